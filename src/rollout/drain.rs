//! When a canary Deployment may serve the stable version again after its
//! canary ended: only once no request reaches it any more.
//!
//! Putting the weights back is one write; the data plane follows some time
//! later (the Gateway controller translates the route, then pushes it to
//! its proxies). A canary Deployment moved back before then has its pods
//! replaced while requests still arrive, which is how scale-downs right
//! after an abort drop requests. So the route alone is not enough:
//!
//! 1. the route shows the weights back ([`super::canary`] records when);
//! 2. every Gateway that reports on the route has accepted that
//!    generation of it (`status.parents[].conditions[Accepted]
//!    .observedGeneration`);
//! 3. with `spec.canary.drain`, the data plane's own request rate to the
//!    canary backend reads 0. No data and no answer are not 0: they wait,
//!    up to the drain's timeout, after which the Deployment moves back
//!    anyway and a Warning says so.
//!
//! Pure: the shell runs the drain query ([`check`]) and `decide` calls
//! [`judge`] with its reading.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::Value;

use super::analysis::{Check, Reading, Subject, fill};
use crate::api::endpoints::{AllowList, redact};
use crate::api::{Drain, rules};

/// The name of the drain query's measurement.
pub const CHECK_NAME: &str = "drain";

/// How often a drain that waits is looked at again.
pub const RECHECK: Duration = Duration::from_secs(2);

/// Where the wait for a canary Deployment's traffic to stop stands.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// No request reaches it any more; how that is known.
    Drained(String),
    /// Requests may still reach it; why the operator thinks so.
    Waiting(String),
    /// The wait ran out; what it was still waiting for.
    TimedOut(String),
}

/// The drain query for `subject`, when the operator may send it.
pub fn check(drain: &Drain, subject: &Subject, allow: &AllowList) -> Result<Check, String> {
    let address = &drain.prometheus.address;
    let url = format!("{}/api/v1/query", address.trim_end_matches('/'));
    let url = allow
        .check(&url)
        .map_err(|why| format!("drain query: {} ({why})", redact(address)))?;
    Ok(Check::Prometheus {
        name: CHECK_NAME.to_owned(),
        url,
        query: fill(&drain.prometheus.query, subject),
    })
}

/// How long the drain waits before the Deployment moves back anyway.
pub fn timeout(drain: &Drain) -> Duration {
    rules::parse_duration(&drain.timeout).unwrap_or(Duration::from_secs(120))
}

/// Whether the canary Deployment may move back at `now`: `route` as read
/// (none: it is gone, so it sends nothing), the drain of the spec, the
/// drain query's `reading` when one was taken, and `since`, when the route
/// was first seen with the weights back.
pub fn judge(
    route: Option<&Value>,
    drain: Option<&Drain>,
    reading: Option<&Reading>,
    since: &Time,
    now: &Time,
) -> Verdict {
    let waiting = match (pending_parents(route), drain) {
        (Some(why), _) => why,
        (None, None) if reported(route) => {
            return Verdict::Drained(
                "every Gateway accepted the route with the weights back".to_owned(),
            );
        }
        (None, None) => {
            return Verdict::Drained(
                "the route shows the weights back (no Gateway reports on it)".to_owned(),
            );
        }
        (None, Some(_)) => match reading {
            Some(Reading::Sample(rate)) if *rate == 0.0 => {
                return Verdict::Drained(
                    "the data plane sends it no requests (drain query 0)".to_owned(),
                );
            }
            Some(Reading::Sample(rate)) if rate.is_nan() => "the drain query gave NaN".to_owned(),
            Some(Reading::Sample(rate)) => {
                format!("the data plane still sends it {rate:.2} requests/s")
            }
            Some(Reading::NoData) => "the drain query returned no data".to_owned(),
            Some(Reading::Several(n)) => {
                format!("the drain query returned {n} samples; it must return one")
            }
            Some(Reading::Failed(why)) => format!("no answer from the drain query: {why}"),
            Some(Reading::Answer(_) | Reading::Judged(..)) | None => {
                "the drain query was not asked yet".to_owned()
            }
        },
    };
    let limit = drain.map_or(Duration::from_secs(120), timeout);
    let waited = now.0.as_second() - since.0.as_second();
    if waited >= limit.as_secs() as i64 {
        Verdict::TimedOut(format!("{waiting} after {waited}s"))
    } else {
        Verdict::Waiting(waiting)
    }
}

/// Whether any Gateway reports on the route in its status.
fn reported(route: Option<&Value>) -> bool {
    route
        .and_then(|r| r.pointer("/status/parents"))
        .and_then(Value::as_array)
        .is_some_and(|parents| !parents.is_empty())
}

