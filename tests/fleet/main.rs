//! Fleet rollouts in gated waves on three control planes (`tests/fleet/up`):
//! staging, hospital A and hospital B, each with its own API server and
//! openmed-op, and Flux's own controllers on staging applying each
//! cluster's folder of the fleet's repository through its kubeconfig,
//! wave after wave (`examples/fleet`, docs/fleet.md).
//!
//! `cargo test --test fleet` runs the first scenario (CI runs it); with
//! `FLEET_ALL=1` the other two as well (the documented command of
//! docs/fleet.md, whose results are committed). With `FLEET_RESULTS=FILE`
//! each scenario appends its figures to FILE as a JSON line.

#[allow(dead_code)]
#[path = "../e2e/support.rs"]
mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::apps::v1::Deployment;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use libtest_mimic::{Arguments, Trial};
use openmed_op::api::{OpenMedModel, OpenMedModelStatus, Phase};
use serde_json::{Value, json};

use support::{block_on, client_for, mark_unready, root, wait_until};

/// The waves, in order.
const WAVES: [&str; 3] = ["staging", "hospital-a", "hospital-b"];
/// The soak every model of the fleet gets (`FLEET_SOAK_SECONDS`).
const SOAK_S: i64 = 10;
/// How long a scenario waits for the whole fleet.
const FLEET_DEADLINE: Duration = Duration::from_secs(300);

fn main() {
    let mut args = Arguments::from_args();
    // The scenarios share one fleet and follow each other.
    args.test_threads = Some(1);
    let all = std::env::var_os("FLEET_ALL").is_some();
    let trials = vec![
        trial(
            "fleet::one_commit_rolls_staging_then_each_hospital_once_the_wave_before_soaked",
            one_commit_rolls_staging_then_each_hospital_once_the_wave_before_soaked,
            false,
        ),
        trial(
            "fleet::a_version_that_fails_in_staging_never_reaches_a_hospital",
            a_version_that_fails_in_staging_never_reaches_a_hospital,
            !all,
        ),
        trial(
            "fleet::an_aborted_soak_stops_the_waves",
            an_aborted_soak_stops_the_waves,
            !all,
        ),
    ];
    let run = trials
        .iter()
        .any(|t| support::selected(&args, t.name()) && !t.has_ignored_flag());
    let conclusion = libtest_mimic::run(&args, trials);
    if run && !args.list && FLEET.get().is_some() {
        fleet_down();
    }
    support::print_failure_summary();
    conclusion.exit();
}

fn trial(name: &'static str, test: fn(&Fleet), ignored: bool) -> Trial {
    Trial::test(name, move || support::recorded(name, move || test(fleet())))
        .with_ignored_flag(ignored)
}

/// The running fleet: its clusters' kubeconfigs and the repository.
struct Fleet {
    dir: PathBuf,
    kubeconfigs: BTreeMap<&'static str, PathBuf>,
    git_url: String,
}

static FLEET: OnceLock<Result<Fleet, String>> = OnceLock::new();

/// `tests/fleet/up target/fleet`, once, with this build's openmed-op.
fn fleet() -> &'static Fleet {
    match FLEET.get_or_init(|| {
        std::panic::catch_unwind(start_fleet)
            .map_err(|_| "tests/fleet/up failed (above)".to_owned())
    }) {
        Ok(fleet) => fleet,
        Err(why) => panic!("{why}"),
    }
}

