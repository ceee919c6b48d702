//! The results: what is written as JSON (one row per operator and N), and
//! the same figures as a table, side by side, for the terminal and Markdown.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::workload::Workload;
use crate::{OperatorUnderTest, redact, root};

/// Everything one run measured.
#[derive(Debug, Serialize)]
pub struct Results {
    /// Version of this layout.
    pub schema: &'static str,
    /// When the run started (UTC).
    pub date: String,
    /// Where it ran.
    pub machine: Machine,
    /// The repository's commit (with `-dirty` when it had changes).
    pub commit: Option<String>,
    /// The API server's version.
    pub control_plane: Option<String>,
    /// The options of the run.
    pub settings: Settings,
    /// The control plane alone, with no operator and no models, over a
    /// window as long as the quiet window.
    pub baseline: Option<ClusterLoad>,
    /// One row per operator and N.
    pub runs: Vec<Row>,
    /// `render` and `verify`.
    pub offline: Option<Offline>,
    /// What stopped the cluster measurements early, if anything.
    pub errors: Vec<String>,
}

impl Results {
    /// Empty results for this machine.
    pub fn new(machine: Option<String>, settings: Settings) -> Self {
        let now = k8s_openapi::jiff::Timestamp::now();
        Results {
            schema: "openmed-op/bench-scale/v1",
            date: k8s_openapi::jiff::Timestamp::from_second(now.as_second())
                .map_or_else(|_| now.to_string(), |t| t.to_string()),
            machine: Machine::detect(machine),
            commit: commit(),
            control_plane: None,
            settings,
            baseline: None,
            runs: Vec::new(),
            offline: None,
            errors: Vec::new(),
        }
    }
}

/// The machine.
#[derive(Debug, Serialize)]
pub struct Machine {
    /// A short name for file names: `--machine`, else `<host>-<cpus>cpu-<GiB>g`.
    pub name: String,
    /// CPUs available to the run.
    pub cpus: usize,
    /// Physical memory, GiB.
    pub memory_gib: f64,
    /// `/proc/cpuinfo`'s model name.
    pub cpu_model: String,
    /// The kernel release.
    pub kernel: String,
}

impl Machine {
    fn detect(name: Option<String>) -> Self {
        let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let memory_kib: f64 = read("/proc/meminfo")
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        let memory_gib = (memory_kib / 1048576.0 * 10.0).round() / 10.0;
        let host = read("/proc/sys/kernel/hostname").trim().to_owned();
        Machine {
            name: name.unwrap_or_else(|| format!("{host}-{cpus}cpu-{}g", memory_gib.round())),
            cpus,
            memory_gib,
            cpu_model: read("/proc/cpuinfo")
                .lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
                .unwrap_or_default(),
            kernel: read("/proc/sys/kernel/osrelease").trim().to_owned(),
        }
    }
}

fn commit() -> Option<String> {
    let repo = git2::Repository::discover(root()).ok()?;
    let id = repo.head().ok()?.peel_to_commit().ok()?.id().to_string();
    let mut options = git2::StatusOptions::new();
    options.include_untracked(false);
    let dirty = repo
        .statuses(Some(&mut options))
        .map(|s| !s.is_empty())
        .unwrap_or(false);
    Some(format!(
        "{}{}",
        &id[..12],
        if dirty { "-dirty" } else { "" }
    ))
}

/// The options of the run.
#[derive(Debug, Serialize)]
pub struct Settings {
    /// The Ns.
    pub models: Vec<usize>,
    /// The operators under test.
    pub operators: Vec<OperatorSetting>,
    /// Namespaces the models are spread over (at most N).
    pub namespaces: usize,
    /// `spec.replicas` of each target Deployment.
    pub target_replicas: i32,
    /// Create requests in flight at once.
    pub concurrency: usize,
    /// Length of the quiet window, seconds.
    pub quiet_window_s: u64,
    /// Version changes timed.
    pub reaction_changes: usize,
    /// Resources they rotate over (at most N).
    pub reaction_sample: usize,
    /// Resources rolled back (at most N).
    pub rollbacks: usize,
    /// Models `render` was timed on.
    pub render_models: Option<usize>,
    /// Files of the `verify` repository.
    pub verify_files: Option<usize>,
    /// Commits of the `verify` repository.
    pub verify_commits: Option<usize>,
}

