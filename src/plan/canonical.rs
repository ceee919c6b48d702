//! Canonical JSON and the `sha256:` hashes built on it.
//!
//! The bytes must equal what the earlier Python operator produced with
//! `json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)`,
//! because the hashes are stored in pod templates and status: a different
//! byte would restart every pod on migration.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// Canonical JSON: keys sorted, no whitespace, non-ASCII escaped as `\uXXXX`.
pub fn to_canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, value);
    out
}

/// `sha256:` and the lowercase hex SHA-256 of `bytes`.
pub fn sha256_tag(bytes: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(bytes)))
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

fn write_value(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&n.to_string()),
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item);
            }
            out.push(']');
        }
        Value::Object(map) => {
            // Python sorts by code point, which is the byte order of UTF-8.
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, key);
                out.push(':');
                write_value(out, item);
            }
            out.push('}');
        }
    }
}

/// Python's `ensure_ascii` escaping: everything outside `' '..='~'` is escaped.
fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sorts_keys_and_drops_whitespace() {
        let v = json!({"b": [1, {"d": true, "c": null}], "a": "x"});
        assert_eq!(
            to_canonical_json(&v),
            r#"{"a":"x","b":[1,{"c":null,"d":true}]}"#
        );
    }

    #[test]
    fn escapes_like_python_ensure_ascii() {
        // json.dumps("é\u007f\"\\\n😀", ensure_ascii=True)
        let v = json!("é\u{7f}\"\\\n😀");
        assert_eq!(to_canonical_json(&v), r#""\u00e9\u007f\"\\\n\ud83d\ude00""#);
    }

    #[test]
    fn hashes_are_tagged_lowercase_hex() {
        assert_eq!(
            sha256_tag(b""),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
