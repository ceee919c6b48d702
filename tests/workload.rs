//! The real OpenMed REST service (openmed 3.1.0 from PyPI, its CPU ONNX
//! backend, installed by `tests/workload/build`) serving the synthetic
//! models `tests/workload/make-model` writes: each model tags what it was
//! made to tag, misses what it was made to miss, fails requests when made
//! to, and a pointer the service cannot load ends the process with its
//! reason. The service's own `validate_model_name` and our
//! `is_service_model_id` give the same answer on the same inputs.
//!
//! Every process listens on 127.0.0.1 only and is stopped at the end of
//! its test; every wait has a deadline.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The installed workload (built on first use, then cached).
fn workload() -> PathBuf {
    let out = Command::new(root().join("tests/workload/build"))
        .stderr(Stdio::inherit())
        .output()
        .expect("tests/workload/build runs");
    assert!(out.status.success(), "tests/workload/build failed");
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// `make-model ID ARGS` into `cache`; its summary.
fn make_model(cache: &Path, id: &str, args: &[&str]) -> Value {
    let out = Command::new(root().join("tests/workload/make-model"))
        .arg(id)
        .args(["--cache", cache.to_str().unwrap()])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "make-model {id}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A free loopback port.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One service process, its home and profile in a folder of its own.
struct Service {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Service {
    /// Starts the service preloading `model` from `cache` (the workload's
    /// own when `None`).
    fn start(model: &str, cache: Option<&Path>) -> Service {
        let workload = workload();
        let dir = tempfile::tempdir().unwrap();
        let cache = cache.map_or_else(|| workload.join("models"), Path::to_path_buf);
        let profiles = dir.path().join("config/openmed/profiles");
        std::fs::create_dir_all(&profiles).unwrap();
        std::fs::write(
            profiles.join("synthetic.toml"),
            format!(
                "backend = \"onnx\"\ndevice = \"cpu\"\nlocal_only = true\ncache_dir = \"{}\"\nonnx_intra_op_num_threads = 1\n",
                cache.display()
            ),
        )
        .unwrap();
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("service.log")).unwrap();
        let child = Command::new(workload.join("venv/bin/python"))
            .args(["-m", "openmed.service.logging", "--host", "127.0.0.1"])
            .args(["--port", &port.to_string()])
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", dir.path())
            .env("XDG_CONFIG_HOME", dir.path().join("config"))
            .env("OPENMED_PROFILE", "synthetic")
            .env("HF_HUB_OFFLINE", "1")
            .env("OPENMED_OFFLINE", "1")
            .env("OPENMED_SERVICE_PRELOAD_MODELS", model)
            .env("OPENMED_SERVICE_TRUSTED_HOSTS", "127.0.0.1,localhost")
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        Service { child, port, dir }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("service.log")).unwrap_or_default()
    }

    /// Waits until `/readyz` answers 200: the service listens only once
    /// its preload is done. Panics with the log if it exits first.
    async fn ready(&mut self, client: &reqwest::Client) {
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!(
                    "the service exited ({status}) before it was ready:\n{}",
                    self.log()
                );
            }
            if let Ok(answer) = client.get(self.url("/readyz")).send().await
                && answer.status() == 200
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "not ready in 180 s:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits for the process to end by itself; its exit code.
    fn exit_code(&mut self) -> Option<i32> {
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            assert!(
                Instant::now() < deadline,
                "still running after 180 s:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    async fn extract(&self, client: &reqwest::Client, model: &str, text: &str) -> (u16, Value) {
        let answer = client
            .post(self.url("/pii/extract"))
            .json(&json!({"text": text, "model_name": model, "use_smart_merging": false}))
            .send()
            .await
            .unwrap();
        let status = answer.status().as_u16();
        (status, answer.json().await.unwrap_or(Value::Null))
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        // A connection per request: after an error inside the app, the
        // service may reset the connection it answered on.
        .pool_max_idle_per_host(0)
        .no_proxy()
        .build()
        .unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

const TEXT: &str = "Patient John Smith from Boston was seen on 2024-03-15, phone 617-555-0142.";

/// `(label, text)` of every entity found.
fn entities(answer: &Value) -> Vec<(String, String)> {
    answer["entities"]
        .as_array()
        .unwrap_or_else(|| panic!("no entities in {answer}"))
        .iter()
        .map(|e| {
            (
                e["label"].as_str().unwrap().to_owned(),
                e["text"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn a_synthetic_model_warms_and_tags_what_it_was_made_to_tag() {
    runtime().block_on(async {
        let client = client();
        let mut service = Service::start("OpenMed/synthetic-pii-v1", None);
        service.ready(&client).await;
        let live = client.get(service.url("/livez")).send().await.unwrap();
        assert_eq!(live.status(), 200);
        let (status, answer) = service
            .extract(&client, "OpenMed/synthetic-pii-v1", TEXT)
            .await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["model_name"], "OpenMed/synthetic-pii-v1");
        let found = entities(&answer);
        for (label, text) in [
            ("NAME", "John Smith"),
            ("LOCATION", "Boston"),
            ("DATE", "2024-03-15"),
            ("PHONE", "617-555-0142"),
        ] {
            assert!(
                found.contains(&(label.to_owned(), text.to_owned())),
                "{label} {text:?} not in {found:?}"
            );
        }
        // A model it does not serve is refused, not answered by another.
        let (status, _) = service
            .extract(&client, "OpenMed/synthetic-pii-v2", TEXT)
            .await;
        assert_eq!(status, 422);
    });
}

#[test]
fn a_model_made_to_miss_a_label_never_tags_it() {
    runtime().block_on(async {
        let client = client();
        let cache = tempfile::tempdir().unwrap();
        make_model(cache.path(), "OpenMed/misses-name", &["--misses", "NAME"]);
        let mut service = Service::start("OpenMed/misses-name", Some(cache.path()));
        service.ready(&client).await;
        let (status, answer) = service.extract(&client, "OpenMed/misses-name", TEXT).await;
        assert_eq!(status, 200, "{answer}");
        let found = entities(&answer);
        assert!(found.iter().all(|(label, _)| label != "NAME"), "{found:?}");
        assert!(
            found.contains(&("LOCATION".to_owned(), "Boston".to_owned())),
            "{found:?}"
        );
    });
}

#[test]
fn a_model_made_to_fail_requests_warms_and_then_fails_every_request() {
    runtime().block_on(async {
        let client = client();
        let cache = tempfile::tempdir().unwrap();
        make_model(cache.path(), "OpenMed/fails", &["--fail-requests"]);
        let mut service = Service::start("OpenMed/fails", Some(cache.path()));
        service.ready(&client).await;
        for _ in 0..3 {
            let (status, answer) = service.extract(&client, "OpenMed/fails", TEXT).await;
            assert!(status >= 500, "{status}: {answer}");
        }
        let ready = client.get(service.url("/readyz")).send().await.unwrap();
        assert_eq!(ready.status(), 200, "readiness does not see inference fail");
    });
}

#[test]
fn a_pointer_the_service_cannot_load_ends_the_process_with_its_reason() {
    let cases = [
        ("OpenMed/not-in-the-cache", "LocalEntryNotFoundError"),
        ("OpenMed/pii:v2", "InputError"),
    ];
    for (pointer, cause) in cases {
        let mut service = Service::start(pointer, None);
        assert_eq!(
            service.exit_code(),
            Some(3),
            "{pointer}:\n{}",
            service.log()
        );
        let log = service.log();
        assert!(
            log.contains("Application startup failed"),
            "{pointer}:\n{log}"
        );
        assert!(log.contains(cause), "{pointer}: no {cause}:\n{log}");
    }
}

#[test]
fn make_model_is_deterministic_and_writes_whole_models_only() {
    let one = tempfile::tempdir().unwrap();
    let two = tempfile::tempdir().unwrap();
    let a = make_model(one.path(), "OpenMed/same", &["--labels", "NAME,DATE"]);
    let b = make_model(two.path(), "OpenMed/same", &["--labels", "NAME,DATE"]);
    assert_eq!(a["commit"], b["commit"]);
    let model = |dir: &Path| {
        std::fs::read(
            dir.join("models--OpenMed--same/snapshots")
                .join(a["commit"].as_str().unwrap())
                .join("model.onnx"),
        )
        .unwrap()
    };
    assert_eq!(model(one.path()), model(two.path()));
    // Again with the same arguments: nothing to do. With others: refused
    // unless --force, and nothing half-written is left either way.
    make_model(one.path(), "OpenMed/same", &["--labels", "NAME,DATE"]);
    let out = Command::new(root().join("tests/workload/make-model"))
        .args([
            "OpenMed/same",
            "--cache",
            one.path().to_str().unwrap(),
            "--misses",
            "NAME",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let names: Vec<String> = std::fs::read_dir(one.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["models--OpenMed--same"]);
}

/// The service's own rule, asked of the installed service on each input
/// (from a folder where no input names an existing path).
#[test]
fn our_pointer_rule_is_the_services_own() {
    let inputs = [
        "OpenMed/pii-v2",
        "pii",
        "OpenMed/synthetic_pii.v1",
        "a-b/c.d_e",
        "a/b/c",
        "OpenMed/pii:v2",
        "org/model@main",
        "OpenMed/pii@sha256:0123abcd",
        "OpenMed/pii+local",
        "OpenMed/pii~1",
        "OpenMed/",
        "/pii",
        "bad name",
    ];
    let script = "\
import json, sys
from openmed.utils.validation import validate_model_name
answers = {}
for name in json.load(sys.stdin):
    try:
        validate_model_name(name)
        answers[name] = True
    except Exception:
        answers[name] = False
print(json.dumps(answers))
";
    let empty = tempfile::tempdir().unwrap();
    let mut child = Command::new(workload().join("venv/bin/python"))
        .args(["-c", script])
        .current_dir(empty.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    serde_json::to_writer(child.stdin.take().unwrap(), &inputs).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let service: serde_json::Map<String, Value> = serde_json::from_slice(&out.stdout).unwrap();
    for input in inputs {
        assert_eq!(
            openmed_op::api::rules::is_service_model_id(input),
            service[input] == true,
            "{input:?}: the service says {}",
            service[input]
        );
    }
}
