//! The admission policies of `deploy/admission` on the real API server,
//! installed as users install them (with `deploy/operator`), acting on
//! requests of an impersonated user who holds only what each case grants.
//! Last, the offline mirror: `verify` refuses, before merge, every change
//! the policies refuse at the door.

use std::collections::HashMap;
use std::time::Duration;

use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use openmed_op::api::{OpenMedModel, OpenMedModelStatus};
use openmed_op::findings::Severity;
use openmed_op::source::parse_stream;
use openmed_op::verify::rules::{self, HistoryVersions, Input, ResourceKey, rule};
use serde_json::{Value, json};

use crate::env::*;
use crate::support::*;
use crate::trial;

pub fn trials() -> Vec<libtest_mimic::Trial> {
    vec![
        trial(
            "admission::a_model_may_target_only_what_its_author_may_patch",
            a_model_may_target_only_what_its_author_may_patch,
        ),
        trial(
            "admission::a_rollback_may_name_only_a_retained_version_and_the_operator_acts_on_it",
            a_rollback_may_name_only_a_retained_version_and_the_operator_acts_on_it,
        ),
        trial(
            "admission::a_managed_deployment_may_not_start_reading_its_served_set_from_elsewhere",
            a_managed_deployment_may_not_start_reading_its_served_set_from_elsewhere,
        ),
        trial(
            "admission::a_version_the_service_cannot_load_is_refused_at_the_door",
            a_version_the_service_cannot_load_is_refused_at_the_door,
        ),
        trial(
            "admission::verify_refuses_before_merge_what_the_policies_refuse",
            verify_refuses_before_merge_what_the_policies_refuse,
        ),
    ]
}

/// The user every case acts as: no cluster role, only the Roles a case
/// binds to them in its namespace.
const USER: &str = "alice";
const TARGET_POLICY: &str = "openmed-target-permission";
const ROLLBACK_POLICY: &str = "openmed-rollback-retained";
const RETRY_POLICY: &str = "openmed-failed-version-needs-reason";
const SERVED_POLICY: &str = "openmed-served-set-literal";
const VERSION_POLICY: &str = "openmed-version-model-id";

fn models(client: &Client, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        namespace,
        &ApiResource::erase::<OpenMedModel>(&()),
    )
}

/// Server-side applies `object` (JSON) as `manager`, for real or as a dry
/// run (which goes through admission and stores nothing).
async fn apply(
    api: &Api<DynamicObject>,
    object: &Value,
    manager: &str,
    dry_run: bool,
) -> Result<DynamicObject, kube::Error> {
    let mut params = PatchParams::apply(manager).force();
    params.dry_run = dry_run;
    let name = object["metadata"]["name"].as_str().unwrap();
    api.patch(name, &params, &Patch::Apply(object)).await
}

/// The policy that denied a request, from the API server's message.
fn denied_by(result: &Result<DynamicObject, kube::Error>) -> Option<(&'static str, String)> {
    let Err(kube::Error::Api(status)) = result else {
        return None;
    };
    [
        TARGET_POLICY,
        ROLLBACK_POLICY,
        RETRY_POLICY,
        SERVED_POLICY,
        VERSION_POLICY,
    ]
    .into_iter()
    .find(|p| {
        status
            .message
            .contains(&format!("ValidatingAdmissionPolicy '{p}'"))
    })
    .map(|p| (p, status.message.clone()))
}

/// Policies and RBAC changes reach the API server's caches a moment after
/// they are stored: repeats a dry run of `object` until `ready` holds for
/// its result, and returns that result.
async fn once_in_force(
    api: &Api<DynamicObject>,
    object: &Value,
    manager: &str,
    what: &str,
    ready: impl Fn(&Result<DynamicObject, kube::Error>) -> bool,
) {
    wait_for(what, Duration::from_secs(30), || async {
        let result = apply(api, object, manager, true).await;
        ready(&result).then_some(())
    })
    .await;
}

