//! `spec.autoscaling` on the real control plane: the operator's own
//! HorizontalPodAutoscaler, acted on by kube-controller-manager's HPA
//! controller. This control plane serves no metrics API, so the autoscaler
//! can only keep the count within its bounds (and says it cannot read its
//! metrics); the load signals are measured on the real stack
//! (`tests/stack`). Here: who owns what, and that a bump, an edit of the
//! bounds and the removal never set the count the autoscaler did not ask
//! for.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use kube::Api;
use kube::runtime::watcher;
use libtest_mimic::Trial;
use serde_json::json;

use crate::env::{Env, deployment_yaml, model_yaml};
use crate::operator::ROLLOUT;
use crate::support::*;
use crate::trial;

pub fn trials() -> Vec<Trial> {
    vec![trial(
        "autoscaling::the_models_own_autoscaler_sets_the_count_through_a_bump_an_edit_and_its_removal",
        the_models_own_autoscaler_sets_the_count_through_a_bump_an_edit_and_its_removal,
    )]
}

/// The HPA controller acts every 15 s (kube-controller-manager's default
/// sync period); a few periods.
const HPA_ACTS: Duration = Duration::from_secs(90);

/// Every `spec.replicas` the Deployment `name` had, from a watch started
/// now: each change the API server records, not samples of it.
fn replicas_history(env: &Env, name: &str) -> (Arc<Mutex<Vec<i32>>>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let api: Api<Deployment> = Api::namespaced(env.client.clone(), &env.ns.name);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let record = seen.clone();
    let task = tokio::spawn(async move {
        let mut events = watcher(api, config).boxed();
        while let Some(event) = events.next().await {
            if let Ok(watcher::Event::Apply(d) | watcher::Event::InitApply(d)) = event
                && let Some(replicas) = d.spec.and_then(|s| s.replicas)
            {
                let mut seen = record.lock().unwrap();
                if seen.last() != Some(&replicas) {
                    seen.push(replicas);
                }
            }
        }
    });
    (seen, task)
}

