//! The command-line interface: argument definitions and the subcommands.
//!
//! Exit codes: 0 success, 1 failure (invalid events, drift, Redis errors), 2 usage error,
//! 3 member not on the board, 64 invalid configuration (also: a missing Redis permission,
//! `drop-board` of a board still configured without `--force`).

use std::io::{BufRead, Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use chrono::{DateTime, SecondsFormat, Utc};
use clap::{Parser, Subcommand};

use crate::config::Settings;
use crate::domain::board::{Board, Mode};
use crate::domain::event::check_name;
use crate::domain::ranking::{format_total, Entry, Page};
use crate::ingest::{intake, stream};
use crate::roll::{self, Job};
use crate::store::{Conflicts, Denied, Reconnect, Refused, Store, StoreError};
use tokio_util::sync::CancellationToken;

pub mod dead_letters;

/// Exit status: the member is not on the board.
pub const EXIT_NOT_FOUND: u8 = 3;
/// Exit status: usage error.
pub const EXIT_USAGE: u8 = 2;
/// Exit status: invalid configuration.
pub const EXIT_CONFIG: u8 = 64;
/// Exit status: Redis had an outage ([`StoreError::is_outage`]); the same command may
/// succeed later (sysexits' `EX_TEMPFAIL`). `send` may have appended part of its input:
/// it is run again with the same input, which is exactly-once when every event has an `id`.
pub const EXIT_UNAVAILABLE: u8 = 75;
/// Longest line `send` accepts, in bytes (without its line break).
pub const MAX_LINE_BYTES: usize = 1 << 20;
/// Most events `send` appends in one batch (one MULTI/EXEC per partition).
const SEND_BATCH_EVENTS: usize = 1_000;
/// Most line bytes `send` holds for one MULTI/EXEC.
const SEND_BATCH_BYTES: usize = 4 << 20;
/// Invalid lines `send` lists; further ones are only counted, so memory stays bounded.
const MAX_LISTED_ERRORS: usize = 100;

/// Exact rolling-window leaderboards in Redis.
#[derive(Debug, Parser)]
#[command(name = "rollboard", version, about)]
pub struct Cli {
    /// Config file (default: $ROLLBOARD_CONFIG, else config/rollboard.toml).
    #[arg(long, global = true, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon: stream consumer, scheduled jobs, HTTP API and metrics.
    Run {
        /// The parts to run, comma-separated (default: `daemon.roles` of the config, else
        /// all four). `/metrics`, `/healthz` and `/readyz` are always served.
        #[arg(long, value_delimiter = ',', value_name = "ROLES")]
        roles: Option<Vec<crate::domain::roles::Role>>,
    },
    /// Show the top of a board.
    Top {
        /// Board name.
        board: String,
        /// Scope value (required for scoped boards).
        #[arg(long)]
        scope: Option<String>,
        /// Entries to show (1 to 1000).
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=1000))]
        limit: u64,
        /// Entries to skip.
        #[arg(long, default_value_t = 0)]
        offset: u64,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Show the rank of one member (exit 3 when it is not on the board).
    Rank {
        /// Board name.
        board: String,
        /// Member.
        member: String,
        /// Scope value (required for scoped boards).
        #[arg(long)]
        scope: Option<String>,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Show the entries around one member (exit 3 when it is not on the board).
    Around {
        /// Board name.
        board: String,
        /// Member.
        member: String,
        /// Scope value (required for scoped boards).
        #[arg(long)]
        scope: Option<String>,
        /// Entries on each side (0 to 100).
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(0..=100))]
        radius: u64,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Append JSON-lines events (FILE, or standard input) to the stream; all or nothing.
    Send {
        /// File of JSON objects, one per line.
        file: Option<PathBuf>,
    },
    /// Run the roll and resummarize jobs once, as of TIME (default: now).
    Roll {
        /// Only this board.
        #[arg(long)]
        board: Option<String>,
        /// RFC 3339 or epoch milliseconds; not later than Redis's clock (`TIME`) unless
        /// --force is given.
        #[arg(long, value_parser = parse_time)]
        at: Option<i64>,
        /// Accept an --at later than Redis's clock (it cannot be undone).
        #[arg(long, requires = "at")]
        force: bool,
    },
    /// Recompute a board's rankings from its live slices (every scope unless --scope).
    Rebuild {
        /// Board name.
        board: String,
        /// Only this scope.
        #[arg(long)]
        scope: Option<String>,
    },
    /// Check stored rankings against their slices; exit 1 on drift.
    Verify {
        /// Only this board.
        #[arg(long)]
        board: Option<String>,
        /// Also fail when a resummarize ranking lags its slices.
        #[arg(long)]
        strict: bool,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// List or replay dead letters (`ingest.dead_letter_stream`).
    DeadLetters {
        /// list or replay.
        #[command(subcommand)]
        action: dead_letters::Action,
    },
    /// Delete every key of one board (all its instances and records), nothing of another.
    DropBoard {
        /// Board name.
        board: String,
        /// List what would be deleted; delete nothing.
        #[arg(long)]
        dry_run: bool,
        /// Drop a board that is still in the configuration.
        #[arg(long)]
        force: bool,
    },
}

