//! A pod always loads the model of its own template, whatever is recreated
//! and when: pods of every ReplicaSet are deleted mid-rollout, after an
//! automatic and a manual rollback, under Recreate, while the ConfigMap is
//! renamed and while the resource is deleted in the foreground. What a pod
//! loads is read the way its container would: the ConfigMap its env entry
//! names, resolved now.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DeleteParams, ListParams, PropagationPolicy};
use kube::{Client, ResourceExt};
use libtest_mimic::Trial;
use openmed_op::api::Phase;
use serde_json::json;

use crate::operator::{Env, deployment_yaml, model_yaml};
use crate::support::*;
use crate::trial;

pub fn trials() -> Vec<Trial> {
    vec![
        trial(
            "snapshots::a_recreated_pod_loads_its_own_model_during_a_failing_rollout_and_after_its_rollback",
            a_recreated_pod_loads_its_own_model_during_a_failing_rollout_and_after_its_rollback,
        ),
        trial(
            "snapshots::a_recreated_pod_loads_its_own_model_during_and_after_a_manual_rollback",
            a_recreated_pod_loads_its_own_model_during_and_after_a_manual_rollback,
        ),
        trial(
            "snapshots::a_recreated_pod_loads_the_restored_model_after_a_rollback_under_recreate",
            a_recreated_pod_loads_the_restored_model_after_a_rollback_under_recreate,
        ),
        trial(
            "snapshots::renaming_the_config_map_never_leaves_a_pod_without_its_config_map",
            renaming_the_config_map_never_leaves_a_pod_without_its_config_map,
        ),
        trial(
            "snapshots::a_foreground_deletion_never_leaves_a_reference_to_a_missing_config_map",
            a_foreground_deletion_never_leaves_a_reference_to_a_missing_config_map,
        ),
        trial(
            "snapshots::deleting_one_of_two_models_serving_the_same_version_finishes",
            deleting_one_of_two_models_serving_the_same_version_finishes,
        ),
    ]
}

/// Two resources at the same family, tier and version share their
/// snapshots' short hash (the ReplicaSets' label); deleting one waits for
/// its own pods only.
fn deleting_one_of_two_models_serving_the_same_version_finishes() {
    block_on(async {
        let env = Env::new("twins").await;
        let v1 = env.version("v1");
        for name in ["svc-a", "svc-b"] {
            env.apply(&deployment_yaml(name, "openmed-service", "boot"))
                .await;
            env.apply(&model_yaml(name, &v1, "")).await;
        }
        env.wait_ready("svc-a", &v1).await;
        env.wait_ready("svc-b", &v1).await;
        env.models()
            .delete("svc-a", &DeleteParams::default())
            .await
            .unwrap();
        env.wait_model_gone("svc-a", WAIT).await;
        let left: Vec<String> = env
            .config_maps()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .map(|cm| cm.name_any())
            .filter(|n| n.contains("model-manifest"))
            .collect();
        assert!(
            left.iter().all(|n| n.starts_with("svc-b-")) && !left.is_empty(),
            "svc-a's ConfigMaps are gone, svc-b's stay: {left:?}"
        );
        let b = env.status("svc-b").await;
        assert_eq!(b.phase, Some(Phase::Ready), "svc-b serves on");
        env.finish().await;
    });
}

const WAIT: Duration = Duration::from_secs(90);

/// A pod as the test sees it: its ReplicaSet, readiness, and the model its
/// container resolves.
#[derive(Debug, Clone, PartialEq)]
struct PodView {
    name: String,
    replica_set: String,
    ready: bool,
    /// The ConfigMap its env entry names, if any.
    reference: Option<String>,
    /// What that ConfigMap holds now (`None`: no reference, or missing).
    model: Option<String>,
    /// The kubelet could not resolve the env entry.
    config_error: bool,
}

