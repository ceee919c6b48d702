//! Convergence: N OpenMedModels created at once for N existing, available
//! Deployments. How long until every Deployment carries its expected
//! pod-template hash (the operator's own work), and until every model is
//! Ready (which also needs the Deployment controller and the kubelet to
//! roll every Deployment).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kube::Client;

use crate::api_load::{self, AuditCursor};
use crate::cluster::ControlPlane;
use crate::observe::Observer;
use crate::operator::Process;
use crate::report::{Convergence, Percentiles};
use crate::workload::{self, INITIAL_VERSION, Workload};
use crate::{log, round};

#[allow(clippy::too_many_arguments)]
pub async fn measure(
    client: &Client,
    plan: &Workload,
    observer: &Observer,
    process: &Process,
    cluster: &ControlPlane,
    identity: &str,
    concurrency: usize,
    guard: &dyn Fn() -> Result<(), String>,
) -> Result<Convergence, String> {
    let expected: Vec<(String, String)> = plan
        .items
        .iter()
        .map(|i| (i.key(), workload::expected_hash(i, INITIAL_VERSION)))
        .collect();
    let cursor = AuditCursor::at_end(&cluster.audit_log());
    let cpu_before = cpu(cluster, process);

    let t0 = Instant::now();
    let sent = workload::create_models(client, plan, concurrency).await?;
    let created = t0.elapsed();
    log(format!(
        "{} OpenMedModels created in {:.2} s",
        plan.models,
        created.as_secs_f64()
    ));

    // Generous: at N = 1,000 the Deployment controller's own request rate
    // makes the rollouts take minutes on two cores.
    let timeout = Duration::from_secs(300 + plan.models as u64);
    let hashed = observer
        .wait(
            "every Deployment to carry its expected pod-template hash",
            timeout,
            guard,
            |state| {
                let mut latest = t0;
                for (key, hash) in &expected {
                    let d = state.deployments.get(key)?;
                    if d.hash.as_deref() != Some(hash.as_str()) {
                        return None;
                    }
                    latest = latest.max(d.hash_since);
                }
                let per_model: Vec<Duration> = expected
                    .iter()
                    .map(|(key, _)| {
                        state.deployments[key]
                            .hash_since
                            .saturating_duration_since(sent[key])
                    })
                    .collect();
                Some((latest, per_model))
            },
        )
        .await?;
    let cpu_hashed = cpu(cluster, process);
    log(format!(
        "every hash applied {:.2} s after the first create",
        (hashed.0 - t0).as_secs_f64()
    ));
    let ready = observer
        .wait("every OpenMedModel to be Ready", timeout, guard, |state| {
            let mut latest = t0;
            for (key, _) in &expected {
                let m = state.models.get(key)?;
                latest = latest.max(m.ready_since.filter(|_| m.ready)?);
            }
            let per_model: Vec<Duration> = expected
                .iter()
                .map(|(key, _)| {
                    let since = state.models[key].ready_since.expect("ready");
                    since.saturating_duration_since(sent[key])
                })
                .collect();
            Some((latest, per_model))
        })
        .await?;
    log(format!(
        "every model Ready {:.2} s after the first create",
        (ready.0 - t0).as_secs_f64()
    ));
    let cpu_ready = cpu(cluster, process);
    process.record_convergence(cpu_ready["operator"] - cpu_before["operator"]);

    // The operator's requests for the whole convergence, once its last
    // status writes have landed.
    observer
        .settle(Duration::from_secs(5), Duration::from_secs(60))
        .await;
    let requests = api_load::tally(&cursor.read(), identity);
    let per_model = |n: u64| round(n as f64 / plan.models.max(1) as f64);
    Ok(Convergence {
        models_created_s: round(created.as_secs_f64()),
        hashes_applied_s: round((hashed.0 - t0).as_secs_f64()),
        ready_s: round((ready.0 - t0).as_secs_f64()),
        hash_latency: Percentiles::of(hashed.1),
        ready_latency: Percentiles::of(ready.1),
        operator_writes_per_model: per_model(requests.writes()),
        operator_reads_per_model: per_model(requests.reads()),
        operator_watches_opened: requests.watches_opened,
        operator_requests: requests.by_verb_resource(None),
        cpu_until_hashes_s: delta(&cpu_before, &cpu_hashed),
        cpu_until_ready_s: delta(&cpu_before, &cpu_ready),
    })
}

/// CPU seconds of the operator, the control plane and the harness.
fn cpu(cluster: &ControlPlane, process: &Process) -> BTreeMap<String, f64> {
    let mut cpu = cluster.cpu();
    cpu.insert("operator".to_owned(), process.sample().cpu_s);
    cpu
}

fn delta(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    after
        .iter()
        .filter_map(|(k, v)| Some((k.clone(), round(v - before.get(k)?))))
        .collect()
}
