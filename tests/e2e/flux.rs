//! GitOps for real: Flux's own source-controller and kustomize-controller
//! (`tests/flux/build`, started by `tests/gitops/flux-up`) sync a test's
//! namespace from a repository on a smart-HTTP Git server on loopback, to
//! which the test pushes with `git`. Each test has its own repository,
//! GitRepository and Kustomization (`wait: true`, so Flux's own health
//! checks, which use kstatus, judge the OpenMedModel), and its own
//! operator.

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use libtest_mimic::Trial;
use openmed_op::api::{OpenMedModelStatus, Phase};
use serde_json::{Value, json};

use crate::env::*;
use crate::support::*;
use crate::trial;

pub fn trials() -> Vec<Trial> {
    vec![
        trial(
            "flux::a_commit_rolls_the_model_and_at_rest_flux_and_the_operator_write_nothing",
            a_commit_rolls_the_model_and_at_rest_flux_and_the_operator_write_nothing,
        ),
        trial(
            "flux::a_failed_version_in_git_is_fixed_by_verify_without_a_new_rollout",
            a_failed_version_in_git_is_fixed_by_verify_without_a_new_rollout,
        ),
        trial(
            "flux::a_rollback_committed_to_git_then_folded_into_the_version",
            a_rollback_committed_to_git_then_folded_into_the_version,
        ),
        trial(
            "flux::removing_the_model_from_git_releases_the_deployment",
            removing_the_model_from_git_releases_the_deployment,
        ),
        trial(
            "flux::rendered_snapshots_left_out_of_git_are_not_pruned",
            rendered_snapshots_left_out_of_git_are_not_pruned,
        ),
        trial(
            "flux::a_wave_starts_once_the_wave_before_has_soaked_and_never_after_it_rolled_back",
            a_wave_starts_once_the_wave_before_has_soaked_and_never_after_it_rolled_back,
        ),
        trial(
            "flux::a_canary_under_flux_keeps_its_weights_with_the_route_applied_if_not_present",
            a_canary_under_flux_keeps_its_weights_with_the_route_applied_if_not_present,
        ),
    ]
}

/// What Flux syncs here, and what the operator writes.
const SYNCED: &[&str] = &[
    "deployments",
    "configmaps",
    "openmedmodels",
    "replicasets",
    "pods",
];

/// How often Flux looks at Git and applies, in these tests.
const INTERVAL_S: u64 = 3;

static STARTED: AtomicBool = AtomicBool::new(false);

/// The Git server's base URL, Flux started on the test cluster first.
fn git_base() -> &'static str {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        let dir = cluster_dir();
        let out = Command::new(root().join("tests/gitops/flux-up"))
            .arg(&dir)
            .output()
            .expect("tests/gitops/flux-up runs");
        assert!(
            out.status.success(),
            "tests/gitops/flux-up failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        STARTED.store(true, Ordering::SeqCst);
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    })
}

/// Stops Flux if a test started it (the harness calls this at the end).
pub fn stop() {
    if STARTED.load(Ordering::SeqCst) {
        let _ = Command::new(root().join("tests/gitops/flux-down"))
            .arg(cluster_dir())
            .status();
    }
}

/// A working copy whose `main` is pushed to the test's repository on the
/// Git server.
struct Repo {
    dir: tempfile::TempDir,
    url: String,
}

