//! What the model says each query of one ranking must answer, and the daemon's answers
//! (over HTTP) and the command line's (`--json`) compared with it: `top`, a member, one not
//! on the board, `around` and `ranks`, each of one board instance and window.

use std::path::Path;

use serde_json::{json, Value};

use crate::shards::Ranked;
use crate::support::cli::{rollboard, stderr, stdout};
use crate::support::daemon::Daemon;
use crate::support::http::{get, json, post_to};

/// A member no board has seen.
pub const NOBODY: &str = "nobody";

/// One ranking a query reads (a board's instance, in one window) and what the model
/// ranks there.
pub struct Ranking {
    /// The board.
    pub board: &'static str,
    /// The scope, on a scoped board.
    pub scope: Option<String>,
    /// The window, on a board with several.
    pub window: Option<&'static str>,
    /// The model's ranking, best first.
    pub ranked: Ranked,
}

impl Ranking {
    /// `scope=` and `window=` of this ranking's queries, each followed by `&`.
    fn query(&self) -> String {
        let mut out = String::new();
        if let Some(scope) = &self.scope {
            out.push_str(&format!("scope={scope}&"));
        }
        if let Some(window) = self.window {
            out.push_str(&format!("window={window}&"));
        }
        out
    }

    /// `--scope` and `--window` of this ranking's commands.
    fn flags(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(scope) = &self.scope {
            out.extend(["--scope".to_string(), scope.clone()]);
        }
        if let Some(window) = self.window {
            out.extend(["--window".to_string(), window.to_string()]);
        }
        out
    }

    /// What this ranking is, for failure messages.
    pub fn label(&self) -> String {
        format!("{} {:?} {:?}", self.board, self.scope, self.window)
    }

    /// The model's members, best first.
    pub fn members(&self) -> Vec<String> {
        self.ranked.rows.iter().map(|r| r.0.clone()).collect()
    }

    /// The model's entries from position `from` (0-based) to `to`, as answers write them.
    fn entries(&self, from: usize, to: usize) -> Value {
        serde_json::to_value(self.ranked.entries(from, to)).expect("entries as JSON")
    }

    /// The `ranks` body of `members`.
    fn ranks_body(&self, members: &[&str]) -> String {
        let mut body = json!({ "members": members });
        if let Some(scope) = &self.scope {
            body["scope"] = json!(scope);
        }
        if let Some(window) = self.window {
            body["window"] = json!(window);
        }
        body.to_string()
    }

    /// What `ranks` of `members` must answer: the ranked ones in the board's order, then
    /// the others as listed, each once.
    fn ranks_expected(&self, members: &[&str]) -> Value {
        let mut ranked: Vec<usize> = Vec::new();
        let mut unranked: Vec<&str> = Vec::new();
        for m in members {
            match self.ranked.position(m) {
                Some(i) if !ranked.contains(&i) => ranked.push(i),
                None if !unranked.contains(m) => unranked.push(m),
                _ => {}
            }
        }
        ranked.sort_unstable();
        let mut out: Vec<Value> = ranked
            .iter()
            .enumerate()
            .map(|(k, &i)| {
                let e = self.ranked.entry(i);
                json!({"member": e.member, "rank": e.rank, "competition_rank": e.competition_rank,
                       "subset_rank": k + 1, "total": e.total, "percentile": e.percentile})
            })
            .collect();
        out.extend(unranked.iter().map(|m| {
            json!({"member": m, "rank": null, "competition_rank": null, "subset_rank": null,
                   "total": null, "percentile": null})
        }));
        Value::Array(out)
    }
}

/// `Err` naming `what`, the expected and the answered value, when they differ.
fn same(what: &str, got: &Value, want: &Value) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!("{what}: answered {got}, the model says {want}"))
    }
}

/// The fields of `entry` (an entry as answers write it) in `answer`.
fn same_member(what: &str, answer: &Value, entry: &Value) -> Result<(), String> {
    for field in [
        "member",
        "rank",
        "competition_rank",
        "percentile",
        "total",
        "last_ts",
    ] {
        same(&format!("{what} {field}"), &answer[field], &entry[field])?;
    }
    Ok(())
}

/// The `entries` of `ranks` answers, each with the fields [`Ranking::ranks_expected`]
/// gives.
fn ranks_entries(answer: &Value) -> Value {
    let fields = [
        "member",
        "rank",
        "competition_rank",
        "subset_rank",
        "total",
        "percentile",
    ];
    let rows = answer["entries"].as_array().cloned().unwrap_or_default();
    Value::Array(
        rows.iter()
            .map(|row| {
                let picked: serde_json::Map<String, Value> = fields
                    .iter()
                    .map(|f| (f.to_string(), row[*f].clone()))
                    .collect();
                Value::Object(picked)
            })
            .collect(),
    )
}

/// GET `path`: its status and its body as JSON.
async fn get_json(daemon: &Daemon, path: &str) -> (u16, Value) {
    let (status, _, body) = get(daemon, path).await;
    (status, json(&body))
}

/// Whether the daemon's `top` of `ranking` (everything, one page) equals the model's:
/// `Err` says how it differs.
pub async fn top_matches(daemon: &Daemon, ranking: &Ranking) -> Result<(), String> {
    let path = format!(
        "/v1/boards/{}/top?{}limit=1000",
        ranking.board,
        ranking.query()
    );
    let (status, page) = get_json(daemon, &path).await;
    if status != 200 {
        return Err(format!("{path}: {status} {page}"));
    }
    same(
        &format!("{path} count"),
        &page["count"],
        &json!(ranking.ranked.count()),
    )?;
    same(
        &format!("{path} entries"),
        &page["entries"],
        &ranking.entries(0, 1000),
    )
}

