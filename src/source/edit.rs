//! Editing YAML text in place: how `verify --fix` applies its fixes.
//!
//! A fix changes one scalar or removes one mapping entry, and nothing else:
//! comments, key order, quoting, indentation and line endings outside the
//! changed value stay byte for byte. The positions come from the same
//! event parser that gives findings their lines; the text is then edited
//! by byte range, never re-serialized.

use std::fmt;

use saphyr_parser::{Event, Parser, ScalarStyle};

/// What to do at a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Set the scalar to this string (quoted as the old one was, or as
    /// YAML needs).
    Set(String),
    /// Remove the entry (its key, value and line); a mapping left empty
    /// goes with it.
    Remove,
}

/// One fix: a change at a mapping path of one document of a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edit {
    /// 0-based document index in the stream.
    pub document: usize,
    /// Mapping keys from the document root, e.g. `["spec", "version"]`.
    pub path: Vec<String>,
    /// What to do there.
    pub action: Action,
}

/// Why a fix could not be applied; the text is then left as it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FixError(pub String);

impl fmt::Display for FixError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where an entry is: the key's start and the value's span, in bytes.
#[derive(Debug, Clone)]
struct Entry {
    key_start: usize,
    value_start: usize,
    value_end: usize,
    value: Found,
    /// Whether the mapping holding it is in block style (not `{...}`).
    block: bool,
}

#[derive(Debug, Clone, Copy)]
enum Found {
    Scalar(ScalarStyle),
    Alias,
    Collection,
}

/// The target entry, how many entries its mapping has, and the entry that
/// holds that mapping (absent at the document root).
#[derive(Debug)]
struct Located {
    entry: Entry,
    siblings: usize,
    parent: Option<Entry>,
}

/// Applies every edit to `text`, or none: an edit that cannot be made
/// exactly (a path that is not there, an alias, a block scalar, a flow
/// mapping to remove from) fails the whole call.
pub fn apply(text: &str, edits: &[Edit]) -> Result<String, FixError> {
    let mut ranges: Vec<(usize, usize, String)> = Vec::new();
    for edit in edits {
        let located = locate(text, edit)?;
        ranges.push(match &edit.action {
            Action::Set(value) => set(text, &located.entry, value, edit)?,
            Action::Remove => remove(text, &located, edit)?,
        });
    }
    ranges.sort_by_key(|r| std::cmp::Reverse(r.0));
    for pair in ranges.windows(2) {
        if pair[1].1 > pair[0].0 {
            return Err(FixError("two fixes overlap".into()));
        }
    }
    let mut out = text.to_owned();
    for (start, end, with) in ranges {
        out.replace_range(start..end, &with);
    }
    Ok(out)
}

fn describe(edit: &Edit) -> String {
    format!("document {}: {}", edit.document + 1, edit.path.join("."))
}

fn set(
    text: &str,
    entry: &Entry,
    value: &str,
    edit: &Edit,
) -> Result<(usize, usize, String), FixError> {
    let style = match entry.value {
        Found::Scalar(style) => style,
        Found::Alias => {
            return Err(FixError(format!(
                "{}: the value is an alias; changing it would change what the anchor means elsewhere",
                describe(edit)
            )));
        }
        Found::Collection => {
            return Err(FixError(format!("{}: not a scalar", describe(edit))));
        }
    };
    let rendered = match style {
        ScalarStyle::Plain if plain_is_safe(value) => value.to_owned(),
        ScalarStyle::SingleQuoted => format!("'{}'", value.replace('\'', "''")),
        ScalarStyle::Plain | ScalarStyle::DoubleQuoted => {
            serde_json::to_string(value).expect("a string serializes")
        }
        ScalarStyle::Literal | ScalarStyle::Folded => {
            return Err(FixError(format!(
                "{}: a block scalar; change it by hand",
                describe(edit)
            )));
        }
    };
    let (start, end) = scalar_bounds(text, entry, style);
    Ok((start, end, rendered))
}

