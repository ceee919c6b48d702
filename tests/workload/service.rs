//! The real OpenMed service as a local process, for the tests that talk to
//! it: `tests/workload.rs` and the load generator's own tests include this
//! file. Everything listens on 127.0.0.1; every wait has a deadline.

#![allow(dead_code)] // each including test uses its part

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// The repository root.
pub fn root() -> PathBuf {
    let mut dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    while !dir.join("tests/workload/build").exists() {
        assert!(dir.pop(), "the repository root is above the crate");
    }
    dir
}

/// The installed workload (built on first use, then cached).
pub fn workload() -> PathBuf {
    let out = Command::new(root().join("tests/workload/build"))
        .stderr(Stdio::inherit())
        .output()
        .expect("tests/workload/build runs");
    assert!(out.status.success(), "tests/workload/build failed");
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// `make-model ID ARGS` into `cache`; its summary.
pub fn make_model(cache: &Path, id: &str, args: &[&str]) -> Value {
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
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One service process, its home and profile in a folder of its own.
pub struct Service {
    /// The process.
    pub child: Child,
    /// Its loopback port.
    pub port: u16,
    dir: tempfile::TempDir,
}

impl Service {
    /// Starts the service preloading `model` from `cache` (the workload's
    /// own when `None`).
    pub fn start(model: &str, cache: Option<&Path>) -> Service {
        Service::start_app(model, cache, None)
    }

    /// Like [`Service::start`], serving the ASGI `app` (e.g. the test
    /// image's `openmed_image:app`) through the service's own launcher.
    pub fn start_app(model: &str, cache: Option<&Path>, app: Option<&str>) -> Service {
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
            .args(["-m", "openmed.service.logging"])
            .args(app)
            .args(["--host", "127.0.0.1"])
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
            .env("PYTHONPATH", workload.join("image"))
            .env("HOSTNAME", Service::POD_NAME)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        Service { child, port, dir }
    }

    /// The HOSTNAME the service runs with, as a kubelet sets a pod's name.
    pub const POD_NAME: &'static str = "openmed-service-5d8f7c9b4-x2k8q";

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("service.log")).unwrap_or_default()
    }

    /// Waits until `/readyz` answers 200: the service listens only once
    /// its preload is done. Panics with the log if it exits first.
    pub async fn ready(&mut self, client: &reqwest::Client) {
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
    pub fn exit_code(&mut self) -> Option<i32> {
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

    pub async fn extract(&self, client: &reqwest::Client, model: &str, text: &str) -> (u16, Value) {
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

pub fn client() -> reqwest::Client {
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

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}
