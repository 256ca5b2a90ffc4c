//! Settings pinned by a board's data: a disagreeing configuration is refused.

mod errors_name_their_source;
mod pinned_settings;
