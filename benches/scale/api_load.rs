//! API load: the operator's requests, from the API server's audit log, and
//! the API server's own request counter as a cluster-wide cross-check.
//!
//! `apiserver_request_total` has no label for the client, so it cannot tell
//! the operator from the controller manager or the kubelet. The audit log
//! can: every event names the authenticated user, and the operator under
//! test runs as a ServiceAccount of its own.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kube::Client;
use serde_json::Value;

use crate::observe::Observer;
use crate::operator::Process;
use crate::report::{ApiLoad, ClusterLoad, OperatorLoad, RequestCount};
use crate::{log, round};

const WRITE_VERBS: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];
const READ_VERBS: [&str; 2] = ["get", "list"];

/// A position in the audit log; [`AuditCursor::read`] returns what was
/// written after it.
pub struct AuditCursor {
    path: PathBuf,
    offset: u64,
}

impl AuditCursor {
    /// The end of the log now.
    pub fn at_end(path: &Path) -> Self {
        AuditCursor {
            path: path.to_path_buf(),
            offset: std::fs::metadata(path).map_or(0, |m| m.len()),
        }
    }

    /// The events written since, as JSON. The API server rotates the log
    /// only at 1 GiB; if it did, the events before the rotation are lost
    /// and a warning says so.
    pub fn read(&self) -> Vec<Value> {
        let Ok(mut file) = std::fs::File::open(&self.path) else {
            return Vec::new();
        };
        let len = file.metadata().map_or(0, |m| m.len());
        let offset = if len < self.offset {
            log("warning: the audit log was rotated; some requests are not counted");
            0
        } else {
            self.offset
        };
        let mut text = Vec::new();
        if file.seek(SeekFrom::Start(offset)).is_err() || file.read_to_end(&mut text).is_err() {
            return Vec::new();
        }
        String::from_utf8_lossy(&text)
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }
}

/// Requests of one identity, by verb and resource.
#[derive(Debug, Default)]
pub struct Tally {
    counts: BTreeMap<(String, String), u64>,
    /// Watch requests started (long-running: counted apart).
    pub watches_opened: u64,
    user_agents: BTreeMap<String, u64>,
}

impl Tally {
    /// Write requests.
    pub fn writes(&self) -> u64 {
        self.sum(&WRITE_VERBS)
    }

    /// Read requests other than watches.
    pub fn reads(&self) -> u64 {
        self.sum(&READ_VERBS)
    }

    fn sum(&self, verbs: &[&str]) -> u64 {
        self.counts
            .iter()
            .filter(|((verb, _), _)| verbs.contains(&verb.as_str()))
            .map(|(_, n)| n)
            .sum()
    }

    /// Every (verb, resource), most frequent first, with a rate when the
    /// window is given.
    pub fn by_verb_resource(&self, window_s: Option<f64>) -> Vec<RequestCount> {
        let mut out: Vec<RequestCount> = self
            .counts
            .iter()
            .map(|((verb, resource), &count)| RequestCount {
                verb: verb.clone(),
                resource: resource.clone(),
                count,
                per_minute: window_s.map(|w| round(count as f64 * 60.0 / w)),
            })
            .collect();
        out.sort_by(|a, b| b.count.cmp(&a.count).then(a.verb.cmp(&b.verb)));
        out
    }
}

/// Counts the requests `identity` sent (as itself or impersonated). A watch
/// counts once, when its response starts; every other request when it
/// completes.
pub fn tally(events: &[Value], identity: &str) -> Tally {
    let mut tally = Tally::default();
    for event in events {
        let user = event["user"]["username"].as_str();
        let impersonated = event["impersonatedUser"]["username"].as_str();
        if user != Some(identity) && impersonated != Some(identity) {
            continue;
        }
        let verb = event["verb"].as_str().unwrap_or_default();
        let stage = event["stage"].as_str().unwrap_or_default();
        if verb == "watch" {
            if stage != "ResponseStarted" {
                continue;
            }
            tally.watches_opened += 1;
        } else if stage == "ResponseComplete" || stage == "Panic" {
            *tally
                .counts
                .entry((verb.to_owned(), resource_of(event)))
                .or_default() += 1;
        } else {
            continue;
        }
        if let Some(ua) = event["userAgent"].as_str() {
            *tally.user_agents.entry(ua.to_owned()).or_default() += 1;
        }
    }
    tally
}