/// Grants `user` the verbs on `resource` (optionally only the named
/// objects) in `namespace`.
async fn grant(
    admin: &Client,
    namespace: &str,
    role: &str,
    group: &str,
    resource: &str,
    names: &[&str],
    verbs: &[&str],
) {
    let mut rule = json!({"apiGroups": [group], "resources": [resource], "verbs": verbs});
    if !names.is_empty() {
        rule["resourceNames"] = json!(names);
    }
    let yaml = serde_yaml::to_string(&json!([
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": role}, "rules": [rule]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": role},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}]},
    ]))
    .unwrap();
    // A YAML sequence is not a stream: apply the two documents one by one.
    let docs: Vec<Value> = serde_yaml::from_str(&yaml).unwrap();
    for doc in docs {
        apply_yaml(
            admin,
            Some(namespace),
            &serde_yaml::to_string(&doc).unwrap(),
            "e2e",
        )
        .await;
    }
}

/// Every OpenMedModel verb, nothing else: what a team's model editors get.
async fn may_edit_models(admin: &Client, namespace: &str) {
    grant(
        admin,
        namespace,
        "models",
        "openmed.ai",
        "openmedmodels",
        &[],
        &[
            "get", "list", "watch", "create", "update", "patch", "delete",
        ],
    )
    .await;
}

fn model(namespace: &str, version: &str) -> Value {
    json!({
        "apiVersion": "openmed.ai/v1alpha1",
        "kind": "OpenMedModel",
        "metadata": {"name": "svc", "namespace": namespace},
        "spec": {"family": "pii", "tier": "Small", "version": version, "replicas": 1},
    })
}

fn canary() -> Value {
    json!({
        "targetRef": {"name": "svc-canary"},
        "trafficRef": {"httpRoute": "svc", "stableBackend": "svc", "canaryBackend": "svc-canary"},
        "steps": [{"weight": 10}],
    })
}

/// A Deployment `name` whose `openmed-service` container declares its
/// served set with `served` (an env entry), managed by a model when
/// `managed`.
fn served_deployment(namespace: &str, name: &str, managed: bool, served: Value) -> Value {
    let annotations = if managed {
        json!({"openmed.ai/model-resource": format!("{namespace}/svc")})
    } else {
        json!({})
    };
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{
                    "name": "openmed-service",
                    "image": "openmed",
                    "env": [served],
                }]},
            },
        },
    })
}

fn a_managed_deployment_may_not_start_reading_its_served_set_from_elsewhere() {
    block_on(async {
        let admin = admin().await;
        install_crd(&admin).await;
        operator_kubeconfig(); // installs deploy/operator, policies included
        let ns = TestNamespace::create(&admin, "adm-served").await;
        let api: Api<DynamicObject> = Api::namespaced_with(
            admin.clone(),
            &ns.name,
            &ApiResource::erase::<k8s_openapi::api::apps::v1::Deployment>(&()),
        );
        let literal = json!({"name": "OPENMED_SERVICE_SERVED_MODELS", "value": "OpenMed/pii-v1"});
        let referenced = json!({"name": "OPENMED_SERVICE_SERVED_MODELS",
            "valueFrom": {"configMapKeyRef": {"name": "team-models", "key": "served"}}});

        let managed = served_deployment(&ns.name, "svc", true, literal.clone());
        apply(&api, &managed, "e2e", false).await.unwrap();
        let to_reference = served_deployment(&ns.name, "svc", true, referenced.clone());
        once_in_force(
            &api,
            &to_reference,
            "e2e",
            "the served-set policy to deny",
            |r| denied_by(r).is_some_and(|(p, _)| p == SERVED_POLICY),
        )
        .await;
        let denied = apply(&api, &to_reference, "e2e", false).await;
        let Some((SERVED_POLICY, message)) = denied_by(&denied) else {
            panic!("the reference was not denied by {SERVED_POLICY}: {denied:?}");
        };
        assert!(
            message.contains("container openmed-service")
                && message.contains(&format!("OpenMedModel {}/svc", ns.name)),
            "{message}"
        );
        // What verify says of the same Deployment beside its model, before
        // the merge.
        let tree = format!(
            "{}---\n{}",
            serde_yaml::to_string(&to_reference).unwrap(),
            serde_yaml::to_string(&model(&ns.name, "OpenMed/pii-v2")).unwrap()
        );
        let rev = parse_stream("svc.yaml", &tree).unwrap();
        let outcome = rules::check(&Input {
            rev: &rev,
            base: None,
            history: &HistoryVersions::new(),
            status: None,
            default_namespace: "default",
            strict: false,
        });
        assert!(
            outcome.findings.iter().any(|f| f.rule
                == openmed_op::manifests::rule::SERVED_SET_REFERENCED
                && f.severity == Severity::Error),
            "{:#?}",
            outcome.findings
        );

        // A Deployment no model manages may read it from anywhere.
        let unmanaged = served_deployment(&ns.name, "other", false, referenced.clone());
        apply(&api, &unmanaged, "e2e", false).await.unwrap();
        // One that read it that way before it was adopted stays editable
        // (and releasable): only introducing the reference is refused.
        let mut adopted = served_deployment(&ns.name, "other", true, referenced.clone());
        apply(&api, &adopted, "e2e", false).await.unwrap();
        adopted["spec"]["replicas"] = json!(1);
        apply(&api, &adopted, "e2e", false).await.unwrap();
        // And a literal set stays editable.
        let mut edited = managed.clone();
        edited["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"] =
            json!("OpenMed/pii-v2,OpenMed/pii-v1");
        apply(&api, &edited, "e2e", false).await.unwrap();
    })
}

