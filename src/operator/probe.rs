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
//! and no message carries an address's credentials or query. An answer's
//! body is read within [`BODY_CAP`], in size and in time: one past it is
//! no data, and counted, so an endless answer can neither fill the
//! operator's memory (which a restart would only fill again) nor hold a
//! worker.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use serde_json::Value;
use url::Url;

use crate::api::endpoints::redact;
use crate::api::rules::WEBHOOK_TIMEOUT_MAX;
use crate::rollout::analysis::{Check, Measurement, Reading};
use crate::rollout::quality::Answer;

use super::metrics::Metrics;

/// How long a Prometheus query may take.
const QUERY_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest `measure` takes, whatever the checks ask: the reconcile
/// that asked waits for it, and holds a worker all the while.
pub const MEASURE_DEADLINE: Duration = WEBHOOK_TIMEOUT_MAX;

/// How much of an answer's body the operator reads, and for how long once
/// its head has come.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BodyCap {
    /// The most bytes read.
    pub bytes: usize,
    /// The longest the body may take to arrive whole.
    pub time: Duration,
}

/// An instant query's one sample, or a quality probe's entities, fits in
/// far less; the time leaves room inside [`QUERY_TIMEOUT`] and the
/// quality gate's request timeout.
pub const BODY_CAP: BodyCap = BodyCap {
    bytes: 1 << 20,
    time: Duration::from_secs(5),
};

/// The HTTP client for checks.
#[derive(Clone)]
pub struct Prober {
    client: reqwest::Client,
    deadline: Duration,
    body_cap: BodyCap,
    metrics: Arc<Metrics>,
}

impl Prober {
    /// A client with the platform's trust roots, short timeouts, no
    /// redirects, [`MEASURE_DEADLINE`] and [`BODY_CAP`], counting the
    /// answers it cuts in `metrics`.
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self::with_bounds(MEASURE_DEADLINE, BODY_CAP, metrics)
    }

    /// [`Prober::new`] with other bounds on `measure` and on the bodies it
    /// reads (smaller, in tests).
    pub fn with_bounds(deadline: Duration, body_cap: BodyCap, metrics: Arc<Metrics>) -> Self {
        // kube and this client share the process-wide rustls provider.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("openmed-operator/", env!("CARGO_PKG_VERSION")))
            .build()
            .expect("an HTTP client with the default settings builds");
        Prober {
            client,
            deadline,
            body_cap,
            metrics,
        }
    }

    /// The longest a gathering of readings or probe answers may take.
    pub fn deadline(&self) -> Duration {
        self.deadline
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
        let body = match self.body(answer, Source::Pod).await {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            Err(why) => return Answer::Failed(why),
        };
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
        let bytes = match self.body(answer, Source::Prometheus).await {
            Ok(bytes) => bytes,
            Err(why) => return Reading::Failed(format!("Prometheus at {shown}: {why}")),
        };
        match serde_json::from_slice::<Value>(&bytes) {
            Ok(body) => prometheus_reading(&body),
            Err(_) => Reading::Failed(format!("Prometheus at {shown} answered {status}")),
        }
    }

    /// An answer's body, read chunk by chunk within [`BodyCap`]. A body
    /// past the cap is counted and read as nothing at all: a part of an
    /// answer is not the answer, and an endless one must not hold the
    /// operator's memory or its worker.
    async fn body(&self, mut answer: reqwest::Response, source: Source) -> Result<Vec<u8>, String> {
        let cap = self.body_cap;
        let cut = |why: String| {
            self.metrics.body_cut(source.name());
            format!("answer cut: {why}")
        };
        let too_long = || cut(format!("its body is longer than {} bytes", cap.bytes));
        if answer
            .content_length()
            .is_some_and(|declared| declared > cap.bytes as u64)
        {
            return Err(too_long());
        }
        let until = tokio::time::Instant::now() + cap.time;
        let mut body = Vec::new();
        loop {
            match tokio::time::timeout_at(until, answer.chunk()).await {
                Err(_) => return Err(cut(format!("its body was not whole within {:?}", cap.time))),
                Ok(Err(e)) => return Err(failure(e)),
                Ok(Ok(None)) => return Ok(body),
                Ok(Ok(Some(chunk))) if body.len() + chunk.len() > cap.bytes => {
                    return Err(too_long());
                }
                Ok(Ok(Some(chunk))) => body.extend_from_slice(&chunk),
            }
        }
    }

    /// A webhook's answer is its status: its body is never read.
    async fn post(&self, url: &Url, body: &Value) -> Reading {
        match self.client.post(url.clone()).json(body).send().await {
            Ok(answer) => Reading::Answer(answer.status().as_u16()),
            Err(e) => Reading::Failed(failure(e)),
        }
    }
}

