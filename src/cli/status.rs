//! `status` and `list`: an OpenMedModel as a person reads it, with the
//! ReplicaSets of its Deployment (which version each one serves, how many
//! of its pods are ready), the quality gate's verdict on each pod, its
//! canary with the latest round of analysis (the probes' figures among
//! them) and its last events; `--watch` redraws on every change the
//! watches report.
//!
//! The view is a pure function of the objects read ([`view`]), so what it
//! shows is tested without a cluster; the shell only reads and redraws.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};

use super::{EXIT_OK, EXIT_USAGE};
use crate::api::names::{MANIFEST_SNAPSHOT_LABEL, MODEL_RESOURCE_ANNOTATION, PRELOAD_ENV};
use crate::api::quality::QUALITY_CONDITION;
use crate::api::{OpenMedModel, Phase};

/// The `status` subcommand's arguments.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// The OpenMedModel.
    name: String,

    /// Its namespace [default: the kubeconfig's].
    #[arg(short, long)]
    namespace: Option<String>,

    /// Redraw on every change to the resource, its ReplicaSets or its
    /// events, until interrupted.
    #[arg(short, long)]
    watch: bool,
}

/// The `list` subcommand's arguments.
#[derive(Debug, clap::Args)]
pub struct ListArgs {
    /// Only this namespace [default: the kubeconfig's].
    #[arg(short, long, conflicts_with = "all_namespaces")]
    namespace: Option<String>,

    /// Every namespace.
    #[arg(short = 'A', long)]
    all_namespaces: bool,
}

/// How many events the view shows, the most recent.
const EVENTS_SHOWN: usize = 8;

/// What the view is made of, as read from the cluster.
#[derive(Debug)]
pub struct Observed {
    /// The resource.
    pub model: OpenMedModel,
    /// Its target Deployment, when it exists.
    pub deployment: Option<Deployment>,
    /// The Deployment's ReplicaSets.
    pub replica_sets: Vec<ReplicaSet>,
    /// The resource's manifest snapshots, which name each short hash's version.
    pub snapshots: Vec<ConfigMap>,
    /// Events about the resource.
    pub events: Vec<Event>,
    /// The Deployment's pods, read when `spec.qualityGate` is set.
    pub pods: Vec<Pod>,
}

