//! A model that never warms, on the real stack: the service exits before
//! it listens, its pods crash-loop, the operator rolls back and says why,
//! and the old pods answer every request meanwhile.

use std::time::Duration;

use libtest_mimic::Trial;
use openmed_op::api::Phase;
use serde_json::{Value, json};

use crate::app::*;
use crate::support::*;
use crate::trial;

pub fn trials() -> Vec<Trial> {
    vec![
        trial(
            "crash::a_model_that_never_warms_fails_fast_and_the_event_says_why",
            a_model_that_never_warms_fails_fast_and_the_event_says_why,
        ),
        trial(
            "crash::without_fail_fast_the_deadline_decides_and_the_event_still_says_why",
            without_fail_fast_the_deadline_decides_and_the_event_still_says_why,
        ),
    ]
}

/// The pointer is valid but not in the service's cache: the real process
/// ends with "Application startup failed" and exit status 3.
const MISSING: &str = "OpenMed/synthetic-pii-missing";

async fn rolled_back_with(app: &App, spec: Value, what: &str, deadline: Duration) -> (f64, String) {
    let bumped = now_ms();
    app.env.set_spec(NAME, spec).await;
    let status = wait_until(
        what,
        deadline,
        || async { app.env.status(NAME).await },
        |s| {
            s.phase == Some(Phase::RolledBack)
                && s.conditions
                    .iter()
                    .any(|c| c.type_ == "RolledBack" && c.status == "True")
        },
    )
    .await;
    assert_eq!(status.active_version.as_deref(), Some(V1));
    let failed = app
        .env
        .events(NAME)
        .await
        .into_iter()
        .find(|(reason, _, _)| reason == "RolloutFailed")
        .map(|(_, message, _)| message)
        .expect("a RolloutFailed event");
    ((now_ms() - bumped) / 1000.0, failed)
}

fn a_model_that_never_warms_fails_fast_and_the_event_says_why() {
    block_on(async {
        let app = App::deploy("stack-crash").await;
        let (stop, load) = app.load(20.0, Duration::from_secs(180));
        let (took, failed) = rolled_back_with(
            &app,
            json!({"version": MISSING}),
            "the crash-looping rollout to be rolled back",
            Duration::from_secs(120),
        )
        .await;
        let _ = stop.send(());
        let records = load.await.unwrap();
        assert!(
            failed.contains(
                "keeps crashing: container openmed-service restarted 2 times, exit code 3"
            ),
            "{failed}"
        );
        assert!(
            failed.contains("LocalEntryNotFoundError"),
            "the service's own reason, from its termination message: {failed}"
        );
        assert_all_served(&records);
        assert!(records.iter().all(|r| r.model_name.as_deref() == Some(V1)));
        eprintln!(
            "crash::a_model_that_never_warms_fails_fast (20 requests/s through the Gateway):"
        );
        let phases = vec![phase("bump to RollbackSucceeded", &records)];
        eprintln!("  bump → rolled back {took:.1} s; RolloutFailed: {failed}");
        record_result(json!({
            "scenario": "a_model_that_never_warms_fails_fast", "rps": 20, "phases": phases,
            "bump_to_rolled_back_s": (took * 10.0).round() / 10.0, "event": failed,
        }));
        app.env.finish().await;
    });
}

fn without_fail_fast_the_deadline_decides_and_the_event_still_says_why() {
    block_on(async {
        let app = App::deploy("stack-deadline").await;
        let (stop, load) = app.load(10.0, Duration::from_secs(180));
        let (took, failed) = rolled_back_with(
            &app,
            json!({"version": MISSING, "rolloutStrategy": {
                "progressDeadlineSeconds": 30, "failFast": {"enabled": false}}}),
            "the rollout to fail at its deadline and be rolled back",
            Duration::from_secs(150),
        )
        .await;
        let _ = stop.send(());
        let records = load.await.unwrap();
        assert!(
            failed.contains("ProgressDeadlineExceeded") || failed.contains("timed out progressing"),
            "{failed}"
        );
        assert!(
            failed.contains("exit code 3") && failed.contains("LocalEntryNotFoundError"),
            "{failed}"
        );
        assert!(took >= 30.0, "not before the 30 s deadline: {took:.1} s");
        assert_all_served(&records);
        eprintln!("crash::without_fail_fast (10 requests/s through the Gateway):");
        let phases = vec![phase("bump to RollbackSucceeded", &records)];
        eprintln!("  bump → rolled back {took:.1} s; RolloutFailed: {failed}");
        record_result(json!({
            "scenario": "without_fail_fast_the_deadline_decides", "rps": 10, "phases": phases,
            "progress_deadline_s": 30, "bump_to_rolled_back_s": (took * 10.0).round() / 10.0, "event": failed,
        }));
        app.env.finish().await;
    });
}
