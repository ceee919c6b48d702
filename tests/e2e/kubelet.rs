//! The test kubelet's process pods, on the real control plane: a pod whose
//! images are in the image map runs as processes in a network namespace of
//! its own, with the environment, probes, restarts, termination messages
//! and graceful deletion a kubelet gives it (`tests/cluster/cmd/fake-kubelet`).
//!
//! The processes here are `/bin/sh` and Python's `http.server`; the OpenMed
//! service uses the same machinery (`tests/workload`).

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use libtest_mimic::Trial;
use serde_json::{Value, json};

use crate::support::*;
use crate::trial;

pub fn trials() -> Vec<Trial> {
    vec![
        trial(
            "kubelet::a_process_pod_gets_its_env_address_endpoints_and_host_port",
            a_process_pod_gets_its_env_address_endpoints_and_host_port,
        ),
        trial(
            "kubelet::readiness_and_its_gate_follow_the_probe",
            readiness_and_its_gate_follow_the_probe,
        ),
        trial(
            "kubelet::a_crash_loop_backs_off_with_the_logs_as_its_message",
            a_crash_loop_backs_off_with_the_logs_as_its_message,
        ),
        trial(
            "kubelet::failing_liveness_and_startup_probes_restart_the_container",
            failing_liveness_and_startup_probes_restart_the_container,
        ),
        trial(
            "kubelet::deletion_runs_pre_stop_then_sigterm_then_sigkill",
            deletion_runs_pre_stop_then_sigterm_then_sigkill,
        ),
        trial(
            "kubelet::init_containers_run_to_completion_first",
            init_containers_run_to_completion_first,
        ),
        trial(
            "kubelet::volumes_and_hosts_are_mounted_where_the_spec_says",
            volumes_and_hosts_are_mounted_where_the_spec_says,
        ),
        trial(
            "kubelet::a_volume_over_the_folder_of_the_program_does_not_hide_it",
            a_volume_over_the_folder_of_the_program_does_not_hide_it,
        ),
        trial(
            "kubelet::pods_reach_listed_node_ports_at_their_gateway",
            pods_reach_listed_node_ports_at_their_gateway,
        ),
        trial(
            "kubelet::config_is_read_at_container_start_and_mixed_images_are_refused",
            config_is_read_at_container_start_and_mixed_images_are_refused,
        ),
    ]
}

const SH: &str = "e2e.test/sh";
const PYTHON: &str = "e2e.test/python";

/// Writes this suite's entries into the image map (its own key, so the
/// workload's entries stay).
async fn ensure_images(client: &Client) {
    let python = python();
    let images = json!({
        SH: {"entrypoint": ["/bin/sh", "-c"], "env": ["FROM_IMAGE=yes", "HOME=/image-home"]},
        PYTHON: {"entrypoint": [python], "cmd": ["-m", "http.server"], "env": ["PYTHONUNBUFFERED=1"]},
    });
    set_image_map(client, "e2e-kubelet", &images).await;
}

struct Env {
    client: Client,
    ns: TestNamespace,
    pods: Api<Pod>,
    /// A folder of this test's on the shared filesystem (pods see it too).
    dir: PathBuf,
}

async fn env(prefix: &str) -> Env {
    let client = admin().await;
    ensure_images(&client).await;
    let ns = TestNamespace::create(&client, prefix).await;
    let pods = Api::namespaced(client.clone(), &ns.name);
    let dir = cluster_dir().join("e2e-kubelet").join(&ns.name);
    std::fs::create_dir_all(&dir).unwrap();
    Env {
        client,
        ns,
        pods,
        dir,
    }
}

impl Env {
    async fn create_pod(&self, pod: Value) -> Pod {
        let pod: Pod = serde_json::from_value(pod).unwrap();
        self.pods
            .create(&PostParams::default(), &pod)
            .await
            .expect("the pod is created")
    }

    async fn wait_pod(&self, name: &str, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
        wait_until(
            what,
            Duration::from_secs(90),
            || async {
                self.pods
                    .get_opt(name)
                    .await
                    .ok()
                    .flatten()
                    .map(|p| serde_json::to_value(p).unwrap())
                    .unwrap_or(Value::Null)
            },
            |p| !p.is_null() && ok(p),
        )
        .await
    }

