//! Time judged by Redis's clock: skewed, stale and stepped host clocks never count twice.

mod redis_clock_judges_time;
mod stale_and_stepped_clocks;