/// The scalar's own bytes: after any anchor (`&a`) or tag (`!t`) before
/// it, and for a quoted scalar up to its closing quote (the parser's span
/// may reach on to the next token, over a trailing comment).
fn scalar_bounds(text: &str, entry: &Entry, style: ScalarStyle) -> (usize, usize) {
    let mut start = entry.value_start;
    while text[start..].starts_with(['&', '!']) {
        let token = text[start..]
            .find(char::is_whitespace)
            .map_or(text.len(), |i| start + i);
        start = token + text[token..].len() - text[token..].trim_start_matches([' ', '\t']).len();
    }
    let end = match style {
        ScalarStyle::DoubleQuoted => {
            let mut escaped = false;
            let mut close = None;
            for (i, c) in text[start + 1..].char_indices() {
                match c {
                    _ if escaped => escaped = false,
                    '\\' => escaped = true,
                    '"' => {
                        close = Some(start + 1 + i + 1);
                        break;
                    }
                    _ => {}
                }
            }
            close.unwrap_or(entry.value_end)
        }
        ScalarStyle::SingleQuoted => {
            let body = &text[start + 1..];
            let mut i = 0;
            let bytes = body.as_bytes();
            let mut close = None;
            while i < bytes.len() {
                if bytes[i] == b'\'' {
                    if bytes.get(i + 1) == Some(&b'\'') {
                        i += 2;
                        continue;
                    }
                    close = Some(start + 1 + i + 1);
                    break;
                }
                i += 1;
            }
            close.unwrap_or(entry.value_end)
        }
        _ => entry.value_end,
    };
    (start, end)
}

/// Whether `value` reads back as the same string when written plain.
fn plain_is_safe(value: &str) -> bool {
    super::yaml::write::is_plain_safe(value)
}

fn remove(text: &str, located: &Located, edit: &Edit) -> Result<(usize, usize, String), FixError> {
    let entry = &located.entry;
    if !entry.block {
        return Err(FixError(format!(
            "{}: in a flow mapping ({{...}}); remove it by hand",
            describe(edit)
        )));
    }
    // A mapping left empty goes with its key (`annotations:` with nothing
    // under it would read as null).
    let from = match &located.parent {
        Some(parent) if located.siblings == 1 && parent.block => parent.key_start,
        _ => entry.key_start,
    };
    let start = line_start(text, from);
    if !text[start..from].trim().is_empty() {
        return Err(FixError(format!(
            "{}: the entry does not start its line; remove it by hand",
            describe(edit)
        )));
    }
    let value_end = match entry.value {
        Found::Scalar(style) => scalar_bounds(text, entry, style).1,
        _ => entry.value_end,
    };
    Ok((start, line_end(text, value_end), String::new()))
}

fn line_start(text: &str, at: usize) -> usize {
    text[..at].rfind('\n').map_or(0, |i| i + 1)
}

/// The byte after the newline that ends the line holding `at` (CRLF or LF).
fn line_end(text: &str, at: usize) -> usize {
    let at = at.min(text.len());
    match text[at..].find('\n') {
        Some(i) => at + i + 1,
        None => text.len(),
    }
}

struct Frame {
    /// The current key and where it starts; `None` between entries.
    key: Option<(String, usize)>,
    entries: usize,
    block: bool,
    /// Whether this mapping lies on the path (every key above it matches).
    on_path: bool,
    /// Where the current entry's value started, for a collection value.
    value_start: usize,
    /// A sequence: nothing below it is on a mapping path.
    sequence: bool,
}

