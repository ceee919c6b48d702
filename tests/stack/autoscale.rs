//! Autoscaling on the service's own gauges, on the real stack:
//! `examples/autoscaling` (the service with its metrics and dynamic
//! batching on), the pods' Prometheus scraping them, KEDA's Prometheus
//! triggers behind the external metrics API, kube-controller-manager's HPA controller, the
//! operator owning the model's ScaledObject (`spec.autoscaling.keda`),
//! and real load through the Gateway.
//!
//! A sampler records, once a second, the Deployment's counts, the
//! autoscaler's desired count and the two signals exactly as KEDA queries
//! them, so every figure below is read off one timeline. The figures go to
//! `$STACK_RESULTS` (docs/autoscaling.md).

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use libtest_mimic::Trial;
use openmed_load::Record;
use serde_json::{Value, json};

use crate::app::*;
use crate::env::Env;
use crate::support::*;
use crate::trial;

pub fn trials() -> Vec<Trial> {
    let mut trials = vec![trial(
        "autoscale::load_beyond_two_pods_scales_up_and_its_end_scales_back_down",
        load_beyond_two_pods_scales_up_and_its_end_scales_back_down,
    )];
    // Longer runs, for the committed results (docs/autoscaling.md).
    if std::env::var_os("AUTOSCALE_ALL").is_some() {
        trials.push(trial(
            "autoscale::a_bump_in_the_middle_of_a_scale_up_keeps_every_pod_asked_for",
            a_bump_in_the_middle_of_a_scale_up_keeps_every_pod_asked_for,
        ));
    }
    trials
}

/// The autoscaler's bounds and per-pod targets in these scenarios: small
/// targets, so that a load the two CPUs of a test machine still serve is
/// above what two pods are meant to take; a small maximum, since every
/// pod is a process warming a model on those CPUs.
const MIN: i64 = 2;
const MAX: i64 = 4;
const QUEUE_PER_POD: i64 = 1;
const INFLIGHT_PER_POD: i64 = 1;
/// The scale-down window, shortened from the default five minutes.
const WINDOW_S: i64 = 20;
/// kube-controller-manager's HPA sync period (its default; tests/cluster
/// leaves it).
const HPA_SYNC_S: f64 = 15.0;
/// Above what two pods take at the targets above, far below what
/// saturates the machine (docs/autoscaling.md).
const HEAVY_RPS: f64 = 80.0;
/// How long the service's dynamic batching waits to fill a batch. Its
/// default, 5 ms, leaves the admission queue empty until the CPUs
/// saturate, and two CPUs saturated by pods that warm a model each never
/// recover (tried: 150 requests/s). Waiting 100 ms, the queue holds about
/// the requests of the last 100 ms in every pod: a load signal that grows
/// with the load well before the CPUs run out, as on a cluster whose
/// pods each have CPUs of their own.
const BATCH_WAIT_MS: &str = "100";
/// Clients throughout, below the targets: the requests that must not
/// fail while the pods come and go.
const LIGHT_RPS: f64 = 5.0;

