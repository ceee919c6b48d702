//! The quality gate, the shell: reads the probe set, sends it to the pods
//! `rollout::quality` names, and writes the condition it gives on each
//! judged pod (`pods/status`), with an Event on the OpenMedModel.
//!
//! Runs before the decisions of a reconcile, as the canary checks do: a
//! pod's mark is what `decide` reads to fail a rollout. Opt-in: without
//! `spec.qualityGate` nothing here sends a request. Each text goes once to
//! each pod per round; a pod that gave no usable answer stays unjudged
//! (and not Ready) and is probed again after
//! [`quality::RETRY_SECONDS`]. Requests, texts and answers never reach a
//! log, an Event or the status: only the figures do.

use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use serde_json::json;

use super::by_namespace::ByNamespace;
use super::model::RawModel;
use super::reconcile::Context;
use crate::api::quality::{
    PROBE_SET_KEY, ProbeSet, QUALITY_CONDITION, QualityGate, parse_probe_set,
};
use crate::rollout::analysis::{Check, Measurement, Reading};
use crate::rollout::pods::PodView;
use crate::rollout::quality::{self, Answer, PodProbe, Scores};
use crate::rollout::{Event, EventType, reason};

/// How long one probe request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Judges the pods of `resource` that await it; returns when to look
/// again if some could not be judged.
pub async fn judge_pods(resource: &RawModel, ctx: &Context) -> Option<Duration> {
    let view = resource.view();
    let (gate, container) = quality::gate_of(&view)?;
    let pods = pod_views(&ctx.pods, &view.namespace);
    let (port, host) = service_address(resource, ctx, &container)?;
    let due = quality::probes_due(&gate, &pods, &view.key(), port);
    if due.is_empty() {
        return None;
    }
    let retry = Some(Duration::from_secs(quality::RETRY_SECONDS));
    let set = match probe_set(ctx, &view.namespace, &gate).await {
        Ok(set) => set,
        Err(why) => {
            inconclusive(
                ctx,
                resource,
                format!("the probe set cannot be read: {why}"),
            )
            .await;
            return retry;
        }
    };
    let rounds = rounds(ctx, &view, &pods, &set, &due, host.as_deref()).await;
    let stable: Option<Scores> = rounds
        .iter()
        .find(|(p, _)| p.stable)
        .and_then(|(_, r)| r.as_ref().ok().cloned());
    let mut again = None;
    for (probe, scores) in rounds.iter().filter(|(p, _)| !p.stable) {
        match scores {
            Err(why) => {
                ctx.metrics.quality_judged("inconclusive");
                let message = format!("pod {}: no judgement this round: {why}", probe.pod);
                inconclusive(ctx, resource, message).await;
                again = retry;
            }
            Ok(scores) => {
                let verdict = quality::judge(&gate, &set, scores, stable.as_ref());
                let mark = quality::mark(&probe.pod, &verdict);
                if let Err(e) = write_mark(ctx, &view.namespace, &mark).await {
                    tracing::warn!(pod = %probe.pod, error = %e, "the quality gate's condition was not written");
                    again = retry;
                    continue;
                }
                ctx.metrics.quality_judged(mark.outcome());
                let event = mark.event();
                tell(ctx, resource, event.type_, event.reason, event.message).await;
            }
        }
    }
    again
}

/// Measures a canary's probes (`spec.canary.analysis.probes`): the probe
/// set sent to each ready canary pod, and a stable one with
/// `notWorseThanStable`, judged as one reading.
pub async fn measure_canary(resource: &RawModel, ctx: &Context, check: &Check) -> Measurement {
    let reading = match check {
        Check::Probes {
            gate,
            canary,
            stable,
        } => canary_reading(resource, ctx, gate, canary, stable.as_deref()).await,
        other => Reading::Failed(format!("{} is not a probe check", other.name())),
    };
    Measurement {
        name: check.name().to_owned(),
        reading,
    }
}

async fn canary_reading(
    resource: &RawModel,
    ctx: &Context,
    gate: &QualityGate,
    canary: &str,
    stable: Option<&str>,
) -> Reading {
    let view = resource.view();
    let pods = pod_views(&ctx.pods, &view.namespace);
    let container = quality::container_of(&view);
    let Some((port, host)) = service_address(resource, ctx, &container) else {
        return Reading::Failed("the service's port is not known (no container port)".into());
    };
    let due = quality::canary_probes(gate, &pods, &view.key(), canary, stable, port);
    let set = match probe_set(ctx, &view.namespace, gate).await {
        Ok(set) => set,
        Err(why) => return Reading::Failed(format!("the probe set cannot be read: {why}")),
    };
    let rounds = rounds(ctx, &view, &pods, &set, &due, host.as_deref()).await;
    let (outcome, message) = quality::judge_round(gate, &set, &rounds);
    Reading::Judged(outcome, message)
}

