//! Findings: what `render` and `verify` report about their input.
//!
//! A finding says where (file, document, line), which resource, which rule,
//! how bad, what is wrong, and, when there is one, the exact fix. Every
//! output format (text, JSON, GitHub annotations, KRM results) is built from
//! this one shape.

use std::fmt;

use serde::Serialize;

use crate::source::Location;
use crate::source::edit::Edit;

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The change must not merge / the input must not be applied (exit 1).
    Error,
    /// Worth a look; an error under `--strict`.
    Warning,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
        })
    }
}

/// One problem found in the input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// File, document and line.
    #[serde(flatten)]
    pub location: LocationJson,
    /// `<namespace>/<name>` of the OpenMedModel (or the object) concerned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    /// Stable rule id, e.g. `InvalidSpec`, `TargetConflict`.
    pub rule: &'static str,
    /// Error or warning.
    pub severity: Severity,
    /// Field path within the document, e.g. `spec.rolloutStrategy.maxSurge`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// What is wrong, for a person.
    pub message: String,
    /// The change that fixes it, when there is an exact one.
    #[serde(rename = "suggestedFix", skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
    /// The same fix as an edit `verify --fix` can apply, when it is exact
    /// and its intent is clear.
    #[serde(skip)]
    pub edit: Option<Edit>,
}

/// The serialized form of a [`Location`]: `file`, `document` (1-based), `line`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LocationJson {
    /// Path as given, or `<stdin>`.
    pub file: String,
    /// 1-based document index in the file.
    pub document: usize,
    /// 1-based line, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<usize>,
}

impl From<&Location> for LocationJson {
    fn from(l: &Location) -> Self {
        LocationJson {
            file: l.origin.to_string(),
            document: l.document + 1,
            line: l.line,
        }
    }
}

/// Longest message, field, resource or fix a finding carries: a hostile
/// input must not turn into megabytes of stderr or annotations.
const TEXT_LIMIT: usize = 4096;

/// `text`, cut at [`TEXT_LIMIT`] characters with a note of its length.
pub fn bounded(text: String) -> String {
    let length = text.chars().count();
    if length <= TEXT_LIMIT {
        return text;
    }
    let start: String = text.chars().take(TEXT_LIMIT).collect();
    format!("{start}… (cut; {length} characters in all)")
}

impl Finding {
    /// An error at `location`.
    pub fn error(location: &Location, rule: &'static str, message: impl Into<String>) -> Self {
        let mut location: LocationJson = location.into();
        location.file = bounded(location.file);
        Finding {
            location,
            resource: None,
            rule,
            severity: Severity::Error,
            field: None,
            message: bounded(message.into()),
            fix: None,
            edit: None,
        }
    }

    /// A warning at `location`.
    pub fn warning(location: &Location, rule: &'static str, message: impl Into<String>) -> Self {
        Finding {
            severity: Severity::Warning,
            ..Finding::error(location, rule, message)
        }
    }

    /// The same finding, about `resource`.
    pub fn resource(mut self, resource: impl Into<String>) -> Self {
        self.resource = Some(bounded(resource.into()));
        self
    }

    /// The same finding, about `field`.
    pub fn field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(bounded(field.into()));
        self
    }

    /// The same finding, with a suggested fix.
    pub fn fix(mut self, fix: impl Into<String>) -> Self {
        self.fix = Some(bounded(fix.into()));
        self
    }

    /// The same finding, with the fix as an edit of its document.
    pub fn edit(mut self, edit: Edit) -> Self {
        self.edit = Some(edit);
        self
    }
}

impl fmt::Display for Finding {
    /// `file:line: document N: severity[Rule]: ns/name: field: message`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let l = &self.location;
        match l.line {
            Some(line) => write!(f, "{}:{line}: document {}: ", l.file, l.document)?,
            None => write!(f, "{}: document {}: ", l.file, l.document)?,
        }
        write!(f, "{}[{}]: ", self.severity, self.rule)?;
        if let Some(resource) = &self.resource {
            write!(f, "{resource}: ")?;
        }
        if let Some(field) = &self.field {
            write!(f, "{field}: ")?;
        }
        f.write_str(&self.message)?;
        if let Some(fix) = &self.fix {
            write!(f, "\n  fix: {fix}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_messages_are_cut_and_say_how_long_they_were() {
        let message = bounded("b".repeat(10_000));
        assert!(message.len() < 4200 && message.ends_with("(cut; 10000 characters in all)"));
    }
}
