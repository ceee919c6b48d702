//! The install users run, proven on the real API server: `deploy/operator`
//! applies, its service account can do exactly what the operator needs (the
//! whole operator suite runs as it), the namespaced overlay confines it, and
//! `--require-target-label` keeps it off unlabelled Deployments.

use libtest_mimic::Trial;
use serde_json::{Value, json};

use crate::operator::{Env, deployment_yaml, model_yaml};
use crate::support::*;
use crate::trial;

pub fn trials() -> Vec<Trial> {
    vec![
        trial(
            "deploy::the_install_grants_exactly_what_the_operator_uses",
            the_install_grants_exactly_what_the_operator_uses,
        ),
        trial(
            "deploy::the_operator_deployment_is_locked_down",
            the_operator_deployment_is_locked_down,
        ),
        trial(
            "deploy::the_namespaced_overlay_confines_the_operator",
            the_namespaced_overlay_confines_the_operator,
        ),
        trial(
            "deploy::require_target_label_keeps_the_operator_off_unlabelled_deployments",
            require_target_label_keeps_the_operator_off_unlabelled_deployments,
        ),
    ]
}

const DENIED: &[&[&str]] = &[
    &["get", "secrets", "-A"],
    &["list", "secrets", "-A"],
    &["get", "secrets", "-n", "default"],
    &["create", "deployments", "-n", "default"],
    &["delete", "deployments", "-n", "default"],
    &["patch", "services", "-n", "default"],
    &["create", "pods", "-n", "default"],
    &["get", "nodes"],
    &["update", "deployments", "-n", "default"],
    &[
        "update",
        "horizontalpodautoscalers.autoscaling",
        "-n",
        "default",
    ],
    &["delete", "openmedmodels.openmed.ai", "-n", "default"],
    &["patch", "replicasets.apps", "-n", "default"],
    &["get", "pods", "-n", "default"],
    &["delete", "pods", "-n", "default"],
    &["get", "pods", "--subresource=log", "-n", "default"],
    &["patch", "pods", "-n", "default"],
    &["update", "pods", "--subresource=status", "-n", "default"],
];

const GRANTED: &[&[&str]] = &[
    &["list", "openmedmodels.openmed.ai", "-A"],
    &["watch", "openmedmodels.openmed.ai", "-A"],
    &["patch", "openmedmodels.openmed.ai", "-n", "default"],
    &[
        "update",
        "openmedmodels.openmed.ai",
        "--subresource=status",
        "-n",
        "default",
    ],
    &[
        "update",
        "openmedmodels.openmed.ai",
        "--subresource=finalizers",
        "-n",
        "default",
    ],
    &["patch", "deployments.apps", "-n", "default"],
    &["watch", "deployments.apps", "-A"],
    &["watch", "replicasets.apps", "-A"],
    &["list", "pods", "-A"],
    &["watch", "pods", "-A"],
    &["patch", "pods", "--subresource=status", "-n", "default"],
    &["create", "configmaps", "-n", "default"],
    &["delete", "configmaps", "-n", "default"],
    &["list", "horizontalpodautoscalers.autoscaling", "-A"],
    &[
        "patch",
        "horizontalpodautoscalers.autoscaling",
        "-n",
        "default",
    ],
    &[
        "delete",
        "horizontalpodautoscalers.autoscaling",
        "-n",
        "default",
    ],
    &["create", "events.events.k8s.io", "-n", "default"],
];

/// Leader election: the one Lease in the operator's namespace.
const LEASE_GRANTED: &[&[&str]] = &[
    &[
        "create",
        "leases.coordination.k8s.io",
        "-n",
        "openmed-system",
    ],
    &[
        "get",
        "leases.coordination.k8s.io/openmed-operator",
        "-n",
        "openmed-system",
    ],
    &[
        "update",
        "leases.coordination.k8s.io/openmed-operator",
        "-n",
        "openmed-system",
    ],
];

const LEASE_DENIED: &[&[&str]] = &[
    &["create", "leases.coordination.k8s.io", "-n", "default"],
    &[
        "get",
        "leases.coordination.k8s.io/openmed-operator",
        "-n",
        "default",
    ],
    &[
        "update",
        "leases.coordination.k8s.io/kube-controller-manager",
        "-n",
        "openmed-system",
    ],
    &["list", "leases.coordination.k8s.io", "-n", "openmed-system"],
    &[
        "delete",
        "leases.coordination.k8s.io/openmed-operator",
        "-n",
        "openmed-system",
    ],
];

fn the_install_grants_exactly_what_the_operator_uses() {
    operator_kubeconfig(); // applies deploy/operator --server-side
    for args in LEASE_GRANTED {
        assert!(can_i(OPERATOR_IDENTITY, args), "lease denied: {args:?}");
    }
    for args in LEASE_DENIED {
        assert!(!can_i(OPERATOR_IDENTITY, args), "lease granted: {args:?}");
    }
    let wrongly_granted: Vec<String> = DENIED
        .iter()
        .filter(|args| can_i(OPERATOR_IDENTITY, args))
        .map(|args| args.join(" "))
        .collect();
    assert!(
        wrongly_granted.is_empty(),
        "the operator may: {wrongly_granted:?}"
    );
    let missing: Vec<String> = GRANTED
        .iter()
        .filter(|args| !can_i(OPERATOR_IDENTITY, args))
        .map(|args| args.join(" "))
        .collect();
    assert!(missing.is_empty(), "the operator may not: {missing:?}");
}

