//! The three layouts of a [`Report`]: text for people, JSON for programs,
//! GitHub workflow commands for pull requests.
//!
//! Each is a pure function from the report to the whole output, so the CLI
//! writes it in one piece. The JSON schema is documented in `docs/verify.md`
//! and versioned by `schemaVersion`; fields are only ever added to it.

use std::fmt::Write as _;

use serde::Serialize;

use super::Report;
use super::rules::ResourceSummary;
use crate::findings::{Finding, Severity};

/// Version of the JSON layout; raised only for an incompatible change.
pub const SCHEMA_VERSION: u32 = 1;

/// Findings grouped by file (a blank line between files), errors before
/// warnings, with line numbers; then the notes and a one-line summary.
pub fn text(report: &Report) -> String {
    let mut out = String::new();
    let mut previous: Option<&str> = None;
    for finding in &report.findings {
        let file = finding.location.file.as_str();
        if previous.is_some_and(|p| p != file) {
            out.push('\n');
        }
        previous = Some(file);
        let _ = writeln!(out, "{finding}");
    }
    if !report.findings.is_empty() {
        out.push('\n');
    }
    for note in &report.notes {
        let _ = writeln!(out, "note: {note}");
    }
    out.push_str(&summary(report));
    out.push('\n');
    out
}

/// `openmed-op verify: 1 error, 2 warnings in 1 file; 3 OpenMedModels at REV … checked against BASE …`
pub fn summary(report: &Report) -> String {
    let errors = report.count(Severity::Error);
    let warnings = report.count(Severity::Warning);
    let mut files: Vec<&str> = report
        .findings
        .iter()
        .map(|f| f.location.file.as_str())
        .collect();
    files.dedup();
    let problems = if errors + warnings == 0 {
        "no problems".to_owned()
    } else {
        format!(
            "{}, {} in {}",
            plural(errors, "error"),
            plural(warnings, "warning"),
            plural(files.len(), "file")
        )
    };
    let against = match &report.base {
        Some(base) => format!("checked against BASE {}", short(base)),
        None => "checked without a BASE".to_owned(),
    };
    format!(
        "openmed-op verify: {problems}; {} at REV {} {against}",
        plural(report.resources.len(), "OpenMedModel"),
        short(&report.rev),
    )
}

/// The JSON document (see `docs/verify.md`).
pub fn json(report: &Report) -> String {
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Summary {
        errors: usize,
        warnings: usize,
        resources: usize,
        history_commits: usize,
    }
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Document<'a> {
        schema_version: u32,
        base: Option<&'a str>,
        rev: &'a str,
        summary: Summary,
        resources: &'a [ResourceSummary],
        findings: &'a [Finding],
        notes: &'a [String],
    }
    let document = Document {
        schema_version: SCHEMA_VERSION,
        base: report.base.as_deref(),
        rev: &report.rev,
        summary: Summary {
            errors: report.count(Severity::Error),
            warnings: report.count(Severity::Warning),
            resources: report.resources.len(),
            history_commits: report.history_commits,
        },
        resources: &report.resources,
        findings: &report.findings,
        notes: &report.notes,
    };
    let mut out = serde_json::to_string_pretty(&document).expect("a report serializes");
    out.push('\n');
    out
}

/// GitHub Actions workflow commands: one `::error`/`::warning` annotation
/// per finding, shown on the pull request's diff; `::notice` per note; then
/// the summary as a plain log line.
pub fn github(report: &Report) -> String {
    let mut out = String::new();
    for f in &report.findings {
        let level = match f.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        let mut properties = format!("file={}", property(&f.location.file));
        if let Some(line) = f.location.line {
            let _ = write!(properties, ",line={line}");
        }
        let _ = write!(properties, ",title={}", property(f.rule));
        let mut message = String::new();
        if let Some(resource) = &f.resource {
            let _ = write!(message, "{resource}: ");
        }
        if let Some(field) = &f.field {
            let _ = write!(message, "{field}: ");
        }
        message.push_str(&f.message);
        if let Some(fix) = &f.fix {
            let _ = write!(message, "\nfix: {fix}");
        }
        let _ = writeln!(out, "::{level} {properties}::{}", data(&message));
    }
    for note in &report.notes {
        let _ = writeln!(
            out,
            "::notice title={}::{}",
            property("openmed-op verify"),
            data(note)
        );
    }
    out.push_str(&summary(report));
    out.push('\n');
    out
}

/// Escapes a workflow command's message, as GitHub's toolkit does.
pub fn data(text: &str) -> String {
    text.replace('%', "%25")
        .replace('\r', "%0D")
        .replace('\n', "%0A")
}

/// Escapes a workflow command's property value (`file=`, `title=`).
pub fn property(text: &str) -> String {
    data(text).replace(':', "%3A").replace(',', "%2C")
}

fn short(id: &str) -> &str {
    if id.len() == 40 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
        &id[..12]
    } else {
        id
    }
}

fn plural(n: usize, word: &str) -> String {
    format!("{n} {word}{}", if n == 1 { "" } else { "s" })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workflow_commands_escape_as_github_requires() {
        assert_eq!(data("50% done\r\nnext"), "50%25 done%0D%0Anext");
        assert_eq!(property("a:b,c%"), "a%3Ab%2Cc%25");
    }

    #[test]
    fn commit_ids_are_shortened_in_text() {
        let id = "0123456789abcdef0123456789abcdef01234567";
        assert_eq!(short(id), "0123456789ab");
        assert_eq!(short("worktree"), "worktree");
    }
}
