//! A fleet's waves judged against each other (pure): each cluster's
//! models at REV, as `verify` summarized them cluster by cluster, with its
//! models before the change and, when given, its status. The shell
//! (`super::verify`) reads the waves, the files, BASE and the statuses.
//!
//! Four rules, each a field a change must not leave as it is:
//! - `WaveAhead`: a version reaches a wave only after the wave before asks
//!   for it;
//! - `WaveNotSoaked`: a wave promoted on its own moves only to a version
//!   every cluster of the wave before has soaked (their statuses);
//! - `WaveDisagrees`: the clusters of one wave, applied together, ask for
//!   the same version;
//! - `WaveBehindRollback`: no later wave keeps asking for a version that
//!   rolled back in an earlier one.
//!
//! The first three judge what a change moved ([`Before`]).

use std::collections::{HashMap, HashSet};

use super::rules::{self, ResourceSummary, rule};
use crate::api::{OpenMedModelStatus, Phase};
use crate::findings::Finding;
use crate::fleet::{Cluster, Wave};
use crate::rollout::conditions;
use crate::source::Location;
use crate::source::edit::{Action, Edit};

/// One cluster of the fleet, as the rules need it.
#[derive(Debug, Clone)]
pub struct Member<'a> {
    /// The index of its wave.
    pub index: usize,
    pub wave: &'a Wave,
    pub cluster: &'a Cluster,
    /// Its models at REV.
    pub models: Vec<ResourceSummary>,
    /// Its models before the change.
    pub before: Before,
    /// Its status (`--status DIR/<cluster>.yaml`), when given.
    pub status: Option<rules::ClusterStatus>,
}

/// A cluster's models before the change, which tells what the change
/// moved. The shell reads them at BASE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Before {
    /// Their versions at BASE, `<namespace>/<name>` → `spec.version`: a
    /// model whose version differs, or that is not there, was moved.
    Base(HashMap<String, String>),
    /// There is no BASE: REV is the repository's first commit (or the work
    /// tree's branch has none yet). Every model is added, as in one commit
    /// that bumps every wave, which Flux applies wave by wave.
    FirstCommit,
}

impl Member<'_> {
    /// How a message names it: `wave staging`, or `wave hospitals
    /// (cluster hospital-a)`.
    fn named(&self) -> String {
        if self.wave.clusters.len() == 1 && self.wave.name == self.cluster.name {
            format!("wave {}", self.wave.name)
        } else {
            format!("wave {} (cluster {})", self.wave.name, self.cluster.name)
        }
    }

    fn model(&self, resource: &str) -> Option<&ResourceSummary> {
        self.models.iter().find(|m| m.resource == resource)
    }

    /// Whether this change moved `model`'s version (or added it).
    fn moved(&self, model: &ResourceSummary) -> bool {
        match &self.before {
            Before::Base(versions) => versions.get(&model.resource) != model.version.as_ref(),
            Before::FirstCommit => true,
        }
    }

    /// `resource`'s version before the change, when it was there.
    fn was(&self, resource: &str) -> Option<&String> {
        match &self.before {
            Before::Base(versions) => versions.get(resource),
            Before::FirstCommit => None,
        }
    }

    fn status_of(&self, resource: &str) -> Option<Option<&OpenMedModelStatus>> {
        let status = self.status.as_ref()?;
        Some(
            status
                .iter()
                .find(|(key, _)| format!("{}/{}", key.namespace, key.name) == resource)
                .map(|(_, s)| s),
        )
    }
}

/// Every rule, each field flagged once: a rollback's fix first (it is
/// what the cluster did), then a wave run ahead, one not soaked, one
/// whose clusters disagree.
pub fn judge(members: &[Member]) -> Vec<Finding> {
    let mut flagged = HashSet::new();
    let mut findings = Vec::new();
    for finding in behind_rollback(members)
        .into_iter()
        .chain(ahead(members))
        .chain(not_soaked(members))
        .chain(disagree(members))
    {
        let key = (
            finding.location.file.clone(),
            finding.location.document,
            finding.field.clone(),
        );
        if flagged.insert(key) {
            findings.push(finding);
        }
    }
    findings
}

