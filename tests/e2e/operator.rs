//! The operator against the real control plane: one test per behaviour
//! users rely on. Each test has its own namespace and its own operator
//! process watching only that namespace.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use libtest_mimic::Trial;
use openmed_op::api::{OpenMedModel, Phase};
use serde_json::{Value, json};

pub use crate::env::{Env, ROLLOUT, World, deployment_yaml, model_yaml};
use crate::support::*;
use crate::trial;

pub fn trials() -> Vec<Trial> {
    vec![
        trial(
            "operator::a_healthy_rollout_writes_what_render_shows",
            a_healthy_rollout_writes_what_render_shows,
        ),
        trial(
            "operator::the_served_set_follows_the_versions_and_a_set_it_cannot_edit_is_refused",
            the_served_set_follows_the_versions_and_a_set_it_cannot_edit_is_refused,
        ),
        trial(
            "operator::a_deployment_the_earlier_operator_wrote_is_released_and_its_finalizer_goes",
            a_deployment_the_earlier_operator_wrote_is_released_and_its_finalizer_goes,
        ),
        trial(
            "operator::render_and_the_operator_agree_on_generated_resources",
            render_and_the_operator_agree_on_generated_resources,
        ),
        trial(
            "operator::a_version_that_never_gets_ready_is_rolled_back",
            a_version_that_never_gets_ready_is_rolled_back,
        ),
        trial(
            "operator::a_failed_rollback_is_terminal",
            a_failed_rollback_is_terminal,
        ),
        trial(
            "operator::manual_rollbacks_are_accepted_or_rejected_and_recover",
            manual_rollbacks_are_accepted_or_rejected_and_recover,
        ),
        trial(
            "operator::drift_by_another_writer_is_restored",
            drift_by_another_writer_is_restored,
        ),
        trial(
            "operator::a_target_created_after_the_resource_is_picked_up",
            a_target_created_after_the_resource_is_picked_up,
        ),
        trial(
            "operator::a_container_added_later_is_picked_up",
            a_container_added_later_is_picked_up,
        ),
        trial(
            "operator::a_conflict_heals_when_the_other_owner_goes",
            a_conflict_heals_when_the_other_owner_goes,
        ),
        trial(
            "operator::renaming_the_target_releases_the_old_one",
            renaming_the_target_releases_the_old_one,
        ),
        trial(
            "operator::deletion_releases_the_target_and_keeps_the_deployment",
            deletion_releases_the_target_and_keeps_the_deployment,
        ),
        trial(
            "operator::deletion_with_an_invalid_spec_or_a_foreign_owner_completes",
            deletion_with_an_invalid_spec_or_a_foreign_owner_completes,
        ),
        trial(
            "operator::a_killed_operator_converges_after_restart",
            a_killed_operator_converges_after_restart,
        ),
        trial(
            "operator::a_steady_state_sends_no_requests",
            a_steady_state_sends_no_requests,
        ),
        trial(
            "operator::a_status_from_the_earlier_operator_is_adopted_without_a_restart",
            a_status_from_the_earlier_operator_is_adopted_without_a_restart,
        ),
        trial(
            "operator::an_autoscaled_target_keeps_its_replicas",
            an_autoscaled_target_keeps_its_replicas,
        ),
        trial(
            "operator::replicas_are_never_defaulted_when_the_operator_stops_applying_them",
            replicas_are_never_defaulted_when_the_operator_stops_applying_them,
        ),
        trial(
            "operator::a_rollback_after_a_target_change_stays_on_the_new_target",
            a_rollback_after_a_target_change_stays_on_the_new_target,
        ),
        trial(
            "operator::health_metrics_and_graceful_shutdown",
            health_metrics_and_graceful_shutdown,
        ),
    ]
}

/// The env entry `name` of `container` in a Deployment, `Null` when absent.
fn env_named(deployment: &Value, container: &str, name: &str) -> Value {
    deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == container)
        .unwrap()["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["name"] == name)
        .cloned()
        .unwrap_or(Value::Null)
}

fn env_entry(deployment: &Value, container: &str) -> Value {
    env_named(deployment, container, "OPENMED_SERVICE_PRELOAD_MODELS")
}

/// The container's served set, `Null` when it lists none.
fn served_entry(deployment: &Value, container: &str) -> Value {
    env_named(deployment, container, "OPENMED_SERVICE_SERVED_MODELS")["value"].clone()
}

/// The owned fields of a Deployment, for comparing live and rendered.
fn owned_fields(deployment: &Value, container: &str) -> Value {
    json!({
        "resource": deployment["metadata"]["annotations"]["openmed.ai/model-resource"],
        "label": deployment["metadata"]["labels"]["openmed.ai/operated-by"],
        "replicas": deployment["spec"]["replicas"],
        "progressDeadlineSeconds": deployment["spec"]["progressDeadlineSeconds"],
        "strategy": deployment["spec"]["strategy"],
        "templateAnnotations": deployment["spec"]["template"]["metadata"]["annotations"],
        "templateSnapshotLabel": deployment["spec"]["template"]["metadata"]["labels"]["openmed.ai/model-manifest"],
        "env": env_entry(deployment, container),
        "served": served_entry(deployment, container),
    })
}

fn config_map_fields(cm: &Value) -> Value {
    json!({
        "name": cm["metadata"]["name"],
        "labels": cm["metadata"]["labels"],
        "annotations": cm["metadata"]["annotations"],
        "immutable": cm["immutable"],
        "data": cm["data"],
    })
}

