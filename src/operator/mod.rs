//! `openmed-op run`: the operator shell.
//!
//! It watches OpenMedModels, and through label-selected watches only the
//! Deployments and ConfigMaps it manages and the ReplicaSets whose template
//! reads one of its snapshots (memory grows with managed objects, not with
//! the cluster), keeps them in caches, and reconciles each
//! OpenMedModel with [`reconcile::reconcile`]. A steady resource is looked
//! at again every `--resync` from the caches: no reads, no writes. The only
//! network peer is the Kubernetes API server.

mod by_namespace;
mod config_map;
mod deployment;
mod events;
mod health;
mod http;
mod json_text;
pub mod leader;
mod metrics;
mod model;
mod probe;
mod quality;
mod recent;
mod reconcile;
mod replica_set;
mod retry;
mod scaled_object;
mod settled;
mod synced;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::client::ClientBuilder;
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use tracing::{error, info, warn};

pub use model::RawModel;

use crate::api::names::{
    FIELD_MANAGER, MANAGED_BY_LABEL, MANIFEST_SNAPSHOT_LABEL, MODEL_RESOURCE_ANNOTATION,
    OPERATED_BY_LABEL, PRELOAD_ENV, SERVED_ENV,
};
use crate::api::quality::QUALITY_CONDITION;
use crate::rollout::Settings;
use crate::rollout::pods::PodView;
use by_namespace::ByNamespace;
use health::Health;
use leader::{Fence, FenceLayer};
use metrics::Metrics;
use reconcile::Context;
use synced::{Cache, Synced};

/// The User-Agent of every request the operator sends.
pub const USER_AGENT: &str = concat!("openmed-operator/", env!("CARGO_PKG_VERSION"));

/// How the operator runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// Namespaces to watch; empty means all.
    pub namespaces: Vec<String>,
    /// How often a steady resource is re-examined from the caches.
    pub resync: Duration,
    /// Address of `/healthz` and `/metrics`.
    pub listen: SocketAddr,
    /// How many resources are reconciled at once, which bounds the
    /// operator's memory and its burst of requests when many change.
    pub concurrency: u16,
    /// Policy switches.
    pub settings: Settings,
    /// Leader election; `None`: this instance always acts.
    pub leader_election: Option<LeaderElection>,
}

/// Leader election, as kube-controller-manager's `--leader-elect-*` flags
/// set it.
#[derive(Debug, Clone)]
pub struct LeaderElection {
    /// The Lease's name.
    pub name: String,
    /// The Lease's namespace; `None`: the pod's (`POD_NAMESPACE`, from the
    /// downward API), else the kubeconfig's.
    pub namespace: Option<String>,
    /// Lease duration, renew deadline, retry period.
    pub timing: leader::Timing,
}

/// The process stops because it lost the leader Lease: it exits non-zero,
/// so it restarts as a clean follower.
#[derive(Debug, thiserror::Error)]
#[error("lost the leader lease; stopped so that the restart follows clean")]
pub struct LostLease;

/// Time limits of one request (not of a watch, which the watcher bounds
/// with its own idle timeout): a server that stops answering fails the
/// reconcile, which backs off and retries, instead of hanging a worker.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Retries of a request the API server asked to repeat (429, 503, 504),
/// or of a read answered 500: the first after 100 ms, doubling to 2 s, or
/// after its Retry-After.
const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(2);
const RETRIES: u32 = 3;

