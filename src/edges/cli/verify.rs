//! `rollboard verify|rebuild`: stored rankings checked against their slices (a summary
//! line naming the command that repairs each differing instance), and rebuilt from them.
//! On a board with several windows each window's instance is checked and rebuilt against
//! its own slices, and named by its window.

use super::connect::connect;
use super::output::{shell_word, Progress};
use super::query::resolve_board;
use super::Usage;
use crate::config::Settings;
use crate::domain::board::{
    period_instance, scope_of_period_instance, Board, PeriodSelector, View,
};
use crate::domain::ranking::format_total;
use crate::roll;

/// `rebuild`: recomputes the rankings of every instance of `board` (or of one scope, or
/// one period of a period board), in each of its windows.
pub(super) async fn rebuild(
    settings: &Settings,
    board: &str,
    scope: Option<String>,
    period: Option<String>,
) -> anyhow::Result<u8> {
    let b = settings
        .board(board)
        .ok_or_else(|| Usage(format!("unknown board {board:?}")))?;
    if scope.is_some() || period.is_some() {
        resolve_board(settings, board, scope.as_deref())?;
    }
    let store = connect(settings).await?;
    let scopes = match (period, scope) {
        (Some(id), scope) => vec![Some(period_instance_named(b, scope.as_deref(), &id)?)],
        (None, Some(s)) if b.period.is_none() => vec![Some(s)],
        (None, Some(s)) => roll::instances(&store, b)
            .await?
            .into_iter()
            .filter(|i| i.as_deref().and_then(scope_of_period_instance) == Some(s.as_str()))
            .collect(),
        (None, None) => roll::instances(&store, b).await?,
    };
    let (mut instances, mut repaired, mut changed) = (0u64, 0u64, 0u64);
    for scope in scopes {
        for view in b.views() {
            let rebuilt =
                roll::rebuild(&store, &view, scope.as_deref(), settings.schedule.chunk).await?;
            let label = format!(
                "{}{}",
                scope_label(scope.as_deref()),
                window_label(window_of(&view).as_deref())
            );
            println!(
                "{}{label}: rebuilt, {} member(s), {} changed",
                b.name, rebuilt.members, rebuilt.changed
            );
            if !rebuilt.estimated.is_empty() {
                println!(
                    "{}{label}: the tie-break time of {} member(s) was lost and is now the end of their newest slice: {}",
                    b.name,
                    rebuilt.estimated.len(),
                    rebuilt.estimated.join(", ")
                );
            }
            instances += 1;
            changed += rebuilt.changed;
            repaired += u64::from(rebuilt.changed > 0 || !rebuilt.estimated.is_empty());
        }
    }
    println!(
        "rebuilt {instances} instance(s) of {}: {repaired} repaired, {changed} member(s) changed",
        b.name
    );
    Ok(0)
}

/// The name of the window `view`, as configured, on a board with several windows.
fn window_of(view: &View<'_>) -> Option<String> {
    view.board()
        .has_several_windows()
        .then(|| view.window_name().to_string())
}

/// ` [scope]` after a board's name, or nothing for the unscoped instance.
fn scope_label(scope: Option<&str>) -> String {
    scope.map(|s| format!(" [{s}]")).unwrap_or_default()
}

/// ` window 24h` after an instance's name on a board with several windows, else nothing.
fn window_label(window: Option<&str>) -> String {
    window.map(|w| format!(" window {w}")).unwrap_or_default()
}

/// The instance of the period `id` of `board` (in `scope`): a usage error on a board
/// without periods or for an id that names no period of it.
fn period_instance_named(board: &Board, scope: Option<&str>, id: &str) -> Result<String, Usage> {
    let calendar = board.period.as_ref().ok_or_else(|| {
        Usage(format!(
            "board {} has no calendar period: drop --period",
            board.name
        ))
    })?;
    let span = calendar
        .select(&PeriodSelector::Id(id.to_string()), 0)
        .ok_or_else(|| {
            Usage(format!(
                "--period must be a {} id such as {}",
                calendar.period_name(),
                calendar.span_at(0).id
            ))
        })?;
    Ok(period_instance(scope, &span.id))
}

