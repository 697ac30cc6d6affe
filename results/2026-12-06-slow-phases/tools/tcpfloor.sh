ip netns exec udB taskset -c 1 python3 /tmp/tcpfloor.py listen 10.77.0.2:7200 >/dev/null & sleep 0.4
ip netns exec udA taskset -c 0 python3 /tmp/tcpfloor.py connect 10.77.0.2:7200; wait
