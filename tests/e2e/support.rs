//! Test support for the end-to-end suite: the real control plane from
//! `tests/cluster`, a namespace per test, the operator as a real process,
//! and waits with a deadline that explain what they were waiting for.

use std::fmt::Debug;
use std::future::Future;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::GroupVersionKind;
use kube::discovery::{ApiCapabilities, ApiResource, Scope};
use kube::{Client, Config, Discovery};
use serde_json::Value;

/// Whether the command line selects the trial `name` (so the harness
/// starts the control plane only when a selected trial needs it).
pub fn selected(args: &libtest_mimic::Arguments, name: &str) -> bool {
    match &args.filter {
        Some(filter) if args.exact => name == filter,
        Some(filter) => name.contains(filter.as_str()),
        None => true,
    }
}

/// The repository root.
pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

static CLUSTER_DIR: OnceLock<PathBuf> = OnceLock::new();

/// Points the suite at another cluster folder (the real stack's, made by
/// `tests/workload/up`); before the first use of [`cluster_dir`].
#[allow(dead_code)] // the real-stack suite
pub fn use_cluster_dir(dir: PathBuf) {
    let _ = CLUSTER_DIR.set(dir);
}

/// Where `tests/cluster/up` keeps the cluster the suite uses.
pub fn cluster_dir() -> PathBuf {
    CLUSTER_DIR
        .get()
        .cloned()
        .unwrap_or_else(|| root().join("target/cluster"))
}

/// The admin kubeconfig of the test cluster.
pub fn kubeconfig() -> PathBuf {
    cluster_dir().join("kubeconfig")
}

/// The `openmed-op` binary under test.
pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_openmed-op")
}

/// Writes `owner`'s entries into the test kubelet's image map (a key of
/// its own, under its own field manager, so the entries of others stay):
/// a pod whose images are all in the map runs them as processes
/// (tests/cluster/README.md, "Process pods").
pub async fn set_image_map(client: &Client, owner: &str, images: &Value) {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-system");
    let patch = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "fake-kubelet-images", "namespace": "kube-system"},
        "data": {format!("{owner}.yaml"): serde_yaml::to_string(images).unwrap()},
    });
    api.patch(
        "fake-kubelet-images",
        &PatchParams::apply(owner).force(),
        &Patch::Apply(&patch),
    )
    .await
    .expect("the image map");
}

