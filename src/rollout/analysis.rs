//! Canary analysis, the pure part: which checks are due, what exactly to
//! ask, and what an answer means.
//!
//! The operator shell asks ([`Check`]) and reports what it got back
//! ([`Reading`]); `decide` judges the readings. No data is never a pass: an
//! empty result, NaN, more than one sample, an error or no answer is
//! inconclusive, which holds the step without counting as a failure.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};
use url::Url;

use crate::api::endpoints::{AllowList, redact};
use crate::api::{Analysis, CanaryStatus, Metric, Outcome, TrafficRef, rules};

/// One check the shell is to run now, at an endpoint the allow list
/// allowed: the shell sends exactly this URL.
#[derive(Debug, Clone, PartialEq)]
pub enum Check {
    /// A PromQL instant query: `GET url?query=...`.
    Prometheus {
        /// The metric's name.
        name: String,
        /// The Prometheus address's `/api/v1/query`.
        url: Url,
        /// The query, placeholders filled in.
        query: String,
    },
    /// The probe set sent to the canary's ready pods (and one stable pod
    /// with `notWorseThanStable`): not an endpoint the shell asks, but a
    /// probe round [`super::quality::probe_plan`] plans.
    Probes {
        /// The gate's fields. Which pods are the canary's and which the
        /// stable Deployment's is told by their ReplicaSets, as observed.
        gate: crate::api::QualityGate,
    },
    /// A POST of `body` (JSON) to `url`.
    Webhook {
        /// The webhook's name.
        name: String,
        /// Where to POST.
        url: Url,
        /// How long to wait for the answer, at most
        /// [`rules::WEBHOOK_TIMEOUT_MAX`].
        timeout: Duration,
        /// The canary's state.
        body: Value,
    },
}

impl Check {
    /// The metric's or webhook's name.
    pub fn name(&self) -> &str {
        match self {
            Check::Prometheus { name, .. } | Check::Webhook { name, .. } => name,
            Check::Probes { .. } => PROBES,
        }
    }
}

/// What a check got back.
#[derive(Debug, Clone, PartialEq)]
pub enum Reading {
    /// A query's one sample.
    Sample(f64),
    /// A query that returned no sample.
    NoData,
    /// A query that returned more than one sample.
    Several(usize),
    /// A webhook's HTTP status.
    Answer(u16),
    /// No usable answer: a connection error, a timeout, an HTTP or
    /// Prometheus error.
    Failed(String),
    /// The probes' verdict over the canary's pods, judged from the
    /// round's answers ([`super::quality::canary_reading`]).
    Judged(Outcome, String),
}

/// The name of the probes' measurement.
pub const PROBES: &str = "probes";

/// One check's reading, as the shell hands it to `decide`.
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    /// The check's name.
    pub name: String,
    /// What it got back.
    pub reading: Reading,
}

/// What fills the placeholders of a query and the webhook body.
#[derive(Debug, Clone)]
pub struct Subject<'a> {
    /// `<namespace>/<name>` of the resource.
    pub resource: &'a str,
    /// The namespace.
    pub namespace: &'a str,
    /// The route and backends.
    pub traffic: &'a TrafficRef,
    /// The version under test.
    pub version: &'a str,
    /// The stable version.
    pub stable_version: &'a str,
    /// The step, from 1.
    pub step: i32,
    /// The canary's share of the traffic.
    pub weight: i32,
    /// In a mirror step, the percent of requests copied to the canary.
    pub mirror: Option<i32>,
}

/// Fills `{{canary}}`, `{{stable}}`, `{{route}}`, `{{namespace}}` and
/// `{{version}}`.
pub fn fill(query: &str, subject: &Subject) -> String {
    query
        .replace("{{canary}}", &subject.traffic.canary_backend)
        .replace("{{route}}", &subject.traffic.http_route)
        .replace("{{stable}}", &subject.traffic.stable_backend)
        .replace("{{namespace}}", subject.namespace)
        .replace("{{version}}", subject.version)
}

/// Where a metric's query is sent: its address's `/api/v1/query`.
fn query_url(address: &str) -> String {
    format!("{}/api/v1/query", address.trim_end_matches('/'))
}

/// Every endpoint of `analysis`: (what it is, its address as written, the
/// URL a check would send to).
fn endpoints(analysis: &Analysis) -> impl Iterator<Item = (String, &str, String)> {
    let metrics = analysis.metrics.iter().map(|m| {
        let address = m.prometheus.address.as_str();
        (format!("metric {}", m.name), address, query_url(address))
    });
    let webhooks = analysis
        .webhooks
        .iter()
        .map(|w| (format!("webhook {}", w.name), w.url.as_str(), w.url.clone()));
    metrics.chain(webhooks)
}