/// One round per pod, at once: each pod gets every text, one after another.
async fn rounds(
    ctx: &Context,
    view: &crate::rollout::ResourceView,
    pods: &[PodView],
    set: &ProbeSet,
    due: &[PodProbe],
    host: Option<&str>,
) -> Vec<(PodProbe, Result<Scores, String>)> {
    join_all(due.iter().map(|probe| {
        let version = pods
            .iter()
            .find(|p| p.name == probe.pod)
            .and_then(|p| p.snapshot.as_deref())
            .and_then(|s| quality::version_of(view, s));
        async move {
            let scores = round(ctx, set, probe, host, version.as_deref()).await;
            (probe.clone(), scores)
        }
    }))
    .await
}

/// The port the gate asks the service's pods at, and the Host it sends,
/// from the target Deployment in the cache.
fn service_address(
    resource: &RawModel,
    ctx: &Context,
    container: &str,
) -> Option<(i32, Option<String>)> {
    let namespace = resource.metadata.namespace.as_deref();
    let target = ctx
        .deployments
        .get(&ObjectRef::new(resource.target_name()).within(namespace?))?
        .deployment();
    let port = quality::service_port(&target, container)?;
    Some((port, quality::service_host(&target, container)))
}

/// The pods of `namespace` in the cache, as the core reads them.
fn pod_views(pods: &ByNamespace<Pod>, namespace: &str) -> Vec<PodView> {
    pods.in_namespace(namespace)
        .iter()
        .map(|p| PodView::of(p))
        .collect()
}

/// Reads the probe set from its ConfigMap (live: it is read once per round
/// that has a pod to judge).
async fn probe_set(ctx: &Context, namespace: &str, gate: &QualityGate) -> Result<ProbeSet, String> {
    let name = &gate.config_map_ref.name;
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), namespace);
    let cm = api
        .get_opt(name)
        .await
        .map_err(|e| format!("ConfigMap {name}: {e}"))?
        .ok_or_else(|| format!("ConfigMap {name} does not exist"))?;
    let text = cm
        .data
        .as_ref()
        .and_then(|d| d.get(PROBE_SET_KEY))
        .ok_or_else(|| format!("ConfigMap {name} has no key {PROBE_SET_KEY}"))?;
    let origin = format!("ConfigMap {name} key {PROBE_SET_KEY}");
    let docs = crate::source::parse_stream(&origin, text).map_err(|e| e.to_string())?;
    let [doc] = docs.as_slice() else {
        return Err(format!("{origin}: holds {} documents, not one", docs.len()));
    };
    parse_probe_set(&doc.value).map_err(|errors| {
        let first = errors.iter().map(ToString::to_string).collect::<Vec<_>>();
        format!("{origin}: {}", first.join("; "))
    })
}

/// Sends every text to one pod, one after another, and scores the answers.
async fn round(
    ctx: &Context,
    set: &ProbeSet,
    probe: &PodProbe,
    host: Option<&str>,
    version: Option<&str>,
) -> Result<Scores, String> {
    let version = version.ok_or("its template's version is not one this resource knows")?;
    let mut answers = Vec::with_capacity(set.probes.len());
    let (mut answered, mut failed) = (0, 0);
    for p in &set.probes {
        let body = quality::request(set, &p.text, version);
        let answer = ctx
            .prober
            .extract(&probe.url, host, &body, REQUEST_TIMEOUT)
            .await;
        match &answer {
            Answer::Found(_) => answered += 1,
            Answer::Failed(_) => failed += 1,
        }
        let stop = matches!(answer, Answer::Failed(_));
        answers.push(answer);
        if stop {
            break; // the round is inconclusive already
        }
    }
    ctx.metrics.quality_probes(answered, failed);
    quality::score(set, &answers)
}

/// Sets the gate's condition on the pod (`pods/status`, a strategic merge
/// on `conditions`, keyed by type).
async fn write_mark(
    ctx: &Context,
    namespace: &str,
    mark: &quality::Mark,
) -> Result<(), kube::Error> {
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    let now = k8s_openapi::jiff::Timestamp::now();
    let patch = json!({"status": {"conditions": [{
        "type": QUALITY_CONDITION,
        "status": if mark.passed { "True" } else { "False" },
        "reason": mark.reason,
        "message": mark.message,
        "lastTransitionTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now),
    }]}});
    api.patch_status(&mark.pod, &PatchParams::default(), &Patch::Strategic(patch))
        .await?;
    ctx.metrics.wrote("pods/status", "patch");
    Ok(())
}

/// A Warning that a round judged nothing: the pods wait, unready.
async fn inconclusive(ctx: &Context, resource: &RawModel, message: String) {
    let why = reason::QUALITY_GATE_INCONCLUSIVE;
    tell(ctx, resource, EventType::Warning, why, message).await;
}

async fn tell(
    ctx: &Context,
    resource: &RawModel,
    type_: EventType,
    reason: &'static str,
    message: String,
) {
    let event = Event {
        type_,
        reason,
        message,
    };
    if let Err(e) = ctx.recorder.record(resource, &event).await {
        tracing::warn!(error = %e, reason, "an Event was not recorded");
    }
}
