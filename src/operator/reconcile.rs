//! One reconcile: gather the observed world from the caches, let
//! `rollout::decide` choose, carry the decision out, and ask again until
//! nothing is left to write.
//!
//! Nothing here decides policy. The loop persists the decided status before
//! the writes it announces (so a crash never loses an intent or counts a
//! rollback twice), then emits events, then writes, then decides again with
//! what the writes returned.
//!
//! Every failure (an API error, a conflict, a timeout, a decision that
//! does not settle) is an error: it backs off per object, 1 s doubling to
//! 1 min, is counted in a metric by category, and is reported in the
//! resource's `Reconciling` condition until a decision succeeds again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams,
    PostParams, Preconditions,
};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt};
use tracing::{info, instrument, warn};

use super::by_namespace::ByNamespace;
use super::config_map::CachedConfigMap;
use super::deployment::CachedDeployment;
use super::events::Recorder;
use super::json_text::JsonText;
use super::metrics::Metrics;
use super::model::RawModel;
use super::replica_set::CachedReplicaSet;
use super::settled::Inputs;
use crate::api::names::{
    FIELD_MANAGER, FINALIZER, MANIFEST_SNAPSHOT_LABEL, MODEL_RESOURCE_ANNOTATION,
    REPLICAS_HANDOVER_FIELD_MANAGER,
};
use crate::api::quality::QUALITY_CONDITION;
use crate::api::{API_VERSION, KIND, OpenMedModelStatus};
use crate::rollout::finalizers::Lifecycle;
use crate::rollout::{self, Decision, Observed, ResourceView, Rival, Settings, Write};

/// Passes of decide-and-write in one reconcile; a decision needs at most
/// four (intent, writes, record the generation, tidy the ConfigMaps).
const MAX_PASSES: usize = 6;
/// Live re-reads after refused writes in one reconcile. A Deployment just
/// created or just written has its status written by its controller a few
/// times within a second, so a write may be refused twice in a row on
/// nothing but that; a third refusal backs off like any failure. With the
/// four passes a decision needs, this fits in [`MAX_PASSES`].
const MAX_REFRESHES: usize = 2;

/// How long a reconcile waits for the caches to hold a full list.
const CACHE_SYNC_TIMEOUT: Duration = Duration::from_secs(60);

/// How long one event may take to record before it is given up (logged).
const EVENT_TIMEOUT: Duration = Duration::from_secs(5);

/// Errors of a reconcile, each with a stable category for metrics.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API request failed.
    #[error("Kubernetes API: {0}")]
    Api(#[from] kube::Error),
    /// An object did not serialize.
    #[error("serialization: {0}")]
    Serialize(#[from] serde_json::Error),
    /// The caches did not sync in time.
    #[error("the watch caches did not sync within {}s", CACHE_SYNC_TIMEOUT.as_secs())]
    CacheSync,
    /// The decisions kept asking for writes: something rewrites what the
    /// operator writes (a webhook, another controller), or the cache lags.
    #[error("still asked for writes after {MAX_PASSES} passes: {0}")]
    NotConverged(String),
}

impl Error {
    /// Short category used as a metric label.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Api(kube::Error::Api(s)) if s.code == 409 => "conflict",
            Error::Api(kube::Error::Api(s)) if s.code >= 500 => "server",
            Error::Api(kube::Error::Api(_)) => "client",
            Error::Api(_) => "transport",
            Error::Serialize(_) => "serialization",
            Error::CacheSync => "cache-sync",
            Error::NotConverged(_) => "not-converged",
        }
    }
}

/// What every reconcile shares.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// Every OpenMedModel in scope (the controller's own cache).
    pub models: ByNamespace<RawModel>,
    /// Deployments labelled as managed by this operator.
    pub deployments: ByNamespace<CachedDeployment>,
    /// ConfigMaps labelled as managed by this operator.
    pub config_maps: ByNamespace<CachedConfigMap>,
    /// HorizontalPodAutoscalers in scope.
    pub autoscalers: ByNamespace<HorizontalPodAutoscaler>,
    /// KEDA ScaledObjects in scope, when watched (`--keda`).
    pub scaled_objects: Option<ByNamespace<super::scaled_object::ScaledObject>>,
    /// ReplicaSets whose template references a snapshot (without their
    /// template).
    pub replica_sets: ByNamespace<CachedReplicaSet>,
    /// Pods whose template references a snapshot (name, labels and
    /// container statuses only).
    pub pods: ByNamespace<Pod>,
    /// Policy switches.
    pub settings: Settings,
    /// How often a steady resource is looked at again (from the caches).
    pub resync: Duration,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Event writer.
    pub recorder: Recorder,
    /// Consecutive failures per object, for exponential backoff.
    pub failures: Mutex<HashMap<String, u32>>,
    /// Whether this instance leads (always, without leader election).
    pub fence: Arc<super::leader::Fence>,
    /// Which caches hold a full list.
    pub synced: Arc<super::synced::Synced>,
    /// Runs canary checks.
    pub prober: super::probe::Prober,
    /// What the operator wrote that the caches may not show yet.
    pub written: Arc<super::recent::Written>,
    /// Resources at rest, which a resync need not decide again.
    pub settled: super::settled::Settled,
}

/// Reconciles one OpenMedModel (the controller's reconcile function).
#[instrument(skip_all, fields(resource = %format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any())))]
pub async fn reconcile(obj: Arc<RawModel>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    if !ctx.fence.is_open(started) {
        // A follower keeps its caches warm and leaves the rest to the
        // leader; on taking over it reconciles everything.
        return Ok(Action::await_change());
    }
    let _worker = ctx.metrics.worker();
    // Our own last status write may be newer than the cache's copy.
    let obj = newest(&ctx, obj);
    let key = format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any());
    let api: Api<RawModel> =
        Api::namespaced(ctx.client.clone(), &obj.namespace().unwrap_or_default());
    let lifecycle =
        rollout::finalizers::lifecycle(obj.metadata.deletion_timestamp.is_some(), obj.finalizers());
    let result = match lifecycle {
        Lifecycle::Release => cleanup(&obj, &ctx, &api).await,
        Lifecycle::Leave => Ok(Action::await_change()),
        // Its own watch event brings the resource back.
        Lifecycle::AddFinalizer => add_finalizer(&api, &obj, ctx.as_ref())
            .await
            .map(|()| Action::await_change()),
        Lifecycle::Reconcile => apply(&obj, &ctx).await,
    };
    let outcome = match &result {
        Ok(_) => "success",
        Err(_) => "error",
    };
    ctx.metrics.reconciled(outcome, started.elapsed());
    if result.is_err() {
        ctx.settled.forget(&key);
    }
    {
        let mut failures = ctx.failures.lock().expect("failures");
        if result.is_ok() {
            failures.remove(&key);
        }
        ctx.metrics.in_backoff(failures.len());
    }
    if let Err(e) = &result {
        // The status as this reconcile left it: a copy from before its own
        // status writes would only be refused.
        report_error(&api, &newest(&ctx, obj), e, &ctx).await;
    }
    result
}