/// Parses a time given as RFC 3339 or epoch milliseconds.
pub fn parse_time(text: &str) -> Result<i64, String> {
    let ms = if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        text.parse::<i64>()
            .map_err(|_| format!("{text:?} is out of range"))?
    } else {
        DateTime::parse_from_rfc3339(text)
            .map(|t| t.timestamp_millis())
            .map_err(|_| format!("{text:?} is neither RFC 3339 nor epoch milliseconds"))?
    };
    if !(0..=crate::domain::board::MAX_TOTAL).contains(&ms) {
        return Err(format!("{text:?} is outside 1970 .. 2^53-1 ms"));
    }
    Ok(ms)
}

fn show_time(ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(SecondsFormat::Millis, true))
        .unwrap_or_else(|| ms.to_string())
}

/// A usage problem: message for standard error and exit status 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Usage(pub String);

/// Looks up a board and checks the scope argument against it.
pub fn resolve_board<'a>(
    settings: &'a Settings,
    name: &str,
    scope: Option<&str>,
) -> Result<&'a Board, Usage> {
    let board = settings
        .board(name)
        .ok_or_else(|| Usage(format!("unknown board {name:?}")))?;
    match (&board.scope, scope) {
        (Some(field), None) => Err(Usage(format!(
            "board {name} is scoped by `{field}`: give --scope"
        ))),
        (None, Some(_)) => Err(Usage(format!("board {name} is not scoped: drop --scope"))),
        (_, Some(s)) => check_name(s.as_bytes())
            .map(|_| board)
            .map_err(|why| Usage(format!("scope {why}"))),
        _ => Ok(board),
    }
}

fn check_member(member: &str) -> Result<(), Usage> {
    check_name(member.as_bytes())
        .map(|_| ())
        .map_err(|why| Usage(format!("member {why}")))
}

/// Runs one subcommand other than `run`; returns the exit status.
pub async fn execute(settings: Settings, command: Command) -> ExitCode {
    match dispatch(&settings, command).await {
        Ok(code) => ExitCode::from(code),
        Err(e) => match e.downcast_ref::<Usage>() {
            Some(usage) => {
                eprintln!("error: {usage}");
                ExitCode::from(EXIT_USAGE)
            }
            None if e.downcast_ref::<Conflicts>().is_some()
                || e.downcast_ref::<Denied>().is_some()
                || e.downcast_ref::<Refused>().is_some() =>
            {
                eprintln!("error: {e:#}");
                ExitCode::from(EXIT_CONFIG)
            }
            None if is_outage(&e) => {
                let host = settings.redis.host();
                if format!("{e:#}").contains(&host) {
                    eprintln!("error: {e:#}");
                } else {
                    eprintln!("error: {e:#} (redis at {host})");
                }
                ExitCode::from(EXIT_UNAVAILABLE)
            }
            None => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        },
    }
}

/// Whether `e` was caused by a Redis outage (see [`StoreError::is_outage`]).
fn is_outage(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<StoreError>()
            .is_some_and(StoreError::is_outage)
            || cause
                .downcast_ref::<fred::error::Error>()
                .is_some_and(|e| StoreError::Redis(e.clone()).is_outage())
    })
}

/// Connects, and refuses to go on when the Redis user lacks a permission or a board's
/// settings differ from those its data in Redis was built with.
async fn connect(settings: &Settings) -> anyhow::Result<Store> {
    let store = connect_unchecked(settings).await?;
    check_settings(settings, &store).await?;
    Ok(store)
}

