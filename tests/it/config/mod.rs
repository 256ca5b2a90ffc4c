//! Settings pinned by a board's data: a disagreeing configuration is refused.

mod pinned_settings;
