#!/bin/bash
# vrun.sh lo|veth COMPDIR BTL -- osu args
p=$1 comp=$2 btl=$3; shift 4
cmd=(mpirun.openmpi --allow-run-as-root -np 2 --mca pml ob1 --mca btl "self,$btl" --mca mca_base_component_path "$comp:/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3" $XARGS)
if [[ $p == lo ]]; then
  cmd+=(--bind-to core --map-by core --mca oob_tcp_if_include lo --mca btl_tcp_if_include lo -x UDBTL_IF_INCLUDE=lo)
else
  cmd=(ip netns exec udA "${cmd[@]}" --host localhost,udB --rankfile /tmp/rankfile --mca plm_rsh_agent /work/main/scripts/standin/nsssh --mca oob_tcp_if_include 10.77.0.0/24 --mca btl_tcp_if_include 10.77.0.0/24 --mca btl_udbtl_if_include 10.77.0.0/24)
fi
exec env -u OMPI_MCA_btl -u OMPI_MCA_pml "${cmd[@]}" /tmp/ob/osu "$@"