/// Every query of `ranking` over HTTP against the model: `top` (whole, and a page of one
/// from the second entry), each member, one not on the board (404), `around` each member
/// (radius 1), `ranks` of every member in reverse with a repeat and one not on the board.
pub async fn http_answers_match(daemon: &Daemon, ranking: &Ranking) -> Result<(), String> {
    top_matches(daemon, ranking).await?;
    let (b, q) = (ranking.board, ranking.query());
    let path = format!("/v1/boards/{b}/top?{q}limit=1&offset=1");
    let (_, page) = get_json(daemon, &path).await;
    same(&path, &page["entries"], &ranking.entries(1, 2))?;
    for (i, member) in ranking.members().iter().enumerate() {
        let path = format!("/v1/boards/{b}/members/{member}?{q}");
        let (status, answer) = get_json(daemon, path.trim_end_matches('&')).await;
        same(&format!("{path} status"), &json!(status), &json!(200))?;
        same_member(&path, &answer, &ranking.entries(i, i + 1)[0])?;
        same(
            &format!("{path} count"),
            &answer["count"],
            &json!(ranking.ranked.count()),
        )?;
        let path = format!("/v1/boards/{b}/members/{member}/around?{q}radius=1");
        let (_, answer) = get_json(daemon, &path).await;
        let from = i.saturating_sub(1);
        same(&path, &answer["entries"], &ranking.entries(from, i + 2))?;
    }
    let path = format!("/v1/boards/{b}/members/{NOBODY}?{q}");
    let (status, answer) = get_json(daemon, path.trim_end_matches('&')).await;
    same(&format!("{path} status"), &json!(status), &json!(404))?;
    same(&path, &answer["rank"], &Value::Null)?;
    let members = ranks_list(ranking);
    let members: Vec<&str> = members.iter().map(String::as_str).collect();
    let path = format!("/v1/boards/{b}/ranks");
    let (status, _, body) = post_to(daemon, &path, &ranking.ranks_body(&members)).await;
    same(&format!("{path} status"), &json!(status), &json!(200))?;
    let answer = json(&body);
    same(
        &format!("{path} {members:?}"),
        &ranks_entries(&answer),
        &ranking.ranks_expected(&members),
    )
}

/// The members a `ranks` query asks for: every ranked member in reverse order, the first
/// listed again, and one not on the board.
fn ranks_list(ranking: &Ranking) -> Vec<String> {
    let mut members: Vec<String> = ranking.members().into_iter().rev().collect();
    if let Some(first) = members.first().cloned() {
        members.push(first);
    }
    members.push(NOBODY.to_string());
    members
}

/// `rollboard <args> --json` with `config`: its exit status and its output as JSON.
fn cli_json(config: &Path, args: &[String]) -> (Option<i32>, Value) {
    let mut all: Vec<&str> = args.iter().map(String::as_str).collect();
    all.push("--json");
    let out = rollboard(Some(config), &all, &[]);
    let text = stdout(&out);
    let value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("rollboard {all:?}: not JSON ({e}): {text}{}", stderr(&out)));
    (out.status.code(), value)
}

/// The command line's `top`, `rank` (one member, several, and one not on the board) and
/// `around` of `ranking` against the model.
pub fn cli_answers_match(config: &Path, ranking: &Ranking) -> Result<(), String> {
    let words = |list: &[&str]| -> Vec<String> {
        let mut out: Vec<String> = list.iter().map(|w| w.to_string()).collect();
        out.extend(ranking.flags());
        out
    };
    let b = ranking.board;
    let (code, page) = cli_json(config, &words(&["top", b, "--limit", "1000"]));
    same(&format!("top {b} exit"), &json!(code), &json!(0))?;
    same(
        &format!("top {}", ranking.label()),
        &page["entries"],
        &ranking.entries(0, 1000),
    )?;
    let members = ranking.members();
    if let Some(first) = members.first() {
        let (code, answer) = cli_json(config, &words(&["rank", b, first]));
        same(&format!("rank {b} {first} exit"), &json!(code), &json!(0))?;
        same_member(
            &format!("rank {b} {first}"),
            &answer,
            &ranking.entries(0, 1)[0],
        )?;
        let last = members.len() - 1;
        let (code, answer) = cli_json(
            config,
            &words(&["around", b, &members[last], "--radius", "1"]),
        );
        same(&format!("around {b} exit"), &json!(code), &json!(0))?;
        same(
            &format!("around {} {}", ranking.label(), members[last]),
            &answer["entries"],
            &ranking.entries(last.saturating_sub(1), last + 1),
        )?;
    }
    let (code, answer) = cli_json(config, &words(&["rank", b, NOBODY]));
    same(&format!("rank {b} {NOBODY} exit"), &json!(code), &json!(3))?;
    same(&format!("rank {b} {NOBODY}"), &answer["rank"], &Value::Null)?;
    let listed = ranks_list(ranking);
    let listed: Vec<&str> = listed.iter().map(String::as_str).collect();
    if listed.len() > 2 {
        let mut args = vec!["rank", b];
        args.extend(&listed);
        let (code, answer) = cli_json(config, &words(&args));
        same(
            &format!("rank {b} {listed:?} exit"),
            &json!(code),
            &json!(0),
        )?;
        same(
            &format!("rank {} {listed:?}", ranking.label()),
            &ranks_entries(&answer),
            &ranking.ranks_expected(&listed),
        )?;
    }
    Ok(())
}
