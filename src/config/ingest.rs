//! `[ingest]`: the intake stream and its partitions, the consumer group, batch sizes and
//! timeouts, the dead-letter stream, and how events are deduplicated and how far ahead of
//! the clock they may be.

use std::time::Duration;

use serde::Deserialize;

use super::error::{invalid, ConfigError};
use super::values::{count, duration, non_empty, positive_duration};
use crate::domain::board::Dedup;
use crate::domain::partition::{partition_keys, MAX_PARTITIONS};

/// Longest `ingest.stream`: the key of an event without `id` read from a partition,
/// `<stream>:{63}/<entry ID>` (an entry ID is at most 41 bytes), must fit in an `id` field
/// ([`crate::domain::event::MAX_ID_BYTES`]) for the dead-letter replay to carry it.
pub const MAX_STREAM_BYTES: usize = crate::domain::event::MAX_ID_BYTES - ":{63}/".len() - 41;

/// Most letters `ingest.dead_letter_max_len` may keep: a cap, not a way to switch it off.
pub const MAX_DEAD_LETTERS: i64 = 1_000_000_000;

/// Most entries one `XREADGROUP` call asks for: the consumer reads a batch of
/// `ingest.batch_size` in calls of this many, back to back. Redis's time for a read grows
/// with the entries it delivers, ~1.3 µs per new entry (`>`) and ~3 µs per entry re-read
/// from the pending list on the reference machine (docs/benchmarks.md, *Stream reads*):
/// a batch of 500 in one call took 0.6 to 1.7 ms, close enough to 2 ms that the host's
/// interruptions pushed it over. 100 a call keeps the worst kind near 0.35 ms.
pub const READ_PIECE: usize = 100;

/// Most entries one `XAUTOCLAIM` call asks for: a claimed entry costs Redis ~6-7 µs (moved
/// between two consumers' pending lists, and the claim propagated as an `XCLAIM`), so 50 a
/// call, ~0.3 ms, as [`READ_PIECE`] for reads.
pub const CLAIM_PIECE: usize = 50;

/// `[ingest]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawIngest {
    /// `ingest.stream`: the intake stream (the stem of the partitions' keys).
    stream: String,
    /// `ingest.partitions`: stream keys the events are spread over.
    partitions: i64,
    /// `ingest.group`: consumer group name.
    group: String,
    /// `ingest.consumer`: consumer name (empty: the host name).
    consumer: String,
    /// `ingest.batch_size`: most entries read per batch.
    batch_size: i64,
    /// `ingest.block`: XREADGROUP block timeout.
    block: String,
    /// `ingest.claim_idle`: idle time before another consumer's entries are claimed.
    claim_idle: String,
    /// `ingest.dead_letter_stream`: where malformed events go.
    dead_letter_stream: String,
    /// `ingest.dead_letter_max_len`: about how many letters are kept.
    dead_letter_max_len: i64,
    /// `ingest.retain`: acked history kept on the intake streams.
    retain: String,
    /// `ingest.dedup_window`: `window`, or how long after its slice an id is remembered.
    dedup_window: String,
    /// `ingest.max_future`: how far ahead of the clock an event time may be.
    max_future: String,
}

impl Default for RawIngest {
    fn default() -> Self {
        RawIngest {
            stream: "rb:events".into(),
            partitions: 1,
            group: "rollboard".into(),
            consumer: String::new(),
            batch_size: 10_000,
            block: "1s".into(),
            claim_idle: "30s".into(),
            dead_letter_stream: "rb:events:dead".into(),
            dead_letter_max_len: 100_000,
            retain: "1m".into(),
            dedup_window: "window".into(),
            max_future: "5m".into(),
        }
    }
}

/// Stream consumer settings.
#[derive(Debug, Clone)]
pub struct IngestSettings {
    /// Stream the events arrive on (with several partitions, the stem of their keys).
    pub stream: String,
    /// Stream keys the events are spread over (see [`crate::ingest::stream`]).
    pub partitions: usize,
    /// Consumer group name.
    pub group: String,
    /// Consumer name within the group (the host name when configured empty).
    pub consumer: String,
    /// Most entries read per batch.
    pub batch_size: usize,
    /// XREADGROUP block timeout.
    pub block: Duration,
    /// Most entries one XREADGROUP call asks for ([`READ_PIECE`]; not a key of the file):
    /// a batch is read in calls of this many.
    pub read_piece: usize,
    /// Most entries one XAUTOCLAIM call asks for ([`CLAIM_PIECE`]; not a key of the file).
    pub claim_piece: usize,
    /// Idle time after which another consumer's pending entries are claimed.
    pub claim_idle: Duration,
    /// Stream malformed events are moved to.
    pub dead_letter_stream: String,
    /// About how many letters the dead-letter stream keeps (`XADD … MAXLEN ~`): the oldest
    /// go first.
    pub dead_letter_max_len: usize,
    /// Acked history kept on the intake streams past what every consumer group still
    /// needs (see [`crate::ingest::stream::trim`]).
    pub retain: Duration,
    /// How far ahead of the clock an event time may be, in ms.
    pub max_future_ms: i64,
}

