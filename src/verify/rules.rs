//! The rules of `verify`, as pure functions of plain data.
//!
//! A change to OpenMedModels is judged on what it leaves in Git (REV), what
//! was there before (BASE), the versions the operator retains for a manual
//! rollback (from the cluster's status, or derived from Git history) and,
//! when given, the cluster's status. Reading those from Git or from disk is
//! the shell's job ([`super::git`]); deciding what is allowed is this
//! module's, so every rule can be tested without a repository.
//!
//! Validation and the one-owner-per-target rule are not restated here: they
//! come from [`manifests::resolve`], the same judgement `render` applies.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use serde::Serialize;
use serde_json::Value;

use crate::api::names::{RETRY_REASON_ANNOTATION, ROLLBACK_TO_ANNOTATION};
use crate::api::{self, OpenMedModelSpec, OpenMedModelStatus, Phase};
use crate::findings::{Finding, LocationJson, Severity};
use crate::manifests;
use crate::plan;
use crate::source::Document;
use crate::source::edit::{Action, Edit};

/// Rule ids of `verify`, beside the shared ones in [`manifests::rule`].
pub mod rule {
    /// A file that holds an OpenMedModel is not valid YAML.
    pub const INVALID_YAML: &str = "InvalidYaml";
    /// `openmed.ai/rollback-to` names a version the operator does not retain.
    pub const ROLLBACK_NOT_RETAINED: &str = "RollbackNotRetained";
    /// One change both moves `spec.version` and asks for a rollback.
    pub const ONE_INTENT_PER_CHANGE: &str = "OneIntentPerChange";
    /// A change asks again for a version the cluster saw fail.
    pub const FAILED_VERSION_RETRIED: &str = "FailedVersionRetried";
    /// `openmed.ai/rollback-to` equals `spec.version` already.
    pub const STALE_ROLLBACK_ANNOTATION: &str = "StaleRollbackAnnotation";
    /// An OpenMedModel present at BASE is gone at REV.
    pub const MODEL_DELETED: &str = "ModelDeleted";
    /// `spec.version` names a revision that can move (`:latest`, `@main`).
    pub const MUTABLE_VERSION: &str = "MutableVersion";
    /// `spec.version` is not a model id the OpenMed service accepts: an
    /// error for the characters it never accepts (`:`, `@`, `+`, `~`), a
    /// warning otherwise (it may be a path in the pod).
    pub const NOT_A_SERVICE_MODEL_ID: &str = "NotAServiceModelId";
    /// `spec.targetRef` points at another Deployment or container.
    pub const TARGET_CHANGED: &str = "TargetChanged";
    /// The cluster rolled back, and Git still asks for the failed version.
    pub const GIT_BEHIND_ROLLBACK: &str = "GitBehindRollback";
    /// In a fleet, a wave asks for a version the wave before it does not.
    pub const WAVE_AHEAD: &str = "WaveAhead";
    /// In a fleet, a later wave asks for a version that rolled back in an
    /// earlier wave (its `--status`).
    pub const WAVE_BEHIND_ROLLBACK: &str = "WaveBehindRollback";
    /// In a fleet, a wave promoted on its own to a version a cluster of
    /// the wave before has not soaked (its `--status`).
    pub const WAVE_NOT_SOAKED: &str = "WaveNotSoaked";
    /// In a fleet, the clusters of one wave ask for different versions.
    pub const WAVE_DISAGREES: &str = "WaveDisagrees";
    /// `spec.qualityGate` names a probe set that is not in the tree, or
    /// one the operator could not read: every new pod would stay unready.
    pub const QUALITY_GATE_PROBES: &str = "QualityGateProbes";
    /// `spec.qualityGate` on a target whose container declares no port
    /// and no httpGet probe: the gate has nowhere to ask, and the operator
    /// would refuse to roll out.
    pub const QUALITY_GATE_PORT: &str = "QualityGatePort";
    /// A `minRecall` key that matches no label of the probe set in the
    /// input: it bounds nothing, and the operator refuses the spec.
    pub const QUALITY_GATE_LABEL: &str = "QualityGateLabel";
    /// The target Deployment in the tree lists its served set and leaves
    /// out `spec.version`: the operator refuses to roll it out (its pods
    /// would refuse every request naming it).
    pub const SERVED_SET_LACKS_VERSION: &str = "ServedSetLacksVersion";
    /// The served set in the tree leaves out the version the cluster runs:
    /// clients still naming it are refused by every new pod.
    pub const SERVED_SET_DROPS_RUNNING: &str = "ServedSetDropsRunning";
    /// `spec.replicas` beside `spec.autoscaling`: the autoscaler owns the
    /// count and the operator does not write it.
    pub const REPLICAS_BESIDE_AUTOSCALING: &str = "ReplicasBesideAutoscaling";
    /// `spec.autoscaling` with a rolling update that may take pods away
    /// (`maxUnavailable` above 0): a rollout can then serve with fewer
    /// ready pods than the autoscaler asked for.
    pub const AUTOSCALED_ROLLOUT_DROPS_PODS: &str = "AutoscaledRolloutDropsPods";
}

