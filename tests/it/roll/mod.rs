//! Rolling the window: expiry, catch-up, resummarize and its races, bounded calls, verify and rebuild.

mod bounded_calls_equal_the_model;
mod expiry_and_catch_up;
mod resummarize_races;
mod resummarize_skips_unchanged_instances;
