//! A YAML stream into JSON values, as the API server decodes a YAML body
//! with strict field validation (`sigs.k8s.io/yaml` over go-yaml v2):
//! YAML 1.1 scalars ([`super::scalar`]), `!!binary` decoded, aliases
//! expanded, merge keys (`<<`) applied, and refused where the server
//! refuses: a key set twice (also through a merge), NaN or an infinity
//! (JSON has neither), a key with no JSON form.
//!
//! Built on `saphyr-parser`'s events, without recursion, so depth and alias
//! expansion are bounded by counters, never by the stack.

use std::collections::HashMap;

use saphyr_parser::{Event, Parser, ScalarStyle, Span, Tag};
use serde_json::{Map, Number, Value};

use super::scalar::{self, Resolved, Style};

/// Nesting deeper than this is refused: no Kubernetes object comes close,
/// and everything that walks a value (validation, hashing, output) recurses.
pub const MAX_DEPTH: usize = 128;

/// Aliases may add at most this many times the nodes written out, plus a
/// little: a "billion laughs" document is refused before it grows.
const ALIAS_RATIO: usize = 10;
const ALIAS_ALLOWANCE: usize = 10_000;

/// Why a stream cannot be read: where, and what go-yaml or the API server
/// would say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    /// 0-based index of the document in the stream.
    pub document: usize,
    /// 1-based line.
    pub line: usize,
    pub message: String,
}

/// The documents of a stream, in order: `Null` for an empty one.
pub type Documents = Vec<Value>;

/// A finished node: scalars keep their resolution until they land, because
/// a key and a value turn into JSON differently.
#[derive(Debug, Clone)]
enum Node {
    Scalar(Resolved),
    Value(Value),
}

struct Collection {
    kind: Kind,
    anchor: usize,
    line: usize,
}

enum Kind {
    Seq(Vec<Value>),
    Map {
        map: Map<String, Value>,
        /// The key waiting for its value: its JSON form, whether it is a
        /// merge key, and its line.
        key: Option<(String, bool, usize)>,
        /// Where each key was set, to name both places of a duplicate.
        lines: HashMap<String, usize>,
    },
}

/// Reads every document of `text`.
pub fn read_stream(text: &str) -> Result<Documents, Error> {
    let mut reader = Reader::default();
    for item in Parser::new_from_str(text) {
        let (event, span) = item.map_err(|e| Error {
            document: reader.documents.len(),
            line: e.marker().line(),
            message: e.info().to_owned(),
        })?;
        reader.event(event, span)?;
    }
    Ok(reader.documents)
}

#[derive(Default)]
struct Reader {
    documents: Documents,
    stack: Vec<Collection>,
    anchors: HashMap<usize, (Node, usize)>,
    root: Option<Value>,
    /// Nodes written in this document, and nodes aliases added.
    written: usize,
    aliased: usize,
}

impl Reader {
    fn fail(&self, line: usize, message: impl Into<String>) -> Error {
        Error {
            document: self.documents.len(),
            line,
            message: message.into(),
        }
    }

