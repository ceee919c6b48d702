//! Canaries on the real control plane: the Gateway API CRDs installed from
//! their pinned module, a real Prometheus (built from its module) scraping
//! an endpoint this test serves, and the operator with the RBAC users
//! install. No gateway data plane runs: the weights are read from the
//! HTTPRoute object itself, continuously, while the canary runs.

use std::convert::Infallible;
use std::net::TcpListener as StdListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use openmed_op::api::{CanaryState, OpenMedModelStatus, Phase};
use serde_json::json;

use crate::env::*;
use crate::support::*;
use crate::trial;

pub fn trials() -> Vec<libtest_mimic::Trial> {
    vec![
        trial(
            "canary::steps_then_promotes_and_the_route_ends_as_in_git",
            steps_then_promotes_and_the_route_ends_as_in_git,
        ),
        trial(
            "canary::a_resource_at_rest_with_a_canary_block_sends_no_requests",
            a_resource_at_rest_with_a_canary_block_sends_no_requests,
        ),
        trial(
            "canary::a_version_that_never_warms_aborts_with_the_weights_never_moved",
            a_version_that_never_warms_aborts_with_the_weights_never_moved,
        ),
        trial(
            "canary::a_failing_prometheus_query_aborts_after_the_failure_limit",
            a_failing_prometheus_query_aborts_after_the_failure_limit,
        ),
        trial(
            "canary::an_empty_query_result_pauses_until_there_is_data",
            an_empty_query_result_pauses_until_there_is_data,
        ),
        trial(
            "canary::an_analysis_endpoint_not_allowed_is_never_asked",
            an_analysis_endpoint_not_allowed_is_never_asked,
        ),
        trial(
            "canary::an_analysis_endpoint_that_never_answers_aborts_the_canary",
            an_analysis_endpoint_that_never_answers_aborts_the_canary,
        ),
        trial(
            "canary::a_route_rewritten_by_another_writer_pauses_and_is_not_clobbered",
            a_route_rewritten_by_another_writer_pauses_and_is_not_clobbered,
        ),
        trial(
            "canary::the_admission_policy_keeps_the_operator_to_the_weights",
            the_admission_policy_keeps_the_operator_to_the_weights,
        ),
        trial(
            "canary::the_cli_promotes_a_step_that_waits_and_aborts_the_next",
            the_cli_promotes_a_step_that_waits_and_aborts_the_next,
        ),
        trial(
            "canary::an_aborted_canarys_deployment_waits_for_the_gateway_to_take_the_weights",
            an_aborted_canarys_deployment_waits_for_the_gateway_to_take_the_weights,
        ),
        trial(
            "canary::a_mirror_step_copies_then_steps_and_the_filter_leaves_with_every_ending",
            a_mirror_step_copies_then_steps_and_the_filter_leaves_with_every_ending,
        ),
        trial(
            "canary::a_bump_during_a_soak_is_tried_on_the_canary_against_the_soaking_version",
            a_bump_during_a_soak_is_tried_on_the_canary_against_the_soaking_version,
        ),
    ]
}

