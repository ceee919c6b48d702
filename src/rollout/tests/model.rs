//! The whole core at once, driven the way a model checker drives a
//! system: seeded random sequences of user edits (bumps to versions that
//! warm, never warm, or crash once serving; `spec.canary`, the soak and
//! the autoscaler switched on and off; the abort, soak-abort, promote and
//! rollback annotations) and cluster events (pods getting ready, a crash,
//! the autoscaler changing the count, time passing), each decision's
//! writes carried out on the simulated world, and the invariants of
//! docs/reliability.md checked after every step and against every write.
//!
//! A failing sequence is shrunk by proptest to a short one, printed with
//! the seed that found it; `PROPTEST_RNG_SEED=<seed>` replays the run, and
//! the shrunk sequence is kept as a unit test.
//!
//! `MODEL_CASES` sets how many sequences run; without it `cargo test`
//! runs as many as fit in CI's time budget (below). The longer run and
//! its record: docs/reliability.md.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestRunner};

use super::*;
use crate::api::CanaryState;
use crate::api::names::{
    CANARY_ABORT_ANNOTATION, CANARY_PROMOTE_ANNOTATION, SERVED_ENV, SOAK_ABORT_ANNOTATION,
};
use conditions::SOAKED;

/// The versions a sequence may ask for; v1 serves when it begins.
const VERSIONS: [&str; 5] = ["v1", "v2", "v3", "v4", "v5"];

/// How many sequences `cargo test` runs unless `MODEL_CASES` says: this
/// many at most, at least `CI_MIN_CASES`, and no new batch once
/// `CI_BUDGET` is spent.
const CI_CASES: u32 = 3000;
const CI_MIN_CASES: u32 = 300;
const CI_BUDGET: std::time::Duration = std::time::Duration::from_secs(120);
/// Sequences per seed.
const BATCH: u32 = 100;

/// How a version's pods fare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// They warm and serve.
    Good,
    /// They never get ready: the progress deadline passes.
    NeverWarms,
    /// They warm and serve, and crash when `Action::Crash` comes.
    CrashesLater,
}

/// One step of a sequence.
#[derive(Debug, Clone)]
enum Action {
    /// `spec.version` set to `VERSIONS[i]`.
    Bump(usize),
    /// `spec.canary` added (20 % then 60 %, 30 s each) or removed.
    Canary(bool),
    /// `rolloutStrategy.soakSeconds` set.
    Soak(i64),
    /// `spec.autoscaling` (2 to 6 pods) added or removed.
    Autoscaling(bool),
    /// A new value of `openmed.ai/canary-abort`.
    AbortCanary,
    /// A new value of `openmed.ai/soak-abort`.
    SoakAbort,
    /// A new value of `openmed.ai/canary-promote`.
    Promote,
    /// `openmed.ai/rollback-to` set to `VERSIONS[i]`.
    RollbackTo(usize),
    /// `openmed.ai/rollback-to` removed.
    ClearRollback,
    /// The kubelet and the Deployment controller do what they can: the
    /// pods of a version that warms get ready, a progress deadline past
    /// is reported.
    Settle,
    /// Time passes.
    Tick(i64),
    /// A pod of the stable template crashes, if its version does.
    Crash,
    /// The autoscaler sets the stable count (within its bounds).
    Scale(i32),
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        4 => (1..VERSIONS.len()).prop_map(Action::Bump),
        2 => any::<bool>().prop_map(Action::Canary),
        1 => prop_oneof![Just(0i64), Just(60), Just(300)].prop_map(Action::Soak),
        1 => any::<bool>().prop_map(Action::Autoscaling),
        1 => Just(Action::AbortCanary),
        1 => Just(Action::SoakAbort),
        1 => Just(Action::Promote),
        1 => (0..VERSIONS.len()).prop_map(Action::RollbackTo),
        1 => Just(Action::ClearRollback),
        6 => Just(Action::Settle),
        5 => prop_oneof![Just(5i64), Just(31), Just(65), Just(301)].prop_map(Action::Tick),
        1 => Just(Action::Crash),
        1 => (1..8i32).prop_map(Action::Scale),
    ]
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        3 => Just(Kind::Good),
        1 => Just(Kind::NeverWarms),
        1 => Just(Kind::CrashesLater),
    ]
}

