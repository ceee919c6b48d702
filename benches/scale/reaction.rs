//! Reaction latency: from a `spec.version` patch to the Deployment's
//! pod-template hash changing to the one for the new version, one change
//! at a time, rotating over a sample of resources spread over the
//! namespaces. Each change waits until its resource is Ready at its current
//! version, so no change lands in a rollout still running.

use std::time::Duration;

use kube::Client;

use crate::log;
use crate::observe::Observer;
use crate::report::{Percentiles, Reaction};
use crate::workload::{self, Workload};

pub async fn measure(
    client: &Client,
    plan: &Workload,
    observer: &Observer,
    changes: usize,
    sample: usize,
    guard: &dyn Fn() -> Result<(), String>,
) -> Result<Reaction, String> {
    let sample = plan.sample(sample, 0.0);
    if sample.is_empty() || changes == 0 {
        return Err("nothing to change".into());
    }
    log(format!(
        "reaction: {changes} version changes over {} resources",
        sample.len()
    ));
    let mut latencies = Vec::with_capacity(changes);
    let mut round_trips = Vec::with_capacity(changes);
    for k in 0..changes {
        let item = &sample[k % sample.len()];
        let key = item.key();
        observer
            .wait(
                &format!("{key} to be Ready before change {k}"),
                Duration::from_secs(120),
                guard,
                |state| state.models.get(&key).filter(|m| m.ready).map(|_| ()),
            )
            .await?;
        let version = format!("OpenMed/bench-r{k}");
        let expected = workload::expected_hash(item, &version);
        let sent = std::time::Instant::now();
        let round_trip =
            workload::patch_spec(client, item, serde_json::json!({ "version": version })).await?;
        let applied = observer
            .wait(
                &format!("{key}'s Deployment to carry the hash of {version}"),
                Duration::from_secs(60),
                guard,
                |state| {
                    state
                        .deployments
                        .get(&key)
                        .filter(|d| d.hash.as_deref() == Some(expected.as_str()))
                        .map(|d| d.hash_since)
                },
            )
            .await?;
        latencies.push(applied.saturating_duration_since(sent));
        round_trips.push(round_trip);
    }
    // Leave the sample Ready for what comes next.
    let keys: Vec<String> = sample.iter().map(|i| i.key()).collect();
    observer
        .wait(
            "the reaction sample to be Ready again",
            Duration::from_secs(120),
            guard,
            |state| {
                keys.iter()
                    .all(|k| state.models.get(k).is_some_and(|m| m.ready))
                    .then_some(())
            },
        )
        .await?;
    let result = Reaction {
        changes,
        resources: sample.len(),
        latency: Percentiles::of(latencies),
        patch_round_trip: Percentiles::of(round_trips),
    };
    log(format!(
        "reaction: p50 {} ms, p99 {} ms, max {} ms",
        result.latency.p50_ms, result.latency.p99_ms, result.latency.max_ms
    ));
    Ok(result)
}