/// Runs until SIGTERM or SIGINT, then finishes the reconciles in flight.
pub async fn run(options: Options) -> Result<(), Box<dyn std::error::Error>> {
    let mut config = kube::Config::infer().await?;
    // A user agent of its own makes the operator's requests easy to pick
    // out in the API server's audit log and request metrics.
    // With leader election, it also names the instance, so the audit log
    // shows which one wrote.
    let identity = options.leader_election.as_ref().map(|_| leader::identity());
    let agent = identity
        .as_ref()
        .and_then(|id| ::http::HeaderValue::from_str(&format!("{USER_AGENT} ({id})")).ok())
        .unwrap_or(::http::HeaderValue::from_static(USER_AGENT));
    config.headers.push((::http::header::USER_AGENT, agent));
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    // Watches stay open for minutes with nothing to read: they get a
    // client without a read timeout, and every other request one with it.
    let watch_client = Client::try_from(config.clone())?;
    config.read_timeout = Some(REQUEST_TIMEOUT);
    config.write_timeout = Some(REQUEST_TIMEOUT);
    config.reset_reader_on_write = true;
    // The Lease is renewed through a client of its own: the fence below
    // must never stand between the leader and its renewal.
    let lease_client = Client::try_from(config.clone())?;
    let default_namespace = config.default_namespace.clone();
    let fence = Arc::new(match options.leader_election {
        None => Fence::always_open(),
        Some(_) => Fence::default(),
    });
    // With leader election, every write of a reconcile goes through the
    // fence. Answers that say "try again" (429, 503, 504), and a 500 to a
    // read, are retried a few times within the request, each attempt
    // through the fence (see `retry`): a transient error then costs
    // milliseconds, not a failed reconcile and its backoff. A retried write that had taken effect is harmless:
    // applies are idempotent, a status write meets 409 and decides again,
    // an event create meets 409 and is recognised as the same event.
    let retry = retry::Retry::new(RETRY_MIN, RETRY_MAX, RETRIES);
    let client = ClientBuilder::try_from(config)?
        .with_layer(&tower::util::option_layer(
            options
                .leader_election
                .as_ref()
                .map(|_| FenceLayer(fence.clone())),
        ))
        .with_layer(&tower::buffer::BufferLayer::new(1024))
        .with_layer(&tower::retry::RetryLayer::new(retry))
        .build();
    let metrics = Arc::new(Metrics::default());
    let signal = shutdown_signal().shared();
    let lost = lost_lease(fence.subscribe()).shared();
    let shutdown = futures::future::select(signal.clone(), lost.clone())
        .map(|_| ())
        .shared();
    let scopes: Vec<Option<String>> = if options.namespaces.is_empty() {
        vec![None]
    } else {
        options.namespaces.iter().cloned().map(Some).collect()
    };
    let health = Arc::new(Health::new(scopes.len()));
    let (addr, http) = http::serve(
        options.listen,
        metrics.clone(),
        health.clone(),
        shutdown.clone(),
    )
    .await?;
    info!(%addr, "serving /healthz, /readyz and /metrics");
    info!(
        namespaces = ?options.namespaces,
        resync = ?options.resync,
        require_target_label = options.settings.require_target_label,
        analysis_allow = ?options
            .settings
            .analysis_allow
            .prefixes()
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        leader_elect = options.leader_election.is_some(),
        "openmed-op operator starting"
    );
    // The election runs until the controllers have stopped, so a leader
    // that is asked to stop finishes its reconciles before it releases.
    let (stop_election, election_stopped) = tokio::sync::oneshot::channel::<()>();
    let election = match &options.leader_election {
        None => {
            metrics.leading("", true);
            None
        }
        Some(election) => {
            let namespace = election
                .namespace
                .clone()
                .or_else(|| {
                    std::env::var("POD_NAMESPACE")
                        .ok()
                        .filter(|n| !n.is_empty())
                })
                .unwrap_or(default_namespace);
            let identity = identity.clone().unwrap_or_else(leader::identity);
            info!(lease = %format!("{namespace}/{}", election.name), %identity, "leader election on");
            let name = election.name.clone();
            metrics.leading(&name, false);
            {
                let (metrics, mut leading) = (metrics.clone(), fence.subscribe());
                tokio::spawn(async move {
                    while leading.changed().await.is_ok() {
                        metrics.leading(&name, *leading.borrow());
                    }
                });
            }
            Some(tokio::spawn(leader::elect(
                Api::namespaced(lease_client, &namespace),
                election.name.clone(),
                identity,
                election.timing.clone(),
                fence.clone(),
                async move {
                    let _ = election_stopped.await;
                },
            )))
        }
    };
    let controllers = scopes.into_iter().map(|scope| {
        run_scope(
            Clients {
                requests: client.clone(),
                watches: watch_client.clone(),
            },
            health.clone(),
            scope,
            &options,
            metrics.clone(),
            fence.clone(),
            shutdown.clone(),
        )
    });
    futures::future::join_all(controllers).await;
    let _ = stop_election.send(());
    let ended = match election {
        Some(election) => Some(election.await?),
        None => None,
    };
    if let Err(e) = http.await? {
        warn!(error = %e, "metrics server stopped with an error");
    }
    if ended == Some(leader::Ended::Lost) {
        return Err(LostLease.into());
    }
    info!("stopped");
    Ok(())
}

