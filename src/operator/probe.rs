//! Runs the canary checks `decide` asks for: PromQL instant queries against
//! the Prometheus HTTP API, and webhook POSTs; and the quality gate's
//! requests to pods. Every problem becomes a
//! reading (`Failed`), never an error of the reconcile: `decide` treats it
//! as no data, which holds the step.
//!
//! The checks come from a namespace's users but run with the operator's
//! network position, inside a reconcile that every resource's worker pool
//! shares. So the client sends exactly the URL the core allowed and
//! follows no redirect (a redirect would lead anywhere), every check is
//! bounded in time, `measure` as a whole never outlasts [`MEASURE_DEADLINE`],
//! and no message carries an address's credentials or query.

use std::time::Duration;

use futures::future::join_all;
use serde_json::Value;
use url::Url;

use crate::api::endpoints::redact;
use crate::api::rules::WEBHOOK_TIMEOUT_MAX;
use crate::rollout::analysis::{Check, Measurement, Reading};
use crate::rollout::quality::Answer;

/// How long a Prometheus query may take.
const QUERY_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest `measure` takes, whatever the checks ask: the reconcile
/// that asked waits for it, and holds a worker all the while.
pub const MEASURE_DEADLINE: Duration = WEBHOOK_TIMEOUT_MAX;

/// The HTTP client for checks.
#[derive(Clone)]
pub struct Prober {
    client: reqwest::Client,
    deadline: Duration,
}

impl Prober {
    /// A client with the platform's trust roots, short timeouts, no
    /// redirects, and [`MEASURE_DEADLINE`].
    pub fn new() -> Self {
        Self::with_deadline(MEASURE_DEADLINE)
    }

    /// [`Prober::new`] with another bound on `measure` (shorter, in tests).
    pub fn with_deadline(deadline: Duration) -> Self {
        // kube and this client share the process-wide rustls provider.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("openmed-operator/", env!("CARGO_PKG_VERSION")))
            .build()
            .expect("an HTTP client with the default settings builds");
        Prober { client, deadline }
    }

    /// Runs every check at once and returns their readings in order; each
    /// check has at most the deadline, so the whole does too.
    pub async fn measure(&self, checks: &[Check]) -> Vec<Measurement> {
        join_all(checks.iter().map(|check| async move {
            let bound = match check {
                Check::Prometheus { .. } | Check::Probes { .. } => QUERY_TIMEOUT,
                Check::Webhook { timeout, .. } => *timeout,
            }
            .min(self.deadline);
            let asked = async {
                match check {
                    Check::Prometheus { url, query, .. } => self.query(url, query).await,
                    Check::Webhook { url, body, .. } => self.post(url, body).await,
                    // Sent to pods by the quality gate's shell, not here.
                    Check::Probes { .. } => Reading::Failed("not an endpoint check".into()),
                }
            };
            let reading = match tokio::time::timeout(bound, asked).await {
                Ok(reading) => reading,
                Err(_) => Reading::Failed(format!("no answer within {bound:?}")),
            };
            Measurement {
                name: check.name().to_owned(),
                reading,
            }
        }))
        .await
    }

    /// One quality-gate request: `body` POSTed to a pod's
    /// `/pii/extract` with the Host header `host` (the pod's address when
    /// `None`), the answer read by `rollout::quality::answer`.
    pub async fn extract(
        &self,
        url: &str,
        host: Option<&str>,
        body: &Value,
        timeout: Duration,
    ) -> Answer {
        let mut request = self.client.post(url).json(body).timeout(timeout);
        if let Some(host) = host {
            request = request.header(reqwest::header::HOST, host);
        }
        let sent = request.send().await;
        let answer = match sent {
            Ok(answer) => answer,
            Err(e) => return Answer::Failed(failure(e)),
        };
        let status = answer.status().as_u16();
        let body = answer.json::<Value>().await.unwrap_or(Value::Null);
        crate::rollout::quality::answer(status, &body)
    }

