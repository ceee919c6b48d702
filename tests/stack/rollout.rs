//! Rollouts of the real service under real load through the Gateway.

use std::time::Duration;

use libtest_mimic::Trial;
use serde_json::json;

use crate::app::*;
use crate::support::*;
use crate::trial;

pub fn trials() -> Vec<Trial> {
    vec![
        trial(
            "rollout::a_version_bump_drops_nothing",
            a_version_bump_drops_nothing,
        ),
        trial(
            "rollout::a_manual_rollback_drops_nothing",
            a_manual_rollback_drops_nothing,
        ),
        trial(
            "rollout::deleting_the_model_is_what_clients_see",
            deleting_the_model_is_what_clients_see,
        ),
        trial(
            "rollout::scaling_up_drops_nothing",
            scaling_up_drops_nothing,
        ),
        trial(
            "rollout::the_gateway_lets_go_of_idle_connections_first",
            the_gateway_lets_go_of_idle_connections_first,
        ),
    ]
}

/// v1 → v2, then `openmed.ai/rollback-to: v1`, with the stock app: clients
/// naming v2 (the version they use) and clients naming v1 each send 10
/// requests/s throughout. No request of either fails, and every answer
/// comes from the model named.
fn a_manual_rollback_drops_nothing() {
    block_on(async {
        let app = App::deploy("stack-manual").await;
        app.env.set_spec(NAME, json!({"version": V2})).await;
        app.env.wait_ready(NAME, V2).await;
        let (stop_v2, v2_clients) = app.load(Some(V2), 10.0, Duration::from_secs(120));
        let (stop_v1, v1_clients) = app.load(Some(V1), 10.0, Duration::from_secs(120));
        tokio::time::sleep(Duration::from_secs(3)).await;
        let asked = now_ms();
        app.env
            .annotate(NAME, "openmed.ai/rollback-to", Some(V1))
            .await;
        app.env.wait_manual_rollback(NAME, V1).await;
        let done = now_ms();
        tokio::time::sleep(Duration::from_secs(5)).await;
        let _ = stop_v2.send(());
        let _ = stop_v1.send(());
        let v2 = v2_clients.await.unwrap();
        let v1 = v1_clients.await.unwrap();
        assert_all_served(&v2);
        assert_all_served(&v1);
        assert_answered_as_named(&v2, V2);
        assert_answered_as_named(&v1, V1);
        eprintln!(
            "rollout::a_manual_rollback_drops_nothing (stock app, 10 requests/s naming v2 and 10 naming v1, through the Gateway):"
        );
        let names = ["before", "annotation to rolled back", "after"];
        let v2_phases = phases_around(&v2, names, asked, done);
        let v1_phases = phases_around(&v1, names, asked, done);
        let took = (done - asked) / 1000.0;
        eprintln!("  annotation → manual rollback done {took:.1} s");
        record_result(json!({
            "scenario": "a_manual_rollback_drops_nothing", "app": "stock", "rps": 20,
            "phases_naming_v2": v2_phases, "phases_naming_v1": v1_phases,
            "annotation_to_rolled_back_s": (took * 10.0).round() / 10.0,
        }));
        app.env.finish().await;
    });
}