    /// The container's log for its `restart`th run, as the kubelet keeps it.
    fn log(&self, pod: &Value, container: &str, restart: u32) -> String {
        let path = cluster_dir().join(format!(
            "kubelet/pods/{}_{}_{}/{container}/{restart}.log",
            self.ns.name,
            pod["metadata"]["name"].as_str().unwrap(),
            pod["metadata"]["uid"].as_str().unwrap()
        ));
        std::fs::read_to_string(&path).unwrap_or_default()
    }

    async fn events(&self, reason: &str) -> Vec<String> {
        let api: Api<Event> = Api::namespaced(self.client.clone(), &self.ns.name);
        api.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .filter_map(|e| e.message)
            .collect()
    }

    async fn done(self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        self.ns.delete().await;
    }
}

fn condition(pod: &Value, kind: &str) -> String {
    pod["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == kind))
        .map(|c| c["status"].as_str().unwrap_or_default().to_owned())
        .unwrap_or_default()
}

fn container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    pod["status"]["containerStatuses"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .unwrap_or(&Value::Null)
}

fn pid_of(status: &Value) -> u32 {
    status["containerID"]
        .as_str()
        .and_then(|id| id.strip_prefix("process://"))
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("a process container ID: {status}"))
}

/// A plain HTTP/1.0 GET to 127.0.0.1:port (status and body).
fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(conn, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut response = String::new();
    conn.read_to_string(&mut response).ok()?;
    let status = response.split(' ').nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n")?.1.to_owned();
    Some((status, body))
}

