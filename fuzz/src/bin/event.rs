//! Fuzz target: see `rollboard_fuzz::check_event`.

fn main() {
    afl::fuzz!(|data: &[u8]| rollboard_fuzz::check_event(data));
}
