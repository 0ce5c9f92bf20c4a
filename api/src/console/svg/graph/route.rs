//! Where the graph's boxes and edges go: dagre's layout of the forward edges, then each edge's
//! path between the layers' boxes (a back edge round the drawing in a lane of its own).

use std::collections::HashMap;
use std::fmt::Write as _;

use dagre_dgl_rs::{EdgeLabel, Graph, GraphLabel, NodeLabel, Point};

use super::edges::Link;

/// How far a back edge leaves its box's side before it turns. Less than half the layout's
/// `nodesep`, so the turn stays clear of the next box in the layer.
pub(super) const STUB: f64 = 16.0;
/// The radius of an edge's rounded corners.
pub(super) const CORNER: f64 = 8.0;

/// A box, by its top-left corner.
#[derive(Clone, Copy)]
pub(super) struct Rect {
    pub(super) x: f64,
    pub(super) y: f64,
    pub(super) w: f64,
    pub(super) h: f64,
}

impl Rect {
    pub(super) fn cx(self) -> f64 {
        self.x + self.w / 2.0
    }
    pub(super) fn cy(self) -> f64 {
        self.y + self.h / 2.0
    }
}

/// Each node's box (centred by the layout) and each forward edge's bend points, in `links`
/// order, without the layout's end points on the boxes (a back edge has none).
pub(super) fn lay_out(sizes: &[(String, f64, f64)], links: &[Link]) -> (HashMap<String, Rect>, Vec<Vec<Point>>) {
    let mut g = Graph::with_options(true, true, false);
    g.set_graph(GraphLabel { rankdir: Some("TB".into()), nodesep: Some(40.0), edgesep: Some(16.0), ranksep: Some(56.0), ..GraphLabel::default() });
    for (id, w, h) in sizes {
        g.set_node(id, NodeLabel { width: *w, height: *h, ..NodeLabel::default() });
    }
    // Back edges are left out, so the layout sees a DAG whose layers follow the run; they are
    // routed around it afterwards (`backward`).
    for (i, l) in links.iter().enumerate().filter(|(_, l)| !l.back) {
        g.set_edge(&l.from, &l.to, EdgeLabel { minlen: Some(1), ..EdgeLabel::default() }, Some(&format!("e{i}")));
    }
    dagre_dgl_rs::layout(&mut g);
    let boxes = sizes
        .iter()
        .map(|(id, w, h)| {
            let n = g.node(id);
            (id.clone(), Rect { x: n.x.unwrap_or(0.0) - w / 2.0, y: n.y.unwrap_or(0.0) - h / 2.0, w: *w, h: *h })
        })
        .collect();
    let bends = links
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let mut pts = g.edge_label_named(&l.from, &l.to, &format!("e{i}")).and_then(|e| e.points.clone()).unwrap_or_default();
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
pub(super) fn bands(boxes: &HashMap<String, Rect>) -> Vec<(f64, f64)> {
    let mut by_centre: HashMap<i64, (f64, f64)> = HashMap::new();
    for r in boxes.values() {
        let key = (r.cy() * 2.0).round() as i64;
        let band = by_centre.entry(key).or_insert((r.y, r.y + r.h));
        band.0 = band.0.min(r.y);
        band.1 = band.1.max(r.y + r.h);
    }
    by_centre.into_values().collect()
}

pub(super) fn band_of(bands: &[(f64, f64)], y: f64) -> Option<(f64, f64)> {
    bands.iter().copied().find(|&(top, bottom)| y >= top - 0.5 && y <= bottom + 0.5)
}

/// A bend point, as a vertical pass through its layer's band when the layer has boxes.
pub(super) fn pass(out: &mut Vec<Point>, p: &Point, bands: &[(f64, f64)], down: bool) {
    match band_of(bands, p.y) {
        Some((top, bottom)) => {
            let (a, b) = if down { (top, bottom) } else { (bottom, top) };
            out.push(Point { x: p.x, y: a });
            out.push(Point { x: p.x, y: b });
        }
        None => out.push(p.clone()),
    }
}

pub(super) fn pt(x: f64, y: f64) -> Point {
    Point { x, y }
}

/// A forward edge: out of the source's bottom, through its bend points, into the target's top.
pub(super) fn forward(s: Rect, t: Rect, bends: &[Point], bands: &[(f64, f64)]) -> Vec<Point> {
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
pub(super) fn gap(bands: &[(f64, f64)], band: (f64, f64), up: bool) -> f64 {
    let (top, bottom) = band;
    let next = if up {
        bands.iter().map(|b| b.1).filter(|&b| b <= top).fold(top - 2.0 * STUB, f64::max)
    } else {
        bands.iter().map(|b| b.0).filter(|&t| t >= bottom).fold(bottom + 2.0 * STUB, f64::min)
    };
    if up { (top + next) / 2.0 } else { (bottom + next) / 2.0 }
}

/// A back edge, from `s` below up to `t`: out of the source's side, up the gap above its layer
/// to a lane outside every box and edge already drawn between the two layers, up the lane, and
/// along the gap below the target's layer into its side. Horizontal runs are only in gaps and
/// the lane is clear of everything, so it crosses no box; `ports` counts the back edges already
/// on each side of a box, so that two do not share an end.
pub(super) fn backward(
    s: Rect, t: Rect, bands: &[(f64, f64)], boxes: &HashMap<String, Rect>, drawn: &[&Vec<Point>], ports: &mut HashMap<(String, bool), usize>, ids: (&str, &str),
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
    xs.extend(drawn.iter().flat_map(|p| p.iter()).filter(|p| between(p.y, p.y)).map(|p| p.x));
    let right = xs.iter().copied().fold(f64::MIN, f64::max).max(s.x + s.w).max(t.x + t.w) + STUB;
    let left = xs.iter().copied().fold(f64::MAX, f64::min).min(s.x).min(t.x) - STUB;
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
    let (s_out, t_out) = (edge(s) + sign * (STUB + 4.0 * ks), edge(t) + sign * (STUB + 4.0 * kt));
    let lane = if on_right { lane.max(s_out).max(t_out) } else { lane.min(s_out).min(t_out) };
    let (sy, ty) = (s.cy() - 8.0 * ks, t.cy() + 8.0 * kt);
    let (g1, g2) = (g1 - 4.0 * ks, g2 + 4.0 * kt);
    vec![pt(edge(s), sy), pt(s_out, sy), pt(s_out, g1), pt(lane, g1), pt(lane, g2), pt(t_out, g2), pt(t_out, ty), pt(edge(t), ty)]
}

/// A loop from a box to itself: out of its right side and back in lower down.
pub(super) fn self_loop(r: Rect) -> Vec<Point> {
    let x = r.x + r.w;
    vec![pt(x, r.cy() - 8.0), pt(x + STUB + 6.0, r.cy() - 8.0), pt(x + STUB + 6.0, r.cy() + 8.0), pt(x, r.cy() + 8.0)]
}

/// An SVG path through `pts` with rounded corners (a quadratic curve at each bend).
pub(super) fn path_d(pts: &[Point]) -> String {
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
        let (p, q) = (pt(c.x + (a.x - c.x) * r / l1, c.y + (a.y - c.y) * r / l1), pt(c.x + (b.x - c.x) * r / l2, c.y + (b.y - c.y) * r / l2));
        let _ = write!(d, " L {:.1} {:.1} Q {:.1} {:.1} {:.1} {:.1}", p.x, p.y, c.x, c.y, q.x, q.y);
    }
    d
}