/// The Python the tests run pods with (an absolute path: pods get the PATH
/// their spec gives them).
fn python() -> String {
    let out = std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn a_process_pod_gets_its_env_address_endpoints_and_host_port() {
    block_on(async {
        let e = env("kubelet-env").await;
        let cms: Api<ConfigMap> = Api::namespaced(e.client.clone(), &e.ns.name);
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "settings"},
            "data": {"MODEL": "OpenMed/synthetic-pii-v1", "GREETING": "hello"},
        }))
        .unwrap();
        cms.create(&PostParams::default(), &cm).await.unwrap();
        let secrets: Api<k8s_openapi::api::core::v1::Secret> =
            Api::namespaced(e.client.clone(), &e.ns.name);
        let secret = serde_json::from_value(json!({
            "metadata": {"name": "creds"}, "stringData": {"TOKEN": "s3cret"},
        }))
        .unwrap();
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
        let services: Api<k8s_openapi::api::core::v1::Service> =
            Api::namespaced(e.client.clone(), &e.ns.name);
        let svc = serde_json::from_value(json!({
            "metadata": {"name": "web"},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
        }))
        .unwrap();
        services.create(&PostParams::default(), &svc).await.unwrap();

        let host_port = free_port();
        let script = format!(
            "env | sort; echo \"ARG=$(MODEL)\"; echo 'ESCAPED=$$(MODEL)'; \
             exec {} -m http.server --bind 0.0.0.0 8080",
            python()
        );
        e.create_pod(json!({
            "metadata": {"name": "web", "labels": {"app": "web"}},
            "spec": {"containers": [{
                "name": "web", "image": format!("{SH}:1.0"), "args": [script],
                "workingDir": e.dir,
                "ports": [{"containerPort": 8080, "hostPort": host_port}],
                "envFrom": [{"prefix": "CFG_", "configMapRef": {"name": "settings"}}],
                "env": [
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                    {"name": "MODEL", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "MODEL"}}},
                    {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "TOKEN"}}},
                    {"name": "URL", "value": "http://$(POD_IP):8080/$(CFG_GREETING)"},
                    {"name": "HOME", "value": "/pod-home"},
                    {"name": "PATH", "value": "/usr/local/bin:/usr/bin:/bin"},
                ],
                "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
            }]},
        }))
        .await;
        let pod = e
            .wait_pod("web", "the process pod to be Ready", |p| {
                condition(p, "Ready") == "True"
            })
            .await;
        let ip = pod["status"]["podIP"].as_str().unwrap().to_owned();
        assert!(
            ip.starts_with("10.244."),
            "an address of the pod CIDR: {ip}"
        );
        assert_eq!(pod["status"]["hostIP"], "127.0.0.1");
        assert_eq!(pod["status"]["phase"], "Running");
        let web = container(&pod, "web");
        assert_eq!(web["ready"], true);
        assert_eq!(web["started"], true);
        assert!(web["state"]["running"]["startedAt"].is_string(), "{web}");
        let pid = pid_of(web);
        assert!(
            PathBuf::from(format!("/proc/{pid}")).exists(),
            "the container is a live process"
        );

        let log = e.log(&pod, "web", 0);
        for line in [
            format!("POD_IP={ip}"),
            "POD_NAME=web".into(),
            format!("POD_NAMESPACE={}", e.ns.name),
            "MODEL=OpenMed/synthetic-pii-v1".into(),
            "CFG_GREETING=hello".into(),
            "CFG_MODEL=OpenMed/synthetic-pii-v1".into(),
            "TOKEN=s3cret".into(),
            format!("URL=http://{ip}:8080/hello"),
            "HOME=/pod-home".into(),
            "FROM_IMAGE=yes".into(),
            "HOSTNAME=web".into(),
            "PATH=/usr/local/bin:/usr/bin:/bin".into(),
            "ARG=OpenMed/synthetic-pii-v1".into(),
            "ESCAPED=$(MODEL)".into(),
        ] {
            assert!(
                log.lines().any(|l| l == line),
                "the container's log has {line:?}:\n{log}"
            );
        }

        // The EndpointSlice controller publishes the pod's address: a real
        // data plane can route to it.
        let slices: Api<EndpointSlice> = Api::namespaced(e.client.clone(), &e.ns.name);
        wait_for(
            "an EndpointSlice of the Service with the pod's address, ready",
            Duration::from_secs(60),
            || async {
                let list = slices
                    .list(&ListParams::default().labels("kubernetes.io/service-name=web"))
                    .await
                    .ok()?;
                list.items
                    .iter()
                    .flat_map(|s| s.endpoints.iter())
                    .any(|ep| {
                        ep.addresses.contains(&ip)
                            && ep.conditions.as_ref().and_then(|c| c.ready) == Some(true)
                    })
                    .then_some(())
            },
        )
        .await;

        // hostPort: the node's address forwards to the pod.
        let (status, body) = wait_until(
            "the pod's web server through its hostPort",
            Duration::from_secs(30),
            || async { http_get(host_port, "/") },
            |r| r.is_some(),
        )
        .await
        .unwrap();
        assert_eq!(status, 200, "{body}");
        assert!(body.contains("Directory listing"), "{body}");
        e.done().await;
    });
}

