//! The Helm chart of `deploy/helm/openmed-operator`, with the real `helm`
//! (built from its pinned Go module by `tests/helm/build`): it lints, its
//! values schema refuses what would break an install, and it renders the
//! objects of the kustomize install (`deploy/operator`, its namespaced
//! overlay, `deploy/monitoring`) object by object. Installing, upgrading and
//! uninstalling it on the test control plane is `cargo test --test e2e --
//! helm::`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn chart() -> PathBuf {
    root().join("deploy/helm/openmed-operator")
}

/// `bin/helm`, built once per helm version and cached.
fn helm_binary() -> PathBuf {
    let out = Command::new(root().join("tests/helm/build"))
        .stderr(Stdio::inherit())
        .output()
        .expect("tests/helm/build runs");
    assert!(out.status.success(), "tests/helm/build failed");
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim()).join("bin/helm")
}

/// The test control plane's kubectl when it is built, else the one on PATH.
fn kubectl_binary() -> PathBuf {
    let out = Command::new(root().join("tests/cluster/build"))
        .arg("--print")
        .output()
        .expect("tests/cluster/build runs");
    let built = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("kubectl");
    if out.status.success() && built.exists() {
        built
    } else {
        PathBuf::from("kubectl")
    }
}

/// Runs a program; (success, stdout, stderr).
fn run(program: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{} runs: {e}", program.display()));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn helm(args: &[&str]) -> String {
    let (ok, out, err) = run(&helm_binary(), args);
    assert!(ok, "helm {args:?}:\n{err}");
    out
}

/// `helm template` of the chart as release `openmed-operator` in
/// `openmed-system`, the names deploy/operator uses.
fn template(values: &[&str]) -> String {
    let chart = chart();
    let mut args = vec![
        "template",
        "openmed-operator",
        chart.to_str().unwrap(),
        "--namespace",
        "openmed-system",
        "--include-crds",
    ];
    for value in values {
        args.extend(["--set", value]);
    }
    helm(&args)
}

fn kustomize(dir: &str) -> String {
    let (ok, out, err) = run(
        &kubectl_binary(),
        &["kustomize", root().join(dir).to_str().unwrap()],
    );
    assert!(ok, "kubectl kustomize {dir}:\n{err}");
    out
}

/// Labels Helm adds to say which release and chart made an object; the
/// kustomize install has only `app.kubernetes.io/name`.
const RELEASE_LABELS: &[&str] = &[
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/version",
    "helm.sh/chart",
];

/// Drops the release labels wherever labels are (metadata, selectors, pod
/// templates, spread constraints): they are the only intended difference
/// inside objects. Writes whole numbers one way (the CRD's `maximum: 100.0`
/// is kustomize's `100`, and the API server's).
fn normalized(value: &mut Value) {
    match value {
        Value::Number(n)
            if n.as_f64()
                .is_some_and(|f| f.fract() == 0.0 && f.abs() < 1e15) =>
        {
            *value = Value::from(n.as_f64().unwrap() as i64);
        }
        Value::Object(map) => {
            for label in RELEASE_LABELS {
                if map.get(*label).is_some_and(Value::is_string) {
                    map.remove(*label);
                }
            }
            map.values_mut().for_each(normalized);
        }
        Value::Array(items) => items.iter_mut().for_each(normalized),
        _ => {}
    }
}

/// A stream's objects by `Kind namespace/name`.
fn objects(stream: &str) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for document in serde_yaml::Deserializer::from_str(stream) {
        let mut object: Value = serde::Deserialize::deserialize(document).unwrap();
        if object.is_null() {
            continue;
        }
        normalized(&mut object);
        let key = format!(
            "{} {}/{}",
            object["kind"].as_str().unwrap(),
            object["metadata"]["namespace"].as_str().unwrap_or(""),
            object["metadata"]["name"].as_str().unwrap()
        );
        assert!(out.insert(key.clone(), object).is_none(), "{key} twice");
    }
    out
}

/// Compares the chart's objects to kustomize's, one by one, naming the first
/// difference.
fn assert_same_objects(helm: BTreeMap<String, Value>, kustomize: BTreeMap<String, Value>) {
    let helm_keys: Vec<&String> = helm.keys().collect();
    let kustomize_keys: Vec<&String> = kustomize.keys().collect();
    assert_eq!(helm_keys, kustomize_keys, "the same objects");
    for (key, object) in &helm {
        let theirs = &kustomize[key];
        if object != theirs {
            let ours = serde_yaml::to_string(object).unwrap();
            let theirs = serde_yaml::to_string(theirs).unwrap();
            let diff = similar::TextDiff::from_lines(&theirs, &ours);
            panic!(
                "{key} differs:\n{}",
                diff.unified_diff()
                    .header("kubectl kustomize", "helm template")
            );
        }
    }
}