/// The resource, as text, with ages counted to `now`.
pub fn view(o: &Observed, now: Timestamp) -> String {
    let mut out = String::new();
    let model = &o.model;
    let status = model.status.clone().unwrap_or_default();
    let field = |out: &mut String, key: &str, value: &str| {
        let _ = writeln!(out, "{:<12}{value}", format!("{key}:"));
    };
    field(&mut out, "Name", &model.name_any());
    field(
        &mut out,
        "Namespace",
        &model.namespace().unwrap_or_default(),
    );
    field(
        &mut out,
        "Phase",
        status.phase.map_or("Unknown", Phase::as_str),
    );
    field(
        &mut out,
        "Desired",
        or_dash(status.desired_version.as_deref()),
    );
    field(
        &mut out,
        "Active",
        or_dash(status.active_version.as_deref()),
    );
    let retained = crate::rollout::retained_versions(&status);
    field(
        &mut out,
        "Retained",
        &if retained.is_empty() {
            "none yet".to_owned()
        } else {
            retained.join(", ")
        },
    );
    field(
        &mut out,
        "Rollbacks",
        &status.rollback_count.unwrap_or(0).to_string(),
    );
    if let Some(request) = &status.rollback_request {
        field(&mut out, "Rollback", request);
    }
    if let Some(soak) = soak_line(&status, now) {
        field(&mut out, "Soak", &soak);
    }
    if let Some(line) = autoscaling_line(model) {
        field(&mut out, "Autoscaler", &line);
    }

    if !status.conditions.is_empty() {
        out.push_str("Conditions:\n");
        let rows: Vec<Vec<String>> = status
            .conditions
            .iter()
            .map(|c| {
                vec![
                    c.type_.clone(),
                    c.status.clone(),
                    c.reason.clone(),
                    c.message.clone(),
                ]
            })
            .collect();
        table(&mut out, &["TYPE", "STATUS", "REASON", "MESSAGE"], &rows);
    }

    let versions = versions_by_hash(&o.snapshots, &model_key(model));
    let target = target(model);
    match &o.deployment {
        None => {
            let _ = writeln!(out, "Deployment {target}: not found");
        }
        Some(d) => {
            let s = d.status.clone().unwrap_or_default();
            let _ = writeln!(
                out,
                "Deployment {target} (container {}): {}/{} ready, {} updated",
                model.spec.target_ref.container_name,
                s.ready_replicas.unwrap_or(0),
                d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
                s.updated_replicas.unwrap_or(0),
            );
            let mut sets: Vec<&ReplicaSet> = o.replica_sets.iter().collect();
            sets.sort_by_key(|rs| std::cmp::Reverse(revision(rs)));
            let rows: Vec<Vec<String>> = sets
                .iter()
                .map(|rs| {
                    let short = rs.labels().get(MANIFEST_SNAPSHOT_LABEL).cloned();
                    let version = short
                        .as_ref()
                        .and_then(|h| versions.get(h).cloned())
                        .or_else(|| preload(rs))
                        .unwrap_or_else(|| "-".to_owned());
                    let st = rs.status.clone().unwrap_or_default();
                    vec![
                        revision(rs).to_string(),
                        rs.name_any(),
                        version,
                        format!("{}/{}", st.ready_replicas.unwrap_or(0), st.replicas),
                    ]
                })
                .collect();
            if !rows.is_empty() {
                table(
                    &mut out,
                    &["REVISION", "REPLICASET", "VERSION", "READY"],
                    &rows,
                );
            }
        }
    }

    if model.spec.quality_gate.is_some() {
        quality_gate(&mut out, &o.pods, &versions);
    }

    if let Some(c) = &status.canary {
        let _ = writeln!(
            out,
            "Canary: {} {} at step {}, {}: {}",
            c.version,
            c.state.as_str(),
            c.step,
            traffic_share(c),
            c.message
        );
        if let (Some(back), Some(drained)) = (&c.weights_back_time, &c.drained_time) {
            let _ = writeln!(
                out,
                "  drained {}s after the weights went back",
                drained.0.as_second() - back.0.as_second()
            );
        } else if let Some(back) = &c.weights_back_time {
            let _ = writeln!(
                out,
                "  weights back {} ago; the canary Deployment waits until no request reaches it",
                age(back.0, now)
            );
        }
        if let Some(canary) = &model.spec.canary {
            let steps: Vec<String> = canary
                .steps
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let mark = if i as i32 + 1 == c.step { "*" } else { "" };
                    match s.kind() {
                        crate::api::StepKind::Weight(w) => format!("{mark}{w}%"),
                        crate::api::StepKind::Mirror(p) => format!("{mark}mirror {p}%"),
                    }
                })
                .collect();
            let _ = writeln!(out, "  steps: {} (* current)", steps.join(" → "));
        }
        // The latest measurement of each check: the probes' figures
        // (recall per label), the metrics' values, the webhooks' answers.
        let mut latest: Vec<&crate::api::AnalysisResult> = Vec::new();
        for r in c.analysis.iter().rev() {
            if !latest.iter().any(|l| l.name == r.name) {
                latest.push(r);
            }
        }
        latest.reverse();
        if !latest.is_empty() {
            out.push_str("  analysis, latest of each check:\n");
            let rows: Vec<Vec<String>> = latest
                .iter()
                .map(|r| {
                    vec![
                        r.name.clone(),
                        r.step.to_string(),
                        format!("{:?}", r.outcome),
                        age(r.time.0, now),
                        r.message.clone(),
                    ]
                })
                .collect();
            columns(
                &mut out,
                "  ",
                &["CHECK", "STEP", "OUTCOME", "AGE", "MESSAGE"],
                &rows,
            );
        }
    }

    // The operator's events carry microseconds; older ones (core Events,
    // from before the operator wrote events.k8s.io/v1) have whole seconds,
    // so several of a rollout share one: the resourceVersion, which grows
    // with every write, orders those among themselves.
    let mut events: Vec<&Event> = o.events.iter().collect();
    events.sort_by_key(|e| (event_time(e), written(e)));
    let skip = events.len().saturating_sub(EVENTS_SHOWN);
    let rows: Vec<Vec<String>> = events[skip..]
        .iter()
        .map(|e| {
            let count = e
                .series
                .as_ref()
                .map(|s| s.count)
                .or(e.deprecated_count)
                .unwrap_or(1);
            let reason = e.reason.clone().unwrap_or_default();
            vec![
                event_time(e).map_or("-".to_owned(), |t| age(t, now)),
                e.type_.clone().unwrap_or_default(),
                if count > 1 {
                    format!("{reason} (×{count})")
                } else {
                    reason
                },
                e.note.clone().unwrap_or_default(),
            ]
        })
        .collect();
    if rows.is_empty() {
        out.push_str("Events: none\n");
    } else {
        out.push_str("Events:\n");
        table(&mut out, &["AGE", "TYPE", "REASON", "MESSAGE"], &rows);
    }
    out
}

