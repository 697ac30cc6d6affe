taskset -c 0 /tmp/udbtl-bench/47047df7e715e969acf792b5e0dd6a4793225225/target/release/examples/btl_pingpong 