fn readiness_and_its_gate_follow_the_probe() {
    block_on(async {
        let e = env("kubelet-ready").await;
        e.create_pod(json!({
            "metadata": {"name": "gated"},
            "spec": {
                "readinessGates": [{"conditionType": "e2e.test/gate"}],
                "containers": [{
                    "name": "web", "image": PYTHON, "args": ["-m", "http.server", "8080"],
                    "workingDir": e.dir,
                    "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080,
                                                    "httpHeaders": [{"name": "Host", "value": "localhost"}]},
                                       "periodSeconds": 1, "failureThreshold": 1},
                }],
            },
        }))
        .await;
        let pod = e
            .wait_pod("gated", "the server to run, unready (no /ready yet)", |p| {
                container(p, "web")["state"]["running"].is_object()
            })
            .await;
        assert_eq!(condition(&pod, "Ready"), "False");
        wait_for(
            "an Unhealthy event for the readiness probe's 404",
            Duration::from_secs(30),
            || async {
                e.events("Unhealthy")
                    .await
                    .iter()
                    .any(|m| {
                        m.starts_with(
                            "Readiness probe failed: HTTP probe failed with statuscode: 404",
                        )
                    })
                    .then_some(())
            },
        )
        .await;

        std::fs::write(e.dir.join("ready"), "ok").unwrap();
        let pod = e
            .wait_pod("gated", "containers ready once /ready answers", |p| {
                condition(p, "ContainersReady") == "True"
            })
            .await;
        assert_eq!(
            condition(&pod, "Ready"),
            "False",
            "the readiness gate is not True yet"
        );
        let reason = pod["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Ready")
            .unwrap()["reason"]
            .clone();
        assert_eq!(reason, "ReadinessGatesNotReady");

        let status = json!({"status": {"conditions": [
            {"type": "e2e.test/gate", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}
        ]}});
        e.pods
            .patch_status("gated", &PatchParams::default(), &Patch::Strategic(&status))
            .await
            .unwrap();
        e.wait_pod("gated", "Ready once the gate is True", |p| {
            condition(p, "Ready") == "True"
        })
        .await;

        std::fs::remove_file(e.dir.join("ready")).unwrap();
        let pod = e
            .wait_pod("gated", "unready again when /ready goes", |p| {
                condition(p, "Ready") == "False"
            })
            .await;
        assert_eq!(
            condition(&pod, "e2e.test/gate"),
            "True",
            "the kubelet keeps the gate's condition"
        );
        e.done().await;
    });
}

