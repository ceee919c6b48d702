//! The harness and the CRD on the real API server: the CRD installs and is
//! explained, the server fills in our defaults, the server and the internal
//! `validate` accept and reject the same objects, and Deployments really
//! progress (or time out) through the fake kubelet.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::Api;
use libtest_mimic::Trial;
use serde_json::{Value, json};

use crate::support::*;
use crate::trial;

pub fn trials() -> Vec<Trial> {
    vec![
        trial(
            "cluster::the_crd_is_established_and_explained",
            the_crd_is_established_and_explained,
        ),
        trial(
            "cluster::the_examples_apply_and_the_server_fills_in_defaults",
            the_examples_apply_and_the_server_fills_in_defaults,
        ),
        trial(
            "cluster::the_server_and_validate_accept_and_reject_the_same_objects",
            the_server_and_validate_accept_and_reject_the_same_objects,
        ),
        trial(
            "cluster::the_example_deployment_becomes_available",
            the_example_deployment_becomes_available,
        ),
        trial(
            "cluster::an_unready_version_exceeds_its_progress_deadline",
            an_unready_version_exceeds_its_progress_deadline,
        ),
    ]
}

/// The bundled example without its Namespace document.
pub fn example_docs() -> String {
    let mut out = String::new();
    for file in [
        "examples/openmed/openmed-service.yaml",
        "examples/openmed/openmedmodel.yaml",
    ] {
        let text = std::fs::read_to_string(root().join(file)).unwrap();
        for doc in text.split("\n---\n") {
            if !doc.contains("kind: Namespace") {
                out.push_str(doc.trim());
                out.push_str("\n---\n");
            }
        }
    }
    out
}

fn the_crd_is_established_and_explained() {
    block_on(async {
        let client = admin().await;
        install_crd(&client).await;
        // Established comes first; discovery and the published OpenAPI
        // schema follow a moment later, so a first `explain` may not find
        // the resource yet.
        let (_, out, _) = wait_until(
            "kubectl explain to find openmedmodel.spec.rolloutStrategy",
            Duration::from_secs(60),
            || async { kubectl(&["explain", "openmedmodel.spec.rolloutStrategy"]) },
            |(ok, _, _)| *ok,
        )
        .await;
        assert!(out.contains("maxSurge"), "{out}");
        assert!(
            out.contains("how many extra pods may be created"),
            "our field docs are served:\n{out}"
        );
        let (ok, out, _) = kubectl(&["explain", "omm.spec.version"]);
        assert!(
            ok && out.contains("Version pointer of the model to preload"),
            "{out}"
        );
    });
}

fn the_examples_apply_and_the_server_fills_in_defaults() {
    block_on(async {
        let client = admin().await;
        install_crd(&client).await;
        let ns = TestNamespace::create(&client, "examples").await;
        let stored = apply_yaml(&client, Some(&ns.name), &example_docs(), "e2e").await;
        let model = stored
            .iter()
            .find(|o| o.types.as_ref().unwrap().kind == "OpenMedModel")
            .unwrap();
        let spec = &model.data["spec"];
        assert_eq!(spec["rolloutStrategy"]["rollbackOnFailure"], true);
        assert_eq!(spec["rolloutStrategy"]["progressDeadlineSeconds"], 600);
        assert_eq!(spec["rolloutStrategy"]["maxSurge"], 1);
        assert_eq!(spec["rolloutStrategy"]["maxUnavailable"], 0);
        assert_eq!(spec["targetRef"]["containerName"], "openmed-service");
        ns.delete().await;
    });
}

fn model(spec: Value) -> String {
    serde_yaml::to_string(&json!({
        "apiVersion": "openmed.ai/v1alpha1",
        "kind": "OpenMedModel",
        "metadata": {"name": "probe"},
        "spec": spec,
    }))
    .unwrap()
}

fn base() -> Value {
    json!({"family": "pii", "tier": "Small", "version": "OpenMed/pii-v1", "replicas": 2})
}