fn a_model_may_target_only_what_its_author_may_patch() {
    block_on(async {
        let admin = admin().await;
        install_crd(&admin).await;
        operator_kubeconfig(); // installs deploy/operator, policies included
        let ns = TestNamespace::create(&admin, "adm-target").await;
        may_edit_models(&admin, &ns.name).await;
        let user = client_for(&kubeconfig(), Some(USER)).await;
        let as_user = models(&user, &ns.name);
        let mut object = model(&ns.name, "OpenMed/pii-v1");

        // May create OpenMedModels, may not patch the Deployment: denied,
        // naming the Deployment and the permission.
        let missing = format!(
            "user {USER} may not patch Deployment {}/svc (deployments.apps, verb patch)",
            ns.name
        );
        once_in_force(&as_user, &object, USER, "the target policy to deny", |r| {
            denied_by(r).is_some_and(|(p, m)| p == TARGET_POLICY && m.contains(&missing))
        })
        .await;
        let denied = apply(&as_user, &object, USER, false).await;
        let Some((TARGET_POLICY, message)) = denied_by(&denied) else {
            panic!("creating the model was not denied by {TARGET_POLICY}: {denied:?}");
        };
        assert!(message.contains(&missing), "{message}");
        let Err(kube::Error::Api(status)) = &denied else {
            unreachable!()
        };
        assert_eq!(status.code, 403, "a missing permission is Forbidden");
        assert!(
            models(&admin, &ns.name)
                .get_opt("svc")
                .await
                .unwrap()
                .is_none(),
            "nothing was stored"
        );

        // Granted `patch` on that one Deployment: allowed.
        grant(
            &admin,
            &ns.name,
            "patch-svc",
            "apps",
            "deployments",
            &["svc"],
            &["patch"],
        )
        .await;
        once_in_force(&as_user, &object, USER, "the grant to count", |r| r.is_ok()).await;
        apply(&as_user, &object, USER, false)
            .await
            .expect("allowed once the user may patch the Deployment");

        // A canary names two more objects the operator will write: the
        // canary Deployment, then the HTTPRoute, each needs `patch` too.
        object["spec"]["canary"] = canary();
        let denied = apply(&as_user, &object, USER, false).await;
        let Some((TARGET_POLICY, message)) = denied_by(&denied) else {
            panic!("the canary Deployment was not checked: {denied:?}");
        };
        assert!(
            message.contains(&format!(
                "may not patch Deployment {}/svc-canary (deployments.apps, verb patch)",
                ns.name
            )),
            "{message}"
        );
        grant(
            &admin,
            &ns.name,
            "patch-canary",
            "apps",
            "deployments",
            &["svc-canary"],
            &["patch"],
        )
        .await;
        let route = format!(
            "may not patch HTTPRoute {}/svc (httproutes.gateway.networking.k8s.io, verb patch)",
            ns.name
        );
        once_in_force(&as_user, &object, USER, "the route to be checked", |r| {
            denied_by(r).is_some_and(|(_, m)| m.contains(&route))
        })
        .await;
        grant(
            &admin,
            &ns.name,
            "patch-route",
            "gateway.networking.k8s.io",
            "httproutes",
            &["svc"],
            &["patch"],
        )
        .await;
        once_in_force(&as_user, &object, USER, "the route grant to count", |r| {
            r.is_ok()
        })
        .await;
        apply(&as_user, &object, USER, false)
            .await
            .expect("allowed once the user may patch all three");

        // Re-pointing the model at a Deployment the user may not patch:
        // denied, and the stored target stays.
        object["spec"]["targetRef"] = json!({"name": "billing"});
        let denied = apply(&as_user, &object, USER, false).await;
        let Some((TARGET_POLICY, message)) = denied_by(&denied) else {
            panic!("changing the target was not checked: {denied:?}");
        };
        assert!(message.contains("Deployment"), "{message}");
        assert!(message.contains("/billing "), "{message}");
        let stored = models(&admin, &ns.name).get("svc").await.unwrap();
        assert_eq!(stored.data["spec"]["targetRef"].get("name"), None);
        ns.delete().await;
    });
}