/// Deleting the OpenMedModel releases the Deployment: the operator takes
/// its pointer out, the pods roll to a template that preloads nothing, and
/// the Deployment keeps running. What the clients see is measured and
/// documented (docs/reliability.md): the old pods answer until the new
/// ones are Ready, and the new ones have no model to answer with.
fn deleting_the_model_is_what_clients_see() {
    block_on(async {
        let app = App::deploy("stack-delete").await;
        let (stop, load) = app.load(Some(V1), 20.0, Duration::from_secs(120));
        tokio::time::sleep(Duration::from_secs(3)).await;
        let deleted = now_ms();
        app.env
            .models()
            .delete(NAME, &Default::default())
            .await
            .unwrap();
        wait_for(
            "the OpenMedModel to be gone",
            Duration::from_secs(90),
            || async {
                app.env
                    .models()
                    .get_opt(NAME)
                    .await
                    .ok()?
                    .is_none()
                    .then_some(())
            },
        )
        .await;
        let gone = now_ms();
        // Until the Deployment has rolled: every pod without the pointer.
        wait_until(
            "the Deployment to roll to the released template",
            Duration::from_secs(90),
            || async { app.env.deployment(NAME).await },
            |d| {
                let s = &d["status"];
                s["updatedReplicas"] == s["replicas"]
                    && s["availableReplicas"] == s["replicas"]
                    && s["terminatingReplicas"].as_i64().unwrap_or(0) == 0
            },
        )
        .await;
        let rolled = now_ms();
        tokio::time::sleep(Duration::from_secs(3)).await;
        let _ = stop.send(());
        let records = load.await.unwrap();
        let before = sent_between(&records, 0.0, deleted);
        let during = sent_between(&records, deleted, rolled);
        let after = sent_between(&records, rolled, f64::INFINITY);
        assert!(
            before.iter().all(|r| r.ok()),
            "before the deletion every request is served"
        );
        assert!(
            !after.is_empty() && after.iter().all(|r| !r.ok()),
            "a released pod serves no version of the model (422 model_not_served): {:?}",
            &after[..after.len().min(3)]
        );
        eprintln!("rollout::deleting_the_model (20 requests/s through the Gateway):");
        let errors: Vec<_> = after.iter().filter_map(|r| r.error.clone()).collect();
        let phases = vec![
            phase("before", &before),
            phase("deletion to rolled", &during),
            phase("after", &after),
        ];
        eprintln!(
            "  deletion → resource gone {:.1} s, → pods rolled {:.1} s; errors after: {:?}",
            (gone - deleted) / 1000.0,
            (rolled - deleted) / 1000.0,
            errors.first()
        );
        record_result(json!({
            "scenario": "deleting_the_model", "rps": 20, "phases": phases,
            "deletion_to_rolled_s": ((rolled - deleted) / 100.0).round() / 10.0,
            "error_after": errors.first(),
        }));
        app.env.finish().await;
    });
}

/// v1 → v2 with the stock app: clients naming v1 send 20 requests/s from
/// before the bump to after it; clients naming v2 start once the rollout
/// is Ready. No request of either fails (none is refused as
/// `model_not_served`), and every answer comes from the model named.
fn a_version_bump_drops_nothing() {
    block_on(async {
        let app = App::deploy("stack-bump").await;
        let (stop_old, old_clients) = app.load(Some(V1), 20.0, Duration::from_secs(120));
        // Three seconds of traffic on v1 first: the baseline phase.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let bumped = now_ms();
        app.env.set_spec(NAME, json!({"version": V2})).await;
        app.env.wait_ready(NAME, V2).await;
        let succeeded = now_ms();
        let (stop_new, new_clients) = app.load(Some(V2), 20.0, Duration::from_secs(60));
        // Five seconds of traffic after the rollout is done.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let _ = stop_old.send(());
        let _ = stop_new.send(());
        let old = old_clients.await.unwrap();
        let new = new_clients.await.unwrap();

        assert_all_served(&old);
        assert_all_served(&new);
        assert_answered_as_named(&old, V1);
        assert_answered_as_named(&new, V2);
        let served = app.env.deployment(NAME).await;
        eprintln!(
            "rollout::a_version_bump_drops_nothing (stock app, 20 requests/s naming v1, then 20 naming v2, through the Gateway):"
        );
        let phases = phases_around(
            &old,
            [
                "v1 clients before the bump",
                "v1 clients, bump to RolloutSucceeded",
                "v1 clients after",
            ],
            bumped,
            succeeded,
        );
        let after = phase("v2 clients after RolloutSucceeded", &new);
        let rollout = (succeeded - bumped) / 1000.0;
        eprintln!(
            "  bump → RolloutSucceeded {rollout:.1} s; served set {}",
            served_set(&served)
        );
        record_result(json!({
            "scenario": "a_version_bump_drops_nothing", "app": "stock", "rps": 20,
            "phases": phases, "new_clients": after,
            "bump_to_succeeded_s": (rollout * 10.0).round() / 10.0,
        }));
        app.env.finish().await;
    });
}

