//! The shipped deploy files: the ACL user, TLS, tokens, and Prometheus rules and dashboards;
//! the two ways the scripts reach Redis (`redis.scripts`); and a rolling upgrade to the
//! release that judges events in the worker.

mod acl_user_and_tls;
mod function_permissions;
mod prometheus_with_deploy_files;
mod script_calls;
mod script_calls_under_faults;
mod upgrade_to_judging;