impl Repo {
    fn new(name: &str) -> Repo {
        let url = format!("{}{name}.git", git_base());
        let repo = Repo {
            dir: tempfile::tempdir().unwrap(),
            url,
        };
        repo.git(&["init", "-q", "-b", "main"]);
        repo.git(&["config", "user.email", "platform@example.org"]);
        repo.git(&["config", "user.name", "Platform team"]);
        repo.git(&["remote", "add", "origin", &repo.url]);
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
            .expect("git runs");
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    /// Writes (or, for `None`, deletes) the files, commits and pushes;
    /// returns the commit.
    fn commit(&self, message: &str, files: &[(&str, Option<&str>)]) -> String {
        for (path, text) in files {
            let path = self.path().join(path);
            match text {
                Some(text) => std::fs::write(&path, text).unwrap(),
                None => std::fs::remove_file(&path).unwrap(),
            }
        }
        self.push(message)
    }

    /// Commits whatever the working copy holds and pushes it.
    fn push(&self, message: &str) -> String {
        self.git(&["add", "-A"]);
        self.git(&["commit", "-q", "-m", message]);
        self.git(&["push", "-q", "origin", "HEAD:main"]);
        self.git(&["rev-parse", "HEAD"])
    }

    fn read(&self, path: &str) -> String {
        std::fs::read_to_string(self.path().join(path)).unwrap()
    }
}

/// The GitRepository and the Kustomization that sync `repo` into the
/// test's namespace, waiting for every object's health (`wait: true`).
fn flux_objects(repo: &Repo, namespace: &str) -> String {
    flux_objects_waiting(repo, namespace, "30s")
}

/// [`flux_objects`] whose health checks give up after `timeout` (then Flux
/// applies again after its retry interval).
fn flux_objects_waiting(repo: &Repo, namespace: &str, timeout: &str) -> String {
    let interval = format!("{INTERVAL_S}s");
    let mut docs = example("flux-system.yaml");
    for doc in &mut docs {
        doc["metadata"] = json!({"name": "models"});
        let source = doc["kind"] == "GitRepository";
        let spec = &mut doc["spec"];
        spec["interval"] = json!(interval);
        if source {
            spec["url"] = json!(repo.url);
        } else {
            spec["retryInterval"] = json!(interval);
            spec["sourceRef"]["name"] = json!("models");
            spec["path"] = json!("./");
            spec["timeout"] = json!(timeout);
            spec["targetNamespace"] = json!(namespace);
        }
    }
    yaml_stream(&docs)
}

/// The documents of `examples/flux/<file>`, the layout these tests sync.
fn example(file: &str) -> Vec<Value> {
    use serde::Deserialize;
    let text = std::fs::read_to_string(root().join("examples/flux").join(file)).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

fn kustomizations(env: &Env) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("kustomize.toolkit.fluxcd.io", "v1", "Kustomization");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "kustomizations");
    Api::namespaced_with(env.client.clone(), &env.ns.name, &resource)
}

/// What the Kustomization says: its Ready condition and the revision it
/// last applied.
#[derive(Debug, Clone, PartialEq)]
struct Flux {
    ready: String,
    reason: String,
    message: String,
    applied: String,
    /// The revision of the reconcile in progress or last finished, applied
    /// or not (`lastAppliedRevision` moves only once it is healthy).
    attempted: String,
}

impl Flux {
    fn ready_at(&self, commit: &str) -> bool {
        self.ready == "True" && self.applied.ends_with(commit)
    }
}

async fn flux_state(env: &Env) -> Flux {
    flux_state_of(env, "models").await
}

/// [`flux_state`] of the Kustomization `name` in the test's namespace.
async fn flux_state_of(env: &Env, name: &str) -> Flux {
    let k = kustomizations(env).get(name).await.unwrap();
    let k = serde_json::to_value(k).unwrap();
    let ready = k["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .cloned()
        .unwrap_or(Value::Null);
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    Flux {
        ready: text(&ready["status"]),
        reason: text(&ready["reason"]),
        message: text(&ready["message"]),
        applied: text(&k["status"]["lastAppliedRevision"]),
        attempted: text(&k["status"]["lastAttemptedRevision"]),
    }
}

async fn wait_flux(env: &Env, what: &str, ok: impl FnMut(&Flux) -> bool) -> Flux {
    wait_until(what, ROLLOUT * 2, || flux_state(env), ok).await
}

/// The workload as a team keeps it in Git (`examples/flux/models`): none
/// of the fields the operator writes (the preload variable, and
/// `replicas` since the model sets them). A field Flux applies is forced
/// back to Git's value at each apply: with `replicas: 1` here, every
/// commit's apply scaled the Deployment down and the operator up again,
/// replacing a pod (docs/gitops.md). Named `name`, selecting its own pods.
fn deployment_in_git(name: &str) -> String {
    let mut d = example("models/deployment.yaml").remove(0);
    d["metadata"]["name"] = json!(name);
    d["metadata"].as_object_mut().unwrap().remove("namespace");
    let labels = json!({"app.kubernetes.io/name": name});
    d["metadata"]["labels"] = labels.clone();
    d["spec"]["selector"]["matchLabels"] = labels.clone();
    d["spec"]["template"]["metadata"]["labels"] = labels;
    yaml_stream(&[d])
}

/// The model as Git holds it (`examples/flux/models`), named `svc` in the
/// test's namespace (which `verify --status` matches against the
/// cluster's), with a progress deadline of 30 s.
fn model_in_git(env: &Env, version: &str, annotations: &[(&str, &str)]) -> String {
    let mut m = example("models/openmedmodel.yaml").remove(0);
    m["metadata"]["name"] = json!("svc");
    m["metadata"]["namespace"] = json!(env.ns.name);
    for (key, value) in annotations {
        m["metadata"]["annotations"][*key] = json!(value);
    }
    m["spec"]["version"] = json!(version);
    // Long enough that a good version is never failed while the suite
    // loads both cores (8 s was not, once), short enough that a version
    // that never warms fails within the test's patience.
    m["spec"]["rolloutStrategy"]["progressDeadlineSeconds"] = json!(30);
    yaml_stream(&[m])
}

/// A namespace synced from a new repository holding the Deployment and
/// the model at `v1`, Ready in the cluster and in Flux.
async fn synced(prefix: &str) -> (Env, Repo, String) {
    let env = Env::new(prefix).await;
    let v1 = env.version("v1");
    let repo = Repo::new(&env.ns.name);
    let commit = repo.commit(
        "the service and its model",
        &[
            ("deployment.yaml", Some(&deployment_in_git("svc"))),
            ("openmedmodel.yaml", Some(&model_in_git(&env, &v1, &[]))),
        ],
    );
    env.apply(&flux_objects(&repo, &env.ns.name)).await;
    wait_flux(
        &env,
        "Flux to apply the first commit and see it healthy",
        |f| f.ready_at(&commit),
    )
    .await;
    env.wait_ready("svc", &v1).await;
    (env, repo, v1)
}

/// The pod template's hash annotation and the names of the pods.
async fn template_and_pods(env: &Env) -> (Value, Vec<String>) {
    let d = env.deployment("svc").await;
    let hash = d["spec"]["template"]["metadata"]["annotations"].clone();
    let pods: Api<k8s_openapi::api::core::v1::Pod> =
        Api::namespaced(env.client.clone(), &env.ns.name);
    let mut names: Vec<String> = pods
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.metadata.name)
        .collect();
    names.sort();
    (hash, names)
}