/// The canary block every sequence uses.
fn canary_block() -> Value {
    json!({
        "targetRef": {"name": "svc-canary"},
        "trafficRef": {"httpRoute": "svc", "ruleName": "main",
                       "stableBackend": "svc", "canaryBackend": "svc-canary"},
        "steps": [{"weight": 20, "pause": "30s"}, {"weight": 60, "pause": "30s"}],
    })
}

const AUTOSCALING_MIN: i32 = 2;
const AUTOSCALING_MAX: i32 = 6;
const DEADLINE: i64 = 60;

/// One sequence: the world, and what the model knows that the operator
/// does not.
struct Run {
    w: World,
    kinds: BTreeMap<&'static str, Kind>,
    /// Versions every pod of the stable Deployment ran ready at some time.
    completed: BTreeSet<String>,
    /// Versions that crashed while they soaked: never retained, unless
    /// rolled out again and judged afresh.
    failed_soak: BTreeSet<String>,
    /// What the ready pods of the stable Deployment preload now.
    serving: BTreeSet<String>,
    /// When the stable Deployment's template last changed.
    template_changed: i64,
    tokens: u32,
    /// Soak-abort values set while no soak ran: they must never abort one.
    idle_soak_aborts: Vec<String>,
    /// Journal entries already judged.
    judged: usize,
    /// The snapshot ConfigMap name of each version's template.
    snapshots: BTreeMap<String, &'static str>,
}

impl Run {
    fn new(kinds: [Kind; 4]) -> Run {
        let mut w = World::new(spec("v1"));
        w.resource.spec["rolloutStrategy"] = json!({"progressDeadlineSeconds": DEADLINE});
        let mut canary = deployment("svc-canary");
        canary["spec"]["replicas"] = json!(1);
        w.canary = Some(canary);
        w.route = Some(super::canary::route());
        w.journal = Some(Vec::new());
        let mut all = BTreeMap::from([("v1", Kind::Good)]);
        for (v, k) in VERSIONS[1..].iter().zip(kinds) {
            all.insert(*v, k);
        }
        let id = w.resource.id();
        let snapshots = VERSIONS
            .iter()
            .map(|v| {
                let mut s: OpenMedModelSpec = serde_json::from_value(spec(v)).unwrap();
                s.rollout_strategy.progress_deadline_seconds = DEADLINE as i32;
                let normalized = crate::plan::normalize("svc", &s);
                let plan = crate::plan::plan(&id, &normalized, Default::default());
                (name_of(&plan.snapshot).to_owned(), *v)
            })
            .collect();
        let mut run = Run {
            w,
            kinds: all,
            completed: BTreeSet::new(),
            failed_soak: BTreeSet::new(),
            serving: BTreeSet::new(),
            template_changed: 100,
            tokens: 0,
            idle_soak_aborts: Vec::new(),
            judged: 0,
            snapshots,
        };
        run.decide();
        run.apply(&Action::Settle).unwrap();
        assert_eq!(run.w.status().phase, Some(Phase::Ready));
        run
    }

    /// The version a Deployment's template preloads, by its snapshot.
    fn version_of(&self, deployment: &Value) -> Option<String> {
        let env = deployment.pointer("/spec/template/spec/containers/0/env")?;
        let name = env
            .as_array()?
            .iter()
            .find(|e| e["name"] == PRELOAD_ENV)?
            .pointer("/valueFrom/configMapKeyRef/name")?
            .as_str()?;
        self.snapshots.get(name).map(|v| v.to_string())
    }

    fn stable_version(&self) -> Option<String> {
        self.version_of(self.w.deployment.as_ref()?)
    }

    fn kind(&self, version: Option<&str>) -> Kind {
        version
            .and_then(|v| self.kinds.get(v))
            .copied()
            .unwrap_or(Kind::Good)
    }

    fn token(&mut self, prefix: &str) -> String {
        self.tokens += 1;
        format!("{prefix}-{}", self.tokens)
    }

    /// Sets `annotation` to a value it never had; the value.
    fn annotate_anew(&mut self, annotation: &str, prefix: &str) -> String {
        let value = self.token(prefix);
        self.w
            .resource
            .annotations
            .insert(annotation.into(), value.clone());
        value
    }

    fn soak_running(&self) -> bool {
        let s = self.w.status();
        s.phase == Some(Phase::Ready)
            && s.soak.as_ref().is_some_and(|k| {
                k.soaked_time.is_none() && s.applied_spec_hash.as_deref() == Some(&k.spec_hash)
            })
            && conditions::get(&s.conditions, SOAKED).is_some_and(|c| c.reason == "Soaking")
    }