fn the_operator_deployment_is_locked_down() {
    operator_kubeconfig();
    let (ok, out, err) = kubectl(&[
        "get",
        "deployment",
        "openmed-operator",
        "-n",
        "openmed-system",
        "-o",
        "json",
    ]);
    assert!(ok, "{err}");
    let d: Value = serde_json::from_str(&out).unwrap();
    let pod = &d["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    // Two leader-elected replicas, replaced one at a time, spread apart,
    // and at most one taken by a disruption.
    assert_eq!(d["spec"]["replicas"], 2);
    assert_eq!(d["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"], 0);
    assert!(
        c["args"]
            .as_array()
            .unwrap()
            .contains(&json!("--leader-elect"))
    );
    let env_names: Vec<&str> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert!(env_names.contains(&"POD_NAME") && env_names.contains(&"POD_NAMESPACE"));
    let spread: Vec<&str> = pod["topologySpreadConstraints"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["topologyKey"].as_str())
        .collect();
    assert!(spread.contains(&"kubernetes.io/hostname"), "{spread:?}");
    let (ok, out, err) = kubectl(&[
        "get",
        "poddisruptionbudget",
        "openmed-operator",
        "-n",
        "openmed-system",
        "-o",
        "json",
    ]);
    assert!(ok, "{err}");
    let pdb: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        d["spec"]["selector"]["matchLabels"]
    );
    assert_eq!(pod["serviceAccountName"], "openmed-operator");
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(c["securityContext"]["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["ports"][0]["name"], "metrics");
    assert!(
        c["resources"]["requests"]["memory"].is_string()
            && c["resources"]["limits"]["memory"].is_string()
    );
}

fn the_namespaced_overlay_confines_the_operator() {
    block_on(async {
        let client = admin().await;
        let watched = TestNamespace::create(&client, "nswatched").await;
        let elsewhere = TestNamespace::create(&client, "nselsewhere").await;
        let home = TestNamespace::create(&client, "nshome").await;
        // The overlay as users apply it.
        let (_, out, err) = kubectl(&["create", "namespace", "openmed"]);
        assert!(
            out.contains("created") || err.contains("AlreadyExists"),
            "{err}"
        );
        let (ok, _, err) = kubectl(&[
            "apply",
            "-k",
            root().join("deploy/operator/namespaced").to_str().unwrap(),
            "--server-side",
            "--force-conflicts",
        ]);
        assert!(
            ok,
            "kubectl apply -k deploy/operator/namespaced --server-side: {err}"
        );
        // The same overlay for a service account of its own, so the
        // cluster-wide install does not lend it permissions.
        let (ok, rendered, err) = kubectl(&[
            "kustomize",
            root().join("deploy/operator/namespaced").to_str().unwrap(),
        ]);
        assert!(ok, "{err}");
        let isolated: String = rendered
            .split("\n---\n")
            .filter(|d| {
                d.contains("kind: Role\n")
                    || d.contains("kind: RoleBinding\n")
                    || d.contains("kind: ServiceAccount\n")
            })
            .map(|d| {
                d.replace(
                    "namespace: openmed-system",
                    &format!("namespace: {}", home.name),
                )
                .replace(
                    "namespace: openmed\n",
                    &format!("namespace: {}\n", watched.name),
                )
            })
            .collect::<Vec<_>>()
            .join("\n---\n");
        apply_yaml(&client, None, &isolated, "e2e").await;
        let identity = format!("system:serviceaccount:{}:openmed-operator", home.name);
        for args in GRANTED {
            let mut scoped: Vec<&str> = args.iter().copied().filter(|a| *a != "-A").collect();
            if let Some(i) = scoped.iter().position(|a| *a == "-n") {
                scoped.truncate(i);
            }
            scoped.extend(["-n", &watched.name]);
            assert!(
                can_i(&identity, &scoped),
                "denied in its namespace: {scoped:?}"
            );
            let mut outside: Vec<&str> = scoped[..scoped.len() - 1].to_vec();
            outside.push(&elsewhere.name);
            assert!(
                !can_i(&identity, &outside),
                "granted outside its namespace: {outside:?}"
            );
        }
        assert!(
            !can_i(&identity, &["list", "openmedmodels.openmed.ai", "-A"]),
            "no cluster-wide list"
        );
        for args in DENIED {
            let scoped: Vec<&str> = args
                .iter()
                .map(|a| {
                    if *a == "default" {
                        watched.name.as_str()
                    } else {
                        a
                    }
                })
                .collect();
            assert!(!can_i(&identity, &scoped), "granted: {scoped:?}");
        }
        for ns in [watched, elsewhere, home] {
            ns.delete().await;
        }
    });
}

fn require_target_label_keeps_the_operator_off_unlabelled_deployments() {
    block_on(async {
        let env = Env::with_operator_args("optin", &["--require-target-label"]).await;
        let v1 = env.version("v1");
        env.apply(&deployment_yaml("svc", "openmed-service", "boot"))
            .await;
        env.apply(&model_yaml("svc", &v1, "")).await;
        env.wait_status("svc", "TargetNotOptedIn", |s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.reason == "TargetNotOptedIn")
        })
        .await;
        env.wait_event("svc", "TargetNotOptedIn").await;
        let untouched = env.deployments().get("svc").await.unwrap();
        assert!(
            untouched
                .metadata
                .annotations
                .is_none_or(|a| !a.contains_key("openmed.ai/model-resource"))
        );
        env.opt_in("svc").await;
        env.wait_ready("svc", &v1).await;
        env.finish().await;
    });
}