/// kustomize's objects without the Namespace: Helm installs into a
/// namespace that exists or that `--create-namespace` makes, and a chart
/// cannot own its own release namespace (docs/operations.md says how to
/// label it for Pod Security).
fn kustomize_objects(dir: &str) -> BTreeMap<String, Value> {
    let mut objects = objects(&kustomize(dir));
    objects.retain(|key, _| !key.starts_with("Namespace "));
    objects
}

/// What the kustomize install applies: the CRD (`crds/`, applied on its
/// own so that `kubectl delete -k` leaves it), then the overlay `dir`.
/// The chart holds the same CRD in its `crds/`.
fn install_objects(dir: &str) -> BTreeMap<String, Value> {
    let mut objects = objects(&kustomize("crds"));
    objects.extend(kustomize_objects(dir));
    objects
}

#[test]
fn the_chart_lints_clean_for_each_mode() {
    let chart = chart();
    let chart = chart.to_str().unwrap();
    for values in [
        "",
        "watchNamespaces={team-a,team-b}",
        "metrics.serviceMonitor.enabled=true,metrics.prometheusRule.enabled=true,metrics.dashboard.enabled=true",
        "replicaCount=1,leaderElection=false,admissionPolicies.enabled=false",
    ] {
        let mut args = vec!["lint", chart, "--strict"];
        if !values.is_empty() {
            args.extend(["--set", values]);
        }
        let out = helm(&args);
        assert!(out.contains("0 chart(s) failed"), "{values}: {out}");
    }
}

#[test]
fn the_chart_renders_the_objects_of_deploy_operator() {
    assert_same_objects(objects(&template(&[])), install_objects("deploy/operator"));
}

#[test]
fn watch_namespaces_renders_the_namespaced_overlay() {
    assert_same_objects(
        objects(&template(&["watchNamespaces={openmed}"])),
        install_objects("deploy/operator/namespaced"),
    );
}

/// The commented `--analysis-allow` patch of `deploy/operator`, as an
/// overlay of it, in a temporary folder.
fn analysis_allow_overlay() -> tempfile::TempDir {
    let text = std::fs::read_to_string(root().join("deploy/operator/kustomization.yaml")).unwrap();
    let patch: Vec<&str> = text
        .lines()
        .skip_while(|l| *l != "# patches:")
        .map_while(|l| l.strip_prefix("# "))
        .collect();
    assert!(
        patch.len() > 1,
        "deploy/operator/kustomization.yaml shows the --analysis-allow patch"
    );
    let dir = tempfile::tempdir().unwrap();
    // kustomize takes no absolute path to a base: climb from the overlay.
    let here = std::fs::canonicalize(dir.path()).unwrap();
    let base = std::fs::canonicalize(root().join("deploy/operator")).unwrap();
    let up = "../".repeat(here.components().count() - 1);
    let base = format!("{up}{}", base.strip_prefix("/").unwrap().display());
    let overlay = format!("resources:\n  - {base}\n{}\n", patch.join("\n"));
    std::fs::write(dir.path().join("kustomization.yaml"), overlay).unwrap();
    dir
}

#[test]
fn analysis_allow_renders_the_documented_kustomize_patch() {
    let overlay = analysis_allow_overlay();
    assert_same_objects(
        objects(&template(&[
            "analysisAllow={http://prometheus.monitoring:9090}",
        ])),
        install_objects(overlay.path().to_str().unwrap()),
    );
}

#[test]
fn the_monitoring_values_render_the_objects_of_deploy_monitoring() {
    let install = objects(&template(&[]));
    let mut with_monitoring = objects(&template(&[
        "metrics.serviceMonitor.enabled=true",
        "metrics.prometheusRule.enabled=true",
        "metrics.dashboard.enabled=true",
    ]));
    with_monitoring.retain(|key, _| !install.contains_key(key));
    assert_same_objects(with_monitoring, kustomize_objects("deploy/monitoring"));
}