/// The endpoints of `analysis` that `allow` refuses, each as `metric
/// error-rate: <address> (why)`, the address redacted.
pub fn refused(analysis: &Analysis, allow: &AllowList) -> Vec<String> {
    endpoints(analysis)
        .filter_map(|(what, address, url)| {
            let why = allow.check(&url).err()?;
            Some(format!("{what}: {} ({why})", redact(address)))
        })
        .collect()
}

/// The checks of `analysis` for `subject`; none at all when `allow`
/// refuses any of its endpoints (see [`refused`]): a round that cannot be
/// whole cannot pass, so nothing is asked.
pub fn checks(analysis: &Analysis, subject: &Subject, allow: &AllowList) -> Vec<Check> {
    let Ok(urls) = endpoints(analysis)
        .map(|(_, _, url)| allow.check(&url))
        .collect::<Result<Vec<Url>, _>>()
    else {
        return Vec::new();
    };
    let mut urls = urls.into_iter();
    let metrics: Vec<Check> = analysis
        .metrics
        .iter()
        .zip(urls.by_ref())
        .map(|(m, url)| Check::Prometheus {
            name: m.name.clone(),
            url,
            query: fill(&m.prometheus.query, subject),
        })
        .collect();
    let body = json!({
        "resource": subject.resource,
        "version": subject.version,
        "stableVersion": subject.stable_version,
        "step": subject.step,
        "weight": subject.weight,
        "mirror": subject.mirror,
        "httpRoute": subject.traffic.http_route,
        "stableBackend": subject.traffic.stable_backend,
        "canaryBackend": subject.traffic.canary_backend,
    });
    let webhooks = analysis
        .webhooks
        .iter()
        .zip(urls)
        .map(|(w, url)| Check::Webhook {
            name: w.name.clone(),
            url,
            // Validation refuses a longer timeout; a resource admitted before
            // that rule is held to it too.
            timeout: rules::parse_duration(&w.timeout)
                .unwrap_or(Duration::from_secs(10))
                .min(rules::WEBHOOK_TIMEOUT_MAX),
            body: body.clone(),
        });
    metrics.into_iter().chain(webhooks).collect()
}

/// When the next measurement of the current step is due: one interval
/// after the last, the first one interval after the step's weights were
/// seen, so that every round measures the step's own traffic (a query's
/// range reaches back before it is asked).
pub fn next_due(analysis: &Analysis, canary: &CanaryStatus) -> Option<i64> {
    let started = canary.step_start_time.as_ref()?.0.as_second();
    let interval = (interval(analysis).as_secs() as i64).max(1);
    let last = canary
        .analysis
        .iter()
        .filter(|r| r.step == canary.step && r.time.0.as_second() >= started)
        .map(|r| r.time.0.as_second())
        .max();
    Some(last.unwrap_or(started) + interval)
}

/// Whether a measurement is due at `now`.
pub fn due(analysis: &Analysis, canary: &CanaryStatus, now: &Time) -> bool {
    next_due(analysis, canary).is_some_and(|at| at <= now.0.as_second())
}

/// The analysis interval.
pub fn interval(analysis: &Analysis) -> Duration {
    rules::parse_duration(&analysis.interval).unwrap_or(Duration::from_secs(60))
}

/// What a metric's reading means, and why.
pub fn judge_metric(metric: &Metric, reading: &Reading) -> (Outcome, String) {
    let range = &metric.threshold_range;
    match reading {
        Reading::Sample(v) if v.is_nan() => (Outcome::Inconclusive, "NaN: no data".into()),
        Reading::Sample(v) => {
            let low = range.min.is_some_and(|min| *v < min);
            let high = range.max.is_some_and(|max| *v > max);
            let bounds = match (range.min, range.max) {
                (Some(lo), Some(hi)) => format!("[{lo}, {hi}]"),
                (Some(lo), None) => format!("at least {lo}"),
                (None, Some(hi)) => format!("at most {hi}"),
                (None, None) => "any".into(),
            };
            if low || high {
                (Outcome::Fail, format!("{v} is outside {bounds}"))
            } else {
                (Outcome::Pass, format!("{v} is within {bounds}"))
            }
        }
        Reading::NoData => (Outcome::Inconclusive, "the query returned no data".into()),
        Reading::Several(n) => (
            Outcome::Inconclusive,
            format!("the query returned {n} samples; it must return one"),
        ),
        Reading::Answer(code) => (Outcome::Inconclusive, format!("unexpected HTTP {code}")),
        Reading::Failed(why) => (Outcome::Inconclusive, why.clone()),
        Reading::Judged(outcome, message) => (*outcome, message.clone()),
    }
}