/// The newer of `obj` and the operator's own last write of it.
fn newest(ctx: &Context, obj: Arc<RawModel>) -> Arc<RawModel> {
    let namespace = obj.namespace().unwrap_or_default();
    ctx.written
        .models
        .newest(&namespace, &obj.name_any(), Some(obj.clone()))
        .unwrap_or(obj)
}

/// Requeue with per-object exponential backoff (1 s doubling to 1 min), so a
/// persistent failure never becomes a hot loop.
pub fn error_policy(obj: Arc<RawModel>, error: &Error, ctx: Arc<Context>) -> Action {
    let key = format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any());
    ctx.metrics.failed(error.category());
    let mut failures = ctx.failures.lock().expect("failures");
    // Forget resources that are gone (a finalizer removed by hand, the CRD
    // deleted): their backoff would otherwise stay in the metric forever.
    failures.retain(|k, _| {
        k == &key || {
            let (namespace, name) = k.split_once('/').unwrap_or_default();
            ctx.models
                .get(&ObjectRef::new(name).within(namespace))
                .is_some()
        }
    });
    let n = failures.entry(key.clone()).or_insert(0);
    *n = n.saturating_add(1);
    let delay = backoff(*n);
    ctx.metrics.in_backoff(failures.len());
    warn!(resource = %key, error = %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// The delay after `failures` consecutive failures: 1 s, doubling, at most
/// 1 min. A longer cap would leave a safety action (a rollback past its
/// deadline) waiting for minutes behind unrelated transient errors; a
/// failing resource costs at most one reconcile a minute.
pub fn backoff(failures: u32) -> Duration {
    let exponent = failures.saturating_sub(1).min(16);
    Duration::from_secs((1u64 << exponent).min(60))
}

/// Shows a failed reconcile in the resource's `Reconciling` condition
/// (best effort: the API may be what failed). The message names only the
/// error's category and code, so a repeat of the same failure is a no-op
/// write that wakes nobody.
async fn report_error(api: &Api<RawModel>, obj: &RawModel, error: &Error, ctx: &Context) {
    if obj.metadata.deletion_timestamp.is_some() {
        return;
    }
    let view = obj.view();
    let mut conditions = view.status.conditions.clone();
    let code = match error {
        Error::Api(kube::Error::Api(s)) => format!(" (HTTP {} {})", s.code, s.reason),
        _ => String::new(),
    };
    let message = format!(
        "reconcile failed: {}{code}; retrying with backoff",
        error.category()
    );
    rollout::conditions::set(
        &mut conditions,
        rollout::conditions::RECONCILING,
        true,
        rollout::reason::RETRYING_AFTER_ERROR,
        message,
        view.generation,
        &now(),
    );
    if conditions == view.status.conditions {
        return;
    }
    // A replace of the status the cache holds, with its resourceVersion:
    // the verb the operator already has, and a conflict rather than an
    // overwrite when the status moved on meanwhile.
    let mut status = obj
        .status
        .as_ref()
        .map_or_else(|| serde_json::json!({}), JsonText::value);
    status["conditions"] = serde_json::to_value(&conditions).unwrap_or_default();
    let mut next = obj.clone();
    next.status = Some(JsonText::of(&status));
    next.types = Some(kube::api::TypeMeta {
        api_version: API_VERSION.to_owned(),
        kind: KIND.to_owned(),
    });
    match api
        .replace_status(&obj.name_any(), &PostParams::default(), &next)
        .await
    {
        Ok(stored) => ctx.written.models.wrote(&stored),
        Err(e) => warn!(error = %e, "could not report the error in the Reconciling condition"),
    }
}

async fn add_finalizer(api: &Api<RawModel>, obj: &RawModel, ctx: &Context) -> Result<(), Error> {
    // The resourceVersion makes the patch fail rather than overwrite a
    // list another writer changed meanwhile.
    let mut finalizers = obj.finalizers().to_vec();
    finalizers.push(FINALIZER.to_owned());
    let patch = serde_json::json!({ "metadata": {
        "finalizers": finalizers,
        "resourceVersion": obj.resource_version(),
    }});
    let stored = api
        .patch(
            &obj.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    ctx.written.models.wrote(&stored);
    Ok(())
}

/// Removes the finalizers a done release stands for
/// ([`rollout::finalizers::kept_after_release`]).
async fn remove_finalizer(api: &Api<RawModel>, obj: &RawModel) -> Result<(), Error> {
    let finalizers = rollout::finalizers::kept_after_release(obj.finalizers());
    info!(from = ?obj.finalizers(), kept = ?finalizers, "released; removing the finalizers");
    let patch = serde_json::json!({ "metadata": {
        "finalizers": finalizers,
        "resourceVersion": obj.resource_version(),
    }});
    match api
        .patch(
            &obj.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Objects newer than the caches: read live, or returned by this
/// reconcile's own writes (`None`: known not to exist).
#[derive(Default)]
struct Fresh {
    deployments: HashMap<String, Option<Deployment>>,
    config_maps: HashMap<String, Option<ConfigMap>>,
    /// HTTPRoutes are never cached: a canary judges its weights on what
    /// the API server holds now.
    routes: HashMap<String, Option<serde_json::Value>>,
    /// Pods as the quality gate's marks left them (`None`: gone).
    pods: HashMap<String, Option<rollout::pods::PodView>>,
}

impl Fresh {
    /// Whether the Deployment `name` was read live, or returned by a
    /// write, in this reconcile.
    fn holds(&self, name: &str) -> bool {
        self.deployments.contains_key(name)
    }

    /// Whether nothing was read live.
    fn is_empty(&self) -> bool {
        self.deployments.is_empty()
            && self.config_maps.is_empty()
            && self.routes.is_empty()
            && self.pods.is_empty()
    }

    /// Reads live every object a decision about `view` looks at.
    ///
    /// The caches lag behind the API server: right after a write, the next
    /// reconcile (triggered by that very write) may still see the old
    /// object and take the operator's own change for another writer's.
    /// Writes are therefore decided twice, the second time on live reads;
    /// a steady state, which writes nothing, reads nothing.
    async fn read_live(&mut self, view: &ResourceView, ctx: &Context) -> Result<(), kube::Error> {
        let namespace = &view.namespace;
        let key = view.key();
        let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), namespace);
        let mut names = vec![rollout::target_name(view)];
        names.extend(rollout::canary_target_name(view));
        names.extend(
            ctx.deployments
                .in_namespace(namespace)
                .into_iter()
                .filter(|d| claims(&**d, &key))
                .map(|d| d.name_any()),
        );
        names.retain(|n| !self.deployments.contains_key(n));
        names.sort();
        names.dedup();
        // In parallel: these reads sit on the path from a change to its write.
        let reads = names.iter().map(|n| deployments.get_opt(n));
        let found = futures::future::try_join_all(reads).await?;
        found
            .iter()
            .flatten()
            .for_each(|d| ctx.written.deployments.wrote(&CachedDeployment::of(d)));
        self.deployments.extend(names.into_iter().zip(found));
        let config_maps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), namespace);
        let mut names = rollout::config_map_names(view);
        names.extend(
            ctx.config_maps
                .in_namespace(namespace)
                .into_iter()
                .filter(|c| owns(&**c, view, &key))
                .map(|c| c.name_any()),
        );
        names.retain(|n| !self.config_maps.contains_key(n));
        names.sort();
        names.dedup();
        let reads = names.iter().map(|n| config_maps.get_opt(n));
        let found = futures::future::try_join_all(reads).await?;
        found
            .iter()
            .flatten()
            .for_each(|c| ctx.written.config_maps.wrote(&CachedConfigMap::of(c)));
        self.config_maps.extend(names.into_iter().zip(found));
        Ok(())
    }
}

