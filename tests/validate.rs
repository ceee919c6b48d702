//! Every validation rule, accepted and rejected, with the field path and a
//! message a person can act on; and property tests that hold `validate` to
//! the rules as the API documentation states them.

use openmed_op::api::{FieldError, TargetFacts, validate};
use proptest::prelude::*;
use serde_json::{Value, json};

fn model(spec: Value) -> Value {
    json!({
        "apiVersion": "openmed.ai/v1alpha1",
        "kind": "OpenMedModel",
        "metadata": { "name": "svc", "namespace": "ns" },
        "spec": spec,
    })
}

fn base() -> Value {
    json!({ "family": "pii", "version": "OpenMed/pii-v1", "tier": "Small", "replicas": 2 })
}

fn with(path: &str, value: Value) -> Value {
    let mut spec = base();
    let mut node = &mut spec;
    let parts: Vec<&str> = path.split('.').collect();
    for part in &parts[..parts.len() - 1] {
        node = node
            .as_object_mut()
            .unwrap()
            .entry(*part)
            .or_insert_with(|| json!({}));
    }
    node[parts[parts.len() - 1]] = value;
    spec
}

fn errors(spec: Value) -> Vec<FieldError> {
    validate(&model(spec), None).expect_err("should be rejected")
}

/// The one error for `spec`, which must be at `path` and mention `words`.
fn rejects(spec: Value, path: &str, words: &[&str]) {
    let errors = errors(spec);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].path, path, "{errors:?}");
    for w in words {
        assert!(
            errors[0].message.contains(w),
            "{:?} lacks {w:?}",
            errors[0].message
        );
    }
}

#[test]
fn a_minimal_spec_is_accepted_with_defaults() {
    let spec = validate(
        &model(json!({"family": "pii", "version": "v1", "tier": "Tiny"})),
        None,
    )
    .unwrap();
    assert_eq!(spec.replicas, None);
    assert_eq!(spec.target_ref.container_name, "openmed-service");
    let rollout = serde_json::to_value(&spec.rollout_strategy).unwrap();
    assert_eq!(
        rollout,
        json!({"type": "RollingUpdate", "maxUnavailable": 0, "maxSurge": 1,
               "progressDeadlineSeconds": 600, "rollbackOnFailure": true})
    );
}

#[test]
fn unknown_fields_are_rejected_anywhere_in_spec() {
    rejects(
        with("replica", json!(2)),
        "spec.replica",
        &["unknown field", "did you mean \"replicas\""],
    );
    rejects(
        with("rolloutStrategy.maxSurges", json!(1)),
        "spec.rolloutStrategy.maxSurges",
        &["maxSurge"],
    );
    rejects(
        with("targetRef.container", json!("x")),
        "spec.targetRef.container",
        &["containerName"],
    );
}

#[test]
fn required_fields_are_named() {
    for field in ["family", "version", "tier"] {
        let mut spec = base();
        spec.as_object_mut().unwrap().remove(field);
        rejects(spec, &format!("spec.{field}"), &["required"]);
    }
    let no_spec = json!({"metadata": {"name": "x"}});
    assert_eq!(validate(&no_spec, None).unwrap_err()[0].path, "spec");
    let no_name = json!({"metadata": {}, "spec": base()});
    assert_eq!(
        validate(&no_name, None).unwrap_err()[0].path,
        "metadata.name"
    );
}

#[test]
fn tier_must_be_a_known_tier() {
    rejects(
        with("tier", json!("Huge")),
        "spec.tier",
        &["\"Huge\"", "Accurate-XLarge"],
    );
    for tier in [
        "Tiny",
        "Small",
        "Medium",
        "Base",
        "Large",
        "XLarge",
        "Accurate-XLarge",
    ] {
        validate(&model(with("tier", json!(tier))), None).unwrap();
    }
}

