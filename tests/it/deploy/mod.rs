//! The shipped deploy files: the ACL user, TLS, tokens, and Prometheus rules and dashboards.

mod acl_user_and_tls;
mod function_permissions;
mod prometheus_with_deploy_files;
