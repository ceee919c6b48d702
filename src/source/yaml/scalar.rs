//! What a YAML scalar means to Kubernetes.
//!
//! kubectl and the API server turn YAML into JSON with `sigs.k8s.io/yaml`,
//! which reads with go-yaml v2: YAML 1.1 scalars, not the YAML 1.2 core
//! schema most YAML libraries (serde_yaml among them) follow. The two
//! disagree on everyday values: `yes`, `on`, `y` and `off` are booleans,
//! `010` is 8, `0o7` is 7, `1_000` is 1000. This module is that table,
//! written from go-yaml v2's `resolve` and checked against a real API
//! server (tests/e2e/render.rs), so `render` and `verify` read a manifest
//! as the cluster will store it and write strings the cluster reads back as
//! strings.

/// A scalar as go-yaml v2 resolves it, before the JSON step.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolved {
    Null,
    Bool(bool),
    Int(i64),
    /// Above `i64::MAX`: go-yaml returns a `uint64`.
    UInt(u64),
    Float(f64),
    Str(String),
}

/// How an untagged scalar was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// Plain: its text is resolved against the table.
    Plain,
    /// Quoted or a block scalar: a string.
    Quoted,
}

/// Resolves a scalar with an optional tag (`tag:yaml.org,2002:int` written
/// `!!int`, or a local tag such as `!foo`); an error says why the tag and
/// the text disagree, in go-yaml's words.
pub fn resolve(text: &str, style: Style, tag: Option<&str>) -> Result<Resolved, String> {
    let core = tag.and_then(|t| t.strip_prefix("tag:yaml.org,2002:"));
    match (core, tag) {
        (None, None) if style == Style::Quoted => Ok(Resolved::Str(text.to_owned())),
        (None, None) => Ok(resolve_plain(text)),
        (Some("str"), _) => Ok(Resolved::Str(text.to_owned())),
        (Some("binary"), _) => binary(text).map(Resolved::Str),
        (Some(want @ ("bool" | "int" | "float" | "null" | "timestamp")), _) => {
            let got = resolve_plain(text);
            match (want, got) {
                ("bool", got @ Resolved::Bool(_)) | ("null", got @ Resolved::Null) => Ok(got),
                ("int", got @ (Resolved::Int(_) | Resolved::UInt(_))) => Ok(got),
                ("float", got @ Resolved::Float(_)) => Ok(got),
                ("float", Resolved::Int(i)) => Ok(Resolved::Float(i as f64)),
                ("float", Resolved::UInt(u)) => Ok(Resolved::Float(u as f64)),
                ("timestamp", Resolved::Str(s)) if looks_like_timestamp(&s) => Ok(Resolved::Str(s)),
                (want, got) => Err(format!(
                    "cannot decode !!{} `{}` as a !!{want}",
                    kind_name(&got),
                    crate::text::shorten(text)
                )),
            }
        }
        // Local tags (`!foo`), the non-specific `!`, `!!map`/`!!seq` on a
        // scalar and other core tags: go-yaml keeps the text as a string.
        _ => Ok(Resolved::Str(text.to_owned())),
    }
}

fn kind_name(value: &Resolved) -> &'static str {
    match value {
        Resolved::Null => "null",
        Resolved::Bool(_) => "bool",
        Resolved::Int(_) | Resolved::UInt(_) => "int",
        Resolved::Float(_) => "float",
        Resolved::Str(_) => "str",
    }
}

/// An untagged plain scalar.
pub fn resolve_plain(text: &str) -> Resolved {
    let Some(&first) = text.as_bytes().first() else {
        return Resolved::Null;
    };
    match first {
        b'y' | b'Y' | b'n' | b'N' | b't' | b'T' | b'f' | b'F' | b'o' | b'O' | b'~' => {
            named(text).unwrap_or_else(|| Resolved::Str(text.to_owned()))
        }
        b'.' => named(text)
            .or_else(|| dot_float(text))
            .unwrap_or_else(|| Resolved::Str(text.to_owned())),
        b'0'..=b'9' | b'+' | b'-' => named(text)
            .or_else(|| number(text))
            .unwrap_or_else(|| Resolved::Str(text.to_owned())),
        _ => Resolved::Str(text.to_owned()),
    }
}