/// The clusters of the wave before `member`'s.
fn previous<'m, 'a>(
    members: &'m [Member<'a>],
    member: &Member,
) -> impl Iterator<Item = &'m Member<'a>> {
    members
        .iter()
        .filter(move |p| member.index > 0 && p.index + 1 == member.index)
}

/// A change that moves a wave's model (or adds it) to a version a cluster
/// of the wave before does not ask for runs that wave ahead: a version
/// reaches a wave only after the waves before it, and Flux applies one
/// commit that bumps them all wave by wave. A wave that stays where it was
/// while the one before moves on lags, which is how every bump begins.
/// The fix takes the version of the wave before.
fn ahead(members: &[Member]) -> Vec<Finding> {
    let mut findings = Vec::new();
    for member in members {
        for model in &member.models {
            let Some(version) = &model.version else {
                continue;
            };
            if !member.moved(model) {
                continue;
            }
            let before = previous(members, member).find_map(|p| {
                let asked = p.model(&model.resource)?.version.as_ref()?;
                (asked != version).then_some((p, asked))
            });
            let Some((before, asked)) = before else {
                continue;
            };
            findings.push(set_back(
                model,
                rule::WAVE_AHEAD,
                format!(
                    "{} asks for {version}, and {} before it asks for {asked}: a version reaches a wave only after the waves before it; bump {} too (one commit may bump every wave, and Flux applies it wave by wave) or keep {} on {asked}",
                    member.named(),
                    before.named(),
                    before.cluster.path,
                    member.cluster.path
                ),
                Some(asked),
            ));
        }
    }
    findings
}

/// A change that promotes a wave on its own (the wave before asked for
/// the version already at BASE) moves it only to a version every cluster
/// of the wave before has soaked, as their statuses say: Flux gates a
/// commit that bumps both waves, but a wave promoted later is applied at
/// once. The fix keeps the wave where it was until the soak is over.
fn not_soaked(members: &[Member]) -> Vec<Finding> {
    let mut findings = Vec::new();
    for member in members {
        for model in &member.models {
            let Some(version) = &model.version else {
                continue;
            };
            if !member.moved(model) {
                continue;
            }
            let unsoaked = previous(members, member).find_map(|p| {
                let asked = p.model(&model.resource)?;
                let waited = asked.version.as_ref() == Some(version) && !p.moved(asked);
                if !waited {
                    return None;
                }
                let why = not_soaked_because(p.status_of(&model.resource)?, version)?;
                Some((p, why))
            });
            let Some((before, why)) = unsoaked else {
                continue;
            };
            let was = member.was(&model.resource);
            let keep = match was {
                Some(was) => format!("keep {} on {was} until then", member.cluster.path),
                None => format!("add it to {} once it has", member.cluster.path),
            };
            findings.push(set_back(
                model,
                rule::WAVE_NOT_SOAKED,
                format!(
                    "{} moves to {version}, which {} before it has not soaked: its status says {why}; a wave moves only to a version the wave before has soaked; {keep}",
                    member.named(),
                    before.named(),
                ),
                was.map(String::as_str),
            ));
        }
    }
    findings
}

/// Why a cluster's status does not show `version` soaked, or `None` when
/// it does: `Soaked=True` for that very version.
fn not_soaked_because(status: Option<&OpenMedModelStatus>, version: &str) -> Option<String> {
    let Some(status) = status else {
        return Some("nothing of this model".into());
    };
    let soaked = status
        .soak
        .as_ref()
        .is_some_and(|s| s.version == version && s.soaked_time.is_some())
        && conditions::is_true(&status.conditions, conditions::SOAKED);
    if soaked {
        return None;
    }
    let active = status.active_version.as_deref().unwrap_or("no version");
    if status.desired_version.as_deref() != Some(version) {
        return Some(format!("it runs {active} and has not taken {version} yet"));
    }
    if matches!(status.phase, Some(Phase::RolledBack | Phase::Failed)) {
        return Some(format!("{version} failed there and it runs {active}"));
    }
    match status.soak.as_ref() {
        Some(soak) if soak.version == version && soak.soaked_time.is_none() => {
            Some(format!("{version} soaks until {}", soak.end_time.0))
        }
        _ => Some(format!("{version} has not soaked (it is not Ready yet)")),
    }
}