fn a_rollback_may_name_only_a_retained_version_and_the_operator_acts_on_it() {
    block_on(async {
        let env = Env::new("adm-rollback").await;
        let admin = env.client.clone();
        may_edit_models(&admin, &env.ns.name).await;
        grant(
            &admin,
            &env.ns.name,
            "patch-svc",
            "apps",
            "deployments",
            &["svc"],
            &["patch"],
        )
        .await;
        let user = client_for(&kubeconfig(), Some(USER)).await;
        let as_user = models(&user, &env.ns.name);
        let (v1, v2, v3) = (env.version("v1"), env.version("v2"), env.version("v3"));
        env.apply(&deployment_yaml("svc", "openmed-service", "boot"))
            .await;
        let mut object = model(&env.ns.name, &v1);
        once_in_force(&as_user, &object, USER, "the user's grants", |r| r.is_ok()).await;
        apply(&as_user, &object, USER, false).await.unwrap();
        env.wait_ready("svc", &v1).await;
        object["spec"]["version"] = json!(v2);
        apply(&as_user, &object, USER, false).await.unwrap();
        let s = env.wait_ready("svc", &v2).await;
        assert_eq!(s.last_successful_spec.unwrap().version, v2);
        assert_eq!(s.previous_successful_spec.unwrap().version, v1);

        // A third version, never rolled out: denied with the retained ones
        // listed, in the operator's words.
        object["metadata"]["annotations"] = json!({"openmed.ai/rollback-to": v3});
        let expected =
            format!("openmed.ai/rollback-to={v3} is not a retained version (retained: {v2}, {v1})");
        once_in_force(
            &as_user,
            &object,
            USER,
            "the rollback policy to deny",
            |r| denied_by(r).is_some(),
        )
        .await;
        let denied = apply(&as_user, &object, USER, false).await;
        let Some((ROLLBACK_POLICY, message)) = denied_by(&denied) else {
            panic!("the rollback to {v3} was not denied by {ROLLBACK_POLICY}: {denied:?}");
        };
        assert!(message.contains(&expected), "{message}");
        assert_eq!(
            env.annotation("svc", "openmed.ai/rollback-to").await,
            None,
            "the annotation was not stored"
        );

        // A retained one: allowed, and the operator rolls back to it.
        object["metadata"]["annotations"] = json!({"openmed.ai/rollback-to": v1});
        apply(&as_user, &object, USER, false)
            .await
            .expect("a rollback to a retained version is allowed");
        let s = env.wait_manual_rollback("svc", &v1).await;
        assert_eq!(s.rollback_request, Some(format!("manual:{v1}")));
        env.wait_event("svc", "RollbackSucceeded").await;

        // Removing the annotation is always allowed.
        object["metadata"]["annotations"] = json!({});
        apply(&as_user, &object, USER, false)
            .await
            .expect("removing the annotation is allowed");
        env.wait_ready("svc", &v2).await;
        env.finish().await;
    });
}