/// `gateway.networking.k8s.io/v1` HTTPRoutes, which k8s-openapi does not type.
fn routes(ctx: &Context, namespace: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", "HTTPRoute");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "httproutes");
    Api::namespaced_with(ctx.client.clone(), namespace, &resource)
}

/// Reads an HTTPRoute as JSON; `None` when it (or the Gateway API) is not
/// there.
async fn read_route(
    ctx: &Context,
    namespace: &str,
    name: &str,
) -> Result<Option<serde_json::Value>, kube::Error> {
    let read = routes(ctx, namespace).get_opt(name).await?;
    Ok(read.map(|r| serde_json::to_value(r).expect("an HTTPRoute serializes")))
}

/// A Deployment by name: as read live in this reconcile, else the newer
/// of the cache's and the operator's last write, else read once now (a
/// target not yet labelled is not cached).
async fn deployment_named(
    ctx: &Context,
    fresh: &mut Fresh,
    namespace: &str,
    name: &str,
) -> Result<Option<Deployment>, kube::Error> {
    if let Some(d) = fresh.deployments.get(name) {
        return Ok(d.clone());
    }
    let cached = ctx.deployments.get(&ObjectRef::new(name).within(namespace));
    let deleted = cached.is_some();
    if let Some(d) = ctx.written.deployments.newest(namespace, name, cached) {
        return Ok(Some(d.deployment()));
    }
    if deleted {
        return Ok(None);
    }
    let api = Api::namespaced(ctx.client.clone(), namespace);
    read_and_keep(&mut fresh.deployments, api, name).await
}

/// Reads one object the caches do not hold yet and keeps the answer with
/// the live reads: it is as fresh as one, so it is not read twice before a
/// write.
async fn read_and_keep<K>(
    seen: &mut HashMap<String, Option<K>>,
    api: Api<K>,
    name: &str,
) -> Result<Option<K>, kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let read = api.get_opt(name).await?;
    seen.insert(name.to_owned(), read.clone());
    Ok(read)
}

// Which cached objects of its namespace belong to a resource. Every
// resource is looked at again each resync, so these run for each object of
// the namespace each resync: compare in place, never allocate.

/// A Deployment whose fields the resource `key` manages.
fn claims(deployment: &impl ResourceExt, key: &str) -> bool {
    deployment
        .annotations()
        .get(MODEL_RESOURCE_ANNOTATION)
        .is_some_and(|v| v == key)
}

/// A ConfigMap of the resource: owned by it, or annotated with its key.
fn owns(config_map: &impl ResourceExt, view: &ResourceView, key: &str) -> bool {
    config_map
        .owner_references()
        .iter()
        .any(|o| o.uid == view.uid)
        || config_map
            .annotations()
            .get(MODEL_RESOURCE_ANNOTATION)
            .is_some_and(|v| v == key)
}

/// Everything gathered for one decision.
struct World {
    target: Option<Deployment>,
    canary_target: Option<Deployment>,
    route: Option<serde_json::Value>,
    claimed: Vec<Deployment>,
    config_maps: Vec<ConfigMap>,
    rivals: Vec<Rival>,
    /// The autoscalers that concern the resource.
    autoscalers: Vec<HorizontalPodAutoscaler>,
    /// The ScaledObject of the resource's name, as JSON.
    scaled_object: Option<serde_json::Value>,
    snapshot_uses: Vec<rollout::SnapshotUse>,
    pods: Vec<rollout::pods::PodView>,
}

fn now() -> Time {
    // Whole seconds: the API server stores times at that precision, and an
    // in-memory fraction would make every status look changed.
    let now = k8s_openapi::jiff::Timestamp::now();
    Time(k8s_openapi::jiff::Timestamp::from_second(now.as_second()).expect("a valid time"))
}

/// Where the resource and the caches of its namespace stand, before
/// anything is read from them (see [`super::settled`]).
fn inputs(ctx: &Context, obj: &RawModel) -> Inputs {
    let namespace = obj.metadata.namespace.as_deref().unwrap_or_default();
    Inputs {
        resource: (
            obj.metadata.uid.clone().unwrap_or_default(),
            obj.metadata.resource_version.clone().unwrap_or_default(),
        ),
        caches: [
            ctx.models.version(namespace),
            ctx.deployments.version(namespace),
            ctx.config_maps.version(namespace),
            ctx.autoscalers.version(namespace),
            ctx.replica_sets.version(namespace),
            ctx.pods.version(namespace),
            ctx.scaled_objects
                .as_ref()
                .map(|s| s.version(namespace))
                .unwrap_or_default(),
        ],
    }
}