/// Completes when this instance, having led, leads no more.
async fn lost_lease(mut leading: tokio::sync::watch::Receiver<bool>) {
    let lost = async {
        leading.wait_for(|leads| *leads).await.ok()?;
        leading.wait_for(|leads| !*leads).await.ok()
    };
    if lost.await.is_none() {
        // The fence is gone with the process: nothing to wait for.
        futures::future::pending::<()>().await;
    }
}

fn api<K>(client: &Client, scope: &Option<String>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match scope {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// The two clients: one whose requests time out, one for watches.
struct Clients {
    requests: Client,
    watches: Client,
}

/// Passes a watch stream through, recording each event or error in the
/// readiness state.
fn observed<T, E>(
    stream: impl futures::Stream<Item = Result<T, E>>,
    watch: String,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
) -> impl futures::Stream<Item = Result<T, E>> {
    stream.inspect(move |item| {
        health.observe(&watch, item.is_ok(), std::time::Instant::now());
        metrics.watches_failing(health.failing_watches());
    })
}

/// A watch's name in readiness reports: the resource, and the namespace
/// when the operator watches several one by one (a failure in one must not
/// be hidden by the others' successes).
fn watch_name(resource: &str, scope: &Option<String>) -> String {
    match scope {
        Some(namespace) => format!("{resource} in {namespace}"),
        None => resource.to_owned(),
    }
}

async fn run_scope(
    clients: Clients,
    health: Arc<Health>,
    scope: Option<String>,
    options: &Options,
    metrics: Arc<Metrics>,
    fence: Arc<Fence>,
    shutdown: futures::future::Shared<impl Future<Output = ()> + Send + 'static>,
) {
    let client = &clients.watches;
    let synced = Arc::new(Synced::new(options.settings.keda));
    let written = Arc::new(recent::Written::default());
    let (deployments, deployment_writer) = reflector::store();
    let deployments = ByNamespace::new(deployments);
    let deployment_events = observed(
        watcher(
            api::<deployment::CachedDeployment>(client, &scope),
            watcher::Config::default().labels(&format!("{OPERATED_BY_LABEL}={FIELD_MANAGER}")),
        )
        .default_backoff(),
        watch_name("deployments", &scope),
        health.clone(),
        metrics.clone(),
    )
    .modify(keep_own_apply_time)
    .reflect(deployment_writer)
    .inspect(deployments.observer())
    .inspect({
        let synced = synced.clone();
        move |e| synced.observe(Cache::Deployments, e)
    })
    .inspect({
        let written = written.clone();
        move |e| written.deployments.watch_event(e)
    })
    .touched_objects();

    let (config_maps, config_map_writer) = reflector::store();
    let config_maps = ByNamespace::new(config_maps);
    let config_map_events = observed(
        watcher(
            api::<config_map::CachedConfigMap>(client, &scope),
            watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={FIELD_MANAGER}")),
        )
        .default_backoff(),
        watch_name("configmaps", &scope),
        health.clone(),
        metrics.clone(),
    )
    .modify(forget_write_records)
    .reflect(config_map_writer)
    .inspect(config_maps.observer())
    .inspect({
        let synced = synced.clone();
        move |e| synced.observe(Cache::ConfigMaps, e)
    })
    .inspect({
        let written = written.clone();
        move |e| written.config_maps.watch_event(e)
    })
    .touched_objects();

    // Every HPA in scope is watched (no selector can pick those that scale
    // a managed Deployment), so each is cached as its scale target alone,
    // and only a change of that target wakes a model: an autoscaler's
    // status, rewritten every few seconds, costs nothing. A model's own
    // autoscaler is kept whole, and its counts wake its model.
    let (autoscalers, autoscaler_writer) = reflector::store();
    let autoscalers = ByNamespace::new(autoscalers);
    let autoscaler_events = observed(
        watcher(
            api::<HorizontalPodAutoscaler>(client, &scope),
            watcher::Config::default(),
        )
        .default_backoff(),
        watch_name("horizontalpodautoscalers", &scope),
        health.clone(),
        metrics.clone(),
    )
    .modify(keep_scale_target)
    .reflect(autoscaler_writer)
    .inspect(autoscalers.observer())
    .inspect({
        let synced = synced.clone();
        move |e| synced.observe(Cache::Autoscalers, e)
    })
    .touched_objects()
    .predicate_filter(scale_target, Default::default());

    // With --keda, every ScaledObject in scope (a user's of a model's name
    // must be seen, not written over); a change wakes the model named in
    // its annotation. Without, none is read, and nothing needs KEDA's CRD.
    let (scaled_objects, scaled_object_writer) = reflector::store();
    let scaled_objects = ByNamespace::new(scaled_objects);
    let scaled_object_events = if options.settings.keda {
        observed(
            watcher(
                api::<scaled_object::ScaledObject>(client, &scope),
                watcher::Config::default(),
            )
            .default_backoff(),
            watch_name("scaledobjects", &scope),
            health.clone(),
            metrics.clone(),
        )
        .modify(forget_write_records)
        .reflect(scaled_object_writer)
        .inspect(scaled_objects.observer())
        .inspect({
            let synced = synced.clone();
            move |e| synced.observe(Cache::ScaledObjects, e)
        })
        .touched_objects()
        .boxed()
    } else {
        futures::stream::pending().boxed()
    };

    // Only ReplicaSets whose template references a snapshot, cached as the
    // four fields read (`replica_set.rs`): their label says which snapshot
    // a revision reads, their counts whether a pod of it may start.
    let (replica_sets, replica_set_writer) = reflector::store();
    let replica_sets = ByNamespace::new(replica_sets);
    let replica_set_events = observed(
        watcher(
            api::<replica_set::CachedReplicaSet>(client, &scope),
            watcher::Config::default().labels(MANIFEST_SNAPSHOT_LABEL),
        )
        .default_backoff(),
        watch_name("replicasets", &scope),
        health.clone(),
        metrics.clone(),
    )
    .modify(replica_set::CachedReplicaSet::trim)
    .reflect(replica_set_writer)
    .inspect(replica_sets.observer())
    .inspect({
        let synced = synced.clone();
        move |e| synced.observe(Cache::ReplicaSets, e)
    })
    .touched_objects();

    // Only pods whose template references a snapshot (the targets' pods),
    // cached as name, labels and container statuses: whether a pod of the
    // template being rolled out keeps crashing, and what it said. Memory
    // grows with the managed pods, not with the cluster's.
    let (pods, pod_writer) = reflector::store();
    let pods = ByNamespace::new(pods);
    let pod_events = observed(
        watcher(
            api::<Pod>(client, &scope),
            watcher::Config::default().labels(MANIFEST_SNAPSHOT_LABEL),
        )
        .default_backoff(),
        watch_name("pods", &scope),
        health.clone(),
        metrics.clone(),
    )
    .modify(keep_container_statuses)
    .reflect(pod_writer)
    .inspect(pods.observer())
    .inspect({
        let synced = synced.clone();
        move |e| synced.observe(Cache::Pods, e)
    })
    .touched_objects()
    .predicate_filter(pod_view_hash, Default::default());

    let instance = std::env::var("POD_NAME").unwrap_or_else(|_| FIELD_MANAGER.to_owned());
    let recorder = events::Recorder::new(clients.requests.clone(), instance);
    let (models, model_writer) = reflector::store();
    let models = ByNamespace::new(models);
    let model_events = observed(
        watcher(api::<RawModel>(client, &scope), watcher::Config::default()).default_backoff(),
        watch_name("openmedmodels", &scope),
        health.clone(),
        metrics.clone(),
    )
    .modify(forget_write_records)
    .reflect(model_writer)
    .inspect(models.observer())
    .inspect({
        let synced = synced.clone();
        move |e| synced.observe(Cache::Models, e)
    })
    .inspect({
        let written = written.clone();
        move |e| written.models.watch_event(e)
    })
    .inspect({
        // Event counts go with their resource, whoever deleted it.
        let (recorder, models) = (recorder.clone(), models.clone());
        move |e| match e {
            Ok(watcher::Event::Delete(model)) => recorder.forget(model),
            Ok(watcher::Event::InitDone) => {
                let alive: std::collections::HashSet<String> =
                    models.state().iter().filter_map(|m| m.uid()).collect();
                recorder.keep_only(|uid| alive.contains(uid));
            }
            _ => {}
        }
    })
    .applied_objects();
    metrics.report_models({
        let models = models.clone();
        move || models.state().iter().map(|m| m.state()).collect()
    });
    let controller = Controller::for_stream(model_events, reflector::Store::clone(&models))
        .with_config(controller::Config::default().concurrency(options.concurrency));
    let client = clients.requests;
    let prober = probe::Prober::new(metrics.clone());
    let context = Arc::new(Context {
        client: client.clone(),
        models: models.clone(),
        deployments,
        config_maps,
        autoscalers,
        scaled_objects: options.settings.keda.then_some(scaled_objects),
        replica_sets,
        pods,
        settings: options.settings.clone(),
        resync: options.resync,
        metrics,
        recorder,
        failures: Mutex::new(std::collections::HashMap::new()),
        fence: fence.clone(),
        synced,
        prober,
        written,
        settled: settled::Settled::default(),
    });
    {
        // Ready once every cache of this scope holds a full list, however
        // long that takes (an API server down at start, RBAC fixed later).
        let (context, health) = (context.clone(), health.clone());
        tokio::spawn(async move {
            if reconcile::caches_synced(&context).await {
                health.synced();
            }
        });
    }
    controller
        .owns_stream(config_map_events)
        .watches_stream(
            deployment_events,
            |deployment: deployment::CachedDeployment| {
                // The annotation names the owner, `<namespace>/<name>`.
                let owner = deployment
                    .annotations()
                    .get(MODEL_RESOURCE_ANNOTATION)?
                    .clone();
                let (namespace, name) = owner.split_once('/')?;
                Some(ObjectRef::<RawModel>::new(name).within(namespace))
            },
        )
        .watches_stream(
            scaled_object_events,
            |object: scaled_object::ScaledObject| {
                let owner = object.annotations().get(MODEL_RESOURCE_ANNOTATION)?.clone();
                let (namespace, name) = owner.split_once('/')?;
                Some(ObjectRef::<RawModel>::new(name).within(namespace))
            },
        )
        // ReplicaSets only fill their cache: a snapshot they stop needing is
        // collected at the model's next resync.
        .watches_stream(replica_set_events, |_| None::<ObjectRef<RawModel>>)
        // A pod that restarted or exited, or whose model the quality gate
        // is to judge or failed, is looked at by the models of its
        // namespace. Pods coming and going are already Deployment status
        // changes: waking on them too would cut short the backoff of a
        // resource that keeps failing.
        .watches_stream(pod_events, {
            let models = models.clone();
            move |pod: Pod| {
                if !PodView::of(&pod).is_news() {
                    return Vec::new();
                }
                let namespace = pod.namespace().unwrap_or_default();
                models
                    .in_namespace(&namespace)
                    .into_iter()
                    .map(|m| ObjectRef::from_obj(&*m))
                    .collect::<Vec<_>>()
            }
        })
        .watches_stream(autoscaler_events, move |hpa: HorizontalPodAutoscaler| {
            let namespace = hpa.namespace().unwrap_or_default();
            let target = hpa
                .spec
                .map(|s| s.scale_target_ref.name)
                .unwrap_or_default();
            models
                .in_namespace(&namespace)
                .into_iter()
                .filter(|m| m.target_name() == target)
                .map(|m| ObjectRef::from_obj(&*m))
                .collect::<Vec<_>>()
        })
        // A follower's reconciles do nothing; when it takes over, every
        // resource in its (warm) caches is looked at once.
        .reconcile_all_on(became_leader(&fence))
        .graceful_shutdown_on(shutdown)
        .run(reconcile::reconcile, reconcile::error_policy, context)
        .for_each(|result| async move {
            if let Err(e) = result {
                match &e {
                    kube::runtime::controller::Error::ReconcilerFailed(..) => {}
                    other => error!(error = %other, "controller"),
                }
            }
        })
        .await;
}

/// Yields once, when this instance starts to lead.
fn became_leader(fence: &Fence) -> impl futures::Stream<Item = ()> + Send + 'static {
    let mut leading = fence.subscribe();
    futures::stream::once(async move { leading.wait_for(|leads| *leads).await.is_ok() })
        .filter_map(|led| std::future::ready(led.then_some(())))
}

/// Drops what records how an object was written rather than what it is,
/// before it is cached: `metadata.managedFields`, often the largest part of
/// an object, and the copy of the whole object that `kubectl apply` keeps
/// in an annotation (as do GitOps tools that apply the same way). `decide`
/// reads neither, and the caches hold half as much or less.
///
/// `None`, not an empty list: a status update sends the cached object back,
/// and an absent field is the one form every API server leaves alone. The
/// annotation is safe to drop for the same reason: a status update does
/// not change metadata, and every other write is a patch.
fn forget_write_records<K: ResourceExt>(object: &mut K) {
    object.meta_mut().managed_fields = None;
    forget_last_applied(object.meta_mut());
}

/// Drops the annotation where `kubectl apply` keeps the object as last
/// applied.
fn forget_last_applied(meta: &mut kube::core::ObjectMeta) {
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }
}

