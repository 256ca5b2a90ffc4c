//! Applying events: exact totals, ties and pages, the fast and the chained paths, and writes that land whole or not at all.

mod all_or_nothing_writes;
mod chained_calls_keep_stream_order;
mod data_errors_are_not_a_missing_library;
mod each_attacks;
mod failed_calls_and_refunds_lose_nothing;
mod fast_path_agrees_with_exact_path;
mod judged_attacks;
mod judged_in_the_worker;
mod judged_packs_model;
mod member_layouts_read_back;
mod one_bucket_attacks;
mod one_call_in_flight_counts_exactly;
mod packed_attacks;
mod packed_instances_agree_with_calls_of_their_own;
mod totals_ties_and_pages;