fn a_crash_loop_backs_off_with_the_logs_as_its_message() {
    block_on(async {
        let e = env("kubelet-crash").await;
        e.create_pod(json!({
            "metadata": {"name": "crash"},
            "spec": {"containers": [{
                "name": "svc", "image": SH,
                "args": ["echo loading; echo 'fatal: model OpenMed/missing is not in the cache' >&2; exit 3"],
                "terminationMessagePolicy": "FallbackToLogsOnError",
            }]},
        }))
        .await;
        let pod = e
            .wait_pod(
                "crash",
                "the first back-off (after one immediate restart)",
                |p| {
                    let c = container(p, "svc");
                    c["state"]["waiting"]["reason"] == "CrashLoopBackOff"
                },
            )
            .await;
        let c = container(&pod, "svc");
        assert_eq!(c["restartCount"], 1, "{c}");
        let message = c["state"]["waiting"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("back-off 10s restarting failed container=svc pod=crash_"),
            "{message}"
        );
        let last = &c["lastState"]["terminated"];
        assert_eq!(last["exitCode"], 3, "{c}");
        assert_eq!(last["reason"], "Error");
        assert_eq!(
            last["message"], "loading\nfatal: model OpenMed/missing is not in the cache",
            "the log's tail is the termination message"
        );
        assert_eq!(pod["status"]["phase"], "Running");
        assert_eq!(condition(&pod, "Ready"), "False");
        assert_eq!(e.log(&pod, "svc", 1).lines().next(), Some("loading"));

        let pod = e
            .wait_pod("crash", "the second back-off, twice as long", |p| {
                container(p, "svc")["restartCount"] == 2
                    && container(p, "svc")["state"]["waiting"]["reason"] == "CrashLoopBackOff"
            })
            .await;
        let message = container(&pod, "svc")["state"]["waiting"]["message"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(message.starts_with("back-off 20s "), "{message}");
        assert!(!e.events("BackOff").await.is_empty());
        e.done().await;
    });
}

fn failing_liveness_and_startup_probes_restart_the_container() {
    block_on(async {
        let e = env("kubelet-live").await;
        let alive = e.dir.join("never-made");
        e.create_pod(json!({
            "metadata": {"name": "probed"},
            "spec": {"terminationGracePeriodSeconds": 5, "containers": [
                {"name": "live", "image": SH, "args": ["exec sleep 1000"],
                 "livenessProbe": {"exec": {"command": ["test", "-f", alive]},
                                   "periodSeconds": 1, "failureThreshold": 2}},
                {"name": "boot", "image": SH, "args": ["exec sleep 1000"],
                 "startupProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1, "failureThreshold": 2},
                 "readinessProbe": {"exec": {"command": ["true"]}, "periodSeconds": 1}},
            ]},
        }))
        .await;
        let pod = e
            .wait_pod("probed", "both containers killed and restarted", |p| {
                container(p, "live")["restartCount"].as_i64() >= Some(1)
                    && container(p, "boot")["restartCount"].as_i64() >= Some(1)
            })
            .await;
        for name in ["live", "boot"] {
            let last = &container(&pod, name)["lastState"]["terminated"];
            assert_eq!(
                last["exitCode"],
                128 + 15,
                "{name} stopped by SIGTERM: {last}"
            );
        }
        assert_eq!(
            container(&pod, "boot")["ready"],
            false,
            "no readiness before the startup probe passes"
        );
        let killing = e.events("Killing").await;
        for probe in ["liveness", "startup"] {
            assert!(
                killing
                    .iter()
                    .any(|m| m.contains(&format!("failed {probe} probe, will be restarted"))),
                "{killing:?}"
            );
        }

        e.done().await;
    });
}

fn deletion_runs_pre_stop_then_sigterm_then_sigkill() {
    block_on(async {
        let e = env("kubelet-stop").await;
        let order = e.dir.join("order");
        let order_s = order.to_str().unwrap();
        let stubborn = format!(
            "trap 'echo TERM >> {order_s}' TERM; echo running >> {order_s}; \
             while :; do sleep 0.2; done"
        );
        e.create_pod(json!({
            "metadata": {"name": "stop"},
            "spec": {"terminationGracePeriodSeconds": 3, "containers": [{
                "name": "stubborn", "image": SH, "args": [stubborn],
                "lifecycle": {"preStop": {"exec": {"command": ["sh", "-c", format!("echo prestop >> {order_s}")]}}},
            }]},
        }))
        .await;
        let pod = e
            .wait_pod("stop", "the container running", |p| {
                condition(p, "Ready") == "True"
            })
            .await;
        let pid = pid_of(container(&pod, "stubborn"));
        let ip = pod["status"]["podIP"].as_str().unwrap().to_owned();
        wait_for(
            "the container's first line",
            Duration::from_secs(10),
            || async {
                std::fs::read_to_string(&order)
                    .ok()
                    .filter(|s| !s.is_empty())
                    .map(|_| ())
            },
        )
        .await;

        e.pods
            .delete("stop", &DeleteParams::default())
            .await
            .unwrap();
        wait_for("the pod to be gone", Duration::from_secs(30), || async {
            e.pods
                .get_opt("stop")
                .await
                .unwrap()
                .is_none()
                .then_some(())
        })
        .await;
        assert_eq!(
            std::fs::read_to_string(&order).unwrap(),
            "running\nprestop\nTERM\n",
            "preStop ran before SIGTERM"
        );
        assert!(
            !PathBuf::from(format!("/proc/{pid}")).exists(),
            "SIGKILL ended the process that ignored SIGTERM"
        );
        let netns = std::fs::read_dir("/run/netns")
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name())
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        let offset = {
            let o: Vec<u32> = ip.split('.').map(|p| p.parse().unwrap()).collect();
            (o[2] << 8) | o[3]
        };
        assert!(
            !netns
                .iter()
                .any(|n| n.to_string_lossy().ends_with(&format!("-{offset}"))),
            "the pod's network namespace is removed: {netns:?}"
        );
        let stopping = e.events("Killing").await;
        assert!(
            stopping.iter().any(|m| m == "Stopping container stubborn"),
            "{stopping:?}"
        );
        e.done().await;
    });
}