/// An OpenMedModel's identity: it survives renames and moves between files.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceKey {
    /// `metadata.namespace`, or the default namespace.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
}

impl fmt::Display for ResourceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl ResourceKey {
    /// The key of an OpenMedModel document, `None` for any other document or
    /// one without a name.
    pub fn of(doc: &Document, default_namespace: &str) -> Option<Self> {
        if !manifests::is_model(doc) {
            return None;
        }
        Some(ResourceKey {
            namespace: manifests::namespace_of(doc, default_namespace).to_owned(),
            name: doc.name()?.to_owned(),
        })
    }
}

/// Cluster status per resource, as read with `--status`.
pub type ClusterStatus = HashMap<ResourceKey, OpenMedModelStatus>;

/// Distinct `spec.version` values per resource on BASE's first-parent
/// history, most recent first, at most two (see [`super::history`]).
pub type HistoryVersions = HashMap<ResourceKey, Vec<String>>;

/// Everything the rules look at.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    /// Every document at REV (every YAML file that passed the filters).
    pub rev: &'a [Document],
    /// The OpenMedModel documents at BASE; `None` when there is no BASE.
    pub base: Option<&'a [Document]>,
    /// Versions derived from history, for resources without cluster status.
    pub history: &'a HistoryVersions,
    /// The cluster's status, with `--status`.
    pub status: Option<&'a ClusterStatus>,
    /// Namespace of documents that set none.
    pub default_namespace: &'a str,
    /// Report hygiene warnings as errors.
    pub strict: bool,
}

/// Where the versions a manual rollback may name come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RetainedSource {
    /// `lastSuccessfulSpec` / `previousSuccessfulSpec` of the cluster's status.
    Status,
    /// The last two distinct `spec.version` values on BASE's first-parent history.
    History,
}

impl RetainedSource {
    /// The name as written in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            RetainedSource::Status => "status",
            RetainedSource::History => "history",
        }
    }
}

/// One OpenMedModel at REV, as the report lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceSummary {
    /// `<namespace>/<name>`.
    pub resource: String,
    /// Where it is defined at REV.
    #[serde(flatten)]
    pub location: LocationJson,
    /// `spec.version` at REV, when it is a string.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The versions `openmed.ai/rollback-to` may name, most recent first.
    pub retained_versions: Vec<String>,
    /// Where `retained_versions` come from.
    pub retained_versions_source: RetainedSource,
    /// `openmed.ai/rollback-to` at REV, when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollback_to: Option<String>,
    /// Where `spec.version` is at REV: the line a finding about it names.
    #[serde(skip)]
    pub version_at: LocationJson,
    /// Its normalized spec at REV (what the operator hashes), when valid.
    #[serde(skip)]
    pub normalized: Option<OpenMedModelSpec>,
}

/// What the rules found.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// Every finding, in document order, rules 1–2 first.
    pub findings: Vec<Finding>,
    /// Every OpenMedModel at REV, in document order.
    pub resources: Vec<ResourceSummary>,
}

/// The fields of one OpenMedModel document the rules read.
struct Facts<'d> {
    doc: &'d Document,
    key: ResourceKey,
    version: Option<&'d str>,
    rollback_to: Option<String>,
    retry_reason: Option<String>,
}

impl<'d> Facts<'d> {
    fn of(doc: &'d Document, default_namespace: &str) -> Option<Self> {
        let key = ResourceKey::of(doc, default_namespace)?;
        Some(Facts {
            doc,
            key,
            version: doc.value.pointer("/spec/version").and_then(Value::as_str),
            rollback_to: annotation(doc, ROLLBACK_TO_ANNOTATION),
            retry_reason: annotation(doc, RETRY_REASON_ANNOTATION).filter(|r| !r.trim().is_empty()),
        })
    }

    fn spec(&self) -> Option<&'d Value> {
        self.doc.value.get("spec")
    }

    fn annotation_path(name: &str) -> String {
        format!("metadata.annotations.{name}")
    }

    fn annotation_field(name: &str) -> String {
        format!("metadata.annotations[{name:?}]")
    }
}

fn annotation(doc: &Document, name: &str) -> Option<String> {
    let value = doc.value.get("metadata")?.get("annotations")?.get(name)?;
    Some(match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    })
}

/// The normalized spec of a document and its hash, when it is valid.
fn normalized(doc: &Document) -> Option<(OpenMedModelSpec, String)> {
    let spec = api::validate(&doc.value, None).ok()?;
    let normalized = plan::normalize(doc.name()?, &spec);
    let hash = plan::spec_hash(&normalized);
    Some((normalized, hash))
}