/// A canary block with every part, valid.
fn canary() -> Value {
    json!({
        "targetRef": {"name": "svc-canary"},
        "trafficRef": {"httpRoute": "svc", "ruleName": "main",
                       "stableBackend": "openmed-service", "canaryBackend": "openmed-service-canary"},
        "steps": [{"weight": 10, "pause": "30s"}, {"weight": 50}],
        "analysis": {"interval": "30s", "failureLimit": 1,
                     "metrics": [{"name": "error-rate", "thresholdRange": {"max": 0.01},
                                  "prometheus": {"address": "http://prometheus.monitoring:9090",
                                                 "query": "sum(rate(errors{service=\"{{canary}}\"}[1m]))"}}],
                     "webhooks": [{"name": "smoke", "url": "https://checks.example/canary"}]},
    })
}

fn with(path: &[&str], value: Value) -> Value {
    let mut spec = base();
    if path[0] == "canary" && path.len() > 1 {
        spec["canary"] = canary();
    }
    let mut node = &mut spec;
    for key in &path[..path.len() - 1] {
        if node.get(*key).is_none() {
            node[*key] = json!({});
        }
        node = &mut node[*key];
    }
    node[path[path.len() - 1]] = value;
    spec
}

fn the_server_and_validate_accept_and_reject_the_same_objects() {
    let cases: Vec<(&str, Value, bool)> = vec![
        ("valid", base(), true),
        ("unknown spec field", with(&["replica"], json!(2)), false),
        (
            "unknown nested field",
            with(&["rolloutStrategy", "maxSurges"], json!(1)),
            false,
        ),
        ("tier Huge", with(&["tier"], json!("Huge")), false),
        ("replicas 0", with(&["replicas"], json!(0)), false),
        ("replicas 1001", with(&["replicas"], json!(1001)), false),
        ("replicas 1000", with(&["replicas"], json!(1000)), true),
        (
            "zero surge and zero unavailable",
            with(
                &["rolloutStrategy"],
                json!({"maxSurge": 0, "maxUnavailable": 0}),
            ),
            false,
        ),
        (
            "zero percent surge and zero unavailable",
            with(
                &["rolloutStrategy"],
                json!({"maxSurge": "0%", "maxUnavailable": 0}),
            ),
            false,
        ),
        (
            "Recreate with zero and zero",
            with(
                &["rolloutStrategy"],
                json!({"type": "Recreate", "maxSurge": 0, "maxUnavailable": 0}),
            ),
            true,
        ),
        (
            "maxSurge 150%",
            with(&["rolloutStrategy", "maxSurge"], json!("150%")),
            false,
        ),
        (
            "maxSurge 100%",
            with(&["rolloutStrategy", "maxSurge"], json!("100%")),
            true,
        ),
        (
            "maxSurge 5",
            with(&["rolloutStrategy", "maxSurge"], json!(5)),
            true,
        ),
        (
            "maxSurge -1",
            with(&["rolloutStrategy", "maxSurge"], json!(-1)),
            false,
        ),
        (
            "maxSurge 05%",
            with(&["rolloutStrategy", "maxSurge"], json!("05%")),
            false,
        ),
        (
            "version with a space",
            with(&["version"], json!("OpenMed/pii v1")),
            false,
        ),
        (
            "version with a leading slash",
            with(&["version"], json!("/OpenMed/pii-v1")),
            false,
        ),
        // A version with a digest: the CRD stores it (the earlier
        // operator's resources move over unchanged) and an admission policy
        // refuses a new one (admission::a_version_the_service_cannot_load_*).
        (
            "uppercase container name",
            with(&["targetRef", "containerName"], json!("OpenMed")),
            false,
        ),
        (
            "family starting with a digit",
            with(&["family"], json!("1pii")),
            false,
        ),
        (
            "progress deadline 0",
            with(&["rolloutStrategy", "progressDeadlineSeconds"], json!(0)),
            false,
        ),
        (
            "missing tier",
            json!({"family": "pii", "version": "v1"}),
            false,
        ),
        (
            "ConfigMap name with an underscore",
            with(&["manifestConfigMapName"], json!("a_b")),
            false,
        ),
        ("a canary", with(&["canary"], canary()), true),
        (
            "canary steps not increasing",
            with(
                &["canary", "steps"],
                json!([{"weight": 50}, {"weight": 10}]),
            ),
            false,
        ),
        (
            "canary steps repeating a weight",
            with(
                &["canary", "steps"],
                json!([{"weight": 10}, {"weight": 10}]),
            ),
            false,
        ),
        (
            "canary step weight 100",
            with(&["canary", "steps"], json!([{"weight": 100}])),
            false,
        ),
        (
            "canary without steps",
            with(&["canary", "steps"], json!([])),
            false,
        ),
        (
            "canary pause of five minutes",
            with(&["canary", "steps"], json!([{"weight": 5, "pause": "5m"}])),
            true,
        ),
        (
            "canary pause without a unit",
            with(&["canary", "steps"], json!([{"weight": 5, "pause": "300"}])),
            false,
        ),
        (
            "canary backends the same",
            with(
                &["canary", "trafficRef", "canaryBackend"],
                json!("openmed-service"),
            ),
            false,
        ),
        (
            "canary analysis with nothing to measure",
            with(&["canary", "analysis"], json!({"interval": "1m"})),
            false,
        ),
        (
            "canary threshold with no bound",
            with(
                &["canary", "analysis"],
                json!({"metrics": [{"name": "errors", "thresholdRange": {},
                       "prometheus": {"address": "http://p:9090", "query": "up"}}]}),
            ),
            false,
        ),
        (
            "canary threshold min above max",
            with(
                &["canary", "analysis"],
                json!({"metrics": [{"name": "errors", "thresholdRange": {"min": 2, "max": 1},
                       "prometheus": {"address": "http://p:9090", "query": "up"}}]}),
            ),
            false,
        ),
        (
            "canary webhook timeout at the cap",
            with(
                &["canary", "analysis"],
                json!({"webhooks": [{"name": "smoke", "url": "http://w", "timeout": "30s"}]}),
            ),
            true,
        ),
        (
            "canary webhook timeout over the cap",
            with(
                &["canary", "analysis"],
                json!({"webhooks": [{"name": "smoke", "url": "http://w", "timeout": "30s1ms"}]}),
            ),
            false,
        ),
        (
            "canary webhook timeout of hours",
            with(
                &["canary", "analysis"],
                json!({"webhooks": [{"name": "smoke", "url": "http://w", "timeout": "999999999h"}]}),
            ),
            false,
        ),
        (
            "a quality gate on a pii model",
            with(
                &["qualityGate"],
                json!({"configMapRef": {"name": "probes"}}),
            ),
            true,
        ),
        (
            "a quality gate on a family it cannot judge",
            {
                let mut spec = with(
                    &["qualityGate"],
                    json!({"configMapRef": {"name": "probes"}}),
                );
                spec["family"] = json!("disease-detection");
                spec
            },
            false,
        ),
        (
            "canary probes on a family they cannot judge",
            {
                let mut spec = with(
                    &["canary", "analysis"],
                    json!({"probes": {"configMapRef": {"name": "probes"}}}),
                );
                spec["family"] = json!("disease-detection");
                spec
            },
            false,
        ),
        (
            "canary Prometheus address without a scheme",
            with(
                &["canary", "analysis"],
                json!({"metrics": [{"name": "errors", "thresholdRange": {"max": 1},
                       "prometheus": {"address": "prometheus:9090", "query": "up"}}]}),
            ),
            false,
        ),
        (
            "autoscaling with the service's defaults",
            with(&["autoscaling"], json!({})),
            true,
        ),
        (
            "autoscaling min above max",
            with(
                &["autoscaling"],
                json!({"minReplicas": 5, "maxReplicas": 2}),
            ),
            false,
        ),
        (
            "autoscaling min equal to max",
            with(
                &["autoscaling"],
                json!({"minReplicas": 3, "maxReplicas": 3}),
            ),
            true,
        ),
        (
            "autoscaling min above the default max",
            with(&["autoscaling"], json!({"minReplicas": 11})),
            false,
        ),
        (
            "autoscaling queue target 0",
            with(&["autoscaling"], json!({"queueDepthPerPod": 0})),
            false,
        ),
        (
            "autoscaling in-flight target below 0",
            with(&["autoscaling"], json!({"inflightRequestsPerPod": -1})),
            false,
        ),
        (
            "autoscaling max 0",
            with(
                &["autoscaling"],
                json!({"minReplicas": 1, "maxReplicas": 0}),
            ),
            false,
        ),
        (
            "autoscaling through KEDA without an address",
            with(&["autoscaling"], json!({"keda": {}})),
            false,
        ),
        (
            "autoscaling through KEDA at a URL",
            with(
                &["autoscaling"],
                json!({"keda": {"prometheusAddress": "http://prometheus.monitoring:9090"}}),
            ),
            true,
        ),
    ];
    block_on(async {
        let client = admin().await;
        install_crd(&client).await;
        let ns = TestNamespace::create(&client, "validate").await;
        let mut disagreements = Vec::new();
        for (name, spec, expected) in cases {
            let yaml = model(spec.clone());
            let server = try_apply_yaml(&client, Some(&ns.name), &yaml, "e2e", true).await;
            let object: Value = serde_yaml::from_str(&yaml).unwrap();
            let internal = openmed_op::api::validate(&object, None);
            if let Err(kube::Error::Api(status)) = &server {
                // Invalid values are 422; server-side apply reports a field
                // the schema does not declare as a failed typed patch (500).
                assert!(
                    status.code == 422 || status.message.contains("field not declared in schema"),
                    "{name}: {status:?}"
                );
                assert!(
                    status.message.contains("spec"),
                    "{name}: the server names the field: {}",
                    status.message
                );
            }
            if let Err(e) = &server
                && !matches!(e, kube::Error::Api(_))
            {
                panic!("{name}: {e}");
            }
            if server.is_ok() != expected || internal.is_ok() != expected {
                disagreements.push(format!(
                    "{name}: expected {}, server {}, validate {}",
                    if expected { "accept" } else { "reject" },
                    match &server {
                        Ok(_) => "accepted".to_owned(),
                        Err(e) => format!("rejected ({e})"),
                    },
                    match &internal {
                        Ok(_) => "accepted".to_owned(),
                        Err(e) => format!("rejected ({e:?})"),
                    }
                ));
            }
        }
        assert!(disagreements.is_empty(), "{}", disagreements.join("\n"));
        ns.delete().await;
    });
}