/// Finds the entry `edit.path` names in document `edit.document`.
fn locate(text: &str, edit: &Edit) -> Result<Located, FixError> {
    let bytes = char_to_byte(text);
    let at = |index: usize| bytes.get(index).copied().unwrap_or(text.len());
    let path = &edit.path;
    let mut document: Option<usize> = None;
    let mut stack: Vec<Frame> = Vec::new();
    let mut entry: Option<Entry> = None;
    let mut siblings = 0;
    let mut parent: Option<Entry> = None;
    for item in Parser::new_from_str(text) {
        let (event, span) = item.map_err(|e| FixError(format!("not YAML: {e}")))?;
        let (start, end) = (at(span.start.index()), at(span.end.index()));
        if let Event::DocumentStart(_) = event {
            document = Some(document.map_or(0, |d| d + 1));
            stack.clear();
            continue;
        }
        if document != Some(edit.document) {
            continue;
        }
        match event {
            Event::MappingStart(..) | Event::SequenceStart(..) => {
                let depth = stack.len();
                let on_path = match stack.last_mut() {
                    None => true,
                    Some(top) => {
                        top.value_start = start;
                        !top.sequence
                            && top.on_path
                            && top
                                .key
                                .as_ref()
                                .is_some_and(|(k, _)| path.get(depth - 1) == Some(k))
                    }
                };
                let sequence = matches!(event, Event::SequenceStart(..));
                stack.push(Frame {
                    key: None,
                    entries: 0,
                    block: !text[start..].starts_with(['{', '[']),
                    on_path,
                    value_start: start,
                    sequence,
                });
            }
            Event::MappingEnd | Event::SequenceEnd => {
                let done = stack.pop().expect("balanced events");
                let depth = stack.len();
                if !done.sequence && done.on_path && depth + 1 == path.len() {
                    siblings = done.entries;
                    if let Some(top) = stack.last()
                        && let Some((_, key_start)) = &top.key
                    {
                        parent = Some(Entry {
                            key_start: *key_start,
                            value_start: top.value_start,
                            value_end: end,
                            value: Found::Collection,
                            block: top.block,
                        });
                    }
                }
                value_done(&mut stack);
            }
            Event::Scalar(..) | Event::Alias(_) => {
                let Some(top) = stack.last_mut() else {
                    continue;
                };
                if !top.sequence && top.key.is_none() {
                    let name = match &event {
                        Event::Scalar(value, ..) => value.to_string(),
                        _ => "?".to_owned(),
                    };
                    top.key = Some((name, start));
                    continue;
                }
                let depth = stack.len();
                let top = stack.last().expect("checked above");
                if !top.sequence
                    && top.on_path
                    && depth == path.len()
                    && let Some((key, key_start)) = &top.key
                    && *key == path[depth - 1]
                {
                    entry = Some(Entry {
                        key_start: *key_start,
                        value_start: start,
                        value_end: end,
                        value: match event {
                            Event::Scalar(_, style, ..) => Found::Scalar(style),
                            _ => Found::Alias,
                        },
                        block: top.block,
                    });
                }
                value_done(&mut stack);
            }
            _ => {}
        }
    }
    match entry {
        Some(entry) => Ok(Located {
            entry,
            siblings,
            parent,
        }),
        None => Err(FixError(format!("{}: not found", describe(edit)))),
    }
}

fn value_done(stack: &mut [Frame]) {
    if let Some(top) = stack.last_mut()
        && !top.sequence
    {
        top.key = None;
        top.entries += 1;
    }
}