    /// Decides until the status stands still, as the operator does: its
    /// own status write is a watch event that brings another pass.
    fn decide(&mut self) {
        for _ in 0..4 {
            let before = self.w.status().clone();
            let template = self.stable_version();
            self.w.reconcile();
            if self.stable_version() != template {
                self.template_changed = self.w.now;
                // A new attempt of a version: judged afresh.
                if let Some(v) = self.stable_version() {
                    self.failed_soak.remove(&v);
                }
                // The pods of other templates go as the new one rolls.
                let snapshot = self.w.template_snapshot();
                self.w.pods.retain(|p| p.snapshot == snapshot);
            }
            if *self.w.status() == before {
                break;
            }
        }
    }

    fn apply(&mut self, action: &Action) -> Result<(), TestCaseError> {
        let w = &mut self.w;
        match action {
            Action::Bump(i) => w.set_version(VERSIONS[*i]),
            Action::Canary(on) => {
                let mut spec = w.resource.spec.clone();
                match on {
                    true => spec["canary"] = canary_block(),
                    false => {
                        spec.as_object_mut().unwrap().remove("canary");
                    }
                }
                w.set_spec(spec);
            }
            Action::Soak(seconds) => {
                let mut spec = w.resource.spec.clone();
                spec["rolloutStrategy"]["soakSeconds"] = json!(seconds);
                w.set_spec(spec);
            }
            Action::Autoscaling(on) => {
                let mut spec = w.resource.spec.clone();
                match on {
                    true => {
                        spec["autoscaling"] =
                            json!({"minReplicas": AUTOSCALING_MIN, "maxReplicas": AUTOSCALING_MAX})
                    }
                    false => {
                        spec.as_object_mut().unwrap().remove("autoscaling");
                    }
                }
                w.set_spec(spec);
            }
            Action::AbortCanary => {
                self.annotate_anew(CANARY_ABORT_ANNOTATION, "abort");
            }
            Action::SoakAbort => {
                let idle = !self.soak_running();
                let value = self.annotate_anew(SOAK_ABORT_ANNOTATION, "soak-abort");
                if idle {
                    self.idle_soak_aborts.push(value);
                }
            }
            Action::Promote => {
                self.annotate_anew(CANARY_PROMOTE_ANNOTATION, "promote");
            }
            Action::RollbackTo(i) => w.annotate_rollback(Some(VERSIONS[*i])),
            Action::ClearRollback => w.annotate_rollback(None),
            Action::Settle => self.settle(),
            Action::Tick(seconds) => w.now += seconds,
            Action::Crash => {
                let version = self.stable_version();
                if self.kind(version.as_deref()) == Kind::CrashesLater
                    && version.as_ref().is_some_and(|v| self.serving.contains(v))
                {
                    if self.soak_running() {
                        let soaking = self.w.status().soak.as_ref().unwrap().version.clone();
                        self.failed_soak.insert(soaking);
                    }
                    let name = self.token("svc-crash");
                    self.w.crashing_pod(&name, 1, "Killed");
                }
            }
            Action::Scale(n) => {
                let autoscaled = self
                    .w
                    .autoscalers
                    .iter()
                    .any(|h| h.metadata.name.as_deref() == Some("svc"));
                if autoscaled {
                    let floor = self
                        .w
                        .autoscalers
                        .iter()
                        .find(|h| h.metadata.name.as_deref() == Some("svc"))
                        .and_then(|h| h.spec.as_ref()?.min_replicas)
                        .unwrap_or(AUTOSCALING_MIN);
                    let count = (*n).clamp(floor, AUTOSCALING_MAX);
                    self.w.dep()["spec"]["replicas"] = json!(count);
                    self.settle();
                }
            }
        }
        self.decide();
        self.judge()
    }

    /// What the kubelet and the Deployment controller do by themselves.
    fn settle(&mut self) {
        let version = self.stable_version();
        match self.kind(version.as_deref()) {
            Kind::Good | Kind::CrashesLater => {
                // A crashed container is restarted in its pod, warms and is
                // ready again: its restart count stays, as the kubelet
                // reports it.
                for pod in &mut self.w.pods {
                    pod.containers_ready = true;
                }
                self.w.pods_ready();
                if let Some(v) = version {
                    self.completed.insert(v.clone());
                    self.serving = BTreeSet::from([v]);
                }
            }
            Kind::NeverWarms => {
                if self.w.now >= self.template_changed + DEADLINE {
                    self.w.deadline_exceeded();
                }
            }
        }
        let canary = self.w.canary.as_ref().and_then(|c| self.version_of(c));
        if self.kind(canary.as_deref()) != Kind::NeverWarms {
            self.w.canary_pods_ready();
        }
    }