/// `openmed-op render` of `yaml`, as documents.
fn render(yaml: &str, namespace: &str) -> Vec<Value> {
    let out = run_with_input(&["render", "-n", namespace, "-o", "json", "-"], yaml);
    assert!(
        out.status.success(),
        "render failed: {}\nfor\n{yaml}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    list["items"].as_array().unwrap().clone()
}

/// Applies `deployment` and `model`, waits until Ready, then checks that
/// the live ConfigMap and Deployment fields equal `render`'s.
async fn assert_parity(
    env: &Env,
    deployment: &str,
    model: &str,
    name: &str,
    container: &str,
    version: &str,
) {
    env.apply(deployment).await;
    env.apply(model).await;
    env.wait_ready(name, version).await;
    // The newline before `---` matters: without it the separator joins the
    // last line, and the two documents become one with every key twice.
    let rendered = render(&format!("{deployment}\n---\n{model}"), &env.ns.name);
    let rendered_deployment = rendered.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let rendered_cms: Vec<&Value> = rendered
        .iter()
        .filter(|d| d["kind"] == "ConfigMap")
        .collect();
    assert_eq!(rendered_cms.len(), 2, "the pointer and the snapshot");
    let deployment_name = rendered_deployment["metadata"]["name"].as_str().unwrap();
    let live = env.deployment(deployment_name).await;
    assert_eq!(
        owned_fields(&live, container),
        owned_fields(rendered_deployment, container),
        "{name}: Deployment fields"
    );
    for rendered_cm in rendered_cms {
        let cm_name = rendered_cm["metadata"]["name"].as_str().unwrap();
        // The pointer follows the rollout's last pods, a moment after Ready.
        let live_cm = wait_until(
            &format!("{name}: ConfigMap {cm_name} as render shows it"),
            ROLLOUT,
            || async {
                env.config_maps()
                    .get_opt(cm_name)
                    .await
                    .unwrap()
                    .map(|cm| serde_json::to_value(cm).unwrap())
                    .unwrap_or_default()
            },
            |live| config_map_fields(live) == config_map_fields(rendered_cm),
        )
        .await;
        let owners: Vec<(Option<&str>, Option<bool>)> = live_cm["metadata"]["ownerReferences"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| (o["kind"].as_str(), o["controller"].as_bool()))
            .collect();
        assert_eq!(
            owners,
            [
                (Some("OpenMedModel"), Some(true)),
                (Some("Deployment"), None)
            ],
            "{cm_name}: the model controls it, the target also owns it"
        );
    }
}

fn a_healthy_rollout_writes_what_render_shows() {
    block_on(async {
        let env = Env::new("healthy").await;
        let docs = crate::cluster::example_docs().replace(
            "namespace: openmed\n",
            &format!("namespace: {}\n", env.ns.name),
        );
        let (deployment, model): (Vec<&str>, Vec<&str>) = docs
            .split("\n---\n")
            .filter(|d| !d.trim().is_empty())
            .partition(|d| !d.contains("kind: OpenMedModel"));
        let model = model.join("\n---\n");
        let deployment = deployment.join("\n---\n");
        assert_parity(
            &env,
            &deployment,
            &model,
            "openmed-service",
            "openmed-service",
            "OpenMed/synthetic-pii-v1",
        )
        .await;
        let s = env.status("openmed-service").await;
        assert_eq!(
            s.last_successful_spec.unwrap().version,
            "OpenMed/synthetic-pii-v1"
        );
        assert_eq!(s.observed_generation, Some(1));
        let live = env.deployment("openmed-service").await;
        assert_eq!(
            Some(live["metadata"]["generation"].as_i64().unwrap()),
            s.target_deployment_generation
        );
        assert_eq!(live["status"]["readyReplicas"], 2);
        env.wait_event("openmed-service", "RolloutSucceeded").await;
        let events = env.event_reasons("openmed-service").await;
        assert!(events.iter().any(|(r, _)| r == "RolloutStarted"));
        // The operator never takes its own write, seen late in its cache,
        // for another writer's.
        assert!(
            !events.iter().any(|(r, _)| r == "DriftCorrected"),
            "{events:?}"
        );
        // kubectl wait works on the Ready condition.
        let (ok, _, err) = kubectl(&[
            "wait",
            "-n",
            &env.ns.name,
            "--for=condition=Ready",
            "omm/openmed-service",
            "--timeout=5s",
        ]);
        assert!(ok, "{err}");
        env.finish().await;
    });
}

/// `entries`, then the ids the service serves without a set.
fn with_defaults(entries: &str) -> Value {
    json!(format!(
        "{entries},{}",
        openmed_op::plan::served::SERVICE_DEFAULTS.join(",")
    ))
}

fn the_served_set_follows_the_versions_and_a_set_it_cannot_edit_is_refused() {
    block_on(async {
        let env = Env::new("served").await;
        let (v1, v2) = (env.version("v1"), env.version("v2"));
        env.apply(&deployment_yaml("svc", "openmed-service", "boot"))
            .await;
        env.apply(&model_yaml("svc", &v1, "")).await;
        env.wait_ready("svc", &v1).await;
        let live = env.deployment("svc").await;
        assert_eq!(
            served_entry(&live, "openmed-service"),
            with_defaults(&v1),
            "the first pods answer the version and the service's defaults"
        );
        env.set_spec("svc", json!({"version": v2})).await;
        env.wait_ready("svc", &v2).await;
        let live = env.deployment("svc").await;
        assert_eq!(
            served_entry(&live, "openmed-service"),
            with_defaults(&format!("{v2},{v1}")),
            "expand: clients naming v1 are answered through the bump"
        );
        assert_eq!(
            live["metadata"]["annotations"]["openmed.ai/served-versions"],
            json!(format!("{v2},{v1}"))
        );

        // A Deployment that reads its set from a ConfigMap: refused with a
        // condition and an Event, and not a field of it written.
        let referenced = deployment_yaml("ref", "openmed-service", "boot").replace(
            "          value: boot\n",
            "          value: boot\n        - name: OPENMED_SERVICE_SERVED_MODELS\n          valueFrom:\n            configMapKeyRef: {name: team-models, key: served}\n",
        );
        env.apply(&referenced).await;
        let before = env.deployment("ref").await;
        env.apply(&model_yaml("ref", &v1, "")).await;
        let status = env
            .wait_status("ref", "the served set to be refused", |s| {
                s.conditions
                    .iter()
                    .any(|c| c.reason == "ServedSetRefused" && c.status == "False")
            })
            .await;
        let message = &status
            .conditions
            .iter()
            .find(|c| c.reason == "ServedSetRefused")
            .unwrap()
            .message;
        assert!(message.contains("ConfigMap team-models"), "{message}");
        env.wait_event("ref", "ServedSetRefused").await;
        let after = env.deployment("ref").await;
        assert_eq!(
            after["metadata"]["generation"], before["metadata"]["generation"],
            "no pod was replaced"
        );
        assert!(
            after["metadata"]["annotations"]
                .get("openmed.ai/model-resource")
                .is_none()
        );

        // Released, the set keeps what was not the model's.
        env.models()
            .delete("svc", &DeleteParams::default())
            .await
            .unwrap();
        env.wait_model_gone("svc", ROLLOUT).await;
        let live = env.deployment("svc").await;
        assert_eq!(
            served_entry(&live, "openmed-service"),
            json!(openmed_op::plan::served::SERVICE_DEFAULTS.join(","))
        );
        assert!(
            live["metadata"]["annotations"]
                .get("openmed.ai/served-versions")
                .is_none(),
            "{:?}",
            live["metadata"]["annotations"]
        );
        env.finish().await;
    });
}

/// The earlier (Kopf) operator writes with strategic-merge patches under
/// its own field manager, so after a move to openmed-op it still holds the
/// ownership annotations and the preload `valueFrom`, and its finalizer
/// stays on the resource. Deleting the resource must still complete: the
/// release takes those marks back, and the earlier finalizer goes with
/// ours. Here the earlier operator's writes are made as it makes them
/// (manager `kopf`), with the values it computes (the vectors' rules,
/// which `render` shares).
fn a_deployment_the_earlier_operator_wrote_is_released_and_its_finalizer_goes() {
    block_on(async {
        let env = Env::new("earlier").await;
        let ns = env.ns.name.clone();
        let v1 = env.version("v1");
        let deployment = deployment_yaml("svc", "openmed-service", "boot");
        let model = model_yaml("svc", &v1, "");
        let rendered = render(&format!("{deployment}\n---\n{model}"), &ns);
        let pointer = rendered
            .iter()
            .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "svc-model-manifest")
            .unwrap()
            .clone();
        let hash = rendered.iter().find(|d| d["kind"] == "Deployment").unwrap()["spec"]["template"]
            ["metadata"]["annotations"]["openmed.ai/model-manifest-hash"]
            .clone();
        let owner = format!("{ns}/svc");
        let kopf = PostParams {
            field_manager: Some("kopf".into()),
            ..PostParams::default()
        };
        let config_map = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "svc-model-manifest", "annotations": {"openmed.ai/model-resource": owner}},
            "data": pointer["data"],
        });
        env.config_maps()
            .create(&kopf, &serde_json::from_value(config_map).unwrap())
            .await
            .unwrap();
        let mut written: Value = serde_yaml::from_str(&deployment).unwrap();
        written["metadata"]["annotations"] = json!({"openmed.ai/model-resource": owner});
        written["spec"]["replicas"] = json!(2);
        written["spec"]["progressDeadlineSeconds"] = json!(600);
        written["spec"]["strategy"] = json!({"type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}});
        written["spec"]["template"]["metadata"]["annotations"] =
            json!({"openmed.ai/model-resource": owner, "openmed.ai/model-manifest-hash": hash});
        written["spec"]["template"]["spec"]["containers"][0]["env"] = json!([{
            "name": "OPENMED_SERVICE_PRELOAD_MODELS",
            "valueFrom": {"configMapKeyRef": {"name": "svc-model-manifest", "key": "OPENMED_SERVICE_PRELOAD_MODELS"}},
        }]);
        env.deployments()
            .create(&kopf, &serde_json::from_value(written).unwrap())
            .await
            .unwrap();
        let before = env.deployment("svc").await;
        let mut resource: Value = serde_yaml::from_str(&model).unwrap();
        resource["metadata"]["finalizers"] = json!([EARLIER_FINALIZER]);
        resource["metadata"]["annotations"] =
            json!({"kopf.zalando.org/last-handled-configuration": "{}"});
        env.apply(&serde_yaml::to_string(&resource).unwrap()).await;
        env.wait_ready("svc", &v1).await;
        let adopted = env.deployment("svc").await;
        assert_eq!(
            adopted["spec"]["template"], before["spec"]["template"],
            "adopted as it was: no pod replaced"
        );

        env.models()
            .delete("svc", &DeleteParams::default())
            .await
            .unwrap();
        env.wait_model_gone("svc", ROLLOUT).await;
        let released = env.deployment("svc").await;
        assert_eq!(
            env_entry(&released, "openmed-service"),
            json!({"name": "OPENMED_SERVICE_PRELOAD_MODELS"}),
            "the preload reference the earlier operator wrote is gone"
        );
        for annotations in [
            &released["metadata"]["annotations"],
            &released["spec"]["template"]["metadata"]["annotations"],
        ] {
            assert!(
                annotations.get("openmed.ai/model-resource").is_none(),
                "{annotations}"
            );
        }
        let events = env.event_reasons("svc").await;
        let releases = events.iter().filter(|(r, _)| r == "TargetReleased").count();
        assert!(releases <= 2, "released again and again: {events:?}");
        env.finish().await;
    });
}

