//! Moving a cluster from the earlier OpenMed operator (Kopf) to openmed-op
//! and back, with the earlier operator itself: its files, run unchanged
//! from where the fixture lives (never copied into the project), on Kopf
//! 1.44.6 from PyPI (`tests/kopf/build`), on a control plane of its own
//! (`target/migration`: the two operators' RBAC share names, as they do
//! on a real cluster).
//!
//! Every step of `docs/migration.md`, in its order and with its commands:
//! the earlier operator rolls v1 → v2; it stops and openmed-op starts: no
//! pod replaced, status and retained versions kept, Ready stays; a manual
//! rollback and a bump work; the way back to the earlier operator keeps
//! the history; and the resource, deleted while no operator runs with
//! only the earlier operator's finalizer on it, goes once openmed-op
//! starts, its Deployment released.
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

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use libtest_mimic::{Arguments, Trial};
use openmed_op::api::{OpenMedModelStatus, Phase};
use serde_json::{Value, json};

use env::{Env, ROLLOUT, deployment_yaml, model_yaml};
use support::*;

const TEST: &str = "migration::from_the_earlier_operator_and_back";
const EARLIER_FINALIZER: &str = "kopf.zalando.org/KopfFinalizerMarker";

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

/// The earlier operator, running as its ServiceAccount, for one namespace.
struct Earlier {
    child: Child,
    log: PathBuf,
}

