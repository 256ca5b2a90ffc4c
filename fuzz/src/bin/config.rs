//! Fuzz target: see `rollboard_fuzz::check_config`.

fn main() {
    afl::fuzz!(|data: &[u8]| rollboard_fuzz::check_config(data));
}
