//! Moving a cluster from the earlier OpenMed operator (Kopf) to openmed-op
//! and back, as `docs/migration.md` prints it: each of its blocks, run by
//! bash in the page's order, on a control plane of its own
//! (`target/migration`: the two operators' Deployment, ServiceAccount and
//! RBAC share names, as they do on a real cluster).
//!
//! Both operators run in their own pods, as their users install them. The
//! earlier one is installed from its own files (kept where the fixture
//! lives, never copied into the project; all but its CRD, which is not
//! structural and a current API server refuses: openmed-op's, the same
//! fields and rules, stands in), its image mapped by the test
//! kubelet to what its Dockerfile builds: Kopf 1.44.6 from PyPI
//! (`tests/kopf/build`) with its `openmed_operator.py` at `/app`.
//! openmed-op is installed by the page's own block, from a copy of `crds/`
//! and `deploy/`, its image mapped to the binary under test.
//!
//! The walk: the earlier operator rolls v1 -> v2; the page's checks before
//! the move; the move (no pod replaced, status and retained versions kept,
//! Ready stays); a manual rollback and a bump; the way back (the earlier
//! operator keeps the history); and a resource deleted while no operator
//! runs, with only the earlier operator's finalizer on it, goes once
//! openmed-op is installed again, its Deployment released.
//!
//! The fixture is found at `OPENMED_KOPF_REFERENCE`, else beside the
//! checkout at `../shared/reference/openmed-kopf-operator`. Without it the
//! test is reported ignored, with the reason, and never passes.

// Shared with the end-to-end suite; this one uses a part.
#[allow(dead_code)]
#[path = "../e2e/support.rs"]
mod support;

#[allow(dead_code)]
#[path = "../e2e/env.rs"]
mod env;

#[allow(dead_code)]
#[path = "../e2e/operator_pods.rs"]
mod operator_pods;

#[allow(dead_code)]
#[path = "../doc_blocks/mod.rs"]
mod doc_blocks;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams};
use libtest_mimic::{Arguments, Trial};
use openmed_op::api::{OpenMedModelStatus, Phase};
use serde_json::json;

use env::{ROLLOUT, World, deployment_yaml, model_yaml};
use support::*;

const TEST: &str = "migration::from_the_earlier_operator_and_back_as_the_page_prints";
const EARLIER_FINALIZER: &str = "kopf.zalando.org/KopfFinalizerMarker";
const FINALIZER: &str = "openmed.ai/release-target";

/// The page, and its blocks by the line before each, in the walk's order.
const PAGE: &str = "docs/migration.md";
const AT_REST: &str = "1. **Every model at rest.**";
const NO_REFUSED_VERSION: &str = "2. **No version the service refuses.**";
const STOP_EARLIER: &str = "1. Stop the earlier operator";
const INSTALL: &str = "2. Install openmed-op's CRD";
const CHECK: &str = "3. Check that it took each model over";
const STOP_OPENMED_OP: &str = "1. Stop openmed-op, wait for its pods to go";
const EARLIER_AGAIN: &str = "2. Apply the earlier operator's RBAC and Deployment again";

/// The earlier operator's image, as its Deployment names it (any tag).
const EARLIER_IMAGE: &str = "ghcr.io/maziyarpanahi/openmed-operator";

/// How long one block may take (a rollout status of two operator pods).
const BLOCK_DEADLINE: Duration = Duration::from_secs(180);

fn main() {
    support::use_cluster_dir(support::root().join("target/migration"));
    let args = Arguments::from_args();
    let trial = match reference() {
        Ok(dir) => Trial::test(TEST, move || {
            support::recorded(TEST, move || from_the_earlier_operator_and_back(dir))
        }),
        Err(why) => {
            eprintln!("{TEST}: ignored: {why}");
            Trial::test(TEST, || Ok(())).with_ignored_flag(true)
        }
    };
    support::run_on_own_cluster(&args, vec![trial]);
}

