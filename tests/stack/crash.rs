//! A model that never warms, on the real stack: the service exits before
//! it listens, its pods crash-loop, the operator rolls back and says why,
//! and the old pods answer every request meanwhile.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use libtest_mimic::Trial;
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

/// When the first container of this namespace's service ended, in ms
/// since the epoch (its `finishedAt`, whole seconds, so never later than
/// the truth), watched by listing the pods until `stop`: the crashed pods
/// are gone once the rollback is done.
fn watch_first_crash(
    app: &App,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Option<f64>>,
) {
    let pods: Api<Pod> = Api::namespaced(app.env.client.clone(), &app.env.ns.name);
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let mut first: Option<f64> = None;
        loop {
            for pod in pods
                .list(&ListParams::default())
                .await
                .map(|l| l.items)
                .unwrap_or_default()
            {
                let statuses = pod
                    .status
                    .and_then(|s| s.container_statuses)
                    .unwrap_or_default();
                for status in statuses {
                    let ended = [
                        status.state.and_then(|s| s.terminated),
                        status.last_state.and_then(|s| s.terminated),
                    ];
                    for t in ended.into_iter().flatten() {
                        if let Some(at) = t.finished_at {
                            let at = at.0.as_millisecond() as f64;
                            first = Some(first.map_or(at, |f: f64| f.min(at)));
                        }
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(250)) => {}
                _ = &mut stopped => return first,
            }
        }
    });
    (stop, task)
}

/// Bumps to `spec` and waits for the rollback: the seconds from the bump
/// to it, the seconds from the first crash to it, and `RolloutFailed`.
async fn rolled_back_with(
    app: &App,
    spec: Value,
    what: &str,
    deadline: Duration,
) -> (f64, f64, String) {
    let (crashes_seen, crashes) = watch_first_crash(app);
    let bumped = now_ms();
    app.env.set_spec(NAME, spec).await;
    let status = rolled_back_within(app, what, deadline).await;
    assert_eq!(status.active_version.as_deref(), Some(V1));
    let failed = app
        .env
        .events(NAME)
        .await
        .into_iter()
        .find(|(reason, _, _)| reason == "RolloutFailed")
        .map(|(_, message, _)| message)
        .expect("a RolloutFailed event");
    let done = now_ms();
    let _ = crashes_seen.send(());
    let first_crash = crashes
        .await
        .unwrap()
        .expect("a container of the new template ended");
    (
        (done - bumped) / 1000.0,
        (done - first_crash) / 1000.0,
        failed,
    )
}

fn a_model_that_never_warms_fails_fast_and_the_event_says_why() {
    block_on(async {
        let app = App::deploy("stack-crash").await;
        let (stop, load) = app.load(Some(V1), 20.0, Duration::from_secs(180));
        let (took, from_crash, failed) = rolled_back_with(
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
        eprintln!(
            "  bump → rolled back {took:.1} s, first crash → rolled back {from_crash:.1} s; RolloutFailed: {failed}"
        );
        record_result(json!({
            "scenario": "a_model_that_never_warms_fails_fast", "rps": 20, "phases": phases,
            "bump_to_rolled_back_s": (took * 10.0).round() / 10.0,
            "first_crash_to_rolled_back_s": (from_crash * 10.0).round() / 10.0, "event": failed,
        }));
        app.env.finish().await;
    });
}

fn without_fail_fast_the_deadline_decides_and_the_event_still_says_why() {
    block_on(async {
        let app = App::deploy("stack-deadline").await;
        let (stop, load) = app.load(Some(V1), 10.0, Duration::from_secs(180));
        let (took, from_crash, failed) = rolled_back_with(
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
        eprintln!(
            "  bump → rolled back {took:.1} s, first crash → rolled back {from_crash:.1} s; RolloutFailed: {failed}"
        );
        record_result(json!({
            "scenario": "without_fail_fast_the_deadline_decides", "rps": 10, "phases": phases,
            "progress_deadline_s": 30, "bump_to_rolled_back_s": (took * 10.0).round() / 10.0,
            "first_crash_to_rolled_back_s": (from_crash * 10.0).round() / 10.0, "event": failed,
        }));
        app.env.finish().await;
    });
}