fn init_containers_run_to_completion_first() {
    block_on(async {
        let e = env("kubelet-init").await;
        let order = e.dir.join("order");
        let o = order.to_str().unwrap();
        e.create_pod(json!({
            "metadata": {"name": "init"},
            "spec": {
                "initContainers": [
                    {"name": "first", "image": SH, "args": [format!("echo first >> {o}")]},
                    {"name": "second", "image": SH, "args": [format!("echo second >> {o}")]},
                ],
                "containers": [{"name": "main", "image": SH, "args": [format!("echo main >> {o}; exec sleep 1000")]}],
            },
        }))
        .await;
        let pod = e
            .wait_pod("init", "the pod Ready after its init containers", |p| {
                condition(p, "Ready") == "True"
            })
            .await;
        assert_eq!(condition(&pod, "Initialized"), "True");
        for s in pod["status"]["initContainerStatuses"].as_array().unwrap() {
            assert_eq!(s["state"]["terminated"]["exitCode"], 0, "{s}");
            assert_eq!(s["state"]["terminated"]["reason"], "Completed", "{s}");
        }
        wait_for(
            "the main container's line",
            Duration::from_secs(10),
            || async {
                std::fs::read_to_string(&order)
                    .ok()
                    .filter(|s| s.ends_with("main\n"))
                    .map(|_| ())
            },
        )
        .await;
        assert_eq!(
            std::fs::read_to_string(&order).unwrap(),
            "first\nsecond\nmain\n"
        );
        e.done().await;
    });
}

