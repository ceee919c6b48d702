//! The load generator against the real OpenMed service: every request it
//! sends is answered and recorded, the rate and the bounds hold, and it
//! refuses to send anywhere but loopback.

#[path = "../../service.rs"]
mod service;

use std::process::Command;

use serde_json::Value;
use service::*;

fn load(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_openmed-load"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn every_request_is_sent_answered_and_recorded() {
    let mut service = Service::start("OpenMed/synthetic-pii-v1", None);
    runtime().block_on(service.ready(&client()));
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("load.jsonl");
    let url = service.url("");
    let run = load(&[
        "--url",
        &url,
        "--rps",
        "10",
        "--duration",
        "2",
        "--model",
        "OpenMed/synthetic-pii-v1",
        "--out",
        out.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "{stderr}\n{}", service.log());
    assert!(stderr.contains("20 requests in"), "{stderr}");
    assert!(stderr.contains(", 0 failed;"), "{stderr}");
    let records: Vec<Value> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 20);
    for (i, record) in records.iter().enumerate() {
        assert_eq!(record["i"], i);
        assert_eq!(record["status"], 200, "{record}");
        assert_eq!(record["model_name"], "OpenMed/synthetic-pii-v1");
        // Open loop: request i leaves at i / rps, not after the one before.
        let sent = record["sent_ms"].as_f64().unwrap();
        assert!(sent >= i as f64 * 100.0 - 1.0, "{record}");
    }

    // A model the service does not serve: answered, and counted as failed.
    let run = load(&[
        "--url",
        &url,
        "--rps",
        "5",
        "--duration",
        "1",
        "--model",
        "OpenMed/not-served",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(run.status.code(), Some(1));
    let first: Value = serde_json::from_str(
        std::fs::read_to_string(&out)
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(first["status"], 422, "{first}");
}

#[test]
fn only_loopback_is_sent_to() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("load.jsonl");
    for url in [
        "http://10.0.0.1:80",
        "http://example.com",
        "https://127.0.0.1:1",
    ] {
        let run = load(&[
            "--url",
            url,
            "--rps",
            "1",
            "--duration",
            "1",
            "--out",
            out.to_str().unwrap(),
        ]);
        assert_eq!(run.status.code(), Some(2), "{url}");
        assert!(!out.exists(), "{url}: nothing is written");
    }
    // Nothing listens: each request fails, and the run still ends.
    let port = free_port();
    let run = load(&[
        "--url",
        &format!("http://127.0.0.1:{port}"),
        "--rps",
        "4",
        "--duration",
        "1",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(run.status.code(), Some(1));
    let text = std::fs::read_to_string(&out).unwrap();
    assert_eq!(text.lines().count(), 4);
    assert!(text.contains("\"error\":\"connect\""), "{text}");
}
