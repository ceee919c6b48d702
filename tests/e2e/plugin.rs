//! `kubectl openmed`: the binary installed as a kubectl plugin (a symlink
//! named `kubectl-openmed` on PATH), found and run by the real kubectl,
//! against the test cluster.

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
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

/// Waits for a child with a deadline; kills it and panics past it.
fn finish(mut child: Child, deadline: Duration) -> Output {
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if start.elapsed() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "kubectl openmed still running after {deadline:?}\nstderr:\n{}",
                text(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn rollback_refuses_what_is_not_retained_and_follows_what_is() {
    block_on(async {
        let env = Env::new("plugin-rollback").await;
        let (v1, v2, v3) = (env.version("v1"), env.version("v2"), env.version("v3"));
        env.apply(&deployment_yaml("svc", "openmed-service", "boot"))
            .await;
        env.apply(&model_yaml("svc", &v1, "")).await;
        env.wait_ready("svc", &v1).await;
        env.set_spec("svc", json!({"version": v2})).await;
        env.wait_ready("svc", &v2).await;

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
        let stored = env.models().get("svc").await.unwrap();
        assert!(
            !stored
                .metadata
                .annotations
                .unwrap_or_default()
                .contains_key("openmed.ai/rollback-to")
        );

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
        let ready = kubectl_openmed(&env, &["wait", "svc", "--for", "ready", "--timeout", "2m"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        env.apply(&deployment_yaml("svc", "openmed-service", "boot"))
            .await;
        env.apply(&model_yaml(
            "svc",
            &v1,
            "  rolloutStrategy:\n    progressDeadlineSeconds: 8\n",
        ))
        .await;
        let out = finish(ready, Duration::from_secs(150));
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert!(text(&out.stderr).contains("not found yet"));
        assert!(text(&out.stdout).contains(&format!("serving {v1}")));

        // A version that never warms: --for ready ends 1 at the rollback,
        // --for rolled-back ends 0.
        env.set_spec("svc", json!({"version": bad})).await;
        let ready = kubectl_openmed(&env, &["wait", "svc", "--for", "ready", "--timeout", "2m"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let rolled_back = kubectl_openmed(
            &env,
            &["wait", "svc", "--for", "rolled-back", "--timeout", "2m"],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
        let out = finish(ready, Duration::from_secs(150));
        assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains("phase RolledBack"),
            "{}",
            text(&out.stderr)
        );
        let out = finish(rolled_back, Duration::from_secs(150));
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert!(text(&out.stdout).contains(&format!("serving {v1}")));

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
