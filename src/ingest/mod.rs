//! The intake streams: events arrive in Redis Streams (appended by upstream services, by
//! `POST /v1/events` or by `rollboard send`), are read by a consumer group, folded into the
//! boards and acknowledged; what cannot be counted goes to the dead-letter stream.
//!
//! * [`stream`]: the stream commands (append, read, claim, ack, trim, group state).
//! * [`intake`]: one path from a request body or an input line to appended entries.
//! * [`consumer`]: the consumer loop: read, reclaim, process, trim, hold back on an outage,
//!   drain on shutdown.
//! * [`batch`]: one batch in stages: parse, group per board instance, apply, settle,
//!   dead-letter, ack.
//! * [`dead_letters`]: the dead-letter stream read back and replayed.

pub mod batch;
pub mod consumer;
pub mod dead_letters;
pub mod intake;
pub mod stream;