async fn pods(client: &Client, namespace: &str) -> Vec<PodView> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let mut out = Vec::new();
    for pod in api.list(&ListParams::default()).await.unwrap().items {
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let spec = pod.spec.clone().unwrap_or_default();
        let reference = spec.containers.iter().find_map(|c| {
            c.env.as_ref()?.iter().find_map(|e| {
                (e.name == "OPENMED_SERVICE_PRELOAD_MODELS")
                    .then(|| e.value_from.as_ref()?.config_map_key_ref.as_ref())
                    .flatten()
                    .map(|r| r.name.clone())
            })
        });
        let model = match &reference {
            Some(name) => cms
                .get_opt(name)
                .await
                .unwrap()
                .and_then(|cm| cm.data?.remove("OPENMED_SERVICE_PRELOAD_MODELS")),
            None => None,
        };
        let status = pod.status.clone().unwrap_or_default();
        let ready = status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        let config_error = status.container_statuses.iter().flatten().any(|c| {
            c.state
                .as_ref()
                .and_then(|s| s.waiting.as_ref())
                .and_then(|w| w.reason.as_deref())
                == Some("CreateContainerConfigError")
        });
        out.push(PodView {
            name: pod.name_any(),
            replica_set: pod
                .owner_references()
                .first()
                .map(|o| o.name.clone())
                .unwrap_or_default(),
            ready,
            reference,
            model,
            config_error,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The ReplicaSet of the Deployment's current template: the one whose
/// revision is the Deployment's, once the controller has caught up.
async fn current_replica_set(env: &Env, deployment: &str) -> String {
    const REVISION: &str = "deployment.kubernetes.io/revision";
    wait_for("the current template's ReplicaSet", WAIT, || async {
        let live = env.deployments().get(deployment).await.unwrap();
        let observed = live.status.as_ref().and_then(|s| s.observed_generation);
        if observed < live.metadata.generation {
            return None;
        }
        let revision = live.annotations().get(REVISION)?.clone();
        let api: Api<ReplicaSet> = Api::namespaced(env.client.clone(), &env.ns.name);
        api.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|rs| rs.annotations().get(REVISION) == Some(&revision))
            .map(|rs| rs.name_any())
    })
    .await
}

/// Deletes one pod of `replica_set` and waits for its Ready replacement;
/// returns what the replacement loads.
async fn recreate_one(env: &Env, replica_set: &str) -> PodView {
    let before = pods(&env.client, &env.ns.name).await;
    let victim = before
        .iter()
        .find(|p| p.replica_set == replica_set)
        .unwrap_or_else(|| panic!("no pod of {replica_set}: {before:?}"))
        .clone();
    let api: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns.name);
    api.delete(&victim.name, &DeleteParams::default())
        .await
        .unwrap();
    let known: Vec<String> = before.iter().map(|p| p.name.clone()).collect();
    wait_for(
        &format!("a Ready replacement in {replica_set} for {}", victim.name),
        WAIT,
        || async {
            pods(&env.client, &env.ns.name)
                .await
                .into_iter()
                .find(|p| p.replica_set == replica_set && !known.contains(&p.name) && p.ready)
        },
    )
    .await
}

fn a_recreated_pod_loads_its_own_model_during_a_failing_rollout_and_after_its_rollback() {
    block_on(async {
        let env = Env::new("snaproll").await;
        let (v1, bad) = (env.version("v1"), env.version("bad"));
        mark_unready(&env.client, &[&bad]).await;
        env.apply(&deployment_yaml("svc", "openmed-service", "boot"))
            .await;
        let strategy = "  rolloutStrategy:\n    progressDeadlineSeconds: 25\n";
        env.apply(&model_yaml("svc", &v1, strategy).replace("replicas: 2", "replicas: 3"))
            .await;
        env.wait_ready("svc", &v1).await;
        let old = current_replica_set(&env, "svc").await;

        env.set_spec("svc", json!({"version": bad})).await;
        wait_until(
            "a pod of the new, never-ready template",
            WAIT,
            || pods(&env.client, &env.ns.name),
            |pods| pods.iter().any(|p| p.replica_set != old && !p.ready),
        )
        .await;
        // A v1 pod recreated mid-rollout (an eviction, a node drain) loads
        // v1 and becomes Ready; the earlier design gave it the version
        // under test, and it never did.
        let replacement = recreate_one(&env, &old).await;
        assert_eq!(replacement.model.as_deref(), Some(v1.as_str()));
        let during = pods(&env.client, &env.ns.name).await;
        for p in &during {
            let want = if p.replica_set == old { &v1 } else { &bad };
            assert_eq!(p.model.as_deref(), Some(want.as_str()), "{p:?}");
        }

        let s = env.wait_rolled_back("svc").await;
        assert_eq!(s.rollback_count, Some(1));
        let restored = current_replica_set(&env, "svc").await;
        assert_eq!(restored, old, "the rollback revives v1's ReplicaSet");
        let replacement = recreate_one(&env, &restored).await;
        assert_eq!(replacement.model.as_deref(), Some(v1.as_str()));
        let pointer = env.config_maps().get("svc-model-manifest").await.unwrap();
        assert_eq!(
            pointer.data.unwrap()["OPENMED_SERVICE_PRELOAD_MODELS"],
            v1,
            "the pointer names the version every pod serves"
        );
        env.finish().await;
    });
}

fn a_recreated_pod_loads_its_own_model_during_and_after_a_manual_rollback() {
    block_on(async {
        let env = Env::new("snapmanual").await;
        let (v1, v2) = (env.version("v1"), env.version("v2"));
        env.apply(&deployment_yaml("svc", "openmed-service", "boot"))
            .await;
        let strategy = "  rolloutStrategy:\n    progressDeadlineSeconds: 60\n";
        env.apply(&model_yaml("svc", &v1, strategy)).await;
        env.wait_ready("svc", &v1).await;
        env.set_spec("svc", json!({"version": v2})).await;
        env.wait_ready("svc", &v2).await;
        let v2_set = current_replica_set(&env, "svc").await;
        env.annotate("svc", "openmed.ai/rollback-to", Some(&v1))
            .await;
        env.wait_manual_rollback("svc", &v1).await;
        let restored = current_replica_set(&env, "svc").await;
        assert_ne!(restored, v2_set);
        let replacement = recreate_one(&env, &restored).await;
        assert_eq!(replacement.model.as_deref(), Some(v1.as_str()));

        // Forward to v2 again, then a manual rollback to v1 that cannot
        // finish (v1's new pods no longer warm up). Meanwhile a v2 pod is
        // recreated: it loads v2, its own template's model, and is Ready.
        env.annotate("svc", "openmed.ai/rollback-to", None).await;
        env.wait_ready("svc", &v2).await;
        assert_eq!(current_replica_set(&env, "svc").await, v2_set);
        mark_unready(&env.client, &[&v1]).await;
        env.annotate("svc", "openmed.ai/rollback-to", Some(&v1))
            .await;
        wait_until(
            "a pod of the rollback's never-ready template",
            WAIT,
            || pods(&env.client, &env.ns.name),
            |pods| pods.iter().any(|p| p.replica_set != v2_set && !p.ready),
        )
        .await;
        let replacement = recreate_one(&env, &v2_set).await;
        assert_eq!(replacement.model.as_deref(), Some(v2.as_str()));
        env.finish().await;
    });
}

fn a_recreated_pod_loads_the_restored_model_after_a_rollback_under_recreate() {
    block_on(async {
        let env = Env::new("snaprecreate").await;
        let (v1, bad) = (env.version("v1"), env.version("bad"));
        mark_unready(&env.client, &[&bad]).await;
        env.apply(&deployment_yaml("svc", "openmed-service", "boot"))
            .await;
        let strategy = "  rolloutStrategy:\n    type: Recreate\n    progressDeadlineSeconds: 8\n";
        env.apply(&model_yaml("svc", &v1, strategy)).await;
        env.wait_ready("svc", &v1).await;
        env.set_spec("svc", json!({"version": bad})).await;
        env.wait_rolled_back("svc").await;
        let restored = current_replica_set(&env, "svc").await;
        let replacement = recreate_one(&env, &restored).await;
        assert_eq!(replacement.model.as_deref(), Some(v1.as_str()));
        env.finish().await;
    });
}

fn renaming_the_config_map_never_leaves_a_pod_without_its_config_map() {
    block_on(async {
        let env = Env::new("snaprename").await;
        let v1 = env.version("v1");
        env.apply(&deployment_yaml("svc", "openmed-service", "boot"))
            .await;
        env.apply(&model_yaml("svc", &v1, "")).await;
        env.wait_ready("svc", &v1).await;
        let old_set = current_replica_set(&env, "svc").await;
        env.set_spec("svc", json!({"manifestConfigMapName": "models"}))
            .await;
        // Until every pod runs the renamed template, and after, each pod
        // finds the ConfigMap its template names, holding v1.
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let now = pods(&env.client, &env.ns.name).await;
            for p in &now {
                assert!(!p.config_error, "{p:?}");
                assert_eq!(p.model.as_deref(), Some(v1.as_str()), "{p:?}");
            }
            let s = env.status("svc").await;
            let names: Vec<String> = env
                .config_maps()
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .iter()
                .map(|c| c.name_any())
                .filter(|n| n.contains("model-manifest") || n.starts_with("models"))
                .collect();
            // The old pointer goes; the old snapshot stays while the old
            // ReplicaSet (revision history) references it.
            let settled = s.phase == Some(Phase::Ready)
                && now.len() == 2
                && now.iter().all(|p| p.replica_set != old_set && p.ready)
                && !names.iter().any(|n| n == "svc-model-manifest");
            if settled {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the rename did not settle: {now:?} {names:?}\n{}",
                log_tails()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        env.finish().await;
    });
}

fn a_foreground_deletion_never_leaves_a_reference_to_a_missing_config_map() {
    block_on(async {
        let env = Env::new("snapfg").await;
        let v1 = env.version("v1");
        env.apply(&deployment_yaml("svc", "openmed-service", "boot"))
            .await;
        env.apply(&model_yaml("svc", &v1, "")).await;
        env.wait_ready("svc", &v1).await;
        // What Argo CD's prune does: the garbage collector deletes the
        // dependents first, while the operator's finalizer holds the owner.
        env.models()
            .delete(
                "svc",
                &DeleteParams {
                    propagation_policy: Some(PropagationPolicy::Foreground),
                    ..DeleteParams::default()
                },
            )
            .await
            .unwrap();
        let deadline = std::time::Instant::now() + WAIT;
        let mut seen: BTreeMap<String, Option<String>> = BTreeMap::new();
        loop {
            for p in pods(&env.client, &env.ns.name).await {
                assert!(!p.config_error, "{p:?}");
                assert!(
                    p.reference.is_none() || p.model.is_some(),
                    "a pod names a ConfigMap that is gone: {p:?}"
                );
                seen.insert(p.name.clone(), p.model.clone());
                let live = env.deployments().get("svc").await.unwrap();
                let live = serde_json::to_value(live).unwrap();
                if let Some(name) = live.pointer(
                    "/spec/template/spec/containers/0/env/0/valueFrom/configMapKeyRef/name",
                ) {
                    let exists = env
                        .config_maps()
                        .get_opt(name.as_str().unwrap())
                        .await
                        .unwrap()
                        .is_some();
                    assert!(exists, "the Deployment references missing ConfigMap {name}");
                }
            }
            let gone = env.models().get_opt("svc").await.unwrap().is_none();
            if gone {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the deletion did not finish\n{}",
                log_tails()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let live = serde_json::to_value(env.deployments().get("svc").await.unwrap()).unwrap();
        assert!(
            live.pointer("/spec/template/spec/containers/0/env/0/valueFrom")
                .is_none(),
            "released"
        );
        let left: Vec<String> = env
            .config_maps()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .map(|c| c.name_any())
            .filter(|n| n.starts_with("svc-model-manifest"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        assert!(seen.values().any(|m| m.as_deref() == Some(v1.as_str())));
        env.finish().await;
    });
}
