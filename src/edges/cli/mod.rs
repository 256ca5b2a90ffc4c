//! The command-line interface: the arguments, the exit status of every outcome, and a
//! dispatch to the one function of each subcommand (`query`: top, rank, around, each of
//! one window or, `rank --all-windows`, of every window; `send`;
//! `roll`; `verify`: verify, rebuild; `drop_board`; `dead_letters`). Each subcommand opens
//! its own connection (`connect`) and prints through `output` and `time`.
//!
//! Exit codes: 0 success, 1 failure (invalid events, drift, Redis errors), 2 usage error,
//! 3 member not on the board, 64 invalid configuration (also: a missing Redis permission,
//! `drop-board` of a board still configured without `--force`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::config::Settings;
use crate::store::{Conflicts, Denied, Refused, StoreError};

mod connect;
pub mod dead_letters;
mod drop_board;
mod output;
mod periods;
mod query;
mod roll;
mod send;
mod time;
mod verify;

// For `dead_letters`, which connects as every command does.
use connect::connect;
pub use query::resolve_board;
pub use roll::check_roll_time;
pub use send::MAX_LINE_BYTES;
pub use time::parse_time;

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
        /// What it reads and how it prints (`--scope`, `--window`, `--period`, `--json`).
        #[command(flatten)]
        read: ReadFlags,
        /// Entries to show (1 to 1000).
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=1000))]
        limit: u64,
        /// Entries to skip.
        #[arg(long, default_value_t = 0)]
        offset: u64,
    },
    /// Show the rank of one member (exit 3 when it is not on the board), or of several on
    /// the board and among themselves (exit 3 when none is on the board).
    Rank {
        /// Board name.
        board: String,
        /// Member; several (up to 1000) answer each one's rank on the board and among
        /// them, from one snapshot.
        #[arg(required = true, num_args = 1..)]
        members: Vec<String>,
        /// What it reads and how it prints (`--scope`, `--window`, `--period`, `--json`).
        #[command(flatten)]
        read: ReadFlags,
        /// The member's rank in every window of the board, from one snapshot (one member;
        /// exit 3 when it is ranked in none).
        #[arg(long, conflicts_with = "window")]
        all_windows: bool,
    },
    /// Show the entries around one member (exit 3 when it is not on the board).
    Around {
        /// Board name.
        board: String,
        /// Member.
        member: String,
        /// What it reads and how it prints (`--scope`, `--window`, `--period`, `--json`).
        #[command(flatten)]
        read: ReadFlags,
        /// Entries on each side (0 to 100).
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(0..=100))]
        radius: u64,
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
    /// Recompute a board's rankings from its live slices (every scope and period unless
    /// --scope or --period).
    Rebuild {
        /// Board name.
        board: String,
        /// Only this scope.
        #[arg(long)]
        scope: Option<String>,
        /// Only this period of a calendar-period board (an id; with --scope on a scoped
        /// board).
        #[arg(long)]
        period: Option<String>,
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

/// The flags every read command (`top`, `rank`, `around`) takes: what it reads of its
/// board, and how it prints the answer.
#[derive(Debug, Args)]
pub struct ReadFlags {
    /// Scope value (required for scoped boards).
    #[arg(long)]
    pub scope: Option<String>,
    /// Window of a board with several (`windows = [...]`): its name as configured or an
    /// equal duration (default: the first listed).
    #[arg(long)]
    pub window: Option<String>,
    /// Period of a period board: current (default), previous or an id (2026-11-26,
    /// 2026-W48, 2026-11).
    #[arg(long)]
    pub period: Option<String>,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

impl ReadFlags {
    /// The ranking the command reads: `--scope`, `--period` and `--window`.
    fn ranking(&self) -> query::Ranking<'_> {
        query::Ranking {
            scope: self.scope.as_deref(),
            period: self.period.as_deref(),
            window: self.window.as_deref(),
        }
    }
}

/// A usage problem: message for standard error and exit status 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Usage(pub String);

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

/// Runs `command` through the one function of its subcommand; its exit status.
async fn dispatch(settings: &Settings, command: Command) -> anyhow::Result<u8> {
    match command {
        Command::Run { .. } => unreachable!("`run` is handled by the daemon"),
        Command::Top {
            board,
            read,
            limit,
            offset,
        } => query::top(settings, &board, read.ranking(), limit, offset, read.json).await,
        Command::Rank {
            board,
            members,
            read,
            all_windows,
        } => {
            let (ranking, json) = (read.ranking(), read.json);
            match (members.as_slice(), all_windows) {
                ([member], true) => {
                    query::rank_all_windows(settings, &board, member, ranking, json).await
                }
                (_, true) => Err(Usage("--all-windows takes one member".into()).into()),
                ([member], false) => query::rank(settings, &board, member, ranking, json).await,
                (_, false) => query::ranks(settings, &board, &members, ranking, json).await,
            }
        }
        Command::Around {
            board,
            member,
            read,
            radius,
        } => query::around(settings, &board, &member, read.ranking(), radius, read.json).await,
        Command::Send { file } => send::send(settings, file).await,
        Command::DropBoard {
            board,
            dry_run,
            force,
        } => drop_board::drop_board(settings, &board, dry_run, force).await,
        Command::Roll { board, at, force } => roll::roll(settings, board, at, force).await,
        Command::Rebuild {
            board,
            scope,
            period,
        } => verify::rebuild(settings, &board, scope, period).await,
        Command::Verify {
            board,
            strict,
            json,
        } => verify::verify(settings, board, strict, json).await,
        Command::DeadLetters { action } => dead_letters::run(settings, action).await,
    }
}

#[cfg(test)]
mod tests {
    use clap::error::ErrorKind;
    use clap::{CommandFactory, Parser};

    use super::{Cli, Command};

    #[test]
    fn the_arguments_are_consistent() {
        // Among others: `rank --all-windows` conflicts with an argument that exists.
        Cli::command().debug_assert();
    }

    #[test]
    fn every_read_command_takes_the_read_flags() {
        let flags = [
            "--scope", "s", "--window", "1d", "--period", "previous", "--json",
        ];
        for args in [
            &["top", "b"][..],
            &["rank", "b", "m"],
            &["around", "b", "m"],
        ] {
            let argv = ["rollboard"].iter().chain(args).chain(&flags);
            let read = match Cli::try_parse_from(argv).unwrap().command {
                Command::Top { read, .. }
                | Command::Rank { read, .. }
                | Command::Around { read, .. } => read,
                other => panic!("{other:?}"),
            };
            let ranking = read.ranking();
            assert_eq!(ranking.scope, Some("s"));
            assert_eq!(ranking.window, Some("1d"));
            assert_eq!(ranking.period, Some("previous"));
            assert!(read.json);
        }
    }

    #[test]
    fn all_windows_conflicts_with_window() {
        let argv = [
            "rollboard",
            "rank",
            "b",
            "m",
            "--window",
            "1d",
            "--all-windows",
        ];
        let e = Cli::try_parse_from(argv).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ArgumentConflict);
    }
}
