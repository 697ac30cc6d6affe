#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| udbtl_fuzz::headers(data));
