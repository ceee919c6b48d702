//! The wave rules with each cluster's own, on generated fleets: their
//! histories, the clusters' statuses and a change. `verify --fix` applies
//! every finding's edit, in a pull request (REV against its BASE) and on
//! the default branch once REV has landed (the files against REV); the
//! fixed files are then judged again against the same BASE, as the commit
//! the fix makes is. One `--fix` must leave nothing for a second one to
//! change, its edits must never collide, and when every error had a fix
//! the fixed files pass.

use std::collections::{BTreeSet, HashMap};

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use serde_json::{Value, json};

use super::{Before, Member, judge};
use crate::api::OpenMedModelStatus;
use crate::findings::{Finding, Severity};
use crate::fleet::{Cluster, Wave};
use crate::source::{Document, edit, parse_stream};
use crate::verify::rules::{self, ClusterStatus, HistoryVersions, ResourceKey};

const VERSIONS: [&str; 4] = ["v1", "v2", "v3", "v4"];

fn key() -> ResourceKey {
    ResourceKey {
        namespace: "team".into(),
        name: "svc".into(),
    }
}

/// The file of `svc` in a cluster's folder, asking for `version`.
fn model(version: &str) -> String {
    format!(
        "apiVersion: openmed.ai/v1alpha1\nkind: OpenMedModel\nmetadata:\n  name: svc\n  namespace: team\nspec:\n  family: pii\n  tier: Small\n  version: {version}\n"
    )
}

fn file_of(cluster: &Cluster) -> String {
    format!("{}/svc.yaml", cluster.path)
}

fn parse(path: &str, text: &str) -> Vec<Document> {
    parse_stream(path, text).unwrap_or_else(|e| panic!("{path}: {e}\n{text}"))
}

/// The hash the operator gives `svc` at `version`.
fn hash(version: &str) -> String {
    let doc = &parse("svc.yaml", &model(version))[0];
    let spec = crate::api::validate(&doc.value, None).unwrap();
    crate::plan::spec_hash(&crate::plan::normalize("svc", &spec))
}

/// A cluster's status of `svc`, as the operator leaves it.
#[derive(Debug, Clone)]
enum Status {
    /// Ready at `version`; soaked (it then retains it and `previous`) or
    /// still soaking (it retains `previous`). `failed_before`: a spec that
    /// failed there once (`failedSpecHash` stays).
    Ready {
        version: usize,
        previous: usize,
        soaked: bool,
        failed_before: Option<usize>,
    },
    /// `failed` rolled back automatically to `restored`.
    RolledBack {
        failed: usize,
        restored: usize,
        previous: usize,
    },
    /// `failed` failed with rollbacks off; `active` still serves.
    Failed { failed: usize, active: usize },
    /// The cluster has no such model.
    Absent,
}

fn spec(version: usize) -> Value {
    json!({"family": "pii", "tier": "Small", "version": VERSIONS[version]})
}

fn condition(status: &str, reason: &str) -> Value {
    json!([{"type": "Soaked", "status": status, "reason": reason, "message": reason,
        "lastTransitionTime": "2026-12-06T07:00:00Z"}])
}