/// The earlier operator's files, or why they are not here.
fn reference() -> Result<PathBuf, String> {
    let dir = std::env::var_os("OPENMED_KOPF_REFERENCE")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("../shared/reference/openmed-kopf-operator"));
    if dir.join("openmed_operator.py").is_file() {
        Ok(dir)
    } else {
        Err(format!(
            "the earlier operator's files are not at {} (set OPENMED_KOPF_REFERENCE to its folder)",
            dir.display()
        ))
    }
}

/// Maps the earlier operator's image to what its Dockerfile builds: Kopf
/// on PATH, `openmed_operator.py` at `/app`, its entrypoint, arguments
/// and environment.
async fn map_earlier_image(client: &kube::Client, reference: &Path) {
    let kopf = built_tools("tests/kopf/build");
    set_image_map(
        client,
        "migration-earlier-operator",
        &json!({EARLIER_IMAGE: {
            "entrypoint": ["kopf"],
            "cmd": ["run", "--standalone", "--all-namespaces", "--log-format=json",
                    "--liveness=http://0.0.0.0:8080/healthz", "/app/openmed_operator.py"],
            "env": [
                format!("PATH={}:/usr/local/bin:/usr/bin:/bin", kopf.join("venv/bin").display()),
                "HOME=/tmp",
                "PYTHONUNBUFFERED=1",
            ],
            "workingDir": "/app",
            "files": {"/app/openmed_operator.py": reference.join("openmed_operator.py")},
        }}),
    )
    .await;
}

/// Runs the page's block after `label` in `dir` with bash (`set -e`, so
/// the first failing command fails it), kubectl, kustomize and openmed-op
/// first on PATH and the admin's KUBECONFIG; returns what it printed.
fn run_page_block(dir: &Path, label: &str) -> String {
    let block = doc_blocks::block_after(PAGE, label);
    eprintln!("migration: {} ({label:?}):\n{}", block.at(), block.body);
    let kustomize = built_tools("tests/gitops/build");
    let path = format!(
        "{}:{}:{}:{}",
        kubectl_binary().parent().unwrap().display(),
        kustomize.display(),
        Path::new(binary()).parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut bash = Command::new("bash");
    bash.args(["-euo", "pipefail", "-c", &block.body])
        .current_dir(dir)
        .env("PATH", path)
        .env("KUBECONFIG", kubeconfig());
    let log = cluster_dir().join("logs/migration-block.log");
    let (ok, output) = doc_blocks::run_logged(bash, &log, BLOCK_DEADLINE);
    assert!(
        ok,
        "{}: the block after {label:?} failed:\n{output}",
        block.at()
    );
    output
}

/// The user's models repository: the resource as Git has it.
fn models_repository(model: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("models")).unwrap();
    std::fs::write(dir.path().join("models/openmed-service.yaml"), model).unwrap();
    for args in [
        &["init", "-q"][..],
        &["add", "-A"],
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.com",
            "commit",
            "-qm",
            "models",
        ],
    ] {
        let status = Command::new("git")
            .args(args)
            .current_dir(dir.path())
            .status()
            .unwrap();
        assert!(status.success(), "git {args:?}");
    }
    dir
}

/// The UIDs of the namespace's pods.
async fn pod_uids(client: &kube::Client, namespace: &str) -> BTreeSet<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    pods.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.metadata.uid)
        .collect()
}

fn retained(status: &OpenMedModelStatus) -> (Option<String>, Option<String>) {
    (
        status
            .last_successful_spec
            .as_ref()
            .map(|s| s.version.clone()),
        status
            .previous_successful_spec
            .as_ref()
            .map(|s| s.version.clone()),
    )
}

