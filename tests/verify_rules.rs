//! The rules of `verify` on plain data: each rule accepted and rejected,
//! without a repository (the Git shell is tested in `tests/verify.rs`).

use std::collections::HashMap;

use openmed_op::api::{OpenMedModelSpec, OpenMedModelStatus, Phase};
use openmed_op::findings::{Finding, Severity};
use openmed_op::source::{Document, parse_stream};
use openmed_op::verify::rules::{
    self, ClusterStatus, HistoryVersions, Input, Outcome, ResourceKey, RetainedSource, rule,
};
use serde_json::json;

/// An OpenMedModel in namespace `team`, as YAML.
#[derive(Clone)]
struct Model {
    name: String,
    version: String,
    annotations: Vec<(String, String)>,
    extra: String,
}

fn model(name: &str, version: &str) -> Model {
    Model {
        name: name.into(),
        version: version.into(),
        annotations: Vec::new(),
        extra: String::new(),
    }
}

impl Model {
    fn annotate(mut self, key: &str, value: &str) -> Self {
        self.annotations.push((key.into(), value.into()));
        self
    }

    /// Extra lines inside `spec`, indented by two spaces.
    fn spec(mut self, lines: &str) -> Self {
        self.extra.push_str(lines);
        self
    }

    fn rollback_to(self, version: &str) -> Self {
        self.annotate("openmed.ai/rollback-to", version)
    }

    fn retry_reason(self, why: &str) -> Self {
        self.annotate("openmed.ai/retry-reason", why)
    }

    fn yaml(&self) -> String {
        let mut out = format!(
            "apiVersion: openmed.ai/v1alpha1\nkind: OpenMedModel\nmetadata:\n  name: {}\n  namespace: team\n",
            self.name
        );
        if !self.annotations.is_empty() {
            out.push_str("  annotations:\n");
            for (k, v) in &self.annotations {
                out.push_str(&format!("    {k}: {v:?}\n"));
            }
        }
        out.push_str(&format!(
            "spec:\n  family: pii\n  tier: Small\n  version: {}\n{}",
            self.version, self.extra
        ));
        out
    }
}

fn file(path: &str, models: &[&Model]) -> Vec<Document> {
    let text: Vec<String> = models.iter().map(|m| m.yaml()).collect();
    parse_stream(path, &text.join("---\n")).unwrap()
}

fn key(name: &str) -> ResourceKey {
    ResourceKey {
        namespace: "team".into(),
        name: name.into(),
    }
}

fn spec(version: &str) -> OpenMedModelSpec {
    serde_json::from_value(json!({"family": "pii", "tier": "Small", "version": version})).unwrap()
}

/// Judges REV against BASE with history and optional status.
struct Case {
    rev: Vec<Document>,
    base: Option<Vec<Document>>,
    history: HistoryVersions,
    status: Option<ClusterStatus>,
    strict: bool,
}

fn case(rev: Vec<Document>) -> Case {
    Case {
        rev,
        base: None,
        history: HashMap::new(),
        status: None,
        strict: false,
    }
}

impl Case {
    fn base(mut self, docs: Vec<Document>) -> Self {
        self.base = Some(docs);
        self
    }

    fn history(mut self, name: &str, versions: &[&str]) -> Self {
        self.history
            .insert(key(name), versions.iter().map(|v| v.to_string()).collect());
        self
    }

    fn status(mut self, name: &str, status: OpenMedModelStatus) -> Self {
        self.status
            .get_or_insert_with(HashMap::new)
            .insert(key(name), status);
        self
    }

    fn strict(mut self) -> Self {
        self.strict = true;
        self
    }

    fn check(&self) -> Outcome {
        rules::check(&Input {
            rev: &self.rev,
            base: self.base.as_deref(),
            history: &self.history,
            status: self.status.as_ref(),
            default_namespace: "default",
            strict: self.strict,
        })
    }

    fn findings(&self) -> Vec<Finding> {
        self.check().findings
    }
}

fn with_rule<'a>(findings: &'a [Finding], id: &str) -> Vec<&'a Finding> {
    findings.iter().filter(|f| f.rule == id).collect()
}

/// The one finding of rule `id`.
fn only<'a>(findings: &'a [Finding], id: &str) -> &'a Finding {
    let found = with_rule(findings, id);
    assert_eq!(found.len(), 1, "{findings:#?}");
    found[0]
}

fn none(findings: &[Finding], id: &str) {
    assert!(with_rule(findings, id).is_empty(), "{findings:#?}");
}