/// The clusters of one wave are applied together, so a change that leaves
/// them asking for different versions of a model splits the wave: each
/// cluster the change moved away from a cluster it left alone is flagged,
/// with that cluster's version as the fix.
fn disagree(members: &[Member]) -> Vec<Finding> {
    let mut findings = Vec::new();
    for member in members {
        for model in &member.models {
            let Some(version) = &model.version else {
                continue;
            };
            if !member.moved(model) {
                continue;
            }
            let siblings = members
                .iter()
                .filter(|s| s.index == member.index && s.cluster.name != member.cluster.name);
            let other = siblings.filter_map(|s| {
                let theirs = s.model(&model.resource)?;
                let asked = theirs.version.as_ref()?;
                (asked != version).then_some((s, asked, !s.moved(theirs)))
            });
            // A sibling the change left alone is what the wave runs; else
            // the first that differs, with no fix (which one is meant is
            // the author's to say).
            let mut other: Vec<_> = other.collect();
            other.sort_by_key(|(_, _, unmoved)| !unmoved);
            let Some((sibling, asked, unmoved)) = other.first() else {
                continue;
            };
            let fix = if *unmoved { Some(asked.as_str()) } else { None };
            findings.push(set_back(
                model,
                rule::WAVE_DISAGREES,
                format!(
                    "{} asks for {version}, and cluster {} of the same wave asks for {asked}: the clusters of a wave are applied together and must ask for the same version; bump both or neither",
                    member.named(),
                    sibling.cluster.name,
                ),
                fix,
            ));
        }
    }
    findings
}

/// After an automatic rollback in one cluster (its `--status`), every
/// cluster of a later wave whose folder still asks for the version that
/// failed: once the rolled-back cluster's folder is set back
/// (`GitBehindRollback`) and its wave is Ready, Flux would apply the
/// failed version to the next. The fix is the version the cluster
/// restored, so one `verify --fix` brings every folder back in step.
fn behind_rollback(members: &[Member]) -> Vec<Finding> {
    let mut findings = Vec::new();
    for failed_in in members {
        let Some(cluster) = &failed_in.status else {
            continue;
        };
        for (key, status) in cluster {
            let automatic = status
                .rollback_request
                .as_deref()
                .is_some_and(|r| r.starts_with("automatic:"));
            if status.phase != Some(Phase::RolledBack) || !automatic {
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
            for later in members.iter().filter(|m| m.index > failed_in.index) {
                for model in &later.models {
                    if model.resource != resource || model.version.as_deref() != Some(failed) {
                        continue;
                    }
                    findings.push(set_back(
                        model,
                        rule::WAVE_BEHIND_ROLLBACK,
                        format!(
                            "{} asks for {failed}, which rolled back in {} (the cluster restored {restored}): once {} is set back and that wave is Ready, Flux would apply {failed} here; set it back too",
                            later.named(),
                            failed_in.named(),
                            failed_in.cluster.path
                        ),
                        Some(restored),
                    ));
                }
            }
        }
    }
    findings
}

/// An error at `model`'s `spec.version`, whose fix, when there is one,
/// sets it to `version`.
fn set_back(
    model: &ResourceSummary,
    rule: &'static str,
    message: String,
    version: Option<&str>,
) -> Finding {
    let at = &model.version_at;
    let location = Location {
        origin: at.file.as_str().into(),
        document: at.document.saturating_sub(1),
        line: at.line,
    };
    let finding = Finding::error(&location, rule, message)
        .resource(model.resource.clone())
        .field("spec.version");
    match version {
        Some(version) => finding.fix(format!("version: {version}")).edit(Edit {
            document: location.document,
            path: vec!["spec".into(), "version".into()],
            action: Action::Set(version.to_owned()),
        }),
        None => finding,
    }
}