fn ready_at(status: &OpenMedModelStatus, version: &str) -> bool {
    status.phase == Some(Phase::Ready)
        && status.active_version.as_deref() == Some(version)
        && status
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// Waits until openmed-op's finalizer is on the resource `svc`: it has
/// taken the resource over.
async fn taken_over(models: &Api<DynamicObject>, what: &str) {
    wait_until(
        what,
        ROLLOUT,
        || async { models.get("svc").await.unwrap().metadata.finalizers },
        |f| {
            f.as_ref()
                .is_some_and(|f| f.iter().any(|f| f == "openmed.ai/release-target"))
        },
    )
    .await;
}

fn from_the_earlier_operator_and_back(reference: PathBuf) {
    block_on(async {
        let client = admin().await;
        map_earlier_image(&client, &reference).await;
        operator_pods::map_operator_image(&client, "migration-openmed-op").await;

        // The cluster as its admin left it: the earlier operator, installed
        // from its own files. Its own CRD is not structural, which a
        // current API server refuses; the cluster holds openmed-op's, the
        // same fields and rules in the form it takes (docs/migration.md).
        install_crd(&client).await;
        let files: Vec<String> = [
            "namespace.yaml",
            "service-account.yaml",
            "rbac.yaml",
            "role-binding.yaml",
            "deployment.yaml",
        ]
        .iter()
        .map(|f| reference.join(f).display().to_string())
        .collect();
        let mut apply = vec!["apply", "--server-side"];
        for file in &files {
            apply.extend(["-f", file.as_str()]);
        }
        let (ok, _, err) = kubectl(&apply);
        assert!(ok, "kubectl apply (the earlier operator's files): {err}");
        let (ok, _, err) = kubectl(&[
            "-n",
            "openmed-system",
            "rollout",
            "status",
            "deployment",
            "openmed-operator",
            "--timeout=120s",
        ]);
        assert!(ok, "the earlier operator's pod: {err}");

        let ns = TestNamespace::create(&client, "migration").await;
        let name = ns.name.clone();
        let world = World::of(
            client.clone(),
            ns,
            format!(
                "the operators' pods, under {}",
                cluster_dir().join("kubelet").display()
            ),
        );
        // The earlier operator requires replicas and the strategy type.
        let extra = "  rolloutStrategy:\n    type: RollingUpdate\n";
        let (v1, v2, v3) = (
            format!("OpenMed/v1-{name}"),
            format!("OpenMed/v2-{name}"),
            format!("OpenMed/v3-{name}"),
        );
        world
            .apply(&deployment_yaml("svc", "openmed-service", "boot"))
            .await;
        let models: Api<DynamicObject> = Api::namespaced_with(
            client.clone(),
            &name,
            &kube::api::ApiResource::erase::<openmed_op::api::OpenMedModel>(&()),
        );
        let status = |what: &'static str, ok: Box<dyn Fn(&OpenMedModelStatus) -> bool>| {
            let models = models.clone();
            async move {
                wait_until(
                    what,
                    ROLLOUT,
                    || async {
                        models
                            .get("svc")
                            .await
                            .ok()
                            .and_then(|m| m.data.get("status").cloned())
                            .and_then(|s| serde_json::from_value::<OpenMedModelStatus>(s).ok())
                            .unwrap_or_default()
                    },
                    |s| ok(s),
                )
                .await
            }
        };

        // The earlier operator rolls v1, then v2.
        world.apply(&model_yaml("svc", &v1, extra)).await;
        let first = v1.clone();
        status(
            "the earlier operator to roll out v1",
            Box::new(move |s| ready_at(s, &first)),
        )
        .await;
        let model_v2 = model_yaml("svc", &v2, extra);
        world.apply(&model_v2).await;
        let second = v2.clone();
        let by_earlier = status(
            "the earlier operator to roll out v2",
            Box::new(move |s| ready_at(s, &second)),
        )
        .await;
        assert_eq!(
            retained(&by_earlier),
            (Some(v2.clone()), Some(v1.clone())),
            "the earlier operator's history"
        );

        // Before you start: at rest, and no version the service refuses.
        // The user's models repository, and their copy of openmed-op's
        // checkout (the install edits its kustomization).
        let repository = models_repository(&model_v2);
        let user = install_copy();
        let out = run_page_block(user.path(), AT_REST);
        assert!(
            out.lines()
                .any(|l| l.contains(&name) && l.contains("Ready")),
            "the model is listed at rest:\n{out}"
        );
        let out = run_page_block(repository.path(), NO_REFUSED_VERSION);
        assert!(!out.contains("error["), "no version is refused:\n{out}");

        // The move: the earlier operator stops, openmed-op is installed.
        run_page_block(user.path(), STOP_EARLIER);
        let pods_before = pod_uids(&client, &name).await;
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), &name);
        let template_before = deployments.get("svc").await.unwrap().spec.unwrap().template;
        run_page_block(user.path(), INSTALL);
        taken_over(
            &models,
            "openmed-op to take the resource over (its finalizer)",
        )
        .await;
        let second = v2.clone();
        let adopted = world
            .wait_status("svc", "openmed-op to report v2 Ready", move |s| {
                ready_at(s, &second) && s.observed_generation.is_some()
            })
            .await;
        assert_eq!(
            retained(&adopted),
            (Some(v2.clone()), Some(v1.clone())),
            "the retained versions are kept"
        );
        assert_eq!(
            deployments.get("svc").await.unwrap().spec.unwrap().template,
            template_before,
            "the template is adopted as it is"
        );
        assert_eq!(
            pod_uids(&client, &name).await,
            pods_before,
            "no pod was replaced"
        );
        let out = run_page_block(user.path(), CHECK);
        let row = out
            .lines()
            .find(|l| l.starts_with("svc "))
            .unwrap_or_else(|| panic!("the resource's row:\n{out}"));
        for want in [FINALIZER, EARLIER_FINALIZER, &v2, &v1] {
            assert!(row.contains(want), "{want} in its row:\n{out}");
        }

        // A manual rollback and a bump.
        world
            .annotate("svc", "openmed.ai/rollback-to", Some(&v1))
            .await;
        world.wait_manual_rollback("svc", &v1).await;
        world.annotate("svc", "openmed.ai/rollback-to", None).await;
        world.set_spec("svc", json!({"version": v3})).await;
        let after = world.wait_ready("svc", &v3).await;
        assert_eq!(retained(&after).0.as_deref(), Some(v3.as_str()));

        // The way back: openmed-op stops, its finalizer comes off, and the
        // earlier operator's files are applied again, from its folder.
        run_page_block(user.path(), STOP_OPENMED_OP);
        let finalizers = models.get("svc").await.unwrap().metadata.finalizers;
        assert_eq!(
            finalizers.as_deref(),
            Some(&[EARLIER_FINALIZER.to_owned()][..]),
            "only the earlier operator's finalizer is left"
        );
        run_page_block(&reference, EARLIER_AGAIN);
        let third = v3.clone();
        let back = status(
            "the earlier operator to keep v3 Ready",
            Box::new(move |s| ready_at(s, &third) && s.last_successful_spec.is_some()),
        )
        .await;
        assert_eq!(
            retained(&back).0.as_deref(),
            Some(v3.as_str()),
            "history kept on the way back"
        );
        assert!(
            back.previous_successful_spec.is_some(),
            "the previous version is kept too: {back:?}"
        );

        // A resource deleted while no operator runs (the earlier one
        // stopped, openmed-op not yet installed), so with only the earlier
        // operator's finalizer on it: it waits for openmed-op, which
        // releases the Deployment and lets it go.
        run_page_block(user.path(), STOP_EARLIER);
        models
            .delete("svc", &DeleteParams::default())
            .await
            .unwrap();
        let held = models.get("svc").await.unwrap().metadata;
        assert!(
            held.deletion_timestamp.is_some(),
            "held by the earlier operator's finalizer: {held:?}"
        );
        run_page_block(user.path(), INSTALL);
        world.wait_model_gone("svc", Duration::from_secs(120)).await;
        let released = deployments.get("svc").await.unwrap();
        let annotations = released.metadata.annotations.unwrap_or_default();
        assert!(
            !annotations.contains_key("openmed.ai/model-resource"),
            "released: {annotations:?}"
        );
        world.finish().await;
    });
}
