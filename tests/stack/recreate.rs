//! A pod recreated mid-rollout loads the model of its own ReplicaSet's
//! template, on the real stack under load: the promise the immutable
//! manifest snapshots exist for (docs/design.md). With one mutable
//! ConfigMap, an old-template pod recreated during a rollout would load the
//! version under test.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams};
use libtest_mimic::Trial;
use serde_json::json;

use crate::app::*;
use crate::support::*;
use crate::trial;

pub fn trials() -> Vec<Trial> {
    vec![trial(
        "recreate::pods_recreated_mid_rollout_serve_their_own_templates_model",
        pods_recreated_mid_rollout_serve_their_own_templates_model,
    )]
}

/// The version each ReplicaSet's template points at, by ReplicaSet name:
/// the container's `OPENMED_SERVICE_PRELOAD_MODELS` reference, resolved
/// through the ConfigMap it names.
async fn template_versions(app: &App) -> BTreeMap<String, String> {
    let ns = &app.env.ns.name;
    let sets: Api<ReplicaSet> = Api::namespaced(app.env.client.clone(), ns);
    let maps: Api<ConfigMap> = Api::namespaced(app.env.client.clone(), ns);
    let mut versions = BTreeMap::new();
    for set in sets.list(&ListParams::default()).await.unwrap().items {
        let template = set.spec.unwrap().template.unwrap().spec.unwrap();
        let container = template
            .containers
            .iter()
            .find(|c| c.name == "openmed-service")
            .unwrap();
        let Some(entry) = container
            .env
            .iter()
            .flatten()
            .find(|e| e.name == "OPENMED_SERVICE_PRELOAD_MODELS")
        else {
            continue;
        };
        // The Deployment as first applied names its model itself; the
        // operator's templates read a snapshot.
        let version = match (&entry.value, &entry.value_from) {
            (Some(value), _) => value.clone(),
            (None, Some(from)) => {
                let reference = from.config_map_key_ref.clone().expect("a ConfigMap key");
                let data = maps.get(&reference.name).await.unwrap().data.unwrap();
                data[&reference.key].trim().to_owned()
            }
            (None, None) => continue,
        };
        versions.insert(set.metadata.name.unwrap(), version);
    }
    versions
}

/// A pod's ReplicaSet: its name less the random suffix.
fn replica_set_of(pod: &str) -> &str {
    pod.rsplit_once('-').map_or(pod, |(set, _)| set)
}

/// v1 → v2 at 20 requests/s; as soon as the first v2 pod exists (before
/// it can be Ready), it and one v1 pod are deleted, so both ReplicaSets
/// recreate a pod mid-rollout. Every answer names the model of the
/// template of the pod that gave it, no request fails, and the recreated
/// v2 pod serves v2.
fn pods_recreated_mid_rollout_serve_their_own_templates_model() {
    block_on(async {
        let app = App::deploy_image("stack-recreate", Image::DefaultModel).await;
        let (stop, load) = app.load(None, 20.0, Duration::from_secs(150));
        tokio::time::sleep(Duration::from_secs(3)).await;
        let old: Vec<String> = app
            .pods()
            .await
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect();
        let bumped = now_ms();
        app.env.set_spec(NAME, json!({"version": V2})).await;
        let new_pod = wait_for(
            "the first pod of the v2 template",
            crate::app::WARM,
            || async {
                app.pods()
                    .await
                    .into_iter()
                    .find(|p| !old.contains(p.metadata.name.as_ref().unwrap()))
            },
        )
        .await;
        let new_name = new_pod.metadata.name.clone().unwrap();
        assert!(
            ready_ms(&new_pod).is_none(),
            "the v2 pod is deleted before it is Ready, mid-rollout"
        );
        let pods: Api<k8s_openapi::api::core::v1::Pod> =
            Api::namespaced(app.env.client.clone(), &app.env.ns.name);
        let deleted = now_ms();
        for name in [&new_name, &old[0]] {
            pods.delete(name, &DeleteParams::default()).await.unwrap();
        }
        let status = app.env.status(NAME).await;
        assert_ne!(
            status.active_version.as_deref(),
            Some(V2),
            "the rollout was still going when the pods were deleted"
        );
        app.env.wait_ready(NAME, V2).await;
        let succeeded = now_ms();
        tokio::time::sleep(Duration::from_secs(5)).await;
        let _ = stop.send(());
        let records = load.await.unwrap();

        assert_all_served(&records);
        let versions = template_versions(&app).await;
        let mut answers: BTreeMap<String, (String, usize)> = BTreeMap::new();
        for record in &records {
            let pod = record
                .pod
                .as_deref()
                .expect("every answer names its pod (x-openmed-pod)");
            let set = replica_set_of(pod);
            let template = versions
                .get(set)
                .unwrap_or_else(|| panic!("pod {pod}: no ReplicaSet {set} in {versions:?}"));
            assert_eq!(
                record.model_name.as_deref(),
                Some(template.as_str()),
                "pod {pod} answered with a model its template does not point at"
            );
            answers
                .entry(pod.to_owned())
                .or_insert_with(|| (template.clone(), 0))
                .1 += 1;
        }
        let recreated_v2 = answers
            .iter()
            .filter(|(pod, (version, _))| version == V2 && **pod != new_name && !old.contains(*pod))
            .count();
        assert!(
            recreated_v2 >= 1,
            "the pods of the v2 template, the recreated one among them, serve v2: {answers:?}"
        );
        eprintln!(
            "recreate::pods_recreated_mid_rollout (20 requests/s through the Gateway; deleted {new_name} and {}):",
            old[0]
        );
        // The pods neither there before the bump nor the deleted v2 pod:
        // the v2 rollout's, and the two recreated ones.
        let later = |pod: &str| !old.iter().any(|o| o == pod) && pod != new_name;
        for (pod, (version, n)) in &answers {
            let note = if later(pod) && version == V1 {
                " (recreated mid-rollout from the v1 template)"
            } else {
                ""
            };
            eprintln!("  {pod}: {n} answers, all {version}{note}");
        }
        let phases = phases_around(
            &records,
            [
                "before the bump",
                "bump to RolloutSucceeded (pods deleted)",
                "after",
            ],
            bumped,
            succeeded,
        );
        record_result(json!({
            "scenario": "pods_recreated_mid_rollout", "rps": 20, "phases": phases,
            "bump_to_delete_s": ((deleted - bumped) / 100.0).round() / 10.0,
            "bump_to_succeeded_s": ((succeeded - bumped) / 100.0).round() / 10.0,
            "answers_by_pod": answers.iter().map(|(p, (v, n))| json!({
                "pod": p, "template": v, "answers": n,
                "recreated_from_the_old_template": later(p) && v == V1,
            })).collect::<Vec<_>>(),
        }));
        app.env.finish().await;
    });
}