    fn event(&mut self, event: Event<'_>, span: Span) -> Result<(), Error> {
        let line = span.start.line();
        match event {
            Event::DocumentStart(_) => {
                self.anchors.clear();
                self.root = None;
                self.written = 0;
                self.aliased = 0;
            }
            Event::DocumentEnd => {
                let root = self.root.take().unwrap_or(Value::Null);
                self.documents.push(root);
            }
            Event::Scalar(text, style, anchor, tag) => {
                self.written += 1;
                let style = match style {
                    ScalarStyle::Plain => Style::Plain,
                    _ => Style::Quoted,
                };
                let tag = tag.map(|t| tag_name(&t));
                let merge = style == Style::Plain
                    && text == "<<"
                    && tag
                        .as_deref()
                        .is_none_or(|t| t == "tag:yaml.org,2002:merge");
                if merge && self.awaiting_key() {
                    self.merge_key(line);
                    return Ok(());
                }
                let resolved = scalar::resolve(&text, style, tag.as_deref())
                    .map_err(|m| self.fail(line, m))?;
                self.finish(Node::Scalar(resolved), anchor, line)?;
            }
            Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                self.written += 1;
                if self.stack.len() >= MAX_DEPTH {
                    return Err(
                        self.fail(line, format!("nested more than {MAX_DEPTH} levels deep"))
                    );
                }
                let kind = match event {
                    Event::SequenceStart(..) => Kind::Seq(Vec::new()),
                    _ => Kind::Map {
                        map: Map::new(),
                        key: None,
                        lines: HashMap::new(),
                    },
                };
                self.stack.push(Collection { kind, anchor, line });
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let done = self.stack.pop().expect("the parser balances collections");
                let value = match done.kind {
                    Kind::Seq(items) => Value::Array(items),
                    Kind::Map { map, .. } => Value::Object(map),
                };
                self.finish(Node::Value(value), done.anchor, done.line)?;
            }
            Event::Alias(id) => {
                let Some((node, size)) = self.anchors.get(&id).cloned() else {
                    return Err(
                        self.fail(line, "an alias refers to a node that is not complete yet")
                    );
                };
                self.aliased += size;
                if self.aliased > ALIAS_RATIO * self.written + ALIAS_ALLOWANCE {
                    return Err(self.fail(
                        line,
                        format!(
                            "aliases expand to more than {ALIAS_RATIO} times the document's own size; refused as a possible alias bomb"
                        ),
                    ));
                }
                self.finish(node, 0, line)?;
            }
            Event::StreamStart | Event::StreamEnd | Event::Nothing => {}
        }
        Ok(())
    }

    fn awaiting_key(&self) -> bool {
        matches!(
            self.stack.last(),
            Some(Collection {
                kind: Kind::Map { key: None, .. },
                ..
            })
        )
    }

    /// The key waiting for its value is the merge key `<<`.
    fn merge_key(&mut self, line: usize) {
        if let Some(Kind::Map { key, .. }) = self.stack.last_mut().map(|c| &mut c.kind) {
            *key = Some((String::new(), true, line));
        }
    }

    /// A node is complete: remember its anchor, then place it as a key, a
    /// value or the document.
    fn finish(&mut self, node: Node, anchor: usize, line: usize) -> Result<(), Error> {
        if anchor != 0 {
            let size = match &node {
                Node::Scalar(_) => 1,
                Node::Value(v) => count_nodes(v),
            };
            self.anchors.insert(anchor, (node.clone(), size));
        }
        enum Slot {
            Root,
            Item,
            Key,
            Value,
        }
        let slot = match self.stack.last().map(|c| &c.kind) {
            None => Slot::Root,
            Some(Kind::Seq(_)) => Slot::Item,
            Some(Kind::Map { key: None, .. }) => Slot::Key,
            Some(Kind::Map { key: Some(_), .. }) => Slot::Value,
        };
        match slot {
            Slot::Root => self.root = Some(self.json(node, line)?),
            Slot::Item => {
                let value = self.json(node, line)?;
                if let Some(Kind::Seq(items)) = self.stack.last_mut().map(|c| &mut c.kind) {
                    items.push(value);
                }
            }
            Slot::Key => {
                let name = match node {
                    Node::Scalar(resolved) => {
                        scalar::key_string(&resolved).map_err(|m| self.fail(line, m))?
                    }
                    Node::Value(_) => {
                        return Err(self.fail(line, "a mapping key must be a scalar"));
                    }
                };
                if let Some(Kind::Map { key, .. }) = self.stack.last_mut().map(|c| &mut c.kind) {
                    *key = Some((name, false, line));
                }
            }
            Slot::Value => {
                let value = self.json(node, line)?;
                let document = self.documents.len();
                let Some(Kind::Map { map, key, lines }) =
                    self.stack.last_mut().map(|c| &mut c.kind)
                else {
                    unreachable!("the slot is a mapping's value")
                };
                let (name, merge, key_line) = key.take().expect("the slot has a key");
                let entries = if merge {
                    merged_entries(value).map_err(|message| Error {
                        document,
                        line: key_line,
                        message,
                    })?
                } else {
                    vec![(name, value)]
                };
                for (name, value) in entries {
                    if let Some(first) = lines.get(&name) {
                        let how = if merge {
                            " (through the merge key `<<`)"
                        } else {
                            ""
                        };
                        return Err(Error {
                            document,
                            line: key_line,
                            message: format!(
                                "key {} is set twice{how}, first on line {first}: the API server refuses it (kubectl would keep one of them silently)",
                                crate::text::quote(&name)
                            ),
                        });
                    }
                    lines.insert(name.clone(), key_line);
                    map.insert(name, value);
                }
            }
        }
        Ok(())
    }

    /// A node as the JSON the API server stores.
    fn json(&self, node: Node, line: usize) -> Result<Value, Error> {
        match node {
            Node::Value(v) => Ok(v),
            Node::Scalar(resolved) => scalar_json(resolved).map_err(|m| self.fail(line, m)),
        }
    }
}