/// An operator under test, as named in the results.
#[derive(Debug, Serialize)]
pub struct OperatorSetting {
    /// Its name.
    pub name: String,
    /// Its command.
    pub command: String,
}

/// One operator at one N.
#[derive(Debug, Serialize)]
pub struct Row {
    /// The operator's name.
    pub operator: String,
    /// Its command.
    pub command: String,
    /// N.
    pub models: usize,
    /// Namespaces they were spread over.
    pub namespaces: usize,
    /// Creating the target Deployments (before any model).
    pub setup: Option<Setup>,
    /// N models created at once.
    pub convergence: Option<Convergence>,
    /// The quiet window.
    pub api_load: Option<ApiLoad>,
    /// Version changes.
    pub reaction: Option<Reaction>,
    /// Automatic rollbacks.
    pub rollback: Option<Rollback>,
    /// Memory and CPU of the operator process.
    pub footprint: Option<Footprint>,
    /// Deleting every OpenMedModel at once until the operator had released
    /// them all (finalizers removed), seconds.
    pub release_s: Option<f64>,
    /// Deleting the namespaces afterwards, seconds.
    pub cleanup_s: Option<f64>,
    /// How the operator stopped on SIGTERM.
    pub operator_exit: Option<String>,
    /// Measurements that failed.
    pub errors: Vec<String>,
}

impl Row {
    /// An empty row.
    pub fn new(operator: &OperatorUnderTest, plan: &Workload) -> Self {
        Row {
            operator: operator.name.clone(),
            command: redact(&operator.command),
            models: plan.models,
            namespaces: plan.namespaces.len(),
            setup: None,
            convergence: None,
            api_load: None,
            reaction: None,
            rollback: None,
            footprint: None,
            release_s: None,
            cleanup_s: None,
            operator_exit: None,
            errors: Vec::new(),
        }
    }
}

/// Creating the targets.
#[derive(Debug, Serialize)]
pub struct Setup {
    /// Until every create returned, seconds.
    pub deployments_created_s: f64,
    /// Until every Deployment was available, seconds.
    pub deployments_available_s: f64,
}

/// N OpenMedModels created at once; times from the first create.
#[derive(Debug, Serialize)]
pub struct Convergence {
    /// Until every create returned (the API server's pace).
    pub models_created_s: f64,
    /// Until every Deployment carried its expected pod-template hash.
    pub hashes_applied_s: f64,
    /// Until every OpenMedModel was Ready at its version.
    pub ready_s: f64,
    /// Per model, from its create request to its hash.
    pub hash_latency: Percentiles,
    /// Per model, from its create request to Ready.
    pub ready_latency: Percentiles,
    /// The operator's write requests during convergence, per model.
    pub operator_writes_per_model: f64,
    /// Its get and list requests, per model.
    pub operator_reads_per_model: f64,
    /// Watch requests it started.
    pub operator_watches_opened: u64,
    /// Its requests by verb and resource.
    pub operator_requests: Vec<RequestCount>,
    /// CPU seconds from the first create until every hash was applied, of
    /// the operator, each control-plane process and the harness: where the
    /// work of the operator's phase went.
    pub cpu_until_hashes_s: BTreeMap<String, f64>,
    /// The same until every model was Ready.
    pub cpu_until_ready_s: BTreeMap<String, f64>,
}

