//! Exactly once: idempotency keys (given ids, stream entry IDs), the digest table, and redelivered or late events.

mod digest_table;
mod entry_id_keys;
mod keys_of_events_without_id;
mod largest_window_slice_tags;
mod redelivered_and_late_events;
mod trim_seen_tag_search;