#[test]
fn family_and_version_follow_their_patterns() {
    for good in ["pii", "a", "Disease-Detection.v2_x", &"a".repeat(63)] {
        validate(&model(with("family", json!(good))), None).unwrap();
    }
    for bad in ["1pii", "pii-", "", "p ii", &"a".repeat(64)] {
        rejects(with("family", json!(bad)), "spec.family", &["letter"]);
    }
    for good in [
        "OpenMed/pii-v1",
        "hf.co/OpenMed/x@sha256:abc",
        "v1+build~2",
        &"a".repeat(253),
    ] {
        validate(&model(with("version", json!(good))), None).unwrap();
    }
    for bad in ["/OpenMed/pii", "Open Med", "", "a b", "é", &"a".repeat(254)] {
        rejects(with("version", json!(bad)), "spec.version", &["no spaces"]);
    }
}

#[test]
fn replicas_are_between_1_and_1000() {
    for bad in [0, 1001, -1] {
        rejects(
            with("replicas", json!(bad)),
            "spec.replicas",
            &["from 1 to 1000"],
        );
    }
    rejects(
        with("replicas", json!("3")),
        "spec.replicas",
        &["whole number", "\"3\""],
    );
    rejects(
        with("replicas", json!(1.5)),
        "spec.replicas",
        &["whole number"],
    );
    for good in [1, 1000] {
        validate(&model(with("replicas", json!(good))), None).unwrap();
    }
}

#[test]
fn surge_and_unavailable_are_counts_or_percentages_up_to_100() {
    for good in [json!(0), json!(5), json!("0%"), json!("25%"), json!("100%")] {
        let mut spec = with("rolloutStrategy.maxSurge", good.clone());
        spec["rolloutStrategy"]["maxUnavailable"] = json!(1);
        validate(&model(spec), None).unwrap();
    }
    for bad in [
        json!("150%"),
        json!("101%"),
        json!("05%"),
        json!("5"),
        json!("%"),
    ] {
        rejects(
            with("rolloutStrategy.maxSurge", bad),
            "spec.rolloutStrategy.maxSurge",
            &["0% to 100%"],
        );
    }
    rejects(
        with("rolloutStrategy.maxUnavailable", json!(-1)),
        "spec.rolloutStrategy.maxUnavailable",
        &["out of range"],
    );
    rejects(
        with("rolloutStrategy.maxSurge", json!(true)),
        "spec.rolloutStrategy.maxSurge",
        &["percentage"],
    );
}

#[test]
fn a_rolling_update_cannot_have_zero_surge_and_zero_unavailable() {
    for (surge, unavailable) in [
        (json!(0), json!(0)),
        (json!("0%"), json!(0)),
        (json!(0), json!("0%")),
    ] {
        let mut spec = with("rolloutStrategy.maxSurge", surge);
        spec["rolloutStrategy"]["maxUnavailable"] = unavailable;
        rejects(
            spec,
            "spec.rolloutStrategy",
            &["cannot set both maxUnavailable and maxSurge to zero"],
        );
    }
    // Recreate ignores both.
    let mut spec = with("rolloutStrategy.maxSurge", json!(0));
    spec["rolloutStrategy"]["type"] = json!("Recreate");
    validate(&model(spec), None).unwrap();
}

#[test]
fn the_progress_deadline_is_positive_and_exceeds_min_ready_seconds() {
    rejects(
        with("rolloutStrategy.progressDeadlineSeconds", json!(0)),
        "spec.rolloutStrategy.progressDeadlineSeconds",
        &["at least 1"],
    );
    let spec = model(with("rolloutStrategy.progressDeadlineSeconds", json!(30)));
    validate(
        &spec,
        Some(&TargetFacts {
            min_ready_seconds: 29,
        }),
    )
    .unwrap();
    let errors = validate(
        &spec,
        Some(&TargetFacts {
            min_ready_seconds: 30,
        }),
    )
    .unwrap_err();
    assert_eq!(
        errors[0].path,
        "spec.rolloutStrategy.progressDeadlineSeconds"
    );
    assert!(
        errors[0].message.contains("minReadySeconds (30)"),
        "{errors:?}"
    );
}