/// Applies every rule to `input`.
pub fn check(input: &Input) -> Outcome {
    let ns = input.default_namespace;
    let resolved = manifests::resolve(input.rev, ns);
    let mut findings = resolved.findings;
    let planned: HashMap<usize, &manifests::Model> =
        resolved.models.iter().map(|m| (m.doc, m)).collect();

    let rev = first_by_key(input.rev, ns);
    let base = input.base.map(|docs| first_by_key(docs, ns));
    let mut resources = Vec::new();

    for (i, doc) in input.rev.iter().enumerate() {
        let Some(facts) = Facts::of(doc, ns) else {
            continue;
        };
        // A second document with the same identity is judged by resolve
        // (TargetConflict); the rules look at the first.
        if !std::ptr::eq(rev[&facts.key].doc, doc) {
            continue;
        }
        let rev_plan = planned
            .get(&i)
            .map(|m| (&m.plan.normalized, &m.plan.spec_hash));
        let before = base.as_ref().and_then(|b| b.get(&facts.key));
        let status = input.status.and_then(|s| s.get(&facts.key));
        let (retained, source) = match status {
            Some(status) => (status_retained(status), RetainedSource::Status),
            None => (
                input.history.get(&facts.key).cloned().unwrap_or_default(),
                RetainedSource::History,
            ),
        };
        let change = Change {
            rev: &facts,
            rev_plan,
            base: before,
        };

        one_intent_per_change(&change, &mut findings);
        rollback_retained(&change, &retained, source, &mut findings);
        if let Some(status) = status {
            failed_versions(&change, status, &mut findings);
        }
        mutable_version(&facts, &mut findings);
        service_model_id(&facts, &mut findings);
        target_changed(&change, &mut findings);
        quality_gate_probes(&facts, input.rev, ns, &mut findings);
        if let Some(model) = planned.get(&i) {
            quality_gate_port(&facts, model, input.rev, &mut findings);
            served_set(&facts, model, input.rev, status, &mut findings);
            autoscaled(&facts, model, &mut findings);
        }

        resources.push(ResourceSummary {
            resource: facts.key.to_string(),
            location: (&doc.at("metadata.name")).into(),
            version: facts.version.map(str::to_owned),
            retained_versions: retained,
            retained_versions_source: source,
            rollback_to: facts.rollback_to.clone(),
            version_at: (&doc.at("spec.version")).into(),
            normalized: rev_plan.map(|(normalized, _)| normalized.clone()),
        });
    }

    if let Some(base) = &base {
        for facts in base.values() {
            if !rev.contains_key(&facts.key) {
                findings.push(deleted(facts));
            }
        }
    }

    if input.strict {
        for finding in &mut findings {
            finding.severity = Severity::Error;
        }
    }
    Outcome {
        findings,
        resources,
    }
}

/// The first OpenMedModel document of each identity, by key.
fn first_by_key<'d>(docs: &'d [Document], ns: &str) -> BTreeMap<ResourceKey, Facts<'d>> {
    let mut map = BTreeMap::new();
    for doc in docs {
        if let Some(facts) = Facts::of(doc, ns) {
            map.entry(facts.key.clone()).or_insert(facts);
        }
    }
    map
}

/// The versions the operator accepts in `openmed.ai/rollback-to`, each once.
fn status_retained(status: &OpenMedModelStatus) -> Vec<String> {
    let mut versions = crate::rollout::retained_versions(status);
    versions.dedup();
    versions
}

/// One resource between BASE and REV.
struct Change<'a, 'd> {
    rev: &'a Facts<'d>,
    rev_plan: Option<(&'a OpenMedModelSpec, &'a String)>,
    base: Option<&'a Facts<'d>>,
}

impl Change<'_, '_> {
    fn version_changed(&self) -> bool {
        self.base
            .is_some_and(|b| b.version.is_some() && b.version != self.rev.version)
    }

    fn rollback_added(&self) -> bool {
        self.rev.rollback_to.is_some()
            && self
                .base
                .is_none_or(|b| b.rollback_to != self.rev.rollback_to)
    }

    /// True when the operator sees a new spec at REV: the resource is new,
    /// or its normalized spec (what the operator hashes) differs from BASE's.
    fn spec_changed(&self) -> bool {
        let Some(base) = self.base else { return true };
        if base.spec() == self.rev.spec() {
            return false;
        }
        match (normalized(base.doc), self.rev_plan) {
            (Some((_, base_hash)), Some((_, rev_hash))) => &base_hash != rev_hash,
            _ => true,
        }
    }

    fn display(&self) -> String {
        self.rev.key.to_string()
    }
}

