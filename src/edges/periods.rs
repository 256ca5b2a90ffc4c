//! The `period` of a query on a calendar-period board (`period=` over HTTP, `--period` on
//! the command line): which period instance it reads, and the answer relabelled with the
//! board's own scope, the period's id and its bounds.

use serde_json::Value;

use crate::domain::board::{period_instance, Board, PeriodSelector};
use crate::domain::period::Span;
use crate::domain::ranking::MemberWindows;

/// The period a query reads: on a period board, the instance of the chosen period (the
/// current one unless named); elsewhere nothing.
#[derive(Debug, Clone, Default)]
pub struct Selected {
    /// The instance name to read (see [`period_instance`]).
    instance: Option<String>,
    /// The period.
    span: Option<Span>,
    /// `day`, `week` or `month`: what a period board answers as its `window`.
    length: Option<&'static str>,
}

/// Why a query's `period` cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeriodError {
    /// A period on a board without one, or an id that names no period (HTTP 400).
    #[error("{0}")]
    Usage(String),
    /// A closed period the board no longer keeps (HTTP 404).
    #[error("{0}")]
    NotKept(String),
}

/// Resolves `period` (`current`, `previous` or an id) for `board` at `now`: a usage
/// error for a period on a board without one or an id that names no period, and
/// [`PeriodError::NotKept`] for a closed period beyond the board's `keep_periods`.
pub fn select(
    board: &Board,
    scope: Option<&str>,
    period: Option<&str>,
    now: i64,
) -> Result<Selected, PeriodError> {
    let Some(calendar) = &board.period else {
        return match period {
            Some(_) => Err(PeriodError::Usage(format!(
                "board {} has no calendar period: drop the period",
                board.name
            ))),
            None => Ok(Selected::default()),
        };
    };
    let selector = PeriodSelector::parse(period.unwrap_or("current"));
    let span = calendar.select(&selector, now).ok_or_else(|| {
        let name = calendar.period_name();
        match &selector {
            // Shaped as an id, but no period has it (`2026-02-30`, `2026-W60`): none kept.
            PeriodSelector::Id(id) if calendar.period.has_id_shape(id) => PeriodError::NotKept(
                format!("period {id} of board {}: no {name} has this id", board.name),
            ),
            _ => {
                let example = calendar.span_at(now).id;
                PeriodError::Usage(format!(
                    "period must be current, previous or a {name} id such as {example}"
                ))
            }
        }
    })?;
    if !calendar.keeps(&span, now) {
        return Err(PeriodError::NotKept(format!(
            "period {} of board {} is no longer kept (keep_periods = {}: the current {} and \
             the {} before it)",
            span.id,
            board.name,
            calendar.keep,
            calendar.period_name(),
            calendar.keep
        )));
    }
    Ok(Selected {
        instance: Some(period_instance(scope, &span.id)),
        span: Some(span),
        length: Some(calendar.period_name()),
    })
}

impl Selected {
    /// The instance to pass to the store in place of the scope.
    pub fn instance<'a>(&'a self, scope: Option<&'a str>) -> Option<&'a str> {
        self.instance.as_deref().or(scope)
    }

    /// The period read, if the board has periods.
    pub fn span(&self) -> Option<&Span> {
        self.span.as_ref()
    }

    /// What a period board answers as its `window`: the period's length (`week`).
    pub fn length(&self) -> Option<&'static str> {
        self.length
    }

    /// A member's answer in every window, relabelled as [`Selected::relabel`] relabels the
    /// others: its `scope` the board's scope value; on a period board its `period` the
    /// period's id, and its one window named by the period's length (`week`) with the
    /// period's bounds.
    pub fn relabel_windows(&self, answer: &mut MemberWindows, scope: Option<&str>) {
        answer.scope = scope.map(str::to_string);
        let (Some(span), Some(length)) = (&self.span, self.length) else {
            return;
        };
        answer.period = Some(span.id.clone());
        for window in &mut answer.windows {
            window.window = length.to_string();
            (window.window_from, window.window_to) = (span.start_ms, span.end_ms);
        }
    }

    /// An answer (a page, a rank, a subset) as JSON, relabelled: its `scope` the board's
    /// scope value, `window_from`/`window_to` the period's bounds, `period` its id, and a
    /// `window` (a subset's) the period's length (`week`).
    pub fn relabel(&self, mut answer: Value, scope: Option<&str>) -> Value {
        let (Some(span), Value::Object(fields)) = (&self.span, &mut answer) else {
            return answer;
        };
        fields.insert("scope".into(), scope.into());
        fields.insert("period".into(), span.id.clone().into());
        fields.insert("window_from".into(), span.start_ms.into());
        fields.insert("window_to".into(), span.end_ms.into());
        if let (Some(length), Some(window)) = (self.length, fields.get_mut("window")) {
            *window = length.into();
        }
        if let Some(Value::String(error)) = fields.get_mut("error") {
            if let Some(instance) = &self.instance {
                let shown = match scope {
                    Some(s) => format!("{s:?}"),
                    None => String::new(),
                };
                *error = error.replace(&format!(" (scope {instance:?})"), "");
                error.push_str(&format!(" (period {}", span.id));
                if !shown.is_empty() {
                    error.push_str(&format!(", scope {shown}"));
                }
                error.push(')');
            }
        }
        answer
    }
}
