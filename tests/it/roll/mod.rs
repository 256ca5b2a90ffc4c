//! Rolling the window: expiry, catch-up, resummarize and its races, bounded calls, verify and rebuild.

mod bounded_calls_equal_the_model;
mod corrupt_time_records_fail_before_writing;
mod expiry_and_catch_up;
mod resummarize;
mod resummarize_races;
mod resummarize_skips_unchanged_instances;
mod roll_ahead_of_the_clock;
mod verify_and_rebuild;
