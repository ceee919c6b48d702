//! The load generator of the workload tests: real `POST /pii/extract`
//! requests at a fixed rate to one URL, every answer recorded. The
//! `tests/workload/load` command (main.rs) and the real-stack tests both
//! run it.
//!
//! Open-loop: request `i` is sent at `start + i / rps` whether or not the
//! earlier ones have answered, as independent clients would, so a slow or
//! stuck backend shows as latency and errors instead of a quietly lower
//! rate. Bounded both ways: `rps × duration` requests at most, and each
//! waits at most `timeout`; a run ends by itself (or earlier when asked).
//! Only loopback addresses are accepted: the tests' traffic never leaves
//! the machine.

use std::future::Future;
use std::net::IpAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// What to send.
#[derive(Debug, Clone)]
pub struct Load {
    /// The service or Gateway, with any path prefix (loopback only).
    pub url: url::Url,
    /// Requests per second.
    pub rps: f64,
    /// How long to send at most.
    pub duration: Duration,
    /// The model_name each request asks for; omitted when `None`.
    pub model: Option<String>,
    /// The Host header to send, when not the URL's.
    pub host: Option<String>,
    /// The most one request may take.
    pub timeout: Duration,
}

/// One request's outcome.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    /// Its number, from 0.
    pub i: u64,
    /// When it was sent, in ms since the run's start.
    pub sent_ms: f64,
    /// When it was sent, in ms since the Unix epoch.
    pub unix_ms: u128,
    /// The HTTP status; `None` without an answer.
    pub status: Option<u16>,
    /// From sending to the whole answer.
    pub latency_ms: f64,
    /// The `model_name` of the answer.
    pub model_name: Option<String>,
    /// The service's error code, or `timeout`, `connect`, `ConnectionReset`...
    pub error: Option<String>,
    /// The pod that answered, when the service names it (the test image's
    /// `x-openmed-pod` header).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
}

impl Record {
    /// Whether it got a 200.
    pub fn ok(&self) -> bool {
        self.status == Some(200)
    }

    /// When its answer arrived, in ms since the Unix epoch.
    pub fn answered_unix_ms(&self) -> f64 {
        self.unix_ms as f64 + self.latency_ms
    }
}

/// The texts sent, in turn: each holds a name, a place, a date and a phone
/// number the synthetic models tag.
pub const TEXTS: &[&str] = &[
    "Patient John Smith from Boston was seen on 2024-03-15, phone 617-555-0142.",
    "Mary Johnson of Chicago called 312-555-0117 about her visit on 2024-07-02.",
    "Carlos Garcia, Seattle, follow-up 2025-01-20; call back at 415-555-0160.",
];

/// Sends the load until its duration is over or `stop` completes,
/// whichever comes first, and returns every request's record in order.
pub async fn run(load: &Load, stop: impl Future<Output = ()>) -> Result<Vec<Record>, String> {
    loopback_only(&load.url)?;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .timeout(load.timeout)
        .no_proxy()
        .build()
        .map_err(|e| format!("an HTTP client: {e}"))?;
    // "pii/extract" below the URL's own path, with or without its slash.
    let mut base = load.url.clone();
    if !base.path().ends_with('/') {
        base.set_path(&format!("{}/", base.path()));
    }
    let endpoint = base.join("pii/extract").map_err(|e| e.to_string())?;
    let total = (load.rps * load.duration.as_secs_f64()).floor() as u64;
    let interval = Duration::from_secs_f64(1.0 / load.rps);
    let start = Instant::now();
    let (sender, mut results) = tokio::sync::mpsc::unbounded_channel();
    tokio::pin!(stop);
    for i in 0..total {
        tokio::select! {
            _ = tokio::time::sleep_until((start + interval * i as u32).into()) => {}
            _ = &mut stop => break,
        }
        let mut body = json!({"text": TEXTS[i as usize % TEXTS.len()], "use_smart_merging": false});
        if let Some(model) = &load.model {
            body["model_name"] = Value::from(model.as_str());
        }
        let mut request = client.post(endpoint.clone()).json(&body);
        if let Some(host) = &load.host {
            request = request.header("Host", host);
        }
        let sender = sender.clone();
        tokio::spawn(async move {
            let sent = Instant::now();
            let record = send(i, start, sent, request).await;
            let _ = sender.send(record);
        });
    }
    drop(sender);
    let mut records = Vec::with_capacity(total as usize);
    while let Some(record) = results.recv().await {
        records.push(record);
    }
    records.sort_by_key(|r| r.i);
    Ok(records)
}