fn retained(last: &str, previous: Option<&str>) -> OpenMedModelStatus {
    OpenMedModelStatus {
        phase: Some(Phase::Ready),
        last_successful_spec: Some(spec(last)),
        previous_successful_spec: previous.map(spec),
        ..Default::default()
    }
}

// Rule 1 -------------------------------------------------------------------

#[test]
fn an_invalid_resource_is_reported_with_file_document_line_and_field() {
    let bad = model("svc", "v2").spec("  tier: Huge\n");
    let ok = model("other", "v1");
    let text = format!(
        "{}---\n{}",
        ok.yaml(),
        bad.yaml().replace("  tier: Small\n", "")
    );
    let rev = parse_stream("models/all.yaml", &text).unwrap();
    let findings = case(rev).findings();
    let f = only(&findings, "InvalidSpec");
    assert_eq!(f.location.file, "models/all.yaml");
    assert_eq!(f.location.document, 2);
    assert_eq!(f.location.line, Some(19));
    assert_eq!(f.field.as_deref(), Some("spec.tier"));
    assert_eq!(f.severity, Severity::Error);
}

#[test]
fn a_valid_resource_has_no_finding() {
    let outcome = case(file("a.yaml", &[&model("svc", "OpenMed/pii-v1")])).check();
    assert!(outcome.findings.is_empty(), "{:#?}", outcome.findings);
    assert_eq!(outcome.resources.len(), 1);
    assert_eq!(outcome.resources[0].resource, "team/svc");
}

// Rule 2 -------------------------------------------------------------------

#[test]
fn two_resources_for_one_deployment_conflict_across_files() {
    let mut rev = file(
        "a.yaml",
        &[&model("a", "v1").spec("  targetRef:\n    name: svc\n")],
    );
    rev.extend(file(
        "b.yaml",
        &[&model("b", "v1").spec("  targetRef:\n    name: svc\n")],
    ));
    let findings = case(rev).findings();
    let f = only(&findings, "TargetConflict");
    assert_eq!(f.location.file, "b.yaml");
    assert!(
        f.message
            .contains("already claimed by OpenMedModel a at a.yaml")
    );
}

#[test]
fn resources_with_their_own_targets_do_not_conflict() {
    let mut rev = file("a.yaml", &[&model("a", "v1")]);
    rev.extend(file("b.yaml", &[&model("b", "v1")]));
    assert!(case(rev).findings().is_empty());
}

// Rule 3 -------------------------------------------------------------------

#[test]
fn a_rollback_to_a_history_derived_version_is_accepted() {
    let base = file("a.yaml", &[&model("svc", "v2")]);
    let rev = file("a.yaml", &[&model("svc", "v2").rollback_to("v1")]);
    let outcome = case(rev).base(base).history("svc", &["v2", "v1"]).check();
    assert!(outcome.findings.is_empty(), "{:#?}", outcome.findings);
    let r = &outcome.resources[0];
    assert_eq!(r.retained_versions, ["v2", "v1"]);
    assert_eq!(r.retained_versions_source, RetainedSource::History);
    assert_eq!(r.rollback_to.as_deref(), Some("v1"));
}

#[test]
fn a_rollback_to_a_version_not_retained_is_an_error_that_says_where_versions_come_from() {
    let base = file("a.yaml", &[&model("svc", "v2")]);
    let rev = file("a.yaml", &[&model("svc", "v2").rollback_to("v0")]);
    let findings = case(rev)
        .base(base)
        .history("svc", &["v2", "v1"])
        .findings();
    let f = only(&findings, rule::ROLLBACK_NOT_RETAINED);
    assert_eq!(f.severity, Severity::Error);
    assert_eq!(f.location.line, Some(7), "the annotation's line");
    assert!(
        f.message.contains("\"v0\" is not a retained version"),
        "{}",
        f.message
    );
    assert!(f.message.contains("\"v2\" or \"v1\""), "{}", f.message);
    assert!(f.message.contains("history-derived"), "{}", f.message);
    assert_eq!(f.fix.as_deref(), Some("openmed.ai/rollback-to: v1"));
}

#[test]
fn with_status_the_cluster_decides_which_versions_are_retained() {
    let base = file("a.yaml", &[&model("svc", "v3")]);
    // History knows v1, but the cluster retains v3 and v2 only.
    let rev = file("a.yaml", &[&model("svc", "v3").rollback_to("v1")]);
    let c = case(rev)
        .base(base.clone())
        .history("svc", &["v3", "v1"])
        .status("svc", retained("v3", Some("v2")));
    let outcome = c.check();
    let f = only(&outcome.findings, rule::ROLLBACK_NOT_RETAINED);
    assert!(f.message.contains("cluster's status"), "{}", f.message);
    assert!(!f.message.contains("history-derived"), "{}", f.message);
    assert_eq!(
        outcome.resources[0].retained_versions_source,
        RetainedSource::Status
    );

    let rev = file("a.yaml", &[&model("svc", "v3").rollback_to("v2")]);
    let findings = case(rev)
        .base(base)
        .status("svc", retained("v3", Some("v2")))
        .findings();
    assert!(findings.is_empty(), "{findings:#?}");
}