/// Of an object's metadata, keeps the one annotation `annotation` among
/// its annotations, and of its owners only its controller, when that is a
/// `kind` (which rollout made a pod, which Deployment a ReplicaSet).
pub(crate) fn keep_only(meta: &mut kube::core::ObjectMeta, annotation: &str, kind: &str) {
    meta.annotations = meta.annotations.take().and_then(|mut all| {
        let value = all.remove(annotation)?;
        Some(std::collections::BTreeMap::from([(
            annotation.to_owned(),
            value,
        )]))
    });
    meta.owner_references = meta.owner_references.take().and_then(|all| {
        let controller: Vec<_> = all
            .into_iter()
            .filter(|o| o.controller == Some(true) && o.kind == kind)
            .collect();
        (!controller.is_empty()).then_some(controller)
    });
}

/// Keeps of a pod what the core reads ([`PodView`]): name, namespace,
/// labels, the ownership annotation, its controlling ReplicaSet, creation
/// and deletion, its containers' restart counts, waits and last exits,
/// its address, and the conditions and readiness gate of the quality gate.
fn keep_container_statuses(pod: &mut Pod) {
    forget_write_records(pod);
    let meta = &mut pod.metadata;
    keep_only(meta, MODEL_RESOURCE_ANNOTATION, "ReplicaSet");
    let gates = pod.spec.take().and_then(|s| s.readiness_gates);
    pod.spec = gates.map(|gates| k8s_openapi::api::core::v1::PodSpec {
        readiness_gates: Some(gates),
        ..Default::default()
    });
    let status = pod.status.take().unwrap_or_default();
    let statuses = status.container_statuses;
    pod.status = Some(PodStatus {
        pod_ip: status.pod_ip,
        conditions: status.conditions.map(|all| {
            all.into_iter()
                .filter(|c| c.type_ == "ContainersReady" || c.type_ == QUALITY_CONDITION)
                .map(|mut c| {
                    c.last_probe_time = None;
                    c.last_transition_time = None;
                    c
                })
                .collect()
        }),
        container_statuses: statuses.map(|all| {
            all.into_iter()
                .map(|mut c| {
                    c.image_id = String::new();
                    c.resources = None;
                    c.volume_mounts = None;
                    c.allocated_resources = None;
                    c
                })
                .collect()
        }),
        ..PodStatus::default()
    });
}