async fn send(i: u64, start: Instant, sent: Instant, request: reqwest::RequestBuilder) -> Record {
    let sent_ms = (sent - start).as_secs_f64() * 1000.0;
    let unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let answer = request.send().await;
    let (status, model_name, error, pod) = match answer {
        Ok(answer) => {
            let status = answer.status().as_u16();
            let pod = answer
                .headers()
                .get(POD_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let body: Value = answer.json().await.unwrap_or(Value::Null);
            let model = body["model_name"].as_str().map(str::to_owned);
            let error = (status != 200).then(|| {
                body["error"]["code"]
                    .as_str()
                    .map_or_else(|| format!("HTTP {status}"), str::to_owned)
            });
            (Some(status), model, error, pod)
        }
        Err(e) => (None, None, Some(describe(&e)), None),
    };
    Record {
        i,
        sent_ms,
        unix_ms,
        status,
        latency_ms: sent.elapsed().as_secs_f64() * 1000.0,
        model_name,
        error,
        pod,
    }
}

/// The response header that names the pod that answered.
pub const POD_HEADER: &str = "x-openmed-pod";

/// A transport error in a few words: timeout, refused, reset.
fn describe(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        return "timeout".into();
    }
    if e.is_connect() {
        return "connect".into();
    }
    let mut source: Option<&dyn std::error::Error> = Some(e);
    while let Some(inner) = source {
        if let Some(io) = inner.downcast_ref::<std::io::Error>() {
            return format!("{:?}", io.kind());
        }
        source = inner.source();
    }
    e.to_string()
}

/// Requests, failures and latency of a set of records.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub requests: usize,
    pub failed: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Answers per `model_name` ("-" for none), in order of first answer.
    pub models: Vec<(String, usize)>,
}

impl Summary {
    pub fn of(records: &[Record]) -> Summary {
        let failed = records.iter().filter(|r| !r.ok()).count();
        let mut latencies: Vec<f64> = records.iter().map(|r| r.latency_ms).collect();
        latencies.sort_by(f64::total_cmp);
        let quantile = |q: f64| {
            latencies
                .get(((latencies.len() as f64 - 1.0) * q).round() as usize)
                .copied()
                .unwrap_or(0.0)
        };
        let mut models: Vec<(String, usize)> = Vec::new();
        for record in records {
            let name = record.model_name.clone().unwrap_or_else(|| "-".into());
            match models.iter_mut().find(|(m, _)| *m == name) {
                Some((_, n)) => *n += 1,
                None => models.push((name, 1)),
            }
        }
        Summary {
            requests: records.len(),
            failed,
            p50_ms: quantile(0.5),
            p99_ms: quantile(0.99),
            max_ms: quantile(1.0),
            models,
        }
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let models: Vec<String> = self
            .models
            .iter()
            .map(|(m, n)| format!("{m} {n}"))
            .collect();
        write!(
            f,
            "{} requests, {} failed; latency p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; model_name: {}",
            self.requests,
            self.failed,
            self.p50_ms,
            self.p99_ms,
            self.max_ms,
            models.join(", ")
        )
    }
}

/// The tests send only to loopback addresses.
pub fn loopback_only(url: &url::Url) -> Result<(), String> {
    if url.scheme() != "http" {
        return Err(format!("{url}: only http:// is sent to"));
    }
    let host = url.host_str().unwrap_or_default();
    let loopback = host == "localhost"
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if loopback {
        Ok(())
    } else {
        Err(format!(
            "{url}: not a loopback address; the load generator sends only to 127.0.0.0/8 or ::1"
        ))
    }
}