/// Reaction to `spec.version` changes.
#[derive(Debug, Serialize)]
pub struct Reaction {
    /// Changes timed.
    pub changes: usize,
    /// Resources they rotated over.
    pub resources: usize,
    /// From sending the patch to the Deployment's new hash arriving on a watch.
    pub latency: Percentiles,
    /// The patch request alone.
    pub patch_round_trip: Percentiles,
}

/// Automatic rollbacks.
#[derive(Debug, Serialize)]
pub struct Rollback {
    /// Resources rolled back at once.
    pub resources: usize,
    /// Their progress deadline, seconds.
    pub progress_deadline_s: i64,
    /// From `ProgressDeadlineExceeded` to the last good hash.
    pub latency: Percentiles,
    /// From the bad version's patch to `ProgressDeadlineExceeded` (the
    /// deadline plus the Deployment controller's reaction).
    pub deadline_exceeded_after: Percentiles,
}

/// The quiet window.
#[derive(Debug, Serialize)]
pub struct ApiLoad {
    /// Its length, seconds.
    pub window_s: f64,
    /// How long the harness waited before it for the rest of the control
    /// plane to settle, seconds.
    pub settle_s: f64,
    /// Whether it did settle (within 10 minutes).
    pub settled: bool,
    /// The operator's requests (audit log, its identity).
    pub operator: OperatorLoad,
    /// Every client's (`apiserver_request_total`, resource requests).
    pub cluster: ClusterLoad,
}

/// The operator's requests in the quiet window.
#[derive(Debug, Serialize)]
pub struct OperatorLoad {
    /// The user name it was counted by.
    pub identity: String,
    /// create, update, patch, delete, deletecollection.
    pub writes: u64,
    /// get, list (not watch).
    pub reads: u64,
    /// Writes per minute.
    pub writes_per_minute: f64,
    /// Reads per minute.
    pub reads_per_minute: f64,
    /// Watch requests started in the window (a watch that the server or
    /// the client ended and that was resumed).
    pub watches_opened: u64,
    /// Its requests by verb and resource.
    pub requests: Vec<RequestCount>,
    /// The User-Agents its requests carried.
    pub user_agents: Vec<String>,
}

/// `apiserver_request_total` over a window, every client.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterLoad {
    /// Length, seconds.
    pub window_s: f64,
    /// POST, PUT, PATCH, APPLY, DELETE, DELETECOLLECTION per minute.
    pub writes_per_minute: f64,
    /// GET, LIST per minute.
    pub reads_per_minute: f64,
    /// Watches that ended in the window (the metric counts a watch then).
    pub watches_ended: u64,
    /// By verb and resource.
    pub requests: Vec<RequestCount>,
}

/// Requests of one verb on one resource.
#[derive(Debug, Clone, Serialize)]
pub struct RequestCount {
    /// The verb, lower case.
    pub verb: String,
    /// `resource[.group][/subresource]`, or the path of a non-resource request.
    pub resource: String,
    /// How many.
    pub count: u64,
    /// Per minute, over a window.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_minute: Option<f64>,
}

/// The operator process (its process group), from /proc.
#[derive(Debug, Serialize)]
pub struct Footprint {
    /// The most resident memory seen (sampled every 200 ms, and the
    /// kernel's high-water mark of the main process), MiB.
    pub peak_rss_mib: f64,
    /// Resident memory at the end of the quiet window, MiB.
    pub steady_rss_mib: Option<f64>,
    /// CPU seconds from the first create until every model was Ready.
    pub cpu_convergence_s: Option<f64>,
    /// CPU seconds in the quiet window.
    pub cpu_quiet_s: Option<f64>,
    /// The same, as a percentage of one core.
    pub cpu_quiet_percent: Option<f64>,
    /// CPU seconds from start to before the cleanup.
    pub cpu_total_s: f64,
    /// Seconds it had been running then.
    pub uptime_s: f64,
    /// Processes in its group (more than 1 for a wrapper).
    pub processes: usize,
}