/// Each pod's verdict of the quality gate (the `openmed.ai/model-quality`
/// condition the operator sets, its message the figures), with the
/// version its template serves.
fn quality_gate(out: &mut String, pods: &[Pod], versions: &BTreeMap<String, String>) {
    if pods.is_empty() {
        out.push_str("Quality gate: no pod\n");
        return;
    }
    out.push_str("Quality gate:\n");
    let mut pods: Vec<&Pod> = pods.iter().collect();
    pods.sort_by_key(|p| p.name_any());
    let rows: Vec<Vec<String>> = pods
        .iter()
        .map(|pod| {
            let version = pod
                .labels()
                .get(MANIFEST_SNAPSHOT_LABEL)
                .and_then(|h| versions.get(h).cloned())
                .unwrap_or_else(|| "-".to_owned());
            let gate = pod
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == QUALITY_CONDITION));
            let (verdict, message) = match gate {
                Some(c) => (
                    match c.status.as_str() {
                        "True" => "Passed".to_owned(),
                        "False" => "Failed".to_owned(),
                        other => other.to_owned(),
                    },
                    c.message.clone().unwrap_or_default(),
                ),
                None => ("Waiting".to_owned(), "not judged yet".to_owned()),
            };
            vec![pod.name_any(), version, verdict, message]
        })
        .collect();
    columns(out, "  ", &["POD", "VERSION", "GATE", "FIGURES"], &rows);
}

/// One line per resource.
pub fn list_view(models: &[OpenMedModel], now: Timestamp, namespaces: bool) -> String {
    let mut rows: Vec<Vec<String>> = Vec::new();
    for m in models {
        let s = m.status.clone().unwrap_or_default();
        let mut row = Vec::new();
        if namespaces {
            row.push(m.namespace().unwrap_or_default());
        }
        row.extend([
            m.name_any(),
            s.phase.map_or("Unknown", Phase::as_str).to_owned(),
            or_dash(s.desired_version.as_deref()).to_owned(),
            or_dash(s.active_version.as_deref()).to_owned(),
            s.rollback_count.unwrap_or(0).to_string(),
            m.metadata
                .creation_timestamp
                .as_ref()
                .map_or("-".to_owned(), |t| age(t.0, now)),
        ]);
        rows.push(row);
    }
    let mut headers = vec!["NAME", "PHASE", "DESIRED", "ACTIVE", "ROLLBACKS", "AGE"];
    if namespaces {
        headers.insert(0, "NAMESPACE");
    }
    let mut out = String::new();
    if rows.is_empty() {
        out.push_str("No OpenMedModels found.\n");
    } else {
        columns(&mut out, "", &headers, &rows);
    }
    out
}

/// The Deployment the resource names (its own name by default).
fn target(model: &OpenMedModel) -> String {
    model
        .spec
        .target_ref
        .name
        .clone()
        .unwrap_or_else(|| model.name_any())
}

fn or_dash(value: Option<&str>) -> &str {
    value.unwrap_or("-")
}

fn model_key(model: &OpenMedModel) -> String {
    format!(
        "{}/{}",
        model.namespace().unwrap_or_default(),
        model.name_any()
    )
}

/// Short manifest hash → version, from the resource's snapshots.
fn versions_by_hash(snapshots: &[ConfigMap], key: &str) -> BTreeMap<String, String> {
    snapshots
        .iter()
        .filter(|cm| {
            cm.annotations()
                .get(MODEL_RESOURCE_ANNOTATION)
                .map(String::as_str)
                == Some(key)
        })
        .filter_map(|cm| {
            let short = cm.labels().get(MANIFEST_SNAPSHOT_LABEL)?.clone();
            let version = cm.data.as_ref()?.get(PRELOAD_ENV)?.clone();
            Some((short, version))
        })
        .collect()
}

/// The preload value written in a ReplicaSet's template, for revisions from
/// before the operator managed the Deployment.
fn preload(rs: &ReplicaSet) -> Option<String> {
    let spec = rs.spec.as_ref()?.template.as_ref()?.spec.as_ref()?;
    spec.containers
        .iter()
        .flat_map(|c| c.env.iter().flatten())
        .find(|e| e.name == PRELOAD_ENV)
        .and_then(|e| e.value.clone())
        .filter(|v| !v.is_empty())
}