#[test]
fn a_rollback_with_nothing_retained_says_so() {
    let rev = file("a.yaml", &[&model("svc", "v2").rollback_to("v1")]);
    let findings = case(rev).findings();
    let f = only(&findings, rule::ROLLBACK_NOT_RETAINED);
    assert!(f.message.contains("retains no version"), "{}", f.message);
    assert_eq!(f.fix, None);
}

// Rule 4 -------------------------------------------------------------------

#[test]
fn a_version_bump_with_a_rollback_in_one_change_is_an_error() {
    let base = file("a.yaml", &[&model("svc", "v2")]);
    let rev = file("a.yaml", &[&model("svc", "v3").rollback_to("v1")]);
    let findings = case(rev)
        .base(base)
        .history("svc", &["v2", "v1"])
        .findings();
    let f = only(&findings, rule::ONE_INTENT_PER_CHANGE);
    assert!(f.message.contains("v2 -> v3"), "{}", f.message);
    assert_eq!(f.severity, Severity::Error);
}

#[test]
fn a_bump_alone_and_a_rollback_alone_are_each_one_intent() {
    let base = file("a.yaml", &[&model("svc", "v2")]);
    let bump = file("a.yaml", &[&model("svc", "v3")]);
    none(
        &case(bump).base(base.clone()).findings(),
        rule::ONE_INTENT_PER_CHANGE,
    );
    let rollback = file("a.yaml", &[&model("svc", "v2").rollback_to("v1")]);
    let findings = case(rollback)
        .base(base)
        .history("svc", &["v2", "v1"])
        .findings();
    assert!(findings.is_empty(), "{findings:#?}");
    // A bump while an older rollback annotation stays is not a new rollback.
    let base = file("a.yaml", &[&model("svc", "v2").rollback_to("v1")]);
    let rev = file("a.yaml", &[&model("svc", "v3").rollback_to("v1")]);
    none(
        &case(rev)
            .base(base)
            .history("svc", &["v2", "v1"])
            .findings(),
        rule::ONE_INTENT_PER_CHANGE,
    );
}

// Rule 5 -------------------------------------------------------------------

fn rolled_back_from(failed: &str, restored: &str) -> OpenMedModelStatus {
    OpenMedModelStatus {
        phase: Some(Phase::RolledBack),
        desired_version: Some(failed.into()),
        active_version: Some(restored.into()),
        last_successful_spec: Some(spec(restored)),
        rollback_spec: Some(spec(restored)),
        ..Default::default()
    }
}

#[test]
fn pointing_at_a_failed_version_again_is_an_error() {
    let base = file("a.yaml", &[&model("svc", "v2")]);
    let rev = file("a.yaml", &[&model("svc", "v3")]);
    let findings = case(rev)
        .base(base)
        .status("svc", rolled_back_from("v3", "v2"))
        .findings();
    let f = only(&findings, rule::FAILED_VERSION_RETRIED);
    assert!(f.message.contains("phase RolledBack"), "{}", f.message);
    assert!(
        f.message.contains("openmed.ai/retry-reason"),
        "{}",
        f.message
    );
    none(&findings, rule::GIT_BEHIND_ROLLBACK);
}

#[test]
fn a_failed_version_may_be_tried_again_with_a_new_reason() {
    let base = file("a.yaml", &[&model("svc", "v2")]);
    let rev = file(
        "a.yaml",
        &[&model("svc", "v3").retry_reason("nodes now have 64 GiB")],
    );
    let findings = case(rev)
        .base(base)
        .status("svc", rolled_back_from("v3", "v2"))
        .findings();
    assert!(findings.is_empty(), "{findings:#?}");
}

#[test]
fn a_reason_left_from_an_earlier_retry_does_not_count() {
    let base = file("a.yaml", &[&model("svc", "v2").retry_reason("old")]);
    let rev = file("a.yaml", &[&model("svc", "v3").retry_reason("old")]);
    let findings = case(rev)
        .base(base)
        .status("svc", rolled_back_from("v3", "v2"))
        .findings();
    let f = only(&findings, rule::FAILED_VERSION_RETRIED);
    assert!(f.message.contains("unchanged since BASE"), "{}", f.message);
}

