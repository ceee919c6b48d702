//! Flux's view of an OpenMedModel on the real control plane: kstatus (the
//! rules behind Flux health checks and kpt live apply), built from its Go
//! module, reports InProgress while a model rolls out, Current once it is
//! Ready, and Failed when a rollout failed and stalled.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use libtest_mimic::Trial;

use crate::operator::{Env, deployment_yaml, model_yaml};
use crate::support::*;
use crate::trial;

pub fn trials() -> Vec<Trial> {
    vec![trial(
        "gitops::kstatus_follows_a_rollout_a_success_and_a_failure",
        kstatus_follows_a_rollout_a_success_and_a_failure,
    )]
}

fn kstatus_binary() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| built_tools("tests/gitops/build").join("kstatus"))
        .clone()
}

/// kstatus of an OpenMedModel, e.g. "InProgress: ...".
fn kstatus(namespace: &str, name: &str) -> String {
    let (ok, object, err) = kubectl(&["get", "omm", name, "-n", namespace, "-o", "json"]);
    assert!(ok, "{err}");
    let mut child = Command::new(kstatus_binary())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), object.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

fn kstatus_follows_a_rollout_a_success_and_a_failure() {
    block_on(async {
        let env = Env::new("kstatus").await;
        let (v1, bad) = (env.version("v1"), env.version("bad"));
        mark_unready(&env.client, &[&bad]).await;
        env.apply(&deployment_yaml("svc", "openmed-service", "boot"))
            .await;
        let ns = env.ns.name.clone();
        env.apply(&model_yaml(
            "svc",
            &v1,
            "  rolloutStrategy:\n    progressDeadlineSeconds: 8\n",
        ))
        .await;
        // Before the operator writes a status, kstatus cannot tell and says
        // Current; judge once the operator has reported Ready.
        env.wait_ready("svc", &v1).await;
        let current = kstatus(&ns, "svc");
        assert!(current.starts_with("Current"), "{current}");
        env.apply(&model_yaml(
            "svc",
            &bad,
            "  rolloutStrategy:\n    progressDeadlineSeconds: 8\n",
        ))
        .await;
        let rolling = wait_until(
            "kstatus InProgress while rolling out",
            Duration::from_secs(60),
            || async { kstatus(&ns, "svc") },
            |s| s.starts_with("InProgress"),
        )
        .await;
        assert!(!rolling.is_empty());
        let failed = wait_until(
            "kstatus Failed once the rollout failed",
            Duration::from_secs(90),
            || async { kstatus(&ns, "svc") },
            |s| s.starts_with("Failed"),
        )
        .await;
        let s = env
            .wait_status("svc", "the rollback", |s| s.rollback_count == Some(1))
            .await;
        assert_eq!(s.active_version.as_deref(), Some(v1.as_str()));
        eprintln!("kstatus: {failed}");
        env.finish().await;
    });
}
