//! What the commands print beyond one line: a page of a ranking (a table, or one JSON
//! line), words quoted for a shell, and the progress of a long run on standard error.

use std::io::Write;

use super::time::{as_of, show_time};
use crate::domain::ranking::{format_total, Entry, Envelope, Page};

/// The head line of a table of answers: board, scope, how many are ranked, the window
/// and when the ranking last changed.
pub(super) fn head_line(envelope: &Envelope) -> String {
    let scope = envelope
        .scope
        .as_deref()
        .map(|s| format!(" [{s}]"))
        .unwrap_or_default();
    format!(
        "{}{scope}: {} ranked, window {} {} .. {}{}",
        envelope.board,
        envelope.count,
        envelope.window,
        show_time(envelope.window_from),
        show_time(envelope.window_to),
        as_of(envelope.as_of)
    )
}

/// Prints `page` as a table (a head line, then one row per entry), or as one JSON line.
pub(super) fn print_page(page: &Page, json: bool) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{}", serde_json::to_string(page)?)?;
        return Ok(());
    }
    writeln!(out, "{}", head_line(&page.envelope))?;
    let width = member_width(page.entries.iter().map(|e| e.member.as_str()));
    let dense = page.entries.iter().any(|e| e.dense_rank.is_some());
    writeln!(
        out,
        "{:>6} {:>6}{} {:>6}  {:<width$}  {:>20}  LAST",
        "RANK",
        "COMP",
        if dense { "  DENSE" } else { "" },
        "PCTL",
        "MEMBER",
        "TOTAL"
    )?;
    for Entry {
        rank,
        competition_rank,
        dense_rank,
        percentile,
        member,
        total,
        last_ts,
    } in &page.entries
    {
        let last = last_ts.map(show_time).unwrap_or_else(|| "-".into());
        let dense = dense_rank.map(|d| format!(" {d:>6}")).unwrap_or_default();
        writeln!(
            out,
            "{rank:>6} {competition_rank:>6}{dense} {:>6}  {member:<width$}  {:>20}  {last}",
            percentile.to_string(),
            format_total(*total, page.envelope.scale)
        )?;
    }
    Ok(())
}

/// The width of a MEMBER column holding `members`: the longest, at least the heading's.
pub(super) fn member_width<'a>(members: impl Iterator<Item = &'a str>) -> usize {
    members.map(|m| m.chars().count()).max().unwrap_or(6).max(6)
}

/// `text` quoted for a POSIX shell when it holds anything but plain characters.
pub(super) fn shell_word(text: &str) -> String {
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
pub(super) struct Progress {
    total: usize,
    done: usize,
    terminal: bool,
    last: std::time::Instant,
    shown: bool,
}

/// Instances between two progress lines when standard error is not a terminal.
const PROGRESS_EVERY: usize = 1000;

impl Progress {
    /// Progress over `total` instances, none done yet.
    pub(super) fn new(total: usize) -> Progress {
        use std::io::IsTerminal;
        Progress {
            total,
            done: 0,
            terminal: std::io::stderr().is_terminal(),
            last: std::time::Instant::now(),
            shown: false,
        }
    }

    /// One more instance done, `differing` of all those done so far differing.
    pub(super) fn step(&mut self, differing: u64) {
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

    /// The closing line, when any progress line was shown.
    pub(super) fn done(&self) {
        if self.shown {
            eprintln!("verify: {}/{} instance(s) checked", self.done, self.total);
        }
    }
}
