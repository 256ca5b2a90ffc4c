//! `[daemon]`: the roles this process runs.

use serde::Deserialize;

use super::error::{invalid, ConfigError};
use crate::domain::roles::{Role, Roles};

/// `[daemon]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawDaemon {
    /// `daemon.roles`: what this process runs (default: every role).
    roles: RawRoles,
}

/// `daemon.roles`: a list, or one comma-separated string (what an environment override,
/// `ROLLBOARD__DAEMON__ROLES=intake,query`, gives).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawRoles {
    /// `roles = ["intake", "query"]`.
    List(Vec<String>),
    /// `roles = "intake,query"`.
    Text(String),
}

impl Default for RawDaemon {
    fn default() -> Self {
        RawDaemon {
            roles: RawRoles::List(Role::ALL.iter().map(|r| r.as_str().to_string()).collect()),
        }
    }
}

impl RawDaemon {
    /// The roles named in `daemon.roles`: at least one, each known.
    pub(super) fn validate(&self) -> Result<Roles, ConfigError> {
        let names: Vec<String> = match &self.roles {
            RawRoles::List(names) => names.clone(),
            RawRoles::Text(text) => text
                .split(',')
                .map(|n| n.trim().to_string())
                .filter(|n| !n.is_empty())
                .collect(),
        };
        let mut roles = Vec::with_capacity(names.len());
        for name in &names {
            roles.push(Role::parse(name).ok_or_else(|| {
                invalid(
                    "daemon.roles",
                    name,
                    "expected intake, query, consume or jobs",
                )
            })?);
        }
        if roles.is_empty() {
            return Err(invalid(
                "daemon.roles",
                "[]",
                "name at least one of intake, query, consume, jobs",
            ));
        }
        Ok(Roles::of(&roles))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::testing::{refusal, BOARD};
    use crate::config::Settings;
    use crate::domain::roles::Roles;

    #[test]
    fn roles_default_to_all_and_are_checked() {
        let s = Settings::from_toml(BOARD).expect("valid");
        assert_eq!(s.roles, Roles::ALL);
        assert_eq!(s.schedule.lease, Duration::from_secs(30));
        let s = Settings::from_toml(&format!(
            "[daemon]\nroles = [\"query\", \"intake\"]\n[schedule]\nlease = \"5s\"\n{BOARD}"
        ))
        .expect("valid");
        assert_eq!(s.roles.to_string(), "intake,query");
        assert_eq!(s.schedule.lease, Duration::from_secs(5));
        let s = Settings::from_toml(&format!("[daemon]\nroles = \"consume, jobs\"\n{BOARD}"))
            .expect("valid");
        assert_eq!(s.roles.to_string(), "consume,jobs");
        let e = refusal(&format!(
            "[daemon]\nroles = [\"intake\", \"write\"]\n{BOARD}"
        ));
        assert!(e.contains("daemon.roles") && e.contains("write"), "{e}");
        let e = refusal(&format!("[daemon]\nroles = []\n{BOARD}"));
        assert!(e.contains("daemon.roles"), "{e}");
        let e = refusal(&format!("[schedule]\nlease = \"500ms\"\n{BOARD}"));
        assert!(e.contains("schedule.lease"), "{e}");
    }
}
