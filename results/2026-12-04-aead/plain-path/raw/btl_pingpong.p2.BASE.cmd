taskset -c 0 /tmp/udbtl-bench/272cb8f6099c6f22ef9bba30dca76d326f24b7c3/target/release/examples/btl_pingpong 