/// What a reading means: a metric's against its range, a webhook's by
/// its status, the probes' as already judged.
pub fn judge(analysis: &Analysis, measurement: &Measurement) -> (Outcome, String) {
    if let Reading::Judged(outcome, message) = &measurement.reading {
        return (*outcome, message.clone());
    }
    match analysis.metrics.iter().find(|x| x.name == measurement.name) {
        Some(metric) => judge_metric(metric, &measurement.reading),
        None => judge_webhook(&measurement.reading),
    }
}

/// What a webhook's reading means, and why.
pub fn judge_webhook(reading: &Reading) -> (Outcome, String) {
    match reading {
        Reading::Answer(code) if (200..300).contains(code) => {
            (Outcome::Pass, format!("answered {code}"))
        }
        Reading::Answer(code) => (Outcome::Fail, format!("answered {code}")),
        Reading::Failed(why) => (Outcome::Inconclusive, format!("no answer: {why}")),
        other => (
            Outcome::Inconclusive,
            format!("unexpected reading {other:?}"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{PrometheusQuery, ThresholdRange};

    fn metric(min: Option<f64>, max: Option<f64>) -> Metric {
        Metric {
            name: "error-rate".into(),
            prometheus: PrometheusQuery {
                address: "http://p:9090".into(),
                query: "q".into(),
            },
            threshold_range: ThresholdRange { min, max },
        }
    }

    #[test]
    fn no_data_is_never_a_pass_nor_a_failure() {
        let m = metric(None, Some(0.01));
        for reading in [
            Reading::Sample(f64::NAN),
            Reading::NoData,
            Reading::Several(3),
            Reading::Failed("connection refused".into()),
        ] {
            assert_eq!(
                judge_metric(&m, &reading).0,
                Outcome::Inconclusive,
                "{reading:?}"
            );
        }
        assert_eq!(
            judge_webhook(&Reading::Failed("timed out".into())).0,
            Outcome::Inconclusive
        );
    }

    #[test]
    fn thresholds_include_their_bounds() {
        let m = metric(Some(0.5), Some(1.0));
        assert_eq!(judge_metric(&m, &Reading::Sample(0.5)).0, Outcome::Pass);
        assert_eq!(judge_metric(&m, &Reading::Sample(1.0)).0, Outcome::Pass);
        let (outcome, why) = judge_metric(&m, &Reading::Sample(1.5));
        assert_eq!(outcome, Outcome::Fail);
        assert_eq!(why, "1.5 is outside [0.5, 1]");
        assert_eq!(
            judge_metric(&metric(None, Some(0.01)), &Reading::Sample(f64::INFINITY)).0,
            Outcome::Fail
        );
    }

    #[test]
    fn webhooks_pass_on_2xx_only() {
        assert_eq!(judge_webhook(&Reading::Answer(204)).0, Outcome::Pass);
        assert_eq!(judge_webhook(&Reading::Answer(500)).0, Outcome::Fail);
        assert_eq!(judge_webhook(&Reading::Answer(302)).0, Outcome::Fail);
    }

    #[test]
    fn queries_name_the_backends_namespace_and_version() {
        let traffic = TrafficRef {
            http_route: "svc".into(),
            rule_name: None,
            stable_backend: "svc".into(),
            canary_backend: "svc-canary".into(),
        };
        let subject = Subject {
            resource: "ns/svc",
            namespace: "ns",
            traffic: &traffic,
            version: "OpenMed/pii-v2",
            stable_version: "OpenMed/pii-v1",
            step: 1,
            weight: 10,
            mirror: None,
        };
        assert_eq!(
            fill(
                r#"rate(e{service="{{canary}}",ns="{{namespace}}"}[1m]) / rate(e{service="{{stable}}",v="{{version}}"}[1m])"#,
                &subject
            ),
            r#"rate(e{service="svc-canary",ns="ns"}[1m]) / rate(e{service="svc",v="OpenMed/pii-v2"}[1m])"#
        );
    }
}