/// go-yaml's map of names: booleans, nulls, infinities and NaN.
fn named(text: &str) -> Option<Resolved> {
    Some(match text {
        "y" | "Y" | "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => {
            Resolved::Bool(true)
        }
        "n" | "N" | "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => {
            Resolved::Bool(false)
        }
        "~" | "null" | "Null" | "NULL" => Resolved::Null,
        ".nan" | ".NaN" | ".NAN" => Resolved::Float(f64::NAN),
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => Resolved::Float(f64::INFINITY),
        "-.inf" | "-.Inf" | "-.INF" => Resolved::Float(f64::NEG_INFINITY),
        _ => return None,
    })
}

/// `.5`, `.5e3`: Go's `ParseFloat` on the text as written.
fn dot_float(text: &str) -> Option<Resolved> {
    let rest = text.strip_prefix('.')?;
    let (digits, exponent) = match rest.find(['e', 'E']) {
        Some(i) => (&rest[..i], Some(&rest[i + 1..])),
        None => (rest, None),
    };
    let digits_ok = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit());
    let exponent_ok = exponent.is_none_or(|e| {
        let e = e.strip_prefix(['+', '-']).unwrap_or(e);
        !e.is_empty() && e.bytes().all(|b| b.is_ascii_digit())
    });
    if !(digits_ok && exponent_ok) {
        return None;
    }
    finite(text.parse().ok()?)
}

/// Go's `ParseFloat` fails on overflow, and go-yaml then keeps the text.
fn finite(x: f64) -> Option<Resolved> {
    x.is_finite().then_some(Resolved::Float(x))
}

/// Digits or a sign first: an integer in any base Go's `ParseInt(s, 0, 64)`
/// reads (after go-yaml drops every `_`), else a decimal float.
fn number(text: &str) -> Option<Resolved> {
    let plain: String = text.chars().filter(|&c| c != '_').collect();
    if let Some(int) = go_parse_int(&plain) {
        return Some(int);
    }
    if is_yaml_style_float(&plain) {
        return finite(plain.parse().ok()?);
    }
    None
}

/// `strconv.ParseInt(s, 0, 64)`, then `ParseUint(s, 0, 64)` for what does
/// not fit: a sign, then `0x`/`0o`/`0b` or a leading `0` for octal.
fn go_parse_int(s: &str) -> Option<Resolved> {
    let (negative, body) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let signed = body.len() != s.len();
    let lower = body.get(..2).map(str::to_ascii_lowercase);
    let (radix, digits) = match lower.as_deref() {
        Some("0x") => (16, &body[2..]),
        Some("0o") => (8, &body[2..]),
        Some("0b") => (2, &body[2..]),
        _ if body.len() > 1 && body.starts_with('0') => (8, &body[1..]),
        _ => (10, body),
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let magnitude = u128::from_str_radix(digits, radix).ok()?;
    if negative {
        let value = i128::try_from(magnitude).ok().map(|m| -m)?;
        return i64::try_from(value).ok().map(Resolved::Int);
    }
    if let Ok(value) = i64::try_from(magnitude) {
        return Some(Resolved::Int(value));
    }
    // ParseUint takes no sign.
    if signed {
        return None;
    }
    u64::try_from(magnitude).ok().map(Resolved::UInt)
}

/// go-yaml's `^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`.
fn is_yaml_style_float(s: &str) -> bool {
    let s = s.strip_prefix(['+', '-']).unwrap_or(s);
    let (mantissa, exponent) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    };
    let all_digits = |t: &str| t.bytes().all(|b| b.is_ascii_digit());
    let mantissa_ok = match mantissa.split_once('.') {
        Some(("", fraction)) => !fraction.is_empty() && all_digits(fraction),
        Some((whole, fraction)) => all_digits(whole) && all_digits(fraction),
        None => !mantissa.is_empty() && all_digits(mantissa),
    };
    let exponent_ok = exponent.is_none_or(|e| {
        let e = e.strip_prefix(['+', '-']).unwrap_or(e);
        !e.is_empty() && all_digits(e)
    });
    mantissa_ok && exponent_ok
}

/// `!!binary`: standard base64 (line breaks ignored, as Go's decoder does),
/// then the bytes as a string, each byte that is not UTF-8 replaced by
/// U+FFFD, as Go's JSON encoder does.
fn binary(text: &str) -> Result<String, String> {
    use base64::Engine;
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    const GO_STD: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new()
            .with_decode_allow_trailing_bits(true)
            .with_decode_padding_mode(DecodePaddingMode::RequireCanonical),
    );
    let compact: String = text.chars().filter(|c| !matches!(c, '\r' | '\n')).collect();
    let bytes = GO_STD
        .decode(compact)
        .map_err(|_| "!!binary value contains invalid base64 data".to_owned())?;
    Ok(lossy_per_byte(&bytes))
}

