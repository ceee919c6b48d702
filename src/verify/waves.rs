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
//! The first three judge what a change moved ([`Before`]). Going back is
//! not moving ahead: a wave may move to the version its cluster restored
//! after a rollback, or to one the wave before has already passed. No fix
//! sets a version the cluster saw fail (`FailedVersionRetried` would
//! refuse it), and one `--fix` leaves nothing for a second ([`judge`]).

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

    /// `None` without a status; else the model's status in it, if any.
    fn status_of(&self, resource: &str) -> Option<Option<&OpenMedModelStatus>> {
        let status = self.status.as_ref()?;
        Some(
            status
                .iter()
                .find(|(key, _)| format!("{}/{}", key.namespace, key.name) == resource)
                .map(|(_, s)| s),
        )
    }

    /// The version the cluster restored after rolling `resource` back.
    fn restored(&self, resource: &str) -> Option<&str> {
        self.status_of(resource).flatten().and_then(rules::restored)
    }

    /// Whether this cluster has passed `version` of `resource`: it retains
    /// it (soaked, as its status says, or asked for on BASE's history
    /// without one), or restored it. A later wave moving to such a version
    /// goes back, not ahead.
    fn passed(&self, resource: &str, version: &str) -> bool {
        self.model(resource)
            .is_some_and(|m| m.retained_versions.iter().any(|v| v == version))
            || self.restored(resource) == Some(version)
    }
}

/// Every rule, each field flagged once: a field the clusters' own rules
/// already fix (`cluster_findings` with an edit, `GitBehindRollback`:
/// what the cluster did) is left to them; then a rollback's fix, a wave
/// run ahead, one not soaked, one whose clusters disagree.
///
/// `--fix` makes every edit at once, so the waves are judged in order,
/// each as the fixes of the waves before leave it: a wave set back can
/// leave the wave after it ahead, and the same `--fix` sets that one too.
/// Within a wave a fix can split it, so its clusters are judged again
/// after each fix, until no rule has more to say. A fix is the version
/// its rule names if that passes every rule and did not fail in the
/// cluster; else the model's version at BASE, or the one its cluster
/// restored, if that does; else there is none. So one `--fix` leaves
/// nothing for a second to change.
pub fn judge(members: &[Member], cluster_findings: &[Finding]) -> Vec<Finding> {
    let mut members = members.to_vec();
    let mut settled = Settled::new();
    let mut flagged = HashSet::new();
    for finding in cluster_findings {
        if let Some(at) = settle(&mut members, &mut settled, finding) {
            flagged.insert(at);
        }
    }
    let mut findings = Vec::new();
    let waves = members.iter().map(|m| m.index + 1).max().unwrap_or(0);
    for wave in 0..waves {
        // One flag at a time: each fix changes what the next is judged on.
        // A flag with no fix (none named, or each breaks a rule) waits
        // until the rest of its wave is fixed (a sibling set back may give
        // it one), then is judged once more.
        let mut waiting: Vec<(usize, usize)> = Vec::new();
        let mut waited = HashSet::new();
        loop {
            let open = |flag: &Flag| {
                let at = (flag.member, flag.model);
                members[flag.member].index == wave
                    && !flagged.contains(&at)
                    && !waiting.contains(&at)
            };
            let flag = match every_rule(&members, &settled).into_iter().find(open) {
                Some(flag) => flag,
                None if waiting.is_empty() => break,
                None => {
                    let at = waiting.remove(0);
                    waited.insert(at);
                    let again = every_rule(&members, &settled)
                        .into_iter()
                        .find(|f| (f.member, f.model) == at);
                    match again {
                        Some(flag) => flag,
                        None => continue,
                    }
                }
            };
            let at = (flag.member, flag.model);
            let (fix, note) = choose_fix(&members, &settled, &flag);
            if fix.is_none() && !waited.contains(&at) {
                waiting.push(at);
                continue;
            }
            flagged.insert(at);
            let member = &mut members[flag.member];
            let model = &mut member.models[flag.model];
            findings.push(set_back(
                model,
                flag.rule,
                format!("{}{note}", flag.message),
                fix.as_deref(),
            ));
            if let Some(fix) = fix {
                model.version = Some(fix);
                settled.insert((member.cluster.name.clone(), model.resource.clone()));
            }
        }
    }
    findings
}

/// A rule's finding at one model's `spec.version`, before its fix is
/// chosen.
struct Flag {
    /// The member and its model, by position.
    member: usize,
    model: usize,
    rule: &'static str,
    message: String,
    /// The version the rule would set.
    fix: Option<String>,
}

/// The models a fix sets so far: (cluster, `<namespace>/<name>`).
type Settled = HashSet<(String, String)>;

/// Every rule's flags on `members` as they stand, each rule's in order.
fn every_rule(members: &[Member], settled: &Settled) -> Vec<Flag> {
    let mut flags = behind_rollback(members);
    flags.extend(ahead(members, settled));
    flags.extend(not_soaked(members));
    flags.extend(disagree(members, settled));
    flags
}

