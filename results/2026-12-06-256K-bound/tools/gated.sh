#!/bin/bash
# gated.sh KEEP SIZE label=comp:btl ... : rounds alternating labels, kept only when the raw GSO
# floor before and after the round is above GATE MB/s (default 4500); prints every round.
keep=$1 size=$(numfmt --from=iec $2); shift 2; kept=0; tries=0
while [ $kept -lt $keep ] && [ $tries -lt $((keep*4)) ]; do
  tries=$((tries+1)); f0=$(bash /tmp/floor.sh | tail -1 | awk '{printf "%d",$2}'); line=""
  for spec in "$@"; do label=${spec%%=*} rest=${spec#*=}; IFS=: read -r comp btl extra <<<"$rest"
    v=$(XARGS="${extra//+/ }" bash /tmp/vrun.sh ${P:-veth} $comp $btl -- bandwidth -m $size -M $size $OSUARGS 2>&1 | awk -v s=$size '$1==s{printf "%.0f", $2}')
    line+="$label $v "; done
  f1=$(bash /tmp/floor.sh | tail -1 | awk '{printf "%d",$2}')
  if [ "$f0" -gt ${GATE:-4500} ] && [ "$f1" -gt ${GATE:-4500} ]; then kept=$((kept+1)); tag=kept; else tag=dropped; fi
  echo "$size floor $f0/$f1 $tag: $line"
done
