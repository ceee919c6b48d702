//! The kustomize install, run as README's "Install on your cluster" prints
//! it: its code blocks are read from README.md and run by bash, line for
//! line, in a copy of `crds/` and `deploy/` (the install edits its
//! kustomization), with the built kubectl and kustomize first on PATH.
//!
//! The install's two operator pods run the operator: the test kubelet maps
//! the image the README sets (`registry.example/openmed-op`) to the
//! operator's binary (or the image's static build with
//! `OPERATOR_IMAGE_BINARY`), and runs it with the Deployment's arguments
//! and its ServiceAccount's token. The operator is cluster-wide, as the
//! install makes it, so this tier has a control plane of its own
//! (`target/install`): on the e2e suite's, it would act on every test's
//! models beside the test's own operator.
//!
//! Steps: install (2a); the pods lead through the install's Lease and roll
//! a model v1 -> v2; upgrade to a new image (3): the pods are replaced, no
//! model pod restarts, a new pod leads and rolls v3; uninstall (5): the
//! model releases its Deployment, the operator's pods stop cleanly, and
//! the CRD stays.

#[allow(dead_code)]
#[path = "../e2e/support.rs"]
mod support;

#[allow(dead_code)]
#[path = "../e2e/env.rs"]
mod env;

#[allow(dead_code)]
#[path = "../e2e/operator_pods.rs"]
mod operator_pods;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, ListParams};
use libtest_mimic::{Arguments, Trial};
use serde_json::json;

use env::World;
use operator_pods::{OperatorPods, map_operator_image};
use support::*;

/// One way to install, as README's blocks say it, by the lines that come
/// before them.
struct Way {
    test: &'static str,
    install: &'static str,
    upgrade: &'static str,
    uninstall: &'static str,
}

const KUSTOMIZE: Way = Way {
    test: "install::kustomize_install_upgrade_and_uninstall_as_the_readme_prints",
    install: "**2a. With kustomize**",
    upgrade: "With kustomize, the CRD, then the new image",
    uninstall: "Then the operator, with kustomize:",
};

const HELM: Way = Way {
    test: "install::helm_install_upgrade_and_uninstall_as_the_readme_prints",
    install: "**2b. Or with Helm**",
    upgrade: "**3. Upgrade.**",
    uninstall: "or with Helm:",
};

fn main() {
    support::use_cluster_dir(support::root().join("target/install"));
    let mut args = Arguments::from_args();
    // Each install is cluster-wide: one at a time.
    args.test_threads = Some(1);
    let trials = [KUSTOMIZE, HELM]
        .into_iter()
        .map(|way| {
            Trial::test(way.test, move || {
                support::recorded(way.test, move || install_upgrade_and_uninstall(&way))
            })
        })
        .collect::<Vec<_>>();
    support::run_on_own_cluster(&args, trials);
}

/// The lines of the first ```sh block after the README line that starts
/// with `label`.
fn readme_block(label: &str) -> String {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let mut lines = readme
        .lines()
        .skip_while(|l| !l.starts_with(label))
        .skip_while(|l| *l != "```sh");
    assert!(
        lines.next().is_some(),
        "README.md has a ```sh block after a line starting {label:?}"
    );
    let block: Vec<&str> = lines.take_while(|l| *l != "```").collect();
    assert!(!block.is_empty(), "the block after {label:?} is empty");
    block.join("\n") + "\n"
}

/// How long one block of commands may take (an uninstall waits for the
/// model's pods to restart and the namespace to go).
const BLOCK_DEADLINE: Duration = Duration::from_secs(240);