async fn apply(obj: &RawModel, ctx: &Arc<Context>) -> Result<Action, Error> {
    wait_for_caches(ctx).await?;
    let namespace = obj.namespace().unwrap_or_default();
    let key = format!("{namespace}/{}", obj.name_any());
    let inputs = inputs(ctx, obj);
    // A canary's checks, when due, run once, before the decisions that
    // judge them.
    let checks = rollout::analysis_checks(&obj.view(), &ctx.settings, &now());
    if checks.is_empty()
        && ctx.settled.is_settled(&key, &inputs)
        && !ctx.written.holds_any_in(&namespace)
    {
        ctx.metrics.resync_skipped();
        return Ok(Action::requeue(ctx.resync));
    }
    let models: Api<RawModel> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut current = obj.clone();
    let mut fresh = Fresh::default();
    let mut refreshes = 0;
    let mut last_writes = String::new();
    // Probes are planned from the world, below; the rest are endpoints.
    let endpoints: Vec<_> = checks
        .into_iter()
        .filter(|c| !matches!(c, rollout::analysis::Check::Probes { .. }))
        .collect();
    let mut observed: Option<Measured> = None;
    for pass in 0..MAX_PASSES {
        let view = current.view();
        let world = gather(&view, ctx, &mut fresh).await?;
        let now = now();
        // Measured once, before the first decision, under one deadline:
        // the decisions of this reconcile judge the same answers.
        let measured = match observed.take() {
            Some(measured) => measured,
            None => measure(ctx, &view, &world, &endpoints, &now).await,
        };
        let measured = &*observed.insert(measured);
        let decision = decide(&view, &world, measured, &ctx.settings, now.clone());
        if decision.needs_live_reads && !fresh.holds(&rollout::target_name(&view)) {
            // Giving up on a version rolls back or fails for good; a cut
            // watch re-listing can leave the cache showing a Deployment
            // from seconds ago, mid-rollout. Decide again on what the API
            // server holds now (the chaos suite's cut watches once failed a
            // rollback that was completing).
            fresh.read_live(&view, ctx).await?;
            continue;
        }
        // No read before a write: the caches, with the operator's own
        // recent writes laid over them, are as new as anything this
        // operator did, and every write carries a precondition (the
        // resourceVersion or UID it was decided on), so a decision on
        // something another writer changed meanwhile is refused and made
        // again on live reads.
        let mut status = decision.status.clone();
        if !decision.writes.is_empty() {
            rollout::conditions::keep_error_report(&mut status, &view.status);
        }
        // What goes out with the status rather than after it, and its
        // outcome: a new snapshot, which nothing reads until the
        // Deployment names it, so the reaction to a new version waits for
        // two writes in a row (intent and snapshot together, then the
        // Deployment) instead of three.
        let mut alongside: Result<(), Error> = Ok(());
        let mut after_status: &[Write] = &decision.writes;
        if status != view.status {
            let (early, rest) = decision.writes_around_intent();
            after_status = rest;
            let (stored, early_written) = tokio::join!(
                write_status(&models, &current, &status, ctx),
                execute(early, &namespace, ctx, &world, &mut fresh, &now),
            );
            alongside = early_written;
            match stored {
                Ok(written) => current = written,
                // A conflict means this copy is stale: another writer, or a
                // watch that lags or broke (after an API server restart the
                // chaos suite saw one stay stale for minutes, every retry
                // conflicting again). Decide once more from the stored
                // object, and the objects it names (a newer spec names
                // another snapshot), instead of waiting for the watch; a
                // conflict after MAX_REFRESHES is an error that backs off.
                Err(kube::Error::Api(e)) if e.code == 409 && refreshes < MAX_REFRESHES => {
                    refreshes += 1;
                    let Some(stored) = read_all_live(&models, &current, ctx, &mut fresh).await?
                    else {
                        return Ok(Action::await_change());
                    };
                    current = stored;
                    continue;
                }
                Err(e) => return Err(e.into()),
            }
        }
        if decision.writes.is_empty() {
            let at_rest = pass == 0
                && status == view.status
                && decision.events.is_empty()
                && decision.requeue_after.is_none()
                && measured.is_empty()
                && fresh.is_empty()
                && !ctx.written.holds_any_in(&namespace);
            ctx.settled.record(&key, at_rest.then_some(inputs), |key| {
                let (namespace, name) = key.split_once('/').unwrap_or_default();
                ctx.models
                    .get(&ObjectRef::new(name).within(namespace))
                    .is_some()
            });
            record_events(ctx, &current, &decision).await;
            let after = decision
                .requeue_after
                .map_or(ctx.resync, |d| d.min(ctx.resync));
            return Ok(Action::requeue(after));
        }
        last_writes = describe(&decision.writes);
        // The writes first: the events tell people what happened and are
        // not on the path from a change to its writes. They are recorded
        // whatever the writes' outcome (the status already holds it).
        let written = match alongside {
            Ok(()) => execute(after_status, &namespace, ctx, &world, &mut fresh, &now).await,
            failed => failed,
        };
        record_events(ctx, &current, &decision).await;
        if written.is_ok()
            && let Some(measured) = observed.as_mut()
        {
            // The probe answers were judged by a decision now carried out:
            // the pods' marks are written and the Events told. The next
            // decisions judge the pods as those marks left them.
            measured.probes.clear();
        }
        match written {
            // A precondition refused a write: what it was decided on has
            // changed. Decide again on live reads.
            Err(Error::Api(kube::Error::Api(e))) if e.code == 409 && refreshes < MAX_REFRESHES => {
                refreshes += 1;
                let Some(stored) = read_all_live(&models, &current, ctx, &mut fresh).await? else {
                    return Ok(Action::await_change());
                };
                current = stored;
            }
            written => written?,
        }
    }
    Err(Error::NotConverged(last_writes))
}

