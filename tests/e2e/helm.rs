//! The Helm chart (`deploy/helm/openmed-operator`) installed, upgraded and
//! uninstalled with the real `helm` (built by `tests/helm/build`) on the
//! real control plane, and the operator working after each step. The
//! chart's own pods run the operator: the test kubelet maps the image the
//! README's install names to the operator's binary (the one under test, or
//! the image's static build with `OPERATOR_IMAGE_BINARY`, see
//! docs/operations.md, "Image"), and runs it as the image would, with the
//! chart's arguments, its ServiceAccount's token and nothing else. So the
//! pods find the API server as in-cluster clients do, lead through the
//! chart's Lease, roll a model out (install), obey a changed value
//! (upgrade), and stop cleanly, restarting no model pod (uninstall).
//!
//! `cargo test --test helm` checks the chart offline: lint, values schema,
//! and the rendered objects against the kustomize install.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use libtest_mimic::Trial;
use serde_json::json;

use crate::operator::{ROLLOUT, World};
use crate::support::*;
use crate::trial;

pub fn trials() -> Vec<Trial> {
    vec![trial(
        "helm::the_chart_installs_upgrades_and_uninstalls_with_the_operator_working",
        the_chart_installs_upgrades_and_uninstalls_with_the_operator_working,
    )]
}

/// `bin/helm`, built once per helm version and cached.
fn helm_binary() -> &'static PathBuf {
    static HELM: OnceLock<PathBuf> = OnceLock::new();
    HELM.get_or_init(|| built_tools("tests/helm/build").join("bin/helm"))
}