/// Why a Gateway may not have the route's current weights yet: one that
/// reports on the route has not accepted its current generation.
fn pending_parents(route: Option<&Value>) -> Option<String> {
    let route = route?;
    let generation = route.pointer("/metadata/generation")?.as_i64()?;
    let parents = route.pointer("/status/parents")?.as_array()?;
    parents.iter().find_map(|parent| {
        let accepted = parent
            .get("conditions")?
            .as_array()?
            .iter()
            .find(|c| c.get("type").and_then(Value::as_str) == Some("Accepted"))?;
        let observed = accepted.get("observedGeneration").and_then(Value::as_i64);
        let ok = accepted.get("status").and_then(Value::as_str) == Some("True")
            && observed.is_some_and(|g| g >= generation);
        (!ok).then(|| {
            let gateway = parent
                .pointer("/parentRef/name")
                .and_then(Value::as_str)
                .unwrap_or("a Gateway");
            format!(
                "Gateway {gateway} has not accepted generation {generation} of the route yet (it reports {})",
                observed.map_or("none".to_owned(), |g| g.to_string())
            )
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::PrometheusQuery;
    use serde_json::json;

    fn at(second: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + second).unwrap())
    }

    fn route(generation: i64, accepted: &[(&str, i64)]) -> Value {
        let parents: Vec<Value> = accepted
            .iter()
            .map(|(status, observed)| {
                json!({"parentRef": {"name": "openmed"}, "conditions": [
                    {"type": "Accepted", "status": status, "observedGeneration": observed}
                ]})
            })
            .collect();
        json!({"metadata": {"generation": generation}, "status": {"parents": parents}})
    }

    fn drain() -> Drain {
        Drain {
            prometheus: PrometheusQuery {
                address: "http://prom:9090".into(),
                query: "sum(rate(x{backend=\"{{canary}}\"}[10s])) or vector(0)".into(),
            },
            timeout: "1m".into(),
        }
    }

    #[test]
    fn without_a_drain_query_the_gateways_acceptance_decides() {
        let behind = route(7, &[("True", 6)]);
        let verdict = judge(Some(&behind), None, None, &at(0), &at(5));
        assert_eq!(
            verdict,
            Verdict::Waiting(
                "Gateway openmed has not accepted generation 7 of the route yet (it reports 6)"
                    .into()
            )
        );
        let caught_up = route(7, &[("True", 7)]);
        assert!(matches!(
            judge(Some(&caught_up), None, None, &at(0), &at(5)),
            Verdict::Drained(_)
        ));
        // A route no Gateway reports on, or no route: nothing to wait for.
        let unreported = json!({"metadata": {"generation": 3}});
        assert_eq!(
            judge(Some(&unreported), None, None, &at(0), &at(0)),
            Verdict::Drained("the route shows the weights back (no Gateway reports on it)".into())
        );
        assert!(matches!(
            judge(None, None, None, &at(0), &at(0)),
            Verdict::Drained(_)
        ));
    }

    #[test]
    fn a_refused_route_is_not_accepted() {
        let refused = route(4, &[("False", 4)]);
        assert!(matches!(
            judge(Some(&refused), None, None, &at(0), &at(1)),
            Verdict::Waiting(_)
        ));
    }

    #[test]
    fn only_a_zero_rate_drains() {
        let r = route(2, &[("True", 2)]);
        let d = drain();
        let judge_with =
            |reading: Reading| judge(Some(&r), Some(&d), Some(&reading), &at(0), &at(3));
        assert_eq!(
            judge_with(Reading::Sample(0.0)),
            Verdict::Drained("the data plane sends it no requests (drain query 0)".into())
        );
        assert_eq!(
            judge_with(Reading::Sample(1.5)),
            Verdict::Waiting("the data plane still sends it 1.50 requests/s".into())
        );
        for reading in [
            Reading::NoData,
            Reading::Sample(f64::NAN),
            Reading::Several(2),
            Reading::Failed("connection refused".into()),
        ] {
            assert!(
                matches!(judge_with(reading.clone()), Verdict::Waiting(_)),
                "{reading:?} is not a drain"
            );
        }
        assert!(matches!(
            judge(Some(&r), Some(&d), None, &at(0), &at(3)),
            Verdict::Waiting(_)
        ));
    }

    #[test]
    fn the_wait_runs_out_at_the_timeout() {
        let r = route(2, &[("True", 2)]);
        let d = drain();
        let busy = Reading::Sample(2.0);
        assert!(matches!(
            judge(Some(&r), Some(&d), Some(&busy), &at(0), &at(59)),
            Verdict::Waiting(_)
        ));
        assert_eq!(
            judge(Some(&r), Some(&d), Some(&busy), &at(0), &at(60)),
            Verdict::TimedOut("the data plane still sends it 2.00 requests/s after 60s".into())
        );
    }

    #[test]
    fn the_query_is_sent_only_where_allowed() {
        let traffic = crate::api::TrafficRef {
            http_route: "r".into(),
            rule_name: None,
            stable_backend: "s".into(),
            canary_backend: "c".into(),
        };
        let subject = Subject {
            resource: "ns/m",
            namespace: "ns",
            traffic: &traffic,
            version: "v2",
            stable_version: "v1",
            step: 0,
            weight: 0,
            mirror: None,
        };
        let none = AllowList::default();
        assert!(check(&drain(), &subject, &none).is_err());
        let allow = AllowList::new(vec![
            crate::api::endpoints::AllowedPrefix::parse("http://prom:9090").unwrap(),
        ]);
        let Check::Prometheus { name, url, query } = check(&drain(), &subject, &allow).unwrap()
        else {
            panic!("a Prometheus check")
        };
        assert_eq!(name, "drain");
        assert_eq!(url.as_str(), "http://prom:9090/api/v1/query");
        assert_eq!(query, "sum(rate(x{backend=\"c\"}[10s])) or vector(0)");
    }
}