/// Like `String::from_utf8_lossy`, but one U+FFFD per invalid byte.
fn lossy_per_byte(mut bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    loop {
        match std::str::from_utf8(bytes) {
            Ok(rest) => {
                out.push_str(rest);
                return out;
            }
            Err(e) => {
                let (valid, rest) = bytes.split_at(e.valid_up_to());
                out.push_str(std::str::from_utf8(valid).expect("checked"));
                out.push('\u{FFFD}');
                bytes = &rest[1..];
            }
        }
    }
}

/// A map key as `sigs.k8s.io/yaml` turns it into a JSON object key.
pub fn key_string(key: &Resolved) -> Result<String, String> {
    match key {
        Resolved::Str(s) => Ok(s.clone()),
        Resolved::Int(i) => Ok(i.to_string()),
        Resolved::Bool(b) => Ok(b.to_string()),
        Resolved::Float(x) => Ok(go_format_float32(*x)),
        Resolved::Null => Err("a null mapping key has no JSON form".into()),
        Resolved::UInt(u) => Err(format!("the mapping key {u} does not fit a JSON key")),
    }
}

/// Go's `strconv.FormatFloat(x, 'g', -1, 32)`, with go-yaml's names for the
/// infinities and NaN.
fn go_format_float32(x: f64) -> String {
    if x.is_nan() {
        return ".nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { ".inf" } else { "-.inf" }.into();
    }
    let single = x as f32;
    // Rust's `{:e}` gives the shortest digits that read back as this f32.
    let formatted = format!("{:e}", single.abs());
    let (mantissa, exponent) = formatted.split_once('e').expect("{:e} has an exponent");
    let digits: String = mantissa.chars().filter(|&c| c != '.').collect();
    let exponent: i32 = exponent.parse().expect("an integer exponent");
    let sign = if single.is_sign_negative() { "-" } else { "" };
    if !(-4..6).contains(&exponent) {
        let (head, tail) = digits.split_at(1);
        let point = if tail.is_empty() { "" } else { "." };
        let esign = if exponent < 0 { '-' } else { '+' };
        return format!("{sign}{head}{point}{tail}e{esign}{:02}", exponent.abs());
    }
    let point = exponent + 1;
    let body = if point <= 0 {
        format!("0.{}{digits}", "0".repeat(point.unsigned_abs() as usize))
    } else if point as usize >= digits.len() {
        format!("{digits}{}", "0".repeat(point as usize - digits.len()))
    } else {
        let (whole, fraction) = digits.split_at(point as usize);
        format!("{whole}.{fraction}")
    };
    format!("{sign}{body}")
}

/// Four digits and a dash: what go-yaml and YAML 1.2 readers may take for
/// a date. Written quoted, so no reader turns it into a timestamp.
pub fn looks_like_timestamp(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() >= 5 && b[..4].iter().all(u8::is_ascii_digit) && b[4] == b'-'
}

