//! The waterfall: each step a bar against the run's clock, its label on the left and its state
//! and duration on the right. The right-hand column is as wide as its longest text, so a bar
//! that ends at the run's end still has its words inside the picture; a left label too long
//! for its column is cut with an ellipsis and given whole in the bar's `<title>`.

use std::fmt::Write as _;

use chrono::{DateTime, Utc};

use super::super::escape::escape;
use super::super::view::duration;
use super::{symbol, text_width};

/// The picture's width in user units; the page scales it to the column.
const W: f64 = 800.0;
/// The left column, for the steps' names.
const LABEL: f64 = 230.0;
const ROW: f64 = 26.0;
/// Room between a text and what it sits next to.
const GAP: f64 = 8.0;
/// Font sizes of the step names, and of the state words and clock ticks (as in `console.css`).
const LABEL_FONT: f64 = 12.0;
const SMALL_FONT: f64 = 11.0;

/// One bar of the waterfall.
pub(in crate::console) struct Bar<'a> {
    pub label: String,
    pub state: &'a str,
    pub start: DateTime<Utc>,
    pub end: Option<DateTime<Utc>>,
}

/// `text` cut to fit `room` at `font_size`, with an ellipsis where it was cut.
fn fit(text: &str, room: f64, font_size: f64) -> String {
    if text_width(text, font_size) <= room {
        return text.to_owned();
    }
    let keep = ((room / (0.6 * font_size)).floor() as usize).saturating_sub(1);
    let mut cut: String = text.chars().take(keep).collect();
    cut.push('…');
    cut
}

/// Steps as bars against the clock, from the run's creation to its end (or now).
pub(in crate::console) fn waterfall(bars: &[Bar<'_>], from: DateTime<Utc>, to: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let span = (to - from).num_milliseconds().max(1) as f64;
    let height = ROW * bars.len().max(1) as f64 + 24.0;
    let rows: Vec<(DateTime<Utc>, String)> = bars
        .iter()
        .map(|b| {
            let end = b.end.unwrap_or(now).min(to.max(b.start));
            let secs = (end - b.start).num_milliseconds().max(0) as f64 / 1000.0;
            (end, format!("{} {} · {}", symbol(b.state).0, b.state, duration(secs)))
        })
        .collect();
    let total = format!("+{}", duration(span / 1000.0));
    // The plot ends where the longest state text still fits after a bar that runs to the end
    // (the end tick, anchored at the plot's end, needs no room past it).
    let right = rows.iter().map(|(_, s)| text_width(s, SMALL_FONT)).fold(0.0, f64::max) + 2.0 * GAP;
    let plot = (W - LABEL - right).max(100.0);

    let mut out = String::new();
    let summary = format!("Waterfall of {} steps over {}", bars.len(), duration(span / 1000.0));
    let _ = write!(
        out,
        "<svg class=\"waterfall\" viewBox=\"0 0 {W} {height}\" role=\"img\" aria-label=\"{}\" xmlns=\"http://www.w3.org/2000/svg\"><title>{}</title>",
        escape(&summary),
        escape(&summary)
    );
    let _ = write!(out, "<line class=\"axis\" x1=\"{LABEL}\" y1=\"0\" x2=\"{LABEL}\" y2=\"{}\"/>", height - 20.0);
    for (i, (b, (end, state_text))) in bars.iter().zip(&rows).enumerate() {
        let y = i as f64 * ROW + 4.0;
        let x0 = LABEL + plot * ((b.start - from).num_milliseconds() as f64 / span).clamp(0.0, 1.0);
        // A bar never runs past the plot, whatever the clocks say, so its text has its room.
        let width = (plot * ((*end - b.start).num_milliseconds().max(0) as f64 / span)).min(LABEL + plot - x0).max(3.0);
        let (_, class) = symbol(b.state);
        let shown = fit(&b.label, LABEL - 2.0 * GAP, LABEL_FONT);
        let _ = write!(
            out,
            "<g class=\"bar {class}\"><title>{}: {}</title>\
             <text x=\"{:.1}\" y=\"{:.1}\" class=\"label\" font-size=\"{LABEL_FONT}\" text-anchor=\"end\">{}</text>\
             <rect x=\"{x0:.1}\" y=\"{y:.1}\" width=\"{width:.1}\" height=\"{:.1}\" rx=\"3\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" class=\"state\" font-size=\"{SMALL_FONT}\">{}</text></g>",
            escape(&b.label),
            escape(state_text),
            LABEL - GAP,
            y + 14.0,
            escape(&shown),
            ROW - 8.0,
            x0 + width + 6.0,
            y + 14.0,
            escape(state_text),
        );
    }
    let _ = write!(
        out,
        "<text x=\"{LABEL}\" y=\"{:.1}\" class=\"tick\" font-size=\"{SMALL_FONT}\">{}</text>\
         <text x=\"{:.1}\" y=\"{:.1}\" class=\"tick\" font-size=\"{SMALL_FONT}\" text-anchor=\"end\">{}</text></svg>",
        height - 4.0,
        from.format("%H:%M:%S"),
        LABEL + plot,
        height - 4.0,
        escape(&total),
    );
    out
}