/// `openmed-op ARGS` with `input` on stdin: its whole output.
pub fn run_with_input(args: &[&str], input: &str) -> std::process::Output {
    use std::io::Write;
    let mut child = Command::new(binary())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// Starts the control plane (building it on first use) unless it already
/// runs; returns true when this call started it, so the caller stops it.
pub fn start_cluster() -> bool {
    if cluster_running() {
        eprintln!(
            "e2e: reusing the running control plane in {}",
            cluster_dir().display()
        );
        return false;
    }
    eprintln!("e2e: starting the control plane (tests/cluster/up); the first run builds it");
    let status = Command::new(root().join("tests/cluster/up"))
        .arg(cluster_dir())
        .stdin(Stdio::null())
        .status()
        .expect("tests/cluster/up runs");
    assert!(
        status.success(),
        "tests/cluster/up failed; see {}/logs",
        cluster_dir().display()
    );
    true
}

/// Whether the control plane in [`cluster_dir`] runs and is healthy.
pub fn cluster_running() -> bool {
    Command::new(root().join("tests/cluster/up"))
        .arg("--check")
        .arg(cluster_dir())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Stops the control plane started by [`start_cluster`].
pub fn stop_cluster() {
    let _ = Command::new(root().join("tests/cluster/down"))
        .arg(cluster_dir())
        .stdin(Stdio::null())
        .status();
}

/// A runtime per test: each test is independent and may run in parallel.
pub fn block_on<F: Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(future)
}

/// An admin client of the test cluster.
pub async fn admin() -> Client {
    client_for(&kubeconfig(), None).await
}

/// A client that acts as `user` (impersonation by the admin).
pub async fn client_for(path: &Path, impersonate: Option<&str>) -> Client {
    let kubeconfig = Kubeconfig::read_from(path).expect("the test kubeconfig");
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("a client config");
    if let Some(user) = impersonate {
        config.auth_info.impersonate = Some(user.to_owned());
    }
    Client::try_from(config).expect("a client")
}

/// Installs the committed CRD and waits until it is Established.
pub async fn install_crd(client: &Client) {
    static DONE: OnceLock<()> = OnceLock::new();
    if DONE.get().is_some() {
        return;
    }
    let text = std::fs::read_to_string(root().join("crds/openmedmodel.yaml")).unwrap();
    let crd: CustomResourceDefinition = serde_yaml::from_str(&text).unwrap();
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    api.patch(
        "openmedmodels.openmed.ai",
        &PatchParams::apply("openmed-op-tests").force(),
        &Patch::Apply(&crd),
    )
    .await
    .expect("the API server accepts the CRD");
    wait_for(
        "the CRD to be Established",
        Duration::from_secs(60),
        || async {
            let crd = api.get("openmedmodels.openmed.ai").await.ok()?;
            let established = crd
                .status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            established.then_some(())
        },
    )
    .await;
    let _ = DONE.set(());
}

/// A namespace of its own for one test; deleted when the test passes.
pub struct TestNamespace {
    /// Its name.
    pub name: String,
    client: Client,
}

impl TestNamespace {
    /// Creates `e2e-<prefix>-<random>`.
    pub async fn create(client: &Client, prefix: &str) -> Self {
        let suffix: u32 = rand_suffix();
        let name = format!("e2e-{prefix}-{suffix:06x}");
        TEST_NAMESPACE.with(|ns| *ns.borrow_mut() = Some(name.clone()));
        let api: Api<Namespace> = Api::all(client.clone());
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}
        }))
        .unwrap();
        api.create(&PostParams::default(), &ns)
            .await
            .expect("a namespace");
        // kube-controller-manager creates it; right after the chaos suite
        // restarts kube-apiserver, its informers may take a while to come
        // back (their watch backoff), so the bound is generous.
        wait_for(
            "the default ServiceAccount of the namespace",
            Duration::from_secs(120),
            || async {
                let sa: Api<k8s_openapi::api::core::v1::ServiceAccount> =
                    Api::namespaced(client.clone(), &name);
                sa.get_opt("default").await.ok().flatten().map(|_| ())
            },
        )
        .await;
        TestNamespace {
            name,
            client: client.clone(),
        }
    }

    /// Deletes the namespace (after a passing test). Its operator has
    /// stopped by then, so nothing would run the finalizers it left on the
    /// OpenMedModels: they are dropped here, or the namespace would stay
    /// Terminating for good, and a stack kept for run after run would
    /// gather them.
    pub async fn delete(self) {
        let api: Api<Namespace> = Api::all(self.client.clone());
        let _ = api.delete(&self.name, &DeleteParams::background()).await;
        let models: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &self.name,
            &ApiResource::from_gvk(&GroupVersionKind::gvk(
                "openmed.ai",
                "v1alpha1",
                "OpenMedModel",
            )),
        );
        let Ok(list) = models.list(&Default::default()).await else {
            return;
        };
        let unfinalized = Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}}));
        for name in list.items.into_iter().filter_map(|m| m.metadata.name) {
            let _ = models
                .patch(&name, &PatchParams::default(), &unfinalized)
                .await;
        }
    }
}

fn rand_suffix() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos());
    (h.finish() & 0xff_ffff) as u32
}

/// Server-side applies every document of a YAML stream, in `namespace`
/// (overriding theirs) when given; returns the objects as stored.
pub async fn apply_yaml(
    client: &Client,
    namespace: Option<&str>,
    yaml: &str,
    manager: &str,
) -> Vec<DynamicObject> {
    try_apply_yaml(client, namespace, yaml, manager, false)
        .await
        .unwrap_or_else(|e| panic!("apply failed: {e}\n{yaml}"))
}