/// 2 → 6 replicas at 20 requests/s: no request fails while four new pods
/// start. A pod is in its Service's endpoints, not ready, from the moment
/// it has an address, seconds before the service listens: the Gateway
/// must keep it out until it is ready (Envoy Gateway hands it to Envoy as
/// draining, and Envoy leaves draining hosts out of its balancing and of
/// its panic threshold).
fn scaling_up_drops_nothing() {
    block_on(async {
        let app = App::deploy("stack-scale").await;
        let (stop, load) = app.load(Some(V1), 20.0, Duration::from_secs(120));
        tokio::time::sleep(Duration::from_secs(3)).await;
        let scaled = now_ms();
        app.env.set_spec(NAME, json!({"replicas": 6})).await;
        // The window the policy is for: more pods than ready ones, fewer
        // than half of them ready.
        let ready_of = |d: &serde_json::Value| {
            (
                d["status"]["readyReplicas"].as_i64().unwrap_or(0),
                d["status"]["replicas"].as_i64().unwrap_or(0),
            )
        };
        wait_until(
            "six pods, fewer than three of them ready",
            Duration::from_secs(60),
            || app.env.deployment(NAME),
            |d| {
                let (ready, pods) = ready_of(d);
                pods == 6 && ready < 3
            },
        )
        .await;
        wait_until(
            "six ready pods",
            Duration::from_secs(120),
            || app.env.deployment(NAME),
            |d| ready_of(d) == (6, 6),
        )
        .await;
        let ready = now_ms();
        tokio::time::sleep(Duration::from_secs(5)).await;
        let _ = stop.send(());
        let records = load.await.unwrap();

        assert_all_served(&records);
        let other: Vec<_> = records
            .iter()
            .filter(|r| r.model_name.as_deref() != Some(V1))
            .collect();
        assert!(other.is_empty(), "answered by another model: {other:?}");
        let pods: std::collections::BTreeSet<_> =
            records.iter().filter_map(|r| r.pod.clone()).collect();
        assert!(
            pods.len() >= 6,
            "the new pods answered once ready: {pods:?}"
        );
        eprintln!("rollout::scaling_up_drops_nothing (20 requests/s through the Gateway):");
        let phases = phases_around(
            &records,
            ["before", "2 → 6 replicas", "after"],
            scaled,
            ready,
        );
        let took = (ready - scaled) / 1000.0;
        eprintln!("  replicas 2 → 6: every pod ready after {took:.1} s");
        record_result(json!({
            "scenario": "scaling_up_drops_nothing", "rps": 20, "phases": phases,
            "scale_to_ready_s": (took * 10.0).round() / 10.0,
        }));
        app.env.finish().await;
    });
}

/// The service closes a keep-alive connection after 5 s idle; a request
/// Envoy sends on it at that moment fails (a 503, "upstream reset:
/// connection termination"), which the stack saw once in several hundred
/// requests. The example's Gateway policy has Envoy close idle
/// connections after 3 s, so the service never closes one under it: after
/// requests 6 s apart, every connection Envoy lost it closed itself.
fn the_gateway_lets_go_of_idle_connections_first() {
    block_on(async {
        let app = App::deploy("stack-idle").await;
        let client = reqwest::Client::new();
        let cluster = format!("httproute/{}/", app.env.ns.name);
        for _ in 0..3 {
            let answer = client
                .post(format!("{}/pii/extract", app.url))
                .json(&json!({"text": "Patient John Smith, seen 2024-03-15.", "model_name": V1}))
                .send()
                .await
                .unwrap();
            assert!(answer.status().is_success(), "{answer:?}");
            // Idle past both timeouts: the stimulus, not a wait.
            tokio::time::sleep(Duration::from_secs(6)).await;
        }
        let closed_by_envoy = envoy_counter(&cluster, "upstream_cx_destroy_local").await;
        let closed_by_service = envoy_counter(&cluster, "upstream_cx_destroy_remote").await;
        eprintln!(
            "rollout::the_gateway_lets_go_of_idle_connections_first: idle connections closed by Envoy {closed_by_envoy}, by the service {closed_by_service}"
        );
        assert!(closed_by_envoy >= 3.0, "Envoy closed {closed_by_envoy}");
        assert_eq!(
            closed_by_service, 0.0,
            "the service closed connections first"
        );
        app.env.finish().await;
    });
}
