//! `tests/workload/load`: the load generator (lib.rs) as a command, for the
//! workload tests and for people watching a rollout.

use std::io::Write;
use std::time::{Duration, Instant};

use clap::Parser;
use openmed_load::{Load, Summary, loopback_only, run};

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
    let load = Load {
        url: args.url,
        rps: args.rps,
        duration: Duration::from_secs_f64(args.duration),
        model: args.model,
        host: args.host,
        timeout: Duration::from_secs_f64(args.timeout),
    };
    let start = Instant::now();
    let records = match run(&load, std::future::pending()).await {
        Ok(records) => records,
        Err(e) => {
            eprintln!("tests/workload/load: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    for record in &records {
        let _ = serde_json::to_writer(&mut out, record);
        let _ = out.write_all(b"\n");
    }
    if let Err(e) = out.flush() {
        eprintln!("tests/workload/load: {}: {e}", args.out.display());
        return std::process::ExitCode::from(2);
    }
    let summary = Summary::of(&records);
    let took = start.elapsed().as_secs_f64();
    let line = summary
        .to_string()
        .replacen(" requests,", &format!(" requests in {took:.1} s,"), 1);
    eprintln!("tests/workload/load: {line}");
    std::process::ExitCode::from(u8::from(summary.failed > 0))
}