#[test]
fn a_failed_spec_is_recognised_by_its_hash() {
    let failed = model("svc", "v3").spec("  replicas: 4\n");
    let rev = file("a.yaml", &[&failed]);
    let hash = {
        let spec = openmed_op::api::validate(&rev[0].value, None).unwrap();
        openmed_op::plan::spec_hash(&openmed_op::plan::normalize("svc", &spec))
    };
    let status = OpenMedModelStatus {
        phase: Some(Phase::Ready),
        failed_spec_hash: Some(hash),
        ..Default::default()
    };
    let base = file("a.yaml", &[&model("svc", "v3")]);
    let findings = case(rev.clone())
        .base(base)
        .status("svc", status.clone())
        .findings();
    let f = only(&findings, rule::FAILED_VERSION_RETRIED);
    assert!(f.message.contains("failedSpecHash"), "{}", f.message);

    // Another spec with the same version is not the failed one.
    let other = file("a.yaml", &[&model("svc", "v3").spec("  replicas: 5\n")]);
    none(
        &case(other).base(rev).status("svc", status).findings(),
        rule::FAILED_VERSION_RETRIED,
    );
}

#[test]
fn versions_that_did_not_fail_are_not_retries() {
    let base = file("a.yaml", &[&model("svc", "v2")]);
    let rev = file("a.yaml", &[&model("svc", "v4")]);
    let findings = case(rev)
        .base(base)
        .status("svc", rolled_back_from("v3", "v2"))
        .findings();
    assert!(findings.is_empty(), "{findings:#?}");
}

// Rule 6 -------------------------------------------------------------------

#[test]
fn a_rollback_annotation_already_carried_out_is_a_warning_with_its_line() {
    let base = file("a.yaml", &[&model("svc", "v1").rollback_to("v1")]);
    let rev = file("a.yaml", &[&model("svc", "v1").rollback_to("v1")]);
    let findings = case(rev).base(base).findings();
    let f = only(&findings, rule::STALE_ROLLBACK_ANNOTATION);
    assert_eq!(f.severity, Severity::Warning);
    assert_eq!(
        f.fix.as_deref(),
        Some("delete line 7 (openmed.ai/rollback-to: v1)")
    );
    none(&findings, rule::ROLLBACK_NOT_RETAINED);
}

#[test]
fn a_deleted_resource_is_a_warning_but_a_moved_one_is_not() {
    let base = file("old.yaml", &[&model("svc", "v1"), &model("gone", "v1")]);
    let rev = file("new/place.yaml", &[&model("svc", "v1")]);
    let findings = case(rev).base(base).findings();
    let f = only(&findings, rule::MODEL_DELETED);
    assert_eq!(f.resource.as_deref(), Some("team/gone"));
    assert_eq!(f.location.file, "old.yaml");
    assert_eq!(f.location.document, 2);
    assert!(
        f.message.contains("without a preloaded model"),
        "{}",
        f.message
    );
}

#[test]
fn a_moving_version_is_a_warning_and_a_pinned_one_is_not() {
    for moving in [
        "OpenMed/pii:latest",
        "OpenMed/pii@main",
        "hf.co/OpenMed/pii@master",
        "main",
    ] {
        let findings = case(file("a.yaml", &[&model("svc", moving)])).findings();
        let f = only(&findings, rule::MUTABLE_VERSION);
        assert_eq!(f.severity, Severity::Warning);
        assert_eq!(f.location.line, Some(9));
    }
    for pinned in [
        "OpenMed/pii-v2",
        "OpenMed/pii@5f3c2a1",
        "hf.co/OpenMed/pii@sha256:0123abcd",
        "OpenMed/main-model",
    ] {
        let findings = case(file("a.yaml", &[&model("svc", pinned)])).findings();
        assert!(
            findings.iter().all(|f| f.rule != rule::MUTABLE_VERSION),
            "{pinned}"
        );
    }
    assert_eq!(rules::moving_revision("OpenMed/x:Latest"), Some("Latest"));
    assert_eq!(rules::moving_revision("OpenMed/x@v1.2"), None);
}