impl Status {
    fn cluster(&self) -> ClusterStatus {
        let status = match *self {
            Status::Absent => return ClusterStatus::new(),
            Status::Ready {
                version,
                previous,
                soaked,
                failed_before,
            } => {
                let mut soak = json!({"version": VERSIONS[version], "specHash": "x",
                    "startTime": "2026-12-06T06:50:00Z", "endTime": "2026-12-06T07:00:00Z"});
                let mut status = json!({"phase": "Ready",
                    "desiredVersion": VERSIONS[version], "activeVersion": VERSIONS[version]});
                if soaked {
                    soak["soakedTime"] = json!("2026-12-06T07:00:00Z");
                    status["lastSuccessfulSpec"] = spec(version);
                    if previous != version {
                        status["previousSuccessfulSpec"] = spec(previous);
                    }
                    status["conditions"] = condition("True", "Soaked");
                } else {
                    status["lastSuccessfulSpec"] = spec(previous);
                    status["conditions"] = condition("False", "Soaking");
                }
                status["soak"] = soak;
                if let Some(failed) = failed_before {
                    status["failedSpecHash"] = json!(hash(VERSIONS[failed]));
                }
                status
            }
            Status::RolledBack {
                failed,
                restored,
                previous,
            } => {
                let mut status = json!({"phase": "RolledBack",
                    "desiredVersion": VERSIONS[failed], "activeVersion": VERSIONS[restored],
                    "lastSuccessfulSpec": spec(restored), "rollbackSpec": spec(restored),
                    "rollbackRequest": format!("automatic:{}", VERSIONS[restored]),
                    "failedSpecHash": hash(VERSIONS[failed]),
                    "conditions": condition("False", "RolledBack")});
                if previous != restored {
                    status["previousSuccessfulSpec"] = spec(previous);
                }
                status
            }
            Status::Failed { failed, active } => json!({"phase": "Failed",
                "desiredVersion": VERSIONS[failed], "activeVersion": VERSIONS[active],
                "lastSuccessfulSpec": spec(active), "failedSpecHash": hash(VERSIONS[failed]),
                "conditions": condition("False", "RolloutFailed")}),
        };
        let status: OpenMedModelStatus = serde_json::from_value(status).unwrap();
        ClusterStatus::from([(key(), status)])
    }
}

/// A fleet, its history on the default branch, a change and the
/// clusters' statuses; clusters in the fleet's order.
#[derive(Debug, Clone)]
struct Case {
    /// Clusters per wave.
    waves: Vec<usize>,
    /// Each cluster's versions on the default branch, oldest first, the
    /// last at BASE; empty when the model is not there at BASE.
    history: Vec<Vec<usize>>,
    /// Each cluster's version at REV; `None` keeps BASE's (`v1` when there
    /// is none).
    change: Vec<Option<usize>>,
    /// Each cluster's status, with `--status`.
    statuses: Option<Vec<Status>>,
    /// REV is the repository's first commit.
    first_commit: bool,
}