/// `configmaps`, `deployments.apps`, `openmedmodels.openmed.ai/status`; a
/// non-resource request by its path.
fn resource_of(event: &Value) -> String {
    let object = &event["objectRef"];
    match object["resource"].as_str() {
        Some(resource) => {
            let mut name = resource.to_owned();
            if let Some(group) = object["apiGroup"].as_str().filter(|g| !g.is_empty()) {
                name = format!("{name}.{group}");
            }
            if let Some(sub) = object["subresource"].as_str().filter(|s| !s.is_empty()) {
                name = format!("{name}/{sub}");
            }
            name
        }
        None => event["requestURI"]
            .as_str()
            .unwrap_or_default()
            .split('?')
            .next()
            .unwrap_or_default()
            .to_owned(),
    }
}

/// `apiserver_request_total` summed over codes, by (verb, resource), for
/// resource requests only.
type Counter = BTreeMap<(String, String), f64>;

async fn scrape(client: &Client) -> Result<Counter, String> {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    let text = client
        .request_text(request)
        .await
        .map_err(|e| format!("the API server's /metrics: {e}"))?;
    let mut out = Counter::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |key: &str| -> String {
            labels
                .split("\",")
                .filter_map(|kv| kv.split_once("=\""))
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.trim_end_matches('"').to_owned())
                .unwrap_or_default()
        };
        let resource = label("resource");
        if resource.is_empty() {
            continue;
        }
        let mut name = resource;
        let group = label("group");
        if !group.is_empty() {
            name = format!("{name}.{group}");
        }
        let sub = label("subresource");
        if !sub.is_empty() {
            name = format!("{name}/{sub}");
        }
        let count: f64 = value.trim().parse().unwrap_or(0.0);
        *out.entry((label("verb").to_lowercase(), name)).or_default() += count;
    }
    Ok(out)
}

fn cluster_load(before: &Counter, after: &Counter, window_s: f64) -> ClusterLoad {
    let mut deltas: Vec<RequestCount> = after
        .iter()
        .filter_map(|(key, &n)| {
            let delta = n - before.get(key).copied().unwrap_or(0.0);
            (delta > 0.0).then(|| RequestCount {
                verb: key.0.clone(),
                resource: key.1.clone(),
                count: delta as u64,
                per_minute: Some(round(delta * 60.0 / window_s)),
            })
        })
        .collect();
    deltas.sort_by(|a, b| b.count.cmp(&a.count).then(a.verb.cmp(&b.verb)));
    // The metric's verbs: APPLY is a server-side apply, WATCH counts a watch
    // when it ends.
    let sum = |verbs: &[&str]| -> u64 {
        deltas
            .iter()
            .filter(|d| verbs.contains(&d.verb.as_str()))
            .map(|d| d.count)
            .sum()
    };
    let per_minute = |n: u64| round(n as f64 * 60.0 / window_s);
    ClusterLoad {
        window_s: round(window_s),
        writes_per_minute: per_minute(sum(&[
            "post",
            "put",
            "patch",
            "apply",
            "delete",
            "deletecollection",
        ])),
        reads_per_minute: per_minute(sum(&["get", "list"])),
        watches_ended: sum(&["watch"]),
        requests: deltas,
    }
}

/// The control plane alone: no operator, no models.
pub async fn baseline(client: &Client, window: Duration) -> Result<ClusterLoad, String> {
    let before = scrape(client).await?;
    let started = Instant::now();
    tokio::time::sleep(window).await;
    let after = scrape(client).await?;
    Ok(cluster_load(
        &before,
        &after,
        started.elapsed().as_secs_f64(),
    ))
}