/// Like [`apply_yaml`], returning the API server's error; `strict` asks for
/// strict field validation (unknown fields are errors).
pub async fn try_apply_yaml(
    client: &Client,
    namespace: Option<&str>,
    yaml: &str,
    manager: &str,
    strict: bool,
) -> Result<Vec<DynamicObject>, kube::Error> {
    use serde::Deserialize;
    let discovery = Discovery::new(client.clone()).run().await?;
    let mut out = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let mut value = Value::deserialize(doc).unwrap();
        if value.is_null() {
            continue;
        }
        let gvk = GroupVersionKind::try_from(&kube::api::TypeMeta {
            api_version: value["apiVersion"].as_str().unwrap().to_owned(),
            kind: value["kind"].as_str().unwrap().to_owned(),
        })
        .unwrap();
        let (resource, caps): (ApiResource, ApiCapabilities) = discovery
            .resolve_gvk(&gvk)
            .unwrap_or_else(|| panic!("the server knows {gvk:?}"));
        let name = value["metadata"]["name"].as_str().unwrap().to_owned();
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Cluster => Api::all_with(client.clone(), &resource),
            Scope::Namespaced => {
                if let Some(ns) = namespace {
                    value["metadata"]["namespace"] = Value::String(ns.to_owned());
                }
                let ns = value["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or("default")
                    .to_owned();
                Api::namespaced_with(client.clone(), &ns, &resource)
            }
        };
        let mut params = PatchParams::apply(manager).force();
        if strict {
            params = params.validation_strict();
        }
        out.push(api.patch(&name, &params, &Patch::Apply(&value)).await?);
    }
    Ok(out)
}

/// Polls `check` every 200 ms until it returns `Some`, or panics after
/// `deadline` naming what it waited for (with the operator and control
/// plane logs attached by the caller's context).
pub async fn wait_for<T, F, Fut>(what: &str, deadline: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        if start.elapsed() > deadline {
            panic!(
                "timed out after {deadline:?} waiting for {what}\n{}",
                log_tails()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Like [`wait_for`], with the last value seen shown on timeout.
pub async fn wait_until<T: Debug, F, Fut>(
    what: &str,
    deadline: Duration,
    mut get: F,
    mut ok: impl FnMut(&T) -> bool,
) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = T>,
{
    let start = Instant::now();
    loop {
        let value = get().await;
        if ok(&value) {
            return value;
        }
        if start.elapsed() > deadline {
            panic!(
                "timed out after {deadline:?} waiting for {what}; last seen:\n{value:#?}\n{}",
                log_tails()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

thread_local! {
    /// The namespace of the test running on this thread: its logs are the
    /// ones a failure shows.
    static TEST_NAMESPACE: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
    /// Where this thread's last panic happened, for the failure summary.
    static PANIC_AT: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// The last lines of the logs of the test running on this thread (its
/// operator processes are named after its namespace), or of every
/// component log when the thread runs no test; for failure messages.
pub fn log_tails() -> String {
    let mut out = String::new();
    let dir = cluster_dir().join("logs");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return out;
    };
    let namespace = TEST_NAMESPACE.with(|ns| ns.borrow().clone());
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| match &namespace {
            Some(ns) => p
                .file_name()
                .is_some_and(|f| f.to_string_lossy().contains(ns.as_str())),
            None => true,
        })
        .collect();
    paths.sort();
    for path in paths {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = &lines[lines.len().saturating_sub(15)..];
        out.push_str(&format!(
            "--- {} (last {} lines)\n{}\n",
            path.display(),
            tail.len(),
            tail.join("\n")
        ));
    }
    out
}

/// Marks versions as unready for the fake kubelet: pods created from now on
/// that would preload them never pass their readiness check.
pub async fn mark_unready(client: &Client, versions: &[&str]) {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-system");
    for _ in 0..20 {
        let existing = api.get_opt("fake-kubelet").await.unwrap();
        let mut lines: Vec<String> = existing
            .as_ref()
            .and_then(|c| c.data.as_ref())
            .and_then(|d| d.get("unready"))
            .map(|s| s.lines().map(str::to_owned).collect())
            .unwrap_or_default();
        for v in versions {
            if !lines.iter().any(|l| l == v) {
                lines.push((*v).to_owned());
            }
        }
        let data = serde_json::json!({ "unready": lines.join("\n") });
        let result = match existing {
            Some(mut cm) => {
                cm.data = serde_json::from_value(data).unwrap();
                api.replace("fake-kubelet", &PostParams::default(), &cm)
                    .await
            }
            None => {
                let cm: ConfigMap = serde_json::from_value(serde_json::json!({
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "fake-kubelet", "namespace": "kube-system"},
                    "data": data,
                }))
                .unwrap();
                api.create(&PostParams::default(), &cm).await
            }
        };
        match result {
            Ok(_) => return,
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => panic!("cannot update kube-system/fake-kubelet: {e}"),
        }
    }
    panic!("kube-system/fake-kubelet kept changing under us");
}

/// The operator, running as a real process against the test cluster.
pub struct Operator {
    child: Child,
    /// Extra environment variables, kept for a restart.
    env: Vec<(String, String)>,
    /// Its log file.
    pub log: PathBuf,
    /// Its `/metrics` and `/healthz` address.
    pub addr: String,
    args: Vec<String>,
    kubeconfig: PathBuf,
    /// The network namespace it runs in, when not the machine's.
    netns: Option<String>,
}

/// The pods' gateway address: the node's address on the pod network
/// (the first of the kubelet's pod CIDR, tests/cluster/state.sh).
pub const POD_GATEWAY: &str = "10.244.0.1";

/// The operator's identity in `deploy/operator`.
pub const OPERATOR_IDENTITY: &str = "system:serviceaccount:openmed-system:openmed-operator";

/// Installs `deploy/operator` (CRD, namespace, service account, RBAC and the
/// operator Deployment) the way users do, once per run, and returns a
/// kubeconfig that acts as the operator's service account: every operator
/// test then runs with exactly the permissions users install, so a missing
/// one fails a test.
/// `kubectl apply --server-side -f crds/openmedmodel.yaml`, then
/// `kubectl apply -k deploy/operator --server-side`: the CRD, the
/// operator's namespace, ServiceAccount, RBAC and admission policies, as
/// users install them.
pub fn install_operator() {
    let (ok, _, err) = kubectl(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        root().join("crds/openmedmodel.yaml").to_str().unwrap(),
    ]);
    assert!(ok, "kubectl apply -f crds/openmedmodel.yaml failed: {err}");
    let (ok, _, err) = kubectl(&[
        "apply",
        "-k",
        root().join("deploy/operator").to_str().unwrap(),
        "--server-side",
        "--force-conflicts",
    ]);
    assert!(
        ok,
        "kubectl apply -k deploy/operator --server-side failed: {err}"
    );
}

pub fn operator_kubeconfig() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        install_operator();
        let admin = std::fs::read_to_string(kubeconfig()).unwrap();
        let mut config: Value = serde_yaml::from_str(&admin).unwrap();
        config["users"][0]["user"]["as"] = Value::String(OPERATOR_IDENTITY.to_owned());
        let path = cluster_dir().join("operator.kubeconfig");
        std::fs::write(&path, serde_yaml::to_string(&config).unwrap()).unwrap();
        path
    })
    .clone()
}

/// A copy of what the install reads (`crds/`, `deploy/`), so that
/// `kustomize edit` changes the copy, not the checkout.
#[allow(dead_code)] // the install and migration tiers
pub fn install_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for folder in ["crds", "deploy"] {
        let status = Command::new("cp")
            .arg("-R")
            .arg(root().join(folder))
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(status.success(), "cp -R {folder}");
    }
    dir
}

