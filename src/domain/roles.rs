//! The parts of the daemon one process runs: `rollboard run --roles intake,query,consume,jobs`
//! or `daemon.roles` in the config (the flag wins; default all four).
//!
//! A platform can run thin sidecars (`intake,query`: the HTTP API only, on two Redis
//! connections) next to its app and a small worker deployment (`consume,jobs`) that applies
//! the stream and rolls the windows. `/metrics`, `/healthz` and `/readyz` are served by
//! every process; a route of a role the process does not run answers 404.

use std::fmt;

/// One part of the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Role {
    /// `POST /v1/events`: appends events to the stream.
    Intake,
    /// The `/v1/boards` reads.
    Query,
    /// The stream consumers: partitions, retired partitions, claiming from dead consumers.
    Consume,
    /// The scheduled roll and resummarize jobs, each tick under a lease in Redis.
    Jobs,
}

impl Role {
    /// Every role, in the order they are listed.
    pub const ALL: [Role; 4] = [Role::Intake, Role::Query, Role::Consume, Role::Jobs];

    /// The role's name, as given to `--roles` and `daemon.roles`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Intake => "intake",
            Role::Query => "query",
            Role::Consume => "consume",
            Role::Jobs => "jobs",
        }
    }

    /// The role named `name`, if there is one.
    pub fn parse(name: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == name)
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// A set of roles.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Roles(u8);

impl Roles {
    /// Every role: what `rollboard run` does without `--roles`.
    pub const ALL: Roles = Roles(0b1111);

    /// The set holding exactly `roles`.
    pub fn of(roles: &[Role]) -> Roles {
        Roles(roles.iter().fold(0, |set, r| set | r.bit()))
    }

    /// Whether `role` is in the set.
    pub fn has(self, role: Role) -> bool {
        self.0 & role.bit() != 0
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Whether the process does work beside the HTTP API (consume or jobs): such a
    /// process keeps its Redis connections for that work apart from the API's.
    pub fn works(self) -> bool {
        self.has(Role::Consume) || self.has(Role::Jobs)
    }
}

impl Roles {
    /// Whether the process serves API routes (intake or query) beside the probes.
    pub fn serves(self) -> bool {
        self.has(Role::Intake) || self.has(Role::Query)
    }
}

impl Default for Roles {
    fn default() -> Self {
        Roles::ALL
    }
}

impl fmt::Display for Roles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = Role::ALL
            .into_iter()
            .filter(|r| self.has(*r))
            .map(Role::as_str)
            .collect();
        f.write_str(&names.join(","))
    }
}

impl fmt::Debug for Roles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Roles({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_lists_its_roles_in_order() {
        let roles = Roles::of(&[Role::Query, Role::Intake]);
        assert_eq!(roles.to_string(), "intake,query");
        assert!(roles.has(Role::Intake) && !roles.has(Role::Jobs));
        assert!(!roles.works() && roles.serves());
        assert!(!Roles::of(&[Role::Consume, Role::Jobs]).serves());
        assert!(Roles::of(&[Role::Jobs]).works());
        assert_eq!(Roles::ALL.to_string(), "intake,query,consume,jobs");
        assert!(Roles::of(&[]).is_empty());
    }

    #[test]
    fn names_parse_back() {
        for role in Role::ALL {
            assert_eq!(Role::parse(role.as_str()), Some(role));
        }
        assert_eq!(Role::parse("Intake"), None);
    }
}
