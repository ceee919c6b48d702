//! The example application of `examples/real` in a test's namespace,
//! behind the shared Gateway, and the load the tests send through it.

use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use openmed_load::{Load, Record, Summary};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::env::Env;
use crate::support::*;

pub const V1: &str = "OpenMed/synthetic-pii-v1";
pub const V2: &str = "OpenMed/synthetic-pii-v2";
pub const NAME: &str = "openmed-service";

/// Brings the stack up; whether it was not running before.
pub fn start_stack() -> bool {
    let was_running = cluster_running() && cluster_dir().join("gateway-url").exists();
    eprintln!(
        "stack: {} the real stack (tests/workload/up); a first run builds it",
        if was_running { "checking" } else { "starting" }
    );
    let status = Command::new(root().join("tests/workload/up"))
        .arg(cluster_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .expect("tests/workload/up runs");
    if !status.success() {
        // What it started must not outlive the run: a half-started stack
        // holds its ports, and the next start would fail on them.
        stop_stack();
        panic!(
            "tests/workload/up failed (the stack is stopped again); see {}/logs",
            cluster_dir().display()
        );
    }
    !was_running
}

pub fn stop_stack() {
    let _ = Command::new(root().join("tests/workload/down"))
        .arg(cluster_dir())
        .stdin(Stdio::null())
        .status();
}

pub fn gateway_url() -> String {
    std::fs::read_to_string(cluster_dir().join("gateway-url"))
        .expect("DIR/gateway-url from tests/workload/up")
        .trim()
        .to_owned()
}

/// A loopback port of the stack (`GATEWAY_PORT`, `ENVOY_STATS_PORT`,
/// `PROMETHEUS_PORT`), as `tests/workload/up` chose it.
pub fn workload_port(name: &str) -> String {
    let ports = std::fs::read_to_string(cluster_dir().join("workload-ports"))
        .expect("DIR/workload-ports from tests/workload/up");
    let prefix = format!("{name}=");
    ports
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("{name} in DIR/workload-ports"))
        .to_owned()
}

/// A counter Envoy keeps for the clusters whose names start with
/// `cluster` (a route rule's cluster: `httproute/<namespace>/...`), summed,
/// read from its stats port.
pub async fn envoy_counter(cluster: &str, name: &str) -> f64 {
    let port = workload_port("ENVOY_STATS_PORT");
    let text = reqwest::get(format!("http://127.0.0.1:{port}/stats/prometheus"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let wanted = format!("envoy_cluster_{name}{{envoy_cluster_name=\"{cluster}");
    text.lines()
        .filter(|l| l.starts_with(&wanted))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

pub fn now_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        * 1000.0
}

/// Which image of the service the example's Deployment runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Image {
    /// The stock app: clients name their model. The stock app names no
    /// pod in its answers, so the test's route has Envoy add the address
    /// of the pod that answered as `x-openmed-pod`.
    Stock,
    /// The image recipe of `tests/workload/image`: a request naming no
    /// model gets the preloaded one, and the answer names its pod.
    DefaultModel,
}

/// The example's documents (no Namespace) for one test: its HTTPRoute
/// takes `/<namespace>/` on the shared Gateway and strips that prefix.
pub fn example(ns: &str, image: Image) -> String {
    example_at("examples/real/openmed-service.yaml", ns, image)
}

/// The same, of another example's service file (`path` from the
/// repository's root).
pub fn example_at(path: &str, ns: &str, image: Image) -> String {
    let text = std::fs::read_to_string(root().join(path)).unwrap();
    let mut out = String::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let mut value = Value::deserialize(doc).unwrap();
        if value.is_null() || value["kind"] == "Namespace" {
            continue;
        }
        if value["kind"] == "HTTPRoute" {
            let rule = &mut value["spec"]["rules"][0];
            rule["matches"] = json!([{"path": {"type": "PathPrefix", "value": format!("/{ns}")}}]);
            rule["filters"][0]["urlRewrite"]["path"] =
                json!({"type": "ReplacePrefixMatch", "replacePrefixMatch": "/"});
            if image == Image::Stock {
                // An Envoy format string: the upstream host that answered.
                rule["filters"].as_array_mut().unwrap().push(json!({
                    "type": "ResponseHeaderModifier",
                    "responseHeaderModifier": {"set": [
                        {"name": openmed_load::POD_HEADER, "value": "%UPSTREAM_REMOTE_ADDRESS%"},
                    ]},
                }));
            }
        }
        if value["kind"] == "Deployment" && image == Image::DefaultModel {
            for c in value["spec"]["template"]["spec"]["containers"]
                .as_array_mut()
                .unwrap()
            {
                c["image"] = json!("openmed/openmed-service-default-model:3.1.0");
            }
        }
        out.push_str(&serde_yaml::to_string(&value).unwrap());
        out.push_str("---\n");
    }
    out
}

