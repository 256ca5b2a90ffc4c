//! Ingest from the stream: intake ids, partitions, stream trimming and the replay of dead letters.

mod batches_of_many_instances;
mod dead_letter_replay;
mod every_intake_path_ends_in_the_model;
mod intake_ids_and_outages;
mod large_batches;
mod malformed_events_are_dead_lettered;
mod partitions;
mod reads_in_pieces;
mod stream_trimming;
