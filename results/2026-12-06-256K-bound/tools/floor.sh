#!/bin/bash
cd /work/main
ip netns exec udB taskset -c 1 target/release/udp_stream --listen 10.77.0.2:7100 > /tmp/fl.rx 2>&1 & sleep 0.3
ip netns exec udA taskset -c 0 target/release/udp_stream --connect 10.77.0.2:7100 --mode gso --min-size 1048576 2>&1 | tail -1 | awk '{print "floor", $2}'
wait