/// Runs a cached tool build (`tests/canary/build`, `tests/gitops/build`,
/// `tests/helm/build`) and returns the folder it prints; its progress goes
/// to the test's stderr.
pub fn built_tools(script: &str) -> PathBuf {
    let out = Command::new(root().join(script))
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("{script} runs: {e}"));
    assert!(out.status.success(), "{script} failed");
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// `kubectl auth can-i --as identity args...`: whether the API server's
/// authorizer allows it.
pub fn can_i(identity: &str, args: &[&str]) -> bool {
    let mut full = vec!["auth", "can-i", "--as", identity];
    full.extend_from_slice(args);
    let (_, out, _) = kubectl(&full);
    out.trim() == "yes"
}

/// A kubeconfig acting as `user` (impersonated by the admin).
pub fn kubeconfig_as(user: &str) -> PathBuf {
    let admin = std::fs::read_to_string(kubeconfig()).unwrap();
    let mut config: Value = serde_yaml::from_str(&admin).unwrap();
    config["users"][0]["user"]["as"] = Value::String(user.to_owned());
    let path = cluster_dir().join(format!("{}.kubeconfig", user.replace(':', "-")));
    std::fs::write(&path, serde_yaml::to_string(&config).unwrap()).unwrap();
    path
}

/// `openmed-op run` for one namespace, with a short resync.
fn run_args(namespace: &str, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "run".into(),
        "-n".into(),
        namespace.into(),
        "--resync".into(),
        "2s".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

impl Operator {
    /// Starts `openmed-op run` for `namespace` with a short resync, as the
    /// operator's service account from `deploy/operator`.
    pub fn start(namespace: &str, extra: &[&str]) -> Self {
        Self::start_with(&operator_kubeconfig(), namespace, extra)
    }

    /// Starts one of several operators for `namespace`, with a log of its
    /// own (`operator-<namespace>-<instance>.log`).
    pub fn start_instance(namespace: &str, instance: &str, extra: &[&str]) -> Self {
        Self::start_instance_with(&operator_kubeconfig(), namespace, instance, extra)
    }

    /// [`Operator::start_instance`] with another kubeconfig.
    pub fn start_instance_with(
        kubeconfig: &Path,
        namespace: &str,
        instance: &str,
        extra: &[&str],
    ) -> Self {
        let log = cluster_dir()
            .join("logs")
            .join(format!("operator-{namespace}-{instance}.log"));
        Self::spawn(run_args(namespace, extra), kubeconfig.to_path_buf(), log)
    }

    /// Starts it with another kubeconfig (another identity).
    pub fn start_with(kubeconfig: &Path, namespace: &str, extra: &[&str]) -> Self {
        let log = cluster_dir()
            .join("logs")
            .join(format!("operator-{namespace}.log"));
        Self::spawn(run_args(namespace, extra), kubeconfig.to_path_buf(), log)
    }

    /// [`Operator::start_with`], with extra environment variables (the
    /// chaos suite skews its clock through libfaketime).
    #[allow(dead_code)] // the chaos suite
    pub fn start_with_env(
        kubeconfig: &Path,
        namespace: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let log = cluster_dir()
            .join("logs")
            .join(format!("operator-{namespace}.log"));
        let mut operator = Self::spawn_env(
            run_args(namespace, extra),
            kubeconfig.to_path_buf(),
            log,
            env.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        operator.env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        operator
    }

    /// Starts `openmed-op` with exactly `args` (an installed Deployment's),
    /// as `kubeconfig`'s identity, logging to `operator-<name>.log`.
    #[allow(dead_code)] // not used by the chaos suite
    pub fn start_exactly(
        kubeconfig: &Path,
        args: Vec<String>,
        name: &str,
        env: &[(&str, &str)],
    ) -> Self {
        let log = cluster_dir()
            .join("logs")
            .join(format!("operator-{name}.log"));
        let env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Self::spawn_env(args, kubeconfig.to_path_buf(), log, env)
    }

    fn spawn(args: Vec<String>, kubeconfig: PathBuf, log: PathBuf) -> Self {
        Self::spawn_env(args, kubeconfig, log, Vec::new())
    }

    /// `openmed-op run` for `namespace` on the pod network, as a pod of a
    /// real cluster runs: in the process pods' node network namespace,
    /// where pod addresses are reachable (the quality gate probes them), and
    /// reaching the API server at the node's address, which the kubelet
    /// forwards to this machine's (`tests/workload/up` lists its port).
    /// Its `/metrics` address is inside that namespace too.
    #[allow(dead_code)] // the real-stack suite
    pub fn start_on_pod_network(namespace: &str, extra: &[&str]) -> Self {
        let own = std::fs::read_to_string(operator_kubeconfig()).unwrap();
        let mut config: Value = serde_yaml::from_str(&own).unwrap();
        let server = config["clusters"][0]["cluster"]["server"]
            .as_str()
            .unwrap()
            .to_owned();
        let port = server.rsplit(':').next().unwrap().to_owned();
        config["clusters"][0]["cluster"]["server"] =
            Value::String(format!("https://{POD_GATEWAY}:{port}"));
        // The serving certificate names localhost, not the node address.
        config["clusters"][0]["cluster"]["tls-server-name"] = Value::String("localhost".into());
        let path = cluster_dir().join("operator-pod-network.kubeconfig");
        std::fs::write(&path, serde_yaml::to_string(&config).unwrap()).unwrap();
        let log = cluster_dir()
            .join("logs")
            .join(format!("operator-{namespace}.log"));
        // The kubelet's namespaces are named after the API server's port
        // (tests/cluster/state.sh, cluster_netns_prefix).
        let netns = format!("fk{port}-node");
        Self::spawn_in(
            run_args(namespace, extra),
            path,
            log,
            Vec::new(),
            Some(netns),
        )
    }

    fn spawn_env(
        args: Vec<String>,
        kubeconfig: PathBuf,
        log: PathBuf,
        env: Vec<(String, String)>,
    ) -> Self {
        Self::spawn_in(args, kubeconfig, log, env, None)
    }

    fn spawn_in(
        mut args: Vec<String>,
        kubeconfig: PathBuf,
        log: PathBuf,
        env: Vec<(String, String)>,
        netns: Option<String>,
    ) -> Self {
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        args.retain(|a| !a.starts_with("--listen="));
        let mut full = args.clone();
        full.push(format!("--listen={addr}"));
        std::fs::create_dir_all(log.parent().unwrap()).unwrap();
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let mut command = match &netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, binary()]);
                c
            }
            None => Command::new(binary()),
        };
        let child = command
            .args(&full)
            .env("KUBECONFIG", &kubeconfig)
            .env("RUST_LOG", "info,openmed_op=debug")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("openmed-op run starts");
        Operator {
            child,
            log,
            addr,
            args,
            kubeconfig,
            env,
            netns,
        }
    }

    /// Its process id.
    #[allow(dead_code)] // the chaos suite's crash hooks
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it has exited (killed, crashed or stopped).
    #[allow(dead_code)] // the chaos suite's crash hooks
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Its exit code, once it has exited by itself (`None` while it runs,
    /// or when a signal ended it).
    #[allow(dead_code)] // the chaos suite
    pub fn exit_code(&mut self) -> Option<i32> {
        self.child.try_wait().ok().flatten()?.code()
    }

    /// Kills it at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Its `/metrics`, read inside the network namespace it runs in.
    #[allow(dead_code)] // the real-stack suite
    pub fn metrics_in_netns(&self) -> Option<String> {
        let url = format!("http://{}/metrics", self.addr);
        let out = match &self.netns {
            Some(ns) => Command::new("ip")
                .args(["netns", "exec", ns, "curl", "-sf", &url])
                .output(),
            None => Command::new("curl").args(["-sf", &url]).output(),
        }
        .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Starts it again with the same arguments.
    pub fn restart(&mut self) {
        self.kill();
        *self = Self::spawn_in(
            self.args.clone(),
            self.kubeconfig.clone(),
            self.log.clone(),
            self.env.clone(),
            self.netns.clone(),
        );
    }

    /// Sends SIGTERM and waits for a clean exit; returns the exit code.
    pub fn terminate(&mut self) -> Option<i32> {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.code();
            }
            if Instant::now() > deadline {
                self.kill();
                return None;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The operator's `/metrics` text.
    pub async fn metrics(&self) -> String {
        http_get(&self.addr, "/metrics").await.unwrap_or_default()
    }

    /// The operator's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.kill();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A plain HTTP GET on loopback.
pub async fn http_get(addr: &str, path: &str) -> Option<String> {
    let (code, body) = http_request(addr, path).await?;
    (code == 200).then_some(body)
}

/// Where the API server's audit log ends now: pass it to
/// [`operator_requests`] to see what came after.
pub fn audit_log_end() -> u64 {
    std::fs::metadata(cluster_dir().join("logs/audit.log")).map_or(0, |m| m.len())
}

/// What an operator at rest asks about `namespace` for `window` (after
/// `settle`, for the last writes to reach its caches): every completed
/// request but its watches, as "verb URI".
pub async fn requests_at_rest(namespace: &str, settle: Duration, window: Duration) -> Vec<String> {
    tokio::time::sleep(settle).await;
    let start = audit_log_end();
    tokio::time::sleep(window).await; // the window measured
    operator_requests(namespace, start)
        .iter()
        .filter(|e| e["verb"] != "watch")
        .map(|e| format!("{} {}", e["verb"], e["requestURI"]))
        .collect()
}

/// The completed requests an operator (by its User-Agent) sent about
/// `namespace` after byte `from` of the audit log, as audit events.
pub fn operator_requests(namespace: &str, from: u64) -> Vec<Value> {
    let text = std::fs::read(cluster_dir().join("logs/audit.log"))
        .expect("the API server writes an audit log");
    String::from_utf8_lossy(&text[from as usize..])
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|event| {
            let ours = event["userAgent"]
                .as_str()
                .is_some_and(|ua| ua.starts_with("openmed-operator/"));
            let here = event["objectRef"]["namespace"] == namespace
                || event["requestURI"]
                    .as_str()
                    .is_some_and(|u| u.contains(namespace));
            ours && here && event["stage"] == "ResponseComplete"
        })
        .collect()
}

/// The status code of a plain GET, whatever it is.
pub async fn http_status(addr: &str, path: &str) -> Option<u16> {
    Some(http_request(addr, path).await?.0)
}

async fn http_request(addr: &str, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body.to_owned()))
}

