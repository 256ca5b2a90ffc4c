//! How the Lua scripts reach Redis (`redis.scripts`): as one library of functions
//! (`FUNCTION LOAD`, `FCALL`), or each by itself (`SCRIPT LOAD`, `EVALSHA`) where a service
//! refuses functions. Both run the same script text over the same KEYS and ARGV, so the
//! choice changes no answer and no key; it is made once per process, at the first need.

use std::future::Future;

use fred::prelude::*;
use fred::types::{ClusterHash, CustomCommand};
use tracing::info;

use super::{lua, Function, Store, StoreError};
use crate::config::ScriptCalls;

/// How this process calls its scripts, once chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Calling {
    /// `FCALL rollboard_<version>_<script>`.
    Functions,
    /// `EVALSHA <sha1 of the script's text>`.
    Eval,
}

impl Calling {
    /// The command that calls `function`, and the word that names it: its function name or
    /// its text's digest. The rest of the call (the key count, the keys, the arguments) is
    /// the same for both.
    pub(super) fn command(self, function: &Function) -> (&'static str, &str) {
        match self {
            Calling::Functions => ("FCALL", function.name.as_str()),
            Calling::Eval => ("EVALSHA", function.sha.as_str()),
        }
    }

    /// Whether Redis refused a call because it does not hold the script (nothing ran): its
    /// own error reply. A script's error may carry those words too (in a member name from
    /// an event) and is not one: a function's is the whole reply, a script's the code.
    fn missing(self, e: &fred::error::Error) -> bool {
        match self {
            Calling::Functions => e.details() == "ERR Function not found",
            Calling::Eval => e.details().starts_with("NOSCRIPT "),
        }
    }