/// `!!int`-style tags as the full names `Tag` carries.
fn tag_name(tag: &Tag) -> String {
    format!("{}{}", tag.handle, tag.suffix)
}

/// What a resolved scalar is once go-yaml's value went through Go's JSON
/// encoder and the API server decoded it again: a whole float within
/// `i64` is an integer (`1.0` is stored as `1`), a `uint64` above `i64` a
/// float, NaN and infinities refused.
fn scalar_json(resolved: Resolved) -> Result<Value, String> {
    Ok(match resolved {
        Resolved::Null => Value::Null,
        Resolved::Bool(b) => Value::Bool(b),
        Resolved::Int(i) => Value::from(i),
        Resolved::UInt(u) => Number::from_f64(u as f64).map_or(Value::Null, Value::Number),
        Resolved::Float(x) if !x.is_finite() => {
            return Err(format!(
                "{} is not a number JSON can hold; the API server refuses it",
                if x.is_nan() {
                    ".nan"
                } else if x > 0.0 {
                    ".inf"
                } else {
                    "-.inf"
                }
            ));
        }
        Resolved::Float(x) if x.fract() == 0.0 && x.abs() < 9.2e18 => Value::from(x as i64),
        Resolved::Float(x) => Number::from_f64(x).map_or(Value::Null, Value::Number),
        Resolved::Str(s) => Value::String(s),
    })
}

/// The entries a merge key brings: a mapping, or a list of mappings where
/// earlier ones win (go-yaml applies them last to first).
fn merged_entries(value: Value) -> Result<Vec<(String, Value)>, String> {
    const WANT: &str = "the merge key `<<` needs a mapping or a list of mappings";
    match value {
        Value::Object(map) => Ok(map.into_iter().collect()),
        Value::Array(items) => {
            let mut out: Vec<(String, Value)> = Vec::new();
            for item in items.into_iter().rev() {
                let Value::Object(map) = item else {
                    return Err(WANT.into());
                };
                for (k, v) in map {
                    if out.iter().any(|(seen, _)| *seen == k) {
                        return Err(format!(
                            "key {} comes from two mappings of the merge key `<<`: the API server refuses it",
                            crate::text::quote(&k)
                        ));
                    }
                    out.push((k, v));
                }
            }
            Ok(out)
        }
        _ => Err(WANT.into()),
    }
}