impl RawIngest {
    /// The validated `[ingest]` section, and the deduplication every board gets
    /// (`ingest.dedup_window`).
    pub(super) fn validate(self) -> Result<(IngestSettings, Dedup), ConfigError> {
        let dedup = match self.dedup_window.as_str() {
            "window" => Dedup::Window,
            other => Dedup::AfterSlice(duration("ingest.dedup_window", other)?),
        };
        let batch_size = count("ingest.batch_size", self.batch_size, 1..=10_000)?;
        let partitions = count(
            "ingest.partitions",
            self.partitions,
            1..=MAX_PARTITIONS as i64,
        )?;
        let ingest = IngestSettings {
            stream: self.stream()?,
            partitions,
            group: non_empty("ingest.group", &self.group)?,
            consumer: self.consumer(),
            batch_size,
            block: millis(positive_duration("ingest.block", &self.block)?),
            read_piece: READ_PIECE,
            claim_piece: CLAIM_PIECE,
            claim_idle: millis(positive_duration("ingest.claim_idle", &self.claim_idle)?),
            dead_letter_stream: non_empty("ingest.dead_letter_stream", &self.dead_letter_stream)?,
            dead_letter_max_len: count(
                "ingest.dead_letter_max_len",
                self.dead_letter_max_len,
                1..=MAX_DEAD_LETTERS,
            )?,
            retain: millis(duration("ingest.retain", &self.retain)?),
            max_future_ms: duration("ingest.max_future", &self.max_future)?,
        };
        check_dead_letter_stream(&ingest)?;
        Ok((ingest, dedup))
    }

    /// `ingest.stream`: short enough to key a replayed event, without hash tags of its
    /// own when partitioned.
    fn stream(&self) -> Result<String, ConfigError> {
        let stream = &self.stream;
        if stream.len() > MAX_STREAM_BYTES {
            return Err(invalid(
                "ingest.stream",
                stream,
                format!(
                    "is {} bytes long, at most {MAX_STREAM_BYTES} are allowed (an event without \
                     `id` read from a partition is keyed by the partition's key and its entry \
                     ID, and the key must fit in an `id` field to be replayed)",
                    stream.len()
                ),
            ));
        }
        if self.partitions > 1 && stream.contains(['{', '}']) {
            return Err(invalid(
                "ingest.stream",
                stream,
                "must not contain { or } when ingest.partitions is above 1 (each partition key gets its own hash tag)",
            ));
        }
        non_empty("ingest.stream", stream)
    }

    /// `ingest.consumer`, or the host name when it is empty.
    fn consumer(&self) -> String {
        if !self.consumer.is_empty() {
            return self.consumer.clone();
        }
        hostname::get()
            .ok()
            .and_then(|h| h.into_string().ok())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "rollboard".into())
    }
}

fn millis(ms: i64) -> Duration {
    Duration::from_millis(ms as u64)
}

/// Refuses a dead-letter stream that is one of the keys any partition layout reads as
/// events: the daemon drains the other layouts' keys too (entries left by a change of
/// `ingest.partitions`), so dead letters written to one of them would be applied again.
fn check_dead_letter_stream(ingest: &IngestSettings) -> Result<(), ConfigError> {
    let mut stream_keys = partition_keys(&ingest.stream, MAX_PARTITIONS);
    stream_keys.push(ingest.stream.clone());
    if stream_keys.contains(&ingest.dead_letter_stream) {
        return Err(invalid(
            "ingest.dead_letter_stream",
            &ingest.dead_letter_stream,
            "must differ from ingest.stream and the keys of its partitions (in any layout)",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::testing::{refusal, BOARD};
    use crate::config::Settings;

    #[test]
    fn retain_may_be_zero_and_the_dead_letter_cap_may_not() {
        let s = Settings::from_toml(&format!(
            "[ingest]\nretain = \"0s\"\ndead_letter_max_len = 10\n{BOARD}"
        ))
        .expect("valid");
        assert_eq!(s.ingest.retain, Duration::ZERO);
        assert_eq!(s.ingest.dead_letter_max_len, 10);
        let e = refusal(&format!("[ingest]\ndead_letter_max_len = 0\n{BOARD}"));
        assert!(e.contains("ingest.dead_letter_max_len"), "{e}");
        let e = refusal(&format!("[ingest]\nretain = \"soon\"\n{BOARD}"));
        assert!(e.contains("ingest.retain"), "{e}");
    }

    #[test]
    fn environment_overrides_keep_strings_as_written() {
        std::env::set_var("ROLLBOARD__INGEST__CONSUMER", "007");
        let s = Settings::from_toml(BOARD);
        std::env::remove_var("ROLLBOARD__INGEST__CONSUMER");
        assert_eq!(s.expect("valid").ingest.consumer, "007");
    }

    #[test]
    fn partitions_streams_and_timeouts_are_checked() {
        let e = refusal(&format!("[ingest]\npartitions = 0\n{BOARD}"));
        assert!(
            e.contains("ingest.partitions") && e.contains("between 1 and 64"),
            "{e}"
        );
        let e = refusal(&format!("[ingest]\npartitions = 65\n{BOARD}"));
        assert!(e.contains("ingest.partitions") && e.contains("65"), "{e}");
        let e = refusal(&format!(
            "[ingest]\npartitions = 2\nstream = \"{{rb}}:events\"\n{BOARD}"
        ));
        assert!(e.contains("ingest.stream") && e.contains("hash tag"), "{e}");
        let e = refusal(&format!(
            "[ingest]\npartitions = 2\ndead_letter_stream = \"rb:events:{{1}}\"\n{BOARD}"
        ));
        assert!(e.contains("ingest.dead_letter_stream"), "{e}");
        let e = refusal(&format!("[ingest]\nblock = \"soon\"\n{BOARD}"));
        assert!(e.contains("ingest.block") && e.contains("soon"), "{e}");
        let e = refusal(&format!("[ingest]\nbatch_size = 10001\n{BOARD}"));
        assert!(e.contains("ingest.batch_size"), "{e}");
    }
}