/// The model's served set in Deployment `d`'s template.
pub(crate) fn served_set(d: &serde_json::Value) -> Vec<String> {
    d["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["name"] == "OPENMED_SERVICE_SERVED_MODELS")
        .and_then(|e| e["value"].as_str())
        .map(|v| v.split(',').map(str::to_owned).collect())
        .unwrap_or_default()
}

/// v2 promoted through the canary and soaking on the stable Deployment,
/// then v3: its canary starts against v2 at once, the stable Deployment
/// keeps serving v2, and v3 gets traffic only through the steps.
fn a_bump_during_a_soak_is_tried_on_the_canary_against_the_soaking_version() {
    block_on(async {
        let (env, v1) = stage(
            "canary-soak",
            "[{weight: 20, pause: 2s}, {weight: 60, pause: 2s}]",
            "",
            &[],
        )
        .await;
        env.set_spec("svc", json!({"rolloutStrategy": {"soakSeconds": 300}}))
            .await;
        let v2 = env.version("v2");
        env.set_spec("svc", json!({"version": v2})).await;
        trace(&env, "the canary to promote v2", |s| {
            s.phase == Some(Phase::Ready)
                && s.state == Some(CanaryState::Promoted)
                && s.weights == (100, 0)
        })
        .await;
        let s = env
            .wait_status("svc", "v2 soaking on the stable Deployment", |s| {
                s.active_version.as_deref() == Some(v2.as_str())
                    && s.conditions
                        .iter()
                        .any(|c| c.type_ == "Soaked" && c.reason == "Soaking")
            })
            .await;
        assert_eq!(s.last_successful_spec.unwrap().version, v1);
        let stable = env.deployment("svc").await;
        assert_eq!(served_set(&stable)[..2], [v2.clone(), v1.clone()]);

        let v3 = env.version("v3");
        env.set_spec("svc", json!({"version": v3})).await;
        let seen = trace(&env, "v3's first step", |s| s.weights == (80, 20)).await;
        assert!(
            seen.iter()
                .all(|s| s.weights == (100, 0) || s.weights == (80, 20)),
            "{seen:#?}"
        );
        let now = env.deployment("svc").await;
        assert_eq!(
            now["spec"]["template"], stable["spec"]["template"],
            "the stable Deployment keeps serving v2 while v3 is tried"
        );
        let events = env.events("svc").await;
        let started = events
            .iter()
            .find(|(reason, note, _)| reason == "CanaryStarted" && note.contains(v3.as_str()))
            .unwrap_or_else(|| panic!("no CanaryStarted for v3: {events:#?}"));
        assert!(
            started
                .1
                .contains(&format!("the stable Deployment serves {v2}")),
            "{}",
            started.1
        );
        assert!(
            !events
                .iter()
                .any(|(reason, note, _)| reason == "RolloutStarted" && note.contains(v3.as_str())),
            "v3 was rolled out on the stable Deployment: {events:#?}"
        );
        env.finish().await;
    });
}

/// Writes the route's status as a Gateway controller does: its Gateway
/// accepted `generation` of the route.
async fn gateway_reports(env: &Env, generation: i64) {
    let status = json!({"status": {"parents": [{
        "parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "gw"},
        "controllerName": "example.com/test-gateway",
        "conditions": [{
            "type": "Accepted", "status": "True", "reason": "Accepted", "message": "",
            "observedGeneration": generation, "lastTransitionTime": "2026-01-01T00:00:00Z",
        }],
    }]}});
    routes(env)
        .patch_status(
            "svc",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(status),
        )
        .await
        .expect("the route's status is written");
}

/// The canary Deployment's generation, and whether the canary's status
/// says it drained.
async fn canary_moved(env: &Env) -> (i64, bool) {
    let d = env.deployment("svc-canary").await;
    let drained = env
        .status("svc")
        .await
        .canary
        .is_some_and(|c| c.drained_time.is_some());
    (d["metadata"]["generation"].as_i64().unwrap(), drained)
}

fn an_aborted_canarys_deployment_waits_for_the_gateway_to_take_the_weights() {
    block_on(async {
        let (env, v1) = stage("canary-drain", "[{weight: 10, pause: 1h}]", "", &[]).await;
        let (_, generation) = route_state(&env).await;
        gateway_reports(&env, generation).await;
        env.set_spec("svc", json!({"version": env.version("v2")}))
            .await;
        trace(&env, "the first step", |s| s.weights == (90, 10)).await;
        let (_, stepped) = route_state(&env).await;
        gateway_reports(&env, stepped).await;
        let (warm, _) = canary_moved(&env).await;

        env.models()
            .patch(
                "svc",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(
                    json!({"metadata": {"annotations": {"openmed.ai/canary-abort": "drain"}}}),
                ),
            )
            .await
            .unwrap();
        trace(&env, "the weights to go back", |s| s.weights == (100, 0)).await;
        // The Gateway still reports the step's generation: for three
        // resync periods the canary Deployment keeps its version.
        let started = std::time::Instant::now();
        while started.elapsed() < Duration::from_secs(6) {
            assert_eq!(
                canary_moved(&env).await,
                (warm, false),
                "the canary Deployment moved before the Gateway took the weights"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let (_, back) = route_state(&env).await;
        gateway_reports(&env, back).await;
        let moved = wait_until(
            "the canary Deployment to move back once the Gateway has the weights",
            ROLLOUT,
            || canary_moved(&env),
            |(generation, drained)| *generation > warm && *drained,
        )
        .await;
        assert_eq!(moved.0, warm + 1, "one write moves it back");
        let s = env.status("svc").await;
        assert_eq!(s.active_version.as_deref(), Some(v1.as_str()));
        let events = env.events("svc").await;
        assert!(
            events.iter().any(|(r, m, _)| r == "CanaryDrained"
                && m.ends_with("every Gateway accepted the route with the weights back")),
            "{events:?}"
        );
        env.finish().await;
    });
}

/// The folder `tests/canary/build` prints: `crds/` and `bin/prometheus`.
fn tools() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| built_tools("tests/canary/build"))
}

/// Installs the Gateway API CRDs once and waits until they are served.
pub(crate) fn gateway_api() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        let crds = tools().join("crds");
        let (ok, _, err) = kubectl(&["apply", "--server-side", "-f", crds.to_str().unwrap()]);
        assert!(ok, "installing the Gateway API CRDs: {err}");
        // `kubectl wait` fails outright on a CRD that has no conditions
        // yet; ask until it says Established, within a deadline.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let (_, established, _) = kubectl(&[
                "get",
                "crd/httproutes.gateway.networking.k8s.io",
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Established\")].status}",
            ]);
            if established.trim() == "True" {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the HTTPRoute CRD is not established after 60 s"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        // Every canary test runs with the policy that keeps the operator to
        // the weights.
        let policy = root().join("deploy/admission");
        let (ok, _, err) = kubectl(&["apply", "--server-side", "-k", policy.to_str().unwrap()]);
        assert!(ok, "installing deploy/admission: {err}");
    });
}

pub(crate) fn routes(env: &Env) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", "HTTPRoute");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "httproutes");
    Api::namespaced_with(env.client.clone(), &env.ns.name, &resource)
}