/// A test's namespace with the example application rolled out at `V1`
/// and served through the Gateway.
pub struct App {
    pub env: Env,
    /// The Gateway URL of this namespace's route.
    pub url: String,
}

/// The example's OpenMedModel, without its namespace (the test's).
pub fn example_model() -> Value {
    example_model_at("examples/real/openmedmodel.yaml")
}

/// The same, of another example's model file.
pub fn example_model_at(path: &str) -> Value {
    let model = std::fs::read_to_string(root().join(path)).unwrap();
    let mut value: Value = serde_yaml::from_str(&model).unwrap();
    value["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("namespace");
    value
}

/// The example's OpenMedModel with `spec.qualityGate` naming the example's
/// probe set (`examples/real/probes.yaml`), and that ConfigMap.
fn gated_model() -> String {
    let mut value = example_model();
    value["spec"]["qualityGate"] =
        json!({"configMapRef": {"name": "pii-probes"}, "minRecall": {"*": 1.0}});
    let probes = std::fs::read_to_string(root().join("examples/real/probes.yaml")).unwrap();
    let mut probes: Value = serde_yaml::from_str(&probes).unwrap();
    probes["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("namespace");
    format!(
        "{}---\n{}",
        serde_yaml::to_string(&probes).unwrap(),
        serde_yaml::to_string(&value).unwrap()
    )
}

impl App {
    pub async fn deploy(prefix: &str) -> App {
        Self::deploy_image(prefix, Image::Stock).await
    }

    pub async fn deploy_image(prefix: &str, image: Image) -> App {
        let env = Env::new(prefix).await;
        let model =
            std::fs::read_to_string(root().join("examples/real/openmedmodel.yaml")).unwrap();
        Self::deploy_in(env, &model, image).await
    }

    /// The example with the quality gate on, its operator on the pod
    /// network (the gate probes pod addresses).
    pub async fn deploy_gated(prefix: &str) -> App {
        let client = admin().await;
        install_crd(&client).await;
        let ns = TestNamespace::create(&client, prefix).await;
        let operator = Operator::start_on_pod_network(&ns.name, &[]);
        let env = Env::of(client, ns, operator);
        Self::deploy_in(env, &gated_model(), Image::Stock).await
    }

    async fn deploy_in(env: Env, model: &str, image: Image) -> App {
        env.apply(&example(&env.ns.name, image)).await;
        env.apply(model).await;
        env.wait_ready(NAME, V1).await;
        let url = routed(&env).await;
        App { env, url }
    }

    /// Real load through the Gateway, each request naming `model` (none:
    /// the default-model image answers with the pod's own), until `stop`
    /// or `max`.
    pub fn load(
        &self,
        model: Option<&str>,
        rps: f64,
        max: Duration,
    ) -> (
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<Vec<Record>>,
    ) {
        let load = Load {
            url: self.url.parse().unwrap(),
            rps,
            duration: max,
            model: model.map(str::to_owned),
            host: None,
            timeout: Duration::from_secs(10),
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            openmed_load::run(&load, async {
                let _ = stopped.await;
            })
            .await
            .expect("the load runs")
        });
        (stop, task)
    }

    pub async fn pods(&self) -> Vec<Pod> {
        let api: Api<Pod> = Api::namespaced(self.env.client.clone(), &self.env.ns.name);
        api.list(&ListParams::default().labels("app.kubernetes.io/name=openmed-service"))
            .await
            .unwrap()
            .items
    }
}

/// How long the real stack is given to turn a template Ready: its pods are
/// OpenMed processes that load a model before `/readyz` passes, several at
/// once on two cores while the other scenarios run beside them.
pub const WARM: Duration = Duration::from_secs(180);

/// The Gateway URL of the namespace's route, once the Gateway routes it
/// to a ready pod.
pub async fn routed(env: &Env) -> String {
    let url = format!("{}/{}", gateway_url(), env.ns.name);
    let ready = format!("{url}/readyz");
    wait_for("the Gateway to route to the service", WARM, || async {
        let ok = reqwest::get(&ready).await.ok()?.status().is_success();
        ok.then_some(())
    })
    .await;
    url
}

/// Waits, up to `deadline`, until the model has rolled back
/// (`RolledBack=True`), and returns its status.
pub async fn rolled_back_within(
    app: &App,
    what: &str,
    deadline: Duration,
) -> openmed_op::api::OpenMedModelStatus {
    wait_until(
        what,
        deadline,
        || async { app.env.status(NAME).await },
        |s| {
            s.phase == Some(openmed_op::api::Phase::RolledBack)
                && s.conditions
                    .iter()
                    .any(|c| c.type_ == "RolledBack" && c.status == "True")
        },
    )
    .await
}

/// When a pod became Ready, in ms since the epoch (its condition's time,
/// whole seconds, so never later than the truth).
pub fn ready_ms(pod: &Pod) -> Option<f64> {
    let conditions = pod.status.as_ref()?.conditions.as_ref()?;
    let ready = conditions
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "True")?;
    Some(ready.last_transition_time.as_ref()?.0.as_millisecond() as f64)
}

