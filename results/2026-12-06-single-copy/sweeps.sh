#!/bin/bash
# 10 ping-pong sweeps to 8 MiB on loopback through Open MPI at the defaults
# (btl self,udbtl); prints per size the median, lowest and lowest/median of
# size / one-way latency. usage: sweeps.sh COMPONENT_DIR OSU_PT2PT [RUNS]
comp=$1 osu=$2 runs=${3:-10} out=$(mktemp -d)
for i in $(seq "$runs"); do
  mpirun.openmpi --allow-run-as-root -np 2 --bind-to core --map-by core --mca pml ob1 \
    --mca btl self,udbtl --mca btl_udbtl_if_include lo --mca oob_tcp_if_include lo \
    --mca mca_base_component_path "$comp:/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3" \
    "$osu" latency -m 1 -M 8M > "$out/$i.txt" 2>&1
done
cat "$out"/*.txt | awk '$1 ~ /^[0-9]+$/ {print $1, $1 / $2}' | sort -k1,1n -k2,2n |
  awk '{v[$1] = v[$1] " " $2} END {for (s in v) print s, v[s]}' | sort -n |
  awk '{n = NF - 1; for (i = 2; i <= NF; i++) a[i-1] = $i;
        med = (n % 2) ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2;
        printf "| %d | %.1f | %.1f | %.2f |\n", $1, med, a[1], a[1] / med}'
rm -rf "$out"
