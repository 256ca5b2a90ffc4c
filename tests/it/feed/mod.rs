//! The change feed of a board's top N: written by the script call that changes the
//! ranking, replayed by a reader into exactly the tops the board goes through.

mod a_broken_stream_fails_the_call_before_it_writes;
mod a_cap_below_one_call;
mod bounded_calls;
mod edges_of_a_change;
mod replays_the_model;
mod replays_the_stored_ranking;
mod streams_go_with_their_board;
mod the_daemon_writes_the_feed;
mod the_start_up_check_covers_the_stream;
mod turned_on_or_resized;
mod two_rollers_and_a_cleanup;
