//! How input appears in messages: quoted, and cut when long, so a hostile
//! value never turns into megabytes of stderr, status or annotations. The
//! lowest layer, beside `source`: everything that reports may use it.

/// Longest quoted value a message shows whole.
const QUOTE_LIMIT: usize = 120;

/// `value` quoted for a message; a long one is cut, keeping its start and
/// saying how long it was: `"aaaa…" (52428800 characters)`.
pub fn quote(value: &str) -> String {
    let length = value.chars().count();
    if length <= QUOTE_LIMIT {
        return format!("{value:?}");
    }
    let start: String = value.chars().take(QUOTE_LIMIT).collect();
    let quoted = format!("{start:?}");
    format!("{}…\" ({length} characters)", &quoted[..quoted.len() - 1])
}

/// A value's text unquoted (a YAML scalar as written), cut the same way.
pub fn shorten(text: &str) -> String {
    let length = text.chars().count();
    if length <= QUOTE_LIMIT {
        return text.to_owned();
    }
    let start: String = text.chars().take(QUOTE_LIMIT).collect();
    format!("{start}… ({length} characters)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_values_are_cut_and_say_how_long_they_were() {
        assert_eq!(quote("v1"), "\"v1\"");
        let long = "a".repeat(50_000);
        let quoted = quote(&long);
        assert!(
            quoted.starts_with(&format!("\"{}", "a".repeat(120))),
            "{quoted}"
        );
        assert!(quoted.ends_with("…\" (50000 characters)"), "{quoted}");
        assert_eq!(shorten("x"), "x");
        assert!(shorten(&long).ends_with("… (50000 characters)"));
    }
}
