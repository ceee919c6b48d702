#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| openmed_op_fuzz::render_stream(data));