/// Changes with what a decision reads of a pod (its [`PodView`]).
fn pod_view_hash(pod: &Pod) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    PodView::of(pod).hash(&mut hasher);
    Some(hasher.finish())
}

/// Keeps of an HPA what decisions read: of another writer's, its identity
/// and scale target (whether it scales a model's Deployment); of the
/// operator's own (`spec.autoscaling`), all but the field list, to see
/// drift and report its counts.
fn keep_scale_target(hpa: &mut HorizontalPodAutoscaler) {
    forget_write_records(hpa);
    if is_models(hpa) {
        return;
    }
    let meta = &mut hpa.metadata;
    meta.annotations = None;
    meta.labels = None;
    meta.owner_references = None;
    hpa.status = None;
    if let Some(spec) = hpa.spec.as_mut() {
        spec.metrics = None;
        spec.behavior = None;
    }
}

/// An autoscaler that says which model it is for: the operator's own.
fn is_models(hpa: &HorizontalPodAutoscaler) -> bool {
    hpa.annotations().contains_key(MODEL_RESOURCE_ANNOTATION)
}

/// What of an HPA wakes a model: its scale target (and its coming or
/// going), and of the operator's own, its spec and the counts and
/// condition its status reports (not its metric readings, which change
/// on every sync).
fn scale_target(hpa: &HorizontalPodAutoscaler) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    let target = hpa.spec.as_ref().map(|s| &s.scale_target_ref);
    target.map(|t| (&t.kind, &t.name)).hash(&mut hasher);
    if is_models(hpa) {
        serde_json::to_string(&hpa.spec).ok().hash(&mut hasher);
        hpa.metadata.labels.hash(&mut hasher);
        hpa.metadata.annotations.hash(&mut hasher);
        if let Some(status) = &hpa.status {
            (status.current_replicas, status.desired_replicas).hash(&mut hasher);
            let active = status
                .conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == "ScalingActive")
                .map(|c| (&c.status, &c.reason));
            active.hash(&mut hasher);
        }
    }
    Some(hasher.finish())
}