/// Rule 4: a change moves `spec.version` or asks for a rollback, not both.
fn one_intent_per_change(change: &Change, findings: &mut Vec<Finding>) {
    if !(change.version_changed() && change.rollback_added()) {
        return;
    }
    let base = change.base.expect("a version change has a base");
    let path = Facts::annotation_path(ROLLBACK_TO_ANNOTATION);
    findings.push(
        Finding::error(
            &change.rev.doc.at(&path),
            rule::ONE_INTENT_PER_CHANGE,
            format!(
                "this change both moves spec.version ({} -> {}) and adds {ROLLBACK_TO_ANNOTATION}; the operator cannot tell which one you mean. Make two changes: the rollback first, then the version bump (or drop the annotation)",
                base.version.unwrap_or("?"),
                change.rev.version.unwrap_or("?"),
            ),
        )
        .resource(change.display())
        .field(Facts::annotation_field(ROLLBACK_TO_ANNOTATION)),
    );
}

/// Rule 3 (and the first hygiene rule): a manual rollback names a retained
/// version, and the annotation goes once the rollback is in `spec.version`.
fn rollback_retained(
    change: &Change,
    retained: &[String],
    source: RetainedSource,
    findings: &mut Vec<Finding>,
) {
    let facts = change.rev;
    let Some(target) = &facts.rollback_to else {
        return;
    };
    let path = Facts::annotation_path(ROLLBACK_TO_ANNOTATION);
    let field = Facts::annotation_field(ROLLBACK_TO_ANNOTATION);
    if facts.version == Some(target.as_str()) {
        findings.push(
            Finding::warning(
                &facts.doc.at(&path),
                rule::STALE_ROLLBACK_ANNOTATION,
                format!(
                    "spec.version is already {target:?}, so this rollback request has nothing left to do; remove the annotation so a later version bump is not mistaken for a rollback"
                ),
            )
            .resource(change.display())
            .field(field)
            .fix(format!(
                "delete line {} ({ROLLBACK_TO_ANNOTATION}: {target})",
                facts.doc.line_of(&path)
            ))
            .edit(edit(facts.doc, &["metadata", "annotations", ROLLBACK_TO_ANNOTATION], Action::Remove)),
        );
        return;
    }
    if retained.iter().any(|v| v == target) {
        return;
    }
    let from = match source {
        RetainedSource::Status => {
            "the cluster's status (lastSuccessfulSpec, previousSuccessfulSpec)"
        }
        RetainedSource::History => {
            "history-derived: the last two distinct spec.version values on BASE's first-parent history; --status gives the cluster's own"
        }
    };
    let accepted = if retained.is_empty() {
        "the operator retains no version of this resource to roll back to".to_owned()
    } else {
        format!("it accepts only {}", quoted_list(retained))
    };
    let mut finding = Finding::error(
        &facts.doc.at(&path),
        rule::ROLLBACK_NOT_RETAINED,
        format!("{target:?} is not a retained version; {accepted} ({from})"),
    )
    .resource(change.display())
    .field(field);
    // The retained version other than the one already asked for is the
    // rollback that can be meant.
    // A status is input too: a version it names that `validate` refuses is
    // never suggested.
    let others: Vec<&String> = retained
        .iter()
        .filter(|v| Some(v.as_str()) != facts.version)
        .filter(|v| invalid_version(facts.doc, v).is_none())
        .collect();
    if let Some(other) = others.first() {
        finding = finding.fix(format!("{ROLLBACK_TO_ANNOTATION}: {}", yaml_scalar(other)));
    }
    // Applied by `--fix` only when exactly one version can be meant.
    if let [other] = others.as_slice() {
        finding = finding.edit(edit(
            facts.doc,
            &["metadata", "annotations", ROLLBACK_TO_ANNOTATION],
            Action::Set((*other).clone()),
        ));
    }
    findings.push(finding);
}

/// Whether the cluster's `status` shows that `model` asking for `version`
/// failed there: its rollout of `version` failed (phase RolledBack or
/// Failed), or that very spec did (`status.failedSpecHash`). A change to
/// such a version is what `FailedVersionRetried` refuses, so no fix
/// suggests one.
pub fn failed_there(status: &OpenMedModelStatus, model: &ResourceSummary, version: &str) -> bool {
    let failed_phase = matches!(status.phase, Some(Phase::RolledBack | Phase::Failed));
    if failed_phase && status.desired_version.as_deref() == Some(version) {
        return true;
    }
    let (Some(failed), Some(normalized)) = (&status.failed_spec_hash, &model.normalized) else {
        return false;
    };
    let mut asked = normalized.clone();
    asked.version = version.to_owned();
    &plan::spec_hash(&asked) == failed
}

/// The version the cluster restored after rolling `status`'s model back,
/// automatically or by hand: what it serves, and what Git is set back to.
pub fn restored(status: &OpenMedModelStatus) -> Option<&str> {
    if status.phase != Some(Phase::RolledBack) {
        return None;
    }
    status
        .rollback_spec
        .as_ref()
        .or(status.last_successful_spec.as_ref())
        .map(|s| s.version.as_str())
        .or(status.active_version.as_deref())
}