fn count_nodes(value: &Value) -> usize {
    let mut count = 0;
    let mut pending = vec![value];
    while let Some(v) = pending.pop() {
        count += 1;
        match v {
            Value::Array(items) => pending.extend(items),
            Value::Object(map) => pending.extend(map.values()),
            _ => {}
        }
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn one(text: &str) -> Value {
        let mut docs = read_stream(text).unwrap();
        assert_eq!(docs.len(), 1, "{text}");
        docs.remove(0)
    }

    fn error(text: &str) -> Error {
        read_stream(text).unwrap_err()
    }

    #[test]
    fn values_are_what_the_api_server_stores() {
        let text = "\
a: yes
b: '010'
c: 010
d: !!binary aGVsbG8=
e: &x {k: 1}
f: *x
g: 1.0
h: 1e23
i: !foo 5
1: int key
true: bool key
1.5: float key
j: ~
k: 2001-12-14
";
        assert_eq!(
            one(text),
            json!({"a": true, "b": "010", "c": 8, "d": "hello", "e": {"k": 1}, "f": {"k": 1},
                   "g": 1, "h": 1e23, "i": "5", "1": "int key", "true": "bool key",
                   "1.5": "float key", "j": null, "k": "2001-12-14"})
        );
    }

    #[test]
    fn merge_keys_are_applied() {
        assert_eq!(
            one("base: &b {a: 1, b: 2}\nm:\n  <<: *b\n  c: 3\n"),
            json!({"base": {"a": 1, "b": 2}, "m": {"a": 1, "b": 2, "c": 3}})
        );
        assert_eq!(
            one("m: {<<: [{a: 1}, {b: 2}]}\n"),
            json!({"m": {"a": 1, "b": 2}})
        );
        assert_eq!(one("m: {'<<': 1}\n"), json!({"m": {"<<": 1}}));
    }

    #[test]
    fn yaml_11_keys_collide_where_the_api_server_sees_them_collide() {
        // `y` is a boolean in YAML 1.1: the key is "true".
        assert_eq!(one("y: 1\n"), json!({"true": 1}));
        assert!(error("y: 1\n'true': 2\n").message.contains("set twice"));
    }

    #[test]
    fn a_key_set_twice_is_refused_with_both_lines() {
        let e = error("a: 1\nb: 2\na: 3\n");
        assert_eq!(e.line, 3);
        assert!(
            e.message.contains("\"a\" is set twice, first on line 1"),
            "{e:?}"
        );
        let e = error("m: {a: 1, <<: {a: 2}}\n");
        assert!(e.message.contains("through the merge key"), "{e:?}");
        let e = error("m: {<<: [{a: 1}, {a: 2}]}\n");
        assert!(e.message.contains("two mappings"), "{e:?}");
        // Keys are compared as the JSON keys they become.
        let e = error("1: a\n'1': b\n");
        assert!(e.message.contains("set twice"), "{e:?}");
    }

    #[test]
    fn what_json_cannot_hold_is_refused() {
        for text in ["a: .nan\n", "a: .inf\n", "a: -.Inf\n", "a: [.NaN]\n"] {
            let e = error(text);
            assert!(e.message.contains("JSON can hold"), "{text}: {e:?}");
        }
        assert!(error("~: 1\n").message.contains("null mapping key"));
        assert!(error("[1]: 1\n").message.contains("must be a scalar"));
        assert!(error("a: !!int 1.5\n").message.contains("as a !!int"));
    }

    #[test]
    fn documents_are_counted_and_empty_ones_are_null() {
        let docs = read_stream("a: 1\n---\n---\nb: 2\n").unwrap();
        assert_eq!(docs, vec![json!({"a": 1}), Value::Null, json!({"b": 2})]);
        let e = error("a: 1\n---\nb: [1, 2\n");
        assert_eq!(e.document, 1);
    }

    #[test]
    fn depth_and_alias_expansion_are_bounded() {
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        assert!(error(&deep).message.contains("levels deep"));
        let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..12 {
            let p = i - 1;
            bomb.push_str(&format!("a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"));
        }
        assert!(error(&bomb).message.contains("alias bomb"));
    }
}
