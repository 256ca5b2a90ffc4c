//! The ground floor: the product's rules as pure functions and plain types. Nothing here
//! speaks to Redis, reads a file or the clock on its own; time is a parameter.

pub mod board;
pub mod clock;
pub mod event;
pub mod keys;
pub mod limits;
pub mod partition;
pub mod period;
pub mod ranking;
pub mod roles;