/// The fix of `flag`, and what the message adds when it is not the
/// version the rule names: the first of that version, the model's version
/// at BASE and the one its cluster restored that did not fail in the
/// cluster and leaves no rule to flag the field.
fn choose_fix(members: &[Member], settled: &Settled, flag: &Flag) -> (Option<String>, String) {
    let Some(named) = &flag.fix else {
        return (None, String::new());
    };
    let member = &members[flag.member];
    let model = &member.models[flag.model];
    let mut candidates = vec![named.clone()];
    candidates.extend(member.was(&model.resource).cloned());
    candidates.extend(member.restored(&model.resource).map(str::to_owned));
    let mut refused = None;
    for candidate in candidates {
        match passes(members, settled, flag, &candidate) {
            Ok(()) if candidate == *named => return (Some(candidate), String::new()),
            Ok(()) => {
                let why = refused.unwrap_or_default();
                return (
                    Some(candidate.clone()),
                    format!(" ({named} {why}, so the fix is {candidate})"),
                );
            }
            Err(why) => {
                refused.get_or_insert(why);
            }
        }
    }
    let why = refused.unwrap_or_default();
    (None, format!(" ({named} {why}, so no fix is suggested)"))
}

/// Whether `flag`'s model may be set to `version`: it did not fail in the
/// cluster (`FailedVersionRetried` would refuse it), and no rule flags it
/// there.
fn passes(members: &[Member], settled: &Settled, flag: &Flag, version: &str) -> Result<(), String> {
    let member = &members[flag.member];
    let model = &member.models[flag.model];
    let failed = member
        .status_of(&model.resource)
        .flatten()
        .is_some_and(|s| rules::failed_there(s, model, version));
    if failed {
        return Err("failed in this cluster".into());
    }
    let mut trial = members.to_vec();
    trial[flag.member].models[flag.model].version = Some(version.to_owned());
    match every_rule(&trial, settled)
        .into_iter()
        .find(|f| f.member == flag.member && f.model == flag.model)
    {
        Some(other) => Err(format!("would break {} there", other.rule)),
        None => Ok(()),
    }
}

/// `finding`'s fix (the clusters' own) applied to the model whose
/// `spec.version` it sets; that model's position.
fn settle(
    members: &mut [Member],
    settled: &mut Settled,
    finding: &Finding,
) -> Option<(usize, usize)> {
    let Some(Edit {
        path,
        action: Action::Set(version),
        ..
    }) = &finding.edit
    else {
        return None;
    };
    if path != &["spec", "version"] {
        return None;
    }
    for (i, member) in members.iter_mut().enumerate() {
        for (k, model) in member.models.iter_mut().enumerate() {
            if model.version_at.file == finding.location.file
                && model.version_at.document == finding.location.document
            {
                model.version = Some(version.clone());
                settled.insert((member.cluster.name.clone(), model.resource.clone()));
                return Some((i, k));
            }
        }
    }
    None
}

/// How a message says what `member` asks for `resource`: as Git has it,
/// or as the fix of its own finding sets it.
fn as_fixed(settled: &Settled, member: &Member, resource: &str) -> &'static str {
    if settled.contains(&(member.cluster.name.clone(), resource.to_owned())) {
        " once --fix sets it"
    } else {
        ""
    }
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
/// while the one before moves on lags, which is how every bump begins; one
/// that goes back to a version the wave before has passed, or to the one
/// its own cluster restored, is not ahead either. The fix takes the
/// version of the wave before.
fn ahead(members: &[Member], settled: &Settled) -> Vec<Flag> {
    let mut flags = Vec::new();
    for (i, member) in members.iter().enumerate() {
        for (k, model) in member.models.iter().enumerate() {
            let Some(version) = &model.version else {
                continue;
            };
            if !member.moved(model) || member.restored(&model.resource) == Some(version) {
                continue;
            }
            let before = previous(members, member).find_map(|p| {
                let asked = p.model(&model.resource)?.version.as_ref()?;
                (asked != version && !p.passed(&model.resource, version)).then_some((p, asked))
            });
            let Some((before, asked)) = before else {
                continue;
            };
            flags.push(Flag {
                member: i,
                model: k,
                rule: rule::WAVE_AHEAD,
                message: format!(
                    "{} asks for {version}, and {} before it asks for {asked}{}: a version reaches a wave only after the waves before it; bump {} too (one commit may bump every wave, and Flux applies it wave by wave) or keep {} on {asked}",
                    member.named(),
                    before.named(),
                    as_fixed(settled, before, &model.resource),
                    before.cluster.path,
                    member.cluster.path
                ),
                fix: Some(asked.clone()),
            });
        }
    }
    flags
}

