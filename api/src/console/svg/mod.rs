//! The run page's pictures, as inline SVG made on the server: the waterfall (each step a bar
//! against the run's clock) and the graph (the workflow's nodes in layers, each with its state).
//! State is never only a colour: every bar and node also carries a symbol and the state's word,
//! and each picture has a text alternative.
//!
//! Text sizes are written on each `<text>` as well as in `console.css`, so that the pictures'
//! own code (and their tests) can measure a label against the room it has.

mod graph;
mod waterfall;

#[cfg(test)]
mod tests;

pub(super) use graph::graph;
pub(super) use waterfall::{Bar, waterfall};

/// How wide a line of text is taken to be, in user units: an average glyph of 0.6 em. Labels
/// are given room by this estimate, so it errs wide.
fn text_width(text: &str, font_size: f64) -> f64 {
    text.chars().count() as f64 * 0.6 * font_size
}

/// A state's symbol and CSS class.
pub(super) fn symbol(state: &str) -> (&'static str, &'static str) {
    match state {
        "succeeded" | "completed" => ("✓", "ok"),
        "failed" => ("✗", "bad"),
        "cancelled" => ("⊘", "off"),
        "running" | "leased" => ("▶", "run"),
        "waiting" => ("‖", "wait"),
        "pending" => ("…", "wait"),
        _ => ("○", "none"),
    }
}