/// The steady state: once every model is Ready, the watches have been
/// calm for 10 s and the rest of the control plane is back near its
/// baseline, what the operator sends in `window`, and its CPU and memory
/// then.
pub async fn quiet_window(
    client: &Client,
    audit: &Path,
    identity: &str,
    baseline: Option<&ClusterLoad>,
    observer: &Observer,
    process: &Process,
    window: Duration,
) -> Result<ApiLoad, String> {
    observer
        .settle(Duration::from_secs(10), Duration::from_secs(120))
        .await;
    let (settle_s, settled) = settle_cluster(client, audit, identity, baseline).await?;
    log(format!("quiet window: {} s", window.as_secs()));
    let cursor = AuditCursor::at_end(audit);
    let before = scrape(client).await?;
    let cpu_before = process.sample().cpu_s;
    let started = Instant::now();
    tokio::time::sleep(window).await;
    let after = scrape(client).await?;
    let seconds = started.elapsed().as_secs_f64();
    let now = process.sample();
    process.record_quiet(seconds, now.cpu_s - cpu_before, now.rss_kib);
    let tally = tally(&cursor.read(), identity);
    let per_minute = |n: u64| round(n as f64 * 60.0 / seconds);
    let load = ApiLoad {
        window_s: round(seconds),
        settle_s,
        settled,
        operator: OperatorLoad {
            identity: identity.to_owned(),
            writes: tally.writes(),
            reads: tally.reads(),
            writes_per_minute: per_minute(tally.writes()),
            reads_per_minute: per_minute(tally.reads()),
            watches_opened: tally.watches_opened,
            requests: tally.by_verb_resource(Some(seconds)),
            user_agents: tally.user_agents.keys().cloned().collect(),
        },
        cluster: cluster_load(&before, &after, seconds),
    };
    log(format!(
        "quiet window: operator {} writes, {} reads, {} watches opened",
        load.operator.writes, load.operator.reads, load.operator.watches_opened
    ));
    Ok(load)
}

/// Waits (at most 10 minutes) until everyone but the operator writes at
/// most about the baseline rate: after a large convergence the controller
/// manager keeps flushing its backlog of Events for minutes, and that is
/// not the steady state. The operator's own writes do not count, so an
/// operator that writes all the time is still measured.
async fn settle_cluster(
    client: &Client,
    audit: &Path,
    identity: &str,
    baseline: Option<&ClusterLoad>,
) -> Result<(f64, bool), String> {
    const SAMPLE: Duration = Duration::from_secs(15);
    const LIMIT: Duration = Duration::from_secs(600);
    let baseline = baseline.map_or(20.0, |b| b.writes_per_minute);
    let allowed = (baseline * 1.5).max(baseline + 30.0);
    let started = Instant::now();
    loop {
        let cursor = AuditCursor::at_end(audit);
        let before = scrape(client).await?;
        let t = Instant::now();
        tokio::time::sleep(SAMPLE).await;
        let after = scrape(client).await?;
        let seconds = t.elapsed().as_secs_f64();
        let cluster = cluster_load(&before, &after, seconds);
        let operator = tally(&cursor.read(), identity).writes() as f64 * 60.0 / seconds;
        let others = cluster.writes_per_minute - operator;
        if others <= allowed {
            return Ok((round(started.elapsed().as_secs_f64()), true));
        }
        if started.elapsed() > LIMIT {
            log("the control plane did not settle; measuring anyway");
            return Ok((round(started.elapsed().as_secs_f64()), false));
        }
        let top = cluster
            .requests
            .first()
            .map(|r| format!(" (most: {} {})", r.verb, r.resource))
            .unwrap_or_default();
        log(format!(
            "the control plane is still busy: {others:.0} writes / min by others{top}, baseline {baseline:.0}; waiting"
        ));
    }
}