/// Runs helm against the test cluster, with its caches and configuration
/// in the cluster folder; panics with helm's output when it fails.
fn helm(args: &[&str]) -> String {
    let home = cluster_dir().join("helm");
    let out = Command::new(helm_binary())
        .arg("--kubeconfig")
        .arg(kubeconfig())
        .args(args)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .output()
        .expect("helm runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "helm {args:?}:\n{text}");
    text
}

const RELEASE: &str = "e2e";
const FULLNAME: &str = "e2e-openmed-operator";

/// The operator container's arguments as the API server holds them.
async fn installed_args(deployments: &Api<Deployment>) -> Vec<String> {
    let deployment = deployments.get(FULLNAME).await.unwrap();
    deployment.spec.unwrap().template.spec.unwrap().containers[0]
        .args
        .clone()
        .unwrap()
}

async fn installed_image(deployments: &Api<Deployment>) -> String {
    let deployment = deployments.get(FULLNAME).await.unwrap();
    deployment.spec.unwrap().template.spec.unwrap().containers[0]
        .image
        .clone()
        .unwrap_or_default()
}

/// The image README's install names, without its tag.
const IMAGE: &str = "registry.example/openmed-op";

/// What the image runs: the binary under test, or with
/// `OPERATOR_IMAGE_BINARY=$(deploy/image/build-binary)` the static one the
/// image ships (a release build for musl, about 10 minutes from nothing,
/// so not in CI).
fn image_binary() -> String {
    std::env::var("OPERATOR_IMAGE_BINARY").unwrap_or_else(|_| binary().to_owned())
}

/// The release's operator pods.
async fn release_pods(pods: &Api<Pod>) -> Vec<Pod> {
    let selector = format!("app.kubernetes.io/instance={RELEASE}");
    pods.list(&ListParams::default().labels(&selector))
        .await
        .unwrap()
        .items
}

/// Waits until the release's pods are the chart's two, each running image
/// tag `tag` and Ready (a pod of another tag still terminating counts
/// against it); returns their names.
async fn operator_pods(pods: &Api<Pod>, tag: &str) -> Vec<String> {
    let image = format!("{IMAGE}:{tag}");
    wait_until(
        &format!("the chart's two operator pods on {image}, Ready"),
        ROLLOUT,
        || release_pods(pods),
        |items| {
            items.len() == 2
                && items.iter().all(|p| {
                    let ready = p.status.as_ref().is_some_and(|s| {
                        s.conditions
                            .iter()
                            .flatten()
                            .any(|c| c.type_ == "Ready" && c.status == "True")
                    });
                    let spec_image = p.spec.as_ref().and_then(|s| s.containers[0].image.clone());
                    ready && spec_image.as_deref() == Some(image.as_str())
                })
        },
    )
    .await
    .into_iter()
    .filter_map(|p| p.metadata.name)
    .collect()
}

async fn lease_holder(leases: &Api<Lease>) -> String {
    leases
        .get(FULLNAME)
        .await
        .unwrap()
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap_or_default()
}

/// Where the test kubelet keeps the operator pods' logs (for a timeout's
/// message).
fn pod_logs_hint(namespace: &str) -> String {
    format!(
        "{}/kubelet/pods/{namespace}_{FULLNAME}-*/operator/",
        cluster_dir().display()
    )
}

/// The log of the last run of pod `name`'s operator container.
fn last_log(namespace: &str, name: &str) -> String {
    let prefix = format!("{namespace}_{name}_");
    let pods = cluster_dir().join("kubelet/pods");
    let dir = std::fs::read_dir(&pods)
        .unwrap()
        .filter_map(Result::ok)
        .find(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .unwrap_or_else(|| panic!("no log folder {prefix}* in {}", pods.display()))
        .path()
        .join("operator");
    let last = (0..)
        .map(|restart| dir.join(format!("{restart}.log")))
        .take_while(|path| path.exists())
        .last()
        .unwrap_or_else(|| panic!("no log in {}", dir.display()));
    std::fs::read_to_string(last).unwrap()
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn the_chart_installs_upgrades_and_uninstalls_with_the_operator_working() {
    block_on(async {
        let client = admin().await;
        install_crd(&client).await;
        set_image_map(
            &client,
            "e2e-helm",
            &json!({IMAGE: {"entrypoint": [image_binary()], "cmd": ["run"]}}),
        )
        .await;
        let home = TestNamespace::create(&client, "helmhome").await;
        let watched = TestNamespace::create(&client, "helmwatched").await;
        let chart = root().join("deploy/helm/openmed-operator");
        let chart = chart.to_str().unwrap();
        // Namespaced mode, so this release and the suite's cluster-wide
        // install do not overlap. The admission policies are cluster-wide
        // singletons that the suite's install already holds.
        let out = helm(&[
            "install",
            RELEASE,
            chart,
            "--namespace",
            &home.name,
            "--set",
            &format!("watchNamespaces={{{}}}", watched.name),
            "--set",
            "admissionPolicies.enabled=false",
            // The image as README's install sets it.
            "--set",
            "image.repository=registry.example/openmed-op",
            "--set",
            "image.tag=0.1.0",
            "--wait",
            "--timeout",
            "2m",
        ]);
        assert!(out.contains("STATUS: deployed"), "{out}");
        assert!(
            out.contains(&format!("watching {}", watched.name)),
            "NOTES: {out}"
        );
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), &home.name);
        assert_eq!(
            installed_image(&deployments).await,
            "registry.example/openmed-op:0.1.0"
        );

        // The chart's identity may do the operator's work in the watched
        // namespace, and nothing cluster-wide.
        let identity = format!("system:serviceaccount:{}:{FULLNAME}", home.name);
        assert!(can_i(
            &identity,
            &["patch", "deployments.apps", "-n", &watched.name]
        ));
        assert!(can_i(
            &identity,
            &["create", "events.events.k8s.io", "-n", &watched.name]
        ));
        assert!(!can_i(
            &identity,
            &["list", "openmedmodels.openmed.ai", "-A"]
        ));
        assert!(!can_i(
            &identity,
            &["patch", "deployments.apps", "-n", &home.name]
        ));

        // The chart's Deployment as the API server holds it: its pods run
        // exactly these arguments (the image's entrypoint, no command).
        let args = installed_args(&deployments).await;
        assert_eq!(
            args,
            [
                "run",
                "--log-format=json",
                "--leader-elect",
                &format!("--leader-elect-resource-name={FULLNAME}"),
                &format!("--namespace={}", watched.name),
            ]
        );
        let pods: Api<Pod> = Api::namespaced(client.clone(), &home.name);
        let first = operator_pods(&pods, "0.1.0").await;
        let env = World::of(client.clone(), watched, pod_logs_hint(&home.name));
        let (_v1, v2) = env.v1_then_v2().await;
        let leases: Api<Lease> = Api::namespaced(client.clone(), &home.name);
        let holder = lease_holder(&leases).await;
        assert!(
            first.iter().any(|pod| holder.starts_with(pod.as_str())),
            "one of the chart's pods {first:?} leads through the chart's Lease: {holder}"
        );

        // Upgrade as README's step 3 does (the tag named again, since
        // --reuse-values keeps the one set at install), with a value the
        // operator obeys. The pods roll one at a time (helm waits for the
        // new ones to be Ready); once the old ones are gone, the operator
        // that leads runs the new arguments and leaves the unlabelled
        // target alone.
        let out = helm(&[
            "upgrade",
            RELEASE,
            chart,
            "--namespace",
            &home.name,
            "--reuse-values",
            "--set",
            "image.tag=0.2.0",
            "--set",
            "requireTargetLabel=true",
            "--wait",
            "--timeout",
            "2m",
        ]);
        assert!(out.contains("STATUS: deployed"), "{out}");
        assert_eq!(
            installed_image(&deployments).await,
            "registry.example/openmed-op:0.2.0"
        );
        let args = installed_args(&deployments).await;
        assert_eq!(
            args.last().map(String::as_str),
            Some("--require-target-label")
        );
        let second = operator_pods(&pods, "0.2.0").await;
        assert!(
            second.iter().all(|pod| !first.contains(pod)),
            "every pod replaced: {first:?} then {second:?}"
        );
        let v3 = env.version("v3");
        env.set_spec("svc", json!({"version": v3})).await;
        env.wait_status("svc", "TargetNotOptedIn", |s| {
            s.conditions.iter().any(|c| c.reason == "TargetNotOptedIn")
        })
        .await;
        assert_eq!(env.status("svc").await.active_version, Some(v2.clone()));
        env.opt_in("svc").await;
        env.wait_ready("svc", &v3).await;
        let holder = lease_holder(&leases).await;
        assert!(
            second.iter().any(|pod| holder.starts_with(pod.as_str())),
            "a pod of the upgrade {second:?} leads: {holder}"
        );

        // Uninstall: every object of the release goes, the operator's
        // access with them; the CRD and the resources stay (Helm never
        // deletes what crds/ installed), and the target keeps serving:
        // the operator's pods stopping restarts no model pod.
        let serving = |pods: Vec<Pod>| {
            pods.into_iter()
                .filter_map(|p| p.metadata.uid)
                .collect::<std::collections::BTreeSet<_>>()
        };
        let model_pods: Api<Pod> = Api::namespaced(client.clone(), &env.ns.name);
        let before = serving(model_pods.list(&Default::default()).await.unwrap().items);
        let generation = env.deployment("svc").await["metadata"]["generation"].clone();
        helm(&["uninstall", RELEASE, "--namespace", &home.name, "--wait"]);
        wait_for("the operator's pods to be gone", ROLLOUT, || async {
            release_pods(&pods).await.is_empty().then_some(())
        })
        .await;
        for pod in first.iter().chain(&second) {
            let log = last_log(&home.name, pod);
            assert!(
                log.contains("\"stopped\""),
                "operator pod {pod} stopped cleanly; its log ends:\n{}",
                tail(&log, 15)
            );
        }
        assert_eq!(
            env.deployment("svc").await["metadata"]["generation"],
            generation,
            "the uninstall wrote nothing to the target"
        );
        assert_eq!(
            serving(model_pods.list(&Default::default()).await.unwrap().items),
            before,
            "no model pod restarted"
        );
        assert!(deployments.get_opt(FULLNAME).await.unwrap().is_none());
        assert!(!can_i(
            &identity,
            &["patch", "deployments.apps", "-n", &env.ns.name]
        ));
        assert!(env.models().get_opt("svc").await.unwrap().is_some());
        let (ok, _, err) = kubectl(&["get", "crd", "openmedmodels.openmed.ai"]);
        assert!(ok, "the CRD stays: {err}");
        env.finish().await;
        home.delete().await;
    });
}