/// The autoscaling example's service in the test's namespace, its batches
/// waiting [`BATCH_WAIT_MS`].
fn autoscaled_example(ns: &str) -> String {
    let mut docs: Vec<Value> = parse_documents(&example_at(
        "examples/autoscaling/openmed-service.yaml",
        ns,
        Image::Stock,
    ));
    for d in docs.iter_mut().filter(|d| d["kind"] == "Deployment") {
        d["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "OPENMED_SERVICE_BATCH_MAX_WAIT_MS", "value": BATCH_WAIT_MS}));
    }
    yaml_stream(&docs)
}

fn parse_documents(text: &str) -> Vec<Value> {
    use serde::Deserialize;
    serde_yaml::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

/// The autoscaling example's model, with this test's bounds and targets
/// and the pods' Prometheus of the stack.
fn autoscaled_model() -> String {
    let mut value = example_model_at("examples/autoscaling/openmedmodel.yaml");
    let autoscaling = &mut value["spec"]["autoscaling"];
    assert!(
        autoscaling["keda"].is_object(),
        "examples/autoscaling goes through KEDA"
    );
    for (field, v) in [
        ("minReplicas", MIN),
        ("maxReplicas", MAX),
        ("queueDepthPerPod", QUEUE_PER_POD),
        ("inflightRequestsPerPod", INFLIGHT_PER_POD),
        ("scaleDownStabilizationSeconds", WINDOW_S),
    ] {
        autoscaling[field] = json!(v);
    }
    autoscaling["keda"]["prometheusAddress"] = json!(pods_prometheus());
    serde_yaml::to_string(&value).unwrap()
}

/// The autoscaled example at `V1`, routed, its autoscaler active.
async fn deploy(prefix: &str) -> App {
    install_operator_with_keda();
    let env = Env::with_operator_args(prefix, &["--keda"]).await;
    env.apply(&autoscaled_example(&env.ns.name)).await;
    env.apply(&autoscaled_model()).await;
    env.wait_ready(NAME, V1).await;
    env.wait_status(
        NAME,
        "Autoscaled=True (KEDA's autoscaler reads both gauges)",
        |s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Autoscaled" && c.status == "True")
        },
    )
    .await;
    let url = routed(&env).await;
    App { env, url }
}

/// The Deployment's `spec.replicas`, pods and ready pods, and what KEDA's
/// autoscaler asks for.
#[derive(Debug, Clone, Copy)]
struct Counts {
    spec: i64,
    pods: i64,
    ready: i64,
    desired: Option<i64>,
}

/// Reads [`Counts`] now.
async fn counts(
    deployments: &Api<k8s_openapi::api::apps::v1::Deployment>,
    autoscalers: &Api<HorizontalPodAutoscaler>,
) -> Option<Counts> {
    let d = deployments.get(NAME).await.ok()?;
    let status = d.status.unwrap_or_default();
    let desired = autoscalers
        .get_opt(&format!("keda-hpa-{NAME}"))
        .await
        .ok()
        .flatten()
        .and_then(|h| h.status)
        .map(|s| i64::from(s.desired_replicas));
    Some(Counts {
        spec: i64::from(d.spec.and_then(|s| s.replicas).unwrap_or(0)),
        pods: i64::from(status.replicas.unwrap_or(0)),
        ready: i64::from(status.ready_replicas.unwrap_or(0)),
        desired,
    })
}

fn autoscalers(app: &App) -> Api<HorizontalPodAutoscaler> {
    Api::namespaced(app.env.client.clone(), &app.env.ns.name)
}

/// One second of the timeline.
#[derive(Debug, Clone)]
struct Sample {
    t_ms: f64,
    /// The Deployment's `spec.replicas`, its pods, its ready pods.
    spec: i64,
    pods: i64,
    ready: i64,
    /// What KEDA's autoscaler asks for.
    desired: Option<i64>,
    /// The two triggers' values, as KEDA's queries read them now.
    queue: Option<f64>,
    inflight: Option<f64>,
}

impl Sample {
    /// The signal asks for more than `MIN` pods.
    fn asks_for_more(&self) -> bool {
        self.queue.is_some_and(|q| q > (QUEUE_PER_POD * MIN) as f64)
            || self
                .inflight
                .is_some_and(|i| i > (INFLIGHT_PER_POD * MIN) as f64)
    }
}

/// The network namespace of the stack's node, where the pods' Prometheus
/// listens (tests/cluster/state.sh names it after the API server's port).
fn node_netns() -> String {
    let ports = std::fs::read_to_string(cluster_dir().join("ports")).unwrap();
    let port = ports
        .lines()
        .find_map(|l| l.strip_prefix("APISERVER_PORT="))
        .expect("APISERVER_PORT in DIR/ports");
    format!("fk{port}-node")
}

/// A PromQL query on the pods' Prometheus, from the node's namespace.
async fn query(prometheus: &str, promql: &str) -> Option<f64> {
    let out = tokio::process::Command::new("ip")
        .args(["netns", "exec", &node_netns(), "curl", "-s", "-m", "2"])
        .arg(format!("{prometheus}/api/v1/query"))
        .args(["--data-urlencode", &format!("query={promql}")])
        .output()
        .await
        .ok()?;
    let answer: Value = serde_json::from_slice(&out.stdout).ok()?;
    answer["data"]["result"][0]["value"][1]
        .as_str()?
        .parse()
        .ok()
}

/// KEDA's two queries, as the operator wrote them into the ScaledObject.
async fn trigger_queries(app: &App) -> (String, String) {
    let gvk = GroupVersionKind::gvk("keda.sh", "v1alpha1", "ScaledObject");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "scaledobjects");
    let objects: Api<DynamicObject> =
        Api::namespaced_with(app.env.client.clone(), &app.env.ns.name, &resource);
    let object = objects.get(NAME).await.unwrap();
    let triggers = &object.data["spec"]["triggers"];
    let of = |name: &str| {
        triggers
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .and_then(|t| t["metadata"]["query"].as_str())
            .unwrap_or_else(|| panic!("trigger {name} in {triggers}"))
            .to_owned()
    };
    (of("queue-depth"), of("inflight-requests"))
}

