//! `rollboard send`: JSON-lines events appended to the stream, all or nothing. The input
//! is read twice (checked, then appended batch by batch), never held whole: a line at a
//! time, a batch at a time.

use std::io::{BufRead, Read, Seek, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;

use super::connect::connect;
use crate::config::Settings;
use crate::domain::board::Board;
use crate::ingest::intake;
use crate::store::Store;

/// Longest line `send` accepts, in bytes (without its line break).
pub const MAX_LINE_BYTES: usize = 1 << 20;
/// Most events `send` appends in one batch (one MULTI/EXEC per partition).
const SEND_BATCH_EVENTS: usize = 1_000;
/// Most line bytes `send` holds for one MULTI/EXEC.
const SEND_BATCH_BYTES: usize = 4 << 20;
/// Invalid lines `send` lists; further ones are only counted, so memory stays bounded.
const MAX_LISTED_ERRORS: usize = 100;

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
pub(super) async fn send(settings: &Settings, file: Option<PathBuf>) -> anyhow::Result<u8> {
    let regular = file
        .as_deref()
        .and_then(|p| std::fs::metadata(p).ok())
        .is_some_and(|m| m.is_file());
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
        report_invalid(&checked);
        return Ok(1);
    }
    let second = second_pass(spool, file.as_deref())?;
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

fn open(path: &Path) -> anyhow::Result<std::fs::File> {
    std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))
}

/// Lists the invalid lines the first pass kept (and how many more it only counted).
fn report_invalid(checked: &Checked) {
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
}

/// The input of the second pass: the spool rewound, or the regular file opened again.
fn second_pass(
    spool: Option<std::io::BufWriter<std::fs::File>>,
    file: Option<&Path>,
) -> anyhow::Result<Box<dyn BufRead>> {
    Ok(match (spool, file) {
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
    })
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