/// Reads the resource live, then every object a decision about it looks
/// at (`None`: the resource is gone).
///
/// Called after a refused write, so what this reconcile read or wrote
/// before is forgotten first: the object a precondition was refused on is
/// among it (the Deployment controller writes a Deployment's status right
/// after every write of its spec), and keeping it would only see the same
/// write refused again.
async fn read_all_live(
    models: &Api<RawModel>,
    current: &RawModel,
    ctx: &Context,
    fresh: &mut Fresh,
) -> Result<Option<RawModel>, kube::Error> {
    let Some(stored) = models.get_opt(&current.name_any()).await? else {
        return Ok(None);
    };
    ctx.written.models.wrote(&stored);
    *fresh = Fresh::default();
    fresh.read_live(&stored.view(), ctx).await?;
    Ok(Some(stored))
}

/// Deletion: release, wait until nothing reads the ConfigMaps, delete
/// them, and only then let the resource go.
async fn cleanup(obj: &RawModel, ctx: &Context, api: &Api<RawModel>) -> Result<Action, Error> {
    wait_for_caches(ctx).await?;
    let namespace = obj.namespace().unwrap_or_default();
    let mut current = obj.clone();
    let mut fresh = Fresh::default();
    fresh.read_live(&current.view(), ctx).await?;
    // A canary's Deployment is released only once no request reaches it:
    // the drain query, when due, is read as for any decision.
    let drain: Vec<_> = rollout::analysis_checks(&current.view(), &ctx.settings, &now())
        .into_iter()
        .filter(|c| c.name() == rollout::drain::CHECK_NAME)
        .collect();
    let measured = Measured {
        readings: if drain.is_empty() {
            Vec::new()
        } else {
            ctx.prober.measure(&drain).await
        },
        probes: Vec::new(),
    };
    let mut last_writes = String::new();
    for _ in 0..MAX_PASSES {
        let view = current.view();
        let world = gather(&view, ctx, &mut fresh).await?;
        let now = now();
        let decision = decide(&view, &world, &measured, &ctx.settings, now.clone());
        record_events(ctx, &current, &decision).await;
        if decision.finished {
            remove_finalizer(api, &current).await?;
            ctx.recorder.forget(&current);
            ctx.settled
                .forget(&format!("{namespace}/{}", current.name_any()));
            return Ok(Action::await_change());
        }
        // What the deletion waits for is said in the status, so a
        // finalizer that stays is never a silent one.
        if decision.status != view.status {
            current = write_status(api, &current, &decision.status, ctx).await?;
        }
        if decision.writes.is_empty() {
            let wait = decision.requeue_after.unwrap_or(ctx.resync);
            info!(
                retry_in = ?wait,
                "released; waiting until no pod can read the model ConfigMaps before deleting them"
            );
            return Ok(Action::requeue(wait));
        }
        last_writes = describe(&decision.writes);
        execute(&decision.writes, &namespace, ctx, &world, &mut fresh, &now).await?;
    }
    Err(Error::NotConverged(last_writes))
}

/// Records a decision's events, each bounded in time: they tell people what
/// happened, and a slow event must not hold a worker, nor a lost one undo
/// the decision (its status is already written).
async fn record_events(ctx: &Context, resource: &RawModel, decision: &Decision) {
    for event in &decision.events {
        ctx.metrics
            .observe_event(event, decision.status.rollback_request.as_deref());
        info!(reason = event.reason, message = %event.message, "event");
        match tokio::time::timeout(EVENT_TIMEOUT, ctx.recorder.record(resource, event)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(error = %e, reason = event.reason, "could not record event"),
            Err(_) => warn!(reason = event.reason, "recording the event timed out"),
        }
    }
}