fn the_models_own_autoscaler_sets_the_count_through_a_bump_an_edit_and_its_removal() {
    block_on(async {
        let env = Env::new("autoscale").await;
        let (v1, v2) = (env.version("v1"), env.version("v2"));
        let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(env.client.clone(), &env.ns.name);
        // The Deployment asks for 1 pod; the model for 3 to 5.
        env.apply(&deployment_yaml("svc", "openmed-service", "boot"))
            .await;
        env.apply(&model_yaml(
            "svc",
            &v1,
            "  autoscaling:\n    minReplicas: 3\n    maxReplicas: 5\n",
        ))
        .await;

        let hpa = wait_until(
            "the model's autoscaler",
            ROLLOUT,
            || async { hpas.get_opt("svc").await.unwrap() },
            Option::is_some,
        )
        .await
        .unwrap();
        let owner = &hpa.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str()),
            ("OpenMedModel", "svc")
        );
        assert_eq!(owner.controller, Some(true));
        let managers: Vec<(String, String)> = hpa
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .map(|m| {
                (
                    m.manager.clone().unwrap_or_default(),
                    m.operation.clone().unwrap_or_default(),
                )
            })
            .collect();
        assert!(
            managers.contains(&("openmed-operator".into(), "Apply".into())),
            "{managers:?}"
        );
        let spec = hpa.spec.unwrap();
        assert_eq!((spec.min_replicas, spec.max_replicas), (Some(3), 5));
        assert_eq!(spec.scale_target_ref.name, "svc");

        // The HPA controller brings the count within the bounds; the
        // operator, which asks for replicas: 2 in the spec, writes none.
        let status = env
            .wait_status(
                "svc",
                "v1 Ready on the 3 pods the autoscaler asked for",
                |s| {
                    s.active_version.as_deref() == Some(v1.as_str())
                        && s.autoscaling.as_ref().is_some_and(|a| {
                            a.desired_replicas == Some(3) && a.current_replicas == Some(3)
                        })
                },
            )
            .await;
        assert_eq!(env.deployment("svc").await["spec"]["replicas"], 3);
        let replicas_managers = field_managers_of_replicas(&env, "svc").await;
        assert!(
            !replicas_managers.iter().any(|m| m == "openmed-operator"),
            "the operator owns no replicas: {replicas_managers:?}"
        );
        drop(status);
        // No metrics API serves this control plane: the autoscaler says it
        // cannot read the service's gauges, in its own words.
        let status = env
            .wait_status(
                "svc",
                "the autoscaler reporting it cannot read its metrics",
                |s| {
                    s.autoscaling
                        .as_ref()
                        .is_some_and(|a| a.not_scaling.is_some())
                },
            )
            .await;
        // At rest the operator sends nothing: the autoscaler as the API
        // server stores it (defaults filled in) is the one it planned.
        let requests = requests_at_rest(
            &env.ns.name,
            Duration::from_secs(2),
            Duration::from_secs(20),
        )
        .await;
        assert!(
            requests.is_empty(),
            "the operator sent requests at rest:\n{}",
            requests.join("\n")
        );
        let autoscaled = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Autoscaled")
            .unwrap();
        assert_eq!(
            (autoscaled.status.as_str(), autoscaled.reason.as_str()),
            ("False", "AutoscalerNotScaling"),
            "{}",
            autoscaled.message
        );

        // A bump keeps the autoscaler's count: every spec.replicas the
        // Deployment has meanwhile is 3.
        let (seen, watch) = replicas_history(&env, "svc");
        env.set_spec("svc", json!({"version": v2})).await;
        env.wait_ready("svc", &v2).await;
        let d = env.deployment("svc").await;
        assert_eq!(d["spec"]["replicas"], 3);
        assert_eq!(d["status"]["readyReplicas"], 3);

        // An edit of the bounds rolls nothing and the autoscaler follows.
        let before = env.status("svc").await.applied_spec_hash;
        env.set_spec(
            "svc",
            json!({"autoscaling": {"minReplicas": 4, "maxReplicas": 4}}),
        )
        .await;
        wait_until(
            "the Deployment at the new minimum, 4",
            HPA_ACTS,
            || env.deployment("svc"),
            |d| d["spec"]["replicas"] == 4,
        )
        .await;
        assert_eq!(env.status("svc").await.applied_spec_hash, before);

        // Removal: the autoscaler goes, the count stays until spec.replicas
        // (2) is applied, and nothing in between.
        env.set_spec("svc", json!({"autoscaling": null})).await;
        wait_until(
            "the autoscaler deleted",
            ROLLOUT,
            || async { hpas.get_opt("svc").await.unwrap() },
            Option::is_none,
        )
        .await;
        wait_until(
            "spec.replicas applied once the autoscaler is gone",
            ROLLOUT,
            || env.deployment("svc"),
            |d| d["spec"]["replicas"] == 2,
        )
        .await;
        let status = env.status("svc").await;
        assert!(status.autoscaling.is_none());
        assert!(!status.conditions.iter().any(|c| c.type_ == "Autoscaled"));
        watch.abort();
        let seen = seen.lock().unwrap().clone();
        assert_eq!(
            seen,
            [3, 4, 2],
            "the count went only where the autoscaler, then spec.replicas, put it"
        );
        env.finish().await;
    });
}

/// The field managers that own a Deployment's `spec.replicas`.
async fn field_managers_of_replicas(env: &Env, name: &str) -> Vec<String> {
    let d = env.deployments().get(name).await.unwrap();
    d.metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter(|m| {
            m.fields_v1
                .as_ref()
                .is_some_and(|f| f.0.pointer("/f:spec/f:replicas").is_some())
        })
        .filter_map(|m| m.manager)
        .collect()
}