/// A plain scalar a YAML 1.2 core-schema reader (kustomize, yq, serde_yaml)
/// takes for something other than a string.
pub fn is_yaml12_special(s: &str) -> bool {
    if matches!(
        s,
        "null" | "Null" | "NULL" | "~" | "true" | "True" | "TRUE" | "false" | "False" | "FALSE"
    ) {
        return true;
    }
    let lower = s.to_ascii_lowercase();
    let unsigned = lower.strip_prefix(['+', '-']).unwrap_or(&lower);
    if matches!(unsigned, ".inf" | ".nan") {
        return true;
    }
    if let Some(hex) = unsigned.strip_prefix("0x") {
        return !hex.is_empty() && hex.chars().all(|c| c.is_ascii_hexdigit());
    }
    if let Some(oct) = unsigned.strip_prefix("0o") {
        return !oct.is_empty() && oct.chars().all(|c| c.is_digit(8));
    }
    is_yaml_style_float(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(text: &str) -> Resolved {
        resolve_plain(text)
    }

    /// Each row was checked on a real API server (a YAML body to a CRD
    /// that keeps unknown fields): what it stored.
    #[test]
    fn plain_scalars_resolve_as_the_api_server_reads_them() {
        use Resolved::*;
        let s = |v: &str| Str(v.to_owned());
        let rows = [
            ("yes", Bool(true)),
            ("on", Bool(true)),
            ("y", Bool(true)),
            ("n", Bool(false)),
            ("Off", Bool(false)),
            ("TRUE", Bool(true)),
            ("tRue", s("tRue")),
            ("0x10", Int(16)),
            ("-0x10", Int(-16)),
            ("+0x10", Int(16)),
            ("0X10", Int(16)),
            ("0o7", Int(7)),
            ("0O7", Int(7)),
            ("010", Int(8)),
            ("00", Int(0)),
            ("0_1", Int(1)),
            ("08", Float(8.0)),
            ("1_000", Int(1000)),
            ("1__0", Int(10)),
            ("_1", s("_1")),
            ("0x_1", Int(1)),
            ("0b11", Int(3)),
            ("0b", s("0b")),
            ("0o", s("0o")),
            ("99999999999999999999", Float(1e20)),
            ("18446744073709551615", UInt(u64::MAX)),
            ("9223372036854775808", UInt(9_223_372_036_854_775_808)),
            ("1e23", Float(1e23)),
            ("1e400", s("1e400")),
            ("1.0", Float(1.0)),
            ("1.e5", Float(1e5)),
            ("0.", Float(0.0)),
            (".5", Float(0.5)),
            ("-.5", Float(-0.5)),
            ("12e", s("12e")),
            ("1.0.0", s("1.0.0")),
            ("+12", Int(12)),
            ("1:20", s("1:20")),
            ("2001-12-14", s("2001-12-14")),
            ("~", Null),
            ("", Null),
            ("Null", Null),
            ("nULL", s("nULL")),
            ("<<", s("<<")),
        ];
        for (text, want) in rows {
            assert_eq!(plain(text), want, "{text:?}");
        }
        assert!(matches!(plain(".nan"), Float(x) if x.is_nan()));
        assert_eq!(plain("-.inf"), Float(f64::NEG_INFINITY));
    }

    #[test]
    fn tags_decide_before_the_table() {
        let tag = |t: &str| format!("tag:yaml.org,2002:{t}");
        assert_eq!(
            resolve("123", Style::Plain, Some(&tag("str"))).unwrap(),
            Resolved::Str("123".into())
        );
        assert_eq!(
            resolve("7", Style::Quoted, Some(&tag("int"))).unwrap(),
            Resolved::Int(7)
        );
        assert_eq!(
            resolve("1", Style::Plain, Some(&tag("float"))).unwrap(),
            Resolved::Float(1.0)
        );
        let err = resolve("1.5", Style::Plain, Some(&tag("int"))).unwrap_err();
        assert_eq!(err, "cannot decode !!float `1.5` as a !!int");
        assert_eq!(
            resolve("5", Style::Plain, Some("!foo")).unwrap(),
            Resolved::Str("5".into())
        );
        assert_eq!(
            resolve("yes", Style::Quoted, None).unwrap(),
            Resolved::Str("yes".into())
        );
    }

    #[test]
    fn binary_is_decoded_and_bytes_that_are_not_utf8_become_replacement_characters() {
        let tag = Some("tag:yaml.org,2002:binary");
        assert_eq!(
            resolve("aGVs\nbG8=", Style::Plain, tag).unwrap(),
            Resolved::Str("hello".into())
        );
        assert_eq!(
            resolve("/w==", Style::Plain, tag).unwrap(),
            Resolved::Str("\u{FFFD}".into())
        );
        assert_eq!(
            lossy_per_byte(&[0xF0, 0x9F, 0x98, b'A']),
            "\u{FFFD}\u{FFFD}\u{FFFD}A"
        );
        assert!(resolve("not base64!", Style::Plain, tag).is_err());
    }

    #[test]
    fn keys_become_json_keys_as_sigs_k8s_io_yaml_writes_them() {
        assert_eq!(key_string(&Resolved::Int(1)).unwrap(), "1");
        assert_eq!(key_string(&Resolved::Bool(true)).unwrap(), "true");
        assert_eq!(key_string(&Resolved::Float(1.5)).unwrap(), "1.5");
        assert_eq!(key_string(&Resolved::Float(1.0)).unwrap(), "1");
        assert_eq!(key_string(&Resolved::Float(1e23)).unwrap(), "1e+23");
        assert_eq!(
            key_string(&Resolved::Float(1234567.0)).unwrap(),
            "1.234567e+06"
        );
        assert_eq!(key_string(&Resolved::Float(0.0001)).unwrap(), "0.0001");
        assert_eq!(key_string(&Resolved::Float(0.00001)).unwrap(), "1e-05");
        assert_eq!(key_string(&Resolved::Float(0.1)).unwrap(), "0.1");
        assert!(key_string(&Resolved::Null).is_err());
    }
}