/// Like [`forget_write_records`], but keeps what decisions read of the
/// field list: of the operator's own last apply, its time and whether it
/// owns `spec.replicas` (`decide` judges a rollout's deadline from when
/// that write landed by the API server's clock, and hands `replicas` over
/// before an apply that stops sending it); of every other manager, only
/// whether it holds the fields the operator must not fight or must take
/// back: the ownership annotations, and the preload and served-set entries
/// of the containers ([`others_relevant_fields`]). After a restart the
/// cache is where it finds all of it.
fn keep_own_apply_time<K: ResourceExt>(deployment: &mut K) {
    forget_last_applied(deployment.meta_mut());
    let kept = deployment
        .meta_mut()
        .managed_fields
        .take()
        .into_iter()
        .flatten()
        .filter_map(|mut m| {
            let ours = m.manager.as_deref() == Some(FIELD_MANAGER);
            if ours
                && m.operation.as_deref() == Some("Apply")
                && m.subresource.as_deref().unwrap_or_default().is_empty()
            {
                let replicas = m
                    .fields_v1
                    .as_ref()
                    .is_some_and(|f| f.0.pointer("/f:spec/f:replicas").is_some());
                m.fields_v1 = replicas.then(|| {
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1(
                        serde_json::json!({"f:spec": {"f:replicas": {}}}),
                    )
                });
                return Some(m);
            }
            // The rest, the operator's own patches (Updates) among them:
            // the earlier operator patched under the same name.
            let fields = m
                .fields_v1
                .as_ref()
                .and_then(|f| others_relevant_fields(&f.0))?;
            m.fields_v1 = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1(
                fields,
            ));
            m.time = None;
            Some(m)
        })
        .collect::<Vec<_>>();
    deployment.meta_mut().managed_fields = (!kept.is_empty()).then_some(kept);
}