/// A short account of writes, for the not-converged error.
fn describe(writes: &[Write]) -> String {
    writes
        .iter()
        .map(|w| match w {
            Write::ApplyConfigMap(cm) => format!("apply ConfigMap {}", cm.name_any()),
            Write::DeleteConfigMap { name, .. } => format!("delete ConfigMap {name}"),
            Write::MergePatchDeployment { name, .. } => format!("patch Deployment {name}"),
            Write::StrategicPatchDeployment { name, .. } => {
                format!("take back the marks of Deployment {name}")
            }
            Write::PatchRoute { name, .. } => format!("patch HTTPRoute {name}"),
            Write::HandOverReplicas { name, .. } => {
                format!("hand over replicas of Deployment {name}")
            }
            Write::ApplyDeployment { name, .. } => format!("apply Deployment {name}"),
            Write::MarkPod { name, .. } => format!("mark pod {name}"),
            Write::ApplyAutoscaler(hpa) => {
                format!("apply HorizontalPodAutoscaler {}", hpa.name_any())
            }
            Write::DeleteAutoscaler { name, .. } => {
                format!("delete HorizontalPodAutoscaler {name}")
            }
            Write::ApplyScaledObject(object) => format!(
                "apply ScaledObject {}",
                object["metadata"]["name"].as_str().unwrap_or_default()
            ),
            Write::DeleteScaledObject { name, .. } => format!("delete ScaledObject {name}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// What the shell measured for the decisions of one reconcile: the
/// analysis readings and the probe rounds, taken together under one
/// deadline.
#[derive(Default)]
struct Measured {
    readings: Vec<rollout::analysis::Measurement>,
    probes: Vec<rollout::quality::ProbeRound>,
}

impl Measured {
    /// Nothing was measured.
    fn is_empty(&self) -> bool {
        self.readings.is_empty() && self.probes.is_empty()
    }
}

/// Takes the readings of `endpoints` and the probe rounds the core plans
/// for `view` at once, each bounded by the prober's deadline
/// ([`super::probe::MEASURE_DEADLINE`]): a reconcile holds a worker that
/// every resource shares.
async fn measure(
    ctx: &Context,
    view: &ResourceView,
    world: &World,
    endpoints: &[rollout::analysis::Check],
    now: &Time,
) -> Measured {
    let plans = observing(
        view,
        world,
        &Measured::default(),
        &ctx.settings,
        now.clone(),
        rollout::quality::probe_plan,
    );
    let (readings, probes) = tokio::join!(
        async {
            if endpoints.is_empty() {
                Vec::new()
            } else {
                ctx.prober.measure(endpoints).await
            }
        },
        super::quality::gather(
            &ctx.client,
            &view.namespace,
            &ctx.prober,
            &ctx.metrics,
            plans,
            ctx.prober.deadline(),
        ),
    );
    Measured { readings, probes }
}

fn decide(
    view: &ResourceView,
    world: &World,
    measured: &Measured,
    settings: &Settings,
    now: Time,
) -> Decision {
    observing(view, world, measured, settings, now, rollout::decide)
}

/// What `core` makes of the world as gathered and measured.
fn observing<T>(
    view: &ResourceView,
    world: &World,
    measured: &Measured,
    settings: &Settings,
    now: Time,
    core: impl FnOnce(&Observed) -> T,
) -> T {
    let claimed: Vec<&Deployment> = world.claimed.iter().collect();
    let config_maps: Vec<&ConfigMap> = world.config_maps.iter().collect();
    let autoscalers: Vec<&HorizontalPodAutoscaler> = world.autoscalers.iter().collect();
    core(&Observed {
        resource: view,
        target: world.target.as_ref(),
        canary_target: world.canary_target.as_ref(),
        route: world.route.as_ref(),
        measurements: &measured.readings,
        probes: &measured.probes,
        autoscalers: &autoscalers,
        scaled_object: world.scaled_object.as_ref(),
        rivals: &world.rivals,
        claimed: &claimed,
        config_maps: &config_maps,
        snapshot_uses: &world.snapshot_uses,
        pods: &world.pods,
        settings: settings.clone(),
        now,
    })
}

/// Waits, within [`CACHE_SYNC_TIMEOUT`], until every cache holds a full
/// list: deciding from a half-filled cache could miss a Deployment to
/// release or a ConfigMap still in use.
pub async fn wait_for_caches(ctx: &Context) -> Result<(), Error> {
    match tokio::time::timeout(CACHE_SYNC_TIMEOUT, caches_synced(ctx)).await {
        Ok(true) => Ok(()),
        _ => Err(Error::CacheSync),
    }
}

/// Completes when every cache holds a full list (false: a store was dropped).
pub async fn caches_synced(ctx: &Context) -> bool {
    ctx.synced.all().await;
    true
}

/// Reads the world from the caches; an object the caches cannot hold yet
/// (a target not yet labelled, a ConfigMap not yet created) is read once.
async fn gather(view: &ResourceView, ctx: &Context, fresh: &mut Fresh) -> Result<World, Error> {
    let namespace = &view.namespace;
    let key = view.key();
    let target_name = rollout::target_name(view);

    let target = deployment_named(ctx, fresh, namespace, &target_name).await?;
    let canary_target = match rollout::canary_target_name(view) {
        Some(name) => deployment_named(ctx, fresh, namespace, &name).await?,
        None => None,
    };
    let route = match rollout::route_to_read(view) {
        None => None,
        Some(name) => match fresh.routes.get(&name) {
            Some(r) => r.clone(),
            None => {
                let read = read_route(ctx, namespace, &name).await?;
                fresh.routes.insert(name, read.clone());
                read
            }
        },
    };

    let mut claimed: HashMap<String, Deployment> = ctx
        .deployments
        .in_namespace(namespace)
        .into_iter()
        .filter(|d| claims(&**d, &key))
        .map(|d| (d.name_any(), d.deployment()))
        .collect();
    for name in ctx.written.deployments.names_in(namespace) {
        let cached = ctx
            .deployments
            .get(&ObjectRef::new(&name).within(namespace));
        match ctx.written.deployments.newest(namespace, &name, cached) {
            Some(d) if claims(&*d, &key) => {
                claimed.insert(name, d.deployment());
            }
            _ => {
                claimed.remove(&name);
            }
        }
    }
    if let Some(t) = &target
        && claims(t, &key)
    {
        claimed.insert(t.name_any(), t.clone());
    }
    for (name, d) in &fresh.deployments {
        match d {
            Some(d) if claims(d, &key) => {
                claimed.insert(name.clone(), d.clone());
            }
            _ => {
                claimed.remove(name);
            }
        }
    }
    let mut claimed: Vec<Deployment> = claimed.into_values().collect();
    claimed.sort_by_key(|d| d.name_any());

    let mut config_maps: HashMap<String, ConfigMap> = HashMap::new();
    for cm in ctx.config_maps.in_namespace(namespace) {
        if owns(&*cm, view, &key) {
            config_maps.insert(cm.name_any(), cm.config_map());
        }
    }
    // A name the cache lacks is not read here: a decision that would
    // write is made again on live reads of every name first (`read_live`),
    // which is what keeps a foreign ConfigMap of that name from being
    // overwritten, and a pointer not yet written (it waits for the rollout)
    // costs no request per resync.
    for name in rollout::config_map_names(view) {
        if config_maps.contains_key(&name) || fresh.config_maps.contains_key(&name) {
            continue;
        }
        if let Some(cm) = ctx
            .config_maps
            .get(&ObjectRef::new(&name).within(namespace))
        {
            config_maps.insert(name, cm.config_map());
        }
    }
    for name in ctx.written.config_maps.names_in(namespace) {
        let cached = ctx
            .config_maps
            .get(&ObjectRef::new(&name).within(namespace));
        match ctx.written.config_maps.newest(namespace, &name, cached) {
            Some(cm) if owns(&*cm, view, &key) || config_maps.contains_key(&name) => {
                config_maps.insert(name, cm.config_map());
            }
            Some(_) => {}
            None => {
                config_maps.remove(&name);
            }
        }
    }
    for (name, cm) in &fresh.config_maps {
        match cm {
            Some(cm) => config_maps.insert(name.clone(), cm.clone()),
            None => config_maps.remove(name),
        };
    }
    let mut config_maps: Vec<ConfigMap> = config_maps.into_values().collect();
    config_maps.sort_by_key(|c| c.name_any());

    let rivals = ctx
        .models
        .in_namespace(namespace)
        .into_iter()
        .filter(|m| {
            rollout::is_rival(
                view,
                m.metadata.namespace.as_deref().unwrap_or_default(),
                m.metadata.name.as_deref().unwrap_or_default(),
                m.target_name(),
            )
        })
        .map(|m| Rival {
            key: format!("{namespace}/{}", m.name_any()),
            created: m.metadata.creation_timestamp.clone(),
        })
        .collect();

    let autoscalers: Vec<HorizontalPodAutoscaler> = ctx
        .autoscalers
        .in_namespace(namespace)
        .iter()
        .filter(|h| rollout::autoscaling::concerns(h, &view.id(), &target_name))
        .map(|h| (**h).clone())
        .collect();

    let mut snapshot_uses: Vec<rollout::SnapshotUse> = ctx
        .replica_sets
        .in_namespace(namespace)
        .iter()
        .filter_map(|rs| {
            let short = rs.labels().get(MANIFEST_SNAPSHOT_LABEL)?.clone();
            Some(rollout::SnapshotUse {
                short,
                config_map: rs.preload_config_map().map(str::to_owned),
                replica_set: rs.name_any(),
                has_pods: rs.has_pods(),
                deployment: rs.deployment_uid().map(str::to_owned),
                revision: rs.revision().map(str::to_owned),
            })
        })
        .collect();
    snapshot_uses.sort();
    snapshot_uses.dedup();

    let mut pods: Vec<rollout::pods::PodView> = ctx
        .pods
        .in_namespace(namespace)
        .iter()
        .map(|p| rollout::pods::PodView::of(p))
        .filter(|p| !fresh.pods.contains_key(&p.name))
        .collect();
    pods.extend(fresh.pods.values().flatten().cloned());

    Ok(World {
        target,
        canary_target,
        route,
        claimed,
        config_maps,
        rivals,
        autoscalers,
        scaled_object: ctx.scaled_objects.as_ref().and_then(|objects| {
            objects
                .in_namespace(namespace)
                .iter()
                .find(|o| o.metadata.name.as_deref() == Some(view.name.as_str()))
                .map(|o| o.to_value())
        }),
        snapshot_uses,
        pods,
    })
}

/// Replaces the status through the status subresource. The object carries
/// its resourceVersion, so a concurrent writer makes this fail with a
/// conflict instead of being overwritten.
async fn write_status(
    api: &Api<RawModel>,
    current: &RawModel,
    status: &OpenMedModelStatus,
    ctx: &Context,
) -> Result<RawModel, kube::Error> {
    let mut next = current.clone();
    next.status = Some(JsonText::of(
        &serde_json::to_value(status).map_err(kube::Error::SerdeError)?,
    ));
    // Objects from a list or watch may lack their type; a replace needs it.
    next.types = Some(kube::api::TypeMeta {
        api_version: API_VERSION.to_owned(),
        kind: KIND.to_owned(),
    });
    ctx.metrics.wrote("openmedmodels/status", "update");
    let stored = api
        .replace_status(&current.name_any(), &PostParams::default(), &next)
        .await?;
    ctx.written.models.wrote(&stored);
    Ok(stored)
}

/// The resourceVersions a decision saw, which its writes are conditioned
/// on: a write to an object changed since fails with a conflict instead
/// of undoing that change.
struct Seen {
    deployments: HashMap<String, Option<String>>,
    config_maps: HashMap<String, Option<String>>,
}

impl Seen {
    fn of(world: &World) -> Self {
        let deployments = world
            .target
            .iter()
            .chain(&world.canary_target)
            .chain(&world.claimed)
            .map(|d| (d.name_any(), d.resource_version()))
            .collect();
        let config_maps = world
            .config_maps
            .iter()
            .map(|c| (c.name_any(), c.resource_version()))
            .collect();
        Seen {
            deployments,
            config_maps,
        }
    }

    /// Notes what a write returned: the next write to it in the same
    /// decision is conditioned on that.
    fn deployment_written(&mut self, stored: &Deployment) {
        self.deployments
            .insert(stored.name_any(), stored.resource_version());
    }
}

/// An apply body conditioned on `resource_version` (none: the object was
/// not there when decided).
fn at_version(body: &serde_json::Value, resource_version: Option<&String>) -> serde_json::Value {
    let mut body = body.clone();
    if let Some(rv) = resource_version {
        body["metadata"]["resourceVersion"] = serde_json::Value::String(rv.clone());
    }
    body
}

/// Carries out a decision's writes in order, each conditioned on what the
/// decision saw; stops at the first failure.
/// Notes a Deployment a write returned: in the recent writes (for the
/// caches), for the next write's precondition, and for the next decision.
fn deployment_written(
    ctx: &Context,
    seen: &mut Seen,
    fresh: &mut Fresh,
    name: &str,
    stored: Deployment,
) {
    ctx.written
        .deployments
        .wrote(&CachedDeployment::of(&stored));
    seen.deployment_written(&stored);
    fresh.deployments.insert(name.to_owned(), Some(stored));
}

/// Deletes `name` if it is still the object of `uid` (when known). One
/// already gone, or re-created since by another writer, is not ours to
/// delete, and is left alone.
async fn delete_if_same<K>(api: &Api<K>, name: &str, uid: &Option<String>) -> Result<(), Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let params = DeleteParams {
        preconditions: uid.clone().map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

async fn execute(
    writes: &[Write],
    namespace: &str,
    ctx: &Context,
    world: &World,
    fresh: &mut Fresh,
    now: &Time,
) -> Result<(), Error> {
    let apply = PatchParams::apply(FIELD_MANAGER).force();
    let mut seen = Seen::of(world);
    for write in writes {
        match write {
            Write::ApplyConfigMap(cm) => {
                let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), namespace);
                let name = cm.name_any();
                let stored = match seen.config_maps.get(&name).cloned().flatten() {
                    // Seen: applied at the version seen.
                    Some(rv) => {
                        let body = at_version(&serde_json::to_value(cm.as_ref())?, Some(&rv));
                        ctx.metrics.wrote("configmaps", "apply");
                        api.patch(&name, &apply, &Patch::Apply(&body)).await?
                    }
                    // Not seen: created, which fails if another writer's
                    // ConfigMap has the name (the caches hold only ours).
                    None => {
                        let params = PostParams {
                            field_manager: Some(FIELD_MANAGER.to_owned()),
                            ..PostParams::default()
                        };
                        ctx.metrics.wrote("configmaps", "create");
                        api.create(&params, cm.as_ref()).await?
                    }
                };
                ctx.written.config_maps.wrote(&CachedConfigMap::of(&stored));
                seen.config_maps
                    .insert(name.clone(), stored.resource_version());
                fresh.config_maps.insert(name, Some(stored));
            }
            Write::DeleteConfigMap { name, uid } => {
                let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), namespace);
                ctx.metrics.wrote("configmaps", "delete");
                delete_if_same(&api, name, uid).await?;
                ctx.written
                    .config_maps
                    .deleted(namespace, name, uid.clone());
                fresh.config_maps.insert(name.clone(), None);
            }
            Write::PatchRoute { name, patch } => {
                let patch: json_patch::Patch = serde_json::from_value(patch.clone())
                    .expect("decide writes a valid JSON Patch");
                let params = PatchParams {
                    field_manager: Some(FIELD_MANAGER.to_owned()),
                    ..PatchParams::default()
                };
                ctx.metrics.wrote("httproutes", "patch");
                let stored = routes(ctx, namespace)
                    .patch(name, &params, &Patch::Json::<()>(patch))
                    .await?;
                let stored = serde_json::to_value(stored).expect("an HTTPRoute serializes");
                fresh.routes.insert(name.clone(), Some(stored));
            }
            Write::MergePatchDeployment { name, patch } => {
                let api: Api<Deployment> = Api::namespaced(ctx.client.clone(), namespace);
                ctx.metrics.wrote("deployments", "patch");
                let params = PatchParams {
                    field_manager: Some(FIELD_MANAGER.to_owned()),
                    ..PatchParams::default()
                };
                let patch = at_version(patch, seen.deployments.get(name).and_then(Option::as_ref));
                let stored = api.patch(name, &params, &Patch::Merge(&patch)).await?;
                deployment_written(ctx, &mut seen, fresh, name, stored);
            }
            Write::StrategicPatchDeployment { name, patch } => {
                let api: Api<Deployment> = Api::namespaced(ctx.client.clone(), namespace);
                ctx.metrics.wrote("deployments", "patch");
                let params = PatchParams {
                    field_manager: Some(FIELD_MANAGER.to_owned()),
                    ..PatchParams::default()
                };
                let patch = at_version(patch, seen.deployments.get(name).and_then(Option::as_ref));
                match api.patch(name, &params, &Patch::Strategic(&patch)).await {
                    Ok(stored) => {
                        deployment_written(ctx, &mut seen, fresh, name, stored);
                    }
                    // Only sent for a release: a Deployment that is gone
                    // needs none.
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Write::ApplyAutoscaler(hpa) => {
                let api: Api<HorizontalPodAutoscaler> =
                    Api::namespaced(ctx.client.clone(), namespace);
                ctx.metrics.wrote("horizontalpodautoscalers", "apply");
                api.patch(&hpa.name_any(), &apply, &Patch::Apply(hpa.as_ref()))
                    .await?;
            }
            Write::DeleteAutoscaler { name, uid } => {
                let api: Api<HorizontalPodAutoscaler> =
                    Api::namespaced(ctx.client.clone(), namespace);
                ctx.metrics.wrote("horizontalpodautoscalers", "delete");
                delete_if_same(&api, name, uid).await?;
            }
            Write::ApplyScaledObject(object) => {
                let api: Api<super::scaled_object::ScaledObject> =
                    Api::namespaced(ctx.client.clone(), namespace);
                ctx.metrics.wrote("scaledobjects", "apply");
                let name = object["metadata"]["name"].as_str().unwrap_or_default();
                api.patch(name, &apply, &Patch::Apply(object.as_ref()))
                    .await?;
            }
            Write::DeleteScaledObject { name, uid } => {
                let api: Api<super::scaled_object::ScaledObject> =
                    Api::namespaced(ctx.client.clone(), namespace);
                ctx.metrics.wrote("scaledobjects", "delete");
                delete_if_same(&api, name, uid).await?;
            }
            Write::HandOverReplicas { name, replicas } => {
                let api: Api<Deployment> = Api::namespaced(ctx.client.clone(), namespace);
                let body = serde_json::json!({
                    "apiVersion": "apps/v1", "kind": "Deployment",
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": {"replicas": replicas},
                });
                ctx.metrics.wrote("deployments", "apply");
                let params = PatchParams::apply(REPLICAS_HANDOVER_FIELD_MANAGER);
                match api.patch(name, &params, &Patch::Apply(&body)).await {
                    Ok(stored) => {
                        deployment_written(ctx, &mut seen, fresh, name, stored);
                    }
                    // Another manager set another value meanwhile and owns
                    // the field: nothing is left to hand over.
                    Err(kube::Error::Api(s)) if s.code == 409 => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Write::MarkPod {
                name,
                passed,
                reason,
                message,
            } => {
                let api: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
                let patch = serde_json::json!({"status": {"conditions": [{
                    "type": QUALITY_CONDITION,
                    "status": if *passed { "True" } else { "False" },
                    "reason": reason,
                    "message": message,
                    "lastTransitionTime": now,
                }]}});
                ctx.metrics.wrote("pods/status", "patch");
                let marked = api
                    .patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
                    .await;
                match marked {
                    Ok(stored) => {
                        let view = rollout::pods::PodView::of(&stored);
                        fresh.pods.insert(name.clone(), Some(view));
                    }
                    // Gone meanwhile: nothing is left to judge.
                    Err(kube::Error::Api(s)) if s.code == 404 => {
                        fresh.pods.insert(name.clone(), None);
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            Write::ApplyDeployment {
                name,
                body,
                release,
            } => {
                let api: Api<Deployment> = Api::namespaced(ctx.client.clone(), namespace);
                ctx.metrics.wrote("deployments", "apply");
                let body = at_version(body, seen.deployments.get(name).and_then(Option::as_ref));
                match api.patch(name, &apply, &Patch::Apply(&body)).await {
                    Ok(stored) => {
                        deployment_written(ctx, &mut seen, fresh, name, stored);
                    }
                    // A Deployment deleted meanwhile needs no release: an
                    // apply would try to create it, which the operator may
                    // not (403) and could not (422, no selector). Any other
                    // refusal, a 403 on a Deployment that exists or a 429,
                    // fails: what depends on the release waits for it.
                    Err(kube::Error::Api(s))
                        if *release
                            && (s.code == 404
                                || (matches!(s.code, 403 | 422)
                                    && api.get_opt(name).await?.is_none())) =>
                    {
                        info!(deployment = %name, "the Deployment to release is gone");
                        fresh.deployments.insert(name.clone(), None);
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_one_second_to_one_minute() {
        let delays: Vec<u64> = (1..=9).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(backoff(u32::MAX), Duration::from_secs(60));
    }

    #[test]
    fn a_status_conflict_and_a_decision_that_never_settles_are_errors_that_back_off() {
        // Both used to requeue after 1 s as a success, resetting the backoff.
        let conflict = Error::Api(kube::Error::Api(Box::new(
            kube::core::Status::failure("the object has been modified", "Conflict").with_code(409),
        )));
        assert_eq!(conflict.category(), "conflict");
        let stuck = Error::NotConverged("apply Deployment svc".into());
        assert_eq!(stuck.category(), "not-converged");
        assert!(stuck.to_string().contains("apply Deployment svc"));
    }
}