    async fn query(&self, url: &Url, query: &str) -> Reading {
        let shown = redact(url.as_str());
        let sent = self
            .client
            .get(url.clone())
            .query(&[("query", query)])
            .send()
            .await;
        let answer = match sent {
            Ok(answer) => answer,
            Err(e) => return Reading::Failed(format!("Prometheus at {shown}: {}", failure(e))),
        };
        let status = answer.status();
        match answer.json::<Value>().await {
            Ok(body) => prometheus_reading(&body),
            Err(_) => Reading::Failed(format!("Prometheus at {shown} answered {status}")),
        }
    }

    async fn post(&self, url: &Url, body: &Value) -> Reading {
        match self.client.post(url.clone()).json(body).send().await {
            Ok(answer) => Reading::Answer(answer.status().as_u16()),
            Err(e) => Reading::Failed(failure(e)),
        }
    }
}

/// What went wrong with a request, without its URL (which may carry
/// credentials or a token), with the causes that say why.
fn failure(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

impl Default for Prober {
    fn default() -> Self {
        Self::new()
    }
}

/// Reads an instant query's answer: one sample, none, several, or why not.
pub fn prometheus_reading(body: &Value) -> Reading {
    if body.get("status").and_then(Value::as_str) != Some("success") {
        let kind = body
            .get("errorType")
            .and_then(Value::as_str)
            .unwrap_or("error");
        let error = body
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or("no reason given");
        return Reading::Failed(format!("Prometheus: {kind}: {error}"));
    }
    let data = body.get("data").cloned().unwrap_or_default();
    let result = data.get("result").cloned().unwrap_or_default();
    let sample = |pair: &Value| {
        pair.get(1)
            .and_then(Value::as_str)
            .and_then(|v| v.parse::<f64>().ok())
    };
    match data.get("resultType").and_then(Value::as_str) {
        Some("scalar") => sample(&result).map_or_else(
            || Reading::Failed("Prometheus: a scalar without a value".into()),
            Reading::Sample,
        ),
        Some("vector") => match result.as_array().map(Vec::as_slice).unwrap_or_default() {
            [] => Reading::NoData,
            [one] => one.get("value").and_then(sample).map_or_else(
                || Reading::Failed("Prometheus: a sample without a value".into()),
                Reading::Sample,
            ),
            several => Reading::Several(several.len()),
        },
        other => Reading::Failed(format!(
            "Prometheus: a {} result; the query must return one sample",
            other.unwrap_or("missing")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    use std::convert::Infallible;
    use std::net::SocketAddr;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use bytes::Bytes;
    use http_body_util::Full;
    use hyper::service::service_fn;
    use hyper::{Response, StatusCode};
    use hyper_util::rt::TokioIo;

    /// An HTTP server on 127.0.0.1 that gives every request `answer`
    /// and counts them.
    async fn serve(
        answer: impl Fn() -> Response<Full<Bytes>> + Clone + Send + Sync + 'static,
    ) -> (SocketAddr, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(AtomicUsize::new(0));
        let counter = seen.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let (answer, counter) = (answer.clone(), counter.clone());
                tokio::spawn(async move {
                    let service = service_fn(move |_| {
                        counter.fetch_add(1, Ordering::SeqCst);
                        let response = answer();
                        async move { Ok::<_, Infallible>(response) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        (addr, seen)
    }

    fn redirect(status: StatusCode, to: String) -> Response<Full<Bytes>> {
        Response::builder()
            .status(status)
            .header("location", to)
            .body(Full::new(Bytes::new()))
            .unwrap()
    }

    fn url(text: &str) -> Url {
        Url::parse(text).unwrap()
    }

    #[tokio::test]
    async fn redirects_are_not_followed() {
        let (target, reached) = serve(|| {
            Response::new(Full::new(Bytes::from(
                r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"0"]}]}}"#,
            )))
        })
        .await;
        let (redirector, asked) =
            serve(move || redirect(StatusCode::FOUND, format!("http://{target}/api/v1/query")))
                .await;
        let checks = [
            Check::Prometheus {
                name: "error-rate".into(),
                url: url(&format!("http://{redirector}/api/v1/query")),
                query: "up".into(),
            },
            Check::Webhook {
                name: "smoke".into(),
                url: url(&format!("http://{redirector}/hook")),
                timeout: Duration::from_secs(10),
                body: json!({}),
            },
        ];
        let readings = Prober::new().measure(&checks).await;
        assert_eq!(asked.load(Ordering::SeqCst), 2);
        assert_eq!(reached.load(Ordering::SeqCst), 0, "{readings:?}");
        assert_eq!(
            readings[0].reading,
            Reading::Failed(format!(
                "Prometheus at http://{redirector}/api/v1/query answered 302 Found"
            ))
        );
        assert_eq!(readings[1].reading, Reading::Answer(302));
    }

    #[tokio::test]
    async fn a_silent_webhook_holds_measure_no_longer_than_its_deadline() {
        // Accepts connections and never answers.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let silent = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        let (prometheus, _) = serve(|| {
            Response::new(Full::new(Bytes::from(
                r#"{"status":"success","data":{"resultType":"scalar","result":[1,"0.5"]}}"#,
            )))
        })
        .await;
        let checks = [
            Check::Webhook {
                name: "slow".into(),
                url: url(&format!("http://{silent}/hook")),
                // Far beyond any cap: measure's own deadline still holds.
                timeout: Duration::from_secs(24 * 3600),
                body: json!({}),
            },
            Check::Prometheus {
                name: "error-rate".into(),
                url: url(&format!("http://{prometheus}/api/v1/query")),
                query: "up".into(),
            },
        ];
        let prober = Prober::with_deadline(Duration::from_millis(300));
        // A guard against hanging the test run, not a measurement: the
        // webhook alone would hold measure for a day.
        let readings = tokio::time::timeout(Duration::from_secs(120), prober.measure(&checks))
            .await
            .expect("measure returned within its deadline");
        assert_eq!(
            readings[0].reading,
            Reading::Failed("no answer within 300ms".into())
        );
        assert_eq!(
            readings[1].reading,
            Reading::Sample(0.5),
            "the other checks' readings are kept"
        );
    }

    #[tokio::test]
    async fn failures_never_show_an_address_query_or_credentials() {
        // A port nothing listens on.
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let checks = [
            Check::Prometheus {
                name: "error-rate".into(),
                url: url(&format!(
                    "http://alice:hunter2@{closed}/api/v1/query?key=s3cr3t"
                )),
                query: "up".into(),
            },
            Check::Webhook {
                name: "smoke".into(),
                url: url(&format!("http://alice:hunter2@{closed}/hook?key=s3cr3t")),
                timeout: Duration::from_secs(10),
                body: json!({}),
            },
        ];
        for m in Prober::new().measure(&checks).await {
            let Reading::Failed(why) = &m.reading else {
                panic!("{m:?}")
            };
            for secret in ["alice", "hunter2", "key", "s3cr3t"] {
                assert!(!why.contains(secret), "{secret} in {why:?}");
            }
        }
    }

    fn vector(samples: &[&str]) -> Value {
        let result: Vec<Value> = samples
            .iter()
            .map(|v| json!({"metric": {}, "value": [1700000000.0, v]}))
            .collect();
        json!({"status": "success", "data": {"resultType": "vector", "result": result}})
    }

    #[test]
    fn answers_read_as_samples_no_data_or_failures() {
        assert_eq!(
            prometheus_reading(&vector(&["0.25"])),
            Reading::Sample(0.25)
        );
        assert_eq!(prometheus_reading(&vector(&[])), Reading::NoData);
        assert_eq!(
            prometheus_reading(&vector(&["1", "2"])),
            Reading::Several(2)
        );
        let Reading::Sample(nan) = prometheus_reading(&vector(&["NaN"])) else {
            panic!("NaN is a sample")
        };
        assert!(nan.is_nan());
        assert_eq!(
            prometheus_reading(&vector(&["+Inf"])),
            Reading::Sample(f64::INFINITY)
        );
        assert_eq!(
            prometheus_reading(
                &json!({"status": "success", "data": {"resultType": "scalar", "result": [1.0, "3"]}})
            ),
            Reading::Sample(3.0)
        );
        let Reading::Failed(why) = prometheus_reading(
            &json!({"status": "error", "errorType": "bad_data", "error": "parse error"}),
        ) else {
            panic!("an error is a failed reading")
        };
        assert_eq!(why, "Prometheus: bad_data: parse error");
        assert!(matches!(
            prometheus_reading(
                &json!({"status": "success", "data": {"resultType": "matrix", "result": []}})
            ),
            Reading::Failed(_)
        ));
    }
}