/// One case of the mirror: a stored OpenMedModel with a status, and the
/// change applied to it (or, with no stored one, the object created).
struct Case {
    what: &'static str,
    /// Annotations and spec fields of the stored object (`None`: a create).
    stored: Option<(Value, Value)>,
    /// The stored status.
    status: Value,
    /// Annotations and spec fields of the changed object.
    changed: (Value, Value),
    /// The policy that refuses it, if any.
    policy: Option<&'static str>,
    /// `verify`'s error for it, if any (it may refuse more than a policy:
    /// the reverse is what must never happen).
    verify: Option<&'static str>,
}

fn retained(last: &str, previous: &str) -> Value {
    json!({
        "phase": "Ready",
        "desiredVersion": last,
        "activeVersion": last,
        "lastSuccessfulSpec": {"family": "pii", "tier": "Small", "version": last},
        "previousSuccessfulSpec": {"family": "pii", "tier": "Small", "version": previous},
    })
}

fn rolled_back(failed: &str, restored: &str) -> Value {
    json!({
        "phase": "RolledBack",
        "desiredVersion": failed,
        "activeVersion": restored,
        "lastSuccessfulSpec": {"family": "pii", "tier": "Small", "version": restored},
    })
}

fn spec(version: &str, replicas: i64) -> Value {
    json!({"family": "pii", "tier": "Small", "version": version, "replicas": replicas})
}

fn cases() -> Vec<Case> {
    let none = json!({});
    let rollback = |v: &str| json!({"openmed.ai/rollback-to": v});
    let reason = |why: &str| json!({"openmed.ai/retry-reason": why});
    vec![
        Case {
            what: "a rollback to the previous retained version",
            stored: Some((none.clone(), spec("b", 1))),
            status: retained("b", "a"),
            changed: (rollback("a"), spec("b", 1)),
            policy: None,
            verify: None,
        },
        Case {
            what: "a rollback to a version never retained",
            stored: Some((none.clone(), spec("b", 1))),
            status: retained("b", "a"),
            changed: (rollback("z"), spec("b", 1)),
            policy: Some(ROLLBACK_POLICY),
            verify: Some(rule::ROLLBACK_NOT_RETAINED),
        },
        Case {
            what: "a new model that asks for a rollback",
            stored: None,
            status: json!({}),
            changed: (rollback("a"), spec("b", 1)),
            policy: Some(ROLLBACK_POLICY),
            verify: Some(rule::ROLLBACK_NOT_RETAINED),
        },
        Case {
            what: "the rollback annotation removed",
            stored: Some((rollback("a"), spec("b", 1))),
            status: retained("a", "b"),
            changed: (none.clone(), spec("b", 1)),
            policy: None,
            verify: None,
        },
        Case {
            what: "a rollback annotation kept after its version left the retained",
            stored: Some((rollback("a"), spec("b", 1))),
            status: retained("c", "b"),
            changed: (rollback("a"), spec("b", 2)),
            // Unchanged, so the policy does not look at it again (the
            // operator refuses it); verify judges what Git asks for.
            policy: None,
            verify: Some(rule::ROLLBACK_NOT_RETAINED),
        },
        Case {
            what: "another field edited while the failed version is still asked for",
            stored: Some((none.clone(), spec("b", 1))),
            status: rolled_back("b", "a"),
            changed: (none.clone(), spec("b", 2)),
            policy: Some(RETRY_POLICY),
            verify: Some(rule::FAILED_VERSION_RETRIED),
        },
        Case {
            what: "the same, with a reason for the retry",
            stored: Some((none.clone(), spec("b", 1))),
            status: rolled_back("b", "a"),
            changed: (reason("the new weights are fixed"), spec("b", 2)),
            policy: None,
            verify: None,
        },
        Case {
            what: "the same, with the reason of the attempt that failed",
            stored: Some((reason("first try"), spec("b", 1))),
            status: rolled_back("b", "a"),
            changed: (reason("first try"), spec("b", 2)),
            policy: Some(RETRY_POLICY),
            verify: Some(rule::FAILED_VERSION_RETRIED),
        },
        Case {
            what: "Git following the rollback",
            stored: Some((none.clone(), spec("b", 1))),
            status: rolled_back("b", "a"),
            changed: (none.clone(), spec("a", 1)),
            policy: None,
            verify: None,
        },
        Case {
            what: "a new version after a failed one",
            stored: Some((none.clone(), spec("b", 1))),
            status: rolled_back("b", "a"),
            changed: (none.clone(), spec("c", 1)),
            policy: None,
            verify: None,
        },
        Case {
            what: "only the canary block edited after a failure",
            stored: Some((none.clone(), spec("b", 1))),
            status: rolled_back("b", "a"),
            changed: (none.clone(), {
                let mut s = spec("b", 1);
                s["canary"] = canary();
                s
            }),
            policy: None,
            verify: None,
        },
        Case {
            what: "a version bump on a healthy model",
            stored: Some((none.clone(), spec("b", 1))),
            status: retained("b", "a"),
            changed: (none.clone(), spec("c", 1)),
            policy: None,
            verify: None,
        },
        Case {
            what: "a new model at a version with a digest",
            stored: None,
            status: json!({}),
            changed: (none.clone(), spec("hf.co/org/m@sha256:abc", 1)),
            policy: Some(VERSION_POLICY),
            verify: Some(rule::NOT_A_SERVICE_MODEL_ID),
        },
        Case {
            what: "a bump to a version with a revision",
            stored: Some((none.clone(), spec("b", 1))),
            status: retained("b", "a"),
            changed: (none.clone(), spec("org/b:2", 1)),
            policy: Some(VERSION_POLICY),
            verify: Some(rule::NOT_A_SERVICE_MODEL_ID),
        },
    ]
}