/// Samples the timeline once a second until told to stop (or ten
/// minutes, the bound of every scenario here), printing each sample as it
/// comes (seconds after `from`), so that a failure shows its timeline.
async fn sampler(
    app: &App,
    from: f64,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Vec<Sample>>,
) {
    let (queue_query, inflight_query) = trigger_queries(app).await;
    let prometheus = pods_prometheus();
    let deployments = app.env.deployments();
    let autoscalers = autoscalers(app);
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let mut samples = Vec::new();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        for _ in 0..600 {
            tokio::select! {
                _ = &mut stopped => break,
                _ = tick.tick() => {}
            }
            let t_ms = now_ms();
            let Some(Counts {
                spec,
                pods,
                ready,
                desired,
            }) = counts(&deployments, &autoscalers).await
            else {
                continue;
            };
            let sample = Sample {
                t_ms,
                spec,
                pods,
                ready,
                desired,
                queue: query(&prometheus, &queue_query).await,
                inflight: query(&prometheus, &inflight_query).await,
            };
            print_sample(&sample, from);
            samples.push(sample);
        }
        samples
    });
    (stop, task)
}

/// Polls [`Counts`] until `done` holds of them; returns them.
async fn wait_counts(
    app: &App,
    what: &str,
    deadline: Duration,
    done: impl Fn(&Counts) -> bool,
) -> Counts {
    let deployments = app.env.deployments();
    let autoscalers = autoscalers(app);
    wait_for(what, deadline, || async {
        let now = counts(&deployments, &autoscalers).await?;
        done(&now).then_some(now)
    })
    .await
}

/// Waits until the autoscaler asks for more than `MIN` pods; returns what
/// it asks for.
async fn wait_asked_for_more(app: &App) -> i64 {
    let asked = wait_counts(
        app,
        "the autoscaler to ask for more than two pods",
        Duration::from_secs(150),
        |c| c.desired.is_some_and(|d| d > MIN),
    )
    .await;
    asked.desired.unwrap()
}

/// The first sample at or after `from` that satisfies `p`, in s after
/// `from`.
fn first_after(samples: &[Sample], from: f64, p: impl Fn(&Sample) -> bool) -> Option<f64> {
    samples
        .iter()
        .find(|s| s.t_ms >= from && p(s))
        .map(|s| (s.t_ms - from) / 1000.0)
}

fn tenths(s: f64) -> f64 {
    (s * 10.0).round() / 10.0
}

