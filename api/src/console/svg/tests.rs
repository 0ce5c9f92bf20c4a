//! The pictures read back as geometry: the SVG is parsed, each edge's path flattened into
//! segments (curves sampled), and checked against the node boxes and the view, as a person
//! looking at the drawing would check it.

use std::collections::HashMap;

use chrono::{TimeDelta, TimeZone, Utc};
use engine::definition::{Definition, parse};

use super::{Bar, graph, waterfall};

fn fixture(name: &str) -> Definition {
    let path = format!("{}/../engine/tests/fixtures/workflows/{name}", env!("CARGO_MANIFEST_DIR"));
    let source = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    parse(&source).unwrap_or_else(|p| panic!("{name} does not parse: {p:?}"))
}

/// Fans out wide and joins again: the layout must keep the join's edges off the branches.
const WIDE: &str = "name: wide
nodes:
  split: { trigger: {} }
  a_long_branch_name: { after: [split], wait: { for: 1m } }
  b: { after: [split], wait: { for: 1m } }
  c: { after: [split], wait: { for: 1m } }
  d: { after: [split], wait: { for: 1m } }
  e: { after: [a_long_branch_name], wait: { for: 1m } }
  join: { after: [a_long_branch_name, b, c, d, e, split], wait: { for: 1m } }
";

