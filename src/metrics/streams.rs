//! The streams as Redis reports them: the consumer group's pending entries and lag (over
//! all partitions and per partition), stream lengths, the dead-letter cap, and trims.

use prometheus::{IntCounterVec, IntGauge, IntGaugeVec, Registry};
use tracing::debug;

use super::{counter_vec, int_gauge_vec, register, Metrics};

/// The stream families.
pub(super) struct StreamFamilies {
    /// `rollboard_consumer_pending`.
    pending: IntGauge,
    /// `rollboard_consumer_lag`.
    lag: IntGauge,
    /// `rollboard_stream_pending`.
    stream_pending: IntGaugeVec,
    /// `rollboard_stream_lag`.
    stream_lag: IntGaugeVec,
    /// `rollboard_stream_length`.
    length: IntGaugeVec,
    /// `rollboard_stream_max_length`.
    max_length: IntGaugeVec,
    /// `rollboard_stream_trimmed_total`.
    trimmed: IntCounterVec,
}

impl StreamFamilies {
    /// Registers the families (their streams are known later: see [`Metrics::streams`]).
    pub(super) fn new(registry: &Registry) -> StreamFamilies {
        let gauge = |name: &str, help: &str| {
            register(registry, IntGauge::new(name, help).expect("valid metric"))
        };
        let per_stream = |name: &str, help: &str| int_gauge_vec(registry, name, help, &["stream"]);
        StreamFamilies {
            pending: gauge(
                "rollboard_consumer_pending",
                "Entries delivered to the consumer group but not acknowledged (XINFO GROUPS).",
            ),
            lag: gauge(
                "rollboard_consumer_lag",
                "Entries in the stream not yet delivered to the consumer group (XINFO GROUPS).",
            ),
            stream_pending: per_stream(
                "rollboard_stream_pending",
                "Entries of one stream (partition) delivered to the consumer group but not acknowledged (XINFO GROUPS).",
            ),
            length: per_stream(
                "rollboard_stream_length",
                "Entries in one stream rollboard reads or writes: intake partitions and the dead-letter stream (XLEN).",
            ),
            max_length: per_stream(
                "rollboard_stream_max_length",
                "The configured cap of a capped stream (the dead-letter stream: ingest.dead_letter_max_len).",
            ),
            trimmed: counter_vec(
                registry,
                "rollboard_stream_trimmed_total",
                "Intake stream entries removed by this process's trims (XTRIM MINID).",
                &["stream"],
            ),
            stream_lag: per_stream(
                "rollboard_stream_lag",
                "Entries of one stream (partition) not yet delivered to the consumer group (XINFO GROUPS).",
            ),
        }
    }
}

impl Metrics {
    /// Registers the per-partition gauges of `streams` (at 0 until the first poll), so that
    /// every family shows from the start.
    pub fn streams(&self, streams: &[String]) {
        let families = &self.streams;
        for stream in streams {
            families
                .stream_pending
                .with_label_values(&[stream.as_str()]);
            families.stream_lag.with_label_values(&[stream.as_str()]);
            families.length.with_label_values(&[stream.as_str()]);
            families.trimmed.with_label_values(&[stream.as_str()]);
        }
    }

    /// The dead-letter stream `stream` is capped at about `max_len` entries.
    pub fn capped_stream(&self, stream: &str, max_len: usize) {
        self.streams.length.with_label_values(&[stream]);
        self.streams
            .max_length
            .with_label_values(&[stream])
            .set(max_len as i64);
    }

    /// A stream's length was polled (XLEN).
    pub fn stream_length(&self, stream: &str, length: i64) {
        self.streams.length.with_label_values(&[stream]).set(length);
    }

    /// A trim of an intake stream removed `removed` entries below `minid`.
    pub fn stream_trimmed(&self, stream: &str, minid: &str, removed: u64) {
        if removed > 0 {
            debug!(stream, minid, removed, "stream trimmed");
        }
        self.streams
            .trimmed
            .with_label_values(&[stream])
            .inc_by(removed);
    }

    /// One partition's pending count and lag, from XINFO GROUPS on its stream.
    pub fn stream_group(&self, stream: &str, pending: i64, lag: Option<i64>) {
        self.streams
            .stream_pending
            .with_label_values(&[stream])
            .set(pending);
        if let Some(lag) = lag {
            self.streams
                .stream_lag
                .with_label_values(&[stream])
                .set(lag);
        }
    }

    /// The consumer group's pending count and lag over every partition, from XINFO GROUPS.
    pub fn consumer(&self, pending: i64, lag: Option<i64>) {
        self.streams.pending.set(pending);
        if let Some(lag) = lag {
            self.streams.lag.set(lag);
        }
    }
}