/// The finalizer of the earlier operator.
const EARLIER_FINALIZER: &str = "kopf.zalando.org/KopfFinalizerMarker";

fn render_and_the_operator_agree_on_generated_resources() {
    block_on(async {
        let env = Env::new("parity").await;
        let long = "a".repeat(60);
        let cases = vec![
            ("recreate", "openmed-service", "  rolloutStrategy:\n    type: Recreate\n".to_owned()),
            ("percent", "openmed-service", "  rolloutStrategy:\n    maxSurge: 50%\n    maxUnavailable: 25%\n    progressDeadlineSeconds: 120\n".to_owned()),
            ("named-cm", "openmed-service", "  manifestConfigMapName: models.v1\n".to_owned()),
            ("custom-container", "api", "  targetRef:\n    containerName: api\n".to_owned()),
            (long.as_str(), "openmed-service", String::new()),
        ];
        for (name, container, extra) in cases {
            let version = env.version(&format!("parity-{}", &name[..name.len().min(8)]));
            let deployment = deployment_yaml(name, container, "boot");
            let model = model_yaml(name, &version, &extra);
            assert_parity(&env, &deployment, &model, name, container, &version).await;
        }
        env.finish().await;
    });
}

fn a_version_that_never_gets_ready_is_rolled_back() {
    block_on(async {
        let env = Env::new("rollback").await;
        let (v1, bad) = (env.version("v1"), env.version("bad"));
        mark_unready(&env.client, &[&bad]).await;
        env.apply(&deployment_yaml("svc", "openmed-service", "boot"))
            .await;
        env.apply(&model_yaml(
            "svc",
            &v1,
            "  rolloutStrategy:\n    progressDeadlineSeconds: 8\n",
        ))
        .await;
        let ready = env.wait_ready("svc", &v1).await;
        let v1_hash = ready.applied_spec_hash.clone();
        let v1_template = env.deployment("svc").await["spec"]["template"]["metadata"]["annotations"]["openmed.ai/model-manifest-hash"].clone();
        env.set_spec("svc", json!({"version": bad})).await;
        let s = env.wait_rolled_back("svc").await;
        assert_eq!(s.desired_version.as_deref(), Some(bad.as_str()));
        assert_eq!(s.active_version.as_deref(), Some(v1.as_str()));
        assert_eq!(s.failed_spec_hash, s.desired_spec_hash);
        assert_eq!(s.applied_spec_hash, v1_hash);
        assert_eq!(s.rollback_spec.as_ref().unwrap().version, v1);
        assert_eq!(s.rollback_request, Some(format!("automatic:{v1}")));
        assert_eq!(s.rollback_count, Some(1));
        assert_eq!(s.last_successful_spec.as_ref().unwrap().version, v1);
        let condition = |t: &str| {
            s.conditions
                .iter()
                .find(|c| c.type_ == t)
                .map(|c| (c.status.clone(), c.reason.clone()))
        };
        assert_eq!(
            condition("Degraded"),
            Some(("True".into(), "RolloutFailed".into()))
        );
        assert_eq!(
            condition("RolledBack"),
            Some(("True".into(), "RollbackSucceeded".into()))
        );
        assert_eq!(
            condition("Ready"),
            Some(("False".into(), "RolledBack".into()))
        );
        assert_eq!(condition("Stalled").map(|c| c.0), Some("True".into()));
        let live = env.deployment("svc").await;
        assert_eq!(
            live["spec"]["template"]["metadata"]["annotations"]["openmed.ai/model-manifest-hash"],
            v1_template
        );
        let cm = env.config_maps().get("svc-model-manifest").await.unwrap();
        assert_eq!(cm.data.unwrap()["OPENMED_SERVICE_PRELOAD_MODELS"], v1);
        for reason in ["RolloutFailed", "RollbackStarted", "RollbackSucceeded"] {
            env.wait_event("svc", reason).await;
        }
        // Several resyncs later: counted once, never retried.
        let generation = live["metadata"]["generation"].clone();
        // Proving that nothing happens takes time: three resync periods of 2 s.
        tokio::time::sleep(Duration::from_secs(6)).await;
        let s = env.status("svc").await;
        assert_eq!(s.rollback_count, Some(1));
        assert_eq!(
            env.deployment("svc").await["metadata"]["generation"],
            generation,
            "the failed spec is never retried"
        );
        env.finish().await;
    });
}

