//! Fault paths that only a real API server can show: a field that another
//! writer (here a MutatingAdmissionPolicy) keeps rewriting, and readiness
//! while the operator cannot see the cluster.

use std::time::Duration;

use kube::api::{DeleteParams, Patch, PatchParams};
use libtest_mimic::Trial;
use serde_json::{Value, json};

use crate::operator::{Env, deployment_yaml, model_yaml};
use crate::support::*;
use crate::trial;

pub fn trials() -> Vec<Trial> {
    vec![
        trial(
            "faults::a_field_another_writer_keeps_rewriting_backs_off_instead_of_looping",
            a_field_another_writer_keeps_rewriting_backs_off_instead_of_looping,
        ),
        trial(
            "faults::readyz_fails_until_every_cache_has_synced",
            readyz_fails_until_every_cache_has_synced,
        ),
        trial(
            "faults::a_refused_release_keeps_the_config_maps_and_the_finalizer",
            a_refused_release_keeps_the_config_maps_and_the_finalizer,
        ),
    ]
}

const WAIT: Duration = Duration::from_secs(90);
/// Three retries at the backoff's cap (60 s), and some.
const BACKOFF_CAPPED: Duration = Duration::from_secs(200);

/// Start times of the bursts of Deployment writes the operator sent in
/// `namespace` after byte `from` of the audit log (writes less than a
/// second apart are one burst: one reconcile's passes).
fn write_bursts(namespace: &str, from: u64) -> Vec<f64> {
    let times = operator_requests(namespace, from)
        .into_iter()
        .filter(|e| e["objectRef"]["resource"] == "deployments" && e["verb"] == "patch")
        .map(|e| {
            let stamp = e["requestReceivedTimestamp"].as_str().unwrap();
            let t: k8s_openapi::jiff::Timestamp = stamp.parse().unwrap();
            t.as_millisecond() as f64 / 1000.0
        });
    let mut bursts: Vec<f64> = Vec::new();
    let mut last = f64::MIN;
    for t in times {
        if t - last > 1.0 {
            bursts.push(t);
        }
        last = t;
    }
    bursts
}

