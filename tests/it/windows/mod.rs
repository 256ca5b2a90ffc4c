//! Several windows from one ingest: one set of idempotency keys, one exact ranking per
//! window, each rolled on its own.

mod edges_of_several_windows;
mod every_window_matches_the_model;
mod one_ingest_every_window;