/// As [`connect`], without the board settings check (nothing is written).
async fn connect_unchecked(settings: &Settings) -> anyhow::Result<Store> {
    let url = settings.redis.redacted_url();
    let store = match Store::connect_with(&settings.redis, 1, Reconnect::Never).await {
        Ok(store) => store,
        Err(e) => {
            // Wrong credentials or certificates are settings to fix (exit 64), not an outage.
            let refused = match &e {
                StoreError::Redis(e) => Refused::from_error(e),
                StoreError::Reply(_) => None,
            };
            let error = match refused {
                Some(refused) => anyhow::Error::new(refused),
                None => anyhow::Error::new(e),
            };
            return Err(error.context(format!("cannot connect to {url}")));
        }
    };
    match stream::check_permissions(&store, &settings.boards, &settings.ingest).await {
        Ok(denied) if denied.is_empty() => {}
        Ok(denied) => return Err(Denied(denied).into()),
        Err(e) => return Err(Denied::from_error(&e).map_or_else(|| e.into(), Into::into)),
    }
    Ok(store)
}

/// Refuses to go on when a board's pinned settings differ from its data in Redis (and
/// records them for a board seen for the first time).
async fn check_settings(settings: &Settings, store: &Store) -> anyhow::Result<()> {
    let conflicts = store.check_settings(&settings.boards).await?;
    if !conflicts.is_empty() {
        return Err(Conflicts(conflicts).into());
    }
    Ok(())
}

