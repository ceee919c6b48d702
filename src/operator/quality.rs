//! The quality gate, the shell: carries out the probe rounds the core
//! plans (`rollout::quality::probe_plan`) and hands back what the pods
//! answered, for `decide` to judge. It decides nothing and writes nothing:
//! a pod's mark is a write of the decision (`Write::MarkPod`), its Events
//! are the decision's.
//!
//! A gathering: each round's probe set read live from its ConfigMap, then
//! every text sent once to each pod of the round, the pods at once and
//! each pod's texts one after another. All of it is bounded by one
//! deadline, the one analysis readings have: a reconcile holds a worker
//! that every resource shares, and a pod that never answers must not hold
//! it longer. A pod whose round is not over in time has no answer, which
//! is never a pass. Opt-in: without `spec.qualityGate` or canary probes
//! nothing is planned and nothing here runs. Requests, texts and answers
//! never reach a log, an Event or the status: only the figures do.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::Api;
use tokio::time::Instant;

use super::metrics::Metrics;
use super::probe::Prober;
use crate::api::quality::{PROBE_SET_KEY, ProbeSet, parse_probe_set};
use crate::rollout::quality::{self, Answer, PodAnswer, PodProbe, ProbeRound, RoundPlan};

/// How long one probe request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Carries out `plans` in `namespace` within `deadline`: each probe set
/// read once, each round's requests sent. Every round comes back, with
/// what its pods answered in time.
pub async fn gather(
    client: &Client,
    namespace: &str,
    prober: &Prober,
    metrics: &Metrics,
    plans: Vec<RoundPlan>,
    deadline: Duration,
) -> Vec<ProbeRound> {
    if plans.is_empty() {
        return Vec::new();
    }
    let until = Instant::now() + deadline;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let mut names: Vec<String> = plans
        .iter()
        .map(|p| p.gate.config_map_ref.name.clone())
        .collect();
    names.sort();
    names.dedup();
    let api = &api;
    let reads = names.iter().map(|name| async move {
        let read = match tokio::time::timeout_at(until, probe_set(api, name)).await {
            Ok(read) => read,
            Err(_) => Err(format!("ConfigMap {name}: no answer within {deadline:?}")),
        };
        (name.clone(), read)
    });
    let sets: BTreeMap<String, Result<ProbeSet, String>> =
        join_all(reads).await.into_iter().collect();
    join_all(plans.into_iter().map(|plan| {
        let set = sets[&plan.gate.config_map_ref.name].clone();
        async move {
            let answers = match &set {
                Ok(set) => ask(prober, metrics, set, &plan.requests, until).await,
                Err(_) => Vec::new(),
            };
            ProbeRound { plan, set, answers }
        }
    }))
    .await
}

/// Sends `set` to every pod of `requests` at once; a pod whose round is
/// not over at `until` has no answer.
pub async fn ask(
    prober: &Prober,
    metrics: &Metrics,
    set: &ProbeSet,
    requests: &[PodProbe],
    until: Instant,
) -> Vec<PodAnswer> {
    join_all(requests.iter().map(|probe| async move {
        let asked = round(prober, metrics, set, probe);
        let scores = match tokio::time::timeout_at(until, asked).await {
            Ok(scores) => scores,
            Err(_) => {
                Err("no answer in time: the round was not over by the gathering's deadline".into())
            }
        };
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

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::net::SocketAddr;

    use bytes::Bytes;
    use http_body_util::Full;
    use hyper::Response;
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    use serde_json::json;

    use super::*;

    /// A listener on 127.0.0.1 that accepts connections and never answers.
    async fn silent() -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        addr
    }

    /// An OpenMed service on 127.0.0.1 that tags the DATE of every text.
    async fn service() -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let service = service_fn(|_| async {
                        let body = json!({"entities": [{"label": "DATE", "start": 8, "end": 18}]});
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(body.to_string()))))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        addr
    }

    fn probe_to(pod: &str, addr: SocketAddr) -> PodProbe {
        PodProbe {
            pod: pod.into(),
            url: format!("http://{addr}/pii/extract"),
            host: None,
            version: "OpenMed/v2".into(),
            stable: false,
        }
    }

    #[tokio::test]
    async fn a_pod_that_never_answers_has_no_answer_once_the_deadline_is_reached() {
        let set = parse_probe_set(&json!({
            "apiVersion": "openmed.ai/v1alpha1", "kind": "PIIProbeSet",
            "probes": [{"text": "Seen on 2024-03-15.", "entities": [{"label": "DATE", "start": 8, "end": 18}]}],
        }))
        .unwrap();
        let requests = [
            probe_to("silent", silent().await),
            probe_to("answers", service().await),
        ];
        let metrics = std::sync::Arc::new(Metrics::default());
        let until = Instant::now() + Duration::from_millis(300);
        // A guard against hanging the test run, not a measurement: each
        // request alone may take far longer than the deadline.
        let answers = tokio::time::timeout(
            Duration::from_secs(120),
            ask(
                &Prober::new(metrics.clone()),
                &metrics,
                &set,
                &requests,
                until,
            ),
        )
        .await
        .expect("the gathering returned");
        assert_eq!(
            answers[0],
            PodAnswer {
                pod: "silent".into(),
                scores: Err(
                    "no answer in time: the round was not over by the gathering's deadline".into()
                ),
            },
            "no answer is never a pass"
        );
        let scores = answers[1]
            .scores
            .as_ref()
            .expect("the other pod's answer is kept");
        assert_eq!(scores.summary(), "DATE recall 1.00 (1/1) precision 1.00");
    }
}
