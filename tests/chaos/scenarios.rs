//! The scenarios: each sets up a fault, drives the operator through
//! rollouts and rollbacks while it is active, waits for convergence, and
//! returns what the invariant watcher saw.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use kube::api::{Api, DeleteParams, Patch, PatchParams};
use openmed_op::api::{OpenMedModel, OpenMedModelStatus, Phase};
use serde_json::json;

use crate::env::{deployment_yaml, model_yaml};
use crate::proxy::{Fault, Logged, Match, Rule};
use crate::stage::Stage;
use crate::support::*;
use crate::{Mode, Outcome, Scenario};

/// Each scenario under its function's name.
macro_rules! named {
    ($($scenario:ident),* $(,)?) => {
        vec![$((stringify!($scenario), $scenario as Scenario)),*]
    };
}

pub fn all() -> Vec<(&'static str, Scenario)> {
    named![
        crash_sweep_rollout,
        crash_sweep_automatic_rollback,
        crash_sweep_manual_rollback,
        crash_sweep_config_map_rename,
        crash_sweep_deletion,
        random_kills,
        persistent_status_conflicts_back_off,
        random_server_errors,
        errors_after_the_write_committed,
        cut_watches_and_expired_resource_versions,
        a_partition_from_the_api_server_heals,
        operator_clock_ahead_and_behind,
        two_instances_with_leader_election,
        two_instances_without_leader_election,
        a_leader_that_cannot_renew_stops_writing,
        a_slow_lease_read_does_not_shorten_the_followers_wait,
        a_foreign_namespace_is_never_written,
        rivals_created_and_deleted_within_a_second,
        restart_kube_apiserver_mid_rollout,
        restart_etcd_mid_rollback,
        restart_kube_controller_manager_mid_rollback,
    ]
}

/// A deadline longer than any restart of a control-plane component takes,
/// as bounded by [`restart_mid_change`]'s convergence limit.
const OUTLASTS_A_RESTART: &str = "  rolloutStrategy:\n    progressDeadlineSeconds: 300\n";

/// The model every scenario drives.
const MODEL: &str = "svc";

/// A deadline short enough that an automatic rollback is quick.
const DEADLINE: &str = "  rolloutStrategy:\n    progressDeadlineSeconds: 4\n";

/// Creates the target and the model at `version`, and waits until Ready.
async fn set_up(stage: &mut Stage, version: &str) {
    set_up_with(stage, version, DEADLINE).await;
}

/// [`set_up`] with another `rolloutStrategy` block.
async fn set_up_with(stage: &mut Stage, version: &str, strategy: &str) {
    stage
        .env
        .apply(&deployment_yaml(MODEL, "openmed-service", "boot"))
        .await;
    stage.env.apply(&model_yaml(MODEL, version, strategy)).await;
    let version = version.to_owned();
    stage
        .converge(MODEL, "the first version", |s| ready_with(s, &version))
        .await;
    quiet(stage).await;
}

fn ready_with(s: &OpenMedModelStatus, version: &str) -> bool {
    s.phase == Some(Phase::Ready) && s.active_version.as_deref() == Some(version)
}