#[test]
fn names_follow_kubernetes_rules() {
    rejects(
        with("targetRef.containerName", json!("OpenMed")),
        "spec.targetRef.containerName",
        &["lowercase"],
    );
    rejects(
        with("targetRef.containerName", json!("a".repeat(64))),
        "spec.targetRef.containerName",
        &["at most 63"],
    );
    rejects(
        with("targetRef.name", json!("Svc")),
        "spec.targetRef.name",
        &["lowercase"],
    );
    rejects(
        with("manifestConfigMapName", json!("a_b")),
        "spec.manifestConfigMapName",
        &["lowercase"],
    );
    validate(&model(with("targetRef.name", json!("svc.v2"))), None).unwrap();
    let bad_name = json!({"metadata": {"name": "Bad_Name"}, "spec": base()});
    assert_eq!(
        validate(&bad_name, None).unwrap_err()[0].path,
        "metadata.name"
    );
}

#[test]
fn wrong_types_and_nulls_are_rejected_with_the_type_expected() {
    rejects(
        with("rolloutStrategy", json!("fast")),
        "spec.rolloutStrategy",
        &["mapping"],
    );
    rejects(
        with("rolloutStrategy.rollbackOnFailure", json!("yes")),
        "spec.rolloutStrategy.rollbackOnFailure",
        &["true or false"],
    );
    rejects(with("family", Value::Null), "spec.family", &["null"]);
    // Optional fields may be null, as the API server's schema allows.
    validate(&model(with("replicas", Value::Null)), None).unwrap();
}

#[test]
fn every_problem_is_reported_at_once() {
    let spec = json!({"family": "1", "version": " ", "tier": "Huge", "extra": 1});
    let paths: Vec<String> = errors(spec).into_iter().map(|e| e.path).collect();
    assert_eq!(
        paths,
        ["spec.family", "spec.version", "spec.tier", "spec.extra"]
    );
}

// ---- Property tests: validate agrees with the rules as documented. ----

/// The documented rules, written out by hand (no regular expressions), as
/// an independent oracle for what the CRD admits.
fn oracle(spec: &Value) -> bool {
    let map = spec.as_object().unwrap();
    let known = [
        "family",
        "version",
        "tier",
        "replicas",
        "rolloutStrategy",
        "targetRef",
        "manifestConfigMapName",
    ];
    if map.keys().any(|k| !known.contains(&k.as_str())) {
        return false;
    }
    let family = map["family"].as_str().unwrap();
    let fam: Vec<char> = family.chars().collect();
    let family_ok = (1..=63).contains(&fam.len())
        && fam[0].is_ascii_alphabetic()
        && fam[fam.len() - 1].is_ascii_alphanumeric()
        && fam
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(*c));
    let version: Vec<char> = map["version"].as_str().unwrap().chars().collect();
    let version_ok = (1..=253).contains(&version.len())
        && version[0].is_ascii_alphanumeric()
        && version
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || "._:@/+~-".contains(*c));
    let tier_ok = [
        "Tiny",
        "Small",
        "Medium",
        "Base",
        "Large",
        "XLarge",
        "Accurate-XLarge",
    ]
    .contains(&map["tier"].as_str().unwrap());
    let replicas_ok = map
        .get("replicas")
        .is_none_or(|r| (1..=1000).contains(&r.as_i64().unwrap()));
    let strategy = &map["rolloutStrategy"];
    let int_or_percent = |v: &Value| match v {
        Value::Number(n) => n.as_i64().is_some_and(|n| n >= 0),
        Value::String(s) => s.strip_suffix('%').is_some_and(|d| {
            !d.is_empty()
                && (d == "0" || !d.starts_with('0'))
                && d.chars().all(|c| c.is_ascii_digit())
                && d.parse::<u32>().is_ok_and(|n| n <= 100)
        }),
        _ => false,
    };
    let is_zero = |v: &Value| v == &json!(0) || v == &json!("0%");
    let surge = &strategy["maxSurge"];
    let unavailable = &strategy["maxUnavailable"];
    let strategy_ok = int_or_percent(surge)
        && int_or_percent(unavailable)
        && strategy["progressDeadlineSeconds"].as_i64().unwrap() >= 1
        && !(strategy["type"] == "RollingUpdate" && is_zero(surge) && is_zero(unavailable));
    family_ok && version_ok && tier_ok && replicas_ok && strategy_ok
}

