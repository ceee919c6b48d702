//! A fleet's waves judged against each other (pure): each wave's models at
//! REV, as `verify` summarized them wave by wave, with each wave's models
//! at BASE and, when given, each cluster's status. The shell
//! (`super::verify`) reads the waves, the files and the statuses.

use std::collections::HashMap;

use super::rules::{self, ResourceSummary, rule};
use crate::findings::Finding;
use crate::fleet::Wave;
use crate::source::Location;
use crate::source::edit::{Action, Edit};

/// The waves against each other. A change that moves a wave's model (or
/// adds it) to a version the wave before it does not ask for runs that
/// wave ahead: a version reaches a wave only after the waves before it,
/// and Flux applies one commit that bumps them all wave by wave. A wave
/// that stays where it was while the one before moves on lags, which is
/// how every bump begins. The fix takes the version of the wave before.
/// `before` holds each wave's versions at BASE.
pub fn ahead(
    waves: &[(Wave, Vec<ResourceSummary>)],
    before: &[HashMap<String, String>],
) -> Vec<Finding> {
    let mut findings = Vec::new();
    for (i, pair) in waves.windows(2).enumerate() {
        let [(previous, earlier), (wave, later)] = pair else {
            continue;
        };
        for model in later {
            let Some(prior) = earlier.iter().find(|m| m.resource == model.resource) else {
                continue;
            };
            let (Some(version), Some(asked)) = (&model.version, &prior.version) else {
                continue;
            };
            let moved = before
                .get(i + 1)
                .and_then(|b| b.get(&model.resource))
                .is_none_or(|was| was != version);
            if version == asked || !moved {
                continue;
            }
            let before = previous;
            findings.push(set_back(
                model,
                rule::WAVE_AHEAD,
                format!(
                    "wave {} asks for {version}, and wave {} before it asks for {asked}: a version reaches a wave only after the waves before it; bump {} too (one commit may bump every wave, and Flux applies it wave by wave) or keep {} on {asked}",
                    wave.name, before.name, before.path, wave.path
                ),
                asked,
            ));
        }
    }
    findings
}

/// After an automatic rollback in one wave (its `--status`), every later
/// wave whose folder still asks for the version that failed: once the
/// rolled-back wave's folder is set back (`GitBehindRollback`) and that
/// wave is Ready again, Flux would apply the failed version to the next.
/// The fix is the version the cluster restored, so one `verify --fix`
/// brings every folder back in step.
pub fn behind_rollback(
    waves: &[(Wave, Vec<ResourceSummary>)],
    clusters: &[Option<rules::ClusterStatus>],
) -> Vec<Finding> {
    let mut findings = Vec::new();
    for (i, cluster) in clusters.iter().enumerate() {
        let Some(cluster) = cluster else {
            continue;
        };
        let (failed_wave, _) = &waves[i];
        for (key, status) in cluster {
            let automatic = status
                .rollback_request
                .as_deref()
                .is_some_and(|r| r.starts_with("automatic:"));
            if status.phase != Some(crate::api::Phase::RolledBack) || !automatic {
                continue;
            }
            let (Some(failed), Some(restored)) = (
                status.desired_version.as_deref(),
                status
                    .rollback_spec
                    .as_ref()
                    .or(status.last_successful_spec.as_ref())
                    .map(|s| s.version.as_str())
                    .or(status.active_version.as_deref()),
            ) else {
                continue;
            };
            let resource = format!("{}/{}", key.namespace, key.name);
            for (wave, models) in &waves[i + 1..] {
                for model in models {
                    if model.resource != resource || model.version.as_deref() != Some(failed) {
                        continue;
                    }
                    findings.push(set_back(
                        model,
                        rule::WAVE_BEHIND_ROLLBACK,
                        format!(
                            "wave {} asks for {failed}, which rolled back in wave {} (the cluster restored {restored}): once {} is set back and that wave is Ready, Flux would apply {failed} here; set it back too",
                            wave.name, failed_wave.name, failed_wave.path
                        ),
                        restored,
                    ));
                }
            }
        }
    }
    findings
}

/// An error at `model`'s `spec.version` whose fix sets it to `version`.
fn set_back(
    model: &ResourceSummary,
    rule: &'static str,
    message: String,
    version: &str,
) -> Finding {
    let location = Location {
        origin: model.location.file.as_str().into(),
        document: model.location.document.saturating_sub(1),
        line: model.location.line,
    };
    Finding::error(&location, rule, message)
        .resource(model.resource.clone())
        .field("spec.version")
        .fix(format!("version: {version}"))
        .edit(Edit {
            document: location.document,
            path: vec!["spec".into(), "version".into()],
            action: Action::Set(version.to_owned()),
        })
}