/// Percentiles of a set of durations (nearest rank), milliseconds.
#[derive(Debug, Serialize)]
pub struct Percentiles {
    /// How many.
    pub count: usize,
    /// Median.
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Largest.
    pub max_ms: f64,
}

impl Percentiles {
    /// Of `values`.
    pub fn of(mut values: Vec<Duration>) -> Self {
        values.sort();
        let at = |q: f64| -> f64 {
            if values.is_empty() {
                return 0.0;
            }
            let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
            (values[rank - 1].as_secs_f64() * 10_000.0).round() / 10.0
        };
        Percentiles {
            count: values.len(),
            p50_ms: at(0.50),
            p90_ms: at(0.90),
            p99_ms: at(0.99),
            max_ms: at(1.0),
        }
    }
}

/// `render` and `verify`.
#[derive(Debug, Serialize)]
pub struct Offline {
    /// `openmed-op render DIR`.
    pub render: Option<OfflineRun>,
    /// `openmed-op verify --rev pr`.
    pub verify: Option<OfflineRun>,
    /// What failed.
    pub errors: Vec<String>,
}

/// Runs of one offline command.
#[derive(Debug, Serialize)]
pub struct OfflineRun {
    /// What was run, on what.
    pub what: String,
    /// How many times.
    pub runs: usize,
    /// Fastest, seconds.
    pub min_s: f64,
    /// Median, seconds.
    pub median_s: f64,
    /// Slowest, seconds.
    pub max_s: f64,
    /// Models (render) or files (verify) per second, at the median.
    pub items_per_s: f64,
    /// The largest peak resident memory of a run, MiB.
    pub peak_rss_mib: f64,
    /// Bytes written (render).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_bytes: Option<u64>,
}