/// Waits until the operator has written nothing in the namespace (but its
/// Lease) for a second: the writes that follow a Ready status (the pointer, the events)
/// have landed, so the next crash point counts from the next change.
async fn quiet(stage: &mut Stage) {
    let namespace = stage.namespace();
    let started = Instant::now();
    loop {
        // A crash armed for a late write may have fired after the change
        // converged: the operator is started again before anything is
        // judged.
        stage.revive();
        let last = stage
            .proxy
            .log()
            .into_iter()
            .filter(|l| {
                l.call.is_write()
                    && l.call.resource != "leases"
                    && l.call.namespace.as_deref() == Some(namespace.as_str())
            })
            .map(|l| l.at)
            .max();
        if last.is_none_or(|at| at.elapsed() > Duration::from_secs(1)) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the operator did not go quiet within 60 s ({namespace})"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One change the scenarios make, and what convergence means for it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Change {
    /// A new version that gets ready.
    Rollout,
    /// A new version that never gets ready: rolled back automatically.
    AutomaticRollback,
    /// Back to the previous retained version by annotation (after a fresh
    /// rollout, so that each rollback is in a generation of its own).
    ManualRollback,
}

/// The points a crash sweep visits on one side (before or after the
/// write): every index until one is not reached (full), else two seeded
/// ones among the first eight.
fn sweep_points(stage: &mut Stage, mode: Mode) -> Vec<u32> {
    if mode.full {
        return (0..64).collect();
    }
    let mut points: BTreeSet<u32> = BTreeSet::new();
    while points.len() < 2 {
        points.insert(stage.rng.u32(0..8));
    }
    points.into_iter().collect()
}

/// Installs the crash at write `k` (before or after it takes effect);
/// returns the rule's index.
fn arm_crash(stage: &Stage, k: u32, after: bool) -> usize {
    let kill = stage.kill_hook();
    let fault = if after {
        Fault::HookAfter(kill)
    } else {
        Fault::HookBefore(kill)
    };
    stage
        .proxy
        .add(Rule::new(stage.writes(), fault).skip(k).times(1))
}

/// Records one crash point; returns whether the sweep on this side goes on.
fn crash_point(
    stage: &mut Stage,
    outcome: &mut Outcome,
    mode: Mode,
    (rule, k, after): (usize, u32, bool),
    took: Duration,
) -> bool {
    let fired = stage.proxy.applied()[rule] > 0;
    stage.proxy.clear();
    stage.revive();
    outcome.points += 1;
    outcome.converge.push(took);
    eprintln!(
        "  crash {} write {k}: {}, converged in {:.1} s",
        if after { "after" } else { "before" },
        if fired { "killed" } else { "not reached" },
        took.as_secs_f64()
    );
    !mode.full || fired
}

/// State the drivers share across changes.
struct Driver {
    n: u32,
    rollbacks: i64,
}

impl Driver {
    fn new() -> Self {
        Driver { n: 0, rollbacks: 0 }
    }

    fn version(&mut self, stage: &Stage, what: &str) -> String {
        self.n += 1;
        format!("OpenMed/{what}-{}-{}", self.n, stage.namespace())
    }

    /// Prepares `change` without faults (what must happen before it).
    async fn prepare(&mut self, stage: &mut Stage, change: Change) {
        if change == Change::ManualRollback {
            let version = self.version(stage, "good");
            patch_model(
                stage,
                json!({"metadata": {"annotations": {"openmed.ai/rollback-to": null}}, "spec": {"version": version}}),
            )
            .await;
            let v = version.clone();
            stage
                .converge(MODEL, "the rollout before a manual rollback", |s| {
                    ready_with(s, &v)
                })
                .await;
            quiet(stage).await;
        }
    }

    /// Makes `change` and waits until it has converged; returns how long
    /// that took.
    async fn change(&mut self, stage: &mut Stage, change: Change) -> Duration {
        match change {
            Change::Rollout => {
                let version = self.version(stage, "good");
                new_version(stage, &version).await;
                stage
                    .converge(MODEL, "the rollout", |s| ready_with(s, &version))
                    .await
                    .1
            }
            Change::AutomaticRollback => {
                let bad = self.version(stage, "bad");
                stage.never_ready(&bad).await;
                let before = stage.env.status(MODEL).await;
                let good = before.active_version.clone().unwrap_or_default();
                new_version(stage, &bad).await;
                self.rollbacks += 1;
                let rollbacks = self.rollbacks;
                stage
                    .converge(MODEL, "the automatic rollback", |s| {
                        s.phase == Some(Phase::RolledBack)
                            && s.active_version.as_deref() == Some(good.as_str())
                            && s.rollback_count == Some(rollbacks)
                    })
                    .await
                    .1
            }
            Change::ManualRollback => {
                let status = stage.env.status(MODEL).await;
                let target = status
                    .previous_successful_spec
                    .map(|s| s.version)
                    .expect("a previous version is retained");
                stage
                    .env
                    .annotate(MODEL, "openmed.ai/rollback-to", Some(&target))
                    .await;
                // rollbackCount counts every rollback performed, manual too.
                self.rollbacks += 1;
                let rollbacks = self.rollbacks;
                stage
                    .converge(MODEL, "the manual rollback", |s| {
                        s.rollback_count == Some(rollbacks)
                            && s.active_version.as_deref() == Some(target.as_str())
                            && s.conditions
                                .iter()
                                .any(|c| c.type_ == "Ready" && c.reason == "ManualRollback")
                    })
                    .await
                    .1
            }
        }
    }
}

/// A new `spec.version`, and no rollback annotation left from an earlier
/// manual rollback (it would pin the rolled-back version).
async fn new_version(stage: &Stage, version: &str) {
    patch_model(
        stage,
        json!({"metadata": {"annotations": {"openmed.ai/rollback-to": null}}, "spec": {"version": version}}),
    )
    .await;
}

async fn patch_model(stage: &Stage, patch: serde_json::Value) {
    stage
        .env
        .models()
        .patch(MODEL, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
}

/// The crash-point sweep: SIGKILL the operator just before, or just after,
/// its k-th write of a change, for every k (full) or a seeded sample, then
/// restart it and check that the change converges with every promise kept.
fn crash_sweep(prefix: &str, change: Change, mode: Mode, seed: u64) -> Outcome {
    block_on(async {
        let mut stage = Stage::new(prefix, seed, &[]).await;
        let mut driver = Driver::new();
        let first = driver.version(&stage, "good");
        set_up(&mut stage, &first).await;
        if change == Change::ManualRollback {
            // Two retained versions to move between.
            driver.change(&mut stage, Change::Rollout).await;
            quiet(&mut stage).await;
        }
        let mut outcome = Outcome::default();
        for after in [false, true] {
            for k in sweep_points(&mut stage, mode) {
                driver.prepare(&mut stage, change).await;
                let rule = arm_crash(&stage, k, after);
                let took = driver.change(&mut stage, change).await;
                let more = crash_point(&mut stage, &mut outcome, mode, (rule, k, after), took);
                quiet(&mut stage).await;
                stage.invariants.settled(MODEL, driver.rollbacks).await;
                if !more {
                    break;
                }
            }
        }
        outcome.violations = stage.finish().await;
        outcome
    })
}

fn crash_sweep_rollout(mode: Mode, seed: u64) -> Outcome {
    crash_sweep("crash-rollout", Change::Rollout, mode, seed)
}

fn crash_sweep_automatic_rollback(mode: Mode, seed: u64) -> Outcome {
    crash_sweep("crash-autorb", Change::AutomaticRollback, mode, seed)
}

fn crash_sweep_manual_rollback(mode: Mode, seed: u64) -> Outcome {
    crash_sweep("crash-manualrb", Change::ManualRollback, mode, seed)
}

/// The sweep over a rename of `spec.manifestConfigMapName`: no pod may
/// ever lose its ConfigMap.
fn crash_sweep_config_map_rename(mode: Mode, seed: u64) -> Outcome {
    block_on(async {
        let mut stage = Stage::new("crash-rename", seed, &[]).await;
        let mut driver = Driver::new();
        let first = driver.version(&stage, "good");
        set_up(&mut stage, &first).await;
        let mut outcome = Outcome::default();
        let mut n = 0;
        for after in [false, true] {
            for k in sweep_points(&mut stage, mode) {
                n += 1;
                let pointer = format!("models-{n}");
                let rule = arm_crash(&stage, k, after);
                stage
                    .env
                    .set_spec(MODEL, json!({"manifestConfigMapName": pointer}))
                    .await;
                let namespace = stage.namespace();
                let took = stage
                    .until("the rename", |client| {
                        let (namespace, pointer) = (namespace.clone(), pointer.clone());
                        async move { template_reads(&client, &namespace, &pointer).await }
                    })
                    .await;
                let more = crash_point(&mut stage, &mut outcome, mode, (rule, k, after), took);
                quiet(&mut stage).await;
                stage.invariants.settled(MODEL, 0).await;
                if !more {
                    break;
                }
            }
        }
        outcome.violations = stage.finish().await;
        outcome
    })
}

/// The sweep over a deletion: afterwards no Deployment reads a missing
/// ConfigMap or names a missing owner, and nothing managed is left.
fn crash_sweep_deletion(mode: Mode, seed: u64) -> Outcome {
    block_on(async {
        let mut stage = Stage::new("crash-delete", seed, &[]).await;
        let mut driver = Driver::new();
        stage
            .env
            .apply(&deployment_yaml(MODEL, "openmed-service", "boot"))
            .await;
        let mut outcome = Outcome::default();
        for after in [false, true] {
            for k in sweep_points(&mut stage, mode) {
                let version = driver.version(&stage, "good");
                stage
                    .env
                    .apply(&model_yaml(MODEL, &version, DEADLINE))
                    .await;
                stage
                    .converge(MODEL, "the model before its deletion", |s| {
                        ready_with(s, &version)
                    })
                    .await;
                quiet(&mut stage).await;
                let rule = arm_crash(&stage, k, after);
                stage
                    .env
                    .models()
                    .delete(MODEL, &DeleteParams::default())
                    .await
                    .unwrap();
                let namespace = stage.namespace();
                let took = stage
                    .until("the deletion", |client| {
                        let namespace = namespace.clone();
                        async move { deleted(&client, &namespace).await }
                    })
                    .await;
                let more = crash_point(&mut stage, &mut outcome, mode, (rule, k, after), took);
                quiet(&mut stage).await;
                stage.invariants.released().await;
                if !more {
                    break;
                }
            }
        }
        outcome.violations = stage.finish().await;
        outcome
    })
}

/// Whether the target's template reads a snapshot of `pointer`.
async fn template_reads(client: &kube::Client, namespace: &str, pointer: &str) -> bool {
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(client.clone(), namespace);
    let Ok(deployment) = deployments.get(MODEL).await else {
        return false;
    };
    let value = serde_json::to_value(&deployment).unwrap();
    value["spec"]["template"]["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|c| c["env"].as_array().cloned().unwrap_or_default())
        .filter_map(|e| {
            e["valueFrom"]["configMapKeyRef"]["name"]
                .as_str()
                .map(str::to_owned)
        })
        .any(|name| name.starts_with(&format!("{pointer}-")))
}

/// The model is gone and so is every ConfigMap the operator managed.
async fn deleted(client: &kube::Client, namespace: &str) -> bool {
    let models: Api<OpenMedModel> = Api::namespaced(client.clone(), namespace);
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), namespace);
    let managed =
        kube::api::ListParams::default().labels("app.kubernetes.io/managed-by=openmed-operator");
    matches!(models.get_opt(MODEL).await, Ok(None))
        && cms.list(&managed).await.is_ok_and(|l| l.items.is_empty())
}

/// A stage with the model Ready at its first version, and its driver.
async fn ready(prefix: &str, seed: u64) -> (Stage, Driver) {
    let mut stage = Stage::new(prefix, seed, &[]).await;
    let mut driver = Driver::new();
    let first = driver.version(&stage, "good");
    set_up(&mut stage, &first).await;
    (stage, driver)
}

/// After a scenario's changes under its faults: the faults go, the operator
/// settles, the settled checks run, and the outcome holds what the watcher
/// saw and how many faults were injected.
async fn after_faults(mut stage: Stage, driver: &Driver, converge: Vec<Duration>) -> Outcome {
    let points = stage.proxy.applied().iter().sum();
    assert!(points > 0, "no fault was injected: the run tested nothing");
    stage.proxy.clear();
    quiet(&mut stage).await;
    stage.invariants.settled(MODEL, driver.rollbacks).await;
    Outcome {
        converge,
        points,
        violations: stage.finish().await,
        ..Outcome::default()
    }
}

/// Drives a seeded mix of rollouts and rollbacks under the faults already
/// installed; returns each change's time to converge.
async fn drive(stage: &mut Stage, driver: &mut Driver, changes: usize) -> Vec<Duration> {
    let mut took = Vec::new();
    for _ in 0..changes {
        let change = match stage.rng.u32(0..4) {
            0 => Change::AutomaticRollback,
            1 => Change::ManualRollback,
            _ => Change::Rollout,
        };
        driver.prepare(stage, change).await;
        took.push(driver.change(stage, change).await);
    }
    took
}

fn changes(mode: Mode) -> usize {
    if mode.full { 8 } else { 3 }
}

/// A persistent 409 on every status write: the operator backs off, its
/// retries spread out (1 s doubling), and it converges once it stops.
fn persistent_status_conflicts_back_off(mode: Mode, seed: u64) -> Outcome {
    block_on(async {
        let (mut stage, mut driver) = ready("conflicts", seed).await;
        let status_writes = Match {
            resource: Some("openmedmodels/status".into()),
            namespace: Some(stage.namespace()),
            writes: true,
            ..Match::default()
        };
        stage
            .proxy
            .add(Rule::new(status_writes.clone(), Fault::Fail(409)));
        let version = driver.version(&stage, "good");
        stage.env.set_spec(MODEL, json!({"version": version})).await;
        // Long enough for the spacing to reach 8 s (32 s in the full run).
        // The snapshot created beside the first refused write wakes the
        // resource once more right away, which counts with the first
        // attempt, so the last of 7 comes about 127 s after the change.
        let attempts = if mode.full { 7 } else { 5 };
        let log = wait_for(
            "the retries to spread out",
            Duration::from_secs(if mode.full { 200 } else { 120 }),
            || async {
                // One reconcile writes the status up to four times (its
                // decision, the decision again after each of two refused
                // writes, with live reads between, then the error report in
                // the Reconciling condition), which on a loaded machine
                // spans more than a second from first to last. Backoff
                // waits at least 1 s after an attempt's last write, so a
                // write less than 0.9 s after the one before belongs to the
                // same attempt.
                let mut hits: Vec<Instant> = Vec::new();
                let mut previous: Option<Instant> = None;
                for at in stage
                    .proxy
                    .log()
                    .into_iter()
                    .filter(|l| status_writes.matches(&l.call) && l.fault.is_some())
                    .map(|l| l.at)
                {
                    if previous.is_none_or(|p| at - p >= Duration::from_millis(900)) {
                        hits.push(at);
                    }
                    previous = Some(at);
                }
                if hits.len() >= attempts {
                    Some(hits)
                } else {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    None
                }
            },
        )
        .await;
        let gaps: Vec<f64> = log
            .windows(2)
            .map(|w| (w[1] - w[0]).as_secs_f64())
            .collect();
        let mut outcome = Outcome::default();
        eprintln!("  spacing of the refused status writes: {gaps:.1?} s");
        // Backoff doubles from 1 s: each gap at least as long as the one
        // before (with a little slack for scheduling), and the last one
        // has grown to at least 8 s.
        let grows = gaps.windows(2).all(|w| w[1] >= w[0] * 0.9);
        if !grows || *gaps.last().unwrap() < 7.5 {
            outcome
                .violations
                .push(format!("the retries did not spread out: {gaps:.1?} s"));
        }
        stage.proxy.clear();
        let (_, took) = stage
            .converge(MODEL, "the rollout after the conflicts", |s| {
                ready_with(s, &version)
            })
            .await;
        outcome.converge.push(took);
        quiet(&mut stage).await;
        stage.invariants.settled(MODEL, 0).await;
        outcome.points = attempts as u32;
        outcome.violations.extend(stage.finish().await);
        outcome
    })
}

/// 20 % of the operator's requests in the namespace (reads and writes, not
/// watches) answered 500, 503 or 504, over a seeded series of changes.
fn random_server_errors(mode: Mode, seed: u64) -> Outcome {
    block_on(async {
        let mut stage = Stage::new("errors5xx", seed, &[]).await;
        // One reconcile sends several requests; with 20 % of them failing
        // most reconciles fail, and the per-object backoff (1 s doubling
        // to 1 min) sets the pace: convergence is slow by design, not
        // stuck.
        stage.converge_within = Duration::from_secs(420);
        let mut driver = Driver::new();
        let first = driver.version(&stage, "good");
        set_up(&mut stage, &first).await;
        // Slow answers too: 10 % wait up to two seconds.
        let delay = Duration::from_millis(stage.rng.u64(100..2000));
        stage.proxy.add(
            Rule::new(
                Match {
                    namespace: Some(stage.namespace()),
                    ..Match::default()
                },
                Fault::Delay(delay),
            )
            .probability(0.1),
        );
        for status in [500, 503, 504] {
            stage.proxy.add(
                Rule::new(
                    Match {
                        namespace: Some(stage.namespace()),
                        verbs: Some(vec!["get", "list", "create", "update", "patch", "delete"]),
                        ..Match::default()
                    },
                    Fault::Fail(status),
                )
                .probability(0.07),
            );
        }
        let converge = drive(&mut stage, &mut driver, changes(mode)).await;
        after_faults(stage, &driver, converge).await
    })
}

/// Writes that take effect but are answered 504 (a timeout after commit).
fn errors_after_the_write_committed(mode: Mode, seed: u64) -> Outcome {
    block_on(async {
        let (mut stage, mut driver) = ready("after504", seed).await;
        stage
            .proxy
            .add(Rule::new(stage.writes(), Fault::FailAfter(504)).probability(0.3));
        let converge = drive(&mut stage, &mut driver, changes(mode)).await;
        after_faults(stage, &driver, converge).await
    })
}

/// Watches cut after 0.5 to 3 s, and re-watches answered 410 Gone.
fn cut_watches_and_expired_resource_versions(mode: Mode, seed: u64) -> Outcome {
    block_on(async {
        let (mut stage, mut driver) = ready("watches", seed).await;
        let watches = Match {
            verbs: Some(vec!["watch"]),
            ..Match::default()
        };
        stage
            .proxy
            .add(Rule::new(watches.clone(), Fault::Gone).probability(0.3));
        let cut = Duration::from_millis(500 + stage.rng.u64(0..2500));
        stage.proxy.add(Rule::new(watches, Fault::CutWatch(cut)));
        // And every watch at once, now and then (a load balancer's reset).
        // The first reset is immediate: the watches opened before the rules
        // reconnect through them, or a quick run would never meet a fault.
        let resets = {
            let proxy = stage.proxy.resetter();
            let mut rng = fastrand::Rng::with_seed(seed ^ 0x7a7c);
            tokio::spawn(async move {
                loop {
                    proxy.cut_watches();
                    tokio::time::sleep(Duration::from_millis(rng.u64(1000..5000))).await;
                }
            })
        };
        let converge = drive(&mut stage, &mut driver, changes(mode)).await;
        resets.abort();
        after_faults(stage, &driver, converge).await
    })
}

/// Grants the operator's identity the Lease in the scenario's namespace.
async fn grant_lease(stage: &Stage) {
    stage
        .env
        .apply(
            "apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: chaos-lease}
rules:
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [get, create, update]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: chaos-lease}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: chaos-lease}
subjects:
- {kind: ServiceAccount, name: openmed-operator, namespace: openmed-system}
",
        )
        .await;
}