/// The completed requests about `namespace` after byte `from` of the
/// audit log by a client whose User-Agent starts with `agent`.
fn requests_by(agent: &str, namespace: &str, from: u64) -> Vec<Value> {
    let text = std::fs::read(cluster_dir().join("logs/audit.log")).unwrap();
    String::from_utf8_lossy(&text[from as usize..])
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| {
            e["stage"] == "ResponseComplete"
                && e["objectRef"]["namespace"] == namespace
                && e["userAgent"]
                    .as_str()
                    .is_some_and(|u| u.starts_with(agent))
        })
        .collect()
}

fn is_dry_run(e: &Value) -> bool {
    e["requestURI"]
        .as_str()
        .unwrap_or_default()
        .contains("dryRun=All")
}

/// Writes in the test's namespace after byte `from` of the audit log by
/// `agent` (dry runs are not writes): (verb, resource, name).
fn writes_by(agent: &str, namespace: &str, from: u64) -> Vec<(String, String, String)> {
    writes_to(agent, namespace, from, &[])
}

/// [`writes_by`] of the objects of `resources` only (all when empty).
fn writes_to(
    agent: &str,
    namespace: &str,
    from: u64,
    resources: &[&str],
) -> Vec<(String, String, String)> {
    requests_by(agent, namespace, from)
        .iter()
        .filter(|e| {
            ["create", "update", "patch", "delete"]
                .contains(&e["verb"].as_str().unwrap_or_default())
                && !is_dry_run(e)
                && (resources.is_empty()
                    || resources.contains(&e["objectRef"]["resource"].as_str().unwrap_or_default()))
        })
        .map(|e| {
            let s = |k: &str| e["objectRef"][k].as_str().unwrap_or_default().to_owned();
            let sub = s("subresource");
            let resource = if sub.is_empty() {
                s("resource")
            } else {
                format!("{}/{sub}", s("resource"))
            };
            (
                e["verb"].as_str().unwrap_or_default().to_owned(),
                resource,
                s("name"),
            )
        })
        .collect()
}

/// How many times Flux dry-ran its apply of `resource` (to find drift)
/// after byte `from` of the audit log: one per reconcile that applies.
fn flux_dry_runs(namespace: &str, resource: &str, from: u64) -> usize {
    requests_by("kustomize-controller", namespace, from)
        .iter()
        .filter(|e| e["objectRef"]["resource"] == resource && e["verb"] == "patch" && is_dry_run(e))
        .count()
}

