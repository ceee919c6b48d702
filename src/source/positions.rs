//! Line numbers for field paths, so an error can point at the line to fix.
//!
//! The reader (`yaml::read`) builds values without positions, so a second,
//! event-level pass with `saphyr-parser` records the line where each field
//! path starts.
//! The index only serves messages: if it cannot be built, messages simply
//! lose their line numbers.

use std::collections::HashMap;

use saphyr_parser::{Event, Parser};

/// Field path → 1-based line, for one document.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Positions {
    start_line: usize,
    lines: HashMap<String, usize>,
}

impl Positions {
    /// Line of `path` (`spec.rolloutStrategy.maxSurge`,
    /// `spec.template.spec.containers[0].env`), or of its nearest ancestor
    /// present in the document, or the document's first line.
    pub fn line_of(&self, path: &str) -> usize {
        let mut path = path;
        loop {
            if let Some(line) = self.lines.get(path) {
                return *line;
            }
            match parent(path) {
                Some(p) => path = p,
                None => return self.start_line,
            }
        }
    }

    /// First line of the document.
    pub fn start_line(&self) -> usize {
        self.start_line
    }
}

/// `a.b[2].c` → `a.b[2]` → `a.b` → `a` → None.
fn parent(path: &str) -> Option<&str> {
    if path.is_empty() {
        return None;
    }
    let cut = path.rfind(['.', '['])?;
    Some(&path[..cut])
}

enum Frame {
    Map { path: String, key: Option<String> },
    Seq { path: String, next: usize },
}

/// The positions of every document in a stream, in order. `None` when the
/// parser disagrees with the text (the caller then reports without lines).
pub fn index_stream(text: &str) -> Option<Vec<Positions>> {
    let mut docs = Vec::new();
    let mut current: Option<Positions> = None;
    let mut stack: Vec<Frame> = Vec::new();
    for item in Parser::new_from_str(text) {
        let (event, span) = item.ok()?;
        let line = span.start.line();
        match event {
            Event::DocumentStart(_) => {
                current = Some(Positions {
                    start_line: line,
                    lines: HashMap::new(),
                });
                stack.clear();
            }
            Event::DocumentEnd => docs.extend(current.take()),
            Event::MappingStart(..) | Event::SequenceStart(..) => {
                let doc = current.as_mut()?;
                let path = node_path(&mut stack);
                doc.lines.entry(path.clone()).or_insert(line);
                stack.push(match event {
                    Event::MappingStart(..) => Frame::Map { path, key: None },
                    _ => Frame::Seq { path, next: 0 },
                });
            }
            Event::MappingEnd | Event::SequenceEnd => {
                stack.pop();
                finish_value(&mut stack);
            }
            Event::Scalar(value, ..) => {
                let doc = current.as_mut()?;
                if let Some(Frame::Map { path, key }) = stack.last_mut()
                    && key.is_none()
                {
                    let full = join(path, &value);
                    doc.lines.entry(full).or_insert(line);
                    *key = Some(value.into_owned());
                    continue;
                }
                let path = node_path(&mut stack);
                doc.lines.entry(path).or_insert(line);
                finish_value(&mut stack);
            }
            Event::Alias(_) => {
                let doc = current.as_mut()?;
                if let Some(Frame::Map {
                    key: key @ None, ..
                }) = stack.last_mut()
                {
                    // An alias used as a key: no usable name.
                    *key = Some(String::from("?"));
                    continue;
                }
                let path = node_path(&mut stack);
                doc.lines.entry(path).or_insert(line);
                finish_value(&mut stack);
            }
            Event::StreamStart | Event::StreamEnd | Event::Nothing => {}
        }
    }
    Some(docs)
}

/// Path of the node that starts now, in the innermost container.
fn node_path(stack: &mut [Frame]) -> String {
    match stack.last_mut() {
        None => String::new(),
        Some(Frame::Map { path, key }) => join(path, key.as_deref().unwrap_or("?")),
        Some(Frame::Seq { path, next }) => format!("{path}[{next}]"),
    }
}

/// A value in the innermost container is complete: move to the next slot.
fn finish_value(stack: &mut [Frame]) {
    match stack.last_mut() {
        Some(Frame::Map { key, .. }) => *key = None,
        Some(Frame::Seq { next, .. }) => *next += 1,
        None => {}
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
apiVersion: v1
kind: Thing
spec:
  rolloutStrategy:
    maxSurge: 0
  list:
  - name: a
  - name: b
    env:
    - x
---
second: 1
";

    #[test]
    fn finds_lines_of_nested_fields_and_list_items() {
        let docs = index_stream(TEXT).unwrap();
        assert_eq!(docs.len(), 2);
        let first = &docs[0];
        assert_eq!(first.line_of("kind"), 2);
        assert_eq!(first.line_of("spec.rolloutStrategy.maxSurge"), 5);
        assert_eq!(first.line_of("spec.list[1].name"), 8);
        assert_eq!(first.line_of("spec.list[1].env[0]"), 10);
        assert_eq!(docs[1].line_of("second"), 12);
    }

    #[test]
    fn missing_paths_fall_back_to_the_nearest_ancestor() {
        let docs = index_stream(TEXT).unwrap();
        assert_eq!(docs[0].line_of("spec.rolloutStrategy.maxUnavailable"), 4);
        assert_eq!(docs[0].line_of("status.phase"), docs[0].start_line());
    }
}