/// The part of another manager's field list a decision reads: the
/// `openmed.ai/model-resource` annotations (a release takes them back),
/// and each container's preload and served-set entries (`value`,
/// `valueFrom`: a release takes the preload reference back; a served set
/// another applier keeps is theirs). `None` when it holds none of them.
fn others_relevant_fields(fields: &serde_json::Value) -> Option<serde_json::Value> {
    use serde_json::{Map, Value, json};
    let annotation = format!("f:{MODEL_RESOURCE_ANNOTATION}");
    let mut out = Map::new();
    if fields
        .pointer("/f:metadata/f:annotations")
        .and_then(|a| a.get(&annotation))
        .is_some()
    {
        out.insert(
            "f:metadata".into(),
            json!({"f:annotations": {annotation.clone(): {}}}),
        );
    }
    let mut template = Map::new();
    if fields
        .pointer("/f:spec/f:template/f:metadata/f:annotations")
        .and_then(|a| a.get(&annotation))
        .is_some()
    {
        template.insert(
            "f:metadata".into(),
            json!({"f:annotations": {annotation: {}}}),
        );
    }
    let entries: Vec<String> = [PRELOAD_ENV, SERVED_ENV]
        .iter()
        .map(|name| format!("k:{}", json!({ "name": name })))
        .collect();
    let mut containers = Map::new();
    if let Some(Value::Object(all)) = fields.pointer("/f:spec/f:template/f:spec/f:containers") {
        for (key, container) in all {
            let mut env = Map::new();
            for entry in &entries {
                let Some(Value::Object(held)) =
                    container.pointer("/f:env").and_then(|e| e.get(entry))
                else {
                    continue;
                };
                let kept: Map<String, Value> = held
                    .iter()
                    .filter(|(k, _)| *k == "f:value" || *k == "f:valueFrom")
                    .map(|(k, _)| (k.clone(), json!({})))
                    .collect();
                if !kept.is_empty() {
                    env.insert(entry.clone(), Value::Object(kept));
                }
            }
            if !env.is_empty() {
                containers.insert(key.clone(), json!({ "f:env": env }));
            }
        }
    }
    if !containers.is_empty() {
        template.insert("f:spec".into(), json!({ "f:containers": containers }));
    }
    if !template.is_empty() {
        out.insert("f:spec".into(), json!({ "f:template": template }));
    }
    (!out.is_empty()).then_some(Value::Object(out))
}

