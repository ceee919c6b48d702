//! The control plane of `tests/cluster`, the CRD, and the identity the
//! operator under test runs as.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::{Value, json};

use crate::operator::cpu_seconds;
use crate::{log, redact, root};

/// The field manager of everything the harness applies.
pub const MANAGER: &str = "openmed-bench";

/// Where the operator's ServiceAccount lives; never a workload namespace.
const IDENTITY_NAMESPACE: &str = "openmed-bench-system";
const IDENTITY_NAME: &str = "operator-under-test";

/// A running control plane; stopped on drop if this run started it.
pub struct ControlPlane {
    dir: PathBuf,
    started: bool,
    keep: bool,
}

impl ControlPlane {
    /// Reuses the control plane running in `dir`, or starts one with
    /// `tests/cluster/up` (which builds it on first use).
    pub fn start(dir: &Path, keep: bool) -> Self {
        let script = |name: &str| root().join("tests/cluster").join(name);
        let running = Command::new(script("up"))
            .arg("--check")
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        let shown = redact(&dir.display().to_string());
        if running {
            log(format!("reusing the control plane running in {shown}"));
        } else {
            log(format!(
                "starting the control plane in {shown} (tests/cluster/up)"
            ));
            let status = Command::new(script("up"))
                .arg(dir)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .status()
                .expect("tests/cluster/up runs");
            assert!(
                status.success(),
                "tests/cluster/up failed; see {shown}/logs"
            );
        }
        ControlPlane {
            dir: dir.to_path_buf(),
            started: !running,
            keep,
        }
    }

    /// The admin kubeconfig.
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    /// The API server's audit log (JSON lines, Metadata level).
    pub fn audit_log(&self) -> PathBuf {
        self.dir.join("logs/audit.log")
    }

    /// Where component logs go; the operator's go there too.
    pub fn log_dir(&self) -> PathBuf {
        self.dir.join("logs")
    }

    /// CPU seconds used so far by each control-plane process (from the pids
    /// `up` recorded) and by this harness, to show where a phase's work went.
    pub fn cpu(&self) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        for component in [
            "kube-apiserver",
            "etcd",
            "kube-controller-manager",
            "fake-kubelet",
        ] {
            let pid =
                std::fs::read_to_string(self.dir.join("pids").join(format!("{component}.pid")))
                    .unwrap_or_default();
            if let Some(cpu) = cpu_seconds(pid.trim()) {
                out.insert(component.to_owned(), cpu);
            }
        }
        if let Some(cpu) = cpu_seconds("self") {
            out.insert("harness".to_owned(), cpu);
        }
        out
    }

    /// A client with the admin kubeconfig.
    pub async fn admin(&self) -> Result<Client, String> {
        let kubeconfig = Kubeconfig::read_from(self.kubeconfig()).map_err(|e| e.to_string())?;
        let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| e.to_string())?;
        Client::try_from(config).map_err(|e| e.to_string())
    }

    /// A ServiceAccount for the operator under test, bound to
    /// `cluster-admin` (the harness cannot know what another operator
    /// needs), and a kubeconfig with a token for it. Every client library
    /// speaks bearer tokens, and the audit log names the ServiceAccount as
    /// `user.username`, so the operator's requests are told apart from
    /// everyone else's whatever its User-Agent.
    pub async fn operator_identity(&self, admin: &Client) -> Result<Identity, String> {
        let apply = PatchParams::apply(MANAGER).force();
        let namespaces: Api<Namespace> = Api::all(admin.clone());
        let namespace = json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": IDENTITY_NAMESPACE},
        });
        namespaces
            .patch(IDENTITY_NAMESPACE, &apply, &Patch::Apply(&namespace))
            .await
            .map_err(|e| format!("namespace {IDENTITY_NAMESPACE}: {e}"))?;
        let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), IDENTITY_NAMESPACE);
        let account = json!({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": IDENTITY_NAME, "namespace": IDENTITY_NAMESPACE},
        });
        accounts
            .patch(IDENTITY_NAME, &apply, &Patch::Apply(&account))
            .await
            .map_err(|e| format!("ServiceAccount: {e}"))?;
        let bindings: Api<ClusterRoleBinding> = Api::all(admin.clone());
        let binding_name = format!("{MANAGER}-{IDENTITY_NAME}");
        let binding = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": binding_name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": IDENTITY_NAME, "namespace": IDENTITY_NAMESPACE}],
        });
        bindings
            .patch(&binding_name, &apply, &Patch::Apply(&binding))
            .await
            .map_err(|e| format!("ClusterRoleBinding: {e}"))?;

        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: Vec::new(),
                expiration_seconds: Some(24 * 3600),
                ..TokenRequestSpec::default()
            },
            ..TokenRequest::default()
        };
        let token = accounts
            .create_token_request(IDENTITY_NAME, &PostParams::default(), &request)
            .await
            .map_err(|e| format!("TokenRequest: {e}"))?
            .status
            .ok_or("TokenRequest: no status")?
            .token;

        let admin_config: Value = serde_yaml::from_str(
            &std::fs::read_to_string(self.kubeconfig()).map_err(|e| e.to_string())?,
        )
        .map_err(|e| e.to_string())?;
        let cluster = admin_config["clusters"][0].clone();
        let config = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [cluster],
            "users": [{"name": IDENTITY_NAME, "user": {"token": token}}],
            "contexts": [{"name": "operator-under-test", "context": {
                "cluster": cluster["name"], "user": IDENTITY_NAME, "namespace": "default",
            }}],
            "current-context": "operator-under-test",
        });
        let path = self.dir.join("operator-under-test.kubeconfig");
        write_private(
            &path,
            &serde_yaml::to_string(&config).map_err(|e| e.to_string())?,
        )?;
        Ok(Identity {
            username: format!("system:serviceaccount:{IDENTITY_NAMESPACE}:{IDENTITY_NAME}"),
            kubeconfig: path,
        })
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if self.started && !self.keep {
            log("stopping the control plane this run started (tests/cluster/down)");
            let _ = Command::new(root().join("tests/cluster/down"))
                .arg(&self.dir)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .status();
        }
    }
}