/// Byte offset of every char index (and of the end).
fn char_to_byte(text: &str) -> Vec<usize> {
    let mut offsets: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
    offsets.push(text.len());
    offsets
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(document: usize, path: &[&str], value: &str) -> Edit {
        Edit {
            document,
            path: path.iter().map(|s| s.to_string()).collect(),
            action: Action::Set(value.to_owned()),
        }
    }

    fn remove(document: usize, path: &[&str]) -> Edit {
        Edit {
            document,
            path: path.iter().map(|s| s.to_string()).collect(),
            action: Action::Remove,
        }
    }

    const MODEL: &str = "\
# The service's model. Keep v2 until the review.
apiVersion: openmed.ai/v1alpha1
kind: OpenMedModel
metadata:
  name: svc   # the Deployment's name too
  annotations:
    openmed.ai/rollback-to: \"OpenMed/a-v1\"  # asked by on-call
    team: nlp
spec:
  family: pii
  version: OpenMed/a-v3 # bumped in PR 12
  tier: Small
";

    #[test]
    fn a_value_changes_and_nothing_else() {
        let out = apply(MODEL, &[set(0, &["spec", "version"], "OpenMed/a-v1")]).unwrap();
        assert_eq!(
            out,
            MODEL.replace("version: OpenMed/a-v3 #", "version: OpenMed/a-v1 #")
        );
    }

    #[test]
    fn quoting_follows_the_old_value() {
        let out = apply(
            MODEL,
            &[set(
                0,
                &["metadata", "annotations", "openmed.ai/rollback-to"],
                "OpenMed/a-v2",
            )],
        )
        .unwrap();
        assert!(
            out.contains("openmed.ai/rollback-to: \"OpenMed/a-v2\"  # asked by on-call\n"),
            "{out}"
        );
        let single = "a:\n  b: 'x'\n";
        assert_eq!(
            apply(single, &[set(0, &["a", "b"], "it's")]).unwrap(),
            "a:\n  b: 'it''s'\n"
        );
        // A plain value that would read back as something else is quoted.
        let plain = "a:\n  b: x\n";
        assert_eq!(
            apply(plain, &[set(0, &["a", "b"], "true")]).unwrap(),
            "a:\n  b: \"true\"\n"
        );
        assert_eq!(
            apply(plain, &[set(0, &["a", "b"], "v: 2")]).unwrap(),
            "a:\n  b: \"v: 2\"\n"
        );
    }

    #[test]
    fn an_entry_goes_with_its_line_and_an_emptied_mapping_with_its_key() {
        let path = ["metadata", "annotations", "openmed.ai/rollback-to"];
        let out = apply(MODEL, &[remove(0, &path)]).unwrap();
        assert_eq!(
            out,
            MODEL.replace(
                "    openmed.ai/rollback-to: \"OpenMed/a-v1\"  # asked by on-call\n",
                ""
            )
        );
        let quoted = "metadata:\n  annotations:\n    a: 'x'\n    b: \"y\"\n    c: z\n";
        assert_eq!(
            apply(quoted, &[remove(0, &["metadata", "annotations", "b"])]).unwrap(),
            "metadata:\n  annotations:\n    a: 'x'\n    c: z\n"
        );
        assert_eq!(
            apply(quoted, &[remove(0, &["metadata", "annotations", "a"])]).unwrap(),
            "metadata:\n  annotations:\n    b: \"y\"\n    c: z\n"
        );
        let only =
            "metadata:\n  name: svc\n  annotations:\n    openmed.ai/rollback-to: v1\nspec: {}\n";
        assert_eq!(
            apply(only, &[remove(0, &path)]).unwrap(),
            "metadata:\n  name: svc\nspec: {}\n"
        );
    }

    #[test]
    fn the_right_document_of_a_stream_and_crlf_line_ends() {
        let stream = "kind: A\nspec:\n  version: v1\n---\nkind: B\nspec:\n  version: v1\n";
        let out = apply(stream, &[set(1, &["spec", "version"], "v2")]).unwrap();
        assert_eq!(
            out,
            "kind: A\nspec:\n  version: v1\n---\nkind: B\nspec:\n  version: v2\n"
        );
        let crlf = MODEL.replace('\n', "\r\n");
        let out = apply(
            &crlf,
            &[
                set(0, &["spec", "version"], "OpenMed/a-v1"),
                remove(0, &["metadata", "annotations", "team"]),
            ],
        )
        .unwrap();
        assert_eq!(
            out,
            crlf.replace("version: OpenMed/a-v3", "version: OpenMed/a-v1")
                .replace("    team: nlp\r\n", "")
        );
    }

    #[test]
    fn anchors_stay_and_aliases_are_refused() {
        let anchored = "spec:\n  version: &v OpenMed/a-v3\nother:\n  version: *v\n";
        let out = apply(anchored, &[set(0, &["spec", "version"], "OpenMed/a-v1")]).unwrap();
        assert_eq!(
            out,
            "spec:\n  version: &v OpenMed/a-v1\nother:\n  version: *v\n"
        );
        let err = apply(anchored, &[set(0, &["other", "version"], "x")]).unwrap_err();
        assert!(err.0.contains("alias"), "{err}");
    }

    #[test]
    fn what_cannot_be_done_exactly_is_refused_and_nothing_changes() {
        assert!(
            apply(MODEL, &[set(0, &["spec", "missing"], "x")])
                .unwrap_err()
                .0
                .contains("not found")
        );
        assert!(apply(MODEL, &[set(1, &["spec", "version"], "x")]).is_err());
        let flow = "metadata: {annotations: {a: b, c: d}}\n";
        assert!(
            apply(flow, &[remove(0, &["metadata", "annotations", "a"])])
                .unwrap_err()
                .0
                .contains("flow")
        );
        let block = "spec:\n  version: |\n    v1\n";
        assert!(
            apply(block, &[set(0, &["spec", "version"], "v2")])
                .unwrap_err()
                .0
                .contains("block")
        );
        // Keys inside sequences are not on a mapping path.
        let seq = "spec:\n  - version: v1\n";
        assert!(apply(seq, &[set(0, &["spec", "version"], "v2")]).is_err());
    }
}
