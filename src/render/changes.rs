//! What a change does, resource by resource (pure): the summary rows of a
//! render of the inputs at a Git revision (BASE) beside those of a render
//! of the inputs now, compared on what the operator writes: the version
//! pointer, its ConfigMaps, the two variables of the target container and
//! the pod-template hash, which decides whether the pods roll, and the
//! model's own HorizontalPodAutoscaler.
//! `render --base REV` prints it, wave by wave in a fleet (docs/fleet.md).

use std::fmt::Write as _;

use serde::Serialize;

use super::SummaryRow;

/// What happens to one OpenMedModel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Change {
    /// `<namespace>/<name>`.
    pub resource: String,
    /// `<deployment>/<container>`, now (at BASE for a removed resource).
    pub target: String,
    pub what: What,
    /// Whether the target's pods roll: its pod-template hash changes.
    pub rolls: bool,
    /// The fields that differ, in a fixed order; every field for a new
    /// or removed resource.
    pub fields: Vec<Field>,
}

/// How a resource differs between BASE and now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum What {
    /// New since BASE: the operator adopts its Deployment.
    Added,
    /// Gone since BASE: the operator releases its Deployment.
    Removed,
    /// Something it writes differs.
    Changed,
    /// It writes the same.
    Unchanged,
}

/// One field the operator writes, before and after; `None` where absent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Field {
    pub name: &'static str,
    pub before: Option<String>,
    pub after: Option<String>,
}

/// How a field is read off a row.
type Read = fn(&SummaryRow) -> Option<String>;

/// The fields compared, with how each is read off a row.
const FIELDS: [(&str, Read); 7] = [
    ("version", |r| Some(r.version.clone())),
    ("ConfigMap", |r| Some(r.config_map.clone())),
    ("snapshot ConfigMap", |r| r.snapshot.clone()),
    ("OPENMED_SERVICE_PRELOAD_MODELS", |r| r.preload.clone()),
    ("OPENMED_SERVICE_SERVED_MODELS", |r| r.served.clone()),
    ("pod-template hash", |r| Some(r.pod_template_hash.clone())),
    ("HorizontalPodAutoscaler", |r| r.autoscaler.clone()),
];

/// Each resource of `before` and `after`, in `after`'s order, then those
/// only in `before`.
pub fn between(before: &[SummaryRow], after: &[SummaryRow]) -> Vec<Change> {
    let find = |rows: &'_ [SummaryRow], resource: &str| -> Option<usize> {
        rows.iter().position(|r| r.resource == resource)
    };
    let mut changes: Vec<Change> = after
        .iter()
        .map(|now| compare(find(before, &now.resource).map(|i| &before[i]), Some(now)))
        .collect();
    changes.extend(
        before
            .iter()
            .filter(|was| find(after, &was.resource).is_none())
            .map(|was| compare(Some(was), None)),
    );
    changes
}

fn compare(before: Option<&SummaryRow>, after: Option<&SummaryRow>) -> Change {
    let row = after.or(before).expect("a resource on one side at least");
    let fields: Vec<Field> = FIELDS
        .iter()
        .map(|(name, read)| Field {
            name,
            before: before.and_then(read),
            after: after.and_then(read),
        })
        .filter(|f| f.before != f.after)
        .collect();
    let what = match (before, after) {
        (None, _) => What::Added,
        (_, None) => What::Removed,
        _ if fields.is_empty() => What::Unchanged,
        _ => What::Changed,
    };
    Change {
        resource: row.resource.clone(),
        target: row.target.clone(),
        what,
        rolls: before.map(|r| &r.pod_template_hash) != after.map(|r| &r.pod_template_hash),
        fields,
    }
}

