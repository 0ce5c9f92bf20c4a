//! A YAML document as a small tree that remembers where each node and key was written.
//!
//! We build it from saphyr's event stream rather than take saphyr's own tree because
//! validation needs two things that tree loses: the position of every mapping key, and keys
//! written twice (a YAML map silently keeps the last one, which hides a mistake).

use std::collections::HashMap;

use saphyr::Scalar;
use saphyr_parser::{Event, Marker, Parser, ScalarStyle, Span, StrInput};

/// A 1-based line and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Pos {
    pub line: usize,
    pub col: usize,
}

impl Pos {
    fn of(marker: &Marker) -> Pos {
        // saphyr counts lines from 1 but columns from 0.
        Pos { line: marker.line(), col: marker.col() + 1 }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub pos: Pos,
    pub value: Value,
}

#[derive(Debug, Clone)]
pub(crate) enum Value {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    /// `literal` is set for a `|` block, whose lines are the file's lines one for one, so a
    /// problem on line N of the text can be placed on the file's line.
    Str {
        text: String,
        literal: bool,
    },
    Seq(Vec<Node>),
    /// In document order, duplicates kept, so that the reader can report them.
    Map(Vec<(Key, Node)>),
}

#[derive(Debug, Clone)]
pub(crate) struct Key {
    pub name: String,
    pub pos: Pos,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SyntaxError {
    pub pos: Pos,
    pub message: String,
}

/// Anchors let a small file expand into a huge tree ("billion laughs"); past this many nodes
/// we stop. A real workflow has a few hundred.
const MAX_NODES: usize = 100_000;
/// Deep nesting would otherwise exhaust the stack of the recursive build below.
const MAX_DEPTH: usize = 64;

/// Reads the one YAML document of `source`; `None` when the file holds no document at all.
pub(crate) fn load(source: &str) -> Result<Option<Node>, SyntaxError> {
    let mut loader = Loader { events: Parser::new_from_str(source), anchors: HashMap::new(), nodes: 0, last: Pos { line: 1, col: 1 } };
    loader.document()
}

struct Loader<'a> {
    events: Parser<'a, StrInput<'a>>,
    /// Anchor id to the node it names, with that node's size in nodes.
    anchors: HashMap<usize, (Node, usize)>,
    nodes: usize,
    last: Pos,
}

impl<'a> Loader<'a> {
    fn next(&mut self) -> Result<(Event<'a>, Span), SyntaxError> {
        match self.events.next_event() {
            Some(Ok((event, span))) => {
                self.last = Pos::of(&span.start);
                Ok((event, span))
            }
            Some(Err(e)) => Err(SyntaxError { pos: Pos::of(e.marker()), message: e.info().to_owned() }),
            None => Err(SyntaxError { pos: self.last, message: "unexpected end of the file".to_owned() }),
        }
    }

    /// The next event of a sequence or mapping, or `None` at its end (the parser pairs each
    /// end with its start).
    fn entry(&mut self) -> Result<Option<(Event<'a>, Span)>, SyntaxError> {
        let (event, span) = self.next()?;
        Ok((!matches!(event, Event::SequenceEnd | Event::MappingEnd)).then_some((event, span)))
    }

    fn document(&mut self) -> Result<Option<Node>, SyntaxError> {
        let mut root = None;
        loop {
            let (event, span) = self.next()?;
            match event {
                Event::StreamStart | Event::Nothing | Event::DocumentEnd => {}
                Event::StreamEnd => return Ok(root),
                Event::DocumentStart(_) if root.is_some() => {
                    return Err(SyntaxError { pos: Pos::of(&span.start), message: "a workflow file holds one YAML document, this is a second one".to_owned() });
                }
                Event::DocumentStart(_) => {
                    let (event, span) = self.next()?;
                    root = Some(self.node(event, span, 0)?);
                }
                _ => return Err(unexpected(&span)),
            }
        }
    }

    fn count(&mut self, n: usize, pos: Pos) -> Result<(), SyntaxError> {
        self.nodes += n;
        if self.nodes > MAX_NODES {
            return Err(SyntaxError { pos, message: format!("the document expands to more than {MAX_NODES} values") });
        }
        Ok(())
    }

    fn node(&mut self, event: Event<'a>, span: Span, depth: usize) -> Result<Node, SyntaxError> {
        let pos = Pos::of(&span.start);
        if depth > MAX_DEPTH {
            return Err(SyntaxError { pos, message: format!("nested deeper than {MAX_DEPTH} levels") });
        }
        let before = self.nodes;
        let (node, anchor) = match event {
            Event::Scalar(text, style, anchor, tag) => {
                self.count(1, pos)?;
                let literal = style == ScalarStyle::Literal;
                let value = match Scalar::parse_from_cow_and_metadata(text.clone(), style, tag.as_ref()) {
                    Some(Scalar::Null) => Value::Null,
                    Some(Scalar::Boolean(b)) => Value::Bool(b),
                    Some(Scalar::Integer(i)) => Value::Int(i),
                    Some(Scalar::FloatingPoint(f)) => Value::Float(f.into_inner()),
                    Some(Scalar::String(s)) => Value::Str { text: s.into_owned(), literal },
                    None => {
                        return Err(SyntaxError { pos, message: format!("`{text}` does not match its tag") });
                    }
                };
                (Node { pos, value }, anchor)
            }
            Event::SequenceStart(anchor, _) => {
                self.count(1, pos)?;
                let mut items = Vec::new();
                while let Some((event, span)) = self.entry()? {
                    items.push(self.node(event, span, depth + 1)?);
                }
                (Node { pos, value: Value::Seq(items) }, anchor)
            }
            Event::MappingStart(anchor, _) => {
                self.count(1, pos)?;
                let mut entries = Vec::new();
                while let Some((event, span)) = self.entry()? {
                    let key_pos = Pos::of(&span.start);
                    let name = match event {
                        Event::Scalar(text, ..) => text.into_owned(),
                        Event::Alias(id) => match self.anchors.get(&id) {
                            Some((Node { value: Value::Str { text, .. }, .. }, _)) => text.clone(),
                            _ => {
                                return Err(SyntaxError { pos: key_pos, message: "a key must be a plain value".to_owned() });
                            }
                        },
                        _ => {
                            return Err(SyntaxError { pos: key_pos, message: "a key must be a plain value, not a list or mapping".to_owned() });
                        }
                    };
                    let (event, span) = self.next()?;
                    let value = self.node(event, span, depth + 1)?;
                    entries.push((Key { name, pos: key_pos }, value));
                }
                (Node { pos, value: Value::Map(entries) }, anchor)
            }
            Event::Alias(id) => {
                let Some((node, size)) = self.anchors.get(&id).cloned() else {
                    return Err(SyntaxError { pos, message: "alias to an unknown anchor".to_owned() });
                };
                self.count(size, pos)?;
                // An alias stands for its anchor's value but is reported where it is used.
                (Node { pos, value: node.value }, 0)
            }
            _ => return Err(unexpected(&span)),
        };
        // saphyr numbers anchors from 1; 0 means none.
        if anchor != 0 {
            self.anchors.insert(anchor, (node.clone(), self.nodes - before));
        }
        Ok(node)
    }
}

fn unexpected(span: &Span) -> SyntaxError {
    SyntaxError { pos: Pos::of(&span.start), message: "unexpected YAML event".to_owned() }
}