/// The records of the requests sent in `[from, to)` (ms since the epoch).
pub fn sent_between(records: &[Record], from: f64, to: f64) -> Vec<Record> {
    records
        .iter()
        .filter(|r| (r.unix_ms as f64) >= from && (r.unix_ms as f64) < to)
        .cloned()
        .collect()
}

/// Every request got a 200.
pub fn assert_all_served(records: &[Record]) {
    let failed: Vec<_> = records.iter().filter(|r| !r.ok()).collect();
    assert!(
        failed.is_empty(),
        "{} of {} requests failed: {:?}",
        failed.len(),
        records.len(),
        &failed[..failed.len().min(5)]
    );
}

/// Every answer came from the model the client named.
pub fn assert_answered_as_named(records: &[Record], model: &str) {
    let other: Vec<_> = records
        .iter()
        .filter(|r| r.ok() && r.model_name.as_deref() != Some(model))
        .collect();
    assert!(
        other.is_empty(),
        "{} answers to clients naming {model} came from another model: {:?}",
        other.len(),
        &other[..other.len().min(5)]
    );
}

/// The served set of the service container of a Deployment (JSON).
pub fn served_set(deployment: &Value) -> String {
    deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["name"] == "OPENMED_SERVICE_SERVED_MODELS")
        .and_then(|e| e["value"].as_str())
        .unwrap_or("(none)")
        .to_owned()
}

/// Prints a phase's figures and returns them as JSON for the results file.
pub fn phase(name: &str, records: &[Record]) -> Value {
    let s = Summary::of(records);
    eprintln!("  {name}: {s}");
    json!({
        "phase": name, "requests": s.requests, "failed": s.failed,
        "p50_ms": (s.p50_ms * 10.0).round() / 10.0, "p99_ms": (s.p99_ms * 10.0).round() / 10.0,
        "models": s.models.iter().map(|(m, n)| json!({"model": m, "answers": n})).collect::<Vec<_>>(),
    })
}

/// The figures of the requests sent before `from`, in `[from, to)` and
/// from `to` on, under the three names given: printed, and returned for
/// the results file.
pub fn phases_around(records: &[Record], names: [&str; 3], from: f64, to: f64) -> Vec<Value> {
    let bounds = [(0.0, from), (from, to), (to, f64::INFINITY)];
    names
        .iter()
        .zip(bounds)
        .map(|(name, (start, end))| phase(name, &sent_between(records, start, end)))
        .collect()
}

/// Appends a result line to $STACK_RESULTS when set (the committed
/// results under benches/results come from there).
pub fn record_result(value: Value) {
    if let Ok(path) = std::env::var("STACK_RESULTS") {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        writeln!(file, "{value}").unwrap();
    }
}

/// The pods' Prometheus of the stack, as pods (and KEDA) reach it.
pub fn pods_prometheus() -> String {
    std::fs::read_to_string(cluster_dir().join("pods-prometheus-url"))
        .expect("DIR/pods-prometheus-url from tests/workload/up")
        .trim()
        .to_owned()
}

/// `deploy/operator` with its `components/keda`, as a user who enables
/// KEDA's way installs it: the operator's identity may then read and
/// write ScaledObjects. Once per run, after the plain install.
pub fn install_operator_with_keda() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        operator_kubeconfig();
        // A kustomization beside the cluster's files, naming the two by
        // relative paths (kustomize refuses absolute ones).
        let dir = cluster_dir().join("operator-with-keda");
        std::fs::create_dir_all(&dir).unwrap();
        let up = "../".repeat(dir.strip_prefix(root()).unwrap().components().count());
        std::fs::write(
            dir.join("kustomization.yaml"),
            format!(
                "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
                 resources: [{up}deploy/operator]\ncomponents: [{up}deploy/operator/components/keda]\n"
            ),
        )
        .unwrap();
        let (ok, _, err) = kubectl(&[
            "apply",
            "-k",
            dir.to_str().unwrap(),
            "--server-side",
            "--force-conflicts",
        ]);
        assert!(ok, "kubectl apply -k with components/keda failed: {err}");
    });
}
