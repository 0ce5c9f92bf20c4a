//! The workflow's graph: its nodes in layers from `$start` down, each with its state in this
//! run, and its edges (plain `after`, decision cases, `failure` handlers, a gate's `on_fail`).
//!
//! The layout is dagre-dgl-rs's, a port of dagre-js (the layered, Sugiyama-style layout that
//! dot popularised): it ranks the nodes, orders each layer to keep crossings down, places them
//! (Brandes–Köpf), and gives every edge bend points through dummy nodes in the layers it
//! crosses. Those bend points are why it was chosen over rust-sugiyama, which gives only node
//! coordinates: an edge drawn through its own dummies keeps off the other boxes, where an edge
//! drawn straight between its two ends crossed whatever sat between them.
//!
//! Edges that go back up (a gate's `on_fail`, and any route or handler into a node that leads
//! to its source) are left out of the layout, which so lays out a DAG whose layers follow the
//! run. They are drawn dashed, with the class `back`, out of their source's side and round the
//! drawing in a lane of their own into the target's side, so that a loop never lies on the
//! forward edge between the same two nodes.
//!
//! Between layers an edge runs only in the gap between the layers' boxes; inside a layer it
//! runs straight up or down at its dummy's place (or beside its own box, or in a back edge's
//! lane), which is clear of every box. That is what keeps edges off other boxes whatever the
//! layout's coordinates are.

//!
//! Here: the drawing itself (`graph`). `edges.rs` says which edges there are and which go back;
//! `route.rs` lays the boxes out and routes each edge.

mod edges;
mod route;

use std::collections::HashMap;
use std::fmt::Write as _;

use dagre_dgl_rs::Point;
use engine::definition::Definition;

use crate::console::escape::escape;
use crate::console::svg::{symbol, text_width};
use edges::{Link, START, links};
use route::{backward, bands, forward, lay_out, path_d, self_loop};

const BOX_H: f64 = 46.0;
const START_H: f64 = 28.0;
const NAME_FONT: f64 = 12.0;
const STATE_FONT: f64 = 11.0;
/// The room around the drawing.
const PAD: f64 = 10.0;

/// The words under a node's name.
fn state_line(kind: &str, sym: &str, state: &str) -> String {
    format!("{sym} {kind} · {state}")
}

