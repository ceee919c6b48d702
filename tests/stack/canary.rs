//! Canaries on real traffic: `examples/real/canary` (a stable and a canary
//! Deployment of the real service, one HTTPRoute rule with both as
//! backends) under load through Envoy Gateway, the analysis reading
//! Envoy's own request statistics from Prometheus and the canary's pods
//! answering the probe set.
//!
//! Each test records the route's weights and the canary's state as they
//! change (a poll every 200 ms), and judges every request the load sent by
//! what was on the route when it was sent.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use libtest_mimic::Trial;
use openmed_load::Record;
use openmed_op::api::{CanaryState, OpenMedModelStatus, Outcome, Phase};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::app::*;
use crate::env::Env;
use crate::gauges::export_gauges;
use crate::support::*;
use crate::trial;

pub fn trials() -> Vec<Trial> {
    let mut trials = vec![
        // It accepts no failed request. Opt-in until 2026-12-05 after a
        // rare 503 from Envoy itself (docs/canary.md); since the Gateway
        // closes idle connections first it ran 27 times without one
        // (benches/results/2026-12-0[35]-stack-canary*.jsonl).
        trial(
            "canary::the_split_is_real_and_the_promotion_drops_nothing",
            the_split_is_real_and_the_promotion_drops_nothing,
        ),
        trial(
            "canary::a_canary_that_serves_errors_is_aborted_by_the_data_planes_metrics",
            a_canary_that_serves_errors_is_aborted_by_the_data_planes_metrics,
        ),
        trial(
            "canary::no_data_holds_and_an_abort_moves_the_canary_back_once_drained",
            no_data_holds_and_an_abort_moves_the_canary_back_once_drained,
        ),
        trial(
            "canary::a_model_that_misses_dates_is_aborted_by_the_probes",
            a_model_that_misses_dates_is_aborted_by_the_probes,
        ),
        trial(
            "canary::a_mirror_step_copies_requests_to_the_canary_and_every_client_gets_the_stable_model",
            a_mirror_step_copies_requests_to_the_canary_and_every_client_gets_the_stable_model,
        ),
    ];
    // Ten stable pods and their canary: a longer run, for the committed
    // results (docs/autoscaling.md).
    if std::env::var_os("AUTOSCALE_ALL").is_some() {
        trials.push(trial(
            "canary::an_autoscaled_canary_at_20_percent_runs_a_fifth_of_the_pods",
            an_autoscaled_canary_at_20_percent_runs_a_fifth_of_the_pods,
        ));
    }
    trials
}

/// Warms, passes `/readyz`, and answers every request with an error.
const FAILS: &str = "OpenMed/synthetic-pii-fails";
/// Warms, answers every request, and never tags a date.
const MISSES_DATE: &str = "OpenMed/synthetic-pii-misses-date";
const CANARY: &str = "openmed-service-canary";

/// Prometheus as the operator on the pod network reaches it.
fn prometheus() -> String {
    let port = workload_port("PROMETHEUS_PORT");
    format!("http://{POD_GATEWAY}:{port}")
}

/// A document of the example, without its namespace.
fn documents(file: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(root().join("examples/real/canary").join(file)).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap())
        .filter(|v| !v.is_null() && v["kind"] != "Namespace")
        .map(|mut v| {
            v["metadata"].as_object_mut().unwrap().remove("namespace");
            v
        })
        .collect()
}

/// The example's Prometheus query with its range cut to `range`, for
/// steps of seconds rather than minutes.
fn with_range(query: &str, range: &str) -> String {
    query.replace("[1m]", &format!("[{range}]"))
}

/// The data plane's request rate to the canary backend, 0 when it has no
/// series (Envoy drops a cluster no route uses).
/// A mirror step's copies count too (their own cluster, per rule).
const DRAIN_QUERY: &str = "sum(rate(envoy_cluster_upstream_rq_total{envoy_cluster_name=~\"service/{{namespace}}/{{canary}}/.+|httproute/{{namespace}}/{{route}}/rule/[0-9]+-mirror-[0-9]+\"}[5s])) or vector(0)";

/// `examples/real/canary` in a test's namespace, its operator on the pod
/// network (the probes reach pod addresses; Prometheus is forwarded there),
/// rolled out at `V1` on both Deployments.
struct CanaryApp {
    app: App,
}

impl CanaryApp {
    async fn deploy(prefix: &str, tune: impl FnOnce(&mut Value)) -> CanaryApp {
        Self::deploy_with(prefix, &[], |_| {}, |spec| tune(&mut spec["canary"])).await
    }