    /// Loads every script: the library (`FUNCTION LOAD REPLACE`) or each script (`SCRIPT
    /// LOAD`); on a cluster, on every master. Loading the same text again changes nothing
    /// for calls in flight: Redis runs one command at a time.
    pub(super) async fn load(self, client: &Client) -> Result<(), fred::error::Error> {
        match self {
            Calling::Functions => {
                let text = lua::library().text.as_str();
                if client.is_clustered() {
                    client.function_load_cluster::<Value, _>(true, text).await?;
                } else {
                    client.function_load::<Value, _>(true, text).await?;
                }
            }
            Calling::Eval => {
                for script in lua::eval_scripts() {
                    let text = script.text.as_str();
                    if client.is_clustered() {
                        client.script_load_cluster::<Value, _>(text).await?;
                    } else {
                        client.script_load::<Value, _>(text).await?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Loads what a call of `function` needs: the library, or that one script's text (on a
    /// cluster, on every master).
    async fn load_one(
        self,
        client: &Client,
        function: &super::Function,
    ) -> Result<(), fred::error::Error> {
        let script = lua::eval_scripts().iter().find(|s| s.sha == function.sha);
        match (self, script) {
            (Calling::Eval, Some(script)) => {
                let text = script.text.as_str();
                if client.is_clustered() {
                    client.script_load_cluster::<Value, _>(text).await?;
                } else {
                    client.script_load::<Value, _>(text).await?;
                }
                Ok(())
            }
            _ => self.load(client).await,
        }
    }

    /// The command (and its arguments) that tells whether one master holds every script:
    /// `FUNCTION LIST LIBRARYNAME <name>` answers an empty list when it does not,
    /// `SCRIPT EXISTS <sha>...` a 0 for each script it lacks.
    fn listing(self) -> (CustomCommand, Vec<Value>) {
        match self {
            Calling::Functions => (
                CustomCommand::new_static("FUNCTION", ClusterHash::Random, false),
                vec![
                    "LIST".into(),
                    "LIBRARYNAME".into(),
                    lua::library().name.as_str().into(),
                ],
            ),
            Calling::Eval => {
                let mut args = vec![Value::from("EXISTS")];
                args.extend(lua::eval_scripts().iter().map(|s| s.sha.as_str().into()));
                (
                    CustomCommand::new_static("SCRIPT", ClusterHash::Random, false),
                    args,
                )
            }
        }
    }

    /// Whether a master's answer to [`Calling::listing`] says it holds every script.
    fn holds_all(self, listed: &Value) -> bool {
        match (self, listed) {
            (Calling::Functions, listed) => listed.array_len() != Some(0),
            (Calling::Eval, Value::Array(found)) => {
                found.iter().all(|f| super::as_i64(f) == Some(1))
            }
            (Calling::Eval, _) => false,
        }
    }
}

/// Asks Redis whether the current user may run each command of ARGV (groups of a count
/// followed by that many words), without running any; returns one status per group:
/// 1 allowed, 0 denied, 2 not a command Redis knows (`acl_check_cmd` raises an error); or
/// `{-1}` alone where the server offers no `redis.acl_check_cmd`. KEYS[1] is any key of
/// rollboard's, unread: a service that runs no script without a key (ElastiCache
/// Serverless) runs this one, and a cluster routes it.
pub(super) const PERMISSION_PROBE: &str = r#"
if not redis.acl_check_cmd then return {-1} end
local status, i = {}, 1
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  local ok, allowed = pcall(redis.acl_check_cmd, unpack(ARGV, i + 1, i + n))
  if not ok then
    status[#status + 1] = 2
  elseif allowed then
    status[#status + 1] = 1
  else
    status[#status + 1] = 0
  end
  i = i + n + 1
end
return status
"#;

/// The ARGV of [`PERMISSION_PROBE`] for `probes`, each one command's words.
pub(super) fn probe_args<S: AsRef<str>>(probes: &[Vec<S>]) -> Vec<Value> {
    let mut args = Vec::new();
    for probe in probes {
        args.push(Value::from(probe.len() as i64));
        args.extend(probe.iter().map(|w| Value::from(w.as_ref())));
    }
    args
}

/// How many times a call that found its script missing is sent again, each after loading
/// that script: a cache flushed again between a load and its resend (a `SCRIPT FLUSH`
/// loop, a failover racing a reload) misses once more, and nothing ran either time.
const RESENDS_WHEN_MISSING: usize = 4;

/// Sends a script call of `function` with `send`; when Redis does not hold the script
/// (nothing ran: a server restarted without persistence, a promoted replica, a flush),
/// loads it through `client` and sends the call once more, up to
/// [`RESENDS_WHEN_MISSING`] times. Only the script called is loaded before its resend (by
/// `EVALSHA`, one `SCRIPT LOAD`; by functions, the library), so the window in which
/// another flush can undo the load is one round trip, not one per script; the others
/// load at their own first miss, or at readiness.
pub(super) async fn reloading<F, Fut>(
    client: &Client,
    calling: Calling,
    function: &super::Function,
    send: F,
) -> Result<Value, fred::error::Error>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<Value, fred::error::Error>>,
{
    let mut reply = send().await;
    for _ in 0..RESENDS_WHEN_MISSING {
        match reply {
            Err(e) if calling.missing(&e) => {
                calling.load_one(client, function).await?;
                reply = send().await;
            }
            reply => return reply,
        }
    }
    reply
}

/// Whether `e` is Redis refusing a command for good (an ACL's `NOPERM`, a command the
/// service does not offer) rather than an outage or a redirection.
fn refused(e: &fred::error::Error) -> bool {
    StoreError::Redis(e.clone()).kind() == "other"
}

/// Asks Redis, without running them, whether the user may run each of `commands` (see
/// [`PERMISSION_PROBE`]): `None` when the probe itself is refused.
async fn allowed(
    client: &Client,
    key: &str,
    commands: &[Vec<&str>],
) -> Result<Option<bool>, StoreError> {
    match client
        .eval::<Vec<i64>, _, _, _>(PERMISSION_PROBE, key, probe_args(commands))
        .await
    {
        // `{-1}`: no `redis.acl_check_cmd` to ask.
        Ok(status) if status == [-1] => Ok(None),
        Ok(status) => Ok(Some(status.iter().all(|s| *s == 1))),
        Err(e) if refused(&e) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

impl Store {
    /// How this process calls its scripts: the setting, or for `auto` the choice made at
    /// the first need ([`Store::choose_calling`]) and kept.
    pub(super) async fn calling(&self) -> Result<Calling, StoreError> {
        match self.script_calls {
            ScriptCalls::Functions => Ok(Calling::Functions),
            ScriptCalls::Eval => Ok(Calling::Eval),
            ScriptCalls::Auto => self
                .calling
                .get_or_try_init(|| self.choose_calling())
                .await
                .copied(),
        }
    }

    /// As [`Store::calling`], with the error a script call reports.
    pub(super) async fn calling_for_call(&self) -> Result<Calling, fred::error::Error> {
        self.calling().await.map_err(|e| match e {
            StoreError::Redis(e) => e,
            StoreError::Reply(what) => fred::error::Error::new(ErrorKind::Unknown, what),
        })
    }

    /// `redis.scripts = "auto"`: `EVALSHA` where the user may not load or call functions
    /// but may load and call scripts (an ACL made for `EVALSHA`), or where the server
    /// refuses `FUNCTION LIST` for a reason of its own (a service that does not offer
    /// functions, such as a serverless one); functions otherwise, so that a user who may
    /// do neither is told what functions need, as the shipped ACL grants. The user's
    /// permissions are asked first (`redis.acl_check_cmd`, which runs nothing and leaves no
    /// denial in the ACL log). Logged once.
    async fn choose_calling(&self) -> Result<Calling, StoreError> {
        let reason = match self.may_use(Calling::Functions).await? {
            Some(false) if self.may_use(Calling::Eval).await? == Some(true) => Some(
                "the user may not load or call functions, and may load and call scripts"
                    .to_string(),
            ),
            Some(false) => None,
            Some(true) | None => {
                let (list, args) = Calling::Functions.listing();
                match super::on_every_master(self.client(), list, args).await {
                    Err(StoreError::Redis(e)) if refused(&e) => Some(format!(
                        "the server refused FUNCTION LIST ({})",
                        e.details().chars().take(120).collect::<String>()
                    )),
                    Err(e) => return Err(e),
                    Ok(_) => None,
                }
            }
        };
        let calling = match &reason {
            Some(reason) => {
                info!(
                    scripts = "eval",
                    "redis.scripts = auto: {reason}, so the scripts are loaded with SCRIPT \
                     LOAD and called with EVALSHA"
                );
                Calling::Eval
            }
            None => {
                info!(
                    scripts = "functions",
                    "redis.scripts = auto: the scripts are one library (FUNCTION LOAD) called \
                     with FCALL"
                );
                Calling::Functions
            }
        };
        Ok(calling)
    }

    /// Whether the user may load, list and call scripts the way `calling` does; `None`
    /// when the server cannot tell (no `EVAL`, no `redis.acl_check_cmd`).
    async fn may_use(&self, calling: Calling) -> Result<Option<bool>, StoreError> {
        let key = self.keys.lease("roll");
        let (call, name) = calling.command(&self.scripts.lease);
        let mut probes: Vec<Vec<&str>> = match calling {
            Calling::Functions => vec![
                vec!["FUNCTION", "LOAD", "REPLACE", "#!lua name=probe\n"],
                vec!["FUNCTION", "LIST"],
            ],
            Calling::Eval => vec![
                vec!["SCRIPT", "LOAD", "return 1"],
                vec!["SCRIPT", "EXISTS", name],
            ],
        };
        probes.push(vec![call, name, "1", &key]);
        allowed(self.client(), &key, &probes).await
    }

    /// Whether the server holds every script; loads them if not. On a cluster every master
    /// is asked: a new master, or one restarted without persistence, lacks them while the
    /// others hold them.
    pub async fn ensure_library(&self) -> Result<(), StoreError> {
        let calling = self.calling().await?;
        let (list, args) = calling.listing();
        let replies = super::on_every_master(self.client(), list, args).await?;
        if !replies.iter().all(|listed| calling.holds_all(listed)) {
            self.load_library().await?;
        }
        Ok(())
    }

    /// Loads every script (the library, or each script by `SCRIPT LOAD`); on a cluster, on
    /// every master.
    pub async fn load_library(&self) -> Result<(), StoreError> {
        let calling = self.calling().await?;
        Ok(calling.load(self.client()).await?)
    }
}
