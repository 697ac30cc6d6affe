#!/bin/bash
# lat.sh N path label=comp:btl ... : latency at 8,1K,4K,16K,32K,64K per label, alternating; prints per round
n=$1 p=$2; shift 2
for i in $(seq $n); do for spec in "$@"; do label=${spec%%=*} rest=${spec#*=}; IFS=: read -r comp btl extra <<<"$rest"
  echo "$i $label $(XARGS="${extra//+/ }" bash /tmp/vrun.sh $p $comp $btl -- latency -m 8 -M 65536 2>&1 | awk '$1==8||$1==1024||$1==4096||$1==16384||$1==32768||$1==65536{printf "%s:%s ", $1, $2}')"
done; done