/// `verify`: checks every instance of every board (or of `board`); exit 1 when one fails.
pub(super) async fn verify(
    settings: &Settings,
    board: Option<String>,
    strict: bool,
    json: bool,
) -> anyhow::Result<u8> {
    if let Some(name) = &board {
        settings
            .board(name)
            .ok_or_else(|| Usage(format!("unknown board {name:?}")))?;
    }
    let store = connect(settings).await?;
    let mut all = Vec::new();
    for b in settings
        .boards
        .iter()
        .filter(|b| board.as_ref().is_none_or(|n| *n == b.name))
    {
        // The scope registry is the board's: every window's instance of a scope is checked,
        // narrowest first.
        let views = b.views();
        for scope in roll::instances(&store, b).await? {
            all.extend(views.iter().map(|view| (view.clone(), scope.clone())));
        }
    }
    let mut progress = Progress::new(all.len());
    let mut summary = VerifySummary::default();
    for (view, scope) in all {
        let v = roll::verify(&store, &view, scope.as_deref(), settings.schedule.chunk).await?;
        summary.add(&v, view.board(), strict);
        progress.step(summary.differing);
        if json {
            println!("{}", serde_json::to_string(&v)?);
        } else {
            print_verified(&v, view.board(), strict);
        }
    }
    progress.done();
    if json {
        println!("{}", serde_json::json!({ "summary": summary }));
    } else {
        println!("{}", summary.line());
    }
    Ok(u8::from(summary.failing > 0))
}

/// The text lines of one verified instance: its verdict, then one line per difference.
fn print_verified(v: &roll::Verified, b: &Board, strict: bool) {
    let label = format!(
        "{}{}",
        scope_label(v.scope.as_deref()),
        window_label(v.window.as_deref())
    );
    let verdict = match (v.differences.is_empty(), v.fails(strict)) {
        (true, true) => format!(
            "DENSE RANKS wrong: {} distinct total(s) differ from a recount",
            v.dense_drift.len()
        ),
        (true, _) => "ok".to_string(),
        (false, true) => format!("DRIFT in {} member(s)", v.differences.len()),
        (false, false) => format!(
            "behind its slices by {} member(s), {} unit(s)",
            v.differences.len(),
            v.amount_behind
        ),
    };
    println!(
        "{}{label} ({}): {} member(s), {verdict}",
        v.board, v.mode, v.members
    );
    for d in &v.differences {
        let show = |t: Option<i64>| {
            t.map(|t| format_total(t, b.scale))
                .unwrap_or_else(|| "-".into())
        };
        println!(
            "  {}: slices {} stored {}",
            d.member,
            show(d.expected),
            show(d.stored)
        );
    }
}

/// What `verify` found over every instance it checked: its last output line (a
/// `{"summary": ...}` line with `--json`).
#[derive(Debug, Default, serde::Serialize)]
struct VerifySummary {
    /// Instances checked.
    instances: u64,
    /// Instances whose stored ranking differs from their slices.
    differing: u64,
    /// Of those, the ones that fail the check (drift; with `--strict`, lag too).
    failing: u64,
    /// Members that differ, over every instance.
    members_differing: u64,
    /// The commands that repair the differing instances.
    repair: Vec<String>,
}

impl VerifySummary {
    fn add(&mut self, v: &roll::Verified, b: &Board, strict: bool) {
        self.instances += 1;
        if v.differences.is_empty() && v.dense_drift.is_empty() {
            return;
        }
        self.differing += 1;
        self.failing += u64::from(v.fails(strict));
        self.members_differing += v.differences.len() as u64;
        // A period board's instance is `<scope>@<period id>`: named as rebuild takes it.
        // A shard is no scope (`--scope` is refused on a sharded board): the board's
        // rebuild rebuilds every shard.
        let (scope, period) = match v.scope.as_deref() {
            _ if b.is_sharded() => (None, None),
            Some(instance) if b.period.is_some() => match instance.rsplit_once('@') {
                Some((scope, id)) => ((!scope.is_empty()).then_some(scope), Some(id)),
                None => (Some(instance), None),
            },
            scope => (scope, None),
        };
        let scope = [("--scope", scope), ("--period", period)]
            .iter()
            .filter_map(|(flag, value)| value.map(|v| format!(" {flag} {}", shell_word(v))))
            .collect::<String>();
        // `rebuild` rebuilds every window of an instance, and the windows of one instance
        // are checked one after the other: one command for all of them.
        let repair = format!("rollboard rebuild {}{scope}", shell_word(&v.board));
        if self.repair.last() != Some(&repair) {
            self.repair.push(repair);
        }
    }

    fn line(&self) -> String {
        let head = format!(
            "verified {} instance(s): {} differing ({} member(s)), {} failing",
            self.instances, self.differing, self.members_differing, self.failing
        );
        match self.repair.as_slice() {
            [] => head,
            [one] => format!("{head}; repair with: {one}"),
            many => format!(
                "{head}; repair with: {} (and {} more, see above)",
                many[0],
                many.len() - 1
            ),
        }
    }
}