/// Runs README's block after `label` in `dir` with bash (`set -e`, so the
/// first failing command fails it), kubectl, kustomize and helm first on
/// PATH, KUBECONFIG set and helm's folders in `dir`; polls it to the end within [`BLOCK_DEADLINE`].
fn run_readme_block(dir: &Path, label: &str) {
    let block = readme_block(label);
    eprintln!("install: running README's block after {label:?}:\n{block}");
    let kustomize = built_tools("tests/gitops/build");
    let helm = built_tools("tests/helm/build").join("bin");
    let kubectl = kubectl_binary();
    let path = format!(
        "{}:{}:{}:{}",
        kubectl.parent().unwrap().display(),
        kustomize.display(),
        helm.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let log = dir.join("commands.log");
    let out = std::fs::File::options()
        .create(true)
        .append(true)
        .open(&log)
        .unwrap();
    let mut child = Command::new("bash")
        .arg("-euo")
        .arg("pipefail")
        .arg("-c")
        .arg(&block)
        .current_dir(dir)
        .env("PATH", path)
        .env("KUBECONFIG", kubeconfig())
        .env("HELM_CACHE_HOME", dir.join(".helm/cache"))
        .env("HELM_CONFIG_HOME", dir.join(".helm/config"))
        .env("HELM_DATA_HOME", dir.join(".helm/data"))
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("bash runs");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > BLOCK_DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "README's block after {label:?} did not finish in {BLOCK_DEADLINE:?}:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        status.success(),
        "README's block after {label:?} failed ({status}):\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}

const HOME: &str = "openmed-system";
const NAME: &str = "openmed-operator";

fn uids(pods: Vec<Pod>) -> BTreeSet<String> {
    pods.into_iter().filter_map(|p| p.metadata.uid).collect()
}

fn install_upgrade_and_uninstall(way: &Way) {
    block_on(async {
        let client = admin().await;
        map_operator_image(&client, "install").await;
        let copy = install_copy();

        // 2. Install.
        run_readme_block(copy.path(), way.install);
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), HOME);
        let pods = OperatorPods::new(
            &client,
            HOME,
            NAME,
            "app.kubernetes.io/name=openmed-operator",
        );
        assert_eq!(pods.image().await, "registry.example/openmed-op:0.1.0");
        let first = pods.wait_ready("0.1.0", 2).await;
        pods.wait_led_by_one_of(&first).await;
        let ns = TestNamespace::create(&client, "install").await;
        let world = World::of(client.clone(), ns, pods.log_hint());
        let (_v1, v2) = world.v1_then_v2().await;

        // 3. Upgrade: both pods replaced, one at a time; the model's pods
        // untouched; a pod of the new image leads and rolls the next
        // version.
        let model_pods: Api<Pod> = Api::namespaced(client.clone(), &world.ns.name);
        let serving = uids(model_pods.list(&ListParams::default()).await.unwrap().items);
        let generation = world.deployment("svc").await["metadata"]["generation"].clone();
        run_readme_block(copy.path(), way.upgrade);
        assert_eq!(pods.image().await, "registry.example/openmed-op:0.2.0");
        let second = pods.wait_ready("0.2.0", 2).await;
        assert!(
            second.iter().all(|pod| !first.contains(pod)),
            "every operator pod replaced: {first:?} then {second:?}"
        );
        pods.wait_led_by_one_of(&second).await;
        assert_eq!(
            uids(model_pods.list(&ListParams::default()).await.unwrap().items),
            serving,
            "no model pod restarted on the upgrade"
        );
        assert_eq!(
            world.deployment("svc").await["metadata"]["generation"],
            generation,
            "the upgrade wrote nothing to the target"
        );
        assert_eq!(world.status("svc").await.active_version, Some(v2));
        let v3 = world.version("v3");
        world.set_spec("svc", json!({"version": v3})).await;
        world.wait_ready("svc", &v3).await;

        // 5. Uninstall: the model first (it releases its Deployment and
        // deletes its ConfigMaps), then the operator, whose pods stop
        // cleanly. The CRD stays.
        run_readme_block(copy.path(), "**5. Uninstall.**");
        assert!(world.models().get_opt("svc").await.unwrap().is_none());
        let released = world.deployment("svc").await;
        let container = &released["spec"]["template"]["spec"]["containers"][0];
        let preload = container["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "OPENMED_SERVICE_PRELOAD_MODELS")
            .cloned()
            .unwrap_or_default();
        // An empty value, which the API server stores as no value, and no
        // reference to a ConfigMap.
        assert_eq!(
            preload,
            json!({"name": "OPENMED_SERVICE_PRELOAD_MODELS"}),
            "the Deployment released: {container}"
        );
        let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &world.ns.name);
        let left: Vec<String> = config_maps
            .list(&ListParams::default().labels("app.kubernetes.io/managed-by=openmed-op"))
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|c| c.metadata.name)
            .collect();
        assert!(left.is_empty(), "the model's ConfigMaps deleted: {left:?}");
        run_readme_block(copy.path(), way.uninstall);
        let (ok, _, err) = kubectl(&["get", "crd", "openmedmodels.openmed.ai"]);
        assert!(ok, "the CRD stays: {err}");
        pods.wait_gone().await;
        pods.assert_stopped_cleanly(&[first, second].concat());
        assert!(deployments.get_opt(NAME).await.unwrap().is_none());
        let (ok, _, _) = kubectl(&["get", "clusterrole", NAME]);
        assert!(!ok, "the operator's ClusterRole is gone");
        world.finish().await;
        // Not a README step: Helm leaves the namespace it was installed
        // into, and the next install (or run) creates it again.
        let (ok, _, err) = kubectl(&["delete", "namespace", HOME, "--ignore-not-found"]);
        assert!(ok, "{err}");
    });
}