/// Each row was run through the OpenMed service's own
/// `validate_model_name` (3.1.0); `tests/workload.rs` holds the two to the
/// same answers on a real install.
#[test]
fn a_pointer_the_service_refuses_is_an_error_and_a_path_a_warning() {
    // A revision or digest: never a model id, an error.
    for refused in [
        "OpenMed/pii:v2",
        "org/model@main",
        "hf.co/OpenMed/pii@sha256:0123abcd",
        "OpenMed/pii+local",
        "OpenMed/pii~1",
    ] {
        let findings = case(file("a.yaml", &[&model("svc", refused)])).findings();
        let f = findings
            .iter()
            .find(|f| f.rule == rule::NOT_A_SERVICE_MODEL_ID)
            .unwrap_or_else(|| panic!("{refused}: {findings:?}"));
        assert_eq!(f.severity, Severity::Error, "{refused}");
        assert_eq!(f.location.line, Some(9));
        assert!(f.message.contains("`org/model`"), "{}", f.message);
    }
    // Not an id, but perhaps a path in the pod: a warning.
    let findings = case(file("a.yaml", &[&model("svc", "a/b/c")])).findings();
    let f = only(&findings, rule::NOT_A_SERVICE_MODEL_ID);
    assert_eq!(f.severity, Severity::Warning);
    assert!(f.message.contains("`org/model`"), "{}", f.message);
    for accepted in [
        "OpenMed/pii-v2",
        "pii",
        "OpenMed/synthetic_pii.v1",
        "a-b/c.d_e",
    ] {
        let findings = case(file("a.yaml", &[&model("svc", accepted)])).findings();
        assert!(findings.is_empty(), "{accepted}: {findings:?}");
    }
}

#[test]
fn a_new_target_is_a_warning_and_an_explicit_default_is_not_a_change() {
    let base = file("a.yaml", &[&model("svc", "v1")]);
    let moved = file(
        "a.yaml",
        &[&model("svc", "v1").spec("  targetRef:\n    name: other\n")],
    );
    let findings = case(moved).base(base.clone()).findings();
    let f = only(&findings, rule::TARGET_CHANGED);
    assert!(
        f.message
            .contains("from svc/openmed-service to other/openmed-service")
    );

    let same = file(
        "a.yaml",
        &[&model("svc", "v1")
            .spec("  targetRef:\n    name: svc\n    containerName: openmed-service\n")],
    );
    assert!(case(same).base(base).findings().is_empty());
}

#[test]
fn strict_turns_warnings_into_errors() {
    let findings = case(file("a.yaml", &[&model("svc", "OpenMed/pii:latest")]))
        .strict()
        .findings();
    assert_eq!(
        only(&findings, rule::MUTABLE_VERSION).severity,
        Severity::Error
    );
}

// Rule 7 -------------------------------------------------------------------

#[test]
fn after_an_automatic_rollback_git_gets_the_exact_line_to_agree() {
    let base = file("a.yaml", &[&model("svc", "v3")]);
    let rev = file("a.yaml", &[&model("svc", "v3")]);
    let findings = case(rev)
        .base(base)
        .status("svc", rolled_back_from("v3", "OpenMed/pii-v2"))
        .findings();
    let f = only(&findings, rule::GIT_BEHIND_ROLLBACK);
    assert_eq!(f.location.line, Some(9));
    assert_eq!(f.fix.as_deref(), Some("version: OpenMed/pii-v2"));
    assert!(
        f.message.contains("restored \"OpenMed/pii-v2\""),
        "{}",
        f.message
    );
    none(&findings, rule::FAILED_VERSION_RETRIED);
}

#[test]
fn once_git_follows_the_rollback_there_is_nothing_to_say() {
    let base = file("a.yaml", &[&model("svc", "v3")]);
    let rev = file("a.yaml", &[&model("svc", "v2")]);
    let findings = case(rev)
        .base(base)
        .status("svc", rolled_back_from("v3", "v2"))
        .findings();
    assert!(findings.is_empty(), "{findings:#?}");
    // A failure that restored nothing (Failed) is not a rollback to follow.
    let failed = OpenMedModelStatus {
        phase: Some(Phase::Failed),
        desired_version: Some("v3".into()),
        ..Default::default()
    };
    let same = file("a.yaml", &[&model("svc", "v3")]);
    let findings = case(same.clone())
        .base(same)
        .status("svc", failed)
        .findings();
    assert!(findings.is_empty(), "{findings:#?}");
}

#[test]
fn the_rules_read_other_kinds_and_invalid_yaml_values_without_failing() {
    let text = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n---\napiVersion: openmed.ai/v1alpha1\nkind: OpenMedModel\nmetadata:\n  name: svc\n  namespace: team\n  annotations:\n    openmed.ai/rollback-to: 2\nspec:\n  family: pii\n  tier: Small\n  version: 3\n";
    let rev = parse_stream("a.yaml", text).unwrap();
    let outcome = case(rev).check();
    assert_eq!(outcome.resources.len(), 1);
    assert!(
        !with_rule(&outcome.findings, "InvalidSpec").is_empty(),
        "{:#?}",
        outcome.findings
    );
    let f = only(&outcome.findings, rule::ROLLBACK_NOT_RETAINED);
    assert!(f.message.contains("\"2\""), "{}", f.message);
}

