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
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use libtest_mimic::Trial;
use serde_json::json;

use crate::operator::World;
use crate::operator_pods::{OperatorPods, map_operator_image};
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

fn the_chart_installs_upgrades_and_uninstalls_with_the_operator_working() {
    block_on(async {
        let client = admin().await;
        install_crd(&client).await;
        map_operator_image(&client, "e2e-helm").await;
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
        let pods = OperatorPods::new(
            &client,
            &home.name,
            FULLNAME,
            &format!("app.kubernetes.io/instance={RELEASE}"),
        );
        assert_eq!(pods.image().await, "registry.example/openmed-op:0.1.0");

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
        let first = pods.wait_ready("0.1.0", 2).await;
        let env = World::of(client.clone(), watched, pods.log_hint());
        let (_v1, v2) = env.v1_then_v2().await;
        // One of the chart's pods leads through the chart's Lease.
        pods.wait_led_by_one_of(&first).await;

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
        assert_eq!(pods.image().await, "registry.example/openmed-op:0.2.0");
        let args = installed_args(&deployments).await;
        assert_eq!(
            args.last().map(String::as_str),
            Some("--require-target-label")
        );
        let second = pods.wait_ready("0.2.0", 2).await;
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
        pods.wait_led_by_one_of(&second).await;

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
        pods.wait_gone().await;
        pods.assert_stopped_cleanly(&[first, second].concat());
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