fn object(namespace: &str, name: &str, annotations: &Value, spec: &Value) -> Value {
    json!({
        "apiVersion": "openmed.ai/v1alpha1",
        "kind": "OpenMedModel",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": spec,
    })
}

/// `verify`'s error rule ids for the change BASE -> REV judged against the
/// cluster's status, as `verify --status` would.
fn verify_errors(
    namespace: &str,
    name: &str,
    base: Option<&Value>,
    rev: &Value,
    status: &Value,
) -> Vec<&'static str> {
    let yaml = |v: &Value| serde_yaml::to_string(v).unwrap();
    let rev = parse_stream("models/svc.yaml", &yaml(rev)).unwrap();
    let base = base.map(|b| parse_stream("models/svc.yaml", &yaml(b)).unwrap());
    let key = ResourceKey {
        namespace: namespace.into(),
        name: name.into(),
    };
    let status: OpenMedModelStatus = serde_json::from_value(status.clone()).unwrap();
    let cluster = HashMap::from([(key, status)]);
    let history = HistoryVersions::new();
    let outcome = rules::check(&Input {
        rev: &rev,
        base: base.as_deref(),
        history: &history,
        status: Some(&cluster),
        default_namespace: "default",
        strict: false,
    });
    outcome
        .findings
        .iter()
        .filter(|f| f.severity == Severity::Error)
        .map(|f| f.rule)
        .collect()
}