fn start_fleet() -> Fleet {
    {
        let dir = root().join("target/fleet");
        eprintln!(
            "fleet: tests/fleet/up {} (three control planes, Flux, the waves)",
            dir.display()
        );
        let out = Command::new(root().join("tests/fleet/up"))
            .arg(&dir)
            .env("OPENMED_OP", env!("CARGO_BIN_EXE_openmed-op"))
            // The first commit soaks for nothing (nothing waits on it, and
            // three soaks in a row are half a minute of CI); each scenario's
            // commit sets its own soak.
            .env("FLEET_SOAK_SECONDS", "0")
            .stderr(std::process::Stdio::inherit())
            .output()
            .expect("tests/fleet/up runs");
        assert!(out.status.success(), "tests/fleet/up failed (above)");
        let env = std::fs::read_to_string(dir.join("fleet.env")).unwrap();
        let var = |name: &str| {
            env.lines()
                .find_map(|l| l.strip_prefix(&format!("{name}=")))
                .unwrap_or_else(|| panic!("{name} in fleet.env"))
                .to_owned()
        };
        let kubeconfigs = BTreeMap::from([
            ("staging", PathBuf::from(var("STAGING_KUBECONFIG"))),
            ("hospital-a", PathBuf::from(var("HOSPITAL_A_KUBECONFIG"))),
            ("hospital-b", PathBuf::from(var("HOSPITAL_B_KUBECONFIG"))),
        ]);
        Fleet {
            dir,
            kubeconfigs,
            git_url: var("GIT_URL"),
        }
    }
}

fn fleet_down() {
    let _ = Command::new(root().join("tests/fleet/down"))
        .arg(root().join("target/fleet"))
        .status();
}

impl Fleet {
    async fn client(&self, cluster: &str) -> Client {
        client_for(&self.kubeconfigs[cluster], None).await
    }

    async fn status(&self, cluster: &str) -> OpenMedModelStatus {
        let api: Api<OpenMedModel> = Api::namespaced(self.client(cluster).await, "openmed");
        api.get("openmed-service")
            .await
            .ok()
            .and_then(|m| m.status)
            .unwrap_or_default()
    }

    async fn statuses(&self) -> Vec<OpenMedModelStatus> {
        let mut all = Vec::new();
        for wave in WAVES {
            all.push(self.status(wave).await);
        }
        all
    }

    /// Each cluster's pod template, to tell whether a wave's pods changed.
    async fn templates(&self) -> Vec<Value> {
        let mut all = Vec::new();
        for wave in WAVES {
            let api: Api<Deployment> = Api::namespaced(self.client(wave).await, "openmed");
            let d = api.get("openmed-service").await.unwrap();
            all.push(serde_json::to_value(d.spec.unwrap().template).unwrap());
        }
        all
    }

