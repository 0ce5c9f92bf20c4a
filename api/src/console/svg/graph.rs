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

use std::collections::HashMap;
use std::fmt::Write as _;

use dagre_dgl_rs::{EdgeLabel, Graph, GraphLabel, NodeLabel, Point};
use engine::definition::{Definition, Node, NodeKind};
use engine::store::approvals::RUN_APPROVAL_NODE;

use super::super::error::escape;
use super::{symbol, text_width};

/// The drawn entry, named as the engine names a run's own approval step.
const START: &str = RUN_APPROVAL_NODE;
const BOX_H: f64 = 46.0;
const START_H: f64 = 28.0;
const NAME_FONT: f64 = 12.0;
const STATE_FONT: f64 = 11.0;
/// How far a back edge leaves its box's side before it turns. Less than half the layout's
/// `nodesep`, so the turn stays clear of the next box in the layer.
const STUB: f64 = 16.0;
/// The radius of an edge's rounded corners.
const CORNER: f64 = 8.0;
/// The room around the drawing.
const PAD: f64 = 10.0;

/// One edge as drawn.
struct Link {
    from: String,
    to: String,
    /// `plain`, `loop`, `case` or `failure` (`console.css`).
    class: &'static str,
    /// Whether it goes back up, against the layout's direction.
    back: bool,
}

/// A box, by its top-left corner.
#[derive(Clone, Copy)]
struct Rect {
    x: f64,
    y: f64,
    w: f64,
    h: f64,
}

impl Rect {
    fn cx(self) -> f64 {
        self.x + self.w / 2.0
    }
    fn cy(self) -> f64 {
        self.y + self.h / 2.0
    }
}

/// The nodes a node leads to by the walker's forward edges (`after` and a decision's routes).
fn successors<'d>(def: &'d Definition, n: &str) -> Vec<&'d str> {
    let mut out: Vec<&str> = def
        .nodes
        .iter()
        .filter(|m| m.after.iter().any(|a| a == n))
        .map(|m| m.id.as_str())
        .collect();
    if let Some(NodeKind::Decision(d)) = def.nodes.iter().find(|m| m.id == n).map(|m| &m.kind) {
        out.extend(
            d.cases
                .iter()
                .map(|c| c.to.as_str())
                .chain(d.default.as_deref()),
        );
    }
    out
}

/// Whether `to` can be reached from `from` by forward edges.
fn reaches(def: &Definition, from: &str, to: &str) -> bool {
    let mut seen: Vec<&str> = Vec::new();
    let mut stack = vec![from];
    while let Some(n) = stack.pop() {
        if n == to {
            return true;
        }
        if !seen.contains(&n) {
            seen.push(n);
            stack.extend(successors(def, n));
        }
    }
    false
}

/// Whether a node starts a run, by the walker's rule (`walk::is_root`): no `after`, no handler
/// edge into it, and any route into it comes from a decision downstream of it.
fn is_root(def: &Definition, n: &Node) -> bool {
    n.after.is_empty()
        && def.nodes.iter().all(|m| {
            let handles = m.failure.as_ref() == Some(&n.id);
            let routes = matches!(&m.kind, NodeKind::Decision(d) if d.cases.iter().map(|c| &c.to).chain(&d.default).any(|t| *t == n.id));
            !handles && (!routes || reaches(def, n.id.as_str(), m.id.as_str()))
        })
}

/// Every edge to draw, `$start`'s first; which go back is decided by a depth-first walk from
/// `$start` that takes a node's loops last, so the forward edges are the ones a run takes first.
fn links(def: &Definition) -> Vec<Link> {
    let mut links = Vec::new();
    let link = |from: &str, to: &str, class| Link {
        from: from.to_owned(),
        to: to.to_owned(),
        class,
        back: false,
    };
    for n in def.nodes.iter().filter(|n| is_root(def, n)) {
        links.push(link(START, n.id.as_str(), "plain"));
    }
    for n in &def.nodes {
        for a in &n.after {
            links.push(link(a.as_str(), n.id.as_str(), "plain"));
        }
        match &n.kind {
            NodeKind::Decision(d) => {
                for to in d.cases.iter().map(|c| &c.to).chain(&d.default) {
                    let covered = def
                        .nodes
                        .iter()
                        .any(|m| m.id == *to && m.after.contains(&n.id));
                    if !covered
                        && !links
                            .iter()
                            .any(|l: &Link| l.from == n.id.as_str() && l.to == to.as_str())
                    {
                        links.push(link(n.id.as_str(), to.as_str(), "case"));
                    }
                }
            }
            NodeKind::Gate(g) => {
                if let Some(to) = &g.on_fail {
                    links.push(link(n.id.as_str(), to.as_str(), "loop"));
                }
            }
            _ => {}
        }
        if let Some(to) = &n.failure {
            links.push(link(n.id.as_str(), to.as_str(), "failure"));
        }
    }
    mark_back(&mut links, def);
    links
}