/// The workflow's graph with each node's latest state in this run (`states`: node → state).
pub(in crate::console) fn graph(def: &Definition, states: &HashMap<String, String>) -> String {
    let state_of = |id: &str| states.get(id).map_or("not reached", String::as_str);
    let start_text = match states.get(START) {
        Some(s) => format!("{} {START} · {s}", symbol(s).0),
        None => START.to_owned(),
    };
    let mut sizes = vec![(START.to_owned(), (text_width(&start_text, STATE_FONT) + 24.0).max(64.0), START_H)];
    for n in &def.nodes {
        let id = n.id.as_str();
        let (sym, _) = symbol(state_of(id));
        // Bold names run wider than the average glyph.
        let name = text_width(id, NAME_FONT) * 1.1;
        let words = text_width(&state_line(n.kind.name(), sym, state_of(id)), STATE_FONT);
        sizes.push((id.to_owned(), (name.max(words) + 24.0).max(150.0), BOX_H));
    }
    let links = links(def);
    let (boxes, bends) = lay_out(&sizes, &links);
    let bands = bands(&boxes);
    let ends = |l: &Link| Some((*boxes.get(&l.from)?, *boxes.get(&l.to)?));
    let mut paths: Vec<Vec<Point>> = links
        .iter()
        .zip(&bends)
        .map(|(l, b)| match ends(l) {
            Some((s, _)) if l.from == l.to => self_loop(s),
            Some((s, t)) if !l.back => forward(s, t, b, &bands),
            _ => Vec::new(),
        })
        .collect();
    // Back edges go round what is drawn, the shortest first, so that longer loops go round
    // shorter ones.
    let mut back: Vec<usize> = (0..links.len()).filter(|&i| links[i].back && links[i].from != links[i].to).collect();
    back.sort_by(|&a, &b| {
        let span = |i: usize| ends(&links[i]).map_or(0.0, |(s, t)| (s.y - t.y).abs());
        span(a).total_cmp(&span(b))
    });
    let mut ports = HashMap::new();
    for i in back {
        let Some((s, t)) = ends(&links[i]) else {
            continue;
        };
        let drawn: Vec<&Vec<Point>> = paths.iter().collect();
        let route = backward(s, t, &bands, &boxes, &drawn, &mut ports, (&links[i].from, &links[i].to));
        paths[i] = route;
    }

    // The view fits what was drawn: every box and every edge, with room for the arrowheads.
    let (mut x0, mut y0, mut x1, mut y1) = (f64::MAX, f64::MAX, f64::MIN, f64::MIN);
    for r in boxes.values() {
        (x0, y0, x1, y1) = (x0.min(r.x), y0.min(r.y), x1.max(r.x + r.w), y1.max(r.y + r.h));
    }
    for p in paths.iter().flatten() {
        (x0, y0, x1, y1) = (x0.min(p.x), y0.min(p.y), x1.max(p.x), y1.max(p.y));
    }
    let (x0, y0, w, h) = (x0 - PAD, y0 - PAD, x1 - x0 + 2.0 * PAD, y1 - y0 + 2.0 * PAD);

    let mut out = String::new();
    let summary = format!("Graph of {} nodes, {} reached in this run", def.nodes.len(), states.len());
    let _ = write!(
        out,
        "<svg class=\"graph\" viewBox=\"{x0:.1} {y0:.1} {w:.1} {h:.1}\" width=\"{w:.0}\" height=\"{h:.0}\" role=\"img\" aria-label=\"{}\" xmlns=\"http://www.w3.org/2000/svg\"><title>{}</title>\
         <defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" markerWidth=\"7\" markerHeight=\"7\" orient=\"auto-start-reverse\"><path d=\"M 0 0 L 10 5 L 0 10 z\"/></marker></defs>",
        escape(&summary),
        escape(&summary)
    );
    for (l, pts) in links.iter().zip(&paths) {
        let (back, dash, how) = if l.back { (" back", " stroke-dasharray=\"6 4\"", ", back") } else { ("", "", "") };
        let _ = write!(
            out,
            "<path class=\"edge {}{back}\" data-from=\"{}\" data-to=\"{}\" d=\"{}\" fill=\"none\"{dash} marker-end=\"url(#arrow)\"><title>{} → {} ({}{how})</title></path>",
            l.class,
            escape(&l.from),
            escape(&l.to),
            path_d(pts),
            escape(&l.from),
            escape(&l.to),
            l.class,
        );
    }
    let start = boxes[START];
    // Every run passes `$start`; only a run that waited for its approval there has a state.
    let start_class = states.get(START).map_or("", |s| symbol(s).1);
    let entries: Vec<&str> = links.iter().filter(|l| l.from == START).map(|l| l.to.as_str()).collect();
    let _ = write!(
        out,
        "<g class=\"node start {start_class}\" data-node=\"{START}\"><title>{START}: where a run begins ({}){}</title>\
         <rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{START_H}\" rx=\"{}\"/>\
         <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" class=\"name\" font-size=\"{STATE_FONT}\">{}</text></g>",
        escape(&entries.join(", ")),
        states.get(START).map(|s| format!(": {s}")).unwrap_or_default(),
        start.x,
        start.y,
        start.w,
        START_H / 2.0,
        start.cx(),
        start.cy() + 4.0,
        escape(&start_text),
    );
    for n in &def.nodes {
        let id = n.id.as_str();
        let r = boxes[id];
        let state = state_of(id);
        let (sym, class) = symbol(state);
        let name = escape(id);
        let _ = write!(
            out,
            "<g class=\"node {class}\" data-node=\"{name}\"><title>{name} ({}): {state}</title>\
             <rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{BOX_H}\" rx=\"6\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" class=\"name\" font-size=\"{NAME_FONT}\">{name}</text>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" class=\"state\" font-size=\"{STATE_FONT}\">{}</text></g>",
            n.kind.name(),
            r.x,
            r.y,
            r.w,
            r.cx(),
            r.y + 19.0,
            r.cx(),
            r.y + 37.0,
            escape(&state_line(n.kind.name(), sym, state)),
        );
    }
    out.push_str("</svg>");
    out
}
