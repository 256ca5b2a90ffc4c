//! Several windows from one ingest: one set of idempotency keys, one exact ranking per
//! window, each rolled on its own.

mod a_changed_window_list_is_refused;
mod attacks;
mod edges_of_several_windows;
pub mod every_window_matches_the_model;
mod one_ingest_every_window;
mod scopes_and_cleanup;
mod the_start_up_check_covers_every_window;
mod verify_and_rebuild_every_window;