/// The changes for a person: one line per resource, then one per field
/// that differs, `before -> after` (`-` where absent).
pub fn text(changes: &[Change]) -> String {
    let mut out = String::new();
    if changes.is_empty() {
        out.push_str("no OpenMedModel\n");
    }
    let width = FIELDS.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
    for change in changes {
        let what = match (change.what, change.rolls) {
            (What::Added, _) => "added: the operator adopts the Deployment, and its pods roll",
            (What::Removed, _) => {
                "removed: the operator releases the Deployment, and its pods roll without a preloaded model"
            }
            (What::Changed, true) => "changed: the pods roll",
            (What::Changed, false) => "changed: no pod rolls",
            (What::Unchanged, _) => "unchanged",
        };
        let _ = writeln!(out, "{} ({}): {what}", change.resource, change.target);
        for field in &change.fields {
            let side = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
            let _ = writeln!(
                out,
                "  {:<width$}  {} -> {}",
                field.name,
                side(&field.before),
                side(&field.after)
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(resource: &str, version: &str, hash: &str) -> SummaryRow {
        SummaryRow {
            resource: resource.into(),
            target: "svc/openmed".into(),
            version: version.into(),
            config_map: "svc-model-manifest".into(),
            pod_template_hash: hash.into(),
            output: "full",
            snapshot: Some(format!("svc-model-manifest-{hash}")),
            preload: Some(version.into()),
            served: Some(format!("{version},x")),
            autoscaler: None,
        }
    }

    #[test]
    fn a_bump_lists_each_field_that_moves_and_says_the_pods_roll() {
        let changes = between(&[row("ns/a", "v1", "h1")], &[row("ns/a", "v2", "h2")]);
        assert_eq!(changes.len(), 1);
        let c = &changes[0];
        assert_eq!((c.what, c.rolls), (What::Changed, true));
        let names: Vec<&str> = c.fields.iter().map(|f| f.name).collect();
        assert_eq!(
            names,
            [
                "version",
                "snapshot ConfigMap",
                "OPENMED_SERVICE_PRELOAD_MODELS",
                "OPENMED_SERVICE_SERVED_MODELS",
                "pod-template hash"
            ],
            "the pointer ConfigMap keeps its name"
        );
        let text = text(&changes);
        assert!(
            text.starts_with("ns/a (svc/openmed): changed: the pods roll\n  version "),
            "{text}"
        );
        assert!(
            text.contains("  pod-template hash               h1 -> h2\n"),
            "{text}"
        );
    }

    #[test]
    fn added_removed_and_unchanged_resources_each_say_so() {
        let changes = between(
            &[row("ns/same", "v1", "h"), row("ns/gone", "v1", "g")],
            &[row("ns/new", "v1", "n"), row("ns/same", "v1", "h")],
        );
        let whats: Vec<(&str, What, bool)> = changes
            .iter()
            .map(|c| (c.resource.as_str(), c.what, c.rolls))
            .collect();
        assert_eq!(
            whats,
            [
                ("ns/new", What::Added, true),
                ("ns/same", What::Unchanged, false),
                ("ns/gone", What::Removed, true)
            ]
        );
        assert!(changes[1].fields.is_empty());
        // Every field it writes is new: all but the autoscaler, which it
        // does not ask for.
        assert_eq!(changes[0].fields.len(), FIELDS.len() - 1);
        assert!(changes[0].fields.iter().all(|f| f.before.is_none()));
        let text = text(&changes);
        assert!(
            text.contains("ns/same (svc/openmed): unchanged\n"),
            "{text}"
        );
        assert!(
            text.contains("  version                         - -> v1\n"),
            "{text}"
        );
        assert_eq!(super::text(&[]), "no OpenMedModel\n");
    }

    #[test]
    fn an_edit_that_keeps_the_template_rolls_nothing() {
        let mut after = row("ns/a", "v1", "h");
        after.config_map = "renamed".into();
        let changes = between(&[row("ns/a", "v1", "h")], &[after]);
        assert_eq!((changes[0].what, changes[0].rolls), (What::Changed, false));
        assert!(text(&changes).contains("changed: no pod rolls"));
    }

    #[test]
    fn autoscaling_added_is_one_field_and_rolls_nothing() {
        let mut after = row("ns/a", "v1", "h");
        after.autoscaler = Some("a: 2 to 10 pods".into());
        let changes = between(&[row("ns/a", "v1", "h")], &[after]);
        assert_eq!((changes[0].what, changes[0].rolls), (What::Changed, false));
        let names: Vec<&str> = changes[0].fields.iter().map(|f| f.name).collect();
        assert_eq!(names, ["HorizontalPodAutoscaler"]);
        assert!(
            text(&changes).contains("2 to 10 pods"),
            "{}",
            text(&changes)
        );
    }
}
