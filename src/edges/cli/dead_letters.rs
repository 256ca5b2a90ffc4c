//! `rollboard dead-letters list|replay`: the arguments and the printing; what a replay does
//! lives in [`crate::ingest::dead_letters`].

use std::io::Write;

use anyhow::Context;
use clap::{Args, Subcommand};

use super::{connect, Usage};
use crate::config::Settings;
use crate::domain::event::Reason;
use crate::ingest::dead_letters::{
    is_entry_id, Counts, Letter, Pages, Replay, Replayer, Selection,
};

/// What to do with the dead-letter stream.
#[derive(Debug, Subcommand)]
pub enum Action {
    /// Print letters, oldest first.
    ///
    /// Each with its entry ID, reason, the instance that refused it (`overflow`,
    /// `apply_failed`), source, detail and fields.
    List {
        /// Which letters.
        #[command(flatten)]
        select: Select,
        /// Letters to print at most.
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
        limit: u64,
        /// One JSON object per letter.
        #[arg(long)]
        json: bool,
    },
    /// Apply letters again, deleting each one applied.
    ///
    /// With their original id and ts: `overflow` and `apply_failed` to the one instance
    /// that refused them, the others to every board they match once valid. A letter still
    /// refused stays (exit 1).
    Replay {
        /// Which letters.
        #[command(flatten)]
        select: Select,
        /// Show where each letter would go; write nothing.
        #[arg(long)]
        dry_run: bool,
        /// Key an event without `id` by its bare `source_id` even from a partition, as
        /// versions before `<stream>/<entry ID>` keys did: for letters they wrote.
        #[arg(long)]
        bare_keys: bool,
    },
}

/// The letters a command takes.
#[derive(Debug, Args)]
pub struct Select {
    /// Only letters with this reason.
    #[arg(long, value_parser = parse_reason)]
    reason: Option<Reason>,
    /// Only letters of this board: refused by one of its instances, or (other reasons)
    /// whose event matches it.
    #[arg(long)]
    board: Option<String>,
    /// Only this dead-letter entry (repeatable).
    #[arg(long = "id", value_name = "ENTRY_ID", value_parser = parse_entry_id)]
    ids: Vec<String>,
}

fn parse_reason(text: &str) -> Result<Reason, String> {
    Reason::ALL
        .into_iter()
        .find(|r| r.as_str() == text)
        .ok_or_else(|| {
            let known: Vec<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
            format!("one of {}", known.join(", "))
        })
}

fn parse_entry_id(text: &str) -> Result<String, String> {
    is_entry_id(text)
        .then(|| text.to_string())
        .ok_or_else(|| "a stream entry ID such as 1764000000000-0".into())
}

impl Select {
    fn selection(self, settings: &Settings) -> Result<Selection, Usage> {
        if let Some(name) = &self.board {
            settings
                .board(name)
                .ok_or_else(|| Usage(format!("unknown board {name:?}")))?;
        }
        Ok(Selection {
            reason: self.reason,
            board: self.board,
            ids: self.ids,
        })
    }
}

/// Runs `dead-letters <action>`; returns the exit status.
pub(super) async fn run(settings: &Settings, action: Action) -> anyhow::Result<u8> {
    let stream = settings.ingest.dead_letter_stream.as_str();
    match action {
        Action::List {
            select,
            limit,
            json,
        } => {
            let selection = select.selection(settings)?;
            let store = connect(settings).await?;
            let mut pages = Pages::open(store.client(), stream, &selection).await?;
            let mut out = std::io::stdout().lock();
            let mut shown = 0;
            while let Some(page) = pages.next().await? {
                for letter in page {
                    if !selection.takes(&letter, &settings.boards) {
                        continue;
                    }
                    if shown == limit {
                        eprintln!("more letters match: raise --limit");
                        return Ok(0);
                    }
                    shown += 1;
                    print_letter(&mut out, &letter, json)?;
                }
            }
            if !json && shown == 0 {
                writeln!(out, "no dead letters in {stream} match")?;
            }
            Ok(0)
        }
        Action::Replay {
            select,
            dry_run,
            bare_keys,
        } => {
            let selection = select.selection(settings)?;
            let store = connect(settings).await?;
            // Redis's clock, as the consumer judges by (crate::domain::clock).
            let now = store.time_ms().await?;
            let replayer = Replayer::new(&store, &settings.boards, &settings.ingest, now)
                .dry_run(dry_run)
                .bare_keys(bare_keys);
            let mut counts = Counts::default();
            let ran = replayer
                .run(&selection, &mut counts, |letter, replay| {
                    println!("{} {}: {}", letter.entry_id, letter.reason, outcome(replay));
                })
                .await;
            println!("{}", summary(&counts, dry_run));
            ran.context("the replay stopped; the letters not yet replayed are left")?;
            Ok(u8::from(counts.refused > 0))
        }
    }
}

fn outcome(replay: &Replay) -> String {
    match replay {
        Replay::Replayed {
            applied,
            relettered,
        } => {
            let again = if relettered.is_empty() {
                String::new()
            } else {
                format!(" (new letter(s) for the rest: {})", relettered.join(", "))
            };
            format!("replayed to {}{again}; deleted", applied.join(", "))
        }
        Replay::Duplicate => "already counted; deleted".into(),
        Replay::Refused(why) => format!("still refused, left: {why}"),
        Replay::Would(to) => format!("would replay to {}", to.join(", ")),
    }
}

fn summary(counts: &Counts, dry_run: bool) -> String {
    let verb = if dry_run { "would replay" } else { "replayed" };
    let mut text = format!(
        "{verb} {}, already counted {}, still refused {}",
        counts.replayed, counts.duplicates, counts.refused
    );
    if counts.relettered > 0 {
        text.push_str(&format!(", new letters {}", counts.relettered));
    }
    text
}

fn print_letter(out: &mut impl Write, letter: &Letter, json: bool) -> anyhow::Result<()> {
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let (board, scope) = match &letter.refused_by {
        Some((board, scope)) => (Some(board.as_str()), scope.as_deref()),
        None => (None, None),
    };
    if json {
        let fields: serde_json::Map<String, serde_json::Value> = letter
            .fields
            .iter()
            .map(|(k, v)| (text(k), text(v).into()))
            .collect();
        let value = serde_json::json!({
            "entry_id": letter.entry_id,
            "reason": letter.reason,
            "board": board,
            "scope": scope,
            "source_id": letter.source_id,
            "source_stream": letter.source_stream,
            "detail": letter.detail,
            "fields": fields,
        });
        writeln!(out, "{value}")?;
        return Ok(());
    }
    let instance = match (board, scope) {
        (Some(b), Some(s)) => format!(" {b} [{s}]"),
        (Some(b), None) => format!(" {b}"),
        _ => String::new(),
    };
    let source = letter.source_stream.as_deref().unwrap_or("?");
    writeln!(
        out,
        "{} {}{instance} from {source} {}",
        letter.entry_id, letter.reason, letter.source_id
    )?;
    writeln!(out, "  detail: {}", letter.detail)?;
    let fields: Vec<String> = letter
        .fields
        .iter()
        .map(|(k, v)| format!("{}={:?}", text(k), text(v)))
        .collect();
    writeln!(out, "  fields: {}", fields.join(" "))?;
    Ok(())
}
