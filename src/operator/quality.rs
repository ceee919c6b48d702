//! The quality gate, the shell: carries out the probe rounds the core
//! plans (`rollout::quality::probe_plan`) and hands back what the pods
//! answered, for `decide` to judge. It decides nothing and writes nothing:
//! a pod's mark is a write of the decision (`Write::MarkPod`), its Events
//! are the decision's.
//!
//! A gathering: each round's probe set read live from its ConfigMap, then
//! every text sent once to each pod of the round, the pods at once and
//! each pod's texts one after another. Opt-in: without `spec.qualityGate` or canary probes
//! nothing is planned and nothing here runs. Requests, texts and answers
//! never reach a log, an Event or the status: only the figures do.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::Api;

use super::metrics::Metrics;
use super::probe::Prober;
use crate::api::quality::{PROBE_SET_KEY, ProbeSet, parse_probe_set};
use crate::rollout::quality::{self, Answer, PodAnswer, PodProbe, ProbeRound, RoundPlan};

/// How long one probe request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Carries out `plans` in `namespace`: each probe set read once, each
/// round's requests sent. Every round comes back, with what its pods
/// answered.
pub async fn gather(
    client: &Client,
    namespace: &str,
    prober: &Prober,
    metrics: &Metrics,
    plans: Vec<RoundPlan>,
) -> Vec<ProbeRound> {
    if plans.is_empty() {
        return Vec::new();
    }
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let mut names: Vec<String> = plans
        .iter()
        .map(|p| p.gate.config_map_ref.name.clone())
        .collect();
    names.sort();
    names.dedup();
    let api = &api;
    let reads = names
        .iter()
        .map(|name| async move { (name.clone(), probe_set(api, name).await) });
    let sets: BTreeMap<String, Result<ProbeSet, String>> =
        join_all(reads).await.into_iter().collect();
    join_all(plans.into_iter().map(|plan| {
        let set = sets[&plan.gate.config_map_ref.name].clone();
        async move {
            let answers = match &set {
                Ok(set) => ask(prober, metrics, set, &plan.requests).await,
                Err(_) => Vec::new(),
            };
            ProbeRound { plan, set, answers }
        }
    }))
    .await
}

/// Sends `set` to every pod of `requests` at once.
pub async fn ask(
    prober: &Prober,
    metrics: &Metrics,
    set: &ProbeSet,
    requests: &[PodProbe],
) -> Vec<PodAnswer> {
    join_all(requests.iter().map(|probe| async move {
        let scores = round(prober, metrics, set, probe).await;
        PodAnswer {
            pod: probe.pod.clone(),
            scores,
        }
    }))
    .await
}

/// Sends every text to one pod, one after another, and scores the answers.
async fn round(
    prober: &Prober,
    metrics: &Metrics,
    set: &ProbeSet,
    probe: &PodProbe,
) -> Result<quality::Scores, String> {
    let mut answers = Vec::with_capacity(set.probes.len());
    let (mut answered, mut failed) = (0, 0);
    for p in &set.probes {
        let body = quality::request(set, &p.text, &probe.version);
        let answer = prober
            .extract(&probe.url, probe.host.as_deref(), &body, REQUEST_TIMEOUT)
            .await;
        let stop = matches!(answer, Answer::Failed(_));
        if stop {
            failed += 1;
        } else {
            answered += 1;
        }
        answers.push(answer);
        if stop {
            break; // the round is inconclusive already
        }
    }
    metrics.quality_probes(answered, failed);
    quality::score(set, &answers)
}

/// Reads the probe set from its ConfigMap, live: it is read once per
/// gathering that has a pod to probe.
async fn probe_set(api: &Api<ConfigMap>, name: &str) -> Result<ProbeSet, String> {
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