// The quality gate's probe set ---------------------------------------------

const PROBES: &str = "apiVersion: v1
kind: ConfigMap
metadata:
  name: pii-probes
  namespace: team
data:
  probes.yaml: |
    apiVersion: openmed.ai/v1alpha1
    kind: PIIProbeSet
    probes:
      - text: Patient John Smith
        entities:
          - {label: NAME, start: 8, end: 18}
";

fn gated() -> Model {
    model("svc", "OpenMed/pii-v1").spec("  qualityGate:\n    configMapRef: {name: pii-probes}\n")
}

#[test]
fn a_quality_gate_whose_probe_set_is_in_the_tree_and_reads_has_no_finding() {
    let text = format!("{}---\n{PROBES}", gated().yaml());
    let findings = case(parse_stream("m.yaml", &text).unwrap()).findings();
    none(&findings, rule::QUALITY_GATE_PROBES);
}

#[test]
fn a_quality_gate_whose_probe_set_is_missing_is_an_error_at_the_reference() {
    let findings = case(file("m.yaml", &[&gated()])).findings();
    let f = only(&findings, rule::QUALITY_GATE_PROBES);
    assert_eq!(f.severity, Severity::Error);
    assert_eq!(
        f.field.as_deref(),
        Some("spec.qualityGate.configMapRef.name")
    );
    assert_eq!(f.location.line, Some(11));
    assert!(
        f.message
            .contains("\"pii-probes\" (the probe set) is not in the tree in namespace team"),
        "{}",
        f.message
    );
    // One in another namespace is not the one.
    let elsewhere = PROBES.replace("namespace: team", "namespace: other");
    let text = format!("{}---\n{elsewhere}", gated().yaml());
    let findings = case(parse_stream("m.yaml", &text).unwrap()).findings();
    only(&findings, rule::QUALITY_GATE_PROBES);
    // The canary's probes analysis names a probe set the same way.
    let canary = model("svc", "OpenMed/pii-v1").spec(
        "  canary:\n    targetRef: {name: svc-canary}\n    trafficRef: {httpRoute: r, stableBackend: a, canaryBackend: b}\n    steps: [{weight: 10}]\n    analysis:\n      probes:\n        configMapRef: {name: elsewhere}\n",
    );
    let findings = case(file("m.yaml", &[&canary])).findings();
    let f = only(&findings, rule::QUALITY_GATE_PROBES);
    assert_eq!(
        f.field.as_deref(),
        Some("spec.canary.analysis.probes.configMapRef.name")
    );
}

#[test]
fn a_malformed_probe_set_is_an_error_at_its_own_line() {
    let bad = PROBES.replace("start: 8, end: 18", "start: 8, end: 80");
    let text = format!("{}---\n{bad}", gated().yaml());
    let findings = case(parse_stream("m.yaml", &text).unwrap()).findings();
    let f = only(&findings, rule::QUALITY_GATE_PROBES);
    assert_eq!(f.location.document, 2);
    // The entity's own line in the file (the ConfigMap starts at 13).
    let text_lines: Vec<&str> = text.lines().collect();
    assert_eq!(f.location.line, Some(25), "{f:#?}");
    assert!(text_lines[24].contains("end: 80"), "{}", text_lines[24]);
    assert_eq!(
        f.field.as_deref(),
        Some("data.probes.yaml: probes[0].entities[0]")
    );
    assert!(
        f.message
            .contains("span 8..80 is not inside the text's 18 characters"),
        "{}",
        f.message
    );
}

/// The Deployment `svc` in namespace `team` whose container
/// `openmed-service` has `container` as its further lines (indented by
/// ten spaces).
fn target(container: &str) -> String {
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata:
  name: svc
  namespace: team
spec:
  selector: {{matchLabels: {{app: svc}}}}
  template:
    metadata: {{labels: {{app: svc}}}}
    spec:
      containers:
        - name: openmed-service
          image: openmed
{container}"
    )
}

