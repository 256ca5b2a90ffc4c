//! Fuzz target: see `rollboard_fuzz::check_intake`.

fn main() {
    afl::fuzz!(|data: &[u8]| rollboard_fuzz::check_intake(data));
}