#[test]
fn another_release_name_names_its_lease_service_account_and_metrics_job() {
    let chart = chart();
    let rendered = objects(&helm(&[
        "template",
        "team-a",
        chart.to_str().unwrap(),
        "--namespace",
        "ops",
        "--set",
        "metrics.serviceMonitor.enabled=true,metrics.prometheusRule.enabled=true,requireTargetLabel=true",
    ]));
    let deployment = &rendered["Deployment ops/team-a-openmed-operator"];
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(
        args,
        [
            "run",
            "--log-format=json",
            "--leader-elect",
            "--leader-elect-resource-name=team-a-openmed-operator",
            "--require-target-label",
        ]
    );
    let lease = &rendered["Role ops/team-a-openmed-operator-leader-election"];
    assert_eq!(
        lease["rules"][1]["resourceNames"][0],
        "team-a-openmed-operator"
    );
    let binding = &rendered["ClusterRoleBinding /team-a-openmed-operator"];
    assert_eq!(binding["subjects"][0]["name"], "team-a-openmed-operator");
    assert_eq!(binding["subjects"][0]["namespace"], "ops");
    let policy =
        serde_json::to_string(&rendered["ValidatingAdmissionPolicy /openmed-target-permission"])
            .unwrap();
    assert!(
        policy.contains("system:serviceaccount:ops:team-a-openmed-operator"),
        "the policy exempts this release's operator: {policy}"
    );
    assert!(!policy.contains("openmed-system"), "{policy}");
    let rules =
        serde_json::to_string(&rendered["PrometheusRule ops/team-a-openmed-operator"]).unwrap();
    assert!(
        rules.contains(r#"job=\"team-a-openmed-operator-metrics\""#),
        "{rules}"
    );
    assert!(
        !rules.contains(r#"job=\"openmed-operator-metrics\""#),
        "{rules}"
    );
}

#[test]
fn bad_values_are_refused_before_anything_renders() {
    let chart = chart();
    let chart = chart.to_str().unwrap();
    for (values, expected) in [
        ("replicaCount=-1", "/replicaCount"),
        ("watchNamespace=team-a", "'watchNamespace' not allowed"),
        ("watchNamespaces={Team_A}", "/watchNamespaces/0"),
        ("logFormat=xml", "/logFormat"),
        ("image.digest=latest", "/image/digest"),
        (
            "replicaCount=2,leaderElection=false",
            "replicaCount above 1 needs leaderElection",
        ),
        (
            "podLabels.app\\.kubernetes\\.io/name=other",
            "podLabels may not set app.kubernetes.io/name",
        ),
        (
            "extraArgs={--log-format=text}",
            "extraArgs may not set --log-format",
        ),
        (
            "extraArgs={--leader-elect-resource-name=other}",
            "extraArgs may not set --leader-elect-resource-name",
        ),
        (
            "extraArgs={--analysis-allow=http://p:9090}",
            "extraArgs may not set --analysis-allow",
        ),
        ("analysisAllow={prometheus:9090}", "/analysisAllow/0"),
        (
            "analysisAllow={http://user:pass@prometheus:9090}",
            "/analysisAllow/0",
        ),
        (
            "metrics.prometheusRule.enabled=true",
            "metrics.prometheusRule needs metrics.serviceMonitor",
        ),
    ] {
        let (ok, out, err) = run(&helm_binary(), &["template", "x", chart, "--set", values]);
        assert!(!ok, "{values} rendered:\n{out}");
        assert!(err.contains(expected), "{values}: {err}");
    }
    let (ok, _, err) = run(
        &helm_binary(),
        &["template", "x", chart, "--kube-version", "1.32.0"],
    );
    assert!(!ok && err.contains("need Kubernetes 1.33"), "{err}");
    let (ok, out, err) = run(
        &helm_binary(),
        &[
            "template",
            "x",
            chart,
            "--kube-version",
            "1.32.0",
            "--set",
            "admissionPolicies.enabled=false",
        ],
    );
    assert!(ok, "{err}");
    assert!(!out.contains("ValidatingAdmissionPolicy"), "{out}");
}

#[test]
fn unusual_release_names_and_values_still_render_valid_objects() {
    let chart = chart();
    let chart = chart.to_str().unwrap();
    let monitoring = "metrics.serviceMonitor.enabled=true,metrics.prometheusRule.enabled=true";
    // A long release name: the metrics Service is cut to a DNS-1035 label,
    // and the alerts read that very name.
    let long = "a-release-name-of-fifty-two-characters-for-the-test";
    assert_eq!(long.len(), 51);
    let rendered = objects(&helm(&[
        "template",
        long,
        chart,
        "--namespace",
        "ops",
        "--set",
        monitoring,
    ]));
    let service = rendered
        .keys()
        .find(|k| k.starts_with("Service "))
        .unwrap()
        .rsplit('/')
        .next()
        .unwrap()
        .to_owned();
    assert!(service.len() <= 63, "{service}");
    assert!(service.ends_with("-metrics"), "{service}");
    let rules = serde_json::to_string(
        rendered
            .keys()
            .find(|k| k.starts_with("PrometheusRule "))
            .map(|k| &rendered[k])
            .unwrap(),
    )
    .unwrap();
    assert!(rules.contains(&format!(r#"job=\"{service}\""#)), "{rules}");

    // A release name YAML would read as a number stays a string label.
    let out = helm(&["template", "123", chart, "--namespace", "ops"]);
    let deployment: Value = serde_yaml::Deserializer::from_str(&out)
        .map(|d| <Value as serde::Deserialize>::deserialize(d).unwrap())
        .find(|o| o["kind"] == "Deployment")
        .unwrap();
    assert_eq!(
        deployment["metadata"]["labels"]["app.kubernetes.io/instance"],
        Value::String("123".into())
    );
    // ... but cannot name a Service, which must start with a letter.
    let (ok, _, err) = run(
        &helm_binary(),
        &["template", "123", chart, "--set", monitoring],
    );
    assert!(!ok && err.contains("must start with a letter"), "{err}");
    let rendered = objects(&helm(&[
        "template",
        "123",
        chart,
        "--set",
        monitoring,
        "--set",
        "fullnameOverride=omop",
    ]));
    assert!(rendered.keys().any(|k| k.ends_with("/omop-metrics")));

    // A numeric tag, a zero replica count, a Prometheus duration in days.
    let out = helm(&[
        "template",
        "x",
        chart,
        "--set",
        "image.tag=20240101,replicaCount=0",
        "--set",
        "metrics.serviceMonitor.enabled=true,metrics.serviceMonitor.interval=1d",
    ]);
    assert!(out.contains("image: openmed-op:20240101"), "{out}");
    assert!(out.contains("replicas: 0"), "{out}");
}

/// The chart's copies of the CRD, the admission policies and the monitoring
/// rules and dashboard are byte for byte the repository's (the rendering
/// tests above compare their meaning; this keeps the comments too).
/// `UPDATE_CHART=1 cargo test --test helm` copies them again.
#[test]
fn the_chart_carries_the_repositorys_files() {
    let pairs = [
        ("crds/openmedmodel.yaml", "crds/openmedmodel.yaml"),
        (
            "deploy/admission/target-permission.yaml",
            "files/admission/target-permission.yaml",
        ),
        (
            "deploy/admission/rollback-retained.yaml",
            "files/admission/rollback-retained.yaml",
        ),
        (
            "deploy/admission/failed-version-needs-reason.yaml",
            "files/admission/failed-version-needs-reason.yaml",
        ),
        (
            "deploy/admission/route-weights-only.yaml",
            "files/admission/route-weights-only.yaml",
        ),
        (
            "deploy/admission/served-set-literal.yaml",
            "files/admission/served-set-literal.yaml",
        ),
        (
            "deploy/admission/version-model-id.yaml",
            "files/admission/version-model-id.yaml",
        ),
        (
            "deploy/monitoring/prometheusrule.yaml",
            "files/monitoring/prometheusrule.yaml",
        ),
        (
            "deploy/monitoring/dashboard.json",
            "files/monitoring/dashboard.json",
        ),
    ];
    let update = std::env::var_os("UPDATE_CHART").is_some();
    let mut stale = Vec::new();
    for (source, copy) in pairs {
        let source_text = std::fs::read(root().join(source)).unwrap();
        let copy_path = chart().join(copy);
        if std::fs::read(&copy_path).ok().as_deref() != Some(&source_text[..]) {
            if update {
                std::fs::write(&copy_path, &source_text).unwrap();
            } else {
                stale.push(format!("{source} -> deploy/helm/openmed-operator/{copy}"));
            }
        }
    }
    assert!(
        stale.is_empty(),
        "the chart's copies are stale (UPDATE_CHART=1 cargo test --test helm copies them):\n{}",
        stale.join("\n")
    );
}