/// Seconds each pod created after `since` took from its creation to Ready
/// (the model's warm-up, with the process start).
async fn warm_ups(app: &App, since: f64) -> Vec<f64> {
    app.pods()
        .await
        .iter()
        .filter_map(|p| {
            let created = p.metadata.creation_timestamp.as_ref()?.0.as_millisecond() as f64;
            (created >= since - 1000.0).then(|| Some((ready_ms(p)? - created) / 1000.0))?
        })
        .collect()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

fn print_sample(s: &Sample, from: f64) {
    eprintln!(
        "    {:>6.1} s  replicas {} pods {} ready {}  asks {:?}  queue {:?} in-flight {:?}",
        (s.t_ms - from) / 1000.0,
        s.spec,
        s.pods,
        s.ready,
        s.desired,
        s.queue.map(tenths),
        s.inflight.map(tenths),
    );
}

/// Light clients throughout, a heavy load on top until the pods the
/// autoscaler asked for are all Ready, and on for 20 s until its count is
/// settled and Ready again, then the light clients alone until the
/// Deployment is back at `MIN`. No request of either fails; the
/// autoscaler asked for more than `MIN` pods, they all became Ready and
/// served, and after the load it went back to `MIN`. The timeline's figures
/// (signal to asked to Ready against the floor, load's end to scale-down
/// against the window) are printed and recorded.
fn load_beyond_two_pods_scales_up_and_its_end_scales_back_down() {
    block_on(async {
        let app = deploy("stack-autoscale").await;
        let start = now_ms();
        let (stop_light, light) = app.load(Some(V1), LIGHT_RPS, Duration::from_secs(480));
        let (stop_sampling, sampling) = sampler(&app, start + 5000.0).await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        let loaded = now_ms();
        let (stop_heavy, heavy) = app.load(Some(V1), HEAVY_RPS, Duration::from_secs(240));
        let asked = wait_asked_for_more(&app).await;
        wait_counts(
            &app,
            "every pod the autoscaler asked for to be Ready",
            WARM,
            |c| c.spec >= asked && c.pods == c.spec && c.ready == c.spec,
        )
        .await;
        let all_ready = now_ms();
        // The load goes on past a settled count: the autoscaler may ask for
        // more as the window fills, and those pods must serve too.
        tokio::time::sleep(Duration::from_secs(20)).await;
        wait_counts(
            &app,
            "every pod the autoscaler asks for to be Ready under the load",
            WARM,
            |c| c.desired == Some(c.spec) && c.pods == c.spec && c.ready == c.spec,
        )
        .await;
        let _ = stop_heavy.send(());
        let unloaded = now_ms();
        wait_counts(
            &app,
            "the Deployment back at two ready pods",
            Duration::from_secs(240),
            |c| c.spec == MIN && c.pods == MIN && c.ready == MIN,
        )
        .await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let _ = stop_light.send(());
        let _ = stop_sampling.send(());
        let heavy = heavy.await.unwrap();
        let light = light.await.unwrap();
        let samples = sampling.await.unwrap();
        let warm = warm_ups(&app, loaded).await;

        eprintln!(
            "autoscale::load_beyond_two_pods (stock app, {LIGHT_RPS} requests/s throughout, {HEAVY_RPS} more until scaled; targets {QUEUE_PER_POD} queued / {INFLIGHT_PER_POD} in flight per pod, {MIN} to {MAX} pods, window {WINDOW_S} s):"
        );
        assert_all_served(&heavy);
        assert_all_served(&light);
        assert_answered_as_named(&heavy, V1);
        let peak = samples.iter().map(|s| s.spec).max().unwrap_or(0);
        let answered: BTreeSet<_> = heavy.iter().filter_map(|r| r.pod.clone()).collect();
        assert!(
            peak > MIN && answered.len() as i64 >= peak,
            "each of the {peak} pods answered once Ready: {answered:?}"
        );
        let signal = first_after(&samples, loaded, Sample::asks_for_more);
        let asked_at = first_after(&samples, loaded, |s| s.desired.is_some_and(|d| d > MIN));
        let ready_at = (all_ready - loaded) / 1000.0;
        let warm_up = median(warm.clone());
        let scaled_down =
            first_after(&samples, unloaded, |s| s.spec < peak).expect("it scaled down");
        let two_ready = first_after(&samples, unloaded, |s| {
            s.spec == MIN && s.pods == MIN && s.ready == MIN
        })
        .expect("back at two ready pods");
        let figures = json!({
            "scenario": "load_beyond_two_pods_scales_up_and_its_end_scales_back_down",
            "heavy_rps": HEAVY_RPS, "light_rps": LIGHT_RPS,
            "min": MIN, "max": MAX, "queue_per_pod": QUEUE_PER_POD,
            "inflight_per_pod": INFLIGHT_PER_POD, "window_s": WINDOW_S,
            "pods_asked_first": asked, "pods_at_peak": peak,
            "load_to_signal_s": signal.map(tenths),
            "load_to_asked_s": asked_at.map(tenths),
            "load_to_all_ready_s": tenths(ready_at),
            "signal_to_all_ready_s": signal.map(|s| tenths(ready_at - s)),
            "warm_up_s": warm.iter().copied().map(tenths).collect::<Vec<_>>(),
            "floor_s": tenths(HPA_SYNC_S + warm_up),
            "load_end_to_scale_down_s": tenths(scaled_down),
            "load_end_to_two_ready_s": tenths(two_ready),
            "phases": [phase("heavy", &heavy), phase("light, throughout", &light)],
        });
        eprintln!("  {figures}");
        record_result(figures);
        app.env.finish().await;
    });
}

/// A bump to `V2` as soon as the autoscaler asks for more pods under load:
/// the rollout surges above the count, the Deployment's `spec.replicas`
/// never falls below what the autoscaler asked for, every pod of the new
/// version it asked for becomes Ready, and no request fails.
fn a_bump_in_the_middle_of_a_scale_up_keeps_every_pod_asked_for() {
    block_on(async {
        let app = deploy("stack-autoscale-bump").await;
        let loaded = now_ms();
        let (stop_sampling, sampling) = sampler(&app, loaded).await;
        let (stop_load, load) = app.load(Some(V1), HEAVY_RPS, Duration::from_secs(360));
        let asked = wait_asked_for_more(&app).await;
        let bumped = now_ms();
        app.env.set_spec(NAME, json!({"version": V2})).await;
        app.env.wait_ready(NAME, V2).await;
        let rolled = now_ms();
        let spec = wait_counts(
            &app,
            "every pod the autoscaler asks for Ready on the new template",
            WARM,
            |c| c.desired.is_some_and(|d| c.spec >= d) && c.pods == c.spec && c.ready == c.spec,
        )
        .await
        .spec;
        tokio::time::sleep(Duration::from_secs(5)).await;
        let _ = stop_load.send(());
        let _ = stop_sampling.send(());
        let records: Vec<Record> = load.await.unwrap();
        let samples = sampling.await.unwrap();

        eprintln!(
            "autoscale::a_bump_in_the_middle_of_a_scale_up ({HEAVY_RPS} requests/s naming v1; bumped when the autoscaler first asked for {asked}):"
        );
        assert_all_served(&records);
        assert_answered_as_named(&records, V1);
        // The count is the autoscaler's alone: it never falls while the
        // autoscaler asks for at least what it was.
        let dropped: Vec<_> = samples
            .windows(2)
            .filter(|w| w[1].spec < w[0].spec && w[1].desired.is_some_and(|d| d >= w[0].spec))
            .collect();
        assert!(
            dropped.is_empty(),
            "replicas fell below the autoscaler's count: {dropped:?}"
        );
        let figures = json!({
            "scenario": "a_bump_in_the_middle_of_a_scale_up_keeps_every_pod_asked_for",
            "rps": HEAVY_RPS, "min": MIN, "max": MAX,
            "pods_asked_at_bump": asked, "pods_at_end": spec,
            "peak_pods": samples.iter().map(|s| s.pods).max(),
            // Ready pods once the autoscaler's count was first all Ready:
            // what the machine's two CPUs, overloaded, did to readiness.
            "ready_min_after_reached": samples
                .iter()
                .skip_while(|s| s.desired.is_none_or(|d| s.ready < d || d <= MIN))
                .map(|s| s.ready)
                .min(),
            "bump_to_rolled_s": tenths((rolled - bumped) / 1000.0),
            "phases": phases_around(&records, ["before the bump", "bump to rolled", "after"], bumped, rolled),
        });
        eprintln!("  {figures}");
        record_result(figures);
        app.env.finish().await;
    });
}
