//! What a query answers beyond a page of the ranking: count, percentile, dense rank and a
//! subset re-ranked; calendar periods, their archives and ids.

mod calendar_periods;
mod count_percentile_dense_and_subset_ranks;