fn a_field_another_writer_keeps_rewriting_backs_off_instead_of_looping() {
    block_on(async {
        let env = Env::new("rewrite").await;
        let v1 = env.version("v1");
        env.apply(&deployment_yaml("svc", "openmed-service", "boot"))
            .await;
        env.apply(&model_yaml("svc", &v1, "")).await;
        env.wait_ready("svc", &v1).await;

        // Another writer the operator cannot win against: every write of a
        // managed Deployment in this namespace gets replicas 3 (the spec
        // asks for 2).
        let name = format!("e2e-pin-replicas-{}", env.ns.name);
        let policy = format!(
            "apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicy
metadata:
  name: {name}
spec:
  matchConstraints:
    resourceRules:
    - apiGroups: [apps]
      apiVersions: [v1]
      operations: [CREATE, UPDATE]
      resources: [deployments]
  matchConditions:
  - name: managed
    expression: \"has(object.metadata.labels) && 'openmed.ai/operated-by' in object.metadata.labels\"
  failurePolicy: Fail
  reinvocationPolicy: Never
  mutations:
  - patchType: ApplyConfiguration
    applyConfiguration:
      expression: 'Object{{spec: Object.spec{{replicas: 3}}}}'
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicyBinding
metadata:
  name: {name}
spec:
  policyName: {name}
  matchResources:
    namespaceSelector:
      matchLabels:
        kubernetes.io/metadata.name: {}
",
            env.ns.name
        );
        let from = audit_log_end();
        apply_yaml(&env.client, None, &policy, "e2e-user").await;
        // The API server picks the policy up within a moment: touch the
        // Deployment until a write comes back rewritten. The operator then
        // finds replicas changed, restores them, and keeps losing.
        let mut touch = 0;
        let deployments = env.deployments();
        wait_for("the policy to rewrite a write", WAIT, || {
            touch += 1;
            let patch = json!({"metadata": {"annotations": {"e2e/touch": touch.to_string()}}});
            let deployments = deployments.clone();
            async move {
                let stored = deployments
                    .patch("svc", &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .unwrap();
                (stored.spec?.replicas == Some(3)).then_some(())
            }
        })
        .await;
        let s = env
            .wait_status("svc", "the failure to show in Reconciling", |s| {
                s.conditions.iter().any(|c| {
                    c.type_ == "Reconciling"
                        && c.status == "True"
                        && c.reason == "RetryingAfterError"
                        && c.message.contains("not-converged")
                })
            })
            .await;
        assert_eq!(
            s.phase,
            Some(openmed_op::api::Phase::Ready),
            "the model is still served"
        );
        // The earlier operator came back every second, forever. Now the
        // spacing between retries doubles (from 1 s, or from wherever the
        // watch events of the touches above left it) towards its cap. Each
        // touch wakes the resource and fails it once more, so on a busy
        // machine, where the policy takes longer to start rewriting, the
        // spacing may already be at the 60 s cap: three bursts then take
        // two minutes.
        let bursts = wait_for("retries at least 4 s apart", BACKOFF_CAPPED, || async {
            let bursts = write_bursts(&env.ns.name, from);
            let n = bursts.len();
            (n >= 3 && bursts[n - 1] - bursts[n - 2] >= 4.0).then_some(bursts)
        })
        .await;
        let n = bursts.len();
        let (before, last) = (bursts[n - 2] - bursts[n - 3], bursts[n - 1] - bursts[n - 2]);
        assert!(
            last >= before,
            "the spacing between retries shrank: bursts at {bursts:?}"
        );
        let metrics = env.operator.metrics().await;
        assert!(
            metrics.contains("category=\"not-converged\""),
            "counted by category:\n{metrics}"
        );

        // The other writer goes; the operator recovers on its own.
        for kind in ["mutatingadmissionpolicybinding", "mutatingadmissionpolicy"] {
            let (ok, _, err) = kubectl(&["delete", kind, &name]);
            assert!(ok, "{err}");
        }
        // The retry may be a minute away by now; a change to the Deployment
        // (what fixing the cause usually brings) wakes the resource at once.
        // The API server drops a deleted policy from its cache a moment
        // later, so a touch that comes too soon meets the rewrite again:
        // touch until the error clears.
        let mut touches = 0;
        wait_until(
            "the error to clear after the policy went",
            WAIT,
            || {
                touches += 1;
                let (deployments, models) = (env.deployments(), env.status("svc"));
                async move {
                    let touch = json!({"metadata": {"annotations": {"e2e/touch": format!("fixed-{touches}")}}});
                    deployments
                        .patch("svc", &PatchParams::default(), &Patch::Merge(&touch))
                        .await
                        .unwrap();
                    tokio::time::sleep(Duration::from_secs(2)).await; // a touch every 2 s while polling
                    models.await
                }
            },
            |s| {
                !s.conditions
                    .iter()
                    .any(|c| c.reason == "RetryingAfterError")
            },
        )
        .await;
        let live = env.deployments().get("svc").await.unwrap();
        assert_eq!(live.spec.unwrap().replicas, Some(2));
        env.finish().await;
    });
}

fn readyz_fails_until_every_cache_has_synced() {
    block_on(async {
        let mut env = Env::new("readyz").await;
        wait_for("the operator to be ready", WAIT, || async {
            http_get(&env.operator.addr, "/readyz")
                .await
                .filter(|body| body == "ok")
        })
        .await;

        // An identity that may watch everything but ReplicaSets: that cache
        // never syncs, so the operator must not say it is ready. Liveness
        // still answers.
        let user = format!("e2e-blind-{}", env.ns.name);
        let rbac = format!(
            "apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {user}
rules:
- apiGroups: [openmed.ai]
  resources: [openmedmodels]
  verbs: [get, list, watch, patch]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch]
- apiGroups: ['']
  resources: [configmaps]
  verbs: [get, list, watch]
- apiGroups: [autoscaling]
  resources: [horizontalpodautoscalers]
  verbs: [list, watch]
---
{}",
            binding(&user, &user)
        );
        apply_yaml(&env.client, None, &rbac, "e2e-user").await;
        let path = kubeconfig_as(&user);
        env.operator.kill();
        let blind = Operator::start_with(&path, &env.ns.name, &[]);
        let status = wait_for("an answer on /healthz", WAIT, || async {
            http_get(&blind.addr, "/healthz").await
        })
        .await;
        assert_eq!(status, "ok", "alive");
        let code = wait_for("a status code on /readyz", WAIT, || async {
            http_status(&blind.addr, "/readyz").await
        })
        .await;
        assert_eq!(
            code, 503,
            "not ready while the ReplicaSet cache cannot sync"
        );
        env.operator = blind;
        env.finish().await;
        let _ = std::fs::remove_file(path);
        for kind in ["ClusterRoleBinding", "ClusterRole"] {
            kubectl(&["delete", &kind.to_lowercase(), &user, "--ignore-not-found"]);
        }
    });
}