/// Completes on SIGTERM (what Kubernetes sends) or SIGINT.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("a SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
    info!("shutting down: finishing reconciles in flight");
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::ConfigMap;
    use serde_json::json;

    #[test]
    fn what_records_a_write_is_not_cached_and_the_rest_is() {
        let last_applied = "kubectl.kubernetes.io/last-applied-configuration";
        let mut cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "m", "annotations": {last_applied: "{…}", "keep": "me"},
                "managedFields": [{"manager": "kubectl", "operation": "Update"}]},
            "data": {"k": "v"},
        }))
        .unwrap();
        forget_write_records(&mut cm);
        assert_eq!(cm.metadata.managed_fields, None);
        assert_eq!(
            cm.metadata.annotations,
            Some([("keep".to_owned(), "me".to_owned())].into())
        );
        assert_eq!(cm.data, Some([("k".to_owned(), "v".to_owned())].into()));

        let mut deployment: Deployment = serde_json::from_value(json!({
            "metadata": {"name": "d", "annotations": {last_applied: "{…}"}},
        }))
        .unwrap();
        keep_own_apply_time(&mut deployment);
        assert_eq!(deployment.metadata.annotations, None);
    }

    #[test]
    fn the_cache_keeps_which_fields_others_hold_that_decisions_read() {
        let preload = r#"k:{"name":"OPENMED_SERVICE_PRELOAD_MODELS"}"#;
        let served = r#"k:{"name":"OPENMED_SERVICE_SERVED_MODELS"}"#;
        let other = r#"k:{"name":"OTHER"}"#;
        let container = r#"k:{"name":"openmed-service"}"#;
        let mut deployment: Deployment = serde_json::from_value(json!({
            "metadata": {"name": "d", "managedFields": [
                {"manager": "openmed-operator", "operation": "Apply", "time": "2026-12-05T00:00:00Z",
                 "fieldsV1": {"f:spec": {"f:replicas": {}, "f:strategy": {}}}},
                {"manager": "Python-urllib", "operation": "Update", "time": "2026-12-05T00:00:00Z",
                 "fieldsV1": {
                    "f:metadata": {"f:annotations": {"f:openmed.ai/model-resource": {}, "f:x": {}}},
                    "f:spec": {"f:replicas": {}, "f:template": {
                        "f:metadata": {"f:annotations": {"f:openmed.ai/model-resource": {}}},
                        "f:spec": {"f:containers": {container: {
                            "f:image": {},
                            "f:env": {preload: {"f:valueFrom": {"f:configMapKeyRef": {}}, ".": {}},
                                      other: {"f:value": {}}},
                        }}},
                    }},
                 }},
                {"manager": "kustomize-controller", "operation": "Apply",
                 "fieldsV1": {"f:spec": {"f:template": {"f:spec": {"f:containers": {container: {
                    "f:env": {served: {"f:value": {}}}}}}}}}},
                {"manager": "kubectl", "operation": "Update",
                 "fieldsV1": {"f:spec": {"f:replicas": {}}}},
            ]},
        }))
        .unwrap();
        keep_own_apply_time(&mut deployment);
        let kept = serde_json::to_value(&deployment.metadata.managed_fields).unwrap();
        assert_eq!(
            kept,
            json!([
                {"manager": "openmed-operator", "operation": "Apply", "time": "2026-12-05T00:00:00Z",
                 "fieldsV1": {"f:spec": {"f:replicas": {}}}},
                {"manager": "Python-urllib", "operation": "Update",
                 "fieldsV1": {
                    "f:metadata": {"f:annotations": {"f:openmed.ai/model-resource": {}}},
                    "f:spec": {"f:template": {
                        "f:metadata": {"f:annotations": {"f:openmed.ai/model-resource": {}}},
                        "f:spec": {"f:containers": {container: {"f:env": {preload: {"f:valueFrom": {}}}}}},
                    }},
                 }},
                {"manager": "kustomize-controller", "operation": "Apply",
                 "fieldsV1": {"f:spec": {"f:template": {"f:spec": {"f:containers": {container: {
                    "f:env": {served: {"f:value": {}}}}}}}}}},
            ]),
            "ours trimmed to replicas; others' to the marks and entries decisions read; the rest gone"
        );
    }
}
