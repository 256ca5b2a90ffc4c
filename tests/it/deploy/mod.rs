//! The shipped deploy files: the ACL user, TLS, tokens, and Prometheus rules and dashboards.

mod acl_tls_and_tokens;
mod prometheus_with_deploy_files;