/// Marks the edges that close a cycle in a depth-first walk (from `$start`, then from any node
/// not reached) as back edges.
fn mark_back(links: &mut [Link], def: &Definition) {
    let mut order: Vec<&str> = vec![START];
    order.extend(def.nodes.iter().map(|n| n.id.as_str()));
    let out_of = |n: &str| -> Vec<usize> {
        let mut out: Vec<usize> = (0..links.len()).filter(|&i| links[i].from == n).collect();
        out.sort_by_key(|&i| links[i].class == "loop");
        out
    };
    // Not there: not seen yet; 1: on the walk's stack; 2: done.
    let mut mark: HashMap<String, u8> = HashMap::new();
    let mut back = Vec::new();
    for root in order {
        if mark.contains_key(root) {
            continue;
        }
        let mut stack: Vec<(String, Vec<usize>, usize)> = vec![(root.to_owned(), out_of(root), 0)];
        mark.insert(root.to_owned(), 1);
        while let Some((node, out, next)) = stack.last_mut() {
            let Some(&i) = out.get(*next) else {
                mark.insert(node.clone(), 2);
                stack.pop();
                continue;
            };
            *next += 1;
            let to = links[i].to.clone();
            match mark.get(&to) {
                Some(1) => back.push(i),
                Some(_) => {}
                None => {
                    mark.insert(to.clone(), 1);
                    let out = out_of(&to);
                    stack.push((to, out, 0));
                }
            }
        }
    }
    for i in back {
        links[i].back = true;
    }
}

/// Each node's box (centred by the layout) and each forward edge's bend points, in `links`
/// order, without the layout's end points on the boxes (a back edge has none).
fn lay_out(
    sizes: &[(String, f64, f64)],
    links: &[Link],
) -> (HashMap<String, Rect>, Vec<Vec<Point>>) {
    let mut g = Graph::with_options(true, true, false);
    g.set_graph(GraphLabel {
        rankdir: Some("TB".into()),
        nodesep: Some(40.0),
        edgesep: Some(16.0),
        ranksep: Some(56.0),
        ..GraphLabel::default()
    });
    for (id, w, h) in sizes {
        g.set_node(
            id,
            NodeLabel {
                width: *w,
                height: *h,
                ..NodeLabel::default()
            },
        );
    }
    // Back edges are left out, so the layout sees a DAG whose layers follow the run; they are
    // routed around it afterwards (`backward`).
    for (i, l) in links.iter().enumerate().filter(|(_, l)| !l.back) {
        g.set_edge(
            &l.from,
            &l.to,
            EdgeLabel {
                minlen: Some(1),
                ..EdgeLabel::default()
            },
            Some(&format!("e{i}")),
        );
    }
    dagre_dgl_rs::layout(&mut g);
    let boxes = sizes
        .iter()
        .map(|(id, w, h)| {
            let n = g.node(id);
            (
                id.clone(),
                Rect {
                    x: n.x.unwrap_or(0.0) - w / 2.0,
                    y: n.y.unwrap_or(0.0) - h / 2.0,
                    w: *w,
                    h: *h,
                },
            )
        })
        .collect();
    let bends = links
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let mut pts = g
                .edge_label_named(&l.from, &l.to, &format!("e{i}"))
                .and_then(|e| e.points.clone())
                .unwrap_or_default();
            if pts.len() >= 2 {
                pts.remove(0);
                pts.pop();
            }
            pts
        })
        .collect();
    (boxes, bends)
}

/// The layers' vertical extents: boxes the layout put on one rank share their centre line.
fn bands(boxes: &HashMap<String, Rect>) -> Vec<(f64, f64)> {
    let mut by_centre: HashMap<i64, (f64, f64)> = HashMap::new();
    for r in boxes.values() {
        let key = (r.cy() * 2.0).round() as i64;
        let band = by_centre.entry(key).or_insert((r.y, r.y + r.h));
        band.0 = band.0.min(r.y);
        band.1 = band.1.max(r.y + r.h);
    }
    by_centre.into_values().collect()
}

fn band_of(bands: &[(f64, f64)], y: f64) -> Option<(f64, f64)> {
    bands
        .iter()
        .copied()
        .find(|&(top, bottom)| y >= top - 0.5 && y <= bottom + 0.5)
}

/// A bend point, as a vertical pass through its layer's band when the layer has boxes.
fn pass(out: &mut Vec<Point>, p: &Point, bands: &[(f64, f64)], down: bool) {
    match band_of(bands, p.y) {
        Some((top, bottom)) => {
            let (a, b) = if down { (top, bottom) } else { (bottom, top) };
            out.push(Point { x: p.x, y: a });
            out.push(Point { x: p.x, y: b });
        }
        None => out.push(p.clone()),
    }
}