    /// [`CanaryApp::deploy`] with more arguments for the operator, each
    /// Deployment's document edited by `deployment`, and the model's spec
    /// by `tune`.
    async fn deploy_with(
        prefix: &str,
        operator_args: &[&str],
        deployment: impl Fn(&mut Value),
        tune: impl FnOnce(&mut Value),
    ) -> CanaryApp {
        let client = admin().await;
        install_crd(&client).await;
        let ns = TestNamespace::create(&client, prefix).await;
        let prometheus = prometheus();
        let mut args = vec!["--analysis-allow", &prometheus];
        args.extend_from_slice(operator_args);
        let operator = Operator::start_on_pod_network(&ns.name, &args);
        let env = Env::of(client, ns, operator);
        let mut service = documents("openmed-service.yaml");
        for doc in &mut service {
            if doc["kind"] == "Deployment" {
                deployment(doc);
            }
            if doc["kind"] == "HTTPRoute" {
                for rule in doc["spec"]["rules"].as_array_mut().unwrap() {
                    for m in rule["matches"].as_array_mut().unwrap() {
                        m["path"] =
                            json!({"type": "PathPrefix", "value": format!("/{}", env.ns.name)});
                    }
                    rule["filters"][0]["urlRewrite"]["path"] =
                        json!({"type": "ReplacePrefixMatch", "replacePrefixMatch": "/"});
                }
            }
        }
        env.apply(&yaml_stream(&service)).await;
        env.apply(&yaml_stream(&documents("probes.yaml"))).await;
        let mut model = documents("openmedmodel.yaml").remove(0);
        let canary = &mut model["spec"]["canary"];
        for metric in canary["analysis"]["metrics"].as_array_mut().unwrap() {
            metric["prometheus"]["address"] = json!(prometheus);
        }
        tune(&mut model["spec"]);
        env.apply(&yaml_stream(&[model])).await;
        env.wait_ready(NAME, V1).await;
        // At rest the canary Deployment serves the stable version too.
        let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), &env.ns.name);
        wait_for(
            "the canary Deployment to serve the stable version",
            Duration::from_secs(120),
            || async {
                let d = deployments.get(CANARY).await.ok()?;
                let template = serde_json::to_string(&d.spec.as_ref()?.template).ok()?;
                let s = d.status?;
                let settled = s.observed_generation == d.metadata.generation
                    && s.updated_replicas == Some(1)
                    && s.available_replicas == Some(1)
                    && s.replicas == Some(1)
                    && template.contains("OPENMED_SERVICE_PRELOAD_MODELS");
                settled.then_some(())
            },
        )
        .await;
        let url = routed(&env).await;
        CanaryApp {
            app: App { env, url },
        }
    }

    fn env(&self) -> &Env {
        &self.app.env
    }
}

/// The canary block's analysis for short steps: `interval`, the example's
/// error-rate query over `range`, and the probes kept or not.
fn short_analysis(canary: &mut Value, interval: &str, range: &str, probes: bool) {
    let analysis = &mut canary["analysis"];
    analysis["interval"] = json!(interval);
    let query = analysis["metrics"][0]["prometheus"]["query"]
        .as_str()
        .unwrap()
        .to_owned();
    analysis["metrics"][0]["prometheus"]["query"] = json!(with_range(&query, range));
    if !probes {
        analysis.as_object_mut().unwrap().remove("probes");
    }
}

fn with_drain(canary: &mut Value) {
    let address = canary["analysis"]["metrics"][0]["prometheus"]["address"].clone();
    canary["drain"] =
        json!({"prometheus": {"address": address, "query": DRAIN_QUERY}, "timeout": "1m"});
}

/// One look at the route, the canary and the canary Deployment.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    /// When, in ms since the epoch.
    at: f64,
    /// When the poll before saw it otherwise: the change happened in
    /// `(after, at]`.
    after: f64,
    /// (stable, canary) weights on the route.
    weights: (i64, i64),
    /// The percent the rule mirrors to the canary backend.
    mirror: Option<i64>,
    state: Option<CanaryState>,
    step: i32,
    /// The canary Deployment's generation.
    canary_generation: i64,
}