fn verify_refuses_before_merge_what_the_policies_refuse() {
    block_on(async {
        let admin = admin().await;
        install_crd(&admin).await;
        operator_kubeconfig();
        // No operator here: the status of each case is written as the
        // operator would have left it, and nothing moves it.
        let ns = TestNamespace::create(&admin, "adm-mirror").await;
        let api = models(&admin, &ns.name);
        let probe = object(
            &ns.name,
            "probe",
            &json!({"openmed.ai/rollback-to": "a"}),
            &spec("b", 1),
        );
        once_in_force(&api, &probe, "e2e", "the policies to be in force", |r| {
            denied_by(r).is_some()
        })
        .await;
        let statuses: Api<DynamicObject> = api.clone();
        let mut report = Vec::new();
        for (i, case) in cases().into_iter().enumerate() {
            let name = format!("case-{i}");
            let base = case
                .stored
                .as_ref()
                .map(|(annotations, spec)| object(&ns.name, &name, annotations, spec));
            if let Some(base) = &base {
                // Stored in two steps, as the history would have: the spec
                // and status first, then annotations a policy checks
                // against that status.
                let mut first = base.clone();
                first["metadata"]["annotations"] = json!({});
                apply(&api, &first, "e2e", false).await.unwrap();
                let status = if base["metadata"]["annotations"]
                    .get("openmed.ai/rollback-to")
                    .is_some()
                {
                    // A rollback in flight was accepted against versions
                    // that retained it; the case's status comes after.
                    retained(
                        "b",
                        base["metadata"]["annotations"]["openmed.ai/rollback-to"]
                            .as_str()
                            .unwrap(),
                    )
                } else {
                    case.status.clone()
                };
                statuses
                    .patch_status(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"status": status})),
                    )
                    .await
                    .unwrap();
                apply(&api, base, "e2e", false)
                    .await
                    .unwrap_or_else(|e| panic!("{}: storing the starting point: {e}", case.what));
                statuses
                    .patch_status(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"status": case.status})),
                    )
                    .await
                    .unwrap();
            }
            let rev = object(&ns.name, &name, &case.changed.0, &case.changed.1);
            let result = apply(&api, &rev, "e2e", false).await;
            let policy = denied_by(&result).map(|(p, _)| p);
            if policy.is_none() {
                assert!(result.is_ok(), "{}: {result:?}", case.what);
            }
            let errors = verify_errors(&ns.name, &name, base.as_ref(), &rev, &case.status);
            report.push(format!(
                "{:<70} policy {:<38} verify {:?}",
                case.what,
                policy.unwrap_or("allowed"),
                errors
            ));
            assert_eq!(policy, case.policy, "{}: {result:?}", case.what);
            let mirrored = |rule: &str| errors.contains(&rule);
            match policy {
                Some(ROLLBACK_POLICY) => {
                    assert!(mirrored(rule::ROLLBACK_NOT_RETAINED), "{}", case.what)
                }
                Some(RETRY_POLICY) => {
                    assert!(mirrored(rule::FAILED_VERSION_RETRIED), "{}", case.what)
                }
                _ => {}
            }
            match case.verify {
                Some(rule) => assert!(mirrored(rule), "{}: verify found {errors:?}", case.what),
                None => assert!(
                    !mirrored(rule::ROLLBACK_NOT_RETAINED)
                        && !mirrored(rule::FAILED_VERSION_RETRIED),
                    "{}: verify found {errors:?}",
                    case.what
                ),
            }
        }
        eprintln!("{}", report.join("\n"));
        ns.delete().await;
    });
}

/// The CRD stores a version with a revision or digest (the earlier
/// operator's resources move over unchanged), but a new one is refused at
/// the door in the words `verify` and the operator use: no pod could load it.
fn a_version_the_service_cannot_load_is_refused_at_the_door() {
    block_on(async {
        let env = Env::new("adm-version").await;
        let admin = env.client.clone();
        operator_kubeconfig(); // installs deploy/operator, policies included
        let digest = "hf.co/OpenMed/pii@sha256:abc";
        let mut object = model(&env.ns.name, digest);
        assert!(
            openmed_op::api::validate(&object, None).is_ok(),
            "the CRD's schema stores it"
        );
        let api = models(&admin, &env.ns.name);
        once_in_force(&api, &object, "e2e", "the version policy to deny", |r| {
            denied_by(r).is_some()
        })
        .await;
        let denied = apply(&api, &object, "e2e", false).await;
        let Some((VERSION_POLICY, message)) = denied_by(&denied) else {
            panic!("a new model at {digest} was not denied by {VERSION_POLICY}: {denied:?}");
        };
        assert!(
            message.contains(digest) && message.contains("every new pod would exit at start"),
            "{message}"
        );
        assert!(env.models().get_opt("svc").await.unwrap().is_none());

        // A loadable version is stored; a change to a digest is refused, a
        // change to another loadable version is not.
        let v1 = env.version("v1");
        object["spec"]["version"] = json!(v1);
        apply(&api, &object, "e2e", false).await.unwrap();
        for (version, refused) in [
            ("OpenMed/pii:2026-12", true),
            ("OpenMed/pii-2026-12", false),
        ] {
            object["spec"]["version"] = json!(version);
            let result = apply(&api, &object, "e2e", false).await;
            assert_eq!(
                matches!(denied_by(&result), Some((VERSION_POLICY, _))),
                refused,
                "{version}: {result:?}"
            );
        }
        env.finish().await;
    });
}