fn a_failed_rollback_is_terminal() {
    block_on(async {
        let env = Env::new("rollbackfail").await;
        let (v1, bad) = (env.version("v1"), env.version("bad"));
        env.apply(&deployment_yaml("svc", "openmed-service", "boot"))
            .await;
        let strategy = "  rolloutStrategy:\n    type: Recreate\n    progressDeadlineSeconds: 8\n";
        env.apply(&model_yaml("svc", &v1, strategy)).await;
        env.wait_ready("svc", &v1).await;
        // From now on neither version gets ready: Recreate replaces every v1
        // pod, so the rollback needs new v1 pods, and they fail too.
        mark_unready(&env.client, &[&v1, &bad]).await;
        env.set_spec("svc", json!({"version": bad})).await;
        let s = env
            .wait_status("svc", "phase Failed with reason RollbackFailed", |s| {
                s.phase == Some(Phase::Failed)
                    && s.conditions
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.reason == "RollbackFailed")
            })
            .await;
        assert_eq!(
            s.rollback_count,
            Some(1),
            "one rollback; status {s:#?}; operator log {}",
            env.operator.log.display()
        );
        env.wait_event("svc", "RollbackFailed").await;
        let generation = env.deployment("svc").await["metadata"]["generation"].clone();
        tokio::time::sleep(Duration::from_secs(6)).await; // three resync periods, to prove there is no loop
        let after = env.deployment("svc").await;
        assert_eq!(
            after["metadata"]["generation"],
            generation,
            "no further writes; the Deployment's managed fields: {}; operator log {}",
            after["metadata"]["managedFields"],
            env.operator.log.display()
        );
        let s = env.status("svc").await;
        assert_eq!(
            s.rollback_count,
            Some(1),
            "still one rollback; status {s:#?}"
        );
        env.finish().await;
    });
}

fn manual_rollbacks_are_accepted_or_rejected_and_recover() {
    block_on(async {
        let env = Env::new("manual").await;
        let (v1, v2) = env.v1_then_v2().await;

        env.annotate("svc", "openmed.ai/rollback-to", Some(&v1))
            .await;
        let s = env.wait_manual_rollback("svc", &v1).await;
        assert_eq!(s.rollback_request, Some(format!("manual:{v1}")));
        assert_eq!(s.previous_successful_spec.unwrap().version, v2);
        env.wait_event("svc", "RollbackSucceeded").await;

        // A version that is not retained: refused by the API server itself
        // (deploy/admission, installed with deploy/operator), in the words
        // the operator uses, and nothing is written. Without the policy the
        // operator refuses it the same way after it is stored
        // (RollbackRejected, tested in src/rollout/tests).
        let cm_before = env
            .config_maps()
            .get("svc-model-manifest")
            .await
            .unwrap()
            .resource_version();
        let generation = env.deployment("svc").await["metadata"]["generation"].clone();
        let refused = env
            .models()
            .patch(
                "svc",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {
                    "openmed.ai/rollback-to": "OpenMed/never-deployed"}}})),
            )
            .await;
        let Err(kube::Error::Api(status)) = refused else {
            panic!("a rollback to a version never retained was stored: {refused:?}");
        };
        assert!(
            status.message.contains(&format!(
                "openmed.ai/rollback-to=OpenMed/never-deployed is not a retained version (retained: {v1}, {v2})"
            )),
            "{}",
            status.message
        );
        assert_eq!(
            env.annotation("svc", "openmed.ai/rollback-to").await,
            Some(v1.clone()),
            "the stored annotation is unchanged"
        );
        assert_eq!(
            env.config_maps()
                .get("svc-model-manifest")
                .await
                .unwrap()
                .resource_version(),
            cm_before
        );
        assert_eq!(
            env.deployment("svc").await["metadata"]["generation"],
            generation
        );

        // Removing the annotation returns to spec.version (v2).
        env.annotate("svc", "openmed.ai/rollback-to", None).await;
        env.wait_ready("svc", &v2).await;
        env.finish().await;
    });
}

/// Another writer removes the operator's preload variable from the target
/// `svc`; waits until the operator has put it back.
async fn remove_preload_env_and_wait_until_restored(env: &Env) {
    let remove = json!({"spec": {"template": {"spec": {"containers": [{"name": "openmed-service",
        "env": [{"name": "OPENMED_SERVICE_PRELOAD_MODELS", "$patch": "delete"}]}]}}}});
    env.deployments()
        .patch("svc", &PatchParams::default(), &Patch::Strategic(remove))
        .await
        .unwrap();
    wait_until(
        "the env entry to be restored",
        ROLLOUT,
        || env.deployment("svc"),
        |d| {
            env_entry(d, "openmed-service")["valueFrom"]["configMapKeyRef"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("svc-model-manifest-"))
        },
    )
    .await;
}