#[test]
fn a_gated_target_whose_container_has_no_port_is_a_warning_at_the_container() {
    let text = format!(
        "{}---\n{PROBES}---\n{}",
        gated().yaml(),
        target("          readinessProbe: {exec: {command: [\"true\"]}}\n")
    );
    let findings = case(parse_stream("m.yaml", &text).unwrap()).findings();
    let f = only(&findings, rule::QUALITY_GATE_PORT);
    assert_eq!(f.severity, Severity::Warning);
    assert_eq!(f.location.document, 3, "the Deployment, third");
    let lines: Vec<&str> = text.lines().collect();
    let line = f.location.line.expect("a line");
    assert!(
        lines[line - 1].contains("- name: openmed-service"),
        "{line}: {}",
        lines[line - 1]
    );
    assert_eq!(f.field.as_deref(), Some("spec.template.spec.containers[0]"));
    assert!(
        f.message.contains(
            "container openmed-service of Deployment svc declares no port, and no httpGet probe names one"
        ),
        "{}",
        f.message
    );
    // A declared port, or a probe's, is enough; without the gate nothing
    // is asked of the port.
    for container in [
        "          ports: [{containerPort: 8080}]\n",
        "          readinessProbe: {httpGet: {path: /readyz, port: 8080}}\n",
    ] {
        let text = format!("{}---\n{PROBES}---\n{}", gated().yaml(), target(container));
        none(
            &case(parse_stream("m.yaml", &text).unwrap()).findings(),
            rule::QUALITY_GATE_PORT,
        );
    }
    let text = format!(
        "{}---\n{}",
        model("svc", "OpenMed/pii-v1").yaml(),
        target("")
    );
    none(
        &case(parse_stream("m.yaml", &text).unwrap()).findings(),
        rule::QUALITY_GATE_PORT,
    );
}

#[test]
fn a_bound_on_a_label_the_probe_set_lacks_is_an_error_at_its_line() {
    let misspelled = model("svc", "OpenMed/pii-v1").spec(
        "  qualityGate:\n    configMapRef: {name: pii-probes}\n    minRecall:\n      NAMES: 1.0\n      \"*\": 0.5\n",
    );
    let text = format!("{}---\n{PROBES}", misspelled.yaml());
    let findings = case(parse_stream("m.yaml", &text).unwrap()).findings();
    let f = only(&findings, rule::QUALITY_GATE_LABEL);
    assert_eq!(f.severity, Severity::Error);
    assert_eq!(f.field.as_deref(), Some("spec.qualityGate.minRecall.NAMES"));
    let lines: Vec<&str> = text.lines().collect();
    let line = f.location.line.expect("a line");
    assert!(
        lines[line - 1].contains("NAMES: 1.0"),
        "{line}: {}",
        lines[line - 1]
    );
    assert!(
        f.message
            .contains("matches no label of the probe set (ConfigMap pii-probes: NAME)"),
        "{}",
        f.message
    );
    // The labels it has, and the wildcard, are bounds.
    let spelled = model("svc", "OpenMed/pii-v1").spec(
        "  qualityGate:\n    configMapRef: {name: pii-probes}\n    minRecall: {NAME: 1.0, \"*\": 0.5}\n",
    );
    let text = format!("{}---\n{PROBES}", spelled.yaml());
    none(
        &case(parse_stream("m.yaml", &text).unwrap()).findings(),
        rule::QUALITY_GATE_LABEL,
    );
}

// The served set -------------------------------------------------------------

/// `svc` at `version` beside its Deployment, whose container lists
/// `served` as its served set.
fn served_tree(version: &str, served: &str) -> String {
    format!(
        "{}---\n{}",
        model("svc", version).yaml(),
        target(&format!(
            "          env:\n            - name: OPENMED_SERVICE_SERVED_MODELS\n              value: {served}\n"
        ))
    )
}

#[test]
fn a_listed_served_set_without_the_version_is_an_error_at_its_entry() {
    let text = served_tree("OpenMed/pii-v2", "OpenMed/pii-v1,team/ner");
    let findings = case(parse_stream("m.yaml", &text).unwrap()).findings();
    let f = only(&findings, rule::SERVED_SET_LACKS_VERSION);
    assert_eq!(f.severity, Severity::Error);
    assert_eq!(f.location.document, 2, "the Deployment, second");
    let lines: Vec<&str> = text.lines().collect();
    let line = f.location.line.expect("a line");
    assert!(
        lines[line - 1].contains("OPENMED_SERVICE_SERVED_MODELS"),
        "{line}: {}",
        lines[line - 1]
    );
    assert_eq!(
        f.field.as_deref(),
        Some("spec.template.spec.containers[0].env[0]")
    );
    assert!(
        f.message.contains("without OpenMed/pii-v2"),
        "{}",
        f.message
    );
    // Listed, it is fine; so is no set at all (the operator writes it).
    let listed = served_tree("OpenMed/pii-v2", "OpenMed/pii-v2,OpenMed/pii-v1");
    none(
        &case(parse_stream("m.yaml", &listed).unwrap()).findings(),
        rule::SERVED_SET_LACKS_VERSION,
    );
    let absent = format!(
        "{}---\n{}",
        model("svc", "OpenMed/pii-v2").yaml(),
        target("")
    );
    none(
        &case(parse_stream("m.yaml", &absent).unwrap()).findings(),
        rule::SERVED_SET_LACKS_VERSION,
    );
}

