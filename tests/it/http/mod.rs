//! The HTTP API as clients meet it: answers and errors, wire edges, slow clients, metrics and tokens.

mod metrics_follow_answers;
mod operator_answers;
mod slow_and_greedy_clients;
mod token_rotation_and_listeners;
mod wire_edges;
