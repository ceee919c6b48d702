//! JSON values as block YAML that every Kubernetes reader takes back as
//! the same value: go-yaml v2 (kubectl, the API server), YAML 1.2 readers
//! (kustomize, Flux, yq) alike.
//!
//! The layout is libyaml's (two-space indent, list items at their key's
//! indent, literal blocks for text with line breaks); the difference is in
//! the quoting: a string goes out plain only when neither YAML 1.1 nor 1.2
//! would read it as anything else, so `"yes"`, `"on"`, `"1_000"` and
//! `"0o7"` keep their quotes.

use std::fmt::Write;

use serde_json::Value;

use super::scalar::{self, Resolved};

/// One document, ending with a newline.
pub fn document(value: &Value) -> String {
    let mut out = String::new();
    match value {
        Value::Object(map) if !map.is_empty() => write_map(&mut out, map, 0, false),
        Value::Array(items) if !items.is_empty() => write_seq(&mut out, items, 0, false),
        scalar => {
            write_scalar(&mut out, scalar, 0);
            out.push('\n');
        }
    }
    out
}

/// A scalar on one line, for an edit in place: never a block.
pub fn inline_scalar(value: &Value) -> String {
    match value {
        Value::String(s) if !plain_ok(s) && !single_ok(s) => double_quoted(s),
        Value::String(s) if !plain_ok(s) => single_quoted(s),
        Value::Object(_) | Value::Array(_) => {
            serde_json::to_string(value).expect("JSON values serialize")
        }
        other => {
            let mut out = String::new();
            write_scalar(&mut out, other, 0);
            out
        }
    }
}

fn write_map(out: &mut String, map: &serde_json::Map<String, Value>, indent: usize, inline: bool) {
    for (i, (key, value)) in map.iter().enumerate() {
        if !(inline && i == 0) {
            pad(out, indent);
        }
        write_key(out, key);
        out.push(':');
        match value {
            Value::Object(inner) if !inner.is_empty() => {
                out.push('\n');
                write_map(out, inner, indent + 2, false);
            }
            Value::Array(items) if !items.is_empty() => {
                out.push('\n');
                write_seq(out, items, indent, false);
            }
            scalar => {
                out.push(' ');
                write_scalar(out, scalar, indent + 2);
                out.push('\n');
            }
        }
    }
}

fn write_seq(out: &mut String, items: &[Value], indent: usize, inline: bool) {
    for (i, item) in items.iter().enumerate() {
        if !(inline && i == 0) {
            pad(out, indent);
        }
        out.push_str("- ");
        match item {
            Value::Object(inner) if !inner.is_empty() => write_map(out, inner, indent + 2, true),
            Value::Array(inner) if !inner.is_empty() => write_seq(out, inner, indent + 2, true),
            scalar => {
                write_scalar(out, scalar, indent + 2);
                out.push('\n');
            }
        }
    }
}

fn pad(out: &mut String, indent: usize) {
    out.extend(std::iter::repeat_n(' ', indent));
}

fn write_key(out: &mut String, key: &str) {
    if plain_ok(key) {
        out.push_str(key);
    } else if single_ok(key) {
        out.push_str(&single_quoted(key));
    } else {
        out.push_str(&double_quoted(key));
    }
}

/// A scalar or an empty collection; a block scalar's lines are indented by
/// `indent`.
fn write_scalar(out: &mut String, value: &Value, indent: usize) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            let _ = write!(out, "{n}");
        }
        Value::Object(_) => out.push_str("{}"),
        Value::Array(_) => out.push_str("[]"),
        Value::String(s) if plain_ok(s) => out.push_str(s),
        Value::String(s) if literal_ok(s) => literal(out, s, indent),
        Value::String(s) if single_ok(s) => out.push_str(&single_quoted(s)),
        Value::String(s) => out.push_str(&double_quoted(s)),
    }
}

/// Characters YAML allows unescaped (its `c-printable`), minus the ones
/// that YAML 1.1 treats as line breaks (NEL, LS, PS) and the byte-order
/// mark.
fn printable(c: char) -> bool {
    matches!(c, '\u{20}'..='\u{7E}' | '\u{A0}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
        && !matches!(c, '\u{2028}' | '\u{2029}' | '\u{FEFF}')
}

/// Whether `s` can be written without quotes: printable, no surrounding
/// spaces, nothing a YAML reader parses as syntax, and read back as this
/// string by YAML 1.1 and 1.2.
pub fn is_plain_safe(s: &str) -> bool {
    plain_ok(s)
}

fn plain_ok(s: &str) -> bool {
    let Some(first) = s.chars().next() else {
        return false;
    };
    let syntax_first = matches!(
        first,
        '-' | '?'
            | ':'
            | ','
            | '['
            | ']'
            | '{'
            | '}'
            | '#'
            | '&'
            | '*'
            | '!'
            | '|'
            | '>'
            | '\''
            | '"'
            | '%'
            | '@'
            | '`'
            | ' '
    );
    let dash_word = first == '-' && s.len() > 1 && !s[1..].starts_with(' ');
    // `---` and `...` end a document when they start a line.
    let marker = s.starts_with("---") || s.starts_with("...");
    if (syntax_first && !dash_word) || marker || s.ends_with([' ', ':']) {
        return false;
    }
    if !s.chars().all(printable) || s.contains(": ") || s.contains(" #") {
        return false;
    }
    scalar::resolve_plain(s) == Resolved::Str(s.to_owned())
        && !scalar::is_yaml12_special(s)
        && !scalar::looks_like_timestamp(s)
        && s != "<<"
}

fn single_ok(s: &str) -> bool {
    s.chars().all(printable)
}

fn single_quoted(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// Double quotes with every character YAML does not allow written as an
/// escape.
fn double_quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if printable(c) => out.push(c),
            c if (c as u32) <= 0xFF => {
                let _ = write!(out, "\\x{:02X}", c as u32);
            }
            c if (c as u32) <= 0xFFFF => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => {
                let _ = write!(out, "\\U{:08X}", c as u32);
            }
        }
    }
    out.push('"');
    out
}