/// A change that promotes a wave on its own (the wave before asked for
/// the version already at BASE) moves it only to a version every cluster
/// of the wave before has soaked, as their statuses say: Flux gates a
/// commit that bumps both waves, but a wave promoted later is applied at
/// once. The fix keeps the wave where it was until the soak is over. A
/// wave set back to the version its cluster restored is not promoted: it
/// runs that version already. A version the wave before soaked once and
/// retains is soaked ([`not_soaked_because`]).
fn not_soaked(members: &[Member]) -> Vec<Flag> {
    let mut flags = Vec::new();
    for (i, member) in members.iter().enumerate() {
        for (k, model) in member.models.iter().enumerate() {
            let Some(version) = &model.version else {
                continue;
            };
            if !member.moved(model) || member.restored(&model.resource) == Some(version) {
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
            flags.push(Flag {
                member: i,
                model: k,
                rule: rule::WAVE_NOT_SOAKED,
                message: format!(
                    "{} moves to {version}, which {} before it has not soaked: its status says {why}; a wave moves only to a version the wave before has soaked; {keep}",
                    member.named(),
                    before.named(),
                ),
                fix: was.cloned(),
            });
        }
    }
    flags
}

/// Why a cluster's status does not show `version` soaked, or `None` when
/// it does: `Soaked=True` for that very version, or a version it soaked
/// before and retains (`lastSuccessfulSpec`, `previousSuccessfulSpec`),
/// which is `Soaked` again, with no new soak, once asked for again.
fn not_soaked_because(status: Option<&OpenMedModelStatus>, version: &str) -> Option<String> {
    let Some(status) = status else {
        return Some("nothing of this model".into());
    };
    let soaked = status
        .soak
        .as_ref()
        .is_some_and(|s| s.version == version && s.soaked_time.is_some())
        && conditions::is_true(&status.conditions, conditions::SOAKED);
    let retained = crate::rollout::retained_versions(status);
    if soaked || retained.iter().any(|v| v == version) {
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
/// with that cluster's version as the fix. A cluster set back to the
/// version it restored after a rollback follows what it runs: the split is
/// the cluster's, not the change's.
fn disagree(members: &[Member], settled: &Settled) -> Vec<Flag> {
    let mut flags = Vec::new();
    for (i, member) in members.iter().enumerate() {
        for (k, model) in member.models.iter().enumerate() {
            let Some(version) = &model.version else {
                continue;
            };
            if !member.moved(model) || member.restored(&model.resource) == Some(version) {
                continue;
            }
            let siblings = members
                .iter()
                .filter(|s| s.index == member.index && s.cluster.name != member.cluster.name);
            let other = siblings.filter_map(|s| {
                let theirs = s.model(&model.resource)?;
                let asked = theirs.version.as_ref()?;
                // A cluster set back to what it restored runs that version.
                let stays = !s.moved(theirs) || s.restored(&model.resource) == Some(asked);
                (asked != version).then_some((s, asked, stays))
            });
            // A sibling the change left alone (or set back to what its
            // cluster restored) is what the wave runs; else the first that
            // differs, with no fix (which one is meant is the author's to
            // say).
            let mut other: Vec<_> = other.collect();
            other.sort_by_key(|(_, _, stays)| !stays);
            let Some((sibling, asked, stays)) = other.first() else {
                continue;
            };
            flags.push(Flag {
                member: i,
                model: k,
                rule: rule::WAVE_DISAGREES,
                message: format!(
                    "{} asks for {version}, and cluster {} of the same wave asks for {asked}{}: the clusters of a wave are applied together and must ask for the same version; bump both or neither",
                    member.named(),
                    sibling.cluster.name,
                    as_fixed(settled, sibling, &model.resource),
                ),
                fix: stays.then(|| (*asked).clone()),
            });
        }
    }
    flags
}

/// After an automatic rollback in one cluster (its `--status`), every
/// cluster of a later wave whose folder still asks for the version that
/// failed: once the rolled-back cluster's folder is set back
/// (`GitBehindRollback`) and its wave is Ready, Flux would apply the
/// failed version to the next. The fix is the version the cluster
/// restored, so one `verify --fix` brings every folder back in step. A
/// later cluster that itself restored that version runs it: Flux applying
/// it there changes nothing.
fn behind_rollback(members: &[Member]) -> Vec<Flag> {
    let mut flags = Vec::new();
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
            let (Some(failed), Some(restored)) =
                (status.desired_version.as_deref(), rules::restored(status))
            else {
                continue;
            };
            let resource = format!("{}/{}", key.namespace, key.name);
            for (i, later) in members.iter().enumerate() {
                if later.index <= failed_in.index || later.restored(&resource) == Some(failed) {
                    continue;
                }
                for (k, model) in later.models.iter().enumerate() {
                    if model.resource != resource || model.version.as_deref() != Some(failed) {
                        continue;
                    }
                    flags.push(Flag {
                        member: i,
                        model: k,
                        rule: rule::WAVE_BEHIND_ROLLBACK,
                        message: format!(
                            "{} asks for {failed}, which rolled back in {} (the cluster restored {restored}): once {} is set back and that wave is Ready, Flux would apply {failed} here; set it back too",
                            later.named(),
                            failed_in.named(),
                            failed_in.cluster.path
                        ),
                        fix: Some(restored.to_owned()),
                    });
                }
            }
        }
    }
    flags
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

#[cfg(test)]
mod tests;