impl Earlier {
    /// `kopf run --standalone --namespace NS openmed_operator.py`, with the
    /// credentials its README names: a token of its ServiceAccount and the
    /// cluster's CA, for its own requests and for Kopf's.
    fn start(reference: &Path, namespace: &str) -> Self {
        let kopf = built_tools("tests/kopf/build");
        let (ok, token, err) = kubectl(&[
            "create",
            "token",
            "openmed-operator",
            "-n",
            "openmed-system",
            "--duration=2h",
        ]);
        assert!(ok, "a token for the earlier operator: {err}");
        let dir = cluster_dir();
        let token_path = dir.join("earlier-operator.token");
        std::fs::write(&token_path, token.trim()).unwrap();
        let ca = dir.join("pki/ca.crt");
        let admin: Value =
            serde_yaml::from_str(&std::fs::read_to_string(kubeconfig()).unwrap()).unwrap();
        let server = admin["clusters"][0]["cluster"]["server"]
            .as_str()
            .unwrap()
            .to_owned();
        let port = server.rsplit(':').next().unwrap().to_owned();
        let config = json!({
            "apiVersion": "v1", "kind": "Config", "current-context": "earlier",
            "clusters": [{"name": "c", "cluster": {"server": server, "certificate-authority": ca}}],
            "users": [{"name": "earlier", "user": {"token": token.trim()}}],
            "contexts": [{"name": "earlier", "context": {"cluster": "c", "user": "earlier"}}],
        });
        let kubeconfig = dir.join("earlier-operator.kubeconfig");
        std::fs::write(&kubeconfig, serde_yaml::to_string(&config).unwrap()).unwrap();
        let log = dir.join(format!("logs/earlier-operator-{namespace}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(kopf.join("venv/bin/python"))
            .args([
                "-m",
                "kopf",
                "run",
                "--standalone",
                "--namespace",
                namespace,
            ])
            .arg(reference.join("openmed_operator.py"))
            .env("KUBECONFIG", &kubeconfig)
            .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
            .env("KUBERNETES_SERVICE_PORT_HTTPS", &port)
            .env("OPENMED_OPERATOR_TOKEN_PATH", &token_path)
            .env("OPENMED_OPERATOR_CA_PATH", &ca)
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("the earlier operator starts");
        Earlier { child, log }
    }

    fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Earlier {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Installs the earlier operator's RBAC from its own files, as its users
/// did (docs/migration.md, the way back).
fn install_earlier_rbac(reference: &Path) {
    for file in [
        "namespace.yaml",
        "service-account.yaml",
        "rbac.yaml",
        "role-binding.yaml",
    ] {
        let path = reference.join(file);
        let (ok, _, err) = kubectl(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            path.to_str().unwrap(),
        ]);
        assert!(ok, "kubectl apply -f {file}: {err}");
    }
}

/// The UIDs of the namespace's pods.
async fn pod_uids(env_client: &kube::Client, namespace: &str) -> BTreeSet<String> {
    let pods: Api<Pod> = Api::namespaced(env_client.clone(), namespace);
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
async fn taken_over(models: &Api<kube::api::DynamicObject>, what: &str) {
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
        install_crd(&client).await;
        install_earlier_rbac(&reference);
        let ns = TestNamespace::create(&client, "migration").await;
        let name = ns.name.clone();
        // The earlier operator requires replicas and the strategy type.
        let extra = "  rolloutStrategy:\n    type: RollingUpdate\n";
        let (v1, v2, v3) = (
            format!("OpenMed/v1-{name}"),
            format!("OpenMed/v2-{name}"),
            format!("OpenMed/v3-{name}"),
        );
        apply_yaml(
            &client,
            Some(&name),
            &deployment_yaml("svc", "openmed-service", "boot"),
            "e2e-user",
        )
        .await;
        apply_yaml(
            &client,
            Some(&name),
            &model_yaml("svc", &v1, extra),
            "e2e-user",
        )
        .await;
        let models: Api<kube::api::DynamicObject> = Api::namespaced_with(
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

        // 1. The earlier operator rolls v1, then v2.
        let earlier = Earlier::start(&reference, &name);
        let log = earlier.log.clone();
        let first = v1.clone();
        status(
            "the earlier operator to roll out v1",
            Box::new(move |s| ready_at(s, &first)),
        )
        .await;
        apply_yaml(
            &client,
            Some(&name),
            &model_yaml("svc", &v2, extra),
            "e2e-user",
        )
        .await;
        let second = v2.clone();
        let by_earlier = status(
            "the earlier operator to roll out v2",
            Box::new(move |s| ready_at(s, &second)),
        )
        .await;
        assert_eq!(
            retained(&by_earlier),
            (Some(v2.clone()), Some(v1.clone())),
            "the earlier operator's history (log {})",
            log.display()
        );

        // 2. It stops; openmed-op (its RBAC, same names) starts.
        earlier.stop();
        let pods_before = pod_uids(&client, &name).await;
        let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
            Api::namespaced(client.clone(), &name);
        let template_before = deployments.get("svc").await.unwrap().spec.unwrap().template;
        operator_kubeconfig(); // installs deploy/operator
        let mut env = Env::of(client.clone(), ns, Operator::start(&name, &[]));
        taken_over(
            &models,
            "openmed-op to take the resource over (its finalizer)",
        )
        .await;
        let second = v2.clone();
        let adopted = env
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

        // 3. A manual rollback and a bump.
        env.annotate("svc", "openmed.ai/rollback-to", Some(&v1))
            .await;
        env.wait_manual_rollback("svc", &v1).await;
        env.annotate("svc", "openmed.ai/rollback-to", None).await;
        env.set_spec("svc", json!({"version": v3})).await;
        let after = env.wait_ready("svc", &v3).await;
        let (last, _) = retained(&after);
        assert_eq!(last.as_deref(), Some(v3.as_str()));

        // 4. The way back: openmed-op stops, its finalizer is taken off,
        // the earlier operator's RBAC and the operator return.
        env.operator.kill();
        let finalizers: Vec<String> = models
            .get("svc")
            .await
            .unwrap()
            .metadata
            .finalizers
            .unwrap_or_default()
            .into_iter()
            .filter(|f| f != "openmed.ai/release-target")
            .collect();
        models
            .patch(
                "svc",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": finalizers}})),
            )
            .await
            .unwrap();
        install_earlier_rbac(&reference);
        let earlier = Earlier::start(&reference, &name);
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
        earlier.stop();

        // 5. The resource deleted while no operator runs, so with only the
        // earlier operator's finalizer on it (deleted between stopping that
        // operator and starting openmed-op): it waits for openmed-op, which
        // releases the Deployment and lets it go.
        let on_it = models.get("svc").await.unwrap().metadata.finalizers;
        assert_eq!(
            on_it.as_deref(),
            Some(&[EARLIER_FINALIZER.to_owned()][..]),
            "only the earlier operator's finalizer is on the resource"
        );
        models
            .delete("svc", &DeleteParams::default())
            .await
            .unwrap();
        assert!(
            models
                .get("svc")
                .await
                .unwrap()
                .metadata
                .deletion_timestamp
                .is_some(),
            "held by the earlier operator's finalizer"
        );
        install_operator(); // the earlier operator's RBAC had replaced it
        env.operator = Operator::start(&name, &[]);
        let gone = tokio::time::timeout(Duration::from_secs(120), async {
            while models.get_opt("svc").await.unwrap().is_some() {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
        .await;
        if gone.is_err() {
            let (_, deployment, _) = kubectl(&[
                "get",
                "deployment",
                "svc",
                "-n",
                &name,
                "-o",
                "yaml",
                "--show-managed-fields",
            ]);
            panic!(
                "the deletion did not complete in 120 s (operator log {}); the Deployment:\n{deployment}",
                env.operator.log.display()
            );
        }
        let released = deployments.get("svc").await.unwrap();
        let annotations = released.metadata.annotations.unwrap_or_default();
        assert!(
            !annotations.contains_key("openmed.ai/model-resource"),
            "released: {annotations:?}"
        );
        env.finish().await;
    });
}