/// Text with line breaks reads best as a literal block, when each line can
/// be one: printable (tabs allowed), no carriage returns, not starting with
/// a space (that would need an indentation indicator), and no line of
/// spaces only.
fn literal_ok(s: &str) -> bool {
    s.contains('\n')
        && !s.starts_with([' ', '\n'])
        && s.chars().all(|c| c == '\n' || c == '\t' || printable(c))
        && s.split('\n')
            .all(|line| line.is_empty() || !line.trim_start_matches(' ').is_empty())
}

fn literal(out: &mut String, s: &str, indent: usize) {
    let body = s.trim_end_matches('\n');
    let trailing = s.len() - body.len();
    out.push_str(match trailing {
        0 => "|-",
        1 => "|",
        _ => "|+",
    });
    for line in s[..body.len()].split('\n') {
        out.push('\n');
        if !line.is_empty() {
            pad(out, indent);
            out.push_str(line);
        }
    }
    // With `|+` the trailing breaks are content: one ends the last line,
    // the rest are empty lines.
    for _ in 1..trailing {
        out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::super::read::read_stream;
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn round_trip(value: &Value) -> Value {
        let text = document(value);
        let mut docs = read_stream(&text).unwrap_or_else(|e| panic!("{text}\n{e:?}"));
        docs.remove(0)
    }

    #[test]
    fn strings_yaml_11_reads_as_something_else_keep_their_quotes() {
        let value = json!({"data": {"a": "yes", "b": "on", "c": "y", "d": "1_000", "e": "0o7",
            "f": "010", "g": "0x10", "h": "2001-12-14", "i": "<<", "j": "~", "k": "1e3", "l": ".5",
            "yes": "key", "m": "plain text (fine); here"}});
        let text = document(&value);
        assert!(text.contains("a: 'yes'"), "{text}");
        assert!(text.contains("'yes': key"), "{text}");
        assert!(text.contains("m: plain text (fine); here"), "{text}");
        assert_eq!(round_trip(&value), value);
    }

    #[test]
    fn the_layout_is_libyamls() {
        let value = json!({"a": {"b": [{"c": 1, "d": "x"}, "s", [1, 2]]}, "e": [], "f": {},
            "g": "line one\nline two\n", "h": "no newline\nat end", "i": "two\n\n"});
        let text = document(&value);
        assert_eq!(
            text,
            "a:\n  b:\n  - c: 1\n    d: x\n  - s\n  - - 1\n    - 2\ne: []\nf: {}\n\
             g: |\n  line one\n  line two\nh: |-\n  no newline\n  at end\ni: |+\n  two\n\n"
        );
        assert_eq!(round_trip(&value), value);
    }

    fn any_value() -> impl Strategy<Value = Value> {
        let text = prop_oneof![
            "[ -~]{0,12}",
            "(yes|no|on|off|y|n|~|null|<<|-|- a|-a|:a|a:|#|a #b|a: b|0x1F|0o7|010|1_0|1e3|.5|2001-12-14|'|\")",
            "\\PC{0,8}",
            "[ a\\n\\t\\r]{0,8}",
        ];
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            (-1e6f64..1e6).prop_map(|x| json!(x)),
            text.prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[ -~\\n]{0,6}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn whatever_is_written_reads_back_the_same(value in any_value()) {
            let value = json!({"v": value});
            // Whole floats read back as integers, as the API server stores them.
            let expected = round_trip_numbers(&value);
            prop_assert_eq!(round_trip(&value), expected);
        }
    }

    fn round_trip_numbers(value: &Value) -> Value {
        match value {
            Value::Number(n) if n.is_f64() => {
                let x = n.as_f64().unwrap();
                if x.fract() == 0.0 && x.abs() < 9.2e18 {
                    json!(x as i64)
                } else {
                    value.clone()
                }
            }
            Value::Array(items) => Value::Array(items.iter().map(round_trip_numbers).collect()),
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(k, v)| (k.clone(), round_trip_numbers(v)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }
}