fn the_example_deployment_becomes_available() {
    block_on(async {
        let client = admin().await;
        let ns = TestNamespace::create(&client, "available").await;
        let service =
            std::fs::read_to_string(root().join("examples/openmed/openmed-service.yaml")).unwrap();
        let docs: String = service
            .split("\n---\n")
            .filter(|d| !d.contains("kind: Namespace"))
            .collect::<Vec<_>>()
            .join("\n---\n");
        apply_yaml(&client, Some(&ns.name), &docs, "e2e").await;
        let api: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
        wait_until(
            "the example Deployment to become Available with its one ready pod (the model, not the Deployment in Git, says how many)",
            Duration::from_secs(60),
            || async { api.get("openmed-service").await.ok().and_then(|d| d.status) },
            |s| {
                s.as_ref().is_some_and(|s| {
                    s.ready_replicas == Some(1)
                        && s.conditions
                            .iter()
                            .flatten()
                            .any(|c| c.type_ == "Available" && c.status == "True")
                })
            },
        )
        .await;
        ns.delete().await;
    });
}

fn an_unready_version_exceeds_its_progress_deadline() {
    block_on(async {
        let client = admin().await;
        let ns = TestNamespace::create(&client, "deadline").await;
        let version = format!("OpenMed/never-ready-{}", ns.name);
        mark_unready(&client, &[&version]).await;
        let yaml = format!(
            "apiVersion: apps/v1
kind: Deployment
metadata:
  name: stuck
spec:
  replicas: 1
  progressDeadlineSeconds: 5
  selector:
    matchLabels: {{app: stuck}}
  template:
    metadata:
      labels: {{app: stuck}}
    spec:
      containers:
      - name: openmed-service
        image: openmed
        env:
        - name: OPENMED_SERVICE_PRELOAD_MODELS
          value: {version}
"
        );
        apply_yaml(&client, Some(&ns.name), &yaml, "e2e").await;
        let api: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
        wait_until(
            "Progressing=False reason ProgressDeadlineExceeded from the Deployment controller",
            Duration::from_secs(90),
            || async { api.get("stuck").await.ok().and_then(|d| d.status) },
            |s| {
                s.as_ref().is_some_and(|s| {
                    s.conditions.iter().flatten().any(|c| {
                        c.type_ == "Progressing"
                            && c.status == "False"
                            && c.reason.as_deref() == Some("ProgressDeadlineExceeded")
                    })
                })
            },
        )
        .await;
        let pods = kubectl(&[
            "get",
            "pods",
            "-n",
            &ns.name,
            "-o",
            "jsonpath={.items[*].status.phase}",
        ])
        .1;
        assert!(
            pods.contains("Running"),
            "the pod runs but is not ready: {pods}"
        );
        ns.delete().await;
    });
}