/// Who the operator under test is to the API server.
pub struct Identity {
    /// Its user name in the audit log.
    pub username: String,
    /// The kubeconfig it runs with.
    pub kubeconfig: PathBuf,
}

fn write_private(path: &Path, text: &str) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("{}: {e}", redact(&path.display().to_string())))?;
    file.write_all(text.as_bytes()).map_err(|e| e.to_string())
}

/// Installs the committed CRD and waits until it is Established.
pub async fn install_crd(client: &Client) -> Result<(), String> {
    let text = std::fs::read_to_string(root().join("crds/openmedmodel.yaml"))
        .map_err(|e| format!("crds/openmedmodel.yaml: {e}"))?;
    let crd: CustomResourceDefinition = serde_yaml::from_str(&text).map_err(|e| e.to_string())?;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    api.patch(
        "openmedmodels.openmed.ai",
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&crd),
    )
    .await
    .map_err(|e| format!("the CRD: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let established = api
            .get("openmedmodels.openmed.ai")
            .await
            .ok()
            .and_then(|c| c.status)
            .and_then(|s| s.conditions)
            .is_some_and(|c| {
                c.iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            });
        if established {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err("the CRD was not Established within 60 s".into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The API server's version, e.g. `v1.37.2`.
pub async fn version(client: &Client) -> String {
    client
        .apiserver_version()
        .await
        .map(|v| v.git_version)
        .unwrap_or_else(|_| "unknown".into())
}

/// Adds `version` to (or removes it from) the fake kubelet's list of
/// versions whose pods never get Ready: a read-modify-write of
/// `kube-system/fake-kubelet`, retried on conflict.
pub async fn set_unready(client: &Client, version: &str, unready: bool) -> Result<(), String> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-system");
    for _ in 0..20 {
        let existing = api
            .get_opt("fake-kubelet")
            .await
            .map_err(|e| e.to_string())?;
        let mut lines: Vec<String> = existing
            .as_ref()
            .and_then(|c| c.data.as_ref())
            .and_then(|d| d.get("unready"))
            .map(|s| s.lines().map(str::to_owned).collect())
            .unwrap_or_default();
        lines.retain(|l| l != version);
        if unready {
            lines.push(version.to_owned());
        }
        let data = [("unready".to_owned(), lines.join("\n"))].into();
        let result = match existing {
            Some(mut cm) => {
                cm.data = Some(data);
                api.replace("fake-kubelet", &PostParams::default(), &cm)
                    .await
            }
            None => {
                let cm = ConfigMap {
                    metadata: kube::core::ObjectMeta {
                        name: Some("fake-kubelet".into()),
                        namespace: Some("kube-system".into()),
                        ..Default::default()
                    },
                    data: Some(data),
                    ..Default::default()
                };
                api.create(&PostParams::default(), &cm).await
            }
        };
        match result {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(format!("kube-system/fake-kubelet: {e}")),
        }
    }
    Err("kube-system/fake-kubelet kept changing".into())
}