/// Rules 5 and 7: a version the cluster saw fail is not asked for again
/// without a reason, and after an automatic rollback Git follows the cluster.
fn failed_versions(change: &Change, status: &OpenMedModelStatus, findings: &mut Vec<Finding>) {
    let facts = change.rev;
    let Some(version) = facts.version else {
        return;
    };
    let failed_phase = matches!(status.phase, Some(Phase::RolledBack | Phase::Failed));
    let by_version = failed_phase && status.desired_version.as_deref() == Some(version);
    let by_hash = status.failed_spec_hash.is_some()
        && change.rev_plan.map(|(_, hash)| hash) == status.failed_spec_hash.as_ref();
    if !(by_version || by_hash) {
        return;
    }
    let how = if by_version {
        format!(
            "the cluster's rollout of {version:?} failed (phase {})",
            status.phase.map_or("?", Phase::as_str)
        )
    } else {
        "this exact spec failed in the cluster (its hash is status.failedSpecHash)".to_owned()
    };
    let at = facts.doc.at("spec.version");
    if change.spec_changed() {
        let reason_is_new = facts.retry_reason.is_some()
            && change
                .base
                .is_none_or(|b| b.retry_reason != facts.retry_reason);
        if reason_is_new {
            return;
        }
        let stale = if facts.retry_reason.is_some() {
            format!(
                " The {RETRY_REASON_ANNOTATION} annotation is unchanged since BASE; update it to say why this attempt is different."
            )
        } else {
            String::new()
        };
        findings.push(
            Finding::error(
                &at,
                rule::FAILED_VERSION_RETRIED,
                format!(
                    "this change makes the operator roll out {version:?} again, but {how}. Say why it should work now with the annotation {RETRY_REASON_ANNOTATION}, or choose another version.{stale}"
                ),
            )
            .resource(change.display())
            .field("spec.version")
            .fix(format!(
                "{RETRY_REASON_ANNOTATION}: \"<why this attempt is different>\""
            )),
        );
        return;
    }
    if status.phase != Some(Phase::RolledBack) {
        return;
    }
    let restored = restored(status).map(str::to_owned);
    // A status is input too: a restored version `validate` refuses is
    // reported, never suggested.
    let refused = restored
        .as_deref()
        .and_then(|r| invalid_version(facts.doc, r).map(|why| (r.to_owned(), why)));
    let restored = restored.filter(|_| refused.is_none());
    let mut finding = Finding::warning(
        &at,
        rule::GIT_BEHIND_ROLLBACK,
        match (&restored, &refused) {
            (_, Some((bad, why))) => format!(
                "{how} and the status says the operator restored {}, which is not a valid spec.version ({why}); no fix is suggested. Check the status file, then set spec.version to the version the cluster serves",
                crate::text::quote(bad)
            ),
            (Some(restored), None) => format!(
                "{how} and the operator restored {restored:?}; Git still asks for {version:?}. Set spec.version to {restored:?} (line {}) so Git agrees with the cluster",
                at.line.unwrap_or(0)
            ),
            (None, None) => format!(
                "{how} and the operator rolled back; Git still asks for {version:?}. Set spec.version to the version the cluster serves"
            ),
        },
    )
    .resource(change.display())
    .field("spec.version");
    if let Some(restored) = restored {
        finding = finding
            .fix(format!("version: {}", yaml_scalar(&restored)))
            .edit(edit(facts.doc, &["spec", "version"], Action::Set(restored)));
    }
    findings.push(finding);
}

/// Why `validate` refuses `doc` with `spec.version` set to `version`, if
/// it does for that field.
fn invalid_version(doc: &Document, version: &str) -> Option<String> {
    let mut candidate = doc.value.clone();
    candidate.pointer_mut("/spec")?.as_object_mut()?.insert(
        "version".into(),
        serde_json::Value::String(version.to_owned()),
    );
    let errors = api::validate(&candidate, None).err()?;
    errors
        .into_iter()
        .find(|e| e.path == "spec.version")
        .map(|e| e.message)
}

/// An edit of `doc` at `path`.
fn edit(doc: &Document, path: &[&str], action: Action) -> Edit {
    Edit {
        document: doc.index,
        path: path.iter().map(|k| k.to_string()).collect(),
        action,
    }
}

/// Hygiene: a version pointer that can move under the same name.
fn mutable_version(facts: &Facts, findings: &mut Vec<Finding>) {
    let Some(version) = facts.version else {
        return;
    };
    let Some(moving) = moving_revision(version) else {
        return;
    };
    findings.push(
        Finding::warning(
            &facts.doc.at("spec.version"),
            rule::MUTABLE_VERSION,
            format!(
                "{version:?} names {moving:?}, which can move: pods restarted later may load another model than the one rolled out, and a rollback cannot bring the old one back; pin an immutable version: a model id of its own per version (as OpenMed/synthetic-pii-v2); the OpenMed service refuses revisions and digests (@, :) in a pointer"
            ),
        )
        .resource(facts.key.to_string())
        .field("spec.version"),
    );
}