fn drift_by_another_writer_is_restored() {
    block_on(async {
        let env = Env::new("drift").await;
        let v1 = env.version("v1");
        env.apply(&deployment_yaml("svc", "openmed-service", "boot"))
            .await;
        env.apply(&model_yaml("svc", &v1, "")).await;
        env.wait_ready("svc", &v1).await;
        let deployments = env.deployments();

        // Another writer removes our env entry.
        remove_preload_env_and_wait_until_restored(&env).await;
        let drifts = |events: &Vec<(String, String, i32)>| -> Vec<(String, i32)> {
            events
                .iter()
                .filter(|(r, ..)| r == "DriftCorrected")
                .map(|(_, note, count)| (note.clone(), *count))
                .collect()
        };
        let first = wait_until(
            "a DriftCorrected event",
            ROLLOUT,
            || env.events("svc"),
            |events| !drifts(events).is_empty(),
        )
        .await;
        let (env_note, _) = drifts(&first).remove(0);
        let snapshot = env_entry(&env.deployment("svc").await, "openmed-service")["valueFrom"]
            ["configMapKeyRef"]["name"]
            .as_str()
            .unwrap()
            .to_owned();

        // Another writer scales it.
        deployments
            .patch(
                "svc",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": 5}})),
            )
            .await
            .unwrap();
        wait_until(
            "replicas to be restored",
            ROLLOUT,
            || env.deployment("svc"),
            |d| d["spec"]["replicas"] == 2,
        )
        .await;

        // Another writer edits the pointer ConfigMap, which no pod reads:
        // it is put back, without an event.
        env.config_maps()
            .patch(
                "svc-model-manifest",
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"OPENMED_SERVICE_PRELOAD_MODELS": "evil"}})),
            )
            .await
            .unwrap();
        wait_until(
            "the ConfigMap to be restored",
            ROLLOUT,
            || async {
                env.config_maps()
                    .get("svc-model-manifest")
                    .await
                    .unwrap()
                    .data
                    .unwrap()
            },
            |data| data["OPENMED_SERVICE_PRELOAD_MODELS"] == v1,
        )
        .await;

        // Another writer deletes the snapshot the template reads (being
        // immutable, it cannot be edited): it is created again.
        env.config_maps()
            .delete(&snapshot, &DeleteParams::default())
            .await
            .unwrap();
        wait_for("the snapshot to be restored", ROLLOUT, || async {
            env.config_maps().get_opt(&snapshot).await.unwrap()
        })
        .await;
        // The same drift again is a repeat: the first event's series
        // counts it, where another drift was an event of its own.
        remove_preload_env_and_wait_until_restored(&env).await;
        let events = wait_until(
            "the repeated drift counted on its first event",
            ROLLOUT,
            || env.events("svc"),
            |events| {
                drifts(events)
                    .iter()
                    .any(|(note, count)| *note == env_note && *count >= 2)
            },
        )
        .await;
        let drift = drifts(&events);
        assert!(
            drift.len() >= 2,
            "the scaling and the snapshot are other events: {drift:?}"
        );
        assert_eq!(
            drift.iter().filter(|(note, _)| *note == env_note).count(),
            1,
            "one event per drift, counted: {drift:?}"
        );
        env.wait_ready("svc", &v1).await;
        env.finish().await;
    });
}

fn a_target_created_after_the_resource_is_picked_up() {
    block_on(async {
        let env = Env::new("late").await;
        let v1 = env.version("v1");
        env.apply(&model_yaml("svc", &v1, "")).await;
        env.wait_status("svc", "TargetNotFound", |s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.reason == "TargetNotFound")
        })
        .await;
        env.wait_event("svc", "TargetNotFound").await;
        assert!(
            env.config_maps()
                .get_opt("svc-model-manifest")
                .await
                .unwrap()
                .is_none(),
            "no writes while blocked"
        );
        env.apply(&deployment_yaml("svc", "openmed-service", "boot"))
            .await;
        env.wait_ready("svc", &v1).await;
        env.finish().await;
    });
}

fn a_container_added_later_is_picked_up() {
    block_on(async {
        let env = Env::new("container").await;
        let v1 = env.version("v1");
        env.apply(&deployment_yaml("svc", "api", "boot")).await;
        env.apply(&model_yaml("svc", &v1, "")).await;
        let s = env
            .wait_status("svc", "ContainerNotFound", |s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.reason == "ContainerNotFound")
            })
            .await;
        let message = &s
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .unwrap()
            .message;
        assert!(message.contains("it has: api"), "{message}");
        // The user's manifest now names the right container (and drops `api`).
        env.apply(&deployment_yaml("svc", "openmed-service", "boot"))
            .await;
        env.wait_ready("svc", &v1).await;
        env.finish().await;
    });
}

fn a_conflict_heals_when_the_other_owner_goes() {
    block_on(async {
        let env = Env::new("conflict").await;
        let (v1, v2) = (env.version("v1"), env.version("v2"));
        env.apply(&deployment_yaml("svc", "openmed-service", "boot"))
            .await;
        env.apply(&model_yaml("first", &v1, "  targetRef:\n    name: svc\n"))
            .await;
        env.wait_ready("first", &v1).await;
        env.apply(&model_yaml("second", &v2, "  targetRef:\n    name: svc\n"))
            .await;
        env.wait_status("second", "TargetConflict", |s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.reason == "TargetConflict")
        })
        .await;
        env.wait_event("second", "TargetConflict").await;
        let live = env.deployment("svc").await;
        assert_eq!(
            live["metadata"]["annotations"]["openmed.ai/model-resource"],
            format!("{}/first", env.ns.name)
        );
        env.models()
            .delete("first", &DeleteParams::default())
            .await
            .unwrap();
        env.wait_ready("second", &v2).await;
        env.finish().await;
    });
}

