//! What one request to Redis may hold: no request rollboard sends passes
//! `MAX_REQUEST_ARGS` arguments, whatever the batch, its instances, the windows or the ids.

mod every_request_within_the_argument_cap;