    /// The invariants, against every write since the last look and the
    /// state now.
    fn judge(&mut self) -> Result<(), TestCaseError> {
        let journal = self.w.journal.clone().unwrap_or_default();
        for entry in &journal[self.judged..] {
            self.judge_write(entry)?;
        }
        self.judged = journal.len();
        let status = self.w.status().clone();
        // Retained versions were Ready, and soaked where a soak ran.
        for retained in [
            &status.last_successful_spec,
            &status.previous_successful_spec,
        ]
        .into_iter()
        .flatten()
        {
            let v = &retained.version;
            prop_assert!(
                self.completed.contains(v),
                "{v} is retained but never ran ready on every pod"
            );
            prop_assert!(
                !self.failed_soak.contains(v),
                "{v} is retained but crashed during its soak"
            );
        }
        // A soak-abort value acts at most once, and never when set with no
        // soak running.
        if let Some(value) = self.w.resource.annotations.get(SOAK_ABORT_ANNOTATION) {
            let acted = self
                .w
                .events
                .iter()
                .filter(|e| e.reason == reason::SOAK_ABORTED && e.message.contains(value.as_str()))
                .count();
            prop_assert!(acted <= 1, "{value} aborted {acted} soaks");
            prop_assert!(
                acted == 0 || !self.idle_soak_aborts.contains(value),
                "{value}, set when no soak ran, aborted one"
            );
        }
        // With no canary running, the autoscaler asks for the spec's
        // minimum.
        let autoscaled = self.w.resource.spec.get("autoscaling").is_some();
        let canary_over = status.canary.as_ref().is_none_or(|c| c.state.is_over());
        let at_rest = self.w.weights() == (100, 0);
        // A blocked resource (here: a rollback to a version not retained)
        // writes nothing until a person unblocks it, its autoscaler
        // included.
        let blocked = conditions::get(&status.conditions, READY)
            .is_some_and(|c| c.reason == reason::ROLLBACK_TARGET_UNAVAILABLE);
        if autoscaled && canary_over && at_rest && !blocked {
            let min = self
                .w
                .autoscalers
                .iter()
                .find(|h| h.metadata.name.as_deref() == Some("svc"))
                .and_then(|h| h.spec.as_ref()?.min_replicas);
            if let Some(min) = min {
                prop_assert_eq!(
                    min,
                    AUTOSCALING_MIN,
                    "the autoscaler's minimum is raised with no canary running"
                );
            }
        }
        Ok(())
    }