fn renaming_the_target_releases_the_old_one() {
    block_on(async {
        let env = Env::new("rename").await;
        let v1 = env.version("v1");
        env.apply(&deployment_yaml("svc-a", "openmed-service", "boot"))
            .await;
        env.apply(&deployment_yaml("svc-b", "openmed-service", "boot"))
            .await;
        env.apply(&model_yaml("svc", &v1, "  targetRef:\n    name: svc-a\n"))
            .await;
        env.wait_ready("svc", &v1).await;
        env.set_spec("svc", json!({"targetRef": {"name": "svc-b"}}))
            .await;
        wait_until(
            "svc-b to be managed",
            ROLLOUT,
            || env.deployment("svc-b"),
            |d| {
                env_entry(d, "openmed-service")["valueFrom"]["configMapKeyRef"]["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("svc-model-manifest-"))
            },
        )
        .await;
        let old = env.deployment("svc-a").await;
        assert!(
            env_entry(&old, "openmed-service")
                .get("valueFrom")
                .is_none(),
            "svc-a released: {old:#}"
        );
        assert!(
            old["metadata"]["annotations"]
                .get("openmed.ai/model-resource")
                .is_none()
        );
        assert_eq!(
            old["spec"]["template"]["metadata"]["annotations"]["openmed.ai/model-manifest-hash"],
            json!(openmed_op::plan::released_manifest_hash())
        );
        assert_eq!(old["spec"]["replicas"], 2, "scaling is left as it was");
        env.wait_ready("svc", &v1).await;
        env.wait_event("svc", "TargetReleased").await;
        env.finish().await;
    });
}

fn deletion_releases_the_target_and_keeps_the_deployment() {
    block_on(async {
        let env = Env::new("delete").await;
        let v1 = env.version("v1");
        env.apply(&deployment_yaml("svc", "openmed-service", "boot"))
            .await;
        env.apply(&model_yaml("svc", &v1, "")).await;
        env.wait_ready("svc", &v1).await;
        env.models()
            .delete("svc", &DeleteParams::default())
            .await
            .unwrap();
        env.wait_model_gone("svc", ROLLOUT).await;
        assert!(
            env.config_maps()
                .get_opt("svc-model-manifest")
                .await
                .unwrap()
                .is_none()
        );
        let live = env.deployment("svc").await;
        assert_eq!(
            env_entry(&live, "openmed-service"),
            json!({"name": "OPENMED_SERVICE_PRELOAD_MODELS"})
        );
        assert_eq!(
            live["spec"]["template"]["metadata"]["annotations"]["openmed.ai/model-manifest-hash"],
            json!(openmed_op::plan::released_manifest_hash())
        );
        assert!(
            live["metadata"]["annotations"]
                .get("openmed.ai/model-resource")
                .is_none()
        );
        assert!(
            live["metadata"]["labels"]
                .get("openmed.ai/operated-by")
                .is_none()
        );
        wait_until(
            "pods to restart without a preloaded model",
            ROLLOUT,
            || env.deployment("svc"),
            |d| {
                d["status"]["updatedReplicas"] == 2
                    && d["status"]["readyReplicas"] == 2
                    && d["status"]["replicas"] == 2
            },
        )
        .await;
        env.finish().await;
    });
}

fn deletion_with_an_invalid_spec_or_a_foreign_owner_completes() {
    block_on(async {
        let env = Env::new("deleteodd").await;
        let v1 = env.version("v1");
        env.apply(&deployment_yaml("svc", "openmed-service", "boot"))
            .await;
        env.apply(&model_yaml("svc", &v1, "")).await;
        env.wait_ready("svc", &v1).await;
        // Valid for the CRD, invalid against this target.
        env.deployments()
            .patch(
                "svc",
                &PatchParams::default(),
                // Short: deletion waits for the released pods to roll,
                // and each new pod takes this long to count as available.
                &Patch::Merge(json!({"spec": {"minReadySeconds": 12}})),
            )
            .await
            .unwrap();
        env.set_spec(
            "svc",
            json!({"rolloutStrategy": {"progressDeadlineSeconds": 10}}),
        )
        .await;
        env.wait_status("svc", "InvalidSpec", |s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.reason == "InvalidSpec")
        })
        .await;
        env.wait_event("svc", "InvalidSpec").await;
        env.models()
            .delete("svc", &DeleteParams::default())
            .await
            .unwrap();
        env.wait_model_gone("svc", ROLLOUT).await;
        assert!(
            env_entry(&env.deployment("svc").await, "openmed-service")
                .get("valueFrom")
                .is_none()
        );

        // A resource that never owned its target leaves it alone.
        env.apply(&deployment_yaml("shared", "openmed-service", "boot"))
            .await;
        env.apply(&model_yaml(
            "owner",
            &v1,
            "  targetRef:\n    name: shared\n",
        ))
        .await;
        env.wait_ready("owner", &v1).await;
        env.apply(&model_yaml(
            "intruder",
            &v1,
            "  targetRef:\n    name: shared\n",
        ))
        .await;
        env.wait_status("intruder", "TargetConflict", |s| {
            s.conditions.iter().any(|c| c.reason == "TargetConflict")
        })
        .await;
        let before = env.deployment("shared").await;
        env.models()
            .delete("intruder", &DeleteParams::default())
            .await
            .unwrap();
        env.wait_model_gone("intruder", ROLLOUT).await;
        let after = env.deployment("shared").await;
        assert_eq!(
            after["metadata"]["generation"],
            before["metadata"]["generation"]
        );
        assert_eq!(
            owned_fields(&after, "openmed-service"),
            owned_fields(&before, "openmed-service")
        );
        env.finish().await;
    });
}

fn a_killed_operator_converges_after_restart() {
    block_on(async {
        let mut env = Env::new("restart").await;
        let (v1, bad) = (env.version("v1"), env.version("bad"));
        mark_unready(&env.client, &[&bad]).await;
        env.apply(&deployment_yaml("svc", "openmed-service", "boot"))
            .await;
        env.apply(&model_yaml(
            "svc",
            &v1,
            "  rolloutStrategy:\n    progressDeadlineSeconds: 8\n",
        ))
        .await;
        env.wait_ready("svc", &v1).await;
        env.set_spec("svc", json!({"version": bad})).await;
        env.wait_status("svc", "the rollout of the bad version to start", |s| {
            s.phase == Some(Phase::RollingOut)
        })
        .await;
        env.operator.kill();
        // The deadline passes while no operator runs.
        let deployments = env.deployments();
        wait_until(
            "the deadline to pass",
            ROLLOUT,
            || async { deployments.get("svc").await.unwrap() },
            |d| {
                d.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c.reason.as_deref() == Some("ProgressDeadlineExceeded"))
                    })
            },
        )
        .await;
        env.operator.restart();
        let s = env
            .wait_status("svc", "the rollback after restart", |s| {
                s.phase == Some(Phase::RolledBack)
                    && s.conditions
                        .iter()
                        .any(|c| c.type_ == "RolledBack" && c.status == "True")
            })
            .await;
        assert_eq!(s.rollback_count, Some(1));
        assert_eq!(s.last_successful_spec.unwrap().version, v1);
        // Killed again at a steady point and restarted: nothing changes.
        env.operator.restart();
        tokio::time::sleep(Duration::from_secs(5)).await; // two resync periods after the restart
        assert_eq!(env.status("svc").await.rollback_count, Some(1));
        env.finish().await;
    });
}