/// Leader election in the scenario's own namespace (`{ns}` is replaced by
/// it), with short timings so that a take-over is quick.
const ELECT: &[&str] = &[
    "--leader-elect",
    "--leader-elect-resource-namespace={ns}",
    "--leader-elect-lease-duration=4s",
    "--leader-elect-renew-deadline=3s",
    "--leader-elect-retry-period=1s",
];

/// Two instances through the proxy, driven through changes; the stage's
/// own instance is SIGKILLed before every other change (and restarted by
/// the convergence wait). Returns each change's time to converge and the
/// writers (User-Agents) in the order their writes arrived, one entry per
/// run of writes.
async fn two_instances(
    stage: &mut Stage,
    mode: Mode,
    extra: &[&str],
) -> (Vec<Duration>, Vec<String>) {
    let mut driver = Driver::new();
    let first = driver.version(stage, "good");
    set_up(stage, &first).await;
    let namespace = stage.namespace();
    let args: Vec<String> = extra
        .iter()
        .map(|a| a.replace("{ns}", &namespace))
        .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut second = Operator::start_instance_with(&stage.kubeconfig, &namespace, "second", &args);
    let mut took = Vec::new();
    for i in 0..changes(mode) {
        if i % 2 == 1 {
            stage.env.operator.kill();
        }
        let change = match stage.rng.u32(0..3) {
            0 => Change::AutomaticRollback,
            1 => Change::ManualRollback,
            _ => Change::Rollout,
        };
        driver.prepare(stage, change).await;
        took.push(driver.change(stage, change).await);
    }
    quiet(stage).await;
    stage.invariants.settled(MODEL, driver.rollbacks).await;
    second.kill();
    (took, writer_terms(&stage.proxy.log(), &namespace))
}