fn status() -> impl Strategy<Value = Status> {
    prop_oneof![
        (
            0..4usize,
            0..4usize,
            any::<bool>(),
            prop::option::of(0..4usize)
        )
            .prop_map(|(version, previous, soaked, failed_before)| Status::Ready {
                version,
                previous,
                soaked,
                failed_before: failed_before.filter(|f| *f != version),
            }),
        (0..4usize, 0..4usize, 0..4usize)
            .prop_filter("a rollback restores another version", |(f, r, _)| f != r)
            .prop_map(|(failed, restored, previous)| Status::RolledBack {
                failed,
                restored,
                previous,
            }),
        (0..4usize, 0..4usize)
            .prop_filter(
                "the version that failed is not the one serving",
                |(f, a)| f != a
            )
            .prop_map(|(failed, active)| Status::Failed { failed, active }),
        Just(Status::Absent),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    prop::collection::vec(1..=3usize, 1..=3)
        .prop_flat_map(|waves| {
            let n: usize = waves.iter().sum();
            (
                Just(waves),
                prop::collection::vec(prop::collection::vec(0..4usize, 0..=3), n),
                prop::collection::vec(prop::option::weighted(0.5, 0..4usize), n),
                prop::option::weighted(0.7, prop::collection::vec(status(), n)),
                prop::bool::weighted(0.1),
            )
        })
        .prop_map(|(waves, history, change, statuses, first_commit)| Case {
            waves,
            history,
            change,
            statuses,
            first_commit,
        })
}

/// What `verify` is given: the tree at REV and what came before.
struct Tree {
    /// Each cluster's file at REV.
    rev: Vec<String>,
    /// Each cluster's version at BASE (`None`: not there); `None` without
    /// a BASE.
    base: Option<Vec<Option<String>>>,
    /// Each cluster's distinct versions on BASE's first-parent history,
    /// most recent first, at most two.
    history: Vec<Vec<String>>,
}

fn waves_of(case: &Case) -> Vec<Wave> {
    case.waves
        .iter()
        .enumerate()
        .map(|(w, &clusters)| {
            let names: Vec<String> = if clusters == 1 {
                vec![format!("wave-{w}")]
            } else {
                (0..clusters).map(|c| format!("wave-{w}-{c}")).collect()
            };
            Wave {
                name: format!("wave-{w}"),
                clusters: names
                    .into_iter()
                    .map(|name| Cluster {
                        path: format!("clusters/{name}"),
                        name,
                    })
                    .collect(),
            }
        })
        .collect()
}

/// The last two distinct versions of `versions`, most recent first.
fn retained(versions: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for v in versions.iter().rev() {
        if !out.contains(v) && out.len() < 2 {
            out.push(v.clone());
        }
    }
    out
}

/// `verify` of a fleet, as the shell runs it: each cluster's own rules,
/// then the waves against each other.
fn verify(waves: &[Wave], tree: &Tree, statuses: Option<&[ClusterStatus]>) -> Vec<Finding> {
    let mut findings = Vec::new();
    let mut members = Vec::new();
    for (i, (index, wave, cluster)) in crate::fleet::clusters(waves).enumerate() {
        let file = file_of(cluster);
        let rev = parse(&file, &tree.rev[i]);
        let base = tree.base.as_ref().map(|base| match &base[i] {
            Some(version) => parse(&file, &model(version)),
            None => Vec::new(),
        });
        let history: HistoryVersions = HashMap::from([(key(), tree.history[i].clone())]);
        let status = statuses.map(|s| &s[i]);
        let outcome = rules::check(&rules::Input {
            rev: &rev,
            base: base.as_deref(),
            history: &history,
            status,
            default_namespace: "default",
            strict: false,
        });
        findings.extend(outcome.findings);
        members.push(Member {
            index,
            wave,
            cluster,
            models: outcome.resources,
            before: match &tree.base {
                None => Before::FirstCommit,
                Some(base) => Before::Base(
                    base[i]
                        .iter()
                        .map(|v| ("team/svc".to_owned(), v.clone()))
                        .collect(),
                ),
            },
            status: status.cloned(),
        });
    }
    let across = judge(&members, &findings);
    findings.extend(across);
    findings
}

/// The files after `--fix`: every finding's edit, each file's edits at
/// once; an edit that cannot be made (two that collide) is an error.
fn fix(waves: &[Wave], rev: &[String], findings: &[Finding]) -> Result<Vec<String>, String> {
    crate::fleet::clusters(waves)
        .zip(rev)
        .map(|((_, _, cluster), text)| {
            let file = file_of(cluster);
            let mut edits: Vec<edit::Edit> = Vec::new();
            for f in findings.iter().filter(|f| f.location.file == file) {
                if let Some(e) = &f.edit
                    && !edits.contains(e)
                {
                    edits.push(e.clone());
                }
            }
            edit::apply(text, &edits).map_err(|e| format!("{file}: {e}"))
        })
        .collect()
}

fn errors(findings: &[Finding]) -> Vec<&Finding> {
    findings
        .iter()
        .filter(|f| f.severity == Severity::Error)
        .collect()
}

fn said(findings: &[Finding]) -> String {
    findings
        .iter()
        .map(|f| {
            format!(
                "  {}: {}[{}] {} (fix: {})\n",
                f.location.file,
                if f.severity == Severity::Error {
                    "error"
                } else {
                    "warning"
                },
                f.rule,
                f.message,
                f.fix.as_deref().unwrap_or("-")
            )
        })
        .collect()
}

/// `--fix` on `tree`, then `verify` of the fixed files against the same
/// BASE: nothing left for a second `--fix`, and no error but those `--fix`
/// could not touch (a retry that needs its reason, the clusters of a wave
/// that both moved); when every error had a fix, none.
fn fix_then_verify(
    waves: &[Wave],
    tree: &Tree,
    statuses: Option<&[ClusterStatus]>,
) -> Result<(), String> {
    let before = verify(waves, tree, statuses);
    let fixed = fix(waves, &tree.rev, &before)
        .map_err(|e| format!("--fix cannot apply its edits: {e}\n{}", said(&before)))?;
    let unfixable: BTreeSet<(String, &str)> = errors(&before)
        .into_iter()
        .filter(|f| f.edit.is_none())
        .map(|f| (f.location.file.clone(), f.rule))
        .collect();
    let after = verify(
        waves,
        &Tree {
            rev: fixed,
            base: tree.base.clone(),
            history: tree.history.clone(),
        },
        statuses,
    );
    let edits: Vec<Finding> = after.iter().filter(|f| f.edit.is_some()).cloned().collect();
    if !edits.is_empty() {
        return Err(format!(
            "a second --fix would change more:\n{}\nthe first --fix was for:\n{}",
            said(&edits),
            said(&before)
        ));
    }
    let left = errors(&after)
        .into_iter()
        .any(|f| !unfixable.contains(&(f.location.file.clone(), f.rule)));
    if left {
        return Err(format!(
            "after --fix:\n{}\nthe first --fix was for:\n{}",
            said(&after),
            said(&before)
        ));
    }
    Ok(())
}

/// The property, for one case: `--fix` in the pull request (REV against
/// BASE), and on the default branch once REV has landed there (the files
/// on disk against REV itself, as `--fix` reads them there: after a
/// cluster rolled back, say).
fn one_fix_is_enough(case: &Case) -> Result<(), String> {
    let waves = waves_of(case);
    let versions = |c: usize| -> Vec<String> {
        case.history[c]
            .iter()
            .map(|&v| VERSIONS[v].to_owned())
            .collect()
    };
    let n = case.history.len();
    let at_base: Vec<Option<String>> = (0..n).map(|c| versions(c).last().cloned()).collect();
    let at_rev: Vec<String> = (0..n)
        .map(|c| match case.change[c] {
            Some(v) => VERSIONS[v].to_owned(),
            None => at_base[c].clone().unwrap_or_else(|| VERSIONS[0].to_owned()),
        })
        .collect();
    let statuses: Option<Vec<ClusterStatus>> = case
        .statuses
        .as_ref()
        .map(|s| s.iter().map(Status::cluster).collect());
    let statuses = statuses.as_deref();
    let rev: Vec<String> = at_rev.iter().map(|v| model(v)).collect();
    let pull_request = Tree {
        rev: rev.clone(),
        base: (!case.first_commit).then(|| at_base.clone()),
        history: if case.first_commit {
            vec![Vec::new(); n]
        } else {
            (0..n).map(|c| retained(&versions(c))).collect()
        },
    };
    fix_then_verify(&waves, &pull_request, statuses)
        .map_err(|e| format!("in the pull request: {e}"))?;
    let landed = Tree {
        rev,
        base: Some(at_rev.iter().cloned().map(Some).collect()),
        history: (0..n)
            .map(|c| {
                let mut all = if case.first_commit {
                    Vec::new()
                } else {
                    versions(c)
                };
                all.push(at_rev[c].clone());
                retained(&all)
            })
            .collect(),
    };
    fix_then_verify(&waves, &landed, statuses).map_err(|e| format!("once landed: {e}"))
}

proptest! {
    #![proptest_config(Config {
        cases: 300,
        rng_seed: RngSeed::Fixed(0x0BE7_5A7E),
        failure_persistence: None,
        ..Config::default()
    })]

    #[test]
    fn one_fix_leaves_nothing_for_a_second_and_the_fixed_tree_passes(case in case()) {
        if let Err(e) = one_fix_is_enough(&case) {
            return Err(TestCaseError::fail(format!("{case:#?}\n{e}")));
        }
    }
}

/// Staging soaked v2, hospital A (the wave after) rolled v2 back to v1,
/// hospital B never got it. `--fix` on the default branch sets both
/// hospitals back to v1, and the commit that makes passes, with the
/// statuses and without: going back to v1, which hospital A restored and
/// staging asked for before, is not running ahead.
#[test]
fn after_a_rollback_in_a_later_wave_one_fix_is_enough() {
    let case = Case {
        waves: vec![1, 1, 1],
        history: vec![vec![0, 1], vec![0, 1], vec![0, 1]],
        change: vec![None, None, None],
        statuses: Some(vec![
            Status::Ready {
                version: 1,
                previous: 0,
                soaked: true,
                failed_before: None,
            },
            Status::RolledBack {
                failed: 1,
                restored: 0,
                previous: 0,
            },
            Status::Ready {
                version: 0,
                previous: 0,
                soaked: true,
                failed_before: None,
            },
        ]),
        first_commit: false,
    };
    one_fix_is_enough(&case).unwrap();
    let fixed = Case {
        change: vec![None, Some(0), Some(0)],
        ..case
    };
    one_fix_is_enough(&fixed).unwrap();
    one_fix_is_enough(&Case {
        statuses: None,
        ..fixed
    })
    .unwrap();
}
