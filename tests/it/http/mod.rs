//! The HTTP API as clients meet it: answers and errors, wire edges, slow clients, metrics
//! and tokens, the change feed's streams and the live page.

mod answers_attacks;
mod answers_kept;
mod bearer_tokens_and_listeners;
mod change_feed_streams;
mod client_mistakes_and_metrics;
mod live_page_in_a_browser;
mod metrics_follow_answers;
mod openapi_document_describes_real_answers;
mod operator_answers;
mod queries_during_ingest_and_rolls;
mod several_windows;
mod slow_and_greedy_clients;
mod wire_edges;