/// The kubectl built with the control plane (same version as the server),
/// or the one on PATH.
pub fn kubectl_binary() -> PathBuf {
    let built = cluster_dir().join("bin/kubectl");
    if built.exists() {
        built
    } else {
        PathBuf::from("kubectl")
    }
}

/// Runs `kubectl` against the test cluster; returns (success, stdout, stderr).
pub fn kubectl(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(kubectl_binary())
        .arg("--kubeconfig")
        .arg(kubeconfig())
        .args(args)
        .output()
        .expect("kubectl runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A trial from a plain function that panics on failure.
pub fn trial(name: &'static str, test: fn()) -> libtest_mimic::Trial {
    libtest_mimic::Trial::test(name, move || recorded(name, test))
}

/// Runs a test, and keeps why it failed for [`print_failure_summary`].
pub fn recorded(
    name: &str,
    test: impl FnOnce() + std::panic::UnwindSafe,
) -> Result<(), libtest_mimic::Failed> {
    remember_panic_locations();
    PANIC_AT.with(|at| at.borrow_mut().take());
    std::panic::catch_unwind(test).map_err(|e| {
        let message = e
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "test panicked".into());
        let at = PANIC_AT.with(|at| at.borrow_mut().take());
        record_failure(name, at.as_deref(), &message);
        message.into()
    })
}

/// Failures in the order they happened, each as its name, where it
/// panicked and the first lines of its message.
static FAILURES: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn record_failure(name: &str, at: Option<&str>, message: &str) {
    let head: Vec<String> = message
        .lines()
        .filter(|l| !l.trim().is_empty())
        .take(3)
        .map(|l| l.chars().take(400).collect())
        .collect();
    let entry = format!(
        "{name} (panicked at {})\n    {}",
        at.unwrap_or("an unknown place"),
        head.join("\n    ")
    );
    FAILURES.lock().unwrap().push(entry);
}

/// Runs `trials` on the control plane in [`cluster_dir`], for a tier with
/// a control plane of its own: starts it when a trial that is not ignored
/// is selected and it is not running, stops it if this started it, prints
/// the failures last, and exits with the result.
#[allow(dead_code)] // the e2e tier shares its control plane; the others use this
pub fn run_on_own_cluster(args: &libtest_mimic::Arguments, trials: Vec<libtest_mimic::Trial>) -> ! {
    let run = trials
        .iter()
        .any(|t| selected(args, t.name()) && !t.has_ignored_flag());
    let started = run && !args.list && start_cluster();
    let conclusion = libtest_mimic::run(args, trials);
    if started {
        stop_cluster();
    }
    print_failure_summary();
    conclusion.exit();
}

/// Prints every failure once more, last of all: a long log tail in a
/// message must not push out why a test failed.
pub fn print_failure_summary() {
    let failures = FAILURES.lock().unwrap();
    if failures.is_empty() {
        return;
    }
    println!("\nwhy the failed tests failed:");
    for failure in failures.iter() {
        println!("  {failure}");
    }
}

/// Keeps where each panic happened on its thread, then reports it as the
/// default hook does.
fn remember_panic_locations() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if let Some(location) = info.location() {
                let at = format!("{}:{}", location.file(), location.line());
                PANIC_AT.with(|p| *p.borrow_mut() = Some(at));
            }
            default(info);
        }));
    });
}

/// Documents as one YAML stream, as `kubectl apply -f` and Git hold them.
pub fn yaml_stream(docs: &[Value]) -> String {
    docs.iter()
        .map(|d| serde_yaml::to_string(d).unwrap())
        .collect::<Vec<_>>()
        .join("---\n")
}

/// The value of a counter with this exact label set, 0 when absent.
pub fn counter(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}