    fn judge_write(&self, entry: &Journaled) -> Result<(), TestCaseError> {
        match &entry.write {
            Write::ApplyDeployment { name, body, .. } if name == "svc" => {
                let spec = &entry.spec;
                prop_assert!(
                    spec.get("autoscaling").is_none() || body.pointer("/spec/replicas").is_none(),
                    "replicas written to the stable Deployment while spec.autoscaling is set"
                );
                let before = entry.stable.as_ref().and_then(|d| self.version_of(d));
                let written = self.version_of(body);
                if written.is_some() && written != before {
                    let version = written.clone().unwrap();
                    let s = &entry.status;
                    let rollback = s
                        .rollback_request
                        .as_deref()
                        .is_some_and(|r| r.ends_with(&format!(":{version}")));
                    let promoted = s.canary.as_ref().is_some_and(|c| {
                        c.version == version
                            && matches!(c.state, CanaryState::Promoting | CanaryState::Promoted)
                    });
                    let first = before.is_none() || s.stable_spec().is_none();
                    let retained = retained_versions(s).contains(&version);
                    prop_assert!(
                        spec.get("canary").is_none() || rollback || promoted || first || retained,
                        "{version} reached the stable Deployment (serving {before:?}) without its canary"
                    );
                    let served = served_entries(body);
                    for v in self.serving_at(entry) {
                        prop_assert!(
                            served.contains(&v),
                            "the template of {version} serves {served:?}, not {v}, which ready pods serve"
                        );
                    }
                }
            }
            Write::PatchRoute { patch, .. } => {
                let mut route = entry.route.clone().unwrap();
                let patch: json_patch::Patch = serde_json::from_value(patch.clone()).unwrap();
                json_patch::patch(&mut route, &patch).unwrap();
                let canary_weight = route["spec"]["rules"][1]["backendRefs"][1]["weight"]
                    .as_i64()
                    .unwrap_or(0);
                if canary_weight > 0 {
                    let canary = entry.canary.as_ref().unwrap();
                    let available = canary["status"]["availableReplicas"].as_i64().unwrap_or(0);
                    let needed = if entry.spec.get("autoscaling").is_some() {
                        let stable = entry.stable.as_ref().unwrap()["spec"]["replicas"]
                            .as_i64()
                            .unwrap_or(1);
                        i64::from(crate::rollout::autoscaling::canary_replicas(
                            canary_weight as i32,
                            stable as i32,
                        ))
                    } else {
                        1
                    };
                    prop_assert!(
                        available >= needed,
                        "canary weight {canary_weight} written with {available} of {needed} canary pods available"
                    );
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// What ready pods of the stable Deployment served when a write was
    /// made: the model's record, kept in the journal's time order.
    fn serving_at(&self, entry: &Journaled) -> BTreeSet<String> {
        // The stable Deployment complete on its template: its version;
        // rolling: the version every pod served before (the model's).
        let stable = entry.stable.as_ref().unwrap();
        let status = &stable["status"];
        let complete = status["observedGeneration"] == stable["metadata"]["generation"]
            && status["updatedReplicas"] == status["replicas"]
            && status["availableReplicas"] == status["replicas"]
            && status["unavailableReplicas"].as_i64().unwrap_or(0) == 0;
        match (complete, self.version_of(stable)) {
            (true, Some(v)) if self.completed.contains(&v) => BTreeSet::from([v]),
            _ => entry
                .status
                .active_version
                .iter()
                .filter(|v| self.completed.contains(*v))
                .cloned()
                .collect(),
        }
    }
}

/// The entries of the served set a Deployment body writes.
fn served_entries(body: &Value) -> Vec<String> {
    body.pointer("/spec/template/spec/containers/0/env")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|e| e["name"] == SERVED_ENV)
        .and_then(|e| e["value"].as_str())
        .map(|v| v.split(',').map(str::to_owned).collect())
        .unwrap_or_default()
}

/// Runs one sequence; the first invariant broken fails it.
fn run(kinds: [Kind; 4], actions: &[Action]) -> Result<(), TestCaseError> {
    let mut run = Run::new(kinds);
    for action in actions {
        run.apply(action)?;
    }
    // Deleted at the end: the weights go back and nothing is left
    // half-written.
    run.w.resource.deleting = true;
    run.decide();
    prop_assert_eq!(run.w.weights(), (100, 0), "deleted with the weights moved");
    Ok(())
}

#[test]
fn every_feature_at_once_keeps_the_invariants() {
    let exact: Option<u32> = std::env::var("MODEL_CASES")
        .ok()
        .and_then(|c| c.parse().ok());
    let first_seed = match std::env::var("PROPTEST_RNG_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        Some(seed) => seed,
        None => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    };
    // Batches of sequences, each with a seed of its own, until the count
    // or (without MODEL_CASES) CI's time budget is spent: the budget
    // bounds the test, never its verdict. One worker per core takes the
    // next batch (seed first_seed + its index), so a replay runs the same
    // batches whichever worker ran them.
    let (total, budget) = match exact {
        Some(cases) => (cases, None),
        None => (CI_CASES, Some(CI_BUDGET)),
    };
    let started = std::time::Instant::now();
    let next_batch = std::sync::atomic::AtomicU32::new(0);
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let results: Vec<Result<u32, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| {
                    let mut ran = 0;
                    loop {
                        let batch = next_batch.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        let first = batch.saturating_mul(BATCH);
                        let out_of_time = budget
                            .is_some_and(|b| first >= CI_MIN_CASES && started.elapsed() >= b);
                        if first >= total || out_of_time {
                            return Ok(ran);
                        }
                        let seed = first_seed.wrapping_add(u64::from(batch));
                        let cases = BATCH.min(total - first);
                        run_batch(seed, cases).map_err(|e| {
                            format!(
                                "batch {batch}: {e}\nreplay: PROPTEST_RNG_SEED={seed} MODEL_CASES={cases} cargo test --lib -- rollout::tests::model"
                            )
                        })?;
                        ran += cases;
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a worker panicked".to_owned()))
            })
            .collect()
    });
    let mut ran = 0;
    for result in results {
        match result {
            Ok(n) => ran += n,
            Err(e) => panic!("{e}"),
        }
    }
    println!(
        "model-based test: {ran} sequences in {:.0?} on {workers} threads, first seed {first_seed}, every invariant held",
        started.elapsed()
    );
}

/// One batch: `cases` sequences from `seed`, shrunk to the shortest on
/// failure.
fn run_batch(seed: u64, cases: u32) -> Result<(), String> {
    let config = Config {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: None,
        max_shrink_iters: 4096,
        ..Config::default()
    };
    let strategy = (
        [kind(), kind(), kind(), kind()],
        prop::collection::vec(action(), 1..48),
    );
    TestRunner::new(config)
        .run(&strategy, |(kinds, actions)| run(kinds, &actions))
        .map_err(|e| e.to_string())
}

// ---- the sequences it found, shrunk, kept ----

/// An automatic rollback in progress must not stamp a new transition
/// time on every pass (a status write, and a wake-up, each second).
#[test]
fn found_a_rollback_in_progress_that_rewrote_its_status_every_second() {
    use Action::*;
    let kinds = [Kind::Good, Kind::Good, Kind::NeverWarms, Kind::Good];
    run(kinds, &[Bump(3), Tick(65), Settle, Tick(301)]).unwrap();
}

/// A manual rollback written over a template that every pod runs
/// serves that template's version too.
#[test]
fn found_a_rollback_that_dropped_the_version_every_pod_served() {
    use Action::*;
    let kinds = [Kind::Good; 4];
    run(
        kinds,
        &[Bump(1), RollbackTo(1), Settle, Bump(2), RollbackTo(0)],
    )
    .unwrap();
}

/// A resource blocked by a rollback to a version not retained writes
/// nothing, its autoscaler included, until a person unblocks it; then
/// the canary's floor goes.
#[test]
fn found_a_canary_floor_kept_while_a_rejected_rollback_blocks() {
    use Action::*;
    let kinds = [Kind::Good; 4];
    run(
        kinds,
        &[
            Autoscaling(true),
            Canary(true),
            Scale(3),
            Bump(1),
            RollbackTo(1),
            ClearRollback,
        ],
    )
    .unwrap();
}

/// A version that is retained (it succeeded, and soaked where asked)
/// and is asked for again is soaked at once, not judged by a new soak
/// it could fail while it stays retained.
#[test]
fn found_a_retained_version_asked_for_again_soaking_anew() {
    use Action::*;
    let kinds = [
        Kind::CrashesLater,
        Kind::CrashesLater,
        Kind::Good,
        Kind::Good,
    ];
    run(
        kinds,
        &[
            Bump(2),
            Settle,
            Bump(1),
            Settle,
            RollbackTo(2),
            Soak(60),
            Settle,
            Bump(1),
            Bump(2),
            ClearRollback,
            Crash,
        ],
    )
    .unwrap();
}

/// A version whose soak failed, retried by a later bump with no soak
/// asked, is retained once that rollout succeeds (the model's own rule,
/// kept: the invariant is about the attempt that crashed).
#[test]
fn found_a_version_retried_after_its_soak_failed() {
    use Action::*;
    let kinds = [Kind::CrashesLater, Kind::Good, Kind::Good, Kind::Good];
    run(
        kinds,
        &[
            Soak(60),
            Bump(1),
            Settle,
            Crash,
            Soak(0),
            Bump(2),
            Bump(1),
            Settle,
        ],
    )
    .unwrap();
}

/// A crash during a soak that a rejected rollback annotation blocks is
/// judged once the annotation goes: the pod keeps its restart count (the
/// model had dropped crashed pods, which no kubelet does).
#[test]
fn found_a_crash_during_a_blocked_soak() {
    use Action::*;
    let kinds = [Kind::CrashesLater, Kind::Good, Kind::Good, Kind::Good];
    run(
        kinds,
        &[
            Soak(60),
            Bump(1),
            Settle,
            RollbackTo(1),
            Crash,
            Settle,
            Tick(65),
            ClearRollback,
        ],
    )
    .unwrap();
}