fn pt(x: f64, y: f64) -> Point {
    Point { x, y }
}

/// A forward edge: out of the source's bottom, through its bend points, into the target's top.
fn forward(s: Rect, t: Rect, bends: &[Point], bands: &[(f64, f64)]) -> Vec<Point> {
    let first = bends.first().map_or(t.cx(), |p| p.x);
    let last = bends.last().map_or(s.cx(), |p| p.x);
    let ax = first.clamp(s.x + 10.0, s.x + s.w - 10.0);
    let bx = last.clamp(t.x + 10.0, t.x + t.w - 10.0);
    let mut out = vec![pt(ax, s.y + s.h)];
    if let Some((_, bottom)) = band_of(bands, s.cy()) {
        out.push(pt(ax, bottom));
    }
    for p in bends {
        pass(&mut out, p, bands, true);
    }
    if let Some((top, _)) = band_of(bands, t.cy()) {
        out.push(pt(bx, top));
    }
    out.push(pt(bx, t.y));
    out
}

/// The middle of the gap above (`up`) or below a layer's band.
fn gap(bands: &[(f64, f64)], band: (f64, f64), up: bool) -> f64 {
    let (top, bottom) = band;
    let next = if up {
        bands
            .iter()
            .map(|b| b.1)
            .filter(|&b| b <= top)
            .fold(top - 2.0 * STUB, f64::max)
    } else {
        bands
            .iter()
            .map(|b| b.0)
            .filter(|&t| t >= bottom)
            .fold(bottom + 2.0 * STUB, f64::min)
    };
    if up {
        (top + next) / 2.0
    } else {
        (bottom + next) / 2.0
    }
}

/// A back edge, from `s` below up to `t`: out of the source's side, up the gap above its layer
/// to a lane outside every box and edge already drawn between the two layers, up the lane, and
/// along the gap below the target's layer into its side. Horizontal runs are only in gaps and
/// the lane is clear of everything, so it crosses no box; `ports` counts the back edges already
/// on each side of a box, so that two do not share an end.
fn backward(
    s: Rect,
    t: Rect,
    bands: &[(f64, f64)],
    boxes: &HashMap<String, Rect>,
    drawn: &[&Vec<Point>],
    ports: &mut HashMap<(String, bool), usize>,
    ids: (&str, &str),
) -> Vec<Point> {
    let (Some(sb), Some(tb)) = (band_of(bands, s.cy()), band_of(bands, t.cy())) else {
        return Vec::new();
    };
    let (g1, g2) = (gap(bands, sb, true), gap(bands, tb, false));
    let between = |y0: f64, y1: f64| y1 >= g2 && y0 <= g1;
    let mut xs: Vec<f64> = Vec::new();
    for r in boxes.values().filter(|r| between(r.y, r.y + r.h)) {
        xs.extend([r.x, r.x + r.w]);
    }
    xs.extend(
        drawn
            .iter()
            .flat_map(|p| p.iter())
            .filter(|p| between(p.y, p.y))
            .map(|p| p.x),
    );
    let right = xs
        .iter()
        .copied()
        .fold(f64::MIN, f64::max)
        .max(s.x + s.w)
        .max(t.x + t.w)
        + STUB;
    let left = xs
        .iter()
        .copied()
        .fold(f64::MAX, f64::min)
        .min(s.x)
        .min(t.x)
        - STUB;
    let cost = |lane: f64| (lane - s.cx()).abs() + (lane - t.cx()).abs();
    let on_right = cost(right) <= cost(left);
    let mut port = |id: &str| {
        let k = ports.entry((id.to_owned(), on_right)).or_insert(0);
        *k += 1;
        (*k - 1) as f64
    };
    let (ks, kt) = (port(ids.0), port(ids.1));
    let (sign, lane) = if on_right { (1.0, right) } else { (-1.0, left) };
    let edge = |r: Rect| if on_right { r.x + r.w } else { r.x };
    let (s_out, t_out) = (
        edge(s) + sign * (STUB + 4.0 * ks),
        edge(t) + sign * (STUB + 4.0 * kt),
    );
    let lane = if on_right {
        lane.max(s_out).max(t_out)
    } else {
        lane.min(s_out).min(t_out)
    };
    let (sy, ty) = (s.cy() - 8.0 * ks, t.cy() + 8.0 * kt);
    let (g1, g2) = (g1 - 4.0 * ks, g2 + 4.0 * kt);
    vec![
        pt(edge(s), sy),
        pt(s_out, sy),
        pt(s_out, g1),
        pt(lane, g1),
        pt(lane, g2),
        pt(t_out, g2),
        pt(t_out, ty),
        pt(edge(t), ty),
    ]
}

