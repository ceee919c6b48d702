//! Rollouts of the real service under real load through the Gateway.

use std::time::Duration;

use libtest_mimic::Trial;
use serde_json::json;

use crate::app::*;
use crate::support::*;
use crate::trial;

pub fn trials() -> Vec<Trial> {
    vec![trial(
        "rollout::a_version_bump_drops_nothing",
        a_version_bump_drops_nothing,
    )]
}

/// v1 → v2 at 20 requests/s: no request fails; no answer names v2 before
/// the first v2 pod is Ready; every request sent after the operator
/// reports the rollout done is answered by v2.
fn a_version_bump_drops_nothing() {
    block_on(async {
        let app = App::deploy("stack-bump").await;
        let (stop, load) = app.load(20.0, Duration::from_secs(120));
        // Three seconds of traffic on v1 first: the baseline phase.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let old_pods: Vec<String> = app
            .pods()
            .await
            .iter()
            .filter_map(|p| p.metadata.uid.clone())
            .collect();
        let bumped = now_ms();
        app.env.set_spec(NAME, json!({"version": V2})).await;
        app.env.wait_ready(NAME, V2).await;
        let succeeded = now_ms();
        // Five seconds of traffic after the rollout is done.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let _ = stop.send(());
        let records = load.await.unwrap();

        let new_ready: Vec<f64> = app
            .pods()
            .await
            .iter()
            .filter(|p| !old_pods.contains(p.metadata.uid.as_ref().unwrap()))
            .filter_map(ready_ms)
            .collect();
        assert!(!new_ready.is_empty(), "the v2 pods are Ready");
        let first_v2_ready = new_ready.iter().copied().fold(f64::INFINITY, f64::min);

        let failed: Vec<_> = records.iter().filter(|r| !r.ok()).collect();
        assert!(
            failed.is_empty(),
            "{} of {} requests failed: {:?}",
            failed.len(),
            records.len(),
            &failed[..failed.len().min(5)]
        );
        let v2: Vec<_> = records
            .iter()
            .filter(|r| r.model_name.as_deref() == Some(V2))
            .collect();
        let early: Vec<_> = v2
            .iter()
            .filter(|r| r.answered_unix_ms() < first_v2_ready)
            .collect();
        assert!(
            early.is_empty(),
            "answers named v2 before a v2 pod was Ready: {early:?}"
        );
        let late_v1: Vec<_> = records
            .iter()
            .filter(|r| r.unix_ms as f64 >= succeeded && r.model_name.as_deref() != Some(V2))
            .collect();
        assert!(
            late_v1.is_empty(),
            "requests sent after RolloutSucceeded answered by another model: {late_v1:?}"
        );

        let first_v2 = v2
            .iter()
            .map(|r| r.answered_unix_ms())
            .fold(f64::INFINITY, f64::min);
        let last_v1 = records
            .iter()
            .filter(|r| r.model_name.as_deref() == Some(V1))
            .map(|r| r.answered_unix_ms())
            .fold(0.0, f64::max);
        eprintln!("rollout::a_version_bump_drops_nothing (20 requests/s through the Gateway):");
        let before: Vec<_> = records
            .iter()
            .filter(|r| (r.unix_ms as f64) < bumped)
            .cloned()
            .collect();
        let during: Vec<_> = records
            .iter()
            .filter(|r| (r.unix_ms as f64) >= bumped && (r.unix_ms as f64) < succeeded)
            .cloned()
            .collect();
        let after: Vec<_> = records
            .iter()
            .filter(|r| r.unix_ms as f64 >= succeeded)
            .cloned()
            .collect();
        let phases = vec![
            phase("before the bump", &before),
            phase("bump to RolloutSucceeded", &during),
            phase("after", &after),
        ];
        let to_first = (first_v2 - bumped) / 1000.0;
        let to_all = (last_v1 - bumped) / 1000.0;
        let rollout = (succeeded - bumped) / 1000.0;
        eprintln!(
            "  bump → first v2 answer {to_first:.1} s, → last v1 answer {to_all:.1} s, → RolloutSucceeded {rollout:.1} s"
        );
        record_result(json!({
            "scenario": "a_version_bump_drops_nothing", "rps": 20, "phases": phases,
            "bump_to_first_v2_s": (to_first * 10.0).round() / 10.0,
            "bump_to_last_v1_s": (to_all * 10.0).round() / 10.0,
            "bump_to_succeeded_s": (rollout * 10.0).round() / 10.0,
        }));
        app.env.finish().await;
    });
}
