#!/bin/bash
# halo.sh COMPDIR BTL -> halo output (4 ranks, 2 per stand-in host, on 2 CPUs)
comp=$1 btl=$2
exec ip netns exec udA env -u OMPI_MCA_btl -u OMPI_MCA_pml mpirun.openmpi --allow-run-as-root -np 4 --host localhost:2,udB:2 --oversubscribe --bind-to none --mca plm_rsh_agent /work/main/scripts/standin/nsssh --mca pml ob1 --mca btl "self,$btl" --mca mca_base_component_path "$comp:/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3" --mca oob_tcp_if_include 10.77.0.0/24 --mca btl_tcp_if_include 10.77.0.0/24 /tmp/ob/halo --min 1K --max 64K
