//! `tests/workload/load`: sends `POST /pii/extract` at a fixed rate to one
//! URL and records every answer, for the workload tests and for people
//! watching a rollout.
//!
//! Open-loop: request `i` is sent at `start + i / rps` whether or not the
//! earlier ones have answered, as independent clients would, so a slow or
//! stuck backend shows as latency and errors instead of a quietly lower
//! rate. Bounded both ways: `rps × duration` requests at most, and each
//! waits at most `--timeout`; the run ends by itself. Only loopback
//! addresses are accepted: the tests' traffic never leaves the machine.

use std::io::Write;
use std::net::IpAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use serde::Serialize;
use serde_json::{Value, json};

/// Send real POST /pii/extract requests at a fixed rate; one JSON line per
/// request in --out, a summary on stderr.
///
/// Exit codes: 0 every request answered 200, 1 some failed, 2 bad usage
/// (or a URL that is not loopback).
#[derive(Debug, Parser)]
#[command(
    name = "tests/workload/load",
    after_help = "\
Example:
  tests/workload/load --url http://127.0.0.1:8080 --rps 20 --duration 30 \\
      --model OpenMed/synthetic-pii-v1 --out /tmp/load.jsonl

Each line of --out: {\"i\", \"sent_ms\" (since the start), \"unix_ms\", \"status\"
(null when no answer), \"latency_ms\", \"model_name\", \"error\"}."
)]
struct Args {
    /// The service or Gateway, e.g. http://127.0.0.1:8080 (loopback only).
    #[arg(long)]
    url: url::Url,
    /// Requests per second.
    #[arg(long, value_parser = positive)]
    rps: f64,
    /// How long to send, in seconds.
    #[arg(long, value_parser = positive)]
    duration: f64,
    /// Where the per-request JSON lines go.
    #[arg(long)]
    out: std::path::PathBuf,
    /// The model_name each request asks for; omitted when not given.
    #[arg(long)]
    model: Option<String>,
    /// The Host header, for a Gateway listener or the service's trusted hosts.
    #[arg(long)]
    host: Option<String>,
    /// The most one request may take, in seconds.
    #[arg(long, default_value_t = 10.0, value_parser = positive)]
    timeout: f64,
}

fn positive(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
        _ => Err(format!("{text:?} is not a positive number")),
    }
}

/// One request's outcome, as written to --out.
#[derive(Debug, Serialize)]
struct Record {
    i: u64,
    sent_ms: f64,
    unix_ms: u128,
    status: Option<u16>,
    latency_ms: f64,
    model_name: Option<String>,
    error: Option<String>,
}

/// The texts sent, in turn: each holds a name, a place, a date and a phone
/// number the synthetic models tag.
const TEXTS: &[&str] = &[
    "Patient John Smith from Boston was seen on 2024-03-15, phone 617-555-0142.",
    "Mary Johnson of Chicago called 312-555-0117 about her visit on 2024-07-02.",
    "Carlos Garcia, Seattle, follow-up 2025-01-20; call back at 415-555-0160.",
];

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    if let Err(e) = loopback_only(&args.url) {
        eprintln!("tests/workload/load: {e}");
        return std::process::ExitCode::from(2);
    }
    let mut out = match std::fs::File::create(&args.out) {
        Ok(file) => std::io::BufWriter::new(file),
        Err(e) => {
            eprintln!("tests/workload/load: {}: {e}", args.out.display());
            return std::process::ExitCode::from(2);
        }
    };
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs_f64(args.timeout))
        .no_proxy()
        .build()
        .expect("an HTTP client");
    let endpoint = args.url.join("pii/extract").expect("a base URL");
    let total = (args.rps * args.duration).floor() as u64;
    let interval = Duration::from_secs_f64(1.0 / args.rps);
    let start = Instant::now();
    let (sender, mut results) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..total {
        tokio::time::sleep_until((start + interval * i as u32).into()).await;
        let mut body = json!({"text": TEXTS[i as usize % TEXTS.len()], "use_smart_merging": false});
        if let Some(model) = &args.model {
            body["model_name"] = Value::from(model.as_str());
        }
        let mut request = client.post(endpoint.clone()).json(&body);
        if let Some(host) = &args.host {
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
    for record in &records {
        let _ = serde_json::to_writer(&mut out, record);
        let _ = out.write_all(b"\n");
    }
    if let Err(e) = out.flush() {
        eprintln!("tests/workload/load: {}: {e}", args.out.display());
        return std::process::ExitCode::from(2);
    }
    let failed = summary(&records, start.elapsed());
    std::process::ExitCode::from(u8::from(failed > 0))
}

async fn send(i: u64, start: Instant, sent: Instant, request: reqwest::RequestBuilder) -> Record {
    let sent_ms = (sent - start).as_secs_f64() * 1000.0;
    let unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let answer = request.send().await;
    let (status, model_name, error) = match answer {
        Ok(answer) => {
            let status = answer.status().as_u16();
            let body: Value = answer.json().await.unwrap_or(Value::Null);
            let model = body["model_name"].as_str().map(str::to_owned);
            let error = (status != 200).then(|| {
                body["error"]["code"]
                    .as_str()
                    .map_or_else(|| format!("HTTP {status}"), str::to_owned)
            });
            (Some(status), model, error)
        }
        Err(e) => (None, None, Some(describe(&e))),
    };
    Record {
        i,
        sent_ms,
        unix_ms,
        status,
        latency_ms: sent.elapsed().as_secs_f64() * 1000.0,
        model_name,
        error,
    }
}

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

/// Prints the summary on stderr; the number of failed requests.
fn summary(records: &[Record], took: Duration) -> usize {
    let failed = records.iter().filter(|r| r.status != Some(200)).count();
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
    let models: Vec<String> = models.iter().map(|(m, n)| format!("{m} {n}")).collect();
    eprintln!(
        "tests/workload/load: {} requests in {:.1} s, {failed} failed; latency p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; model_name: {}",
        records.len(),
        took.as_secs_f64(),
        quantile(0.5),
        quantile(0.99),
        quantile(1.0),
        models.join(", ")
    );
    failed
}

/// The tests send only to loopback addresses.
fn loopback_only(url: &url::Url) -> Result<(), String> {
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