    /// The Kustomization of `wave` on staging, the management cluster:
    /// its Ready condition and the revisions it attempted and applied.
    async fn wave(&self, wave: &str) -> (String, String, String, String) {
        let out = Command::new(self.dir.join("staging/bin/kubectl"))
            .args(["--kubeconfig"])
            .arg(&self.kubeconfigs["staging"])
            .args([
                "-n",
                "flux-system",
                "get",
                "kustomization",
                wave,
                "-o",
                "json",
            ])
            .output()
            .unwrap();
        let k: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let ready = k["status"]["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
            .cloned()
            .unwrap_or(Value::Null);
        let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        (
            text(&ready["status"]),
            text(&ready["message"]),
            text(&k["status"]["lastAttemptedRevision"]),
            text(&k["status"]["lastAppliedRevision"]),
        )
    }

    /// Requests each cluster's openmed-op sent from byte `from` of each
    /// audit log on.
    fn operator_requests(&self, from: &[u64]) -> Vec<usize> {
        WAVES
            .iter()
            .zip(from)
            .map(|(wave, from)| {
                let log = self.dir.join(wave).join("logs/audit.log");
                let text = std::fs::read(log).unwrap_or_default();
                String::from_utf8_lossy(&text[(*from as usize).min(text.len())..])
                    .lines()
                    .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                    .filter(|e| {
                        e["stage"] == "ResponseComplete"
                            && e["userAgent"]
                                .as_str()
                                .is_some_and(|u| u.starts_with("openmed-operator/"))
                            && e["verb"] != "watch"
                    })
                    .count()
            })
            .collect()
    }

    fn audit_ends(&self) -> Vec<u64> {
        WAVES
            .iter()
            .map(|w| {
                std::fs::metadata(self.dir.join(w).join("logs/audit.log")).map_or(0, |m| m.len())
            })
            .collect()
    }
}

/// A working copy of the fleet's repository.
struct Repo {
    dir: tempfile::TempDir,
}

impl Repo {
    fn clone(fleet: &Fleet) -> Repo {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repo { dir };
        let out = Command::new("git")
            .args(["clone", "-q", &fleet.git_url, "."])
            .current_dir(repo.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        repo.git(&["config", "user.email", "platform@example.org"]);
        repo.git(&["config", "user.name", "Platform team"]);
        repo
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn git(&self, args: &[&str]) -> String {
        let out = Command::new("git")
            .args(args)
            .current_dir(self.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    /// Sets `key: value` under `rolloutStrategy` or `spec` in every
    /// cluster's model, as a fleet bump does.
    fn set_everywhere(&self, edits: &[(&str, &str)]) {
        for wave in WAVES {
            let path = self
                .path()
                .join("clusters")
                .join(wave)
                .join("openmedmodel.yaml");
            let mut text = std::fs::read_to_string(&path).unwrap();
            for (key, value) in edits {
                let prefix = format!("{key}: ");
                let line = text
                    .lines()
                    .find(|l| l.trim_start().starts_with(&prefix))
                    .unwrap_or_else(|| panic!("{key} in {}", path.display()))
                    .to_owned();
                let indent = &line[..line.len() - line.trim_start().len()];
                text = text.replace(&line, &format!("{indent}{key}: {value}"));
            }
            std::fs::write(&path, text).unwrap();
        }
    }

    fn push(&self, message: &str) -> String {
        self.git(&["commit", "-q", "-am", message]);
        self.git(&["push", "-q", "origin", "HEAD:main"]);
        self.git(&["rev-parse", "HEAD"])
    }
}

fn soaked_at(s: &OpenMedModelStatus, version: &str) -> Option<i64> {
    let soak = s.soak.as_ref().filter(|k| k.version == version)?;
    Some(soak.soaked_time.as_ref()?.0.as_second())
}

fn epoch() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Appends a line to `$FLEET_RESULTS` when set.
fn record(line: Value) {
    if let Ok(path) = std::env::var("FLEET_RESULTS") {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        writeln!(f, "{line}").unwrap();
    }
}

fn nonce() -> String {
    format!("{:x}", epoch() % 0xfffff)
}

/// One commit bumps all three folders; each wave's Deployment changes
/// only once the wave before has soaked, by the clusters' own clocks.
fn one_commit_rolls_staging_then_each_hospital_once_the_wave_before_soaked(fleet: &Fleet) {
    block_on(async {
        let repo = Repo::clone(fleet);
        let version = format!("OpenMed/fleet-{}", nonce());
        let audit = fleet.audit_ends();
        let before = fleet.templates().await;
        repo.set_everywhere(&[("version", &version), ("soakSeconds", &SOAK_S.to_string())]);
        let pushed_at = epoch();
        let pushed = Instant::now();
        let commit = repo.push("the fleet at a new version");
        // Watch the order as it happens: no wave's pods change before the
        // wave before it has soaked.
        let mut changed: Vec<Option<i64>> = vec![None; WAVES.len()];
        let statuses = loop {
            let templates = fleet.templates().await;
            let statuses = fleet.statuses().await;
            for i in 0..WAVES.len() {
                if templates[i] != before[i] && changed[i].is_none() {
                    changed[i] = Some(epoch());
                    if i > 0 {
                        assert!(
                            soaked_at(&statuses[i - 1], &version).is_some(),
                            "{}'s pods changed before {} had soaked: {:?}",
                            WAVES[i],
                            WAVES[i - 1],
                            statuses[i - 1].conditions
                        );
                    }
                }
            }
            if statuses.iter().all(|s| soaked_at(s, &version).is_some()) {
                break statuses;
            }
            assert!(
                pushed.elapsed() < FLEET_DEADLINE,
                "not every wave soaked {version} within {FLEET_DEADLINE:?}: {:?}",
                statuses
                    .iter()
                    .map(|s| (&s.phase, &s.active_version))
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        let took = pushed.elapsed().as_secs_f64();
        // The clusters' own timestamps: each wave rolled (the operator's
        // write) at or after the wave before soaked.
        let mut timeline = Vec::new();
        for i in 0..WAVES.len() {
            let rolled = statuses[i]
                .last_rollout_time
                .as_ref()
                .unwrap()
                .0
                .as_second();
            let soaked = soaked_at(&statuses[i], &version).unwrap();
            if i > 0 {
                let before = soaked_at(&statuses[i - 1], &version).unwrap();
                assert!(
                    rolled >= before,
                    "{} rolled at {rolled}, {} soaked at {before}",
                    WAVES[i],
                    WAVES[i - 1]
                );
            }
            assert_eq!(statuses[i].phase, Some(Phase::Ready));
            timeline.push(json!({"wave": WAVES[i], "rolled_s": rolled - pushed_at, "soaked_s": soaked - pushed_at}));
        }
        for wave in WAVES {
            wait_until(
                &format!("wave {wave} Ready at the bump"),
                FLEET_DEADLINE,
                || fleet.wave(wave),
                |(ready, _, _, applied)| ready == "True" && applied.ends_with(&commit),
            )
            .await;
        }
        let requests = fleet.operator_requests(&audit);
        let floor = SOAK_S * WAVES.len() as i64;
        eprintln!(
            "fleet::waves: commit to the last wave soaked {took:.1} s (the soaks' floor {floor} s); timeline {timeline:?}; requests by each cluster's openmed-op {requests:?}"
        );
        record(json!({
            "scenario": "one_commit_three_waves", "commit_to_last_soaked_s": took,
            "soak_floor_s": floor, "timeline": timeline,
            "operator_requests": WAVES.iter().zip(&requests).map(|(w, n)| json!({"cluster": w, "requests": n})).collect::<Vec<_>>(),
        }));
    });
}

/// A version that never warms rolls back in staging; Flux judges the
/// wave failed, and neither hospital is applied at that commit.
/// `verify --status DIR --fix` then sets every folder back to the version
/// staging restored, and that commit rolls nothing anywhere.
fn a_version_that_fails_in_staging_never_reaches_a_hospital(fleet: &Fleet) {
    block_on(async {
        let repo = Repo::clone(fleet);
        let running = fleet.status("staging").await.active_version.unwrap();
        let bad = format!("OpenMed/fleet-bad-{}", nonce());
        for wave in WAVES {
            mark_unready(&fleet.client(wave).await, &[&bad]).await;
        }
        let before = fleet.templates().await;
        repo.set_everywhere(&[("version", &bad), ("progressDeadlineSeconds", "15")]);
        let commit = repo.push("the fleet at a version that never warms");
        let s = wait_until(
            "staging to roll back",
            FLEET_DEADLINE,
            || fleet.status("staging"),
            |s| {
                s.phase == Some(Phase::RolledBack)
                    && s.conditions
                        .iter()
                        .any(|c| c.type_ == "RolledBack" && c.status == "True")
            },
        )
        .await;
        assert_eq!(s.active_version.as_deref(), Some(running.as_str()));
        let staging = wait_until(
            "Flux to judge the staging wave failed",
            FLEET_DEADLINE,
            || fleet.wave("staging"),
            |(ready, _, attempted, _)| ready == "False" && attempted.ends_with(&commit),
        )
        .await;
        eprintln!("fleet::failed: staging wave says {}", staging.1);
        // Several of the hospitals' requeues later, still nothing.
        tokio::time::sleep(Duration::from_secs(6)).await;
        for wave in ["hospital-a", "hospital-b"] {
            let (_, _, attempted, _) = fleet.wave(wave).await;
            assert!(
                !attempted.ends_with(&commit),
                "wave {wave} was applied at {commit}"
            );
        }
        let after = fleet.templates().await;
        assert_eq!(after[1..], before[1..], "a hospital's pods changed");

        // `verify --status DIR --fix` with each cluster's models sets every
        // folder back: staging's (GitBehindRollback) and the hospitals'
        // (WaveBehindRollback), to the version staging restored.
        let statuses = tempfile::tempdir().unwrap();
        for wave in WAVES {
            let api: Api<OpenMedModel> = Api::namespaced(fleet.client(wave).await, "openmed");
            let models = api.list(&Default::default()).await.unwrap().items;
            let docs: Vec<String> = models
                .iter()
                .map(|m| serde_yaml::to_string(m).unwrap())
                .collect();
            std::fs::write(
                statuses.path().join(format!("{wave}.yaml")),
                docs.join("---\n"),
            )
            .unwrap();
        }
        let out = Command::new(env!("CARGO_BIN_EXE_openmed-op"))
            .args(["verify", "--status"])
            .arg(statuses.path())
            .arg("--fix")
            .current_dir(repo.path())
            .output()
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "verify --fix: {said}");
        for wave in WAVES {
            let text = std::fs::read_to_string(
                repo.path()
                    .join("clusters")
                    .join(wave)
                    .join("openmedmodel.yaml"),
            )
            .unwrap();
            assert!(
                text.contains(&format!("version: {running}")),
                "{wave} set back by verify --fix: {said}"
            );
        }
        eprintln!("fleet::failed: verify --fix said: {said}");
        let fixed = repo.push("the fleet back in step (openmed-op verify --status DIR --fix)");
        for wave in WAVES {
            wait_until(
                &format!("wave {wave} Ready at the fix"),
                FLEET_DEADLINE,
                || fleet.wave(wave),
                |(ready, _, _, applied)| ready == "True" && applied.ends_with(&fixed),
            )
            .await;
        }
        assert_eq!(fleet.templates().await, before, "the fix rolled pods");
        record(
            json!({"scenario": "failed_in_staging", "staging_wave": staging.1, "hospitals_applied": false}),
        );
    });
}

/// A person aborts staging's soak: it rolls back, and no hospital gets
/// the version.
fn an_aborted_soak_stops_the_waves(fleet: &Fleet) {
    block_on(async {
        let repo = Repo::clone(fleet);
        let running = fleet.status("staging").await.active_version.unwrap();
        let next = format!("OpenMed/fleet-next-{}", nonce());
        let before = fleet.templates().await;
        repo.set_everywhere(&[("version", &next), ("soakSeconds", "120")]);
        let commit = repo.push("the fleet at a version someone will stop");
        wait_until(
            "staging soaking the new version",
            FLEET_DEADLINE,
            || fleet.status("staging"),
            |s| {
                s.active_version.as_deref() == Some(next.as_str())
                    && s.conditions
                        .iter()
                        .any(|c| c.type_ == "Soaked" && c.reason == "Soaking")
            },
        )
        .await;
        let api: Api<OpenMedModel> = Api::namespaced(fleet.client("staging").await, "openmed");
        api.patch(
            "openmed-service",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"openmed.ai/soak-abort": "fleet-test"}}}),
            ),
        )
        .await
        .unwrap();
        let s = wait_until(
            "staging to roll back after the abort",
            FLEET_DEADLINE,
            || fleet.status("staging"),
            |s| {
                s.phase == Some(Phase::RolledBack)
                    && s.active_version.as_deref() == Some(running.as_str())
            },
        )
        .await;
        assert!(
            s.conditions
                .iter()
                .any(|c| c.type_ == "Degraded" && c.message.contains("failed its soak")),
            "{:?}",
            s.conditions
        );
        wait_until(
            "Flux to judge the staging wave failed",
            FLEET_DEADLINE,
            || fleet.wave("staging"),
            |(ready, _, attempted, _)| ready == "False" && attempted.ends_with(&commit),
        )
        .await;
        tokio::time::sleep(Duration::from_secs(6)).await;
        let after = fleet.templates().await;
        assert_eq!(
            after[1..],
            before[1..],
            "a hospital's pods changed after the abort"
        );
        repo.set_everywhere(&[("version", &running), ("soakSeconds", &SOAK_S.to_string())]);
        repo.push("the fleet back on the running version");
        record(json!({"scenario": "aborted_soak", "hospitals_applied": false}));
    });
}