/// A decision that routes back up, and a failure handler: back edges that are not a gate's.
const ROUTED: &str = "name: routed
nodes:
  work:
    crew: { harness: command, command: [make] }
    failure: report
  check:
    after: [work]
    decision:
      cases:
        - { if: \"nodes.work.output.ok == false\", to: work }
      default: done
  done: { after: [check], end: completed }
  report: { output: { github: comment, body: failed } }
  gave_up: { after: [report], end: failed }
";

#[derive(Debug, Clone, Copy)]
struct Rect {
    x: f64,
    y: f64,
    w: f64,
    h: f64,
}

impl Rect {
    fn shrink(self, by: f64) -> Rect {
        Rect { x: self.x + by, y: self.y + by, w: self.w - 2.0 * by, h: self.h - 2.0 * by }
    }
    fn contains(self, o: Rect) -> bool {
        o.x >= self.x && o.y >= self.y && o.x + o.w <= self.x + self.w && o.y + o.h <= self.y + self.h
    }
    fn overlaps(self, o: Rect) -> bool {
        self.x < o.x + o.w && o.x < self.x + self.w && self.y < o.y + o.h && o.y < self.y + self.h
    }
}

type P = (f64, f64);

struct Edge {
    from: String,
    to: String,
    classes: Vec<String>,
    dashed: bool,
    d: String,
    /// The path flattened: lines as they are, curves sampled.
    points: Vec<P>,
}

struct Drawing {
    view: Rect,
    boxes: HashMap<String, Rect>,
    edges: Vec<Edge>,
}

fn num(n: roxmltree::Node<'_, '_>, attr: &str) -> f64 {
    n.attribute(attr).unwrap_or_else(|| panic!("{attr} on {n:?}")).parse().expect("a number")
}

fn view_box(svg: roxmltree::Node<'_, '_>) -> Rect {
    let v: Vec<f64> = svg.attribute("viewBox").expect("a viewBox").split_whitespace().map(|s| s.parse().expect("a number")).collect();
    Rect { x: v[0], y: v[1], w: v[2], h: v[3] }
}

/// A path's `d` (M, L, Q and C, absolute) as points, curves sampled in 16 steps.
fn flatten(d: &str) -> Vec<P> {
    let tokens: Vec<&str> = d.split_whitespace().collect();
    let mut out: Vec<P> = Vec::new();
    let mut i = 0;
    let arg = |i: usize| -> f64 { tokens[i].parse().unwrap_or_else(|_| panic!("a number at {i} in {d}")) };
    while i < tokens.len() {
        let at = *out.last().unwrap_or(&(0.0, 0.0));
        match tokens[i] {
            "M" | "L" => {
                out.push((arg(i + 1), arg(i + 2)));
                i += 3;
            }
            "Q" => {
                let (c, e) = ((arg(i + 1), arg(i + 2)), (arg(i + 3), arg(i + 4)));
                for k in 1..=16 {
                    let t = f64::from(k) / 16.0;
                    let u = 1.0 - t;
                    out.push((u * u * at.0 + 2.0 * u * t * c.0 + t * t * e.0, u * u * at.1 + 2.0 * u * t * c.1 + t * t * e.1));
                }
                i += 5;
            }
            "C" => {
                let (c1, c2, e) = ((arg(i + 1), arg(i + 2)), (arg(i + 3), arg(i + 4)), (arg(i + 5), arg(i + 6)));
                for k in 1..=16 {
                    let t = f64::from(k) / 16.0;
                    let u = 1.0 - t;
                    let (a, b, c, f) = (u * u * u, 3.0 * u * u * t, 3.0 * u * t * t, t * t * t);
                    out.push((a * at.0 + b * c1.0 + c * c2.0 + f * e.0, a * at.1 + b * c1.1 + c * c2.1 + f * e.1));
                }
                i += 7;
            }
            other => panic!("an unexpected path command {other} in {d}"),
        }
    }
    out
}

fn read(svg: &str) -> Drawing {
    let doc = roxmltree::Document::parse(svg).unwrap_or_else(|e| panic!("not XML: {e}\n{svg}"));
    let root = doc.root_element();
    assert_eq!(root.attribute("role"), Some("img"));
    assert!(root.attribute("aria-label").is_some_and(|l| !l.is_empty()));
    let mut boxes = HashMap::new();
    let mut edges = Vec::new();
    for n in root.descendants() {
        if let Some(id) = n.attribute("data-node") {
            let r = n.children().find(|c| c.has_tag_name("rect")).expect("a node's rect");
            assert!(n.children().any(|c| c.has_tag_name("title")), "{id} has a title");
            boxes.insert(id.to_owned(), Rect { x: num(r, "x"), y: num(r, "y"), w: num(r, "width"), h: num(r, "height") });
        }
        if n.has_tag_name("path") && n.attribute("data-from").is_some() {
            let d = n.attribute("d").expect("a path's d").to_owned();
            edges.push(Edge {
                from: n.attribute("data-from").unwrap().to_owned(),
                to: n.attribute("data-to").expect("data-to").to_owned(),
                classes: n.attribute("class").unwrap_or_default().split_whitespace().map(str::to_owned).collect(),
                dashed: n.attribute("stroke-dasharray").is_some_and(|v| !v.is_empty()),
                points: flatten(&d),
                d,
            });
        }
    }
    Drawing { view: view_box(root), boxes, edges }
}

/// Whether the segment a–b meets the rectangle (Liang–Barsky clipping).
fn crosses(a: P, b: P, r: Rect) -> bool {
    let (dx, dy) = (b.0 - a.0, b.1 - a.1);
    let (mut t0, mut t1) = (0.0_f64, 1.0_f64);
    for (p, q) in [(-dx, a.0 - r.x), (dx, r.x + r.w - a.0), (-dy, a.1 - r.y), (dy, r.y + r.h - a.1)] {
        if p == 0.0 {
            if q < 0.0 {
                return false;
            }
        } else {
            let t = q / p;
            if p < 0.0 {
                t0 = t0.max(t);
            } else {
                t1 = t1.min(t);
            }
        }
    }
    t0 <= t1
}

fn distance_to_segment(p: P, a: P, b: P) -> f64 {
    let (dx, dy) = (b.0 - a.0, b.1 - a.1);
    let len = dx * dx + dy * dy;
    let t = if len == 0.0 { 0.0 } else { (((p.0 - a.0) * dx + (p.1 - a.1) * dy) / len).clamp(0.0, 1.0) };
    (p.0 - a.0 - t * dx).hypot(p.1 - a.1 - t * dy)
}

/// Points along the polyline no more than 2 units apart.
fn dense(points: &[P]) -> Vec<P> {
    let mut out = vec![points[0]];
    for w in points.windows(2) {
        let steps = ((w[1].0 - w[0].0).hypot(w[1].1 - w[0].1) / 2.0).ceil().max(1.0);
        for k in 1..=steps as usize {
            let t = k as f64 / steps;
            out.push((w[0].0 + (w[1].0 - w[0].0) * t, w[0].1 + (w[1].1 - w[0].1) * t));
        }
    }
    out
}

/// The checks every drawn graph must pass; returns the drawing for more.
fn check(name: &str, def: &Definition, states: &HashMap<String, String>) -> Drawing {
    let svg = graph(def, states);
    let g = read(&svg);
    // (c) `$start` is drawn, and leads somewhere.
    assert!(g.boxes.contains_key("$start"), "{name}: no $start\n{svg}");
    assert!(g.edges.iter().any(|e| e.from == "$start"), "{name}: nothing leaves $start");
    for n in &def.nodes {
        assert!(g.boxes.contains_key(&n.id), "{name}: {} is not drawn", n.id);
    }
    // (d) Boxes inside the view, none on another; edges inside the view too.
    for (id, r) in &g.boxes {
        assert!(g.view.contains(*r), "{name}: {id} {r:?} is outside the view {:?}", g.view);
        for (other, o) in &g.boxes {
            assert!(id == other || !r.overlaps(*o), "{name}: {id} {r:?} overlaps {other} {o:?}");
        }
    }
    // (a) No edge enters a box but its own two ends'.
    for e in &g.edges {
        assert!(e.points.len() >= 2, "{name}: {} → {} has no path", e.from, e.to);
        for &(x, y) in &e.points {
            assert!(g.view.contains(Rect { x, y, w: 0.0, h: 0.0 }), "{name}: {} → {} leaves the view at ({x}, {y})", e.from, e.to);
        }
        for (id, r) in g.boxes.iter().filter(|(id, _)| **id != e.from && **id != e.to) {
            for s in e.points.windows(2) {
                assert!(!crosses(s[0], s[1], r.shrink(1.0)), "{name}: {} → {} crosses {id}: {:?}–{:?}\n{}", e.from, e.to, s[0], s[1], e.d);
            }
        }
    }
    // (b) Back edges look and run apart from forward ones.
    for e in &g.edges {
        let back = e.classes.iter().any(|c| c == "back");
        assert!(e.classes.iter().any(|c| c == "edge"), "{name}: {:?}", e.classes);
        assert_eq!(back, e.dashed, "{name}: {} → {}: a back edge is dashed and only a back edge is", e.from, e.to);
        if !back {
            continue;
        }
        for f in g.edges.iter().filter(|f| !f.classes.iter().any(|c| c == "back")) {
            let same_pair = (f.from == e.from && f.to == e.to) || (f.from == e.to && f.to == e.from);
            if !same_pair {
                continue;
            }
            assert_ne!(e.d, f.d, "{name}: {} → {}", e.from, e.to);
            let nearest = dense(&e.points)
                .into_iter()
                .map(|p| f.points.windows(2).map(|s| distance_to_segment(p, s[0], s[1])).fold(f64::MAX, f64::min))
                .fold(f64::MAX, f64::min);
            assert!(nearest >= 4.0, "{name}: the back edge {} → {} comes within {nearest:.1} of the forward edge\n{}\n{}", e.from, e.to, e.d, f.d);
        }
    }
    g
}

fn is_back(g: &Drawing, from: &str, to: &str, class: &str) -> bool {
    g.edges.iter().any(|e| e.from == from && e.to == to && e.classes.iter().any(|c| c == "back") && e.classes.iter().any(|c| c == class))
}

#[test]
fn the_design_example_keeps_edges_off_other_boxes_and_loops_apart() {
    let def = fixture("issue-to-pr.yaml");
    let states =
        HashMap::from([("$start".to_owned(), "succeeded".to_owned()), ("plan".to_owned(), "succeeded".to_owned()), ("ci".to_owned(), "failed".to_owned())]);
    let g = check("issue-to-pr", &def, &states);
    assert!(is_back(&g, "ci", "build", "loop"), "the gate's on_fail is a back edge");
    assert!(g.edges.iter().any(|e| e.from == "route" && e.to == "open_pr" && !e.dashed), "route → open_pr is drawn forward");
    assert!(g.edges.iter().any(|e| e.from == "$start" && e.to == "plan"), "$start leads to the first node");
    // The layers go down the page: open_pr below big_change_review, below route.
    let y = |id: &str| g.boxes[id].y;
    assert!(y("$start") < y("plan") && y("route") < y("big_change_review") && y("big_change_review") < y("open_pr"));
}

#[test]
fn other_workflows_pass_the_same_checks() {
    check("all-kinds", &fixture("all-kinds.yaml"), &HashMap::new());
    check("wide", &parse(WIDE).expect("WIDE parses"), &HashMap::new());
    let g = check("routed", &parse(ROUTED).expect("ROUTED parses"), &HashMap::new());
    assert!(is_back(&g, "check", "work", "case"), "a decision's route back up is a back edge");
    assert!(g.edges.iter().any(|e| e.from == "work" && e.to == "report" && e.classes.iter().any(|c| c == "failure")));
}

#[test]
fn waterfall_text_stays_inside_the_view() {
    let t0 = Utc.with_ymd_and_hms(2030, 1, 1, 9, 0, 0).unwrap();
    let at = |s: i64| t0 + TimeDelta::seconds(s);
    let long = "a_node_with_a_very_long_name_indeed (visit 12, attempt 3)".to_owned();
    let bars = [
        Bar { label: long.clone(), state: "succeeded", start: at(0), end: Some(at(30)) },
        Bar { label: "short".into(), state: "cancelled", start: at(30), end: Some(at(3600)) },
        Bar { label: "tail".into(), state: "running", start: at(3590), end: None },
        Bar { label: "late".into(), state: "failed", start: at(4000), end: Some(at(4100)) },
    ];
    let svg = waterfall(&bars, t0, at(3600), at(3600));
    let doc = roxmltree::Document::parse(&svg).unwrap_or_else(|e| panic!("not XML: {e}\n{svg}"));
    let view = view_box(doc.root_element());
    let texts: Vec<_> = doc.descendants().filter(|n| n.has_tag_name("text")).collect();
    assert_eq!(texts.len(), 2 * bars.len() + 2);
    for t in texts {
        let text = t.text().unwrap_or_default();
        let (x, size) = (num(t, "x"), num(t, "font-size"));
        let width = text.chars().count() as f64 * 0.6 * size;
        let (left, right) = match t.attribute("text-anchor") {
            Some("end") => (x - width, x),
            Some("middle") => (x - width / 2.0, x + width / 2.0),
            _ => (x, x + width),
        };
        assert!(left >= view.x && right <= view.x + view.w, "{text:?} runs from {left:.1} to {right:.1}, outside {view:?}\n{svg}");
        assert!(num(t, "y") <= view.y + view.h && num(t, "y") - size >= view.y, "{text:?} is above or below the view");
    }
    // The cut label is whole in its bar's title.
    assert!(svg.contains('…') && svg.contains(&format!("<title>{long}:")), "{svg}");
}