/// Hygiene: a pointer the OpenMed service itself refuses, unless it is a
/// path inside the image, makes every new pod exit at start.
fn service_model_id(facts: &Facts, findings: &mut Vec<Finding>) {
    let Some(version) = facts.version else {
        return;
    };
    if api::rules::is_service_model_id(version) {
        return;
    }
    if let Some(message) = api::rules::version_refusal(version) {
        findings.push(
            Finding::error(
                &facts.doc.at("spec.version"),
                rule::NOT_A_SERVICE_MODEL_ID,
                message,
            )
            .resource(facts.key.to_string())
            .field("spec.version"),
        );
        return;
    }
    findings.push(
        Finding::warning(
            &facts.doc.at("spec.version"),
            rule::NOT_A_SERVICE_MODEL_ID,
            format!(
                "the OpenMed service accepts a model id of the form `model` or `org/model` (letters, digits, '.', '_', '-'), or a path that exists in its pod; {} is not an id, so unless it is such a path every new pod exits at start and the rollout fails",
                crate::text::quote(version)
            ),
        )
        .resource(facts.key.to_string())
        .field("spec.version"),
    );
}

/// With `spec.autoscaling`, what the spec says that the autoscaler
/// overrides: `spec.replicas`, never written, and a rolling update that
/// may take pods away below the count the autoscaler asked for.
fn autoscaled(facts: &Facts, model: &manifests::Model, findings: &mut Vec<Finding>) {
    let Some(asked) = &model.autoscaling else {
        return;
    };
    let name = match asked.keda {
        Some(_) => crate::plan::autoscaler::keda_autoscaler_name(&model.id),
        None => crate::plan::autoscaler::autoscaler_name(&model.id),
    };
    if let Some(replicas) = facts.spec().and_then(|s| s.get("replicas")) {
        findings.push(
            Finding::warning(
                &facts.doc.at("spec.replicas"),
                rule::REPLICAS_BESIDE_AUTOSCALING,
                format!(
                    "spec.replicas ({replicas}) is not written while spec.autoscaling is set: HorizontalPodAutoscaler {name} owns the count, starting from the Deployment's own and kept within minReplicas and maxReplicas; remove spec.replicas, or keep it as the count to return to if spec.autoscaling is removed"
                ),
            )
            .resource(facts.key.to_string())
            .field("spec.replicas"),
        );
    }
    let strategy = &model.plan.normalized.rollout_strategy;
    let takes_pods = match &strategy.max_unavailable {
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n) => *n > 0,
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(p) => p != "0%",
    };
    if strategy.type_ == api::StrategyType::Recreate || takes_pods {
        let (field, how) = if strategy.type_ == api::StrategyType::Recreate {
            (
                "spec.rolloutStrategy.type",
                "Recreate stops every pod first",
            )
        } else {
            (
                "spec.rolloutStrategy.maxUnavailable",
                "maxUnavailable above 0 lets it take pods away",
            )
        };
        findings.push(
            Finding::warning(
                &facts.doc.at(field),
                rule::AUTOSCALED_ROLLOUT_DROPS_PODS,
                format!(
                    "a rollout of this autoscaled model may serve with fewer ready pods than HorizontalPodAutoscaler {name} asked for: {how}; with RollingUpdate and maxUnavailable 0 (the default) it surges above the count instead"
                ),
            )
            .resource(facts.key.to_string())
            .field(field),
        );
    }
}

/// `spec.qualityGate.configMapRef` names a ConfigMap of the tree, in the
/// resource's namespace, whose `probes.yaml` the operator can read: else
/// every new pod would wait, unready, for a judgement that never comes.
/// Problems inside the probe set point at their own line.
fn quality_gate_probes(facts: &Facts, docs: &[Document], ns: &str, findings: &mut Vec<Finding>) {
    // The gate of plain rollouts, and the canary's probes analysis.
    for field in [
        "spec.qualityGate.configMapRef.name",
        "spec.canary.analysis.probes.configMapRef.name",
    ] {
        let pointer = format!("/{}", field.replace('.', "/"));
        if let Some(name) = facts.doc.value.pointer(&pointer).and_then(Value::as_str) {
            probe_set_in_tree(facts, docs, ns, field, name, findings);
        }
    }
}