pub(crate) const ROUTE: &str = "apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: svc
spec:
  rules:
  - name: main
    backendRefs:
    - name: svc
      port: 8080
      weight: 100
    - name: svc-canary
      port: 8080
      weight: 0
";

/// The route's (stable, canary) weights and its generation.
pub(crate) async fn route_state(env: &Env) -> ((i64, i64), i64) {
    let route = serde_json::to_value(routes(env).get("svc").await.unwrap()).unwrap();
    let refs = &route["spec"]["rules"][0]["backendRefs"];
    (
        (
            refs[0]["weight"].as_i64().unwrap(),
            refs[1]["weight"].as_i64().unwrap(),
        ),
        route["metadata"]["generation"].as_i64().unwrap(),
    )
}

/// What one look at the canary saw.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    phase: Option<Phase>,
    state: Option<CanaryState>,
    step: i32,
    weights: (i64, i64),
    generation: i64,
}

/// Watches the model and the route together until `done`, keeping every
/// distinct combination, in order.
///
/// The route is read before the status. The operator stores a step in the
/// status before it writes the step's weights, so weights read first are
/// never ahead of the status read after them, and a combination that shows
/// weights ahead of their step is the operator's fault. Read the other way
/// round, both writes could land between the two reads and a correct
/// operator would look as if it moved traffic before the status said so.
async fn trace(env: &Env, what: &str, done: impl Fn(&Seen) -> bool) -> Vec<Seen> {
    let start = std::time::Instant::now();
    let mut seen: Vec<Seen> = Vec::new();
    loop {
        let (weights, generation) = route_state(env).await;
        let s = env.status("svc").await;
        let now = Seen {
            phase: s.phase,
            state: s.canary.as_ref().map(|c| c.state),
            step: s.canary.as_ref().map_or(0, |c| c.step),
            weights,
            generation,
        };
        if seen.last() != Some(&now) {
            seen.push(now.clone());
        }
        if done(&now) {
            return seen;
        }
        assert!(
            start.elapsed() < ROLLOUT * 2,
            "timed out waiting for {what} (operator log {}); seen: {seen:#?}\nlast status: {s:#?}",
            env.operator.log.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub(crate) fn canary_block(steps: &str, analysis: &str) -> String {
    format!(
        "  rolloutStrategy:
    progressDeadlineSeconds: 10
  canary:
    targetRef:
      name: svc-canary
    trafficRef:
      httpRoute: svc
      ruleName: main
      stableBackend: svc
      canaryBackend: svc-canary
    steps: {steps}
{analysis}"
    )
}

/// The namespace with the stable and canary Deployments, the route, and
/// the model Ready at `v1` with the canary block; returns the operator's
/// environment. The operator may call the analysis endpoints under
/// `allow` (`--analysis-allow`), and no others.
async fn stage(prefix: &str, steps: &str, analysis: &str, allow: &[&str]) -> (Env, String) {
    gateway_api();
    let args: Vec<&str> = allow
        .iter()
        .flat_map(|prefix| ["--analysis-allow", prefix])
        .collect();
    let env = Env::with_operator_args(prefix, &args).await;
    env.apply(&deployment_yaml("svc", "openmed-service", "boot"))
        .await;
    env.apply(&deployment_yaml("svc-canary", "openmed-service", "boot"))
        .await;
    env.apply(ROUTE).await;
    let v1 = env.version("v1");
    env.apply(&model_yaml("svc", &v1, &canary_block(steps, analysis)))
        .await;
    env.wait_ready("svc", &v1).await;
    (env, v1)
}

fn steps_then_promotes_and_the_route_ends_as_in_git() {
    block_on(async {
        let (env, v1) = stage(
            "canary",
            "[{weight: 10, pause: 3s}, {weight: 50, pause: 3s}]",
            "",
            &[],
        )
        .await;
        let stable_before = env.deployment("svc").await["metadata"]["generation"].clone();
        let v2 = env.version("v2");
        env.set_spec("svc", json!({"version": v2})).await;
        let seen = trace(&env, "the canary to promote v2", |s| {
            s.phase == Some(Phase::Ready)
                && s.state == Some(CanaryState::Promoted)
                && s.weights == (100, 0)
        })
        .await;
        // Every step's weights were on the route while the status said so;
        // no traffic moved before the canary was warm; the stable one did
        // not roll before the promotion.
        let at = |state: CanaryState, step: i32| {
            seen.iter()
                .filter(|s| {
                    s.state == Some(state) && s.step == step && s.phase == Some(Phase::Canary)
                })
                .map(|s| s.weights)
                .collect::<Vec<_>>()
        };
        assert!(
            at(CanaryState::Warming, 0).iter().all(|w| *w == (100, 0)),
            "{seen:#?}"
        );
        assert!(
            at(CanaryState::Progressing, 1).contains(&(90, 10)),
            "{seen:#?}"
        );
        assert!(
            at(CanaryState::Progressing, 2).contains(&(50, 50)),
            "{seen:#?}"
        );
        let order: Vec<(i64, i64)> = seen.iter().map(|s| s.weights).fold(Vec::new(), |mut v, w| {
            if v.last() != Some(&w) {
                v.push(w);
            }
            v
        });
        assert_eq!(order, [(100, 0), (90, 10), (50, 50), (100, 0)], "{seen:#?}");
        let s = env.status("svc").await;
        assert_eq!(s.active_version.as_deref(), Some(v2.as_str()));
        assert_eq!(s.last_successful_spec.unwrap().version, v2);
        assert_eq!(s.previous_successful_spec.unwrap().version, v1);
        assert_ne!(
            env.deployment("svc").await["metadata"]["generation"],
            stable_before,
            "the stable Deployment rolled at the promotion"
        );
        // Events are recorded after the writes of the decision they tell
        // of, so the last may follow the status that shows it.
        wait_until(
            "every step of the canary in the resource's events",
            ROLLOUT,
            || env.event_reasons("svc"),
            |reasons| {
                [
                    "CanaryStarted",
                    "CanaryWeightChanged",
                    "CanaryPromoting",
                    "CanaryPromoted",
                ]
                .iter()
                .all(|r| reasons.iter().any(|(x, _)| x == r))
            },
        )
        .await;
        env.finish().await;
    });
}

/// A canary block costs nothing while no canary runs: the route is read
/// only while weights or a mirror may be on it, so a resource at rest sends
/// no request on any of its resyncs (the route's own changes still reach
/// it through the watch).
fn a_resource_at_rest_with_a_canary_block_sends_no_requests() {
    block_on(async {
        let (env, _) = stage("canary-rest", "[{weight: 10, pause: 3s}]", "", &[]).await;
        // Ten resync periods of 2 s at rest, after the first rollout's
        // last writes settle into the caches.
        let requests = requests_at_rest(
            &env.ns.name,
            Duration::from_secs(3),
            Duration::from_secs(20),
        )
        .await;
        assert!(
            requests.is_empty(),
            "the operator sent requests for a resource at rest:\n{}",
            requests.join("\n")
        );
        env.finish().await;
    });
}

fn a_version_that_never_warms_aborts_with_the_weights_never_moved() {
    block_on(async {
        let (env, v1) = stage("canary-cold", "[{weight: 10, pause: 3s}]", "", &[]).await;
        let bad = env.version("bad");
        mark_unready(&env.client, &[&bad]).await;
        let stable = env.deployment("svc").await;
        let (_, generation) = route_state(&env).await;
        env.set_spec("svc", json!({"version": bad})).await;
        let seen = trace(&env, "the canary to abort", |s| {
            s.state == Some(CanaryState::Aborted) && s.phase == Some(Phase::RolledBack)
        })
        .await;
        assert!(
            seen.iter()
                .all(|s| s.weights == (100, 0) && s.generation == generation),
            "the route was never written: {seen:#?}"
        );
        let s: OpenMedModelStatus = env.status("svc").await;
        assert_eq!(s.desired_version.as_deref(), Some(bad.as_str()));
        assert_eq!(s.active_version.as_deref(), Some(v1.as_str()));
        let rolled_back = s
            .conditions
            .iter()
            .find(|c| c.type_ == "RolledBack")
            .unwrap();
        assert_eq!(rolled_back.reason, "CanaryAborted");
        assert_eq!(
            env.deployment("svc").await["metadata"]["generation"],
            stable["metadata"]["generation"],
            "the stable Deployment was never touched"
        );
        env.finish().await;
    });
}

/// A metrics endpoint this test controls, and a Prometheus scraping it
/// every second.
struct Prometheus {
    child: Child,
    address: String,
    exposed: Arc<Mutex<String>>,
    _data: tempfile::TempDir,
}

impl Prometheus {
    async fn start(exposed: &str) -> Self {
        // reqwest (for the readiness check) uses the process's rustls provider.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let exposed = Arc::new(Mutex::new(exposed.to_owned()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = listener.local_addr().unwrap();
        let served = exposed.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let served = served.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |_: Request<hyper::body::Incoming>| {
                        let body = served.lock().unwrap().clone();
                        // Prometheus 3 refuses a scrape without the
                        // text format's content type.
                        let answer = Response::builder()
                            .header("content-type", "text/plain; version=0.0.4; charset=utf-8")
                            .body(Full::new(Bytes::from(body)))
                            .unwrap();
                        async move { Ok::<_, Infallible>(answer) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        let data = tempfile::tempdir().unwrap();
        let config = data.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\nscrape_configs:\n- job_name: canary\n  static_configs:\n  - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let port = StdListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let address = format!("http://127.0.0.1:{port}");
        let log = std::fs::File::create(data.path().join("prometheus.log")).unwrap();
        let child = Command::new(tools().join("bin/prometheus"))
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                data.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("prometheus starts");
        let ready = format!("{address}/-/ready");
        wait_for(
            "Prometheus to be ready",
            Duration::from_secs(60),
            || async {
                let ok = reqwest::get(&ready).await.ok()?.status().is_success();
                ok.then_some(())
            },
        )
        .await;
        Prometheus {
            child,
            address,
            exposed,
            _data: data,
        }
    }

    /// Waits until Prometheus has scraped `series` at least once.
    async fn scraped(&self, series: &str) {
        let url = format!("{}/api/v1/query", self.address);
        wait_for(
            "Prometheus to scrape the test endpoint",
            Duration::from_secs(60),
            || async {
                let answer: serde_json::Value = reqwest::Client::new()
                    .get(&url)
                    .query(&[("query", series)])
                    .send()
                    .await
                    .ok()?
                    .json()
                    .await
                    .ok()?;
                let found = answer["data"]["result"]
                    .as_array()
                    .is_some_and(|r| !r.is_empty());
                found.then_some(())
            },
        )
        .await;
    }

    fn expose(&self, text: &str) {
        *self.exposed.lock().unwrap() = text.to_owned();
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn error_rate_analysis(address: &str, failure_limit: i32) -> String {
    format!(
        "    analysis:
      interval: 1s
      failureLimit: {failure_limit}
      metrics:
      - name: error-rate
        prometheus:
          address: {address}
          query: canary_error_ratio{{service=\"{{{{canary}}}}\"}}
        thresholdRange: {{max: 0.01}}
"
    )
}

fn a_failing_prometheus_query_aborts_after_the_failure_limit() {
    block_on(async {
        let prometheus =
            Prometheus::start("canary_error_ratio{service=\"svc-canary\"} 0.5\n").await;
        // The series is there before the change: a first round without data
        // would be inconclusive, not a failure.
        prometheus.scraped("canary_error_ratio").await;
        let analysis = error_rate_analysis(&prometheus.address, 1);
        let (env, _) = stage(
            "canary-fail",
            "[{weight: 10, pause: 2s}, {weight: 50, pause: 2s}]",
            &analysis,
            &[&prometheus.address],
        )
        .await;
        env.set_spec("svc", json!({"version": env.version("v2")}))
            .await;
        let seen = trace(&env, "the analysis to abort the canary", |s| {
            s.state == Some(CanaryState::Aborted) && s.weights == (100, 0)
        })
        .await;
        assert!(
            seen.iter().all(|s| s.step <= 1),
            "never past step 1: {seen:#?}"
        );
        let s = env.status("svc").await;
        let c = s.canary.unwrap();
        assert_eq!(c.failures, 2, "{:?}", c.analysis);
        assert!(
            c.analysis
                .iter()
                .all(|r| r.message.contains("0.5 is outside")),
            "{:?}",
            c.analysis
        );
        assert_eq!(s.phase, Some(Phase::RolledBack));
        env.wait_event("svc", "AnalysisFailed").await;
        env.finish().await;
    });
}

fn an_empty_query_result_pauses_until_there_is_data() {
    block_on(async {
        let prometheus =
            Prometheus::start("canary_error_ratio{service=\"someone-else\"} 0\n").await;
        // The series is there before the change: a first round without data
        // would be inconclusive, not a failure.
        prometheus.scraped("canary_error_ratio").await;
        let analysis = error_rate_analysis(&prometheus.address, 0);
        let (env, _) = stage(
            "canary-nodata",
            "[{weight: 10, pause: 1s}, {weight: 50, pause: 1s}]",
            &analysis,
            &[&prometheus.address],
        )
        .await;
        env.set_spec("svc", json!({"version": env.version("v2")}))
            .await;
        let s = env
            .wait_status("svc", "the canary to pause on missing data", |s| {
                s.canary
                    .as_ref()
                    .is_some_and(|c| c.state == CanaryState::Paused && c.analysis.len() >= 3)
            })
            .await;
        // Three rounds (two intervals past the pause) without data: held.
        let c = s.canary.unwrap();
        assert_eq!((c.step, c.failures), (1, 0));
        assert!(c.message.contains("no data"), "{}", c.message);
        let stalled = s.conditions.iter().find(|c| c.type_ == "Stalled").unwrap();
        assert_eq!(
            (stalled.status.as_str(), stalled.reason.as_str()),
            ("True", "AnalysisInconclusive")
        );
        assert_eq!(route_state(&env).await.0, (90, 10));
        prometheus.expose("canary_error_ratio{service=\"svc-canary\"} 0.001\n");
        trace(&env, "the canary to go on once data passes", |s| {
            s.step == 2 && s.weights == (50, 50)
        })
        .await;
        env.finish().await;
    });
}

/// A webhook on loopback that answers 200 and counts what it is asked.
async fn counting_webhook() -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = asked.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let counter = counter.clone();
            tokio::spawn(async move {
                let service = service_fn(move |_: Request<hyper::body::Incoming>| {
                    counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    async move { Ok::<_, Infallible>(Response::new(Full::new(Bytes::new()))) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (address, asked)
}

fn an_analysis_endpoint_not_allowed_is_never_asked() {
    block_on(async {
        let (webhook, asked) = counting_webhook().await;
        let analysis = format!(
            "    analysis:
      interval: 1s
      webhooks:
      - name: smoke
        url: {webhook}/hook?key=s3cr3t
"
        );
        // The webhook's host and port, but another path.
        let (env, _) = stage(
            "canary-refused",
            "[{weight: 10, pause: 1s}]",
            &analysis,
            &[&format!("{webhook}/other")],
        )
        .await;
        env.set_spec("svc", json!({"version": env.version("v2")}))
            .await;
        let s = env
            .wait_status("svc", "the step to hold on the refused webhook", |s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Stalled" && c.reason == "AnalysisEndpointNotAllowed")
            })
            .await;
        let c = s.canary.unwrap();
        assert_eq!((c.state, c.step, c.failures), (CanaryState::Paused, 1, 0));
        assert!(c.analysis.is_empty(), "{:?}", c.analysis);
        assert!(
            c.message
                .contains(&format!("webhook smoke: {webhook}/hook?***")),
            "{}",
            c.message
        );
        assert_eq!(
            route_state(&env).await.0,
            (100, 0),
            "held with no traffic: nothing can judge the model"
        );
        env.wait_event("svc", "AnalysisEndpointNotAllowed").await;
        let events = env.events("svc").await;
        assert!(
            events.iter().all(|(_, note, _)| !note.contains("s3cr3t")),
            "{events:?}"
        );
        assert_eq!(
            asked.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "nothing was sent"
        );
        env.finish().await;
    });
}

/// A webhook on loopback that accepts connections and never answers; it
/// lets them go after two minutes, so nothing outlives the test.
async fn silent_webhook() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let until = tokio::time::Instant::now() + Duration::from_secs(120);
        let mut held = Vec::new();
        while let Ok(Ok((stream, _))) = tokio::time::timeout_at(until, listener.accept()).await {
            held.push(stream);
        }
    });
    address
}

fn an_analysis_endpoint_that_never_answers_aborts_the_canary() {
    block_on(async {
        let webhook = silent_webhook().await;
        let analysis = format!(
            "    analysis:
      interval: 1s
      webhooks:
      - name: silent
        url: {webhook}/hook
        timeout: 1s
"
        );
        let (env, _) = stage(
            "canary-silent",
            "[{weight: 10, pause: 10m}]",
            &analysis,
            &[&webhook],
        )
        .await;
        env.set_spec("svc", json!({"version": env.version("v2")}))
            .await;
        let s = env
            .wait_status(
                "svc",
                "the canary to abort on a webhook that never answers",
                |s| {
                    s.canary
                        .as_ref()
                        .is_some_and(|c| c.state == CanaryState::Aborted)
                },
            )
            .await;
        let c = s.canary.unwrap();
        assert!(
            c.message.contains("no answer 4 rounds in a row"),
            "{}",
            c.message
        );
        assert_eq!(c.failures, 0, "no answer is no failure");
        env.wait_status("svc", "the weights back", |s| {
            s.canary
                .as_ref()
                .is_some_and(|c| c.weights_back_time.is_some())
        })
        .await;
        assert_eq!(route_state(&env).await.0, (100, 0));
        env.finish().await;
    });
}

fn a_route_rewritten_by_another_writer_pauses_and_is_not_clobbered() {
    block_on(async {
        let (env, _) = stage("canary-drift", "[{weight: 10, pause: 10m}]", "", &[]).await;
        env.set_spec("svc", json!({"version": env.version("v2")}))
            .await;
        trace(&env, "the first step", |s| {
            s.step == 1 && s.weights == (90, 10) && s.state == Some(CanaryState::Progressing)
        })
        .await;
        // A GitOps sync writes Git's weights back.
        let sync = json!({"spec": {"rules": [{"name": "main", "backendRefs": [
            {"name": "svc", "port": 8080, "weight": 100},
            {"name": "svc-canary", "port": 8080, "weight": 0}]}]}});
        routes(&env)
            .patch("svc", &PatchParams::default(), &Patch::Merge(&sync))
            .await
            .unwrap();
        let (_, synced) = route_state(&env).await;
        let s = env
            .wait_status("svc", "RouteDrift", |s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Stalled" && c.reason == "RouteDrift")
            })
            .await;
        assert!(
            s.canary
                .unwrap()
                .message
                .contains("/spec/rules/0/backendRefs/*/weight")
        );
        env.wait_event("svc", "RouteDrift").await;
        // The decision that saw the drift wrote nothing.
        assert_eq!(route_state(&env).await, ((100, 0), synced));
        env.finish().await;
    });
}

/// `openmed-op ...` against the test cluster, as its admin.
fn cli(env: &Env, args: &[&str]) -> std::process::Output {
    Command::new(binary())
        .args(args)
        .args(["-n", &env.ns.name, "--timeout", "30s"])
        .env("KUBECONFIG", kubeconfig())
        .output()
        .expect("openmed-op runs")
}

fn the_cli_promotes_a_step_that_waits_and_aborts_the_next() {
    block_on(async {
        let (env, v1) = stage("canary-cli", "[{weight: 10}, {weight: 50}]", "", &[]).await;
        // Nothing to act on before a canary.
        let out = cli(&env, &["canary", "promote", "svc"]);
        assert_eq!(out.status.code(), Some(1));
        assert!(String::from_utf8_lossy(&out.stderr).contains("no canary in progress"));

        env.set_spec("svc", json!({"version": env.version("v2")}))
            .await;
        env.wait_status("svc", "the first step to wait for a promote", |s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Stalled" && c.reason == "CanaryPaused")
        })
        .await;
        assert_eq!(route_state(&env).await.0, (90, 10));
        // The top-level form, as `kubectl openmed promote`.
        let out = cli(&env, &["promote", "svc"]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(said.contains("step 2"), "{said}");
        // The status records the promote before the weights are written.
        trace(&env, "the second step's weights", |s| s.weights == (50, 50)).await;

        let out = cli(&env, &["abort", "svc"]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let s = env
            .wait_status("svc", "the abort", |s| {
                s.canary
                    .as_ref()
                    .is_some_and(|c| c.state == CanaryState::Aborted)
            })
            .await;
        assert_eq!(s.active_version.as_deref(), Some(v1.as_str()));
        trace(&env, "the weights to go back", |s| s.weights == (100, 0)).await;

        // The abort annotation stays on the object; the next version's
        // canary runs all the same.
        let v3 = env.version("v3");
        env.set_spec("svc", json!({"version": v3})).await;
        let s = env
            .wait_status("svc", "the next canary to wait at step 1 (or abort)", |s| {
                s.canary.as_ref().is_some_and(|c| {
                    c.version == v3
                        && (c.state == CanaryState::Aborted
                            || (c.state == CanaryState::Paused && c.step == 1))
                })
            })
            .await;
        let c = s.canary.unwrap();
        assert_eq!(c.state, CanaryState::Paused, "{}", c.message);
        assert_eq!(route_state(&env).await.0, (90, 10));
        env.finish().await;
    });
}

fn the_admission_policy_keeps_the_operator_to_the_weights() {
    block_on(async {
        gateway_api();
        let env = Env::new("canary-policy").await;
        env.apply(ROUTE).await;
        let operator = client_for(&kubeconfig(), Some(OPERATOR_IDENTITY)).await;
        let gvk = GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", "HTTPRoute");
        let resource = ApiResource::from_gvk_with_plural(&gvk, "httproutes");
        let as_operator: Api<DynamicObject> =
            Api::namespaced_with(operator, &env.ns.name, &resource);
        let patch = |ops: serde_json::Value| {
            let ops: json_patch::Patch = serde_json::from_value(ops).unwrap();
            Patch::Json::<()>(ops)
        };
        let params = PatchParams::default();
        // The weights: allowed.
        as_operator
            .patch(
                "svc",
                &params,
                &patch(json!([
                    {"op": "replace", "path": "/spec/rules/0/backendRefs/0/weight", "value": 90},
                    {"op": "replace", "path": "/spec/rules/0/backendRefs/1/weight", "value": 10},
                ])),
            )
            .await
            .expect("the operator may move the weights");
        assert_eq!(route_state(&env).await.0, (90, 10));
        // A mirror of the rule to its own canary backend, and its removal:
        // allowed.
        let mirror = |name: &str| {
            json!({"type": "RequestMirror", "requestMirror": {
                "backendRef": {"name": name, "port": 8080}, "percent": 50}})
        };
        as_operator
            .patch(
                "svc",
                &params,
                &patch(json!([{"op": "add", "path": "/spec/rules/0/filters", "value": [mirror("svc-canary")]}])),
            )
            .await
            .expect("the operator may mirror the rule to its canary backend");
        as_operator
            .patch(
                "svc",
                &params,
                &patch(json!([{"op": "remove", "path": "/spec/rules/0/filters"}])),
            )
            .await
            .expect("the operator may remove its mirror");
        // Anything else: denied, and the route stays as it was.
        for (what, ops) in [
            (
                "a mirror to a Service the rule does not send to",
                json!([{"op": "add", "path": "/spec/rules/0/filters", "value": [mirror("elsewhere")]}]),
            ),
            (
                "a mirror to another port of the canary",
                json!([{"op": "add", "path": "/spec/rules/0/filters", "value": [{
                    "type": "RequestMirror", "requestMirror": {
                        "backendRef": {"name": "svc-canary", "port": 9090}, "percent": 50}}]}]),
            ),
            (
                "another filter",
                json!([{"op": "add", "path": "/spec/rules/0/filters", "value": [{
                    "type": "RequestHeaderModifier",
                    "requestHeaderModifier": {"set": [{"name": "x-a", "value": "1"}]}}]}]),
            ),
            (
                "a match",
                json!([{"op": "add", "path": "/spec/rules/0/matches",
                                "value": [{"path": {"type": "PathPrefix", "value": "/admin"}}]}]),
            ),
            (
                "a backend",
                json!([{"op": "replace", "path": "/spec/rules/0/backendRefs/1/name", "value": "elsewhere"}]),
            ),
            (
                "a new backend",
                json!([{"op": "add", "path": "/spec/rules/0/backendRefs/-",
                                      "value": {"name": "elsewhere", "port": 80, "weight": 1}}]),
            ),
            (
                "a label",
                json!([{"op": "add", "path": "/metadata/labels", "value": {"x": "y"}}]),
            ),
        ] {
            let Err(kube::Error::Api(status)) =
                as_operator.patch("svc", &params, &patch(ops)).await
            else {
                panic!("the policy let the operator change {what}");
            };
            assert!(
                status.message.contains("may change only backend weights"),
                "{what}: {status:?}"
            );
        }
        assert_eq!(route_state(&env).await.0, (90, 10));
        let route = serde_json::to_value(routes(&env).get("svc").await.unwrap()).unwrap();
        assert!(
            route["spec"]["rules"][0].get("filters").is_none(),
            "{route}"
        );
        // Others are not matched: an admin may still change the route.
        routes(&env)
            .patch(
                "svc",
                &params,
                &patch(json!([{"op": "replace", "path": "/spec/rules/0/backendRefs/1/port", "value": 8081}])),
            )
            .await
            .expect("an admin is not subject to the policy");
        env.finish().await;
    });
}

/// The percent the main rule mirrors to the canary backend, as the route
/// shows it, and the weights.
async fn mirror_state(env: &Env) -> (Option<i64>, (i64, i64)) {
    let route = serde_json::to_value(routes(env).get("svc").await.unwrap()).unwrap();
    let rule = &route["spec"]["rules"][0];
    let mirror = rule["filters"].as_array().and_then(|f| {
        f.iter()
            .find(|f| f["requestMirror"]["backendRef"]["name"] == "svc-canary")
            .map(|f| f["requestMirror"]["percent"].as_i64().unwrap_or(100))
    });
    let refs = &rule["backendRefs"];
    (
        mirror,
        (
            refs[0]["weight"].as_i64().unwrap(),
            refs[1]["weight"].as_i64().unwrap(),
        ),
    )
}

/// Every distinct (mirror, weights) the route showed until `done` said so
/// of the model's status and the route. The route is read first, as in
/// [`trace`]: the status records a step before the route carries it, so a
/// status that says a canary is over may come a moment before the route
/// shows its weights back, never after.
async fn mirror_trace(
    env: &Env,
    what: &str,
    done: impl Fn(&OpenMedModelStatus, &(Option<i64>, (i64, i64))) -> bool,
) -> Vec<(Option<i64>, (i64, i64))> {
    let start = std::time::Instant::now();
    let mut seen = Vec::new();
    loop {
        let now = mirror_state(env).await;
        let s = env.status("svc").await;
        if seen.last() != Some(&now) {
            seen.push(now);
        }
        if done(&s, &now) {
            return seen;
        }
        assert!(
            start.elapsed() < ROLLOUT * 2,
            "timed out waiting for {what} (operator log {}); seen: {seen:?}\nlast status: {s:#?}",
            env.operator.log.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn a_mirror_step_copies_then_steps_and_the_filter_leaves_with_every_ending() {
    block_on(async {
        // Under the admission policy, as every canary test here.
        let (env, _) = stage(
            "canary-mirror",
            "[{mirror: 100, pause: 3s}, {weight: 20, pause: 3s}]",
            "",
            &[],
        )
        .await;
        let git = serde_json::to_value(routes(&env).get("svc").await.unwrap()).unwrap();
        let v2 = env.version("v2");
        env.set_spec("svc", json!({"version": v2})).await;
        let seen = mirror_trace(&env, "the canary to promote v2", |s, route| {
            s.phase == Some(Phase::Ready)
                && s.canary
                    .as_ref()
                    .is_some_and(|c| c.state == CanaryState::Promoted)
                && *route == (None, (100, 0))
        })
        .await;
        assert_eq!(
            seen,
            [
                (None, (100, 0)),
                (Some(100), (100, 0)),
                (None, (80, 20)),
                (None, (100, 0))
            ],
            "mirrored before any request was served by the canary, then weighted"
        );
        let after = serde_json::to_value(routes(&env).get("svc").await.unwrap()).unwrap();
        assert_eq!(after["spec"], git["spec"], "the route ends as in Git");

        // An abort in the mirror step removes the filter.
        let v3 = env.version("v3");
        env.set_spec("svc", json!({"version": v3})).await;
        mirror_trace(&env, "the mirror step of v3", |s, _| {
            s.canary
                .as_ref()
                .is_some_and(|c| c.version == v3 && c.mirror == Some(100))
        })
        .await;
        // The status records a step before its write: the route follows.
        wait_until(
            "the route to carry the mirror of v3",
            ROLLOUT,
            || mirror_state(&env),
            |(mirror, _)| *mirror == Some(100),
        )
        .await;
        let ok = cli(&env, &["abort", "svc"]).status.success();
        assert!(ok, "openmed-op abort");
        // The abort's status comes a moment before the route's patch: wait
        // for both, then the whole route must be Git's again.
        mirror_trace(&env, "the abort of v3", |s, route| {
            s.canary
                .as_ref()
                .is_some_and(|c| c.state == CanaryState::Aborted && c.drained_time.is_some())
                && *route == (None, (100, 0))
        })
        .await;
        let after = serde_json::to_value(routes(&env).get("svc").await.unwrap()).unwrap();
        assert_eq!(after["spec"], git["spec"], "the route ends as in Git");
        env.finish().await;
    });
}
