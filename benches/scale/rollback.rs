//! Rollback latency: a version whose pods never get Ready (the fake
//! kubelet's unready list), a 5 s progress deadline, and the time from the
//! Deployment reporting `ProgressDeadlineExceeded` to its pod-template hash
//! being back at the last good one. The sample's resources fail at once.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use kube::Client;
use serde_json::json;

use crate::cluster;
use crate::log;
use crate::observe::Observer;
use crate::report::{Percentiles, Rollback};
use crate::workload::{self, Workload};

/// The progress deadline the sample gets, in seconds.
const DEADLINE: i64 = 5;

pub async fn measure(
    client: &Client,
    plan: &Workload,
    observer: &Observer,
    count: usize,
    guard: &dyn Fn() -> Result<(), String>,
) -> Result<Rollback, String> {
    // Half a step away from the reaction sample.
    let sample = plan.sample(count, 0.5);
    if sample.is_empty() {
        return Err("nothing to roll back".into());
    }
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let broken = format!("OpenMed/bench-broken-{nonce}");
    log(format!(
        "rollback: {} resources to {broken}, progress deadline {DEADLINE} s",
        sample.len()
    ));
    cluster::set_unready(client, &broken, true).await?;
    let result = run(
        client,
        &sample,
        plan.target_replicas,
        observer,
        &broken,
        guard,
    )
    .await;
    cluster::set_unready(client, &broken, false).await?;
    let result = result?;
    log(format!(
        "rollback: p50 {} ms, max {} ms",
        result.latency.p50_ms, result.latency.max_ms
    ));
    Ok(result)
}

async fn run(
    client: &Client,
    sample: &[workload::Item],
    target_replicas: i32,
    observer: &Observer,
    broken: &str,
    guard: &dyn Fn() -> Result<(), String>,
) -> Result<Rollback, String> {
    let keys: Vec<String> = sample.iter().map(|i| i.key()).collect();
    // A target without pods never misses a deadline: give it one pod.
    let mut short_deadline = json!({"rolloutStrategy": {"progressDeadlineSeconds": DEADLINE}});
    if target_replicas == 0 {
        short_deadline["replicas"] = json!(1);
    }
    for item in sample {
        workload::patch_spec(client, item, short_deadline.clone()).await?;
    }
    let good: HashMap<String, String> = observer
        .wait(
            "the rollback sample's Deployments to take the short deadline",
            Duration::from_secs(120),
            guard,
            |state| {
                keys.iter()
                    .map(|k| {
                        let d = state.deployments.get(k)?;
                        let m = state.models.get(k)?;
                        (d.progress_deadline == Some(DEADLINE) && m.ready && !d.stalled)
                            .then(|| Some((k.clone(), d.hash.clone()?)))
                            .flatten()
                    })
                    .collect()
            },
        )
        .await?;

    let mut patched: HashMap<String, Instant> = HashMap::new();
    for item in sample {
        patched.insert(item.key(), Instant::now());
        workload::patch_spec(client, item, json!({ "version": broken })).await?;
    }
    let timings: Vec<(Duration, Duration)> = observer
        .wait(
            "every Deployment of the rollback sample to exceed its deadline and get its last good hash back",
            Duration::from_secs(180),
            guard,
            |state| {
                keys.iter()
                    .map(|k| {
                        let d = state.deployments.get(k)?;
                        let stalled = d.stalled_at.filter(|s| *s > patched[k])?;
                        let restored = d.hash.as_deref() == Some(good[k].as_str())
                            && d.hash_since > stalled;
                        restored.then(|| {
                            (
                                stalled.saturating_duration_since(patched[k]),
                                d.hash_since.saturating_duration_since(stalled),
                            )
                        })
                    })
                    .collect()
            },
        )
        .await?;
    let (detected, restored): (Vec<Duration>, Vec<Duration>) = timings.into_iter().unzip();
    Ok(Rollback {
        resources: sample.len(),
        progress_deadline_s: DEADLINE,
        latency: Percentiles::of(restored),
        deadline_exceeded_after: Percentiles::of(detected),
    })
}