/// The probe set `name` (named at `field`) is in the tree and reads.
fn probe_set_in_tree(
    facts: &Facts,
    docs: &[Document],
    ns: &str,
    field: &str,
    name: &str,
    findings: &mut Vec<Finding>,
) {
    use crate::api::quality::{PROBE_SET_KEY, parse_probe_set};
    let here = facts.key.namespace.as_str();
    let finding = |at: &crate::source::Location, field: &str, message: String| {
        Finding::error(at, rule::QUALITY_GATE_PROBES, message)
            .resource(facts.key.to_string())
            .field(field)
    };
    let found = docs.iter().find(|d| {
        d.kind() == Some("ConfigMap")
            && d.api_version() == Some("v1")
            && d.name() == Some(name)
            && manifests::namespace_of(d, ns) == here
    });
    let Some(cm) = found else {
        findings.push(finding(
            &facts.doc.at(field),
            field,
            format!(
                "ConfigMap {} (the probe set) is not in the tree in namespace {here}; add it beside the OpenMedModel, or every new pod waits unready for a judgement that never comes",
                crate::text::quote(name)
            ),
        ));
        return;
    };
    let key_path = format!("data.{PROBE_SET_KEY}");
    let Some(text) = cm
        .value
        .pointer(&format!("/data/{PROBE_SET_KEY}"))
        .and_then(Value::as_str)
    else {
        findings.push(finding(
            &cm.at("data"),
            &key_path,
            format!(
                "ConfigMap {} has no key {PROBE_SET_KEY}: the probe set (docs/quality.md)",
                crate::text::quote(name)
            ),
        ));
        return;
    };
    // The probe set's lines sit below the key's line (a block scalar).
    let base = cm.line_of(&key_path);
    let inner_at = |line: usize| crate::source::Location {
        line: (base > 0).then_some(base + line.max(1)),
        ..cm.at(&key_path)
    };
    match crate::source::parse_stream(&cm.origin, text) {
        Err(e) => findings.push(finding(
            &cm.at(&key_path),
            &key_path,
            format!("the probe set is not YAML: {e}"),
        )),
        Ok(inner) if inner.len() != 1 => findings.push(finding(
            &cm.at(&key_path),
            &key_path,
            format!("the probe set holds {} documents, not one", inner.len()),
        )),
        Ok(inner) => match parse_probe_set(&inner[0].value) {
            Err(errors) => {
                for e in errors {
                    let at = inner_at(inner[0].line_of(&e.path));
                    let path = if e.path.is_empty() {
                        key_path.clone()
                    } else {
                        format!("{key_path}: {}", e.path)
                    };
                    findings.push(finding(&at, &path, format!("probe set: {e}")));
                }
            }
            Ok(set) => bounds_match_labels(facts, field, name, &set, findings),
        },
    }
}

/// Every `minRecall` key of the gate whose probe set `name` (named at
/// `field`) reads matches one of its labels, the wildcard aside: a key
/// that matches none bounds nothing, and the operator refuses the spec.
fn bounds_match_labels(
    facts: &Facts,
    field: &str,
    name: &str,
    set: &crate::api::quality::ProbeSet,
    findings: &mut Vec<Finding>,
) {
    use crate::rollout::quality::{unmatched_keys, unmatched_message};
    let gate_path = field.trim_end_matches(".configMapRef.name");
    let pointer = format!("/{}", gate_path.replace('.', "/"));
    let Some(gate) = facts
        .doc
        .value
        .pointer(&pointer)
        .and_then(|g| serde_json::from_value::<api::QualityGate>(g.clone()).ok())
    else {
        return; // validation says why
    };
    for key in unmatched_keys(&gate, set) {
        let path = format!("{gate_path}.minRecall.{key}");
        findings.push(
            Finding::error(
                &facts.doc.at(&path),
                rule::QUALITY_GATE_LABEL,
                format!(
                    "minRecall key {} {}",
                    crate::text::quote(key),
                    unmatched_message(name, set)
                ),
            )
            .resource(facts.key.to_string())
            .field(path),
        );
    }
}

/// A gated resource whose target is in the tree: its container tells the
/// gate where the service listens (a port, or an httpGet probe's), as the
/// operator reads it; else every rollout would be refused until it does.
fn quality_gate_port(
    facts: &Facts,
    model: &manifests::Model,
    docs: &[Document],
    findings: &mut Vec<Finding>,
) {
    let Some(target_doc) = model.target_doc.and_then(|i| docs.get(i)) else {
        return;
    };
    if !model.plan.deployment.quality_gate {
        return;
    }
    let Ok(target) =
        serde_json::from_value::<k8s_openapi::api::apps::v1::Deployment>(target_doc.value.clone())
    else {
        return;
    };
    let container = &model.plan.deployment.container;
    if crate::rollout::quality::service_port(&target, container).is_some() {
        return;
    }
    let index = target
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.containers.iter().position(|c| &c.name == container));
    let Some(index) = index else {
        return; // ContainerNotFound says so
    };
    let field = format!("spec.template.spec.containers[{index}]");
    findings.push(
        Finding::warning(
            &target_doc.at(&field),
            rule::QUALITY_GATE_PORT,
            crate::rollout::quality::port_unknown(&target, container),
        )
        .resource(facts.key.to_string())
        .field(field),
    );
}

