//! Ingest from the stream: intake ids, partitions, stream trimming and the replay of dead letters.

mod dead_letter_replay;
mod intake_ids_and_outages;
mod partitions;
mod stream_trimming;