/// Where an answer whose body was read came from: the label of the
/// cut-bodies metric, one fixed name per kind of endpoint.
#[derive(Clone, Copy, Debug)]
enum Source {
    Prometheus,
    Pod,
}

impl Source {
    fn name(self) -> &'static str {
        match self {
            Source::Prometheus => "prometheus",
            Source::Pod => "pod",
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
        let readings = Prober::new(Arc::default()).measure(&checks).await;
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
        let prober = Prober::with_bounds(Duration::from_millis(300), BODY_CAP, Arc::default());
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
        for m in Prober::new(Arc::default()).measure(&checks).await {
            let Reading::Failed(why) = &m.reading else {
                panic!("{m:?}")
            };
            for secret in ["alice", "hunter2", "key", "s3cr3t"] {
                assert!(!why.contains(secret), "{secret} in {why:?}");
            }
        }
    }

    /// How a test server sends the body of its answer.
    #[derive(Clone, Copy)]
    enum Shape {
        /// `json`, padded with spaces to `padded` bytes, with its length.
        Oversized { padded: usize },
        /// A chunked body that never ends. After `quiet_after` bytes it
        /// goes quiet, still unfinished: a reader without a size cap waits
        /// out its timeout then, instead of filling the machine's memory.
        Endless { quiet_after: usize },
        /// `json` with its length, one byte every `every`.
        Trickle { every: Duration },
    }