/// Every change of what [`Seen`] holds, from a poll every 200 ms until
/// stopped.
struct Trace {
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Trace {
    /// Starts the poll and returns once its first look is taken: that one
    /// shows the state before whatever the test changes next.
    async fn start(env: &Env) -> Trace {
        let gvk = GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", "HTTPRoute");
        let resource = ApiResource::from_gvk_with_plural(&gvk, "httproutes");
        let routes: Api<DynamicObject> =
            Api::namespaced_with(env.client.clone(), &env.ns.name, &resource);
        let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), &env.ns.name);
        let models = env.models();
        let seen = Arc::new(Mutex::new(Vec::<Seen>::new()));
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let kept = seen.clone();
        let task = tokio::spawn(async move {
            let mut last_poll = now_ms();
            // Bounded: a test that forgets to stop it ends it in 15 minutes.
            for _ in 0..4500 {
                if stopped.try_recv().is_ok() {
                    return;
                }
                let at = now_ms();
                let (Ok(route), Ok(model), Ok(canary)) = (
                    routes.get(NAME).await,
                    models.get(NAME).await,
                    deployments.get(CANARY).await,
                ) else {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                };
                let route = serde_json::to_value(route).unwrap();
                let refs = &route["spec"]["rules"][0]["backendRefs"];
                let mirror = route["spec"]["rules"][0]["filters"]
                    .as_array()
                    .and_then(|filters| {
                        filters
                            .iter()
                            .find(|f| f["requestMirror"]["backendRef"]["name"] == CANARY)
                    })
                    .map(|f| f["requestMirror"]["percent"].as_i64().unwrap_or(100));
                let c = model.status.and_then(|s| s.canary);
                let now = Seen {
                    at,
                    after: last_poll,
                    weights: (
                        refs[0]["weight"].as_i64().unwrap_or(1),
                        refs[1]["weight"].as_i64().unwrap_or(1),
                    ),
                    mirror,
                    state: c.as_ref().map(|c| c.state),
                    step: c.as_ref().map_or(0, |c| c.step),
                    canary_generation: canary.metadata.generation.unwrap_or(0),
                };
                {
                    let mut seen = kept.lock().unwrap();
                    let changed = seen.last().is_none_or(|last| {
                        (last.weights, last.mirror, last.state, last.step)
                            != (now.weights, now.mirror, now.state, now.step)
                            || last.canary_generation != now.canary_generation
                    });
                    if changed {
                        seen.push(now);
                    }
                }
                last_poll = at;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        let trace = Trace { seen, stop, task };
        wait_for(
            "the trace's first look",
            Duration::from_secs(60),
            || async { (!trace.seen.lock().unwrap().is_empty()).then_some(()) },
        )
        .await;
        trace
    }

    async fn stop(self) -> Vec<Seen> {
        let _ = self.stop.send(());
        let _ = self.task.await;
        self.seen.lock().unwrap().clone()
    }
}

/// When the route first showed `weights`, and when it next showed others.
fn span(seen: &[Seen], weights: (i64, i64)) -> Option<(f64, f64)> {
    let first = seen.iter().position(|s| s.weights == weights)?;
    let end = seen[first..]
        .iter()
        .find(|s| s.weights != weights)
        .map_or(f64::INFINITY, |s| s.at);
    Some((seen[first].at, end))
}

/// When the canary was first seen in `state`.
fn first_in(seen: &[Seen], state: CanaryState) -> Option<f64> {
    seen.iter().find(|s| s.state == Some(state)).map(|s| s.at)
}

/// How long the data plane takes to act on a weight the route shows
/// (Envoy Gateway translates the route and pushes it to Envoy): requests
/// sent in this time after a change are not counted for either side.
const PROPAGATION_MS: f64 = 2000.0;

/// The earliest the canary Deployment can have moved back after the
/// weights were seen back at `restored`: its first change after that look
/// (nothing else writes it once the weights are back).
fn moved_back(seen: &[Seen], restored: f64) -> Option<f64> {
    let at_restore = seen.iter().find(|s| s.at >= restored)?.canary_generation;
    seen.iter()
        .find(|s| s.at > restored && s.canary_generation > at_restore)
        .map(|s| s.after)
}

/// Waits until the trace shows the weights leaving `step` and then the
/// canary Deployment moving back.
async fn wait_moved_back(trace: &Trace, step: (i64, i64)) {
    wait_for(
        "the canary Deployment to move back after the weights",
        Duration::from_secs(120),
        || async {
            let seen = trace.seen.lock().unwrap().clone();
            let (_, restored) = span(&seen, step)?;
            moved_back(&seen, restored).map(|_| ())
        },
    )
    .await
}

/// From the weights back to the drain, as the status records them.
fn drain_seconds(c: &openmed_op::api::CanaryStatus) -> i64 {
    c.drained_time.as_ref().unwrap().0.as_second()
        - c.weights_back_time.as_ref().unwrap().0.as_second()
}

/// The records of requests answered by a canary pod.
fn from_canary(records: &[Record]) -> Vec<&Record> {
    records
        .iter()
        .filter(|r| r.pod.as_deref().is_some_and(|p| p.starts_with(CANARY)))
        .collect()
}

async fn wait_canary(app: &CanaryApp, what: &str, ok: impl FnMut(&OpenMedModelStatus) -> bool) {
    wait_until(
        what,
        Duration::from_secs(300),
        || app.env().status(NAME),
        ok,
    )
    .await;
}

fn canary_state(s: &OpenMedModelStatus) -> Option<CanaryState> {
    s.canary.as_ref().map(|c| c.state)
}

fn the_split_is_real_and_the_promotion_drops_nothing() {
    block_on(async {
        let app = CanaryApp::deploy("stack-canary", |canary| {
            // At least 400 requests per step, and at 50 % about 1,000 (the
            // share is then within 5 points at 3 standard deviations).
            canary["steps"] =
                json!([{"weight": 10, "pause": "25s"}, {"weight": 50, "pause": "55s"}]);
            short_analysis(canary, "10s", "20s", true);
        })
        .await;
        let trace = Trace::start(app.env()).await;
        let (stop, load) = app.app.load(None, 20.0, Duration::from_secs(420));
        tokio::time::sleep(Duration::from_secs(3)).await;
        let bumped = now_ms();
        app.env().set_spec(NAME, json!({"version": V2})).await;
        wait_canary(&app, "the canary to promote v2", |s| {
            s.phase == Some(Phase::Ready)
                && s.active_version.as_deref() == Some(V2)
                && canary_state(s) == Some(CanaryState::Promoted)
        })
        .await;
        let promoted = now_ms();
        tokio::time::sleep(Duration::from_secs(5)).await;
        let _ = stop.send(());
        let records = load.await.unwrap();
        let seen = trace.stop().await;

        assert_all_served(&records);
        let promoting = first_in(&seen, CanaryState::Promoting).expect("the canary promoted");
        let mut phases = Vec::new();
        let mut splits = Vec::new();
        for (weight, weights) in [(10, (90, 10)), (50, (50, 50))] {
            let (from, to) = span(&seen, weights)
                .unwrap_or_else(|| panic!("{weights:?} never on the route: {seen:#?}"));
            // The last step ends when the stable Deployment starts rolling.
            let to = to.min(promoting);
            let step = sent_between(&records, from + PROPAGATION_MS, to);
            let canary = step
                .iter()
                .filter(|r| r.model_name.as_deref() == Some(V2))
                .count();
            let share = 100.0 * canary as f64 / step.len().max(1) as f64;
            eprintln!(
                "  step {weight} %: {} requests over {:.1} s, {canary} answered by the canary ({share:.1} %)",
                step.len(),
                (to - from - PROPAGATION_MS) / 1000.0
            );
            assert!(
                step.len() >= 400,
                "at least 400 requests at {weight} %: {} ({seen:#?})",
                step.len()
            );
            assert!(
                (share - weight as f64).abs() <= 5.0,
                "{share:.1} % of the answers at {weight} % came from the canary"
            );
            phases.push(phase(&format!("step {weight} %"), &step));
            splits.push(
                json!({"weight": weight, "requests": step.len(), "canary_answers": canary,
                "canary_share_pct": (share * 10.0).round() / 10.0}),
            );
        }
        // Before any step, nothing from v2; after the weights went back,
        // every answer names v2.
        let first_step = seen
            .iter()
            .find(|s| s.weights == (90, 10))
            .map(|s| s.after)
            .unwrap();
        let before = sent_between(&records, 0.0, first_step);
        assert!(
            before.iter().all(|r| r.model_name.as_deref() == Some(V1)),
            "a v2 answer before the first step"
        );
        let (_, back) = span(&seen, (50, 50)).unwrap();
        let after = sent_between(&records, back + PROPAGATION_MS, f64::INFINITY);
        assert!(!after.is_empty());
        assert!(
            after.iter().all(|r| r.model_name.as_deref() == Some(V2)),
            "after the promotion every answer names v2"
        );
        // The canary Deployment serves v2 after the promotion as during it:
        // it was not touched after its warm-up.
        let generations: Vec<i64> = seen.iter().map(|s| s.canary_generation).collect();
        let warmed = generations[0];
        assert!(
            generations.iter().all(|g| *g <= warmed + 1),
            "the canary Deployment was written once (the warm-up): {generations:?}"
        );

        eprintln!("canary::the_split_is_real (20 requests/s through the Gateway):");
        phases.push(phase(
            "promotion (stable rolls) to Ready",
            &sent_between(&records, promoting, promoted),
        ));
        phases.push(phase("after the weights went back", &after));
        let took = (promoted - bumped) / 1000.0;
        eprintln!("  bump → promoted {took:.1} s");
        record_result(json!({
            "scenario": "canary_split_and_promotion", "rps": 20, "phases": phases,
            "splits": splits, "bump_to_promoted_s": (took * 10.0).round() / 10.0,
            "failed": records.iter().filter(|r| !r.ok()).count(), "requests": records.len(),
        }));
        app.app.env.finish().await;
    });
}

fn a_canary_that_serves_errors_is_aborted_by_the_data_planes_metrics() {
    block_on(async {
        let app = CanaryApp::deploy("stack-canary-errors", |canary| {
            canary["steps"] =
                json!([{"weight": 10, "pause": "60s"}, {"weight": 50, "pause": "60s"}]);
            short_analysis(canary, "5s", "10s", false);
            with_drain(canary);
        })
        .await;
        let trace = Trace::start(app.env()).await;
        let rps = 20.0;
        let (stop, load) = app.app.load(None, rps, Duration::from_secs(300));
        tokio::time::sleep(Duration::from_secs(3)).await;
        app.env().set_spec(NAME, json!({"version": FAILS})).await;
        wait_canary(
            &app,
            "the canary to abort and its Deployment to drain",
            |s| {
                canary_state(s) == Some(CanaryState::Aborted)
                    && s.canary.as_ref().is_some_and(|c| c.drained_time.is_some())
            },
        )
        .await;
        // The canary Deployment moves back after the drain; the load goes
        // on a little past it.
        wait_moved_back(&trace, (90, 10)).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let _ = stop.send(());
        let records = load.await.unwrap();
        let seen = trace.stop().await;
        let status = app.env().status(NAME).await;

        assert!(
            !seen.iter().any(|s| s.weights == (50, 50)),
            "aborted before the second step: {seen:#?}"
        );
        let (at_ten, restored) = span(&seen, (90, 10)).expect("the first step's weights");
        let failed: Vec<&Record> = records.iter().filter(|r| !r.ok()).collect();
        let expected = 0.1 * rps * (restored - at_ten) / 1000.0;
        eprintln!(
            "canary::errors: {} of {} requests failed; 10 % × {:.1} s at 10 % × {rps} requests/s = {expected:.1}",
            failed.len(),
            records.len(),
            (restored - at_ten) / 1000.0
        );
        assert!(!failed.is_empty(), "the canary got its share and failed it");
        assert!(
            (failed.len() as f64) <= 2.0 * expected + 10.0,
            "{} failed, near {expected:.1} expected",
            failed.len()
        );
        let late: Vec<&&Record> = failed
            .iter()
            .filter(|r| r.unix_ms as f64 >= restored + PROPAGATION_MS)
            .collect();
        assert!(
            late.is_empty(),
            "requests failed after the weights were back: {late:?}"
        );
        let last_failure = failed
            .iter()
            .map(|r| r.unix_ms as f64 - restored)
            .fold(f64::NEG_INFINITY, f64::max);
        // Traffic-verified: the canary Deployment changed only after the
        // last answer from its pods.
        let moved = moved_back(&seen, restored).expect("the canary Deployment moved back");
        let last_canary_answer = from_canary(&records)
            .iter()
            .map(|r| r.unix_ms as f64 + r.latency_ms)
            .fold(0.0, f64::max);
        assert!(
            last_canary_answer < moved,
            "the canary Deployment moved {:.0} ms before its last answer",
            last_canary_answer - moved
        );
        let c = status.canary.as_ref().unwrap();
        let drain_s = drain_seconds(c);
        let metric = c
            .analysis
            .iter()
            .find(|r| r.name == "error-rate" && r.outcome == Outcome::Fail)
            .expect("the error rate failed a round");
        eprintln!(
            "  weights at 10 % for {:.1} s; last failure {:.0} ms after the route showed the weights back; drained {drain_s} s after; moved {:.1} s after the last canary answer; {}",
            (restored - at_ten) / 1000.0,
            last_failure,
            (moved - last_canary_answer) / 1000.0,
            metric.message
        );
        record_result(json!({
            "scenario": "canary_errors_aborted_by_metrics", "rps": rps,
            "requests": records.len(), "failed": failed.len(), "expected_failed": (expected * 10.0).round() / 10.0,
            "at_10_pct_s": ((restored - at_ten) / 100.0).round() / 10.0,
            "last_failure_after_restore_ms": last_failure.round(),
            "drain_s": drain_s, "failed_round": metric.message,
        }));
        app.app.env.finish().await;
    });
}

fn no_data_holds_and_an_abort_moves_the_canary_back_once_drained() {
    block_on(async {
        let app = CanaryApp::deploy("stack-canary-nodata", |canary| {
            canary["steps"] =
                json!([{"weight": 10, "pause": "10s"}, {"weight": 50, "pause": "10m"}]);
            short_analysis(canary, "5s", "10s", false);
            with_drain(canary);
        })
        .await;
        let trace = Trace::start(app.env()).await;
        app.env().set_spec(NAME, json!({"version": V2})).await;
        // No load: the canary backend has no request to count, the query no
        // data, and the step holds past its pause.
        wait_canary(&app, "three inconclusive rounds at the first step", |s| {
            let Some(c) = &s.canary else { return false };
            let rounds = c
                .analysis
                .iter()
                .filter(|r| r.step == 1 && r.outcome == Outcome::Inconclusive)
                .count();
            rounds >= 3
        })
        .await;
        let held = app.env().status(NAME).await;
        let c = held.canary.as_ref().unwrap();
        assert_eq!((c.step, c.weight), (1, 10), "{c:#?}");
        let stalled = held
            .conditions
            .iter()
            .find(|c| c.type_ == "Stalled")
            .unwrap();
        assert_eq!(
            (stalled.status.as_str(), stalled.reason.as_str()),
            ("True", "AnalysisInconclusive")
        );
        let since_step = now_ms() - span(&trace.seen.lock().unwrap(), (90, 10)).unwrap().0;
        assert!(since_step > 10_000.0, "held past the 10 s pause");
        // Data: the next rounds pass and the canary moves on.
        let (stop, load) = app.app.load(None, 20.0, Duration::from_secs(300));
        wait_canary(&app, "the second step", |s| {
            s.canary
                .as_ref()
                .is_some_and(|c| c.step == 2 && c.weight == 50)
        })
        .await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        // An abort of a good canary: nothing may fail, before, at or after
        // the moment its Deployment moves back.
        let aborted = now_ms();
        app.env()
            .models()
            .patch(
                NAME,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(
                    json!({"metadata": {"annotations": {"openmed.ai/canary-abort": "stack-test"}}}),
                ),
            )
            .await
            .unwrap();
        wait_canary(&app, "the abort and the drain", |s| {
            canary_state(s) == Some(CanaryState::Aborted)
                && s.canary.as_ref().is_some_and(|c| c.drained_time.is_some())
        })
        .await;
        // The load goes on a little past the move back.
        wait_moved_back(&trace, (50, 50)).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let _ = stop.send(());
        let records = load.await.unwrap();
        let seen = trace.stop().await;
        let status = app.env().status(NAME).await;

        assert_all_served(&records);
        let (_, restored) = span(&seen, (50, 50)).expect("the second step's weights");
        let moved = moved_back(&seen, restored).expect("the canary Deployment moved back");
        let canary_answers = from_canary(&records);
        let last_canary_answer = canary_answers
            .iter()
            .filter(|r| r.model_name.as_deref() == Some(V2))
            .map(|r| r.unix_ms as f64 + r.latency_ms)
            .fold(0.0, f64::max);
        assert!(
            last_canary_answer < moved,
            "the canary Deployment moved {:.0} ms before its last answer",
            last_canary_answer - moved
        );
        let c = status.canary.as_ref().unwrap();
        let drain_s = drain_seconds(c);
        let events = app.env().events(NAME).await;
        let drained = events
            .iter()
            .find(|(r, _, _)| r == "CanaryDrained")
            .map(|(_, m, _)| m.clone())
            .expect("a CanaryDrained event");
        eprintln!("canary::no_data_holds (20 requests/s once the step held):");
        let phases = vec![phase(
            "abort to the end",
            &sent_between(&records, aborted, f64::INFINITY),
        )];
        eprintln!(
            "  route back → drained {drain_s} s; canary Deployment moved {:.1} s after its last answer; {drained}",
            (moved - last_canary_answer) / 1000.0
        );
        record_result(json!({
            "scenario": "canary_no_data_holds_then_abort_drains", "rps": 20, "phases": phases,
            "inconclusive_rounds_held": 3, "drain_s": drain_s,
            "moved_after_last_canary_answer_s": ((moved - last_canary_answer) / 100.0).round() / 10.0,
        }));
        app.app.env.finish().await;
    });
}

fn a_model_that_misses_dates_is_aborted_by_the_probes() {
    block_on(async {
        let app = CanaryApp::deploy("stack-canary-probes", |canary| {
            canary["steps"] = json!([{"weight": 10, "pause": "30s"}]);
            let analysis = &mut canary["analysis"];
            analysis["interval"] = json!("5s");
            analysis.as_object_mut().unwrap().remove("metrics");
        })
        .await;
        let trace = Trace::start(app.env()).await;
        let (stop, load) = app.app.load(None, 20.0, Duration::from_secs(300));
        tokio::time::sleep(Duration::from_secs(3)).await;
        app.env()
            .set_spec(NAME, json!({"version": MISSES_DATE}))
            .await;
        wait_canary(&app, "the probes to abort the canary", |s| {
            canary_state(s) == Some(CanaryState::Aborted)
        })
        .await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let _ = stop.send(());
        let records = load.await.unwrap();
        let seen = trace.stop().await;
        let status = app.env().status(NAME).await;

        assert_all_served(&records);
        assert_eq!(status.active_version.as_deref(), Some(V1));
        let c = status.canary.as_ref().unwrap();
        let probes = c
            .analysis
            .iter()
            .find(|r| r.name == "probes" && r.outcome == Outcome::Fail)
            .unwrap_or_else(|| panic!("a failed probes round: {:#?}", c.analysis));
        assert!(
            probes.message.contains("DATE recall 0.00"),
            "{}",
            probes.message
        );
        // The figures only: no probe text in the status.
        assert!(!probes.message.contains("Patient"), "{}", probes.message);
        let leaked = records
            .iter()
            .filter(|r| r.model_name.as_deref() == Some(MISSES_DATE))
            .count();
        let (at_ten, restored) = span(&seen, (90, 10)).expect("the step's weights");
        eprintln!(
            "canary::probes: {leaked} answers of {} from the model that misses dates in {:.1} s at 10 %; {}",
            records.len(),
            (restored - at_ten) / 1000.0,
            probes.message
        );
        record_result(json!({
            "scenario": "canary_probes_abort_a_model_that_misses_dates", "rps": 20,
            "requests": records.len(), "answers_from_it": leaked,
            "at_10_pct_s": ((restored - at_ten) / 100.0).round() / 10.0, "failed_round": probes.message,
        }));
        app.app.env.finish().await;
    });
}

/// The requests for `/pii/extract` the canary Deployment's pods of this
/// namespace answered, by their own access logs (one JSON line each, kept
/// by the kubelet; a deleted pod's log stays).
fn canary_pod_requests(env: &Env) -> usize {
    let prefix = format!("{}_{CANARY}-", env.ns.name);
    let Ok(pods) = std::fs::read_dir(cluster_dir().join("kubelet/pods")) else {
        return 0;
    };
    pods.flatten()
        .filter(|p| p.file_name().to_string_lossy().starts_with(&prefix))
        .flat_map(|p| {
            std::fs::read_dir(p.path().join("openmed-service"))
                .into_iter()
                .flatten()
        })
        .flatten()
        .map(|log| std::fs::read_to_string(log.path()).unwrap_or_default())
        .map(|text| {
            text.lines()
                .filter(|l| l.contains("\"route\":\"/pii/extract\""))
                .count()
        })
        .sum()
}

fn a_mirror_step_copies_requests_to_the_canary_and_every_client_gets_the_stable_model() {
    block_on(async {
        let app = CanaryApp::deploy("stack-canary-mirror", |canary| {
            canary["steps"] =
                json!([{"mirror": 50, "pause": "10m"}, {"weight": 10, "pause": "10m"}]);
            short_analysis(canary, "5s", "10s", false);
            with_drain(canary);
        })
        .await;
        let routes: Api<DynamicObject> = Api::namespaced_with(
            app.env().client.clone(),
            &app.env().ns.name,
            &ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", "HTTPRoute"),
                "httproutes",
            ),
        );
        let git = serde_json::to_value(routes.get(NAME).await.unwrap()).unwrap();
        let before = canary_pod_requests(app.env());
        let trace = Trace::start(app.env()).await;
        let rps = 20.0;
        let (stop, load) = app.app.load(None, rps, Duration::from_secs(300));
        tokio::time::sleep(Duration::from_secs(3)).await;
        // A model that warms, passes /readyz and fails every request: in a
        // mirror step only its copies fail, and the analysis sees them.
        app.env().set_spec(NAME, json!({"version": FAILS})).await;
        wait_canary(&app, "the analysis to abort the mirror step", |s| {
            canary_state(s) == Some(CanaryState::Aborted)
        })
        .await;
        // The filter is gone from the route; copies sent before Envoy has
        // the route without it may still arrive, then none.
        wait_for(
            "the mirror filter to leave the route",
            Duration::from_secs(30),
            || async {
                let seen = trace.seen.lock().unwrap().clone();
                let mirrored = seen.iter().position(|s| s.mirror.is_some())?;
                seen[mirrored..]
                    .iter()
                    .find(|s| s.mirror.is_none())
                    .map(|s| s.at)
            },
        )
        .await;
        tokio::time::sleep(Duration::from_millis(PROPAGATION_MS as u64)).await;
        let copies_at_removal = canary_pod_requests(app.env());
        wait_canary(&app, "the canary Deployment to drain", |s| {
            s.canary.as_ref().is_some_and(|c| c.drained_time.is_some())
        })
        .await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        let _ = stop.send(());
        let records = load.await.unwrap();
        let seen = trace.stop().await;
        let status = app.env().status(NAME).await;
        let copies = canary_pod_requests(app.env()) - before;

        // Every client was answered, by the stable model, from a stable pod.
        assert_all_served(&records);
        assert!(
            from_canary(&records).is_empty(),
            "a canary pod answered a client"
        );
        assert!(
            records.iter().all(|r| r.model_name.as_deref() == Some(V1)),
            "every answer names the stable model"
        );
        assert!(
            seen.iter().all(|s| s.weights == (100, 0)),
            "the weights never moved: {seen:#?}"
        );
        // The copies reached the canary's pods, about half of the requests
        // sent while the route mirrored.
        let first = seen
            .iter()
            .position(|s| s.mirror == Some(50))
            .expect("the mirror on the route");
        let (from, to) = (
            seen[first].at,
            seen[first..]
                .iter()
                .find(|s| s.mirror.is_none())
                .unwrap()
                .at,
        );
        let surely = sent_between(&records, from + PROPAGATION_MS, to).len() as f64;
        let at_most = sent_between(&records, seen[first].after, to + PROPAGATION_MS).len() as f64;
        eprintln!(
            "canary::mirror: {copies} copies reached the canary's pods while the route mirrored 50 % for {:.1} s ({} requests sent then); {} requests, 0 from the canary",
            (to - from) / 1000.0,
            at_most,
            records.len()
        );
        assert!(copies > 0, "no copy reached the canary");
        assert!(
            copies as f64 >= 0.3 * surely && copies as f64 <= 0.7 * at_most + 5.0,
            "{copies} copies for about half of {surely}..{at_most} requests"
        );
        // None after the filter left, and the route is Git's again.
        assert_eq!(
            canary_pod_requests(app.env()) - before,
            copies_at_removal - before,
            "copies reached the canary after the filter was removed"
        );
        let after = serde_json::to_value(routes.get(NAME).await.unwrap()).unwrap();
        assert_eq!(after["spec"], git["spec"], "the route ends as in Git");
        let c = status.canary.as_ref().unwrap();
        assert_eq!((c.step, c.mirror), (1, None));
        let metric = c
            .analysis
            .iter()
            .find(|r| r.name == "error-rate" && r.outcome == Outcome::Fail)
            .expect("the error rate of the copies failed a round");
        eprintln!(
            "  mirrored for {:.1} s; drained {} s after the filter left; {}",
            (to - from) / 1000.0,
            drain_seconds(c),
            metric.message
        );
        record_result(json!({
            "scenario": "canary_mirror_step_aborted_by_the_copies_errors", "rps": rps,
            "requests": records.len(), "failed": 0, "answered_by_canary": 0,
            "mirrored_s": ((to - from) / 100.0).round() / 10.0, "copies_at_canary": copies,
            "requests_while_mirrored": at_most, "drain_s": drain_seconds(c),
            "failed_round": metric.message,
        }));
        app.app.env.finish().await;
    });
}

/// An autoscaled model (KEDA's way, at least ten pods) bumped through a
/// canary with one step at 20 %: at that step the canary Deployment runs a
/// fifth of the stable Deployment's pods (two of ten), the stable side
/// keeps its ten throughout (the autoscaler's minimum is the floor while
/// the canary runs), the canary Deployment goes back to its one pod at
/// rest after the promotion, and no request fails.
fn an_autoscaled_canary_at_20_percent_runs_a_fifth_of_the_pods() {
    const STABLE: i32 = 10;
    block_on(async {
        install_operator_with_keda();
        let app =
            CanaryApp::deploy_with("stack-canary-scaled", &["--keda"], export_gauges, |spec| {
                spec.as_object_mut().unwrap().remove("replicas");
                spec["autoscaling"] = json!({
                    "minReplicas": STABLE, "maxReplicas": STABLE + 2,
                    "keda": {"prometheusAddress": pods_prometheus()},
                });
                let canary = &mut spec["canary"];
                canary["steps"] = json!([{"weight": 20, "pause": "40s"}]);
                short_analysis(canary, "10s", "20s", false);
            })
            .await;
        let deployments: Api<Deployment> =
            Api::namespaced(app.env().client.clone(), &app.env().ns.name);
        let counts = |d: &Deployment| {
            let status = d.status.clone().unwrap_or_default();
            (
                d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0),
                status.ready_replicas.unwrap_or(0),
            )
        };
        wait_for("the autoscaler's ten stable pods Ready", WARM, || async {
            let d = deployments.get(NAME).await.ok()?;
            (counts(&d) == (STABLE, STABLE)).then_some(())
        })
        .await;
        let (stop, load) = app.app.load(None, 10.0, Duration::from_secs(300));
        // Both Deployments' counts, once a second, until the promotion.
        let sampling = {
            let deployments = deployments.clone();
            let models = app.env().models();
            tokio::spawn(async move {
                let mut samples = Vec::new();
                for _ in 0..300 {
                    let (Ok(stable), Ok(canary), Ok(model)) = (
                        deployments.get(NAME).await,
                        deployments.get(CANARY).await,
                        models.get(NAME).await,
                    ) else {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    };
                    let c = model.status.and_then(|s| s.canary);
                    let state = c.as_ref().map(|c| c.state);
                    let weight = c.as_ref().map_or(0, |c| c.weight);
                    samples.push((counts(&stable), counts(&canary), state, weight));
                    if state == Some(CanaryState::Promoted) {
                        break;
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                samples
            })
        };
        app.env().set_spec(NAME, json!({"version": V2})).await;
        wait_canary(&app, "the canary to promote v2", |s| {
            s.phase == Some(Phase::Ready)
                && s.active_version.as_deref() == Some(V2)
                && canary_state(s) == Some(CanaryState::Promoted)
        })
        .await;
        let samples = sampling.await.unwrap();
        wait_for(
            "the canary Deployment back at its one pod",
            Duration::from_secs(120),
            || async {
                let d = deployments.get(CANARY).await.ok()?;
                (counts(&d).0 == 1).then_some(())
            },
        )
        .await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let _ = stop.send(());
        let records = load.await.unwrap();

        assert_all_served(&records);
        let at_20: Vec<_> = samples
            .iter()
            .filter(|(_, _, state, weight)| *weight == 20 && *state != Some(CanaryState::Promoting))
            .collect();
        assert!(!at_20.is_empty(), "a sample at 20 %: {samples:?}");
        // Its share of the stable count, rounded up.
        let canary_pods = (STABLE + 4) / 5;
        assert!(
            at_20
                .iter()
                .any(|(_, canary, _, _)| *canary == (canary_pods, canary_pods)),
            "at 20 % the canary ran {canary_pods} ready pods: {at_20:?}"
        );
        assert!(
            at_20
                .iter()
                .all(|(_, canary, _, _)| canary.0 == canary_pods),
            "at 20 % the canary Deployment asked for {canary_pods} pods throughout: {at_20:?}"
        );
        assert!(
            samples.iter().all(|(stable, _, _, _)| stable.0 >= STABLE),
            "the stable Deployment kept its {STABLE} pods: {samples:?}"
        );
        eprintln!(
            "canary::an_autoscaled_canary_at_20_percent (10 requests/s through the Gateway): {} samples at 20 %, canary {canary_pods} of {STABLE} stable pods",
            at_20.len()
        );
        record_result(json!({
            "scenario": "an_autoscaled_canary_at_20_percent_runs_a_fifth_of_the_pods",
            "rps": 10, "stable_pods": STABLE, "canary_pods_at_20": canary_pods,
            "seconds_at_20": at_20.len(),
            "stable_min_during_canary": samples.iter().map(|s| s.0.0).min(),
            "phases": [phase("bump to promoted", &records)],
        }));
        app.app.env.finish().await;
    });
}