/// The figures as (label, one cell per row), shared by both layouts.
fn figures(results: &Results) -> (Vec<String>, Vec<(String, Vec<String>)>) {
    let runs = &results.runs;
    let header: Vec<String> = runs
        .iter()
        .map(|r| format!("{} N={}", r.operator, r.models))
        .collect();
    let dash = || "–".to_owned();
    let cell = |f: &dyn Fn(&Row) -> Option<String>| -> Vec<String> {
        runs.iter().map(|r| f(r).unwrap_or_else(dash)).collect()
    };
    let n = |x: f64| format_number(x);
    let mut rows: Vec<(String, Vec<String>)> = vec![
        (
            "targets created / available (s)".into(),
            cell(&|r| {
                r.setup.as_ref().map(|s| {
                    format!(
                        "{} / {}",
                        n(s.deployments_created_s),
                        n(s.deployments_available_s)
                    )
                })
            }),
        ),
        (
            "models created (s)".into(),
            cell(&|r| r.convergence.as_ref().map(|c| n(c.models_created_s))),
        ),
        (
            "convergence: every hash applied (s)".into(),
            cell(&|r| r.convergence.as_ref().map(|c| n(c.hashes_applied_s))),
        ),
        (
            "convergence: every model Ready (s)".into(),
            cell(&|r| r.convergence.as_ref().map(|c| n(c.ready_s))),
        ),
        (
            "per model, create to hash p50 / p99 (ms)".into(),
            cell(&|r| {
                r.convergence.as_ref().map(|c| {
                    format!(
                        "{} / {}",
                        n(c.hash_latency.p50_ms),
                        n(c.hash_latency.p99_ms)
                    )
                })
            }),
        ),
        (
            "  CPU s to hashes: operator / apiserver / etcd".into(),
            cell(&|r| {
                r.convergence.as_ref().map(|c| {
                    let get = |k: &str| c.cpu_until_hashes_s.get(k).copied().map_or_else(dash, n);
                    format!(
                        "{} / {} / {}",
                        get("operator"),
                        get("kube-apiserver"),
                        get("etcd")
                    )
                })
            }),
        ),
        (
            "operator writes / reads per model".into(),
            cell(&|r| {
                r.convergence.as_ref().map(|c| {
                    format!(
                        "{} / {}",
                        n(c.operator_writes_per_model),
                        n(c.operator_reads_per_model)
                    )
                })
            }),
        ),
        (
            "reaction p50 / p90 / p99 / max (ms)".into(),
            cell(&|r| {
                r.reaction.as_ref().map(|x| {
                    let l = &x.latency;
                    format!(
                        "{} / {} / {} / {}",
                        n(l.p50_ms),
                        n(l.p90_ms),
                        n(l.p99_ms),
                        n(l.max_ms)
                    )
                })
            }),
        ),
        (
            "  changes; patch round trip p50 (ms)".into(),
            cell(&|r| {
                r.reaction
                    .as_ref()
                    .map(|x| format!("{}; {}", x.changes, n(x.patch_round_trip.p50_ms)))
            }),
        ),
        (
            "rollback p50 / max (ms)".into(),
            cell(&|r| {
                r.rollback.as_ref().map(|x| {
                    format!(
                        "{} / {} (n={})",
                        n(x.latency.p50_ms),
                        n(x.latency.max_ms),
                        x.resources
                    )
                })
            }),
        ),
        (
            "steady: control plane settled after (s)".into(),
            cell(&|r| {
                r.api_load.as_ref().map(|a| {
                    format!(
                        "{}{}",
                        n(a.settle_s),
                        if a.settled { "" } else { " (did not)" }
                    )
                })
            }),
        ),
        (
            "steady: operator writes / min".into(),
            cell(&|r| r.api_load.as_ref().map(|a| n(a.operator.writes_per_minute))),
        ),
        (
            "steady: operator reads / min (no watches)".into(),
            cell(&|r| r.api_load.as_ref().map(|a| n(a.operator.reads_per_minute))),
        ),
        (
            "steady: operator watches opened".into(),
            cell(&|r| {
                r.api_load
                    .as_ref()
                    .map(|a| format!("{} in {} s", a.operator.watches_opened, n(a.window_s)))
            }),
        ),
        (
            "steady: cluster writes / reads per min".into(),
            cell(&|r| {
                r.api_load.as_ref().map(|a| {
                    format!(
                        "{} / {}",
                        n(a.cluster.writes_per_minute),
                        n(a.cluster.reads_per_minute)
                    )
                })
            }),
        ),
        (
            "RSS peak / steady (MiB)".into(),
            cell(&|r| {
                r.footprint.as_ref().map(|f| {
                    format!(
                        "{} / {}",
                        n(f.peak_rss_mib),
                        f.steady_rss_mib.map_or_else(dash, n)
                    )
                })
            }),
        ),
        (
            "CPU s: convergence / quiet / total".into(),
            cell(&|r| {
                r.footprint.as_ref().map(|f| {
                    format!(
                        "{} / {} / {}",
                        f.cpu_convergence_s.map_or_else(dash, n),
                        f.cpu_quiet_s.map_or_else(dash, n),
                        n(f.cpu_total_s)
                    )
                })
            }),
        ),
        (
            "release every model (s)".into(),
            cell(&|r| r.release_s.map(n)),
        ),
    ];
    if runs.iter().any(|r| !r.errors.is_empty()) {
        rows.push((
            "errors".into(),
            cell(&|r| (!r.errors.is_empty()).then(|| r.errors.join("; "))),
        ));
    }
    (header, rows)
}