/// The writers (User-Agents) of the operator's writes in `namespace`, its
/// Lease aside, in the order the writes arrived: one entry per run of
/// writes by one process.
fn writer_terms(log: &[Logged], namespace: &str) -> Vec<String> {
    let mut terms: Vec<String> = Vec::new();
    for logged in log {
        if logged.call.is_write()
            && logged.call.resource != "leases"
            && logged.call.namespace.as_deref() == Some(namespace)
            && terms.last() != Some(&logged.call.user_agent)
        {
            terms.push(logged.call.user_agent.clone());
        }
    }
    terms
}

/// Writes of two leader terms interleaved: a process wrote again after
/// another had begun (what the fence rules out). One violation naming the
/// writers that did, and the order of the terms.
fn interleaved(terms: &[String]) -> Option<String> {
    let mut seen = BTreeSet::new();
    let again: BTreeSet<&String> = terms.iter().filter(|w| !seen.insert(*w)).collect();
    (!again.is_empty()).then(|| {
        format!(
            "{again:?} wrote again after another instance had begun; terms in order: {terms:#?}"
        )
    })
}

/// With leader election: two instances, the stage's one killed now and
/// then. Every promise holds, and the instances' writes never interleave
/// (each process writes in one contiguous term: no write after a successor
/// has begun, which is what the fence ensures).
fn two_instances_with_leader_election(mode: Mode, seed: u64) -> Outcome {
    block_on(async {
        let mut stage = Stage::new("twole", seed, ELECT).await;
        grant_lease(&stage).await;
        let (took, terms) = two_instances(&mut stage, mode, ELECT).await;
        let mut outcome = Outcome {
            converge: took,
            points: terms.len() as u32,
            ..Outcome::default()
        };
        eprintln!("  terms of writers: {}", terms.len());
        outcome.violations.extend(interleaved(&terms));
        outcome.violations.extend(stage.finish().await);
        outcome
    })
}