/// Mostly valid values, with the invalid ones that matter mixed in, so
/// whole specs are often valid and single rules decide the verdict.
fn family() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => "[A-Za-z]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?",
        1 => "[a-zA-Z0-9._:@/+~ é-]{0,8}",
        1 => "[A-Za-z][A-Za-z0-9._-]{60,66}",
    ]
}

fn version() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => "[A-Za-z0-9][A-Za-z0-9._:@/+~-]{0,40}",
        1 => "[a-zA-Z0-9._:@/+~ é-]{0,8}",
        1 => "[A-Za-z0-9][A-Za-z0-9._:@/+~-]{250,255}",
    ]
}

fn int_or_percent() -> impl Strategy<Value = Value> {
    prop_oneof![
        (-1i64..3).prop_map(|n| json!(n)),
        prop::sample::select(vec![
            "0%", "0%", "1%", "50%", "100%", "101%", "150%", "05%", "5", "%"
        ])
        .prop_map(|s| json!(s)),
    ]
}

prop_compose! {
    fn arbitrary_spec()(
        family in family(),
        version in version(),
        tier in prop::sample::select(vec!["Tiny", "Small", "Base", "Accurate-XLarge", "Huge", "small"]),
        replicas in prop::option::of(prop_oneof![4 => 1i64..1001, 1 => -1i64..1, 1 => 1000i64..1003]),
        kind in prop::sample::select(vec!["RollingUpdate", "Recreate"]),
        surge in int_or_percent(),
        unavailable in int_or_percent(),
        deadline in prop_oneof![4 => Just(600i64), 1 => -1i64..3],
        extra in prop::bool::weighted(0.1),
    ) -> Value {
        let mut spec = json!({
            "family": family, "version": version, "tier": tier,
            "rolloutStrategy": {"type": kind, "maxSurge": surge, "maxUnavailable": unavailable,
                                 "progressDeadlineSeconds": deadline, "rollbackOnFailure": true},
        });
        if let Some(r) = replicas { spec["replicas"] = json!(r); }
        if extra { spec["replicaCount"] = json!(1); }
        spec
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// validate accepts exactly what the documented rules (and so the CRD) admit.
    #[test]
    fn validate_agrees_with_the_documented_rules(spec in arbitrary_spec()) {
        let verdict = validate(&model(spec.clone()), None);
        prop_assert_eq!(verdict.is_ok(), oracle(&spec), "{} -> {:?}", spec, verdict.err());
    }

    /// Every value built from the documented grammar is accepted.
    #[test]
    fn values_from_the_grammar_are_accepted(
        family in "[A-Za-z]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?",
        version in "[A-Za-z0-9][A-Za-z0-9._:@/+~-]{0,252}",
        container in "[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?",
        target in "[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?){0,3}",
    ) {
        let spec = json!({"family": family, "version": version, "tier": "Base",
                          "targetRef": {"name": target, "containerName": container}});
        let verdict = validate(&model(spec), None);
        prop_assert!(verdict.is_ok(), "{:?}", verdict);
    }

    /// The DNS-subdomain check the ConfigMap name rule uses agrees with the
    /// CRD's pattern and length limit for every string.
    #[test]
    fn dns_subdomain_check_agrees_with_the_crd(name in "[a-z0-9.-]{0,6}|[a-zA-Z0-9._-]{0,300}") {
        let in_crd = validate(&model(with("targetRef.name", json!(name.clone()))), None).is_ok();
        prop_assert_eq!(openmed_op::api::rules::is_dns_subdomain(&name), in_crd);
    }
}

fn canary() -> Value {
    json!({
        "targetRef": {"name": "svc-canary"},
        "trafficRef": {"httpRoute": "svc", "stableBackend": "svc", "canaryBackend": "svc-canary"},
        "steps": [{"weight": 10, "pause": "5m"}, {"weight": 50}],
    })
}

fn with_canary(path: &str, value: Value) -> Value {
    let mut spec = with("canary", canary());
    let mut node = &mut spec["canary"];
    let parts: Vec<&str> = path.split('.').collect();
    for part in &parts[..parts.len() - 1] {
        node = &mut node[*part];
    }
    node[parts[parts.len() - 1]] = value;
    spec
}

#[test]
fn a_canary_is_accepted_with_its_defaults() {
    let spec = validate(&model(with("canary", canary())), None).unwrap();
    let canary = spec.canary.unwrap();
    assert_eq!(canary.target_ref.container_name, "openmed-service");
    assert_eq!(canary.steps[0].pause.as_deref(), Some("5m"));
    assert_eq!(canary.steps[1].pause, None);
    let analysis = validate(
        &model(with_canary(
            "analysis",
            json!({"webhooks": [{"name": "smoke", "url": "http://checks:8080/canary"}]}),
        )),
        None,
    )
    .unwrap()
    .canary
    .unwrap()
    .analysis
    .unwrap();
    assert_eq!(analysis.interval, "1m");
    assert_eq!(analysis.failure_limit, 0);
    assert_eq!(analysis.webhooks[0].timeout, "10s");
}

#[test]
fn canary_steps_must_increase_strictly_within_1_to_99() {
    rejects(
        with_canary("steps", json!([{"weight": 50}, {"weight": 10}])),
        "spec.canary.steps",
        &["strictly increasing"],
    );
    rejects(
        with_canary("steps", json!([{"weight": 20}, {"weight": 20}])),
        "spec.canary.steps",
        &["strictly increasing"],
    );
    rejects(
        with_canary("steps", json!([{"weight": 100}])),
        "spec.canary.steps[0].weight",
        &["out of range", "from 1 to 99"],
    );
    rejects(
        with_canary("steps", json!([])),
        "spec.canary.steps",
        &["at least 1"],
    );
}

#[test]
fn mirror_steps_come_first_and_a_step_is_either_a_weight_or_a_mirror() {
    let steps = json!([{"mirror": 10, "pause": "1m"}, {"mirror": 100, "pause": "1m"},
                       {"weight": 10, "pause": "1m"}, {"weight": 50}]);
    for steps in [steps, json!([{"mirror": 100}])] {
        let accepted = validate(&model(with_canary("steps", steps)), None);
        assert!(accepted.is_ok(), "{accepted:?}");
    }
    rejects(
        with_canary("steps", json!([{"weight": 10}, {"mirror": 50}])),
        "spec.canary.steps",
        &["mirror steps come first"],
    );
    rejects(
        with_canary("steps", json!([{"mirror": 50, "weight": 10}])),
        "spec.canary.steps[0]",
        &["either weight or mirror"],
    );
    rejects(
        with_canary("steps", json!([{"pause": "1m"}])),
        "spec.canary.steps[0]",
        &["either weight or mirror"],
    );
    rejects(
        with_canary("steps", json!([{"mirror": 0}])),
        "spec.canary.steps[0].mirror",
        &["from 1 to 100"],
    );
    rejects(
        with_canary(
            "steps",
            json!([{"mirror": 10}, {"weight": 20}, {"weight": 20}]),
        ),
        "spec.canary.steps",
        &["strictly increasing"],
    );
}

#[test]
fn canary_durations_and_addresses_are_checked() {
    rejects(
        with_canary("steps", json!([{"weight": 10, "pause": "5 minutes"}])),
        "spec.canary.steps[0].pause",
        &["ms, s, m or h"],
    );
    rejects(
        with_canary(
            "analysis",
            json!({"interval": "1d", "webhooks": [{"name": "w", "url": "http://w"}]}),
        ),
        "spec.canary.analysis.interval",
        &["duration"],
    );
    rejects(
        with_canary(
            "analysis",
            json!({"metrics": [{"name": "m", "thresholdRange": {"max": 1},
                                 "prometheus": {"address": "prometheus:9090", "query": "up"}}]}),
        ),
        "spec.canary.analysis.metrics[0].prometheus.address",
        &["http://"],
    );
}

#[test]
fn a_webhook_timeout_is_at_most_thirty_seconds() {
    let webhook = |timeout: &str| {
        with_canary(
            "analysis",
            json!({"webhooks": [{"name": "w", "url": "http://w", "timeout": timeout}]}),
        )
    };
    for allowed in ["30s", "29s1000ms", "500ms", "0s"] {
        assert!(
            validate(&model(webhook(allowed)), None).is_ok(),
            "{allowed}"
        );
    }
    for refused in ["31s", "30s1ms", "1m", "1h", "999999999h"] {
        rejects(
            webhook(refused),
            "spec.canary.analysis.webhooks[0].timeout",
            &["at most 30s"],
        );
    }
}

#[test]
fn a_bad_endpoint_is_named_without_its_credentials_or_query() {
    for (address, shown) in [
        ("alice:hunter2@prometheus:9090", "***@prometheus:9090"),
        ("prometheus:9090/?key=s3cr3t", "prometheus:9090/?***"),
    ] {
        let errors = errors(with_canary(
            "analysis",
            json!({"metrics": [{"name": "m", "thresholdRange": {"max": 1},
                                 "prometheus": {"address": address, "query": "up"}}],
                   "webhooks": [{"name": "w", "url": address}]}),
        ));
        assert_eq!(errors.len(), 2, "{errors:?}");
        for e in &errors {
            assert!(e.message.contains(shown), "{e}");
            for secret in ["alice", "hunter2", "key", "s3cr3t"] {
                assert!(!e.message.contains(secret), "{e}");
            }
        }
    }
}

#[test]
fn canary_cross_field_rules_name_their_field() {
    rejects(
        with_canary("trafficRef.canaryBackend", json!("svc")),
        "spec.canary.trafficRef",
        &["two different Services"],
    );
    rejects(
        with_canary("analysis", json!({"interval": "1m"})),
        "spec.canary.analysis",
        &["at least one metric, webhook or probe set"],
    );
    rejects(
        with_canary(
            "analysis",
            json!({"metrics": [{"name": "m", "thresholdRange": {"min": 2.0, "max": 1.0},
                                 "prometheus": {"address": "http://p:9090", "query": "up"}}]}),
        ),
        "spec.canary.analysis.metrics[0].thresholdRange",
        &["min must not exceed max"],
    );
}

#[test]
fn durations_read_as_written() {
    use openmed_op::api::rules::parse_duration;
    use std::time::Duration;
    assert_eq!(parse_duration("30s"), Some(Duration::from_secs(30)));
    assert_eq!(parse_duration("1h30m"), Some(Duration::from_secs(5400)));
    assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
    assert_eq!(
        parse_duration("1m500ms"),
        Some(Duration::from_millis(60_500))
    );
    assert_eq!(parse_duration("5"), None);
    assert_eq!(parse_duration("5d"), None);
    assert_eq!(parse_duration(""), None);
}

#[test]
fn the_quality_gate_and_canary_probes_judge_pii_models_only() {
    let gate = json!({"configMapRef": {"name": "probes"}});
    validate(&model(with("qualityGate", gate.clone())), None).unwrap();
    let mut spec = with("qualityGate", gate.clone());
    spec["family"] = json!("disease-detection");
    rejects(
        spec,
        "spec.qualityGate",
        &["judges PII models only", "POST /pii/extract", "family pii"],
    );
    let mut spec = with_canary(
        "analysis",
        json!({"interval": "30s", "probes": gate.clone()}),
    );
    validate(&model(spec.clone()), None).unwrap();
    spec["family"] = json!("disease-detection");
    rejects(
        spec,
        "spec.canary.analysis.probes",
        &["canary probes judge PII models only", "family pii"],
    );
    // Without a gate or probes any family is served.
    validate(&model(with("family", json!("disease-detection"))), None).unwrap();
}