fn config_is_read_at_container_start_and_mixed_images_are_refused() {
    block_on(async {
        let e = env("kubelet-config").await;
        e.create_pod(json!({
            "metadata": {"name": "waits"},
            "spec": {"containers": [{
                "name": "svc", "image": SH, "args": ["echo \"MODEL=$MODEL\"; exec sleep 1000"],
                "env": [{"name": "MODEL", "valueFrom": {"configMapKeyRef": {"name": "later", "key": "MODEL"}}}],
            }]},
        }))
        .await;
        let pod = e
            .wait_pod(
                "waits",
                "the container held by its missing ConfigMap",
                |p| {
                    container(p, "svc")["state"]["waiting"]["reason"]
                        == "CreateContainerConfigError"
                },
            )
            .await;
        assert_eq!(
            container(&pod, "svc")["state"]["waiting"]["message"],
            "configmap \"later\" not found"
        );
        let cms: Api<ConfigMap> = Api::namespaced(e.client.clone(), &e.ns.name);
        let cm = serde_json::from_value(
            json!({"metadata": {"name": "later"}, "data": {"MODEL": "OpenMed/m-v2"}}),
        )
        .unwrap();
        cms.create(&PostParams::default(), &cm).await.unwrap();
        let pod = e
            .wait_pod(
                "waits",
                "the container started once the ConfigMap exists",
                |p| condition(p, "Ready") == "True",
            )
            .await;
        wait_for("its log", Duration::from_secs(10), || async {
            e.log(&pod, "svc", 0)
                .contains("MODEL=OpenMed/m-v2")
                .then_some(())
        })
        .await;

        e.create_pod(json!({
            "metadata": {"name": "mixed"},
            "spec": {"containers": [
                {"name": "proc", "image": SH, "args": ["sleep 1000"]},
                {"name": "sim", "image": "registry.example/not-mapped:1"},
            ]},
        }))
        .await;
        let pod = e
            .wait_pod("mixed", "the mixed pod refused", |p| {
                container(p, "sim")["state"]["waiting"]["reason"] == "ErrImageNeverPull"
            })
            .await;
        let message = container(&pod, "sim")["state"]["waiting"]["message"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(
            message.contains("sim (registry.example/not-mapped:1)"),
            "{message}"
        );
        e.done().await;
    });
}

fn volumes_and_hosts_are_mounted_where_the_spec_says() {
    block_on(async {
        let e = env("kubelet-volumes").await;
        let cms: Api<ConfigMap> = Api::namespaced(e.client.clone(), &e.ns.name);
        let cm = serde_json::from_value(json!({
            "metadata": {"name": "conf"}, "data": {"greeting": "hello from a volume"},
        }))
        .unwrap();
        cms.create(&PostParams::default(), &cm).await.unwrap();
        let secrets: Api<k8s_openapi::api::core::v1::Secret> =
            Api::namespaced(e.client.clone(), &e.ns.name);
        let secret = serde_json::from_value(json!({
            "metadata": {"name": "tls"}, "stringData": {"tls.crt": "CERTIFICATE"},
        }))
        .unwrap();
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
        let sa = "/var/run/secrets/kubernetes.io/serviceaccount";
        // Paths that do not exist on this machine (/certs, /etc/e2e-config,
        // /scratch), one that does (/podinfo is made), the token every pod
        // gets, and the API server by its Service's name and port, as
        // cluster DNS gives it (Kopf's in-cluster login asks for it).
        let reader = format!(
            "cat /certs/tls.crt; echo; cat /etc/e2e-config/greeting; echo; \
             cat /podinfo/name; echo; cat /podinfo/labels; cat /etc/hosts; \
             test -s {sa}/token && echo token-present; cat {sa}/namespace; echo; \
             grep -c BEGIN {sa}/ca.crt; \
             curl -sf --cacert {sa}/ca.crt https://kubernetes.default.svc/version >/dev/null && echo api-by-name; \
             echo shared > /scratch/from-reader; exec sleep 1000"
        );
        e.create_pod(json!({
            "metadata": {"name": "vols", "labels": {"app": "vols"}},
            "spec": {
                "hostAliases": [{"ip": "10.244.0.1", "hostnames": ["xds.e2e.test"]}],
                "volumes": [
                    {"name": "conf", "configMap": {"name": "conf"}},
                    {"name": "tls", "secret": {"secretName": "tls"}},
                    {"name": "scratch", "emptyDir": {}},
                    {"name": "info", "downwardAPI": {"items": [
                        {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
                        {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                    ]}},
                ],
                "containers": [
                    {"name": "reader", "image": SH, "args": [reader],
                     "volumeMounts": [
                        {"name": "conf", "mountPath": "/etc/e2e-config"},
                        {"name": "tls", "mountPath": "/certs", "readOnly": true},
                        {"name": "scratch", "mountPath": "/scratch"},
                        {"name": "info", "mountPath": "/podinfo"},
                     ]},
                    // Sees the reader's file through the shared emptyDir,
                    // from an exec probe run in its own mount namespace.
                    {"name": "peer", "image": SH, "args": ["exec sleep 1000"],
                     "volumeMounts": [{"name": "scratch", "mountPath": "/data"}],
                     "readinessProbe": {"exec": {"command": ["test", "-f", "/data/from-reader"]},
                                        "periodSeconds": 1}},
                ],
            },
        }))
        .await;
        let pod = e
            .wait_pod("vols", "both containers ready", |p| {
                condition(p, "Ready") == "True"
            })
            .await;
        let ip = pod["status"]["podIP"].as_str().unwrap().to_owned();
        let log = e.log(&pod, "reader", 0);
        for line in [
            "CERTIFICATE".to_owned(),
            "hello from a volume".into(),
            "vols".into(),
            "app=\"vols\"".into(),
            format!("{ip}\tvols"),
            "10.244.0.1\txds.e2e.test\txds.e2e.test.".into(),
            "token-present".into(),
            e.ns.name.clone(),
            "1".into(),
            "api-by-name".into(),
        ] {
            assert!(
                log.lines().any(|l| l == line),
                "the reader's log has {line:?}:\n{log}"
            );
        }
        for path in ["/certs", "/scratch", "/podinfo", "/etc/e2e-config"] {
            assert!(
                !std::path::Path::new(path).exists(),
                "{path} exists only in the pod, not on this machine"
            );
        }
        e.done().await;
    });
}

/// A container runs its program even when one of its volumes is mounted
/// over the folder that holds it, found on PATH or named by its path, as
/// Envoy Gateway's shutdown-manager (`envoy-gateway` from a tool cache
/// under /tmp) runs beside its emptyDir at /tmp: an image's own files are
/// never hidden by its volumes. The program is a script, so its
/// interpreter too must reach it. A program that only a volume brings is
/// found after the mounts.
fn a_volume_over_the_folder_of_the_program_does_not_hide_it() {
    block_on(async {
        let e = env("kubelet-hidden").await;
        let tools = e.dir.join("tools");
        let bin = tools.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let program = bin.join("hidden-hello");
        std::fs::write(
            &program,
            format!(
                "#!/bin/sh\necho hidden program ran\n\
                 test -e {} || echo its folder is covered\nexec sleep 1000\n",
                program.display()
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        let cover = json!([{"name": "cover", "mountPath": tools}]);
        // And one that only a volume brings, found after the mounts.
        let cms: Api<ConfigMap> = Api::namespaced(e.client.clone(), &e.ns.name);
        let cm = serde_json::from_value(json!({
            "metadata": {"name": "tools"},
            "data": {"from-volume": "#!/bin/sh\necho volume program ran\nexec sleep 1000\n"},
        }))
        .unwrap();
        cms.create(&PostParams::default(), &cm).await.unwrap();
        e.create_pod(json!({
            "metadata": {"name": "hidden"},
            "spec": {
                "volumes": [
                    {"name": "cover", "emptyDir": {}},
                    {"name": "tools", "configMap": {"name": "tools", "defaultMode": 0o755}},
                ],
                "containers": [
                    {"name": "from-volume", "image": SH, "command": ["/opt/e2e-tools/from-volume"],
                     "volumeMounts": [{"name": "tools", "mountPath": "/opt/e2e-tools"}]},
                    {"name": "by-name", "image": SH, "command": ["hidden-hello"],
                     "env": [{"name": "PATH", "value": format!("{}:/usr/bin:/bin", bin.display())}],
                     "volumeMounts": cover},
                    {"name": "by-path", "image": SH, "command": [program],
                     "volumeMounts": cover},
                ],
            },
        }))
        .await;
        let pod = e
            .wait_pod("hidden", "every container ready", |p| {
                condition(p, "Ready") == "True"
            })
            .await;
        let log = e.log(&pod, "from-volume", 0);
        assert!(
            log.lines().any(|l| l == "volume program ran"),
            "from-volume's log:\n{log}"
        );
        for container in ["by-name", "by-path"] {
            let log = e.log(&pod, container, 0);
            for line in ["hidden program ran", "its folder is covered"] {
                assert!(
                    log.lines().any(|l| l == line),
                    "{container}'s log has {line:?}:\n{log}"
                );
            }
        }
        e.done().await;
    });
}

fn pods_reach_listed_node_ports_at_their_gateway() {
    block_on(async {
        let e = env("kubelet-node").await;
        // A service of this machine, on loopback: it answers one line.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let served = std::thread::spawn(move || {
            use std::io::Write;
            let (mut conn, _) = listener.accept().unwrap();
            conn.write_all(b"hello from the node\n").unwrap();
        });
        let api: Api<ConfigMap> = Api::namespaced(e.client.clone(), "kube-system");
        let node = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "fake-kubelet-node", "namespace": "kube-system"},
            "data": {format!("e2e-{}", e.ns.name): port.to_string()},
        });
        api.patch(
            "fake-kubelet-node",
            &PatchParams::apply(&format!("e2e-{}", e.ns.name)).force(),
            &Patch::Apply(&node),
        )
        .await
        .unwrap();
        let read = format!(
            "import socket; s = socket.create_connection(('10.244.0.1', {port}), 5); \
             print(s.makefile().readline().strip())"
        );
        e.create_pod(json!({
            "metadata": {"name": "client"},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "client", "image": PYTHON, "args": ["-c", read],
            }]},
        }))
        .await;
        let pod = e
            .wait_pod("client", "the client pod to finish", |p| {
                p["status"]["phase"] == "Succeeded" || p["status"]["phase"] == "Failed"
            })
            .await;
        assert_eq!(
            pod["status"]["phase"],
            "Succeeded",
            "{}",
            e.log(&pod, "client", 0)
        );
        assert_eq!(e.log(&pod, "client", 0), "hello from the node\n");
        served.join().unwrap();
        let terminated = &container(&pod, "client")["state"]["terminated"];
        assert_eq!(terminated["reason"], "Completed", "{terminated}");
        // Applying nothing under this manager removes its key.
        let none = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "fake-kubelet-node", "namespace": "kube-system"},
        });
        api.patch(
            "fake-kubelet-node",
            &PatchParams::apply(&format!("e2e-{}", e.ns.name)).force(),
            &Patch::Apply(&none),
        )
        .await
        .unwrap();
        e.done().await;
    });
}