/// A loop from a box to itself: out of its right side and back in lower down.
fn self_loop(r: Rect) -> Vec<Point> {
    let x = r.x + r.w;
    vec![
        pt(x, r.cy() - 8.0),
        pt(x + STUB + 6.0, r.cy() - 8.0),
        pt(x + STUB + 6.0, r.cy() + 8.0),
        pt(x, r.cy() + 8.0),
    ]
}

/// An SVG path through `pts` with rounded corners (a quadratic curve at each bend).
fn path_d(pts: &[Point]) -> String {
    let mut pts: Vec<&Point> = pts.iter().collect();
    pts.dedup_by(|b, a| (a.x - b.x).hypot(a.y - b.y) < 0.5);
    let mut d = String::new();
    let Some(first) = pts.first() else { return d };
    let _ = write!(d, "M {:.1} {:.1}", first.x, first.y);
    for i in 1..pts.len() {
        let (a, c) = (pts[i - 1], pts[i]);
        let Some(b) = pts.get(i + 1) else {
            let _ = write!(d, " L {:.1} {:.1}", c.x, c.y);
            break;
        };
        let (l1, l2) = ((c.x - a.x).hypot(c.y - a.y), (b.x - c.x).hypot(b.y - c.y));
        let r = CORNER.min(l1 / 2.0).min(l2 / 2.0);
        let (p, q) = (
            pt(c.x + (a.x - c.x) * r / l1, c.y + (a.y - c.y) * r / l1),
            pt(c.x + (b.x - c.x) * r / l2, c.y + (b.y - c.y) * r / l2),
        );
        let _ = write!(
            d,
            " L {:.1} {:.1} Q {:.1} {:.1} {:.1} {:.1}",
            p.x, p.y, c.x, c.y, q.x, q.y
        );
    }
    d
}

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
    let mut sizes = vec![(
        START.to_owned(),
        (text_width(&start_text, STATE_FONT) + 24.0).max(64.0),
        START_H,
    )];
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
    let mut back: Vec<usize> = (0..links.len())
        .filter(|&i| links[i].back && links[i].from != links[i].to)
        .collect();
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
        let route = backward(
            s,
            t,
            &bands,
            &boxes,
            &drawn,
            &mut ports,
            (&links[i].from, &links[i].to),
        );
        paths[i] = route;
    }

    // The view fits what was drawn: every box and every edge, with room for the arrowheads.
    let (mut x0, mut y0, mut x1, mut y1) = (f64::MAX, f64::MAX, f64::MIN, f64::MIN);
    for r in boxes.values() {
        (x0, y0, x1, y1) = (
            x0.min(r.x),
            y0.min(r.y),
            x1.max(r.x + r.w),
            y1.max(r.y + r.h),
        );
    }
    for p in paths.iter().flatten() {
        (x0, y0, x1, y1) = (x0.min(p.x), y0.min(p.y), x1.max(p.x), y1.max(p.y));
    }
    let (x0, y0, w, h) = (x0 - PAD, y0 - PAD, x1 - x0 + 2.0 * PAD, y1 - y0 + 2.0 * PAD);

    let mut out = String::new();
    let summary = format!(
        "Graph of {} nodes, {} reached in this run",
        def.nodes.len(),
        states.len()
    );
    let _ = write!(
        out,
        "<svg class=\"graph\" viewBox=\"{x0:.1} {y0:.1} {w:.1} {h:.1}\" width=\"{w:.0}\" height=\"{h:.0}\" role=\"img\" aria-label=\"{}\" xmlns=\"http://www.w3.org/2000/svg\"><title>{}</title>\
         <defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" markerWidth=\"7\" markerHeight=\"7\" orient=\"auto-start-reverse\"><path d=\"M 0 0 L 10 5 L 0 10 z\"/></marker></defs>",
        escape(&summary),
        escape(&summary)
    );
    for (l, pts) in links.iter().zip(&paths) {
        let (back, dash, how) = if l.back {
            (" back", " stroke-dasharray=\"6 4\"", ", back")
        } else {
            ("", "", "")
        };
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
    let entries: Vec<&str> = links
        .iter()
        .filter(|l| l.from == START)
        .map(|l| l.to.as_str())
        .collect();
    let _ = write!(
        out,
        "<g class=\"node start {start_class}\" data-node=\"{START}\"><title>{START}: where a run begins ({}){}</title>\
         <rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{START_H}\" rx=\"{}\"/>\
         <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" class=\"name\" font-size=\"{STATE_FONT}\">{}</text></g>",
        escape(&entries.join(", ")),
        states
            .get(START)
            .map(|s| format!(": {s}"))
            .unwrap_or_default(),
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