fn a_commit_rolls_the_model_and_at_rest_flux_and_the_operator_write_nothing() {
    block_on(async {
        let (env, repo, v1) = synced("flux-loop").await;
        let (before, _) = template_and_pods(&env).await;
        let v2 = env.version("v2");
        let pushed = Instant::now();
        let commit = repo.commit(
            "openmed: v2",
            &[("openmedmodel.yaml", Some(&model_in_git(&env, &v2, &[])))],
        );
        // Until the model is Ready on v2, Flux must not say Ready for this
        // commit: its health check (kstatus) reads the operator's
        // conditions.
        let mut seen: Vec<(Flux, Option<Phase>, Option<String>)> = Vec::new();
        let ready_after = loop {
            let f = flux_state(&env).await;
            let s = env.status("svc").await;
            if f.ready_at(&commit) {
                assert_eq!(
                    (s.phase, s.active_version.as_deref()),
                    (Some(Phase::Ready), Some(v2.as_str())),
                    "Flux said Ready before the model was: {seen:#?}"
                );
                break pushed.elapsed();
            }
            let now = (f, s.phase, s.active_version.clone());
            if seen.last() != Some(&now) {
                seen.push(now);
            }
            assert!(
                pushed.elapsed() < ROLLOUT * 2,
                "no Ready for {commit}: {seen:#?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let (after, _) = template_and_pods(&env).await;
        assert_ne!(before, after, "the operator rolled the Deployment");
        assert!(
            seen.iter()
                .any(|(f, phase, _)| f.attempted.ends_with(&commit)
                    && f.ready != "True"
                    && *phase == Some(Phase::RollingOut)),
            "Flux applied the commit and waited while the model rolled: {seen:#?}"
        );
        eprintln!(
            "flux::loop: push to Kustomization Ready {:.1} s (interval {INTERVAL_S} s); while rolling Flux said: {:?}",
            ready_after.as_secs_f64(),
            seen.iter()
                .filter(|(f, _, _)| f.attempted.ends_with(&commit) && f.ready != "True")
                .map(|(f, _, _)| format!("{} {}: {}", f.ready, f.reason, f.message))
                .next()
        );

        // At rest: ten of Flux's applies (dry runs that find no drift), and
        // neither Flux nor the operator writes the Deployment, the
        // ConfigMaps or the model.
        let from = audit_log_end();
        let (template, pods) = template_and_pods(&env).await;
        wait_for(
            "ten of Flux's reconciles at rest",
            Duration::from_secs(INTERVAL_S * 10 * 3),
            || async { (flux_dry_runs(&env.ns.name, "openmedmodels", from) >= 10).then_some(()) },
        )
        .await;
        // Flux writes its own Kustomization's status and Events each time.
        let flux_writes = writes_to("kustomize-controller", &env.ns.name, from, SYNCED);
        let operator_writes = writes_by("openmed-operator", &env.ns.name, from);
        assert_eq!(flux_writes, [], "Flux wrote at rest");
        assert_eq!(operator_writes, [], "the operator wrote at rest");
        assert_eq!(
            template_and_pods(&env).await,
            (template, pods),
            "the pod template and the pods are as they were"
        );
        let _ = v1;
        env.finish().await;
    });
}

fn a_failed_version_in_git_is_fixed_by_verify_without_a_new_rollout() {
    block_on(async {
        let (env, repo, v1) = synced("flux-failed").await;
        let bad = env.version("bad");
        mark_unready(&env.client, &[&bad]).await;
        let commit = repo.commit(
            "openmed: a version that never warms",
            &[("openmedmodel.yaml", Some(&model_in_git(&env, &bad, &[])))],
        );
        env.wait_rolled_back("svc").await;
        let failed = wait_flux(&env, "Flux to report the model failed", |f| {
            f.attempted.ends_with(&commit) && f.ready == "False"
        })
        .await;
        eprintln!(
            "flux::failed: Flux says Ready={} {}: {}",
            failed.ready, failed.reason, failed.message
        );
        assert!(
            failed.message.contains("OpenMedModel") && failed.message.contains("svc"),
            "{failed:?}"
        );
        let (template, pods) = template_and_pods(&env).await;

        // verify --status on the live status, --fix in the working copy.
        let (ok, status, err) = kubectl(&["get", "omm", "-n", &env.ns.name, "-o", "yaml"]);
        assert!(ok, "{err}");
        let status_file = repo.path().join("../status.yaml");
        std::fs::write(&status_file, status).unwrap();
        let out = Command::new(binary())
            .args(["verify", "--status", status_file.to_str().unwrap(), "--fix"])
            .current_dir(repo.path())
            .output()
            .unwrap();
        let diff = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "verify --fix: {diff}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(diff.contains(&format!("+  version: {v1}")), "{diff}");
        assert!(
            repo.read("openmedmodel.yaml")
                .contains(&format!("version: {v1}"))
        );
        let fixed =
            repo.push("openmed: agree with the cluster's rollback (openmed-op verify --fix)");
        wait_flux(&env, "Flux to apply the fix and see it healthy", |f| {
            f.ready_at(&fixed)
        })
        .await;
        let s: OpenMedModelStatus = env.status("svc").await;
        assert_eq!(s.phase, Some(Phase::Ready));
        assert_eq!(s.active_version.as_deref(), Some(v1.as_str()));
        assert_eq!(
            template_and_pods(&env).await,
            (template, pods),
            "no new rollout: the template and the pods are as they were"
        );
        env.finish().await;
    });
}

fn a_rollback_committed_to_git_then_folded_into_the_version() {
    block_on(async {
        let (env, repo, v1) = synced("flux-rollback").await;
        let v2 = env.version("v2");
        let to_v2 = repo.commit(
            "openmed: v2",
            &[("openmedmodel.yaml", Some(&model_in_git(&env, &v2, &[])))],
        );
        wait_flux(&env, "v2 applied and healthy", |f| f.ready_at(&to_v2)).await;
        let annotation = [("openmed.ai/rollback-to", v1.as_str())];
        let back = repo.commit(
            "openmed: roll back to v1",
            &[(
                "openmedmodel.yaml",
                Some(&model_in_git(&env, &v2, &annotation)),
            )],
        );
        env.wait_manual_rollback("svc", &v1).await;
        let f = wait_flux(&env, "Flux to apply the rollback", |f| {
            f.attempted.ends_with(&back) && f.ready != "Unknown"
        })
        .await;
        eprintln!(
            "flux::rollback: with the annotation Flux says Ready={} {}: {}",
            f.ready, f.reason, f.message
        );
        let (template, pods) = template_and_pods(&env).await;
        // The next commit folds the rollback into the version and drops
        // the annotation: nothing rolls again.
        let folded = repo.commit(
            "openmed: v1 is the version",
            &[("openmedmodel.yaml", Some(&model_in_git(&env, &v1, &[])))],
        );
        wait_flux(&env, "Flux to apply the folded rollback", |f| {
            f.ready_at(&folded)
        })
        .await;
        assert_eq!(
            env.annotation("svc", "openmed.ai/rollback-to").await,
            None,
            "Flux removed the annotation it had applied"
        );
        let s = env.status("svc").await;
        assert_eq!(
            (s.phase, s.active_version.as_deref()),
            (Some(Phase::Ready), Some(v1.as_str()))
        );
        assert_eq!(template_and_pods(&env).await, (template, pods));
        env.finish().await;
    });
}

fn removing_the_model_from_git_releases_the_deployment() {
    block_on(async {
        let (env, repo, _) = synced("flux-prune").await;
        let (template, _) = template_and_pods(&env).await;
        let snapshots: Vec<String> = env
            .config_maps()
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|c| {
                c.metadata.annotations.as_ref().is_some_and(|a| {
                    a.get("kustomize.toolkit.fluxcd.io/prune")
                        .map(String::as_str)
                        == Some("disabled")
                })
            })
            .filter_map(|c| c.metadata.name)
            .collect();
        assert!(
            !snapshots.is_empty(),
            "the snapshot ConfigMaps opt out of pruning"
        );
        let commit = repo.commit("openmed: no model", &[("openmedmodel.yaml", None)]);
        wait_flux(&env, "Flux to prune the model", |f| f.ready_at(&commit)).await;
        env.wait_model_gone("svc", ROLLOUT).await;
        // Released: the Deployment (still in Git) stays, without the
        // operator's mark; the operator deleted its snapshots itself once
        // no pod read them (Flux never prunes them: they carry
        // kustomize.toolkit.fluxcd.io/prune: disabled).
        let d = env.deployment("svc").await;
        assert!(
            d["spec"]["template"]["metadata"]["annotations"]
                .get("openmed.ai/model-resource")
                .is_none(),
            "released: {}",
            d["spec"]["template"]["metadata"]
        );
        for name in &snapshots {
            assert!(
                env.config_maps().get_opt(name).await.unwrap().is_none(),
                "snapshot {name} left after the release"
            );
        }
        let _ = template;
        // A later reconcile of Flux changes nothing.
        let from = audit_log_end();
        wait_for(
            "three of Flux's reconciles",
            Duration::from_secs(INTERVAL_S * 10),
            || async { (flux_dry_runs(&env.ns.name, "deployments", from) >= 3).then_some(()) },
        )
        .await;
        assert_eq!(
            writes_to("kustomize-controller", &env.ns.name, from, SYNCED),
            []
        );
        env.finish().await;
    });
}

fn a_canary_under_flux_keeps_its_weights_with_the_route_applied_if_not_present() {
    use crate::canary::{ROUTE, canary_block, gateway_api, route_state};
    block_on(async {
        gateway_api();
        let env = Env::new("flux-canary").await;
        let (v1, v2) = (env.version("v1"), env.version("v2"));
        // The route as docs/canary.md recommends for Flux: created from
        // Git, then left alone, so Flux's applies never put Git's weights
        // back mid-canary.
        let route = ROUTE.replace(
            "metadata:\n  name: svc\n",
            "metadata:\n  name: svc\n  annotations:\n    kustomize.toolkit.fluxcd.io/ssa: IfNotPresent\n",
        );
        assert!(route.contains("IfNotPresent"));
        let block = canary_block("[{weight: 20, pause: 5s}, {weight: 50}]", "");
        let block: Value = serde_yaml::from_str(&format!("spec:\n{block}")).unwrap();
        let model = |version: &str| {
            let mut m: Value = serde_yaml::from_str(&model_in_git(&env, version, &[])).unwrap();
            for (key, value) in block["spec"].as_object().unwrap() {
                m["spec"][key] = value.clone();
            }
            yaml_stream(&[m])
        };
        let repo = Repo::new(&env.ns.name);
        let first = repo.commit(
            "the service, its canary and the route",
            &[
                ("deployment.yaml", Some(&deployment_in_git("svc"))),
                ("canary.yaml", Some(&deployment_in_git("svc-canary"))),
                ("route.yaml", Some(&route)),
                ("openmedmodel.yaml", Some(&model(&v1))),
            ],
        );
        // Flux waits for the model's health after each apply; a canary is
        // not healthy until promoted, so with a timeout shorter than the
        // canary Flux gives up and applies again mid-canary, as it does
        // with minutes-long steps and the usual timeout.
        env.apply(&flux_objects_waiting(&repo, &env.ns.name, "4s"))
            .await;
        wait_flux(&env, "Flux to apply the first commit", |f| {
            f.ready_at(&first)
        })
        .await;
        env.wait_ready("svc", &v1).await;
        let from = audit_log_end();
        let bump = repo.commit(
            "openmed: v2, through the canary",
            &[("openmedmodel.yaml", Some(&model(&v2)))],
        );
        // The second step waits for a promote: it is given only once Flux
        // has applied the whole set twice over the step's weights.
        let mut weights: Vec<(i64, i64)> = Vec::new();
        let mut held_since: Option<u64> = None;
        let mut promoted_by_test = false;
        let start = Instant::now();
        loop {
            let s = env.status("svc").await;
            let c = s.canary.clone();
            let (w, _) = route_state(&env).await;
            if weights.last() != Some(&w) {
                weights.push(w);
            }
            if let Some(c) = &c {
                let waits_for_promote = c.state == openmed_op::api::CanaryState::Paused
                    && c.message.contains("waiting for openmed.ai/canary-promote");
                assert!(
                    c.state != openmed_op::api::CanaryState::Paused || waits_for_promote,
                    "the canary paused: {}",
                    c.message
                );
                if c.step == 2 && w == (50, 50) && !promoted_by_test {
                    let since = *held_since.get_or_insert_with(audit_log_end);
                    if flux_dry_runs(&env.ns.name, "openmedmodels", since) >= 2 {
                        assert!(!waits_for_promote || c.message.contains("step 2"));
                        env.annotate("svc", "openmed.ai/canary-promote", Some("flux-test"))
                            .await;
                        promoted_by_test = true;
                    }
                }
            }
            let promoted = c.as_ref().is_some_and(|c| {
                c.state == openmed_op::api::CanaryState::Promoted && c.version == v2
            });
            if promoted && s.phase == Some(Phase::Ready) && w == (100, 0) {
                break;
            }
            assert!(
                start.elapsed() < ROLLOUT * 3,
                "no promotion: {weights:?} {s:#?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(weights, [(100, 0), (80, 20), (50, 50), (100, 0)]);
        wait_flux(&env, "Flux to see the promoted model healthy", |f| {
            f.ready_at(&bump)
        })
        .await;
        assert_eq!(
            writes_to("kustomize-controller", &env.ns.name, from, &["httproutes"]),
            [],
            "Flux never wrote the route"
        );
        let reasons = env.event_reasons("svc").await;
        assert!(
            !reasons.iter().any(|(r, _)| r == "RouteDrift"),
            "{reasons:?}"
        );
        env.finish().await;
    });
}

/// `openmed-op render` of the Deployment and the model at `version`, as a
/// pipeline commits it for topology (b) (docs/gitops.md).
fn rendered(env: &Env, version: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("deployment.yaml"), deployment_in_git("svc")).unwrap();
    std::fs::write(
        dir.path().join("openmedmodel.yaml"),
        model_in_git(env, version, &[]),
    )
    .unwrap();
    let out = Command::new(binary())
        .args(["render", "-n", &env.ns.name])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "render: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The names of the snapshot ConfigMaps in `text` (a rendered stream).
fn snapshots_in(text: &str) -> Vec<String> {
    use serde::Deserialize;
    serde_yaml::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|d| {
            d["kind"] == "ConfigMap"
                && d["metadata"]["annotations"]["kustomize.toolkit.fluxcd.io/prune"] == "disabled"
        })
        .map(|d| d["metadata"]["name"].as_str().unwrap().to_owned())
        .collect()
}

fn rendered_snapshots_left_out_of_git_are_not_pruned() {
    block_on(async {
        let env = Env::new("flux-rendered").await;
        let (v1, v2) = (env.version("v1"), env.version("v2"));
        let repo = Repo::new(&env.ns.name);
        let first_render = rendered(&env, &v1);
        let old = snapshots_in(&first_render);
        assert_eq!(old.len(), 1, "{first_render}");
        let first = repo.commit("rendered at v1", &[("rendered.yaml", Some(&first_render))]);
        env.apply(&flux_objects(&repo, &env.ns.name)).await;
        wait_flux(&env, "Flux to apply the rendered v1", |f| {
            f.ready_at(&first)
        })
        .await;
        env.wait_ready("svc", &v1).await;
        let from = audit_log_end();
        // The next render lists only v2's snapshot; with prune: true Flux
        // deletes what left Git, but not an object marked prune: disabled.
        let second_render = rendered(&env, &v2);
        assert!(!snapshots_in(&second_render).contains(&old[0]));
        let second = repo.commit("rendered at v2", &[("rendered.yaml", Some(&second_render))]);
        wait_flux(&env, "Flux to apply the rendered v2", |f| {
            f.ready_at(&second)
        })
        .await;
        env.wait_ready("svc", &v2).await;
        let deletes: Vec<_> =
            writes_to("kustomize-controller", &env.ns.name, from, &["configmaps"])
                .into_iter()
                .filter(|(verb, _, _)| verb == "delete")
                .collect();
        assert_eq!(deletes, [], "Flux pruned a snapshot");
        // Flux's own account of its garbage collection.
        let log = std::fs::read_to_string(cluster_dir().join("logs/flux-kustomize-controller.log"))
            .unwrap_or_default();
        let skipped = format!("ConfigMap/{}/{} skipped", env.ns.name, old[0]);
        assert!(log.contains(&skipped), "Flux's log lacks {skipped:?}");
        assert!(
            env.config_maps().get_opt(&old[0]).await.unwrap().is_some(),
            "v1's snapshot stays for the rollback: the operator retains it"
        );
        env.finish().await;
    });
}

/// The soak of the wave test's models: long enough that the next wave
/// starting before it ends would show, short enough for CI.
const WAVE_SOAK_S: i64 = 8;

/// The waves of `examples/fleet/management/flux-system.yaml`, staging and
/// hospital A, as Kustomizations in `first`'s namespace that apply the
/// repository's `staging/` to `first`'s namespace and `hospital-a/` to
/// `second`'s: the example's `dependsOn` and health checks, a namespace
/// standing in for each cluster's kubeconfig.
fn wave_objects(repo: &Repo, first: &Env, second: &Env) -> String {
    use serde::Deserialize;
    let text =
        std::fs::read_to_string(root().join("examples/fleet/management/flux-system.yaml")).unwrap();
    let mut docs: Vec<Value> = serde_yaml::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .filter(|v| v["metadata"]["name"] != "hospital-b")
        .collect();
    let interval = format!("{INTERVAL_S}s");
    for doc in &mut docs {
        let name = doc["metadata"]["name"].as_str().unwrap().to_owned();
        doc["metadata"]["namespace"] = json!(first.ns.name);
        doc["spec"]["interval"] = json!(interval);
        if doc["kind"] == "GitRepository" {
            doc["metadata"]["name"] = json!("fleet");
            doc["spec"]["url"] = json!(repo.url);
            continue;
        }
        let spec = doc["spec"].as_object_mut().unwrap();
        spec.remove("kubeConfig");
        spec.insert("retryInterval".into(), json!(interval));
        spec.insert(
            "sourceRef".into(),
            json!({"kind": "GitRepository", "name": "fleet"}),
        );
        spec.insert("path".into(), json!(format!("./{name}")));
        spec.insert("timeout".into(), json!("90s"));
        let target = if name == "staging" { first } else { second };
        spec.insert("targetNamespace".into(), json!(target.ns.name));
    }
    yaml_stream(&docs)
}

/// The model of one wave as the fleet keeps it (`examples/fleet`), at
/// `version`, with the test's soak.
fn wave_model(env: &Env, version: &str) -> String {
    let mut m = example("models/openmedmodel.yaml").remove(0);
    m["metadata"]["name"] = json!("svc");
    m["metadata"]["namespace"] = json!(env.ns.name);
    m["spec"]["version"] = json!(version);
    m["spec"]["rolloutStrategy"] =
        json!({"progressDeadlineSeconds": 30, "soakSeconds": WAVE_SOAK_S});
    yaml_stream(&[m])
}

fn time_of(t: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>) -> i64 {
    t.as_ref().map(|t| t.0.as_second()).unwrap_or(i64::MAX)
}

fn a_wave_starts_once_the_wave_before_has_soaked_and_never_after_it_rolled_back() {
    block_on(async {
        let staging = Env::new("wave-staging").await;
        let hospital = Env::new("wave-hospital").await;
        // One version name for the fleet, as one commit sets it everywhere.
        let (v1, v2, bad) = (
            staging.version("v1"),
            staging.version("v2"),
            staging.version("bad"),
        );
        mark_unready(&staging.client, &[&bad]).await;
        let repo = Repo::new(&staging.ns.name);
        std::fs::create_dir_all(repo.path().join("staging")).unwrap();
        std::fs::create_dir_all(repo.path().join("hospital-a")).unwrap();
        let fleet = |version: &str| {
            vec![
                (
                    "staging/deployment.yaml".to_owned(),
                    deployment_in_git("svc"),
                ),
                (
                    "staging/openmedmodel.yaml".to_owned(),
                    wave_model(&staging, version),
                ),
                (
                    "hospital-a/deployment.yaml".to_owned(),
                    deployment_in_git("svc"),
                ),
                (
                    "hospital-a/openmedmodel.yaml".to_owned(),
                    wave_model(&hospital, version),
                ),
            ]
        };
        let commit_fleet = |message: &str, version: &str| {
            let files = fleet(version);
            let files: Vec<(&str, Option<&str>)> = files
                .iter()
                .map(|(p, t)| (p.as_str(), Some(t.as_str())))
                .collect();
            repo.commit(message, &files)
        };
        let first = commit_fleet("the fleet at v1", &v1);
        staging
            .apply(&wave_objects(&repo, &staging, &hospital))
            .await;
        for wave in ["staging", "hospital-a"] {
            wait_until(
                &format!("wave {wave} Ready at the first commit"),
                ROLLOUT * 3,
                || flux_state_of(&staging, wave),
                |f| f.ready_at(&first),
            )
            .await;
        }

        // One commit bumps both folders: hospital A's Deployment changes
        // only once staging has soaked v2, by the clusters' own clocks.
        let hospital_template = hospital.deployment("svc").await["spec"]["template"].clone();
        let pushed = Instant::now();
        let bump = commit_fleet("the fleet at v2", &v2);
        let staging_soaked = staging
            .wait_status("svc", "staging soaked at v2", |s| {
                s.soak
                    .as_ref()
                    .is_some_and(|k| k.version == v2 && k.soaked_time.is_some())
            })
            .await;
        assert_eq!(
            hospital.deployment("svc").await["spec"]["template"],
            hospital_template,
            "hospital A's pods changed before staging had soaked"
        );
        let hospital_soaked = wait_until(
            "hospital A soaked at v2",
            ROLLOUT * 3,
            || hospital.status("svc"),
            |s| {
                s.soak
                    .as_ref()
                    .is_some_and(|k| k.version == v2 && k.soaked_time.is_some())
            },
        )
        .await;
        let staging_soak = staging_soaked.soak.as_ref().unwrap();
        let staging_done = time_of(&staging_soak.soaked_time);
        let hospital_started = time_of(&hospital_soaked.last_rollout_time);
        assert!(
            hospital_started >= staging_done,
            "hospital A rolled at {hospital_started}, staging soaked at {staging_done}"
        );
        for wave in ["staging", "hospital-a"] {
            wait_until(
                &format!("wave {wave} Ready at the bump"),
                ROLLOUT * 3,
                || flux_state_of(&staging, wave),
                |f| f.ready_at(&bump),
            )
            .await;
        }
        let floor = 2 * WAVE_SOAK_S;
        eprintln!(
            "flux::waves: commit to the last wave soaked {:.1} s (soaks {floor} s); staging soaked at {staging_done}, hospital A rolled at {hospital_started}",
            pushed.elapsed().as_secs_f64()
        );

        // A version that fails in staging rolls back there and never
        // reaches hospital A.
        let hospital_template = hospital.deployment("svc").await["spec"]["template"].clone();
        let broken = commit_fleet("the fleet at a version that never warms", &bad);
        staging.wait_rolled_back("svc").await;
        let failed = wait_until(
            "Flux to judge staging failed at the broken commit",
            ROLLOUT * 2,
            || flux_state_of(&staging, "staging"),
            |f| f.attempted.ends_with(&broken) && f.ready == "False",
        )
        .await;
        eprintln!(
            "flux::waves: staging says {}: {}",
            failed.reason, failed.message
        );
        let waiting = flux_state_of(&staging, "hospital-a").await;
        assert!(
            !waiting.attempted.ends_with(&broken),
            "hospital A was applied at the commit staging failed: {waiting:?}"
        );
        assert_eq!(
            hospital.deployment("svc").await["spec"]["template"],
            hospital_template,
            "hospital A's pods changed after staging rolled back"
        );
        assert_eq!(
            hospital.status("svc").await.active_version.as_deref(),
            Some(v2.as_str())
        );
        hospital.finish().await;
        staging.finish().await;
    });
}