#[test]
fn a_served_set_that_drops_the_running_version_is_a_warning_with_status() {
    let text = served_tree("OpenMed/pii-v2", "OpenMed/pii-v2");
    let mut status = retained("OpenMed/pii-v1", None);
    status.active_version = Some("OpenMed/pii-v1".into());
    let findings = case(parse_stream("m.yaml", &text).unwrap())
        .status("svc", status.clone())
        .findings();
    let f = only(&findings, rule::SERVED_SET_DROPS_RUNNING);
    assert_eq!(f.severity, Severity::Warning);
    assert!(
        f.message.contains("without OpenMed/pii-v1"),
        "{}",
        f.message
    );
    let kept = served_tree("OpenMed/pii-v2", "OpenMed/pii-v2,OpenMed/pii-v1");
    none(
        &case(parse_stream("m.yaml", &kept).unwrap())
            .status("svc", status)
            .findings(),
        rule::SERVED_SET_DROPS_RUNNING,
    );
}

#[test]
fn a_served_set_read_from_a_secret_is_an_error() {
    let text = format!(
        "{}---\n{}",
        model("svc", "OpenMed/pii-v2").yaml(),
        target(
            "          env:\n            - name: OPENMED_SERVICE_SERVED_MODELS\n              valueFrom: {secretKeyRef: {name: models, key: served}}\n"
        )
    );
    let findings = case(parse_stream("m.yaml", &text).unwrap()).findings();
    let f = only(
        &findings,
        openmed_op::manifests::rule::SERVED_SET_REFERENCED,
    );
    assert_eq!(f.severity, Severity::Error);
    assert!(f.message.contains("Secret models"), "{}", f.message);
}

#[test]
fn replicas_beside_autoscaling_is_a_warning_at_replicas_saying_who_owns_the_count() {
    let m = model("svc", "OpenMed/pii-v1")
        .spec("  replicas: 3\n  autoscaling:\n    minReplicas: 2\n    maxReplicas: 8\n");
    let findings = case(file("m.yaml", &[&m])).findings();
    let f = only(&findings, rule::REPLICAS_BESIDE_AUTOSCALING);
    assert_eq!(f.severity, Severity::Warning);
    assert_eq!(f.field.as_deref(), Some("spec.replicas"));
    assert_eq!(f.location.line, Some(10), "the replicas line");
    assert!(
        f.message
            .contains("HorizontalPodAutoscaler svc owns the count"),
        "{}",
        f.message
    );
    none(&findings, rule::AUTOSCALED_ROLLOUT_DROPS_PODS);
    // Either alone says nothing.
    for extra in ["  replicas: 3\n", "  autoscaling: {maxReplicas: 8}\n"] {
        let m = model("svc", "OpenMed/pii-v1").spec(extra);
        let findings = case(file("m.yaml", &[&m])).findings();
        none(&findings, rule::REPLICAS_BESIDE_AUTOSCALING);
        none(&findings, rule::AUTOSCALED_ROLLOUT_DROPS_PODS);
    }
}

#[test]
fn an_autoscaled_rollout_that_may_take_pods_away_is_a_warning_at_the_strategy() {
    for (strategy, field) in [
        (
            "  rolloutStrategy: {maxUnavailable: 1}\n",
            "spec.rolloutStrategy.maxUnavailable",
        ),
        (
            "  rolloutStrategy: {maxUnavailable: 25%}\n",
            "spec.rolloutStrategy.maxUnavailable",
        ),
        (
            "  rolloutStrategy: {type: Recreate}\n",
            "spec.rolloutStrategy.type",
        ),
    ] {
        let m = model("svc", "OpenMed/pii-v1")
            .spec(&format!("{strategy}  autoscaling: {{maxReplicas: 8}}\n"));
        let findings = case(file("m.yaml", &[&m])).findings();
        let f = only(&findings, rule::AUTOSCALED_ROLLOUT_DROPS_PODS);
        assert_eq!(f.severity, Severity::Warning);
        assert_eq!(f.field.as_deref(), Some(field));
        assert!(
            f.message.contains("surges above the count instead"),
            "{}",
            f.message
        );
    }
    let m = model("svc", "OpenMed/pii-v1")
        .spec("  rolloutStrategy: {maxUnavailable: 0%}\n  autoscaling: {maxReplicas: 8}\n");
    none(
        &case(file("m.yaml", &[&m])).findings(),
        rule::AUTOSCALED_ROLLOUT_DROPS_PODS,
    );
}
