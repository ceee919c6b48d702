//! The soak on the real control plane: `Soaked` turns True a soak after
//! `Ready`, by a timer (no request while it runs), and an abort during a
//! soak rolls back to the version before it.

use std::time::Duration;

use libtest_mimic::Trial;
use openmed_op::api::OpenMedModelStatus;
use serde_json::json;

use crate::env::{Env, deployment_yaml, model_yaml};
use crate::support::*;
use crate::trial;

pub fn trials() -> Vec<Trial> {
    vec![
        trial(
            "soak::soaked_comes_by_a_timer_and_an_abort_rolls_back_to_the_version_before",
            soaked_comes_by_a_timer_and_an_abort_rolls_back_to_the_version_before,
        ),
        trial(
            "soak::a_bump_during_a_soak_serves_the_soaking_version_beside_the_new_one",
            a_bump_during_a_soak_serves_the_soaking_version_beside_the_new_one,
        ),
    ]
}

/// v2 Ready and soaking on every pod, then v3: v3's pods serve v2 too,
/// the version every client was answered by.
fn a_bump_during_a_soak_serves_the_soaking_version_beside_the_new_one() {
    block_on(async {
        let env = Env::new("soak-served").await;
        let (v1, v2, v3) = (env.version("v1"), env.version("v2"), env.version("v3"));
        env.apply(&deployment_yaml("svc", "openmed-service", "boot"))
            .await;
        env.apply(&model_yaml("svc", &v1, "")).await;
        env.wait_ready("svc", &v1).await;
        env.set_spec(
            "svc",
            json!({"version": v2, "rolloutStrategy": {"soakSeconds": 300}}),
        )
        .await;
        env.wait_status("svc", "v2 Ready and soaking", |s| {
            s.active_version.as_deref() == Some(v2.as_str())
                && soaked(s) == Some(("False".into(), "Soaking".into()))
        })
        .await;
        env.set_spec("svc", json!({"version": v3})).await;
        env.wait_ready("svc", &v3).await;
        let served = crate::canary::served_set(&env.deployment("svc").await);
        assert_eq!(
            served[..2],
            [v3.clone(), v2.clone()],
            "v3's pods answer the clients of v2, which every pod served: {served:?}"
        );
        env.finish().await;
    });
}

/// The soak this test asks for: long enough to measure a quiet window
/// inside it, short enough for CI.
const SOAK: i64 = 20;

fn soaked(s: &OpenMedModelStatus) -> Option<(String, String)> {
    s.conditions
        .iter()
        .find(|c| c.type_ == "Soaked")
        .map(|c| (c.status.clone(), c.reason.clone()))
}

fn soaked_at_generation(s: &OpenMedModelStatus) -> bool {
    s.conditions.iter().any(|c| {
        c.type_ == "Soaked" && c.status == "True" && c.observed_generation == s.observed_generation
    })
}

fn soaked_comes_by_a_timer_and_an_abort_rolls_back_to_the_version_before() {
    block_on(async {
        let env = Env::new("soak").await;
        let (v1, v2) = (env.version("v1"), env.version("v2"));
        env.apply(&deployment_yaml("svc", "openmed-service", "boot"))
            .await;
        env.apply(&model_yaml(
            "svc",
            &v1,
            &format!("  rolloutStrategy:\n    soakSeconds: {SOAK}\n"),
        ))
        .await;
        let ready = env.wait_ready("svc", &v1).await;
        assert_eq!(
            soaked(&ready),
            Some(("False".into(), "Soaking".into())),
            "Ready comes first, Soaked a soak later"
        );
        // While it soaks the operator sends nothing: a timer, not polling.
        let requests =
            requests_at_rest(&env.ns.name, Duration::from_secs(3), Duration::from_secs(8)).await;
        assert!(
            requests.is_empty(),
            "the operator sent requests during the soak:\n{}",
            requests.join("\n")
        );
        let s = env
            .wait_status("svc", "Soaked=True for v1", soaked_at_generation)
            .await;
        let soak = s.soak.clone().expect("the soak is recorded");
        let took = soak.soaked_time.unwrap().0.as_second() - soak.start_time.0.as_second();
        assert!(
            took >= SOAK,
            "soaked {took} s after Ready, before its {SOAK} s were over"
        );
        assert_eq!(s.last_successful_spec.as_ref().unwrap().version, v1);
        env.wait_event("svc", "Soaked").await;

        // v2 turns Ready and soaks; an abort during its soak rolls back.
        env.set_spec("svc", json!({"version": v2})).await;
        env.wait_status("svc", "v2 Ready and soaking", |s| {
            s.active_version.as_deref() == Some(v2.as_str())
                && soaked(s) == Some(("False".into(), "Soaking".into()))
        })
        .await;
        env.annotate("svc", "openmed.ai/soak-abort", Some("e2e"))
            .await;
        let s = env.wait_rolled_back("svc").await;
        assert_eq!(s.active_version.as_deref(), Some(v1.as_str()));
        assert_eq!(soaked(&s), Some(("False".into(), "RolledBack".into())));
        assert_eq!(
            s.last_successful_spec.as_ref().unwrap().version,
            v1,
            "a version that failed its soak never joins the history"
        );
        assert!(
            s.previous_successful_spec.is_none(),
            "{:?}",
            s.previous_successful_spec
        );
        let degraded = s.conditions.iter().find(|c| c.type_ == "Degraded").unwrap();
        assert!(
            degraded.message.contains("failed its soak") && degraded.message.contains("e2e"),
            "{}",
            degraded.message
        );
        env.finish().await;
    });
}
