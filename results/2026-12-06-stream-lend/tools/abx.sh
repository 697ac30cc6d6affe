#!/bin/bash
# abx.sh N SIZE label=compdir:btl[:mca+args+with+plus] ... -> per label: max median all
n=$1 size=$(numfmt --from=iec $2); shift 2
declare -A vals
for i in $(seq $n); do
  for spec in "$@"; do
    label=${spec%%=*} rest=${spec#*=}; IFS=: read -r comp btl extra <<<"$rest"
    v=$(XARGS="${extra//+/ }" bash /tmp/vrun.sh ${P:-veth} $comp $btl -- bandwidth -m $size -M $size $OSUARGS 2>&1 | awk -v s=$size '$1==s{printf "%.0f", $2}')
    vals[$label]+="$v "
  done
done
for spec in "$@"; do label=${spec%%=*}
  echo "$size $label $(echo ${vals[$label]} | tr ' ' '\n' | sort -n | awk '{a[NR]=$1} END{printf "max %d med %d", a[NR], (NR%2? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}') [${vals[$label]}]"
done