/// Without leader election: two instances at once. The suite shows what
/// breaks (both decide and write, so events are recorded twice and each
/// undoes the other's work); it does not fail on it.
fn two_instances_without_leader_election(mode: Mode, seed: u64) -> Outcome {
    block_on(async {
        let mut stage = Stage::new("twonole", seed, &[]).await;
        stage
            .invariants
            .expect
            .tolerate
            .store(true, Ordering::SeqCst);
        let (took, _) = two_instances(&mut stage, mode, &[]).await;
        let mut outcome = Outcome {
            converge: took,
            ..Outcome::default()
        };
        outcome.expected_breakage = stage.finish().await;
        eprintln!(
            "  without leader election, broken promises: {}",
            outcome.expected_breakage.len()
        );
        outcome
    })
}

/// A Deployment in another namespace that claims to belong to the model:
/// the operator (watching both namespaces) never writes there.
fn a_foreign_namespace_is_never_written(mode: Mode, seed: u64) -> Outcome {
    block_on(async {
        let client = admin().await;
        let other = TestNamespace::create(&client, "foreign").await;
        let other_ns = other.name.clone();
        let mut stage = Stage::new("home", seed, &["-n", &other_ns]).await;
        let home = stage.namespace();
        let mut deployment: serde_json::Value =
            serde_yaml::from_str(&deployment_yaml(MODEL, "openmed-service", "boot")).unwrap();
        deployment["metadata"]["annotations"] =
            json!({"openmed.ai/model-resource": format!("{home}/{MODEL}")});
        deployment["metadata"]["labels"]["openmed.ai/operated-by"] = json!("openmed-operator");
        apply_yaml(
            &client,
            Some(&other_ns),
            &serde_yaml::to_string(&deployment).unwrap(),
            "e2e-user",
        )
        .await;
        let mut driver = Driver::new();
        let first = driver.version(&stage, "good");
        set_up(&mut stage, &first).await;
        let mut outcome = Outcome {
            converge: drive(&mut stage, &mut driver, changes(mode)).await,
            ..Outcome::default()
        };
        quiet(&mut stage).await;
        let foreign: Vec<String> = stage
            .proxy
            .log()
            .into_iter()
            .filter(|l| l.call.is_write() && l.call.namespace.as_deref() == Some(other_ns.as_str()))
            .map(|l| format!("{} {} {:?}", l.call.verb, l.call.resource, l.call.name))
            .collect();
        if !foreign.is_empty() {
            outcome
                .violations
                .push(format!("writes in the foreign namespace: {foreign:?}"));
        }
        stage.invariants.settled(MODEL, driver.rollbacks).await;
        outcome.points = 1;
        outcome.violations.extend(stage.finish().await);
        other.delete().await;
        outcome
    })
}

/// Rival models for the same Deployment, created and deleted within a
/// second of each other, while the owner rolls out.
fn rivals_created_and_deleted_within_a_second(mode: Mode, seed: u64) -> Outcome {
    block_on(async {
        let (mut stage, mut driver) = ready("rivals", seed).await;
        let models: Api<OpenMedModel> = stage.env.models();
        let first = models.get(MODEL).await.unwrap().spec.version;
        let mut outcome = Outcome::default();
        let rounds = if mode.full { 10 } else { 3 };
        for round in 0..rounds {
            let rival = format!("rival-{round}");
            let mut yaml: serde_json::Value =
                serde_yaml::from_str(&model_yaml(&rival, &first, "")).unwrap();
            yaml["spec"]["targetRef"] = json!({"name": MODEL});
            stage
                .env
                .apply(&serde_yaml::to_string(&yaml).unwrap())
                .await;
            let pause = Duration::from_millis(stage.rng.u64(0..1000));
            if stage.rng.bool() {
                // The owner changes while the rival exists.
                let version = driver.version(&stage, "good");
                stage.env.set_spec(MODEL, json!({"version": version})).await;
            }
            tokio::time::sleep(pause).await; // the fault: how long the rival lives
            models
                .delete(&rival, &DeleteParams::default())
                .await
                .unwrap();
            wait_for("the rival to be gone", Duration::from_secs(60), || async {
                models
                    .get_opt(&rival)
                    .await
                    .unwrap()
                    .is_none()
                    .then_some(())
            })
            .await;
            let active = stage.env.models().get(MODEL).await.unwrap().spec.version;
            let (_, took) = stage
                .converge(MODEL, "the owner after a rival", |s| ready_with(s, &active))
                .await;
            outcome.converge.push(took);
            outcome.points += 1;
        }
        quiet(&mut stage).await;
        stage.invariants.settled(MODEL, 0).await;
        outcome.violations = stage.finish().await;
        outcome
    })
}