fn format_number(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else if x.abs() >= 100.0 {
        format!("{x:.0}")
    } else if x.abs() >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

fn title(results: &Results) -> String {
    let m = &results.machine;
    format!(
        "{} on {} ({} CPUs, {} GiB, {}), Kubernetes {}, commit {}",
        results.date,
        m.name,
        m.cpus,
        m.memory_gib,
        m.cpu_model,
        results.control_plane.as_deref().unwrap_or("–"),
        results.commit.as_deref().unwrap_or("–"),
    )
}

fn baseline_line(results: &Results) -> Option<String> {
    results.baseline.as_ref().map(|b| {
        format!(
            "control plane alone (no operator, no models, {} s): {} writes / min, {} reads / min",
            format_number(b.window_s),
            format_number(b.writes_per_minute),
            format_number(b.reads_per_minute)
        )
    })
}

fn offline_lines(results: &Results) -> Vec<String> {
    let Some(offline) = &results.offline else {
        return Vec::new();
    };
    let mut out: Vec<String> = [&offline.render, &offline.verify]
        .into_iter()
        .flatten()
        .map(|r| {
            format!(
                "{}: median {} s (min {}, max {}, {} runs), {} per second, peak RSS {} MiB",
                r.what,
                format_number(r.median_s),
                format_number(r.min_s),
                format_number(r.max_s),
                r.runs,
                format_number(r.items_per_s),
                format_number(r.peak_rss_mib)
            )
        })
        .collect();
    out.extend(offline.errors.iter().map(|e| format!("error: {e}")));
    out
}

/// The terminal table.
pub fn table(results: &Results) -> String {
    let mut out = format!("\n{}\n\n", title(results));
    let (header, rows) = figures(results);
    if !header.is_empty() {
        let label_width = rows
            .iter()
            .map(|(l, _)| l.chars().count())
            .max()
            .unwrap_or(0);
        let widths: Vec<usize> = (0..header.len())
            .map(|i| {
                rows.iter()
                    .map(|(_, cells)| cells[i].chars().count())
                    .chain([header[i].chars().count()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |label: &str, cells: &[String]| {
            let mut s = format!("{label:<label_width$}");
            for (cell, w) in cells.iter().zip(&widths) {
                s.push_str(&format!("   {cell:>w$}"));
            }
            s.trim_end().to_owned() + "\n"
        };
        out.push_str(&line("", &header));
        for (label, cells) in &rows {
            out.push_str(&line(label, cells));
        }
        out.push('\n');
    }
    if let Some(b) = baseline_line(results) {
        out.push_str(&format!("{b}\n"));
    }
    for l in offline_lines(results) {
        out.push_str(&format!("{l}\n"));
    }
    for e in &results.errors {
        out.push_str(&format!("error: {e}\n"));
    }
    out
}

/// The same as Markdown.
pub fn markdown(results: &Results) -> String {
    let mut out = format!(
        "# Scale benchmark, {}\n\n{}\n\nProduced by `cargo bench --bench scale`; \
         `docs/performance.md` explains every figure. Operators:\n\n",
        results.date.get(..10).unwrap_or(&results.date),
        title(results)
    );
    for o in &results.settings.operators {
        out.push_str(&format!("- {}: `{}`\n", o.name, o.command));
    }
    if results.settings.target_replicas != 1 {
        out.push_str(&format!(
            "\nEach target Deployment has {} replicas (`--target-replicas`).\n",
            results.settings.target_replicas
        ));
    }
    let (header, rows) = figures(results);
    if !header.is_empty() {
        out.push_str(&format!("\n| | {} |\n|---|", header.join(" | ")));
        out.push_str(&"---:|".repeat(header.len()));
        out.push('\n');
        for (label, cells) in &rows {
            let cells: Vec<String> = cells.iter().map(|c| c.replace('|', "\\|")).collect();
            out.push_str(&format!("| {} | {} |\n", label.trim(), cells.join(" | ")));
        }
    }
    if let Some(b) = baseline_line(results) {
        out.push_str(&format!("\n{b}.\n"));
    }
    let offline = offline_lines(results);
    if !offline.is_empty() {
        out.push_str("\nOffline:\n\n");
        for l in offline {
            out.push_str(&format!("- {l}\n"));
        }
    }
    for e in &results.errors {
        out.push_str(&format!("\nError: {e}\n"));
    }
    out
}
