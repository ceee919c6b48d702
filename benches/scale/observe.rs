//! What the cluster looks like, from watches: every measurement takes its
//! timestamps from the moment an event arrives, never from polling.
//!
//! Two watches (the harness's Deployments, every OpenMedModel) keep one
//! state, and each change wakes whoever waits on it.

use std::collections::HashMap;
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};
use openmed_op::api::OpenMedModel;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::workload::{HASH_ANNOTATION, SELECTOR};

/// A Deployment as the measurements need it.
#[derive(Debug, Clone)]
pub struct DeploymentState {
    /// The pod-template annotation `openmed.ai/model-manifest-hash`.
    pub hash: Option<String>,
    /// When `hash` took its current value.
    pub hash_since: Instant,
    /// `spec.progressDeadlineSeconds`.
    pub progress_deadline: Option<i64>,
    /// When the Deployment last started reporting `Progressing=False`
    /// with reason `ProgressDeadlineExceeded` (kept after it stops).
    pub stalled_at: Option<Instant>,
    /// Whether it reports that now.
    pub stalled: bool,
    /// Every replica updated and available, for the current generation.
    pub available: bool,
}

/// An OpenMedModel as the measurements need it.
#[derive(Debug, Clone)]
pub struct ModelState {
    /// `spec.version`.
    pub version: String,
    /// `status.phase` is `Ready` and `status.activeVersion` is `spec.version`.
    pub ready: bool,
    /// When `ready` last became true.
    pub ready_since: Option<Instant>,
}

/// Everything observed, by `<namespace>/<name>`.
#[derive(Debug, Default)]
pub struct State {
    /// The harness's Deployments.
    pub deployments: HashMap<String, DeploymentState>,
    /// Every OpenMedModel.
    pub models: HashMap<String, ModelState>,
    /// When the last event of either watch arrived.
    pub last_event: Option<Instant>,
}

/// The watches and their state.
pub struct Observer {
    state: Arc<Mutex<State>>,
    changed: Arc<Notify>,
    tasks: Vec<JoinHandle<()>>,
}

impl Observer {
    /// Starts both watches.
    pub fn start(client: &Client) -> Self {
        let state = Arc::new(Mutex::new(State::default()));
        let changed = Arc::new(Notify::new());
        let deployments: Api<Deployment> = Api::all(client.clone());
        let models: Api<DynamicObject> =
            Api::all_with(client.clone(), &ApiResource::erase::<OpenMedModel>(&()));
        let tasks = vec![
            tokio::spawn(watch(
                deployments,
                watcher::Config::default().labels(SELECTOR),
                state.clone(),
                changed.clone(),
                |state, key, d: Deployment| {
                    let now = Instant::now();
                    let previous = state.deployments.get(&key);
                    let next = deployment_state(&d, previous, now);
                    state.deployments.insert(key, next);
                },
                |state, key| {
                    state.deployments.remove(&key);
                },
            )),
            tokio::spawn(watch(
                models,
                watcher::Config::default(),
                state.clone(),
                changed.clone(),
                |state, key, m: DynamicObject| {
                    let now = Instant::now();
                    let previous = state.models.get(&key);
                    let next = model_state(&m, previous, now);
                    state.models.insert(key, next);
                },
                |state, key| {
                    state.models.remove(&key);
                },
            )),
        ];
        Observer {
            state,
            changed,
            tasks,
        }
    }

    /// The state now.
    pub fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("observer state")
    }

    /// Waits until `check` returns `Some`, re-checking on every event (and
    /// every second, to call `guard`, which fails fast when the operator has
    /// exited). Fails after `timeout`, naming `what`.
    pub async fn wait<T>(
        &self,
        what: &str,
        timeout: Duration,
        guard: &dyn Fn() -> Result<(), String>,
        mut check: impl FnMut(&State) -> Option<T>,
    ) -> Result<T, String> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let mut notified = pin!(self.changed.notified());
            notified.as_mut().enable();
            if let Some(value) = check(&self.state()) {
                return Ok(value);
            }
            guard()?;
            let tick = tokio::time::Instant::now() + Duration::from_secs(1);
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(tick.min(deadline)) => {
                    if tokio::time::Instant::now() >= deadline {
                        return Err(format!("timed out after {timeout:?} waiting for {what}"));
                    }
                }
            }
        }
    }

    /// Waits until no event has arrived for `calm` (at most `timeout`).
    pub async fn settle(&self, calm: Duration, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let last = self.state().last_event;
            let quiet_for = last.map_or(calm, |l| l.elapsed());
            if quiet_for >= calm || Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep(calm - quiet_for).await;
        }
    }

    /// Stops the watches.
    pub fn stop(self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

async fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
    state: Arc<Mutex<State>>,
    changed: Arc<Notify>,
    apply: impl Fn(&mut State, String, K) + Send + 'static,
    delete: impl Fn(&mut State, String) + Send + 'static,
) where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let mut stream = pin!(watcher::watcher(api, config));
    while let Some(event) = stream.next().await {
        let Ok(event) = event else {
            // The watcher retries by itself; keep the last state.
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        {
            let mut state = state.lock().expect("observer state");
            match event {
                Event::Apply(obj) | Event::InitApply(obj) => {
                    let key = key(&obj);
                    apply(&mut state, key, obj);
                }
                Event::Delete(obj) => {
                    let key = key(&obj);
                    delete(&mut state, key);
                }
                Event::Init | Event::InitDone => {}
            }
            state.last_event = Some(Instant::now());
        }
        changed.notify_waiters();
    }
}

fn key<K: kube::Resource>(obj: &K) -> String {
    format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any())
}

fn deployment_state(
    d: &Deployment,
    previous: Option<&DeploymentState>,
    now: Instant,
) -> DeploymentState {
    let hash = d
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.annotations.as_ref())
        .and_then(|a| a.get(HASH_ANNOTATION))
        .cloned();
    let hash_since = match previous {
        Some(p) if p.hash == hash => p.hash_since,
        _ => now,
    };
    let status = d.status.as_ref();
    let stalled = status.and_then(|s| s.conditions.as_ref()).is_some_and(|c| {
        c.iter().any(|c| {
            c.type_ == "Progressing"
                && c.status == "False"
                && c.reason.as_deref() == Some("ProgressDeadlineExceeded")
        })
    });
    let stalled_at = match previous {
        Some(p) if p.stalled && stalled => p.stalled_at,
        _ if stalled => Some(now),
        Some(p) => p.stalled_at,
        None => None,
    };
    let replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let available = status.is_some_and(|s| {
        s.observed_generation >= d.metadata.generation
            && s.updated_replicas.unwrap_or(0) == replicas
            && s.available_replicas.unwrap_or(0) == replicas
            && s.replicas.unwrap_or(0) == replicas
    });
    DeploymentState {
        hash,
        hash_since,
        progress_deadline: d
            .spec
            .as_ref()
            .and_then(|s| s.progress_deadline_seconds)
            .map(i64::from),
        stalled_at,
        stalled,
        available,
    }
}

fn model_state(m: &DynamicObject, previous: Option<&ModelState>, now: Instant) -> ModelState {
    let version = m.data["spec"]["version"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let status = &m.data["status"];
    let ready =
        status["phase"] == "Ready" && status["activeVersion"].as_str() == Some(version.as_str());
    let ready_since = match previous {
        Some(p) if p.ready && ready && p.version == version => p.ready_since,
        _ if ready => Some(now),
        _ => None,
    };
    ModelState {
        version,
        ready,
        ready_since,
    }
}