/// The fence: the leader's Lease renewals (and reads) are blackholed. It
/// must stop writing before its renew deadline has passed since its last
/// renewal, exit with 1, and the other instance take over; no write of the
/// deposed leader may land after the new leader's first.
fn a_leader_that_cannot_renew_stops_writing(mode: Mode, seed: u64) -> Outcome {
    block_on(async {
        let mut stage = Stage::new("fence", seed, ELECT).await;
        grant_lease(&stage).await;
        let mut driver = Driver::new();
        let first = driver.version(&stage, "good");
        set_up(&mut stage, &first).await;
        let namespace = stage.namespace();
        let args: Vec<String> = ELECT
            .iter()
            .map(|a| a.replace("{ns}", &namespace))
            .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut second =
            Operator::start_instance_with(&stage.kubeconfig, &namespace, "second", &args);
        wait_for("the follower's /readyz", Duration::from_secs(60), || {
            http_get(&second.addr, "/readyz")
        })
        .await;
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
            Api::namespaced(stage.env.client.clone(), &namespace);
        let holder = leases
            .get("openmed-operator")
            .await
            .unwrap()
            .spec
            .unwrap()
            .holder_identity
            .unwrap();
        // Cut the leader off from its Lease, then give it work to do.
        stage.proxy.add(Rule::new(
            Match {
                resource: Some("leases".into()),
                user_agent: Some(holder.clone()),
                ..Match::default()
            },
            Fault::Blackhole,
        ));
        let cut_at = Instant::now();
        let mut outcome = Outcome::default();
        let min_rounds = if mode.full { 4 } else { 2 };
        // Changes, one after the other, until the deposed leader has exited
        // and a change has completed after that (under its successor).
        let mut exited: Option<i32> = None;
        let mut rounds = 0;
        let begun = Instant::now();
        loop {
            rounds += 1;
            let version = driver.version(&stage, "good");
            new_version(&stage, &version).await;
            let started = Instant::now();
            let exited_before = exited.is_some();
            loop {
                if exited.is_none() {
                    exited = stage.env.operator.exit_code();
                }
                if ready_with(&stage.env.status(MODEL).await, &version) {
                    break;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(60),
                    "the rollout to {version} under either leader"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            if exited_before && rounds >= min_rounds {
                break;
            }
            assert!(
                begun.elapsed() < Duration::from_secs(90),
                "the deposed leader never exited"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let started = Instant::now();
        while exited.is_none() && started.elapsed() < Duration::from_secs(60) {
            exited = stage.env.operator.exit_code();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if exited != Some(1) {
            outcome
                .violations
                .push(format!("the deposed leader's exit: {exited:?}, not 1"));
        }
        quiet(&mut stage).await;
        // The deposed leader's last renewal, its last other write, and the
        // successor's first write.
        let log = stage.proxy.log();
        let renew_deadline = Duration::from_secs(3);
        let last_renewal = log
            .iter()
            .filter(|l| {
                l.call.user_agent.contains(&holder)
                    && l.call.resource == "leases"
                    && l.call.verb == "update"
                    && l.fault.is_none()
            })
            .map(|l| l.at)
            .max()
            .unwrap_or(cut_at);
        let (namespace, holder) = (namespace.as_str(), holder.as_str());
        let writes = |of_holder: bool| {
            log.iter()
                .filter(move |l| {
                    l.call.is_write()
                        && l.call.resource != "leases"
                        && l.call.namespace.as_deref() == Some(namespace)
                        && l.call.user_agent.contains(holder) == of_holder
                        && l.at > cut_at
                })
                .map(|l| l.at)
        };
        let last_old = writes(true).max();
        let first_new = writes(false).min();
        if let Some(last) = last_old {
            if last > last_renewal + renew_deadline {
                outcome.violations.push(format!(
                    "the deposed leader wrote {:.2} s after its last renewal (renew deadline {renew_deadline:?})",
                    (last - last_renewal).as_secs_f64()
                ));
            }
            if let Some(first) = first_new
                && last > first
            {
                outcome
                    .violations
                    .push("the deposed leader wrote after its successor had begun".into());
            }
        }
        match first_new {
            Some(first) => {
                eprintln!(
                    "  last renewal → successor's first write: {:.2} s",
                    (first - last_renewal).as_secs_f64()
                );
                outcome.converge.push(first - last_renewal);
            }
            None => outcome
                .violations
                .push("the other instance never wrote".into()),
        }
        stage.proxy.clear();
        second.kill();
        outcome.points = rounds;
        outcome.violations.extend(stage.finish().await);
        outcome
    })
}

/// Leader election with room for one read slower than the margin (lease
/// duration − renew deadline, 1 s) yet inside a follower's attempt (the
/// renew deadline, 5 s).
const ELECT_SLOW_READ: &[&str] = &[
    "--leader-elect",
    "--leader-elect-resource-namespace={ns}",
    "--leader-elect-lease-duration=6s",
    "--leader-elect-renew-deadline=5s",
    "--leader-elect-retry-period=1s",
];

/// How long the follower's slow Lease read waits before it reaches the API
/// server: longer than [`ELECT_SLOW_READ`]'s margin.
const SLOW_READ: Duration = Duration::from_secs(4);

/// The identity in an operator's User-Agent (`openmed-operator/V (ID)`).
fn identity_in(user_agent: &str) -> Option<&str> {
    let (_, rest) = user_agent.split_once('(')?;
    rest.strip_suffix(')')
}

/// Waits until the proxy's log shows what `find` looks for.
async fn proxy_log_shows<T>(stage: &Stage, what: &str, find: impl Fn(&[Logged]) -> Option<T>) -> T {
    wait_for(what, Duration::from_secs(30), || {
        let found = find(&stage.proxy.log());
        async move { found }
    })
    .await
}

/// One Lease read of the follower is slow (its next ones are quick, as
/// latency varies: were every read as slow, the read before the take-over
/// would delay it as much, and hide the fault) and shows a renewal that
/// landed while it waited; then
/// the leader is cut off from its Lease while it has work. The follower
/// must count the lease from when it saw that renewal, so it takes the
/// Lease only a full lease duration after it, once the old leader's fence
/// has closed: the writes of the two terms never interleave.
fn a_slow_lease_read_does_not_shorten_the_followers_wait(_: Mode, seed: u64) -> Outcome {
    block_on(async {
        let mut stage = Stage::new("slowread", seed, ELECT_SLOW_READ).await;
        grant_lease(&stage).await;
        let mut driver = Driver::new();
        let first = driver.version(&stage, "good");
        set_up(&mut stage, &first).await;
        let namespace = stage.namespace();
        let args: Vec<String> = ELECT_SLOW_READ
            .iter()
            .map(|a| a.replace("{ns}", &namespace))
            .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut second =
            Operator::start_instance_with(&stage.kubeconfig, &namespace, "second", &args);
        wait_for("the follower's /readyz", Duration::from_secs(60), || {
            http_get(&second.addr, "/readyz")
        })
        .await;
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
            Api::namespaced(stage.env.client.clone(), &namespace);
        let holder_now = || async {
            leases
                .get("openmed-operator")
                .await
                .ok()
                .and_then(|l| l.spec?.holder_identity)
        };
        let leader = holder_now().await.expect("a leader");
        let lease_reads = |identity: &str| Match {
            verbs: Some(vec!["get"]),
            resource: Some("leases".into()),
            namespace: Some(namespace.clone()),
            user_agent: Some(identity.to_owned()),
            ..Match::default()
        };
        let follower = proxy_log_shows(&stage, "the follower's Lease reads", |log| {
            log.iter().find_map(|l| {
                let identity = identity_in(&l.call.user_agent)?;
                (l.call.resource == "leases" && identity != leader).then(|| identity.to_owned())
            })
        })
        .await;
        // The fault: the follower's next Lease read waits before it goes on.
        let slow = stage
            .proxy
            .add(Rule::new(lease_reads(&follower), Fault::Delay(SLOW_READ)).times(1));
        let renewals_of = |log: &[Logged], identity: &str| {
            log.iter()
                .filter(|l| {
                    l.call.resource == "leases"
                        && l.call.verb == "update"
                        && l.fault.is_none()
                        && l.call.user_agent.contains(identity)
                })
                .map(|l| l.at)
                .collect::<Vec<_>>()
        };
        let sent = proxy_log_shows(&stage, "the slow read", |log| {
            log.iter()
                .find(|l| l.fault.is_some() && l.call.user_agent.contains(&follower))
                .map(|l| l.at)
        })
        .await;
        // A renewal late in the read's wait (so the wait is counted from well
        // before it), then the leader is cut off from its Lease: that renewal
        // is its last, and the slow read shows it.
        proxy_log_shows(&stage, "a renewal during the slow read", |log| {
            renewals_of(log, &leader)
                .into_iter()
                .find(|&at| at > sent + SLOW_READ - Duration::from_millis(1500))
        })
        .await;
        stage.proxy.add(Rule::new(
            Match {
                resource: Some("leases".into()),
                user_agent: Some(leader.clone()),
                ..Match::default()
            },
            Fault::Blackhole,
        ));
        let last_renewal = renewals_of(&stage.proxy.log(), &leader)
            .into_iter()
            .max()
            .expect("the renewal just seen");
        assert!(
            last_renewal + Duration::from_millis(100) < sent + SLOW_READ,
            "the leader's last renewal came {:.2} s after the slow read was sent, too late for it to show",
            (last_renewal - sent).as_secs_f64()
        );
        // Work for both while leadership changes hands: a new version every
        // 0.2 to 0.6 s (seeded), until the follower has led for 2 s.
        let mut outcome = Outcome::default();
        let mut version = first;
        let mut took_over: Option<Instant> = None;
        let begun = Instant::now();
        while took_over.is_none_or(|at| at.elapsed() < Duration::from_secs(2)) {
            version = driver.version(&stage, "good");
            new_version(&stage, &version).await;
            tokio::time::sleep(Duration::from_millis(stage.rng.u64(200..600))).await;
            if took_over.is_none() && holder_now().await.is_some_and(|h| h == follower) {
                took_over = Some(Instant::now());
            }
            assert!(
                begun.elapsed() < Duration::from_secs(60),
                "the follower never took over"
            );
        }
        let (_, took) = stage
            .converge(MODEL, "the last version under the new leader", |s| {
                ready_with(s, &version)
            })
            .await;
        outcome.converge.push(took);
        quiet(&mut stage).await;
        stage.invariants.settled(MODEL, driver.rollbacks).await;
        second.kill();
        let log = stage.proxy.log();
        let lease_duration = Duration::from_secs(6);
        let taken = log
            .iter()
            .filter(|l| {
                l.call.resource == "leases"
                    && l.call.is_write()
                    && l.fault.is_none()
                    && l.call.user_agent.contains(&follower)
            })
            .map(|l| l.at)
            .min();
        match taken {
            Some(taken) => {
                eprintln!(
                    "  leader's last renewal → the follower's take-over: {:.2} s (lease duration {lease_duration:?})",
                    (taken - last_renewal).as_secs_f64()
                );
                if taken < last_renewal + lease_duration {
                    outcome.violations.push(format!(
                        "the follower took the Lease {:.2} s after the leader's last renewal, under the lease duration {lease_duration:?}: its slow read ({SLOW_READ:?}) shortened its wait",
                        (taken - last_renewal).as_secs_f64()
                    ));
                }
            }
            None => outcome
                .violations
                .push("the follower never took the Lease".into()),
        }
        let writes_of = |identity: &str| {
            log.iter()
                .filter(|l| {
                    l.call.is_write()
                        && l.call.resource != "leases"
                        && l.call.namespace.as_deref() == Some(namespace.as_str())
                        && l.call.user_agent.contains(identity)
                })
                .map(|l| l.at)
                .collect::<Vec<_>>()
        };
        let since_renewal = |at: Option<&Instant>| {
            at.map(|at| format!("{:.2} s", (*at - last_renewal).as_secs_f64()))
        };
        eprintln!(
            "  after the leader's last renewal: its last write {:?}, the successor's first {:?}",
            since_renewal(writes_of(&leader).iter().max()),
            since_renewal(writes_of(&follower).iter().min()),
        );
        let terms = writer_terms(&log, &namespace);
        eprintln!("  terms of writers: {}", terms.len());
        outcome.violations.extend(interleaved(&terms));
        outcome.points = stage.proxy.applied()[slow];
        stage.proxy.clear();
        outcome.violations.extend(stage.finish().await);
        outcome
    })
}

/// The operator SIGKILLed at seeded random moments (every 0.3 to 3 s)
/// while a mix of changes runs.
fn random_kills(mode: Mode, seed: u64) -> Outcome {
    block_on(async {
        let (mut stage, mut driver) = ready("randomkill", seed).await;
        let kill = stage.kill_hook();
        let mut rng = fastrand::Rng::with_seed(seed ^ 0x5eed);
        let killer = tokio::spawn(async move {
            let mut kills = 0u32;
            loop {
                tokio::time::sleep(Duration::from_millis(rng.u64(300..3000))).await;
                kill(&crate::proxy::Call::default());
                kills += 1;
                if kills > 1000 {
                    break;
                }
            }
        });
        let mut outcome = Outcome {
            converge: drive(&mut stage, &mut driver, changes(mode) * 2).await,
            ..Outcome::default()
        };
        killer.abort();
        stage.revive();
        quiet(&mut stage).await;
        stage.invariants.settled(MODEL, driver.rollbacks).await;
        outcome.points = stage.restarts;
        eprintln!("  restarts after random kills: {}", stage.restarts);
        outcome.violations = stage.finish().await;
        outcome
    })
}

/// No connection to the API server for a while (20 s; 2 min in the full
/// run), during a rollout that fails its deadline: after the partition
/// heals, the rollback starts within the deadline plus 30 s.
fn a_partition_from_the_api_server_heals(mode: Mode, seed: u64) -> Outcome {
    block_on(async {
        let (mut stage, mut driver) = ready("partition", seed).await;
        let bad = driver.version(&stage, "bad");
        stage.never_ready(&bad).await;
        stage.env.set_spec(MODEL, json!({"version": bad})).await;
        // Let the rollout begin, then cut the operator off.
        let bad_clone = bad.clone();
        stage
            .converge(MODEL, "the rollout to begin", |s| {
                s.desired_version.as_deref() == Some(bad_clone.as_str())
            })
            .await;
        stage.proxy.partition(true);
        let length = Duration::from_secs(if mode.full { 120 } else { 20 });
        tokio::time::sleep(length).await; // the fault: how long the partition lasts
        stage.proxy.partition(false);
        let healed = Instant::now();
        let (_, took) = stage
            .converge(MODEL, "the rollback after the partition", |s| {
                s.rollback_request
                    .as_deref()
                    .is_some_and(|r| r.starts_with("automatic:"))
            })
            .await;
        let mut outcome = Outcome::default();
        let bound = Duration::from_secs(4 + 30);
        eprintln!(
            "  partition of {length:?} healed; rollback started {:.1} s later",
            took.as_secs_f64()
        );
        if healed.elapsed() > bound && took > bound {
            outcome.violations.push(format!(
                "the rollback started {:.1} s after the partition healed (bound: deadline + 30 s = {bound:?})",
                took.as_secs_f64()
            ));
        }
        outcome.converge.push(took);
        driver.rollbacks += 1;
        let rollbacks = driver.rollbacks;
        stage
            .converge(MODEL, "the rollback to finish", |s| {
                s.phase == Some(Phase::RolledBack) && s.rollback_count == Some(rollbacks)
            })
            .await;
        quiet(&mut stage).await;
        stage.invariants.settled(MODEL, driver.rollbacks).await;
        outcome.points = 1;
        outcome.violations.extend(stage.finish().await);
        outcome
    })
}

/// The operator's wall clock 2 s ahead of, then behind, the API server's
/// (libfaketime; the monotonic clock is left alone), through rollouts and
/// automatic rollbacks: deadlines are judged on the server's clock, so no
/// false RollbackFailed and no rollback counted twice.
fn operator_clock_ahead_and_behind(mode: Mode, seed: u64) -> Outcome {
    let mut outcome = Outcome::default();
    for skew in ["+2s", "-2s"] {
        let run = block_on(async {
            let vars = [
                ("LD_PRELOAD", libfaketime()),
                ("FAKETIME", skew),
                ("DONT_FAKE_MONOTONIC", "1"),
            ];
            let mut stage = Stage::with_env("skew", seed, &[], &vars).await;
            let mut driver = Driver::new();
            let first = driver.version(&stage, "good");
            set_up(&mut stage, &first).await;
            let mut outcome = Outcome::default();
            for change in [
                Change::Rollout,
                Change::AutomaticRollback,
                Change::Rollout,
                Change::AutomaticRollback,
            ]
            .into_iter()
            .take(if mode.full { 4 } else { 2 })
            {
                driver.prepare(&mut stage, change).await;
                outcome
                    .converge
                    .push(driver.change(&mut stage, change).await);
            }
            quiet(&mut stage).await;
            stage.invariants.settled(MODEL, driver.rollbacks).await;
            outcome.points = outcome.converge.len() as u32;
            outcome.violations = stage
                .finish()
                .await
                .into_iter()
                .map(|v| format!("clock {skew}: {v}"))
                .collect();
            outcome
        });
        outcome.points += run.points;
        outcome.converge.extend(run.converge);
        outcome.violations.extend(run.violations);
    }
    outcome
}

/// Debian's libfaketime (the `faketime` package).
fn libfaketime() -> &'static str {
    const CANDIDATES: [&str; 2] = [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    ];
    CANDIDATES
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .expect("libfaketime (apt-get install faketime; .ci/run installs it)")
}

/// A control-plane component SIGKILLed during a change, down for two
/// seconds, then started again (tests/cluster/restart).
fn restart_mid_change(prefix: &str, component: &str, change: Change, seed: u64) -> Outcome {
    block_on(async {
        let mut stage = Stage::new(prefix, seed, &[]).await;
        // A rollout also needs kube-controller-manager and the kubelet to
        // recover from the restart (their informers back off too): on a
        // loaded machine that took over two minutes, whatever the operator
        // did, so the bound here is the control plane's, not the operator's.
        // Once (2026-12-02, in .ci/run) a kube-apiserver restart took over
        // 300 s; its replays took 8 s.
        stage.converge_within = Duration::from_secs(420);
        let mut driver = Driver::new();
        let first = driver.version(&stage, "good");
        // A rollout of a good version must outlast the restart: with the
        // 4 s deadline, a control plane that took longer to come back made
        // the Deployment controller itself report the good version (and
        // then its restore) as timed out, and the operator rightly acted on
        // that. A rollback still needs the short deadline to fail quickly.
        if change == Change::Rollout {
            set_up_with(&mut stage, &first, OUTLASTS_A_RESTART).await;
        } else {
            set_up(&mut stage, &first).await;
        }
        driver.prepare(&mut stage, change).await;
        let component = component.to_owned();
        let restart = tokio::task::spawn_blocking(move || {
            // A moment into the change.
            std::thread::sleep(Duration::from_millis(300));
            let out = std::process::Command::new(root().join("tests/cluster/restart"))
                .args(["--down", "2", &component, cluster_dir().to_str().unwrap()])
                .output()
                .expect("tests/cluster/restart runs");
            assert!(
                out.status.success(),
                "tests/cluster/restart {component}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        });
        let took = driver.change(&mut stage, change).await;
        restart.await.unwrap();
        quiet(&mut stage).await;
        stage.invariants.settled(MODEL, driver.rollbacks).await;
        let mut outcome = Outcome {
            converge: vec![took],
            points: 1,
            ..Outcome::default()
        };
        outcome.violations = stage.finish().await;
        outcome
    })
}

fn restart_kube_apiserver_mid_rollout(_: Mode, seed: u64) -> Outcome {
    restart_mid_change("restart-apiserver", "kube-apiserver", Change::Rollout, seed)
}

fn restart_etcd_mid_rollback(_: Mode, seed: u64) -> Outcome {
    restart_mid_change("restart-etcd", "etcd", Change::AutomaticRollback, seed)
}

fn restart_kube_controller_manager_mid_rollback(_: Mode, seed: u64) -> Outcome {
    restart_mid_change(
        "restart-kcm",
        "kube-controller-manager",
        Change::AutomaticRollback,
        seed,
    )
}
