#!/bin/bash
# fine.sh ROUNDS SIZE label=comp:btl[:extra] ... : floor between every run; prints "size label MBps floor_before floor_after"
rounds=$1 size=$(numfmt --from=iec $2); shift 2
f=$(bash /tmp/floor.sh | tail -1 | awk '{printf "%d",$2}')
for r in $(seq $rounds); do for spec in "$@"; do label=${spec%%=*} rest=${spec#*=}; IFS=: read -r comp btl extra <<<"$rest"
  v=$(XARGS="${extra//+/ }" timeout 120 bash /tmp/vrun.sh ${P:-veth} $comp $btl -- bandwidth -m $size -M $size $OSUARGS 2>&1 | awk -v s=$size '$1==s{printf "%.0f", $2}')
  f1=$(bash /tmp/floor.sh | tail -1 | awk '{printf "%d",$2}')
  echo "$size $r $label ${v:-NA} $f $f1"; f=$f1
done; done