async fn dispatch(settings: &Settings, command: Command) -> anyhow::Result<u8> {
    match command {
        Command::Run { .. } => unreachable!("`run` is handled by the daemon"),
        Command::Top {
            board,
            scope,
            limit,
            offset,
            json,
        } => {
            let board = resolve_board(settings, &board, scope.as_deref())?;
            let store = connect(settings).await?;
            let now = store.time_ms().await?;
            let page = store
                .top(board, scope.as_deref(), offset, limit, now)
                .await?;
            print_page(&page, json)?;
            Ok(0)
        }
        Command::Rank {
            board,
            member,
            scope,
            json,
        } => {
            let board = resolve_board(settings, &board, scope.as_deref())?;
            check_member(&member)?;
            let store = connect(settings).await?;
            let now = store.time_ms().await?;
            let rank = store.rank(board, scope.as_deref(), &member, now).await?;
            let found = rank.is_ranked();
            if json && found {
                println!("{}", serde_json::to_string(&rank)?);
            } else if json {
                println!("{}", rank.not_on_board());
            } else if let (Some(r), Some(c), Some(t)) =
                (rank.rank, rank.competition_rank, rank.total)
            {
                println!(
                    "{} rank {r} (competition rank {c}) of {} on {}: total {}{}{}",
                    rank.member,
                    rank.count,
                    rank.board,
                    format_total(t, rank.scale),
                    rank.last_ts
                        .map(|ts| format!(", last {}", show_time(ts)))
                        .unwrap_or_default(),
                    as_of(rank.as_of)
                );
            } else {
                println!(
                    "{} is not on {} ({} ranked)",
                    rank.member, rank.board, rank.count
                );
            }
            Ok(if found { 0 } else { EXIT_NOT_FOUND })
        }
        Command::Around {
            board,
            member,
            scope,
            radius,
            json,
        } => {
            let board = resolve_board(settings, &board, scope.as_deref())?;
            check_member(&member)?;
            let store = connect(settings).await?;
            let now = store.time_ms().await?;
            match store
                .around(board, scope.as_deref(), &member, radius, now)
                .await?
            {
                Ok(page) => {
                    print_page(&page, json)?;
                    Ok(0)
                }
                Err(missing) => {
                    if json {
                        println!("{}", missing.not_on_board());
                    } else {
                        println!(
                            "{} is not on {} ({} ranked)",
                            missing.member, missing.board, missing.count
                        );
                    }
                    Ok(EXIT_NOT_FOUND)
                }
            }
        }
        Command::Send { file } => send(settings, file).await,
        Command::DropBoard {
            board,
            dry_run,
            force,
        } => drop_board(settings, &board, dry_run, force).await,
        Command::Roll { board, at, force } => {
            if let Some(name) = &board {
                settings
                    .board(name)
                    .ok_or_else(|| Usage(format!("unknown board {name:?}")))?;
            }
            let store = connect_unchecked(settings).await?;
            // The one clock: Redis's, the same the daemons judge by. A refused roll writes
            // nothing, not even a first board's settings record.
            let clock = store.time_ms().await?;
            if let Some(at) = at.filter(|_| !force) {
                check_roll_time(at, clock)?;
            }
            check_settings(settings, &store).await?;
            let now = at.unwrap_or(clock);
            let reports = roll::run_once(
                &store,
                &settings.boards,
                Job::All,
                board.as_deref(),
                now,
                settings.schedule.chunk,
                &CancellationToken::new(),
            )
            .await?;
            let mut failed = false;
            // Exit 75 when every failure was an outage: then running it again may succeed.
            let mut only_outages = true;
            for r in reports {
                let resummed = if r.mode == Mode::Resummarize.as_str() {
                    format!(", {} re-summed", r.resummed)
                } else {
                    String::new()
                };
                println!(
                    "{} ({}): {} instance(s), {} slice(s) expired, {} member(s) removed, {} id(s) forgotten{resummed}",
                    r.board, r.mode, r.instances, r.slices_expired, r.members_removed, r.ids_forgotten
                );
                if let Some(error) = &r.first_error {
                    eprintln!(
                        "{}: {} instance(s) failed, first: {error}",
                        r.board, r.instances_failed
                    );
                    failed = true;
                    only_outages &= !r.redis_errors.is_empty()
                        && r.redis_errors.keys().all(|kind| *kind != "data")
                        && r.redis_errors.values().sum::<u64>() >= r.instances_failed;
                }
            }
            Ok(match (failed, only_outages) {
                (false, _) => 0,
                (true, true) => EXIT_UNAVAILABLE,
                (true, false) => 1,
            })
        }
        Command::Rebuild { board, scope } => {
            let b = settings
                .board(&board)
                .ok_or_else(|| Usage(format!("unknown board {board:?}")))?;
            if scope.is_some() {
                resolve_board(settings, &board, scope.as_deref())?;
            }
            let store = connect(settings).await?;
            let scopes = match scope {
                Some(s) => vec![Some(s)],
                None => roll::instances(&store, b).await?,
            };
            let (mut instances, mut repaired, mut changed) = (0u64, 0u64, 0u64);
            for scope in scopes {
                let rebuilt =
                    roll::rebuild(&store, b, scope.as_deref(), settings.schedule.chunk).await?;
                let label = scope.map(|s| format!(" [{s}]")).unwrap_or_default();
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
            println!(
                "rebuilt {instances} instance(s) of {}: {repaired} repaired, {changed} member(s) changed",
                b.name
            );
            Ok(0)
        }
        Command::Verify {
            board,
            strict,
            json,
        } => {
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
                for scope in roll::instances(&store, b).await? {
                    all.push((b, scope));
                }
            }
            let mut progress = Progress::new(all.len());
            let mut summary = VerifySummary::default();
            for (b, scope) in all {
                let v = roll::verify(&store, b, scope.as_deref(), settings.schedule.chunk).await?;
                summary.add(&v, strict);
                progress.step(summary.differing);
                if json {
                    println!("{}", serde_json::to_string(&v)?);
                    continue;
                }
                let label = v
                    .scope
                    .as_deref()
                    .map(|s| format!(" [{s}]"))
                    .unwrap_or_default();
                let verdict = match (v.differences.is_empty(), v.fails(strict)) {
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
            progress.done();
            if json {
                println!("{}", serde_json::json!({ "summary": summary }));
            } else {
                println!("{}", summary.line());
            }
            Ok(u8::from(summary.failing > 0))
        }
        Command::DeadLetters { action } => dead_letters::run(settings, action).await,
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
    fn add(&mut self, v: &roll::Verified, strict: bool) {
        self.instances += 1;
        if v.differences.is_empty() {
            return;
        }
        self.differing += 1;
        self.failing += u64::from(v.fails(strict));
        self.members_differing += v.differences.len() as u64;
        let scope = v
            .scope
            .as_deref()
            .map(|s| format!(" --scope {}", shell_word(s)))
            .unwrap_or_default();
        self.repair
            .push(format!("rollboard rebuild {}{scope}", shell_word(&v.board)));
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

/// `text` quoted for a POSIX shell when it holds anything but plain characters.
fn shell_word(text: &str) -> String {
    if !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.:/@%+=,".contains(&b))
    {
        text.to_string()
    } else {
        format!("'{}'", text.replace('\'', "'\\''"))
    }
}

/// Progress of a long `verify` on standard error: on a terminal at most once a second,
/// otherwise every [`PROGRESS_EVERY`] instances (nothing for a short run), so standard
/// output stays the report and a log of standard error stays one line per report.
struct Progress {
    total: usize,
    done: usize,
    terminal: bool,
    last: std::time::Instant,
    shown: bool,
}

/// Instances between two progress lines when standard error is not a terminal.
const PROGRESS_EVERY: usize = 1000;

impl Progress {
    fn new(total: usize) -> Progress {
        use std::io::IsTerminal;
        Progress {
            total,
            done: 0,
            terminal: std::io::stderr().is_terminal(),
            last: std::time::Instant::now(),
            shown: false,
        }
    }

    fn step(&mut self, differing: u64) {
        self.done += 1;
        let due = if self.terminal {
            self.last.elapsed() >= std::time::Duration::from_secs(1)
        } else {
            self.done % PROGRESS_EVERY == 0
        };
        if due && self.done < self.total {
            self.last = std::time::Instant::now();
            self.shown = true;
            eprintln!(
                "verify: {}/{} instance(s) checked, {differing} differing",
                self.done, self.total
            );
        }
    }

    fn done(&self) {
        if self.shown {
            eprintln!("verify: {}/{} instance(s) checked", self.done, self.total);
        }
    }
}

/// `drop-board`: lists the board's keys, then (unless `dry_run`) deletes them. A board still
/// in the configuration is refused (exit 64) without `force`: a daemon running with it
/// would write its keys again. The stored settings are not checked, so that a board whose
/// settings changed can be dropped to start afresh.
async fn drop_board(
    settings: &Settings,
    name: &str,
    dry_run: bool,
    force: bool,
) -> anyhow::Result<u8> {
    if !crate::domain::board::is_board_name(name) {
        return Err(Usage(format!(
            "board name {name:?}: must match [a-z0-9_-]{{1,64}}"
        ))
        .into());
    }
    if settings.board(name).is_some() && !force {
        eprintln!(
            "error: board {name} is still in the configuration: remove it from [[boards]] and \
             restart the daemons first (they would write it again), or give --force"
        );
        return Ok(EXIT_CONFIG);
    }
    let store = connect_unchecked(settings).await?;
    let found = match store.board_keys(name).await {
        Ok(found) => found,
        Err(e) => return Err(crate::store::scan_denied(&e).map_or_else(|| e.into(), Into::into)),
    };
    let mut out = std::io::stdout().lock();
    for line in found.report(dry_run) {
        writeln!(out, "{line}")?;
    }
    if dry_run {
        writeln!(
            out,
            "board {name}: would delete {}; nothing was deleted",
            found.summary()
        )?;
        return Ok(0);
    }
    let deleted = store.drop_board_keys(&found).await?;
    writeln!(
        out,
        "board {name}: deleted {deleted} of {}",
        found.summary()
    )?;
    Ok(0)
}

/// Refuses a roll time later than Redis's clock: a roll expires every slice that is dead
/// at that time, forgets the idempotency keys due by then and raises the watermark for
/// good, so a roll ahead of the clock would drop live tips from the rankings and refuse
/// them as late (the one clock, see [`crate::domain::clock`]).
pub fn check_roll_time(at: i64, clock: i64) -> Result<(), Usage> {
    if at <= clock {
        return Ok(());
    }
    Err(Usage(format!(
        "--at {} is {} ms ahead of Redis's clock ({}); a roll cannot be undone (it expires \
         every slice dead at that time and forgets the ids due by then, for good): check the \
         time, or give --force",
        show_time(at),
        at - clock,
        show_time(clock),
    )))
}

/// `, as of <time>` when the ranking's last change is known.
fn as_of(at: Option<i64>) -> String {
    at.map(|t| format!(", as of {}", show_time(t)))
        .unwrap_or_default()
}

fn print_page(page: &Page, json: bool) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{}", serde_json::to_string(page)?)?;
        return Ok(());
    }
    let scope = page
        .scope
        .as_deref()
        .map(|s| format!(" [{s}]"))
        .unwrap_or_default();
    writeln!(
        out,
        "{}{scope}: {} ranked, window {} .. {}{}",
        page.board,
        page.count,
        show_time(page.window_from),
        show_time(page.window_to),
        as_of(page.as_of)
    )?;
    let width = page
        .entries
        .iter()
        .map(|e| e.member.chars().count())
        .max()
        .unwrap_or(6)
        .max(6);
    writeln!(
        out,
        "{:>6} {:>6}  {:<width$}  {:>20}  LAST",
        "RANK", "COMP", "MEMBER", "TOTAL"
    )?;
    for Entry {
        rank,
        competition_rank,
        member,
        total,
        last_ts,
    } in &page.entries
    {
        let last = last_ts.map(show_time).unwrap_or_else(|| "-".into());
        writeln!(
            out,
            "{rank:>6} {competition_rank:>6}  {member:<width$}  {:>20}  {last}",
            format_total(*total, page.scale)
        )?;
    }
    Ok(())
}

/// One line of `send` input.
enum Line {
    /// The input ended.
    End,
    /// A line (its line break removed) of at most [`MAX_LINE_BYTES`].
    Text,
    /// A line longer than [`MAX_LINE_BYTES`]; reading stops there.
    TooLong,
}

/// Reads the next line into `buf`, never holding more than [`MAX_LINE_BYTES`] + 2 bytes.
fn next_line(input: &mut impl BufRead, buf: &mut Vec<u8>) -> std::io::Result<Line> {
    buf.clear();
    // Room for the longest line and its CR LF: a line of exactly the limit is accepted
    // whatever its line break.
    let read = input
        .by_ref()
        .take(MAX_LINE_BYTES as u64 + 2)
        .read_until(b'\n', buf)?;
    if read == 0 {
        return Ok(Line::End);
    }
    if buf.last() == Some(&b'\n') {
        buf.pop();
        if buf.last() == Some(&b'\r') {
            buf.pop();
        }
    }
    Ok(if buf.len() > MAX_LINE_BYTES {
        Line::TooLong
    } else {
        Line::Text
    })
}

/// What the first pass of `send` found.
struct Checked {
    /// Valid events.
    events: u64,
    /// The first [`MAX_LISTED_ERRORS`] invalid lines.
    errors: Vec<String>,
    /// Invalid lines in all.
    invalid: u64,
}

/// Validates JSON-lines input (a UTF-8 BOM at its start is skipped) without holding more
/// than one line, copying it to `spool` when given. Reading stops at a line over
/// [`MAX_LINE_BYTES`].
fn check_lines(
    mut input: impl BufRead,
    boards: &[Board],
    mut spool: Option<&mut dyn Write>,
) -> anyhow::Result<Checked> {
    let mut checked = Checked {
        events: 0,
        errors: Vec::new(),
        invalid: 0,
    };
    let mut buf = Vec::new();
    let mut number = 0u64;
    loop {
        number += 1;
        let result = match next_line(&mut input, &mut buf).context("cannot read the input")? {
            Line::End => break,
            Line::TooLong => Err(format!(
                "line {number}: longer than {MAX_LINE_BYTES} bytes; the rest of the input was not read"
            )),
            Line::Text => {
                if let Some(spool) = spool.as_mut() {
                    spool.write_all(&buf).context("cannot spool the input")?;
                    spool.write_all(b"\n").context("cannot spool the input")?;
                }
                intake::parse_line(&buf, number, boards)
            }
        };
        match result {
            Ok(Some(_)) => checked.events += 1,
            Ok(None) => {}
            Err(why) => {
                checked.invalid += 1;
                if checked.errors.len() < MAX_LISTED_ERRORS {
                    checked.errors.push(why);
                }
                if buf.len() > MAX_LINE_BYTES {
                    break;
                }
            }
        }
    }
    Ok(checked)
}

/// `send`: validates the whole input first (nothing is appended when a line is invalid),
/// then appends it in transactions of at most [`SEND_BATCH_EVENTS`] events, so memory is
/// bounded by a batch, not by the input. Standard input, a pipe or a device is spooled to
/// a temporary file during the first pass; a regular file is read twice.
async fn send(settings: &Settings, file: Option<PathBuf>) -> anyhow::Result<u8> {
    let regular = file
        .as_deref()
        .and_then(|p| std::fs::metadata(p).ok())
        .is_some_and(|m| m.is_file());
    let open = |path: &Path| {
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))
    };
    let mut spool = if regular {
        None
    } else {
        Some(std::io::BufWriter::new(tempfile::tempfile().context(
            "cannot create a temporary file to spool the input",
        )?))
    };
    let spool_writer = spool.as_mut().map(|w| w as &mut dyn Write);
    let checked = match &file {
        Some(path) => check_lines(
            std::io::BufReader::new(open(path)?),
            &settings.boards,
            spool_writer,
        )?,
        None => check_lines(std::io::stdin().lock(), &settings.boards, spool_writer)?,
    };
    if checked.invalid > 0 {
        for e in &checked.errors {
            eprintln!("{e}");
        }
        if checked.invalid > checked.errors.len() as u64 {
            eprintln!(
                "... and {} more",
                checked.invalid - checked.errors.len() as u64
            );
        }
        eprintln!("{} invalid line(s); nothing was appended", checked.invalid);
        return Ok(1);
    }
    let second: Box<dyn BufRead> = match (spool, &file) {
        (Some(spool), _) => {
            let mut spooled = spool
                .into_inner()
                .map_err(|e| e.into_error())
                .context("cannot spool the input")?;
            spooled.rewind().context("cannot read the spooled input")?;
            Box::new(std::io::BufReader::new(spooled))
        }
        (None, Some(path)) => Box::new(std::io::BufReader::new(open(path)?)),
        (None, None) => anyhow::bail!("standard input is always spooled"),
    };
    let store = connect(settings).await?;
    let stream = streams_shown(&settings.ingest);
    let mut appended = 0u64;
    let outcome = append_lines(second, settings, &store, &mut appended).await;
    if let Err(e) = outcome {
        eprintln!(
            "{appended} of {} event(s) were appended before the failure",
            checked.events
        );
        return Err(e);
    }
    println!("appended {appended} event(s) to {stream}");
    Ok(0)
}

/// The stream key, or the range of partition keys, for messages.
fn streams_shown(ingest: &crate::config::IngestSettings) -> String {
    match ingest.partitions {
        0 | 1 => ingest.stream.clone(),
        n => format!("{}:{{0..{}}}", ingest.stream, n - 1),
    }
}

/// The second pass of `send`: appends the checked input batch by batch, counting the
/// events appended so far in `appended`.
async fn append_lines(
    mut input: Box<dyn BufRead>,
    settings: &Settings,
    store: &Store,
    appended: &mut u64,
) -> anyhow::Result<()> {
    let stream = streams_shown(&settings.ingest);
    let mut batch = Vec::new();
    let mut bytes = 0;
    let mut buf = Vec::new();
    let mut number = 0u64;
    loop {
        number += 1;
        let more = match next_line(&mut input, &mut buf).context("cannot read the input")? {
            Line::End => false,
            Line::TooLong => anyhow::bail!("line {number}: the input changed since it was checked"),
            Line::Text => {
                match intake::parse_line(&buf, number, &settings.boards) {
                    Ok(Some(fields)) => {
                        bytes += buf.len();
                        batch.push(fields);
                    }
                    Ok(None) => {}
                    Err(why) => anyhow::bail!("{why} (the input changed since it was checked)"),
                }
                true
            }
        };
        if batch.len() >= SEND_BATCH_EVENTS
            || bytes >= SEND_BATCH_BYTES
            || (!more && !batch.is_empty())
        {
            intake::append(store, &settings.ingest, &batch)
                .await
                .with_context(|| format!("cannot append to {stream}"))?;
            *appended += batch.len() as u64;
            batch.clear();
            bytes = 0;
        }
        if !more {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_both_ways() {
        assert_eq!(parse_time("1763700000123"), Ok(1_763_700_000_123));
        assert_eq!(
            parse_time("2025-11-21T04:40:00.123Z"),
            Ok(1_763_700_000_123)
        );
        assert_eq!(
            parse_time("2025-11-21T05:40:00.123+01:00"),
            Ok(1_763_700_000_123)
        );
        assert!(parse_time("yesterday").is_err());
        assert!(parse_time("-5").is_err());
        assert!(parse_time("9223372036854775807").is_err());
        assert!(parse_time("1969-12-31T23:59:59Z").is_err());
    }

    #[test]
    fn roll_times_ahead_of_redis_are_refused() {
        let clock = 1_763_700_000_000;
        assert!(check_roll_time(clock - 86_400_000, clock).is_ok());
        assert!(check_roll_time(clock, clock).is_ok());
        let refused = check_roll_time(clock + 1, clock).map_err(|u| u.0);
        assert!(refused.is_err_and(|m| m.contains("Redis's clock") && m.contains("--force")));
    }
}