fn a_steady_state_sends_no_requests() {
    block_on(async {
        let env = Env::new("steady").await;
        let v1 = env.version("v1");
        env.apply(&deployment_yaml("svc", "openmed-service", "boot"))
            .await;
        env.apply(&model_yaml("svc", &v1, "")).await;
        env.wait_ready("svc", &v1).await;
        const SKIPPED: &str = "openmed_operator_resyncs_skipped_total ";
        let skipped_before = counter(&env.operator.metrics().await, SKIPPED);
        // A minute of steady state, 30 resync periods of 2 s, after the
        // rollout's last writes settle into the caches.
        let requests = requests_at_rest(
            &env.ns.name,
            Duration::from_secs(3),
            Duration::from_secs(60),
        )
        .await;
        assert!(
            requests.is_empty(),
            "the operator sent requests in a steady state:\n{}",
            requests.join("\n")
        );
        // At rest the resyncs were not decided again: at most the first
        // few after the rollout were (they forget its writes).
        let skipped = counter(&env.operator.metrics().await, SKIPPED) - skipped_before;
        assert!(
            skipped >= 20.0,
            "{skipped} of about 30 resyncs at rest were skipped"
        );
        // A resource at rest still sees a change in its namespace: another
        // writer removes the operator's env entry, and it comes back.
        remove_preload_env_and_wait_until_restored(&env).await;
        env.finish().await;
    });
}

fn a_status_from_the_earlier_operator_is_adopted_without_a_restart() {
    block_on(async {
        let client = admin().await;
        install_crd(&client).await;
        let ns = TestNamespace::create(&client, "migrate").await;
        let vector: Value = serde_json::from_str(
            &std::fs::read_to_string(root().join("tests/vectors/basic-v1.json")).unwrap(),
        )
        .unwrap();
        // What the earlier operator left behind: the Deployment wired to its
        // ConfigMap, the ConfigMap, and the resource with its status.
        let deployment = format!(
            "apiVersion: apps/v1
kind: Deployment
metadata:
  name: openmed-service
  labels: {{app: openmed-service}}
  annotations: {{openmed.ai/model-resource: {ns}/openmed-service}}
spec:
  replicas: 2
  progressDeadlineSeconds: 600
  strategy: {{type: RollingUpdate, rollingUpdate: {{maxSurge: 1, maxUnavailable: 0}}}}
  selector:
    matchLabels: {{app: openmed-service}}
  template:
    metadata:
      labels: {{app: openmed-service}}
      annotations:
        openmed.ai/model-manifest-hash: {hash}
        openmed.ai/model-resource: {ns}/openmed-service
    spec:
      containers:
      - name: openmed-service
        image: openmed/openmed-service:1.0.0
        env:
        - name: OPENMED_SERVICE_PRELOAD_MODELS
          valueFrom:
            configMapKeyRef: {{name: openmed-service-model-manifest, key: OPENMED_SERVICE_PRELOAD_MODELS}}
",
            ns = ns.name,
            hash = vector["manifestHash"].as_str().unwrap()
        );
        apply_yaml(&client, Some(&ns.name), &deployment, "kopf").await;
        let mut resource = vector["resource"].clone();
        resource["metadata"] = json!({"name": "openmed-service"});
        let model = serde_yaml::to_string(&resource).unwrap();
        let stored = apply_yaml(&client, Some(&ns.name), &model, "kopf").await;
        let uid = stored[0].metadata.uid.clone().unwrap();
        let cm = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "openmed-service-model-manifest",
                         "labels": {"app.kubernetes.io/managed-by": "openmed-operator", "openmed.ai/model-family": "pii"},
                         "annotations": {"openmed.ai/model-resource": format!("{}/openmed-service", ns.name)},
                         "ownerReferences": [{"apiVersion": "openmed.ai/v1alpha1", "kind": "OpenMedModel", "name": "openmed-service",
                                              "uid": uid, "controller": true, "blockOwnerDeletion": true}]},
            "data": {"manifest.json": vector["manifestJson"], "OPENMED_SERVICE_PRELOAD_MODELS": vector["normalizedSpec"]["version"]},
        });
        apply_yaml(
            &client,
            Some(&ns.name),
            &serde_yaml::to_string(&cm).unwrap(),
            "kopf",
        )
        .await;
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
        let ready = wait_until(
            "the earlier operator's Deployment to be available",
            ROLLOUT,
            || async { deployments.get("openmed-service").await.unwrap() },
            |d| {
                d.status
                    .as_ref()
                    .is_some_and(|s| s.ready_replicas == Some(2) && s.updated_replicas == Some(2))
            },
        )
        .await;
        let generation = ready.metadata.generation;
        let models: Api<OpenMedModel> = Api::namespaced(client.clone(), &ns.name);
        let mut object = models.get("openmed-service").await.unwrap();
        object.status = Some(serde_json::from_value(json!({
            "observedGeneration": 1, "phase": "Ready", "desiredVersion": vector["normalizedSpec"]["version"],
            "activeVersion": vector["normalizedSpec"]["version"], "desiredSpecHash": vector["specHash"],
            "appliedSpecHash": vector["specHash"], "manifestHash": vector["manifestHash"],
            "targetDeploymentGeneration": generation, "rollbackCount": 0,
            "lastSuccessfulSpec": vector["normalizedSpec"],
        })).unwrap());
        models
            .replace_status("openmed-service", &PostParams::default(), &object)
            .await
            .unwrap();

        let mut operator = Operator::start(&ns.name, &[]);
        wait_until(
            "the operator to label the Deployment (adoption)",
            ROLLOUT,
            || async { deployments.get("openmed-service").await.unwrap() },
            |d| d.labels().get("openmed.ai/operated-by").is_some(),
        )
        .await;
        let s = models.get("openmed-service").await.unwrap().status.unwrap();
        assert_eq!(s.phase, Some(Phase::Ready));
        assert_eq!(s.applied_spec_hash.as_deref(), vector["specHash"].as_str());
        assert_eq!(
            s.last_successful_spec.unwrap().version,
            vector["normalizedSpec"]["version"].as_str().unwrap()
        );
        let after = deployments.get("openmed-service").await.unwrap();
        assert_eq!(
            after.metadata.generation, generation,
            "no pod-template change: no pod restarts"
        );
        operator.kill();
        ns.delete().await;
    });
}

fn an_autoscaled_target_keeps_its_replicas() {
    block_on(async {
        let env = Env::new("hpa").await;
        let v1 = env.version("v1");
        env.apply(&deployment_yaml("svc", "openmed-service", "boot"))
            .await;
        env.apply(
            "apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: svc
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: svc}
  minReplicas: 1
  maxReplicas: 5
",
        )
        .await;
        env.apply(&model_yaml("svc", &v1, "")).await;
        let s = env.wait_ready("svc", &v1).await;
        let ready = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
        assert!(
            ready.message.contains("HorizontalPodAutoscaler"),
            "{}",
            ready.message
        );
        assert_eq!(
            env.deployment("svc").await["spec"]["replicas"],
            1,
            "spec.replicas: 2 is not written"
        );
        // The autoscaler scales; the operator does not fight it.
        env.deployments()
            .patch(
                "svc",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": 4}})),
            )
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(5)).await; // two resync periods, to prove nothing reverts it
        assert_eq!(env.deployment("svc").await["spec"]["replicas"], 4);
        env.finish().await;
    });
}

