//! Tables and colour for the command line.
//!
//! Colour is used only when standard output is a terminal and `NO_COLOR` is unset or empty
//! (<https://no-color.org>); a pipe or a file gets plain text. Columns are padded by the width
//! the text shows, so colour codes never shift them.

use std::io::IsTerminal as _;

use chrono::{DateTime, Utc};

/// Whether to colour, decided once per command.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Style {
    pub color: bool,
}

/// A colour for a cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tint {
    Plain,
    Bold,
    Dim,
    Green,
    Red,
    Yellow,
    Cyan,
}

impl Style {
    pub(crate) fn detect() -> Style {
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        Style { color: !no_color && std::io::stdout().is_terminal() }
    }

    pub(crate) fn paint(self, tint: Tint, text: &str) -> String {
        let code = match tint {
            Tint::Plain => return text.to_owned(),
            Tint::Bold => "1",
            Tint::Dim => "2",
            Tint::Green => "32",
            Tint::Red => "31",
            Tint::Yellow => "33",
            Tint::Cyan => "36",
        };
        if self.color && !text.is_empty() { format!("\x1b[{code}m{text}\x1b[0m") } else { text.to_owned() }
    }
}

/// The colour of a run's or step's status.
pub(crate) fn status_tint(status: &str) -> Tint {
    match status {
        "completed" | "succeeded" | "approved" => Tint::Green,
        "failed" | "rejected" => Tint::Red,
        "cancelled" | "withdrawn" => Tint::Dim,
        "waiting" | "awaiting_signal" | "waiting for approval" => Tint::Yellow,
        "running" | "leased" | "executing" => Tint::Cyan,
        _ => Tint::Plain,
    }
}

/// A table: a header and rows of cells.
pub(crate) struct Table {
    headers: Vec<&'static str>,
    rows: Vec<Vec<(String, Tint)>>,
}

impl Table {
    pub(crate) fn new(headers: &[&'static str]) -> Table {
        Table { headers: headers.to_vec(), rows: Vec::new() }
    }

    pub(crate) fn row(&mut self, cells: Vec<(String, Tint)>) {
        self.rows.push(cells);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The widths of the columns: the widest cell of each, header included.
    pub(crate) fn widths(&self) -> Vec<usize> {
        let mut w: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, (text, _)) in row.iter().enumerate() {
                if let Some(slot) = w.get_mut(i) {
                    *slot = (*slot).max(text.chars().count());
                }
            }
        }
        w
    }

    /// The table as lines, header first.
    pub(crate) fn render(&self, style: Style) -> Vec<String> {
        let widths = self.widths();
        let header: Vec<(String, Tint)> = self.headers.iter().map(|h| ((*h).to_owned(), Tint::Bold)).collect();
        std::iter::once(&header).chain(self.rows.iter()).map(|row| line(row, &widths, style)).collect()
    }
}

/// One row padded to `widths` (the last column is not padded).
pub(crate) fn line(row: &[(String, Tint)], widths: &[usize], style: Style) -> String {
    let mut out = String::new();
    for (i, (text, tint)) in row.iter().enumerate() {
        if i > 0 {
            out.push_str("  ");
        }
        out.push_str(&style.paint(*tint, text));
        if i + 1 < row.len() {
            let width = widths.get(i).copied().unwrap_or(0);
            let shown = text.chars().count();
            out.extend(std::iter::repeat_n(' ', width.saturating_sub(shown)));
        }
    }
    out.trim_end().to_owned()
}

pub(crate) fn plain(text: impl Into<String>) -> (String, Tint) {
    (text.into(), Tint::Plain)
}

/// "12s ago", "5m ago", "3h ago", "2d ago"; a time in the future reads "in 5m".
pub(crate) fn ago(at: DateTime<Utc>) -> String {
    ago_in(at, ["s", "m", "h", "d"])
}

/// How long ago `at` was, in whole seconds, minutes, hours or days spelled as `units` says
/// (the console writes "3 min ago"); a time in the future reads "in 3 min".
pub fn ago_in(at: DateTime<Utc>, units: [&str; 4]) -> String {
    let secs = (Utc::now() - at).num_seconds();
    let (n, future) = if secs < 0 { (-secs, true) } else { (secs, false) };
    let [s, m, h, d] = units;
    let span = if n < 60 {
        format!("{n}{s}")
    } else if n < 3600 {
        format!("{}{m}", n / 60)
    } else if n < 86_400 {
        format!("{}{h}", n / 3600)
    } else {
        format!("{}{d}", n / 86_400)
    };
    if future { format!("in {span}") } else { format!("{span} ago") }
}

/// A time as the operator reads it: `2025-05-01 14:03:07Z`.
pub(crate) fn stamp(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%d %H:%M:%SZ").to_string()
}

/// A time of day, for lines of a live stream: `14:03:07`.
pub(crate) fn clock(at: DateTime<Utc>) -> String {
    at.format("%H:%M:%S").to_string()
}

/// How long between two times: `2.4s`, `3m10s`, `1h05m`.
pub(crate) fn span(from: DateTime<Utc>, to: DateTime<Utc>) -> String {
    let ms = (to - from).num_milliseconds().max(0);
    if ms < 60_000 {
        format!("{:.1}s", ms as f64 / 1000.0)
    } else if ms < 3_600_000 {
        format!("{}m{:02}s", ms / 60_000, (ms / 1000) % 60)
    } else {
        format!("{}h{:02}m", ms / 3_600_000, (ms / 60_000) % 60)
    }
}