fn binding(user: &str, role: &str) -> String {
    format!(
        "apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {user}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: {role}
subjects:
- apiGroup: rbac.authorization.k8s.io
  kind: User
  name: {user}
"
    )
}

fn a_refused_release_keeps_the_config_maps_and_the_finalizer() {
    block_on(async {
        let mut env = Env::new("refused").await;
        let v1 = env.version("v1");
        // An operator whose identity holds the installed role, and later
        // loses the right to patch Deployments (a 403 on the release).
        let user = format!("e2e-refused-{}", env.ns.name);
        operator_kubeconfig(); // installs deploy/operator and its ClusterRole
        apply_yaml(
            &env.client,
            None,
            &binding(&user, "openmed-operator"),
            "e2e-user",
        )
        .await;
        let path = kubeconfig_as(&user);
        env.operator.kill();
        env.operator = Operator::start_with(&path, &env.ns.name, &[]);
        env.apply(&deployment_yaml("svc", "openmed-service", "boot"))
            .await;
        env.apply(&model_yaml("svc", &v1, "")).await;
        env.wait_ready("svc", &v1).await;
        let blind = format!(
            "apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {user}
rules:
- apiGroups: [openmed.ai]
  resources: [openmedmodels]
  verbs: [get, list, watch, patch]
- apiGroups: [openmed.ai]
  resources: [openmedmodels/status]
  verbs: [update, patch]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch]
- apiGroups: [apps]
  resources: [replicasets]
  verbs: [list, watch]
- apiGroups: ['']
  resources: [configmaps]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [autoscaling]
  resources: [horizontalpodautoscalers]
  verbs: [list, watch]
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [get, create, patch]
"
        );
        apply_yaml(&env.client, None, &blind, "e2e-user").await;
        kubectl(&["delete", "clusterrolebinding", &user]);
        apply_yaml(&env.client, None, &binding(&user, &user), "e2e-user").await;

        let errors = "controller_runtime_reconcile_errors_total{controller=\"openmedmodel\",category=\"client\"}";
        let before = counter(&env.operator.metrics().await, errors);
        env.models()
            .delete("svc", &DeleteParams::default())
            .await
            .unwrap();
        wait_for("two refused releases", WAIT, || async {
            let now = counter(&env.operator.metrics().await, errors);
            (now >= before + 2.0).then_some(())
        })
        .await;
        // The earlier operator swallowed the 403 and deleted the ConfigMap
        // the Deployment still reads. Now nothing that depends on the
        // release has happened.
        let live = serde_json::to_value(env.deployments().get("svc").await.unwrap()).unwrap();
        let reads = live
            .pointer("/spec/template/spec/containers/0/env/0/valueFrom/configMapKeyRef/name")
            .and_then(Value::as_str)
            .expect("still managed: the release was refused")
            .to_owned();
        assert!(
            env.config_maps().get_opt(&reads).await.unwrap().is_some(),
            "the ConfigMap the Deployment reads is kept"
        );
        assert!(
            env.models().get_opt("svc").await.unwrap().is_some(),
            "the finalizer holds the resource"
        );

        // The right comes back; the deletion completes on its own.
        kubectl(&["delete", "clusterrolebinding", &user]);
        apply_yaml(
            &env.client,
            None,
            &binding(&user, "openmed-operator"),
            "e2e-user",
        )
        .await;
        env.wait_model_gone("svc", WAIT).await;
        let live = serde_json::to_value(env.deployments().get("svc").await.unwrap()).unwrap();
        assert!(
            live.pointer("/spec/template/spec/containers/0/env/0/valueFrom")
                .is_none()
        );
        env.finish().await;
        let _ = std::fs::remove_file(path);
        kubectl(&["delete", "clusterrolebinding", &user, "--ignore-not-found"]);
        kubectl(&["delete", "clusterrole", &user, "--ignore-not-found"]);
    });
}
