//! The run page's pictures, as inline SVG made on the server: the waterfall (each step a bar
//! against the run's clock) and the graph (the workflow's nodes in layers, each with its state).
//! State is never only a colour: every bar and node also carries a symbol and the state's word,
//! and each picture has a text alternative.

use std::collections::HashMap;
use std::fmt::Write as _;

use chrono::{DateTime, Utc};
use engine::definition::{Definition, NodeKind};

use super::error::escape;

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

/// One bar of the waterfall.
pub(super) struct Bar<'a> {
    pub label: String,
    pub state: &'a str,
    pub start: DateTime<Utc>,
    pub end: Option<DateTime<Utc>>,
}

/// Steps as bars against the clock, from the run's creation to its end (or now).
pub(super) fn waterfall(bars: &[Bar<'_>], from: DateTime<Utc>, to: DateTime<Utc>, now: DateTime<Utc>) -> String {
    const W: f64 = 800.0;
    const LABEL: f64 = 230.0;
    const ROW: f64 = 26.0;
    let span = (to - from).num_milliseconds().max(1) as f64;
    let height = ROW * bars.len().max(1) as f64 + 24.0;
    let mut out = String::new();
    let summary = format!("Waterfall of {} steps over {}", bars.len(), super::view::duration(span / 1000.0));
    let _ = write!(
        out,
        "<svg class=\"waterfall\" viewBox=\"0 0 {W} {height}\" role=\"img\" aria-label=\"{}\" xmlns=\"http://www.w3.org/2000/svg\"><title>{}</title>",
        escape(&summary),
        escape(&summary)
    );
    let plot = W - LABEL - 110.0;
    let _ = write!(out, "<line class=\"axis\" x1=\"{LABEL}\" y1=\"0\" x2=\"{LABEL}\" y2=\"{}\"/>", height - 20.0);
    for (i, b) in bars.iter().enumerate() {
        let y = i as f64 * ROW + 4.0;
        let end = b.end.unwrap_or(now).min(to.max(b.start));
        let x0 = LABEL + plot * ((b.start - from).num_milliseconds().max(0) as f64 / span);
        let width = (plot * ((end - b.start).num_milliseconds().max(0) as f64 / span)).max(3.0);
        let (sym, class) = symbol(b.state);
        let secs = (end - b.start).num_milliseconds().max(0) as f64 / 1000.0;
        let label = escape(&b.label);
        let _ = write!(
            out,
            "<g class=\"bar {class}\"><title>{label}: {} {}, {}</title>\
             <text x=\"{:.1}\" y=\"{:.1}\" class=\"label\" text-anchor=\"end\">{label}</text>\
             <rect x=\"{x0:.1}\" y=\"{y:.1}\" width=\"{width:.1}\" height=\"{:.1}\" rx=\"3\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" class=\"state\">{sym} {} · {}</text></g>",
            b.state,
            sym,
            super::view::duration(secs),
            LABEL - 8.0,
            y + 14.0,
            ROW - 8.0,
            x0 + width + 6.0,
            y + 14.0,
            b.state,
            super::view::duration(secs),
        );
    }
    let _ = write!(
        out,
        "<text x=\"{LABEL}\" y=\"{:.1}\" class=\"tick\">{}</text><text x=\"{:.1}\" y=\"{:.1}\" class=\"tick\" text-anchor=\"end\">+{}</text></svg>",
        height - 4.0,
        from.format("%H:%M:%S"),
        LABEL + plot,
        height - 4.0,
        super::view::duration(span / 1000.0)
    );
    out
}

/// The nodes' layers: a node sits one below the lowest of the nodes it comes after. Only plain
/// `after` edges count, so loops back (a gate's `on_fail`) do not lift a node.
fn layers(def: &Definition) -> HashMap<String, usize> {
    let mut layer: HashMap<String, usize> = def.nodes.iter().map(|n| (n.id.to_string(), 0)).collect();
    for _ in 0..def.nodes.len() {
        let mut changed = false;
        for n in &def.nodes {
            let want = n.after.iter().filter_map(|a| layer.get(&a.to_string()).map(|l| l + 1)).max().unwrap_or(0);
            let cur = layer.get_mut(&n.id.to_string()).expect("every node has a layer");
            if want > *cur && want <= def.nodes.len() {
                *cur = want;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    layer
}

/// The workflow's graph with each node's latest state in this run (`states`: node → state).
pub(super) fn graph(def: &Definition, states: &HashMap<String, String>) -> String {
    const W: f64 = 800.0;
    const BOX_W: f64 = 170.0;
    const BOX_H: f64 = 46.0;
    const ROW: f64 = 84.0;
    let layer = layers(def);
    let rows = layer.values().copied().max().unwrap_or(0) + 1;
    let mut by_row: Vec<Vec<&engine::definition::Node>> = vec![Vec::new(); rows];
    for n in &def.nodes {
        by_row[layer[&n.id.to_string()]].push(n);
    }
    let mut at: HashMap<String, (f64, f64)> = HashMap::new();
    for (r, nodes) in by_row.iter().enumerate() {
        let slot = W / nodes.len().max(1) as f64;
        for (i, n) in nodes.iter().enumerate() {
            let cx = slot * (i as f64 + 0.5);
            at.insert(n.id.to_string(), (cx, r as f64 * ROW + 10.0));
        }
    }
    let height = rows as f64 * ROW;
    let mut out = String::new();
    let visited = states.len();
    let summary = format!("Graph of {} nodes, {visited} reached in this run", def.nodes.len());
    let _ = write!(
        out,
        "<svg class=\"graph\" viewBox=\"0 0 {W} {height}\" role=\"img\" aria-label=\"{}\" xmlns=\"http://www.w3.org/2000/svg\"><title>{}</title>\
         <defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" markerWidth=\"7\" markerHeight=\"7\" orient=\"auto-start-reverse\"><path d=\"M 0 0 L 10 5 L 0 10 z\"/></marker></defs>",
        escape(&summary),
        escape(&summary)
    );
    let edge = |from: &str, to: &str, class: &str, out: &mut String| {
        let (Some(&(x1, y1)), Some(&(x2, y2))) = (at.get(from), at.get(to)) else { return };
        let (y1, y2) = if y2 > y1 { (y1 + BOX_H, y2) } else { (y1, y2 + BOX_H) };
        let _ = write!(out, "<line class=\"edge {class}\" x1=\"{x1:.1}\" y1=\"{y1:.1}\" x2=\"{x2:.1}\" y2=\"{y2:.1}\" marker-end=\"url(#arrow)\"/>");
    };
    for n in &def.nodes {
        let id = n.id.to_string();
        for a in &n.after {
            edge(&a.to_string(), &id, "plain", &mut out);
        }
        match &n.kind {
            NodeKind::Gate(g) => {
                if let Some(back) = &g.on_fail {
                    edge(&id, &back.to_string(), "loop", &mut out);
                }
            }
            NodeKind::Decision(d) => {
                for c in &d.cases {
                    if !def.nodes.iter().any(|m| m.id == c.to && m.after.contains(&n.id)) {
                        edge(&id, &c.to.to_string(), "case", &mut out);
                    }
                }
            }
            _ => {}
        }
        if let Some(f) = &n.failure {
            edge(&id, &f.to_string(), "failure", &mut out);
        }
    }
    for n in &def.nodes {
        let id = n.id.to_string();
        let (cx, y) = at[&id];
        let state = states.get(&id).map_or("not reached", String::as_str);
        let (sym, class) = symbol(state);
        let name = escape(&id);
        let _ = write!(
            out,
            "<g class=\"node {class}\"><title>{name} ({}): {state}</title>\
             <rect x=\"{:.1}\" y=\"{y:.1}\" width=\"{BOX_W}\" height=\"{BOX_H}\" rx=\"6\"/>\
             <text x=\"{cx:.1}\" y=\"{:.1}\" text-anchor=\"middle\" class=\"name\">{name}</text>\
             <text x=\"{cx:.1}\" y=\"{:.1}\" text-anchor=\"middle\" class=\"state\">{sym} {} · {state}</text></g>",
            n.kind.name(),
            cx - BOX_W / 2.0,
            y + 19.0,
            y + 37.0,
            n.kind.name(),
        );
    }
    out.push_str("</svg>");
    out
}