/// A target in the tree that lists its served set: as Git holds it, it
/// must list the version (else the operator refuses the rollout) and
/// should list the version the cluster runs (else clients naming it are
/// refused while pods roll). A set `render` wrote lists both.
fn served_set(
    facts: &Facts,
    model: &manifests::Model,
    docs: &[Document],
    status: Option<&OpenMedModelStatus>,
    findings: &mut Vec<Finding>,
) {
    use crate::plan::served;
    let Some(target_doc) = model.target_doc.and_then(|i| docs.get(i)) else {
        return;
    };
    let container = &model.plan.deployment.container;
    let Some(served::Declared::Listed(entries)) = served::declared(&target_doc.value, container)
    else {
        return;
    };
    let field = served::entry_path(&target_doc.value, container).unwrap_or_default();
    let version = &model.plan.normalized.version;
    let name = target_doc.name().unwrap_or("<unnamed>");
    if served::is_served_name(version) && !entries.contains(version) {
        findings.push(
            Finding::error(
                &target_doc.at(&field),
                rule::SERVED_SET_LACKS_VERSION,
                format!(
                    "Deployment {name} lists its served set ({}) without {version}: its new pods would refuse every request naming it, and the operator refuses the rollout. Add {version} to it, or run `openmed-op render`, which writes it",
                    crate::api::names::SERVED_ENV
                ),
            )
            .resource(facts.key.to_string())
            .field(field.clone())
            .fix(format!(
                "{}: {version},{}",
                crate::api::names::SERVED_ENV,
                entries.join(",")
            )),
        );
    }
    let running = status.and_then(|s| s.active_version.as_ref());
    if let Some(running) = running
        && running != version
        && served::is_served_name(running)
        && !entries.contains(running)
    {
        findings.push(
            Finding::warning(
                &target_doc.at(&field),
                rule::SERVED_SET_DROPS_RUNNING,
                format!(
                    "Deployment {name} lists its served set without {running}, the version the cluster serves now: while pods roll, every new pod refuses clients still naming it. Keep {running} in the set until clients have moved"
                ),
            )
            .resource(facts.key.to_string())
            .field(field),
        );
    }
}

/// Revision names that usually move: tags and branch names.
const MOVING_NAMES: &[&str] = &[
    "latest", "main", "master", "head", "trunk", "dev", "develop", "stable", "nightly", "edge",
    "canary",
];

/// The moving revision a version pointer names, if it names one: the part
/// after the last `@` or `:` of its last path segment (`OpenMed/pii:latest`,
/// `OpenMed/pii@main`), or the whole pointer when it is a bare branch name.
pub fn moving_revision(version: &str) -> Option<&str> {
    let last = version.rsplit('/').next().unwrap_or(version);
    let revision = match last.rsplit_once(['@', ':']) {
        Some((_, revision)) => revision,
        None if !version.contains('/') => version,
        None => return None,
    };
    MOVING_NAMES
        .iter()
        .any(|m| revision.eq_ignore_ascii_case(m))
        .then_some(revision)
}

/// Hygiene: a change of target releases the old one.
fn target_changed(change: &Change, findings: &mut Vec<Finding>) {
    let (Some(base), Some((rev_spec, _))) = (change.base, change.rev_plan) else {
        return;
    };
    if base.spec() == change.rev.spec() {
        return;
    }
    let Some((base_spec, _)) = normalized(base.doc) else {
        return;
    };
    if base_spec.target_ref == rev_spec.target_ref {
        return;
    }
    let describe = |s: &OpenMedModelSpec| {
        format!(
            "{}/{}",
            s.target_ref.name.as_deref().unwrap_or("?"),
            s.target_ref.container_name
        )
    };
    findings.push(
        Finding::warning(
            &change.rev.doc.at("spec.targetRef"),
            rule::TARGET_CHANGED,
            format!(
                "the target moves from {} to {} (Deployment/container): the operator releases the old Deployment, whose pods restart without a preloaded model",
                describe(&base_spec),
                describe(rev_spec)
            ),
        )
        .resource(change.display())
        .field("spec.targetRef"),
    );
}

/// Hygiene: deleting an OpenMedModel releases its target.
fn deleted(facts: &Facts) -> Finding {
    let target = facts
        .spec()
        .and_then(|s| s.pointer("/targetRef/name"))
        .and_then(Value::as_str)
        .unwrap_or(&facts.key.name);
    Finding::warning(
        &facts.doc.at("metadata.name"),
        rule::MODEL_DELETED,
        format!(
            "this OpenMedModel is deleted (it was here at BASE, and is in no file at REV): the operator releases Deployment {target}, whose pods restart without a preloaded model"
        ),
    )
    .resource(facts.key.to_string())
}

fn quoted_list(values: &[String]) -> String {
    let quoted: Vec<String> = values.iter().map(|v| format!("{v:?}")).collect();
    quoted.join(" or ")
}

/// `value` as a YAML scalar, quoted only when YAML needs it.
fn yaml_scalar(value: &str) -> String {
    crate::source::yaml::write::inline_scalar(&serde_json::Value::String(value.to_owned()))
}