fn revision(rs: &ReplicaSet) -> i64 {
    rs.annotations()
        .get("deployment.kubernetes.io/revision")
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

/// When the event last happened: a repeat's latest occurrence, else its
/// only one.
fn event_time(e: &Event) -> Option<Timestamp> {
    e.series
        .as_ref()
        .map(|s| s.last_observed_time.0)
        .or_else(|| e.deprecated_last_timestamp.as_ref().map(|t| t.0))
        .or_else(|| e.event_time.as_ref().map(|t| t.0))
        .or_else(|| e.deprecated_first_timestamp.as_ref().map(|t| t.0))
        .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

/// The Event's resourceVersion as a number (0 when it is not one: the API
/// promises nothing about its form, but etcd-backed servers count up).
fn written(e: &Event) -> u64 {
    e.metadata
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The soak of the version last rolled out: running with the time left,
/// soaked and when, or what failed it.
fn soak_line(status: &crate::api::OpenMedModelStatus, now: Timestamp) -> Option<String> {
    let soak = status.soak.as_ref()?;
    let condition = status.conditions.iter().find(|c| c.type_ == "Soaked");
    let version = &soak.version;
    if let Some(at) = &soak.soaked_time {
        // Without a soak asked for there is nothing to say about one.
        return (soak.start_time != soak.end_time)
            .then(|| format!("{version} soaked {} ago", age(at.0, now)));
    }
    match condition.map(|c| c.reason.as_str()) {
        Some("Soaking") => {
            let left = (soak.end_time.0.as_second() - now.as_second()).max(0);
            let total = soak.end_time.0.as_second() - soak.start_time.0.as_second();
            Some(format!(
                "{version} soaking: {left}s left of {total}s (until {})",
                soak.end_time.0
            ))
        }
        Some("SoakFailed" | "SoakAborted") => condition.map(|c| c.message.clone()),
        _ => None,
    }
}

/// `5s`, `3m`, `2h`, `4d`, as kubectl prints ages.
/// The model's own autoscaler: its name, the pods it counts and asks for,
/// its bounds, and why it cannot scale on its metrics when it cannot.
fn autoscaling_line(model: &OpenMedModel) -> Option<String> {
    let asked = model.spec.autoscaling.as_ref()?;
    let bounds = format!("{} to {} pods", asked.min_replicas, asked.max_replicas);
    let Some(seen) = model.status.as_ref().and_then(|s| s.autoscaling.as_ref()) else {
        return Some(format!("not written yet ({bounds})"));
    };
    let counts = match (seen.current_replicas, seen.desired_replicas) {
        (Some(current), Some(desired)) => format!("{current} pods, asks for {desired}"),
        _ => "no count reported yet".to_owned(),
    };
    let mut line = format!("{} {counts} ({bounds})", seen.name);
    if let Some(why) = &seen.not_scaling {
        line.push_str(&format!("; not scaling: {why}"));
    }
    Some(line)
}

fn age(then: Timestamp, now: Timestamp) -> String {
    let seconds = now.duration_since(then).as_secs().max(0);
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// Left-aligned columns two spaces apart, indented by two.
fn table(out: &mut String, headers: &[&str], rows: &[Vec<String>]) {
    columns(out, "  ", headers, rows);
}

/// Left-aligned columns two spaces apart, each line starting with `indent`.
fn columns(out: &mut String, indent: &str, headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |out: &mut String, cells: Vec<&str>| {
        let mut text = String::from(indent);
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                text.push_str(cell);
            } else {
                let pad = w - cell.chars().count();
                text.push_str(cell);
                text.push_str(&" ".repeat(pad + 2));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(out, headers.to_vec());
    for row in rows {
        line(out, row.iter().map(String::as_str).collect());
    }
}

/// Reads everything the view shows.
async fn observe(client: &Client, namespace: &str, name: &str) -> Result<Observed, kube::Error> {
    let models: Api<OpenMedModel> = Api::namespaced(client.clone(), namespace);
    let model = models.get(name).await?;
    let target = target(&model);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let deployment = deployments.get_opt(&target).await?;
    let mut replica_sets = Vec::new();
    if let Some(d) = &deployment {
        let uid = d.metadata.uid.clone();
        let sets: Api<ReplicaSet> = Api::namespaced(client.clone(), namespace);
        let selector = selector(d);
        replica_sets = sets
            .list(&ListParams::default().labels(&selector))
            .await?
            .items
            .into_iter()
            .filter(|rs| {
                rs.owner_references()
                    .iter()
                    .any(|o| Some(&o.uid) == uid.as_ref())
            })
            .collect();
    }
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let snapshots = config_maps
        .list(&ListParams::default().labels(MANIFEST_SNAPSHOT_LABEL))
        .await?
        .items;
    let mut pods = Vec::new();
    if let (Some(d), Some(_)) = (&deployment, &model.spec.quality_gate) {
        let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
        pods = api
            .list(&ListParams::default().labels(&selector(d)))
            .await?
            .items;
    }
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    let events = events
        .list(&ListParams::default().fields(&format!(
            "regarding.kind=OpenMedModel,regarding.name={name}"
        )))
        .await?
        .items;
    Ok(Observed {
        model,
        deployment,
        replica_sets,
        snapshots,
        events,
        pods,
    })
}

/// The Deployment's selector as a label selector string.
fn selector(d: &Deployment) -> String {
    d.spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.as_ref())
        .map(|labels| {
            labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default()
}

fn now() -> Timestamp {
    Timestamp::now()
}

/// `status NAME [--watch]`.
pub fn status(args: &StatusArgs) -> u8 {
    super::with_cluster(|client| async move {
        let namespace = super::namespace_or_default(&client, &args.namespace);
        let name = &args.name;
        let first = match observe(&client, &namespace, name).await {
            Ok(o) => o,
            Err(e) => {
                eprintln!("openmed-op: {namespace}/{name}: {e}");
                return EXIT_USAGE;
            }
        };
        let mut shown = view(&first, now());
        print!("{shown}");
        if !args.watch {
            return EXIT_OK;
        }
        match redraw_on_change(&client, &namespace, name, &mut shown).await {
            Ok(()) => EXIT_OK,
            Err(e) => {
                eprintln!("openmed-op: {namespace}/{name}: {e}");
                EXIT_USAGE
            }
        }
    })
}

/// Redraws whenever a watch of the resource, the namespace's ReplicaSets
/// or its events reports a change, until Ctrl-C. On a terminal the screen
/// is redrawn in place; otherwise each new view follows a blank line.
async fn redraw_on_change(
    client: &Client,
    namespace: &str,
    name: &str,
    shown: &mut String,
) -> Result<(), kube::Error> {
    use std::io::IsTerminal;
    let models: Api<OpenMedModel> = Api::namespaced(client.clone(), namespace);
    let sets: Api<ReplicaSet> = Api::namespaced(client.clone(), namespace);
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    let named = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let about = watcher::Config::default().fields(&format!(
        "regarding.kind=OpenMedModel,regarding.name={name}"
    ));
    let changes = futures::stream::select_all([
        watcher(models, named).map_ok(|_| ()).boxed(),
        watcher(sets, watcher::Config::default())
            .map_ok(|_| ())
            .boxed(),
        watcher(events, about).map_ok(|_| ()).boxed(),
    ]);
    // A burst of changes (a rollout moves several objects at once) is one
    // redraw: what arrives within 100 ms of the first change joins it, so
    // a long rollout still redraws at least ten times a second at most.
    let mut changes = std::pin::pin!(changes);
    let terminal = std::io::stdout().is_terminal();
    let ctrl_c = tokio::signal::ctrl_c();
    let mut ctrl_c = std::pin::pin!(ctrl_c);
    // A running soak's time left changes with no change in the cluster: it
    // is counted down from what was last read, without reading again.
    let mut last = observe(client, namespace, name).await?;
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    let show = |next: String, shown: &mut String| {
        if next != *shown {
            if terminal {
                print!("\x1b[H\x1b[2J{next}");
            } else {
                print!("\n{next}");
            }
            use std::io::Write;
            let _ = std::io::stdout().flush();
            *shown = next;
        }
    };
    loop {
        tokio::select! {
            _ = &mut ctrl_c => return Ok(()),
            _ = tick.tick() => {
                if shown.contains(" soaking: ") {
                    show(view(&last, now()), shown);
                }
            }
            change = changes.next() => {
                // A watch error is retried by the watcher; the view simply
                // waits for the next change.
                if change.is_none() {
                    return Ok(());
                }
                let until = tokio::time::Instant::now() + Duration::from_millis(100);
                while let Ok(Some(_)) = tokio::time::timeout_at(until, changes.next()).await {}
                let observed = match observe(client, namespace, name).await {
                    Ok(o) => o,
                    Err(kube::Error::Api(e)) if e.code == 404 => {
                        println!("\n{namespace}/{name} was deleted");
                        return Ok(());
                    }
                    Err(e) => return Err(e),
                };
                show(view(&observed, now()), shown);
                last = observed;
            }
        }
    }
}

/// `list [-n NS | -A]`.
pub fn list(args: &ListArgs) -> u8 {
    super::with_cluster(|client| async move {
        let api: Api<OpenMedModel> = if args.all_namespaces {
            Api::all(client.clone())
        } else {
            Api::namespaced(
                client.clone(),
                &super::namespace_or_default(&client, &args.namespace),
            )
        };
        match api.list(&ListParams::default()).await {
            Ok(list) => {
                let mut items = list.items;
                items.sort_by_key(|m| (m.namespace(), m.name_any()));
                print!("{}", list_view(&items, now(), args.all_namespaces));
                EXIT_OK
            }
            Err(e) => {
                eprintln!("openmed-op: {e}");
                EXIT_USAGE
            }
        }
    })
}

/// The canary's traffic now: its weight, or the share of requests copied
/// to it in a mirror step.
pub(super) fn traffic_share(c: &crate::api::CanaryStatus) -> String {
    match c.mirror {
        Some(percent) => format!("a copy of {percent}% of the requests (serving none)"),
        None => format!("weight {}%", c.weight),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// An event as the operator writes it: `eventTime` in microseconds,
    /// a `series` for repeats.
    fn event(name: &str, reason: &str, at: &str, version: &str, series: Option<&str>) -> Event {
        let mut event = json!({
            "metadata": {"name": name, "namespace": "team", "resourceVersion": version},
            "regarding": {"kind": "OpenMedModel", "name": "svc"},
            "reason": reason, "note": reason, "type": "Normal", "action": "Rollout",
            "eventTime": at, "reportingController": "openmed-operator",
        });
        if let Some(last) = series {
            event["series"] = json!({"count": 2, "lastObservedTime": last});
        }
        serde_json::from_value(event).unwrap()
    }

    /// A core Event, as an operator before events.k8s.io/v1 wrote them,
    /// read through events.k8s.io/v1: whole seconds and a count.
    fn legacy_event(name: &str, reason: &str, at: &str, version: &str, count: i32) -> Event {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "team", "resourceVersion": version},
            "regarding": {"kind": "OpenMedModel", "name": "svc"},
            "reason": reason, "note": reason, "type": "Normal",
            "deprecatedFirstTimestamp": at, "deprecatedLastTimestamp": at,
            "deprecatedCount": count,
        }))
        .unwrap()
    }

    fn observed(status: serde_json::Value, events: Vec<Event>) -> Observed {
        let model: OpenMedModel = serde_json::from_value(json!({
            "apiVersion": "openmed.ai/v1alpha1", "kind": "OpenMedModel",
            "metadata": {"name": "svc", "namespace": "team"},
            "spec": {"family": "pii", "tier": "Small", "version": "v2",
                "canary": {
                    "targetRef": {"name": "svc-canary"},
                    "trafficRef": {"httpRoute": "svc", "stableBackend": "svc", "canaryBackend": "svc-canary"},
                    "steps": [{"weight": 10}, {"weight": 50}]}},
            "status": status,
        }))
        .unwrap();
        Observed {
            model,
            deployment: None,
            replica_sets: Vec::new(),
            snapshots: Vec::new(),
            events,
            pods: Vec::new(),
        }
    }

    #[test]
    fn an_autoscaled_model_shows_what_its_autoscaler_counts_and_asks_for() {
        let now: Timestamp = "2026-12-01T10:02:00Z".parse().unwrap();
        let line = |autoscaling: Option<serde_json::Value>, status: serde_json::Value| {
            let mut o = observed(status, Vec::new());
            o.model.spec.autoscaling = autoscaling.map(|a| serde_json::from_value(a).unwrap());
            view(&o, now)
                .lines()
                .find(|l| l.starts_with("Autoscaler:"))
                .map(str::to_owned)
        };
        let asked = Some(json!({"minReplicas": 2, "maxReplicas": 8}));
        assert_eq!(line(None, json!({})), None, "none asked for, no line");
        assert_eq!(
            line(asked.clone(), json!({})).as_deref(),
            Some("Autoscaler: not written yet (2 to 8 pods)")
        );
        assert_eq!(
            line(
                asked.clone(),
                json!({"autoscaling": {"name": "svc", "currentReplicas": 3, "desiredReplicas": 5}})
            )
            .as_deref(),
            Some("Autoscaler: svc 3 pods, asks for 5 (2 to 8 pods)")
        );
        assert_eq!(
            line(
                asked,
                json!({"autoscaling": {"name": "svc", "currentReplicas": 2, "desiredReplicas": 2,
                    "notScaling": "FailedGetPodsMetric: no metrics"}})
            )
            .as_deref(),
            Some(
                "Autoscaler: svc 2 pods, asks for 2 (2 to 8 pods); not scaling: FailedGetPodsMetric: no metrics"
            )
        );
    }

    #[test]
    fn a_running_soak_shows_the_time_left_and_a_finished_one_when_it_soaked() {
        let now: Timestamp = "2026-12-01T10:02:00Z".parse().unwrap();
        let soak = |soaked: Option<&str>, reason: &str| {
            let mut soak = json!({"version": "v2", "specHash": "sha256:x",
                "startTime": "2026-12-01T10:00:00Z", "endTime": "2026-12-01T10:05:00Z"});
            if let Some(at) = soaked {
                soak["soakedTime"] = json!(at);
            }
            json!({"soak": soak, "conditions": [{"type": "Soaked",
                "status": if soaked.is_some() { "True" } else { "False" },
                "reason": reason, "message": "v2 failed its soak: pod a restarted during the soak",
                "lastTransitionTime": "2026-12-01T10:00:00Z"}]})
        };
        let line = |status| {
            view(&observed(status, Vec::new()), now)
                .lines()
                .find(|l| l.starts_with("Soak:"))
                .map(str::to_owned)
        };
        assert_eq!(
            line(soak(None, "Soaking")).as_deref(),
            Some("Soak:       v2 soaking: 180s left of 300s (until 2026-12-01T10:05:00Z)")
        );
        assert_eq!(
            line(soak(Some("2026-12-01T10:01:00Z"), "Soaked")).as_deref(),
            Some("Soak:       v2 soaked 60s ago")
        );
        assert_eq!(
            line(soak(None, "SoakFailed")).as_deref(),
            Some("Soak:       v2 failed its soak: pod a restarted during the soak")
        );
        assert_eq!(line(json!({})), None, "no soak on record, no line");
        let none_asked = json!({"soak": {"version": "v2", "specHash": "sha256:x",
            "startTime": "2026-12-01T10:00:00Z", "endTime": "2026-12-01T10:00:00Z",
            "soakedTime": "2026-12-01T10:00:00Z"}});
        assert_eq!(line(none_asked), None, "no soak asked for, no line");
    }

    #[test]
    fn events_list_in_the_order_they_happened() {
        let at = "2026-12-01T10:00:00Z";
        // Listed by name, as the API server does; written in another order.
        let events = vec![
            // Within one second, to the microsecond, whatever the names.
            event(
                "a",
                "RolloutSucceeded",
                "2026-12-01T10:00:01.000300Z",
                "130",
                None,
            ),
            event(
                "b",
                "RolloutStarted",
                "2026-12-01T10:00:01.000200Z",
                "131",
                None,
            ),
            // A repeat lists at its latest occurrence.
            event(
                "c",
                "DriftCorrected",
                "2026-12-01T09:59:58.000000Z",
                "132",
                Some("2026-12-01T10:00:02.000000Z"),
            ),
            // Older core Events of one second: in the order they were written.
            legacy_event("d", "RollbackSucceeded", at, "120", 1),
            legacy_event("e", "RollbackStarted", at, "101", 1),
            legacy_event("f", "CanaryWeightChanged", "2026-12-01T09:59:59Z", "99", 2),
        ];
        let now: Timestamp = "2026-12-01T10:00:30Z".parse().unwrap();
        let text = view(&observed(json!({}), events), now);
        let order: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("Events:"))
            .skip(2)
            .map(|l| l.split_whitespace().nth(2).unwrap())
            .collect();
        assert_eq!(
            order,
            [
                "CanaryWeightChanged",
                "RollbackStarted",
                "RollbackSucceeded",
                "RolloutStarted",
                "RolloutSucceeded",
                "DriftCorrected",
            ]
        );
        assert!(text.contains("CanaryWeightChanged (×2)"), "{text}");
        assert!(text.contains("DriftCorrected (×2)"), "{text}");
        assert!(text.contains("  28s  Normal"), "{text}");
    }

    #[test]
    fn a_canary_shows_its_step_and_weight() {
        let status = json!({
            "phase": "Canary", "desiredVersion": "v2", "activeVersion": "v1",
            "lastSuccessfulSpec": {"family": "pii", "tier": "Small", "version": "v1"},
            "canary": {"version": "v2", "specHash": "sha256:00", "state": "Progressing",
                "step": 2, "weight": 50, "message": "step 2 of 2 for 5m"},
        });
        let now: Timestamp = "2026-12-01T10:00:30Z".parse().unwrap();
        let text = view(&observed(status, Vec::new()), now);
        assert!(
            text.contains("Canary: v2 Progressing at step 2, weight 50%: step 2 of 2 for 5m"),
            "{text}"
        );
        assert!(text.contains("steps: 10% → *50% (* current)"), "{text}");
        assert!(text.contains("Retained:   v1\n"), "{text}");
        assert!(text.contains("Deployment svc: not found"), "{text}");
        assert!(text.contains("Events: none"), "{text}");
    }

    #[test]
    fn the_latest_round_of_analysis_and_the_drain_show() {
        let status = json!({
            "phase": "RolledBack", "desiredVersion": "v2", "activeVersion": "v1",
            "canary": {"version": "v2", "specHash": "sha256:00", "state": "Aborted",
                "step": 1, "weight": 0, "message": "canary of v2 aborted",
                "weightsBackTime": "2026-12-01T10:00:10Z", "drainedTime": "2026-12-01T10:00:13Z",
                "analysis": [
                    {"time": "2026-12-01T10:00:00Z", "name": "probes", "step": 1, "outcome": "Pass",
                     "message": "1 canary pod(s) passed: DATE recall 1.00 (3/3)"},
                    {"time": "2026-12-01T10:00:05Z", "name": "error-rate", "step": 1, "outcome": "Pass",
                     "message": "0 is within at most 0.01"},
                    {"time": "2026-12-01T10:00:10Z", "name": "probes", "step": 1, "outcome": "Fail",
                     "message": "pod svc-canary-1: DATE recall 0.00 is below 1.00 (minRecall)"},
                ]},
        });
        let now: Timestamp = "2026-12-01T10:00:30Z".parse().unwrap();
        let text = view(&observed(status, Vec::new()), now);
        assert!(
            text.contains("  drained 3s after the weights went back\n"),
            "{text}"
        );
        let rows: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.contains("analysis, latest of each check"))
            .skip(2)
            .take(2)
            .collect();
        assert_eq!(rows.len(), 2, "{text}");
        assert!(
            rows[0].contains("error-rate") && rows[0].contains("Pass"),
            "{text}"
        );
        assert!(
            rows[1].contains("probes")
                && rows[1].contains("Fail")
                && rows[1].contains("DATE recall 0.00 is below 1.00"),
            "only the latest probes round: {text}"
        );
    }

    #[test]
    fn each_pods_quality_verdict_shows_with_its_figures() {
        let mut o = observed(json!({"phase": "RollingOut"}), Vec::new());
        o.model.spec.quality_gate =
            Some(serde_json::from_value(json!({"configMapRef": {"name": "pii-probes"}})).unwrap());
        let pod = |name: &str, gate: Option<(&str, &str)>| -> Pod {
            let mut conditions = vec![json!({"type": "Ready", "status": "False"})];
            if let Some((status, message)) = gate {
                conditions
                    .push(json!({"type": QUALITY_CONDITION, "status": status, "message": message}));
            }
            serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {MANIFEST_SNAPSHOT_LABEL: "abc"}},
                "status": {"conditions": conditions},
            }))
            .unwrap()
        };
        o.pods = vec![
            pod(
                "svc-2",
                Some(("False", "DATE recall 0.00 is below 1.00 (minRecall)")),
            ),
            pod("svc-1", Some(("True", "passed: DATE recall 1.00 (3/3)"))),
            pod("svc-3", None),
        ];
        let now: Timestamp = "2026-12-01T10:00:30Z".parse().unwrap();
        let text = view(&o, now);
        let rows: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("Quality gate:"))
            .skip(2)
            .take(3)
            .collect();
        assert!(
            rows[0].contains("svc-1")
                && rows[0].contains("Passed")
                && rows[0].contains("DATE recall 1.00 (3/3)"),
            "{text}"
        );
        assert!(
            rows[1].contains("svc-2")
                && rows[1].contains("Failed")
                && rows[1].contains("below 1.00"),
            "{text}"
        );
        assert!(
            rows[2].contains("svc-3") && rows[2].contains("Waiting"),
            "{text}"
        );
    }

    #[test]
    fn list_lines_up_its_columns() {
        let model = |name: &str, phase: &str| -> OpenMedModel {
            serde_json::from_value(json!({
                "apiVersion": "openmed.ai/v1alpha1", "kind": "OpenMedModel",
                "metadata": {"name": name, "namespace": "team",
                    "creationTimestamp": "2026-12-01T09:00:00Z"},
                "spec": {"family": "pii", "tier": "Small", "version": "v1"},
                "status": {"phase": phase, "desiredVersion": "v1", "activeVersion": "v1"},
            }))
            .unwrap()
        };
        let now: Timestamp = "2026-12-01T10:00:00Z".parse().unwrap();
        let text = list_view(
            &[model("a", "Ready"), model("longer-name", "RolledBack")],
            now,
            true,
        );
        assert_eq!(
            text,
            "NAMESPACE  NAME         PHASE       DESIRED  ACTIVE  ROLLBACKS  AGE\n\
             team       a            Ready       v1       v1      0          60m\n\
             team       longer-name  RolledBack  v1       v1      0          60m\n"
        );
        assert_eq!(list_view(&[], now, false), "No OpenMedModels found.\n");
    }
}