    /// An HTTP server on 127.0.0.1 that answers every request 200 with
    /// `json` sent in `shape`, and keeps each connection until the client
    /// leaves.
    async fn serve_body(json: &'static str, shape: Shape) -> SocketAddr {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buf[..n]),
                        }
                    }
                    let head = |framing: String| {
                        format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n{framing}\r\n\r\n"
                        )
                    };
                    let sent: std::io::Result<()> = async {
                        match shape {
                            Shape::Oversized { padded } => {
                                let mut body = json.as_bytes().to_vec();
                                body.resize(padded, b' ');
                                let framing = format!("content-length: {}", body.len());
                                stream.write_all(head(framing).as_bytes()).await?;
                                stream.write_all(&body).await?;
                            }
                            Shape::Endless { quiet_after } => {
                                let framing = "transfer-encoding: chunked".to_owned();
                                stream.write_all(head(framing).as_bytes()).await?;
                                let chunk = format!("{:x}\r\n{}\r\n", 4096, " ".repeat(4096));
                                for _ in 0..quiet_after.div_ceil(4096) {
                                    stream.write_all(chunk.as_bytes()).await?;
                                }
                            }
                            Shape::Trickle { every } => {
                                let framing = format!("content-length: {}", json.len());
                                stream.write_all(head(framing).as_bytes()).await?;
                                for byte in json.as_bytes() {
                                    stream.write_all(&[*byte]).await?;
                                    stream.flush().await?;
                                    tokio::time::sleep(every).await;
                                }
                            }
                        }
                        stream.flush().await
                    }
                    .await;
                    if sent.is_ok() {
                        // Until the client hangs up: closing with its
                        // request unread could reset the connection.
                        while let Ok(n) = stream.read(&mut buf).await {
                            if n == 0 {
                                break;
                            }
                        }
                    }
                });
            }
        });
        addr
    }

    /// The three ways an answer outgrows [`TEST_CAP`], and what its
    /// failure says (an endless body may be cut for either reason).
    fn too_much() -> [(Shape, &'static str); 3] {
        [
            (
                Shape::Oversized {
                    padded: 16 * TEST_CAP.bytes,
                },
                "answer cut: its body is longer than 65536 bytes",
            ),
            (
                Shape::Endless {
                    quiet_after: 16 * TEST_CAP.bytes,
                },
                "answer cut: ",
            ),
            (
                Shape::Trickle {
                    every: Duration::from_millis(50),
                },
                "answer cut: its body was not whole within 250ms",
            ),
        ]
    }

    /// A cap small enough that the tests outgrow it quickly; a trickle of
    /// one byte in 50 ms sends a short answer in seconds, not 250 ms.
    const TEST_CAP: BodyCap = BodyCap {
        bytes: 64 * 1024,
        time: Duration::from_millis(250),
    };

    /// The count of cut bodies from `source`, as the metrics endpoint shows it.
    fn cut(metrics: &Metrics, source: &str) -> u64 {
        let series = format!("openmed_operator_response_bodies_cut_total{{source=\"{source}\"}} ");
        metrics
            .encode()
            .lines()
            .find_map(|l| l.strip_prefix(series.as_str()).map(|n| n.parse().unwrap()))
            .unwrap_or(0)
    }

    #[tokio::test]
    async fn prometheus_answers_past_the_body_cap_read_as_failed_and_are_counted() {
        const ANSWER: &str =
            r#"{"status":"success","data":{"resultType":"scalar","result":[1,"0.5"]}}"#;
        let metrics = Arc::new(Metrics::default());
        let prober = Prober::with_bounds(MEASURE_DEADLINE, TEST_CAP, metrics.clone());
        let mut checks = Vec::new();
        for (shape, _) in too_much() {
            let server = serve_body(ANSWER, shape).await;
            checks.push(Check::Prometheus {
                name: "error-rate".into(),
                url: url(&format!("http://{server}/api/v1/query")),
                query: "up".into(),
            });
        }
        // A guard against hanging the test run, not a measurement.
        let readings = tokio::time::timeout(Duration::from_secs(120), prober.measure(&checks))
            .await
            .expect("measure returned");
        for ((_, said), m) in too_much().iter().zip(&readings) {
            let Reading::Failed(why) = &m.reading else {
                panic!("an answer past the cap is no data: {m:?}")
            };
            assert!(why.contains(said), "{why}");
        }
        assert_eq!(cut(&metrics, "prometheus"), 3);
        assert_eq!(cut(&metrics, "pod"), 0);
    }

    #[tokio::test]
    async fn pod_answers_past_the_body_cap_are_failed_answers_and_are_counted() {
        let metrics = Arc::new(Metrics::default());
        let prober = Prober::with_bounds(MEASURE_DEADLINE, TEST_CAP, metrics.clone());
        for (shape, said) in too_much() {
            let server = serve_body(r#"{"entities":[]}"#, shape).await;
            let (to, body) = (
                format!("http://{server}/pii/extract"),
                json!({"text": "probe"}),
            );
            let asked = prober.extract(&to, None, &body, Duration::from_secs(10));
            // A guard against hanging the test run, not a measurement.
            let answer = tokio::time::timeout(Duration::from_secs(120), asked)
                .await
                .expect("extract returned");
            let Answer::Failed(why) = &answer else {
                panic!("an answer past the cap is no answer: {answer:?}")
            };
            assert!(why.starts_with(said), "{why}");
        }
        assert_eq!(cut(&metrics, "pod"), 3);
        assert_eq!(cut(&metrics, "prometheus"), 0);
    }

    #[tokio::test]
    async fn answers_within_the_body_cap_are_read_whole() {
        const ANSWER: &str =
            r#"{"status":"success","data":{"resultType":"scalar","result":[1,"0.5"]}}"#;
        let metrics = Arc::new(Metrics::default());
        let prober = Prober::with_bounds(MEASURE_DEADLINE, TEST_CAP, metrics.clone());
        let padded = serve_body(
            ANSWER,
            Shape::Oversized {
                padded: TEST_CAP.bytes,
            },
        )
        .await;
        let checks = [Check::Prometheus {
            name: "error-rate".into(),
            url: url(&format!("http://{padded}/api/v1/query")),
            query: "up".into(),
        }];
        let readings = prober.measure(&checks).await;
        assert_eq!(readings[0].reading, Reading::Sample(0.5));
        assert_eq!(cut(&metrics, "prometheus"), 0);
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
