//! `kubectl openmed`: the binary installed as a kubectl plugin (a symlink
//! named `kubectl-openmed` on PATH), found and run by the real kubectl,
//! against the test cluster.

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use openmed_op::api::Phase;
use serde_json::json;

use crate::env::*;
use crate::support::*;
use crate::trial;

pub fn trials() -> Vec<libtest_mimic::Trial> {
    vec![
        trial(
            "plugin::rollback_refuses_what_is_not_retained_and_follows_what_is",
            rollback_refuses_what_is_not_retained_and_follows_what_is,
        ),
        trial(
            "plugin::wait_exits_by_the_outcome",
            wait_exits_by_the_outcome,
        ),
        trial(
            "plugin::status_shows_the_rollout_and_watch_redraws_it",
            status_shows_the_rollout_and_watch_redraws_it,
        ),
    ]
}

/// A folder holding `kubectl-openmed`, a symlink to the binary under test:
/// how users install the plugin.
fn plugin_dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = cluster_dir().join("plugin");
        std::fs::create_dir_all(&dir).unwrap();
        let link = dir.join("kubectl-openmed");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(binary(), &link).unwrap();
        dir
    })
}

/// `kubectl openmed ARGS -n NAMESPACE`, as the test cluster's admin.
fn kubectl_openmed(env: &Env, args: &[&str]) -> Command {
    let path = format!(
        "{}:{}",
        plugin_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut command = Command::new(kubectl_binary());
    command
        .arg("openmed")
        .args(args)
        .args(["-n", &env.ns.name])
        .env("PATH", path)
        .env("KUBECONFIG", kubeconfig());
    command
}

fn run(env: &Env, args: &[&str]) -> Output {
    kubectl_openmed(env, args)
        .output()
        .expect("kubectl openmed runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A `kubectl openmed` process whose output is read as it comes.
struct Running {
    child: Child,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl Running {
    fn start(env: &Env, args: &[&str]) -> Self {
        let mut child = kubectl_openmed(env, args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl openmed starts");
        let stdout = Arc::new(Mutex::new(String::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        let readers = vec![
            collect(child.stdout.take().unwrap(), stdout.clone()),
            collect(child.stderr.take().unwrap(), stderr.clone()),
        ];
        Running {
            child,
            stdout,
            stderr,
            readers,
        }
    }

    fn stdout(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits for it to exit within `deadline` (killing it and panicking
    /// past it): its exit code, stdout and stderr.
    fn finish(mut self, deadline: Duration) -> (Option<i32>, String, String) {
        let start = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if start.elapsed() > deadline {
                let _ = self.child.kill();
                panic!(
                    "kubectl openmed still running after {deadline:?}\nstderr:\n{}",
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        for reader in self.readers.drain(..) {
            reader.join().unwrap();
        }
        (status.code(), self.stdout(), self.stderr())
    }

    /// Stops it (for `--watch`, which runs until interrupted).
    fn stop(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for reader in self.readers.drain(..) {
            reader.join().unwrap();
        }
        self.stdout()
    }
}

fn collect(
    mut from: impl std::io::Read + Send + 'static,
    into: Arc<Mutex<String>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = from.read(&mut buf) {
            if n == 0 {
                break;
            }
            into.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    })
}

fn rollback_refuses_what_is_not_retained_and_follows_what_is() {
    block_on(async {
        let env = Env::new("plugin-rollback").await;
        let (v1, v2) = env.v1_then_v2().await;
        let v3 = env.version("v3");

        // Never rolled out: refused before anything is written.
        let out = run(&env, &["rollback", "svc", &v3]);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains(&format!(
                "openmed.ai/rollback-to={v3} is not a retained version (retained: {v2}, {v1}); nothing was changed"
            )),
            "{}",
            text(&out.stderr)
        );
        assert_eq!(env.annotation("svc", "openmed.ai/rollback-to").await, None);

        // Retained: annotated, followed to the end, exit 0.
        let out = run(&env, &["rollback", "svc", &v1, "--timeout", "2m"]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert!(
            text(&out.stdout).contains(&format!("svc: rolled back to {v1}")),
            "{}",
            text(&out.stdout)
        );
        // Progress on stderr: at least the phase it went through.
        assert!(text(&out.stderr).contains("following the rollback"));
        let s = env.status("svc").await;
        assert_eq!(s.active_version.as_deref(), Some(v1.as_str()));
        assert_eq!(s.phase, Some(Phase::RolledBack));
        env.finish().await;
    });
}

fn wait_exits_by_the_outcome() {
    block_on(async {
        let env = Env::new("plugin-wait").await;
        let (v1, bad) = (env.version("v1"), env.version("bad"));
        mark_unready(&env.client, &[&bad]).await;
        // Started before the resource exists, as a CI job after a sync.
        let ready = Running::start(&env, &["wait", "svc", "--for", "ready", "--timeout", "2m"]);
        wait_for(
            "wait to report the resource missing",
            Duration::from_secs(30),
            || async { ready.stderr().contains("not found yet").then_some(()) },
        )
        .await;
        env.apply(&deployment_yaml("svc", "openmed-service", "boot"))
            .await;
        env.apply(&model_yaml(
            "svc",
            &v1,
            "  rolloutStrategy:\n    progressDeadlineSeconds: 8\n",
        ))
        .await;
        let (code, stdout, stderr) = ready.finish(Duration::from_secs(150));
        assert_eq!(code, Some(0), "{stderr}");
        assert!(stdout.contains(&format!("serving {v1}")), "{stdout}");

        // A version that never warms: --for ready ends 1 at the rollback,
        // --for rolled-back ends 0.
        env.set_spec("svc", json!({"version": bad})).await;
        let ready = Running::start(&env, &["wait", "svc", "--for", "ready", "--timeout", "2m"]);
        let rolled_back = Running::start(
            &env,
            &["wait", "svc", "--for", "rolled-back", "--timeout", "2m"],
        );
        let (code, _, stderr) = ready.finish(Duration::from_secs(150));
        assert_eq!(code, Some(1), "{stderr}");
        assert!(stderr.contains("phase RolledBack"), "{stderr}");
        let (code, stdout, stderr) = rolled_back.finish(Duration::from_secs(150));
        assert_eq!(code, Some(0), "{stderr}");
        assert!(stdout.contains(&format!("serving {v1}")), "{stdout}");

        // Out of time: exit 1, with what it last saw.
        let out = run(
            &env,
            &["wait", "missing", "--for", "ready", "--timeout", "1s"],
        );
        assert_eq!(out.status.code(), Some(1));
        assert!(
            text(&out.stderr).contains("missing: no answer within 1s; last seen: not found yet"),
            "{}",
            text(&out.stderr)
        );
        env.finish().await;
    });
}

/// The status view with what differs from run to run replaced (the
/// namespace, ReplicaSet name hashes, event ages) and column padding, which
/// follows their widths, collapsed to two spaces.
fn normalized(view: &str, namespace: &str) -> String {
    let mut out = String::new();
    for line in view.replace(namespace, "<ns>").lines() {
        let indent = line.len() - line.trim_start().len();
        let cells: Vec<String> = line
            .trim_start()
            .split("  ")
            .filter(|c| !c.is_empty())
            .map(|c| c.trim().to_owned())
            .collect();
        let cells: Vec<String> = cells
            .into_iter()
            .enumerate()
            .map(|(i, cell)| {
                let is_age = i == 0
                    && cell.len() >= 2
                    && cell.ends_with(['s', 'm', 'h', 'd'])
                    && cell[..cell.len() - 1].chars().all(|c| c.is_ascii_digit());
                let is_set = cell
                    .strip_prefix("svc-")
                    .is_some_and(|h| h.len() >= 8 && h.chars().all(|c| c.is_ascii_alphanumeric()));
                match () {
                    _ if indent == 2 && is_age => "<age>".to_owned(),
                    _ if is_set => "svc-<hash>".to_owned(),
                    _ => cell,
                }
            })
            .collect();
        out.push_str(&" ".repeat(indent));
        out.push_str(&cells.join("  "));
        out.push('\n');
    }
    out
}

fn golden_path(name: &str) -> PathBuf {
    root().join("tests/golden").join(name)
}

fn status_shows_the_rollout_and_watch_redraws_it() {
    block_on(async {
        let env = Env::new("plugin-status").await;
        env.v1_then_v2().await;
        let v3 = env.version("v3");

        // The view, once the old ReplicaSet has scaled down, equals the
        // golden file (UPDATE_GOLDEN=1 rewrites it).
        let path = golden_path("status.txt");
        let update = std::env::var_os("UPDATE_GOLDEN").is_some();
        let expected = std::fs::read_to_string(&path).unwrap_or_default();
        let shown = wait_until(
            "the status view to settle as in tests/golden/status.txt",
            Duration::from_secs(60),
            || async {
                let out = run(&env, &["status", "svc"]);
                assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
                normalized(&text(&out.stdout), &env.ns.name)
            },
            |view| {
                if update {
                    view.contains("svc-<hash>  OpenMed/v1-<ns>  0/0")
                } else {
                    *view == expected
                }
            },
        )
        .await;
        if update {
            std::fs::write(&path, &shown).unwrap();
        }

        // --watch: one view at once, another for each change.
        let watch = Running::start(&env, &["status", "svc", "--watch"]);
        wait_for("the first view", Duration::from_secs(30), || async {
            watch.stdout().contains("Events").then_some(())
        })
        .await;
        env.set_spec("svc", json!({"version": v3})).await;
        let active = format!("Active:     {v3}");
        wait_for("a redraw serving v3", Duration::from_secs(60), || async {
            watch.stdout().contains(&active).then_some(())
        })
        .await;
        let seen = watch.stop();
        assert!(
            seen.matches("Name:").count() >= 2,
            "redrawn on change:\n{seen}"
        );
        assert!(seen.contains(&format!("rolling out {v3}")), "{seen}");
        env.finish().await;
    });
}