/// Every observation of `svc`, until `done` says the change is over, has
/// `spec.replicas` equal to `replicas`: checked while the rollout runs.
async fn replicas_hold_until(
    env: &Env,
    replicas: i64,
    what: &str,
    mut done: impl FnMut(&openmed_op::api::OpenMedModelStatus) -> bool,
) {
    wait_until(
        what,
        ROLLOUT,
        || async { (env.deployment("svc").await, env.status("svc").await) },
        |(deployment, status)| {
            assert_eq!(
                deployment["spec"]["replicas"], replicas,
                "spec.replicas changed while {what}"
            );
            done(status)
        },
    )
    .await;
}

fn replicas_are_never_defaulted_when_the_operator_stops_applying_them() {
    block_on(async {
        let env = Env::new("handover").await;
        let (v1, v2, bad) = (env.version("v1"), env.version("v2"), env.version("bad"));
        mark_unready(&env.client, &[&bad]).await;
        env.apply(&deployment_yaml("svc", "openmed-service", "boot"))
            .await;
        // spec.replicas: 2 is applied, so the operator owns the field.
        env.apply(&model_yaml(
            "svc",
            &v1,
            "  rolloutStrategy:\n    progressDeadlineSeconds: 8\n",
        ))
        .await;
        env.wait_ready("svc", &v1).await;
        assert_eq!(env.deployment("svc").await["spec"]["replicas"], 2);

        // The next spec has no replicas: its apply drops the field.
        env.set_spec("svc", json!({"version": v2, "replicas": null}))
            .await;
        replicas_hold_until(&env, 2, "v2 without spec.replicas rolls out", |s| {
            s.phase == Some(Phase::Ready) && s.active_version.as_deref() == Some(v2.as_str())
        })
        .await;

        // An autoscaler created after the rollout, before it has scaled:
        // the next version's apply no longer sends replicas.
        env.set_spec("svc", json!({"version": v1, "replicas": 2}))
            .await;
        env.wait_ready("svc", &v1).await;
        env.apply(
            "apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: svc
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: svc}
  minReplicas: 2
  maxReplicas: 5
",
        )
        .await;
        env.wait_status("svc", "the operator to see the autoscaler", |s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.message.contains("HorizontalPodAutoscaler"))
        })
        .await;
        env.set_spec("svc", json!({"version": bad})).await;
        replicas_hold_until(&env, 2, "bad rolls out and is rolled back", |s| {
            s.phase == Some(Phase::RolledBack)
                && s.conditions
                    .iter()
                    .any(|c| c.type_ == "RolledBack" && c.status == "True")
        })
        .await;
        env.set_spec("svc", json!({"version": v2})).await;
        replicas_hold_until(&env, 2, "v2 rolls out under the autoscaler", |s| {
            s.phase == Some(Phase::Ready) && s.active_version.as_deref() == Some(v2.as_str())
        })
        .await;
        env.finish().await;
    });
}

fn a_rollback_after_a_target_change_stays_on_the_new_target() {
    block_on(async {
        let env = Env::new("retarget").await;
        let (v1, bad) = (env.version("v1"), env.version("bad"));
        mark_unready(&env.client, &[&bad]).await;
        env.apply(&deployment_yaml("svc", "openmed-service", "boot"))
            .await;
        env.apply(&deployment_yaml("svc-next", "openmed-service", "boot"))
            .await;
        env.apply(&model_yaml(
            "svc",
            &v1,
            "  rolloutStrategy:\n    progressDeadlineSeconds: 8\n",
        ))
        .await;
        env.wait_ready("svc", &v1).await;
        env.set_spec(
            "svc",
            json!({"version": bad, "targetRef": {"name": "svc-next"}}),
        )
        .await;
        let s = env.wait_rolled_back("svc").await;
        assert_eq!(s.active_version.as_deref(), Some(v1.as_str()));
        let next = env.deployment("svc-next").await;
        assert_eq!(
            next["metadata"]["annotations"]["openmed.ai/model-resource"],
            json!(format!("{}/svc", env.ns.name)),
            "the new target is the one served"
        );
        let reads = next["spec"]["template"]["spec"]["containers"][0]["env"][0]["valueFrom"]
            ["configMapKeyRef"]["name"]
            .as_str()
            .expect("the new target reads a snapshot")
            .to_owned();
        let cm = env.config_maps().get(&reads).await.unwrap();
        assert_eq!(
            cm.data.unwrap()["OPENMED_SERVICE_PRELOAD_MODELS"],
            v1,
            "the new target serves v1 again"
        );
        let old = env.deployment("svc").await;
        assert!(
            old["metadata"]["annotations"]
                .get("openmed.ai/model-resource")
                .is_none(),
            "the old target stays released: {}",
            old["metadata"]
        );
        // And it settles: no reconcile keeps failing.
        env.wait_status("svc", "the Reconciling condition to settle", |s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Reconciling" && c.status == "False")
        })
        .await;
        env.finish().await;
    });
}

fn health_metrics_and_graceful_shutdown() {
    block_on(async {
        let mut env = Env::new("runtime").await;
        let v1 = env.version("v1");
        env.apply(&deployment_yaml("svc", "openmed-service", "boot"))
            .await;
        env.apply(&model_yaml("svc", &v1, "")).await;
        env.wait_ready("svc", &v1).await;
        let addr = env.operator.addr.clone();
        let health = wait_for("/healthz", ROLLOUT, || http_get(&addr, "/healthz")).await;
        assert_eq!(health, "ok");
        // The status that says Ready is written before the pass's other
        // writes; its event (and the counters that follow events) come
        // after them, so the metrics may lag the status by a request.
        let names = [
            "controller_runtime_reconcile_total{controller=\"openmedmodel\",result=\"success\"}",
            "controller_runtime_reconcile_time_seconds_bucket",
            "openmed_rollouts_total{outcome=\"started\"} 1",
            "openmed_rollouts_total{outcome=\"succeeded\"} 1",
        ];
        let operator = &env.operator;
        wait_until(
            "every expected series in /metrics",
            ROLLOUT,
            || operator.metrics(),
            |metrics| names.iter().all(|name| metrics.contains(name)),
        )
        .await;
        assert_eq!(env.operator.terminate(), Some(0), "a clean exit on SIGTERM");
        assert!(env.operator.log_text().contains("stopped"));
        env.finish().await;
    });
}
