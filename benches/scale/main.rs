//! Scale and latency of an operator that reconciles OpenMedModels, measured
//! on the real control plane of `tests/cluster`, and of the offline commands
//! (`render`, `verify`) at size.
//!
//! The operator under test is any command (`--operator-cmd`, repeatable, so
//! two operators can be compared in one run). The harness starts it with
//! `KUBECONFIG` set to a kubeconfig of its own ServiceAccount, creates N
//! target Deployments and N OpenMedModels for every N of `--models`, and
//! measures convergence, reaction and rollback latency from watches, the
//! operator's API requests in a quiet window from the API server's audit log
//! (with `apiserver_request_total` as a cluster-wide cross-check), and the
//! operator's memory and CPU from /proc. It prints a table and writes the
//! results as JSON (`--out`) and Markdown (beside it).
//!
//! ```sh
//! cargo bench --bench scale -- --models 10,100,1000 --out benches/results/DATE-MACHINE.json
//! ```
//!
//! `docs/performance.md` explains every figure. Nothing here asserts a time:
//! a benchmark reports, it does not pass or fail.

#[path = "../common/gitops_repo.rs"]
mod gitops_repo;

mod api_load;
mod cluster;
mod convergence;
mod observe;
mod offline;
mod operator;
mod reaction;
mod report;
mod rollback;
mod workload;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;

use report::{Results, Row};

/// Scale and latency benchmarks of an OpenMedModel operator on the test
/// control plane, and of `render` and `verify` offline.
#[derive(Debug, Parser)]
#[command(name = "scale")]
struct Args {
    /// Numbers of models to run with, each on a fresh set of namespaces.
    #[arg(long, value_delimiter = ',', default_value = "10,100,1000")]
    models: Vec<usize>,

    /// The operator under test, a shell command run from the repository
    /// root with KUBECONFIG set; repeat to compare operators in one run.
    /// Default: this repository's release binary, `run`.
    #[arg(long = "operator-cmd", value_name = "COMMAND")]
    operator_cmds: Vec<String>,

    /// A name for each --operator-cmd, in the same order [default: the
    /// command's program name].
    #[arg(long = "operator-name", value_name = "NAME")]
    operator_names: Vec<String>,

    /// Namespaces the models are spread over.
    #[arg(long, default_value_t = 10)]
    namespaces: usize,

    /// `spec.replicas` of each target Deployment. 0 leaves out the pods, so
    /// the Deployment controller and the fake kubelet do not bound the run
    /// (how N = 10,000 fits 2 cores); the rollback sample then asks for
    /// one replica through the OpenMedModel, to have a pod that fails.
    #[arg(long, default_value_t = 1, value_name = "N")]
    target_replicas: i32,

    /// Create requests in flight at once.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,

    /// Seconds of the quiet window in which steady-state API load is counted.
    #[arg(long, default_value_t = 120)]
    quiet: u64,

    /// `spec.version` changes timed for reaction latency.
    #[arg(long, default_value_t = 100)]
    changes: usize,

    /// Resources the version changes rotate over (at most N).
    #[arg(long, default_value_t = 25)]
    sample: usize,

    /// Resources rolled back at once for rollback latency (at most N).
    #[arg(long, default_value_t = 10)]
    rollbacks: usize,

    /// OpenMedModels `render` is timed on.
    #[arg(long, default_value_t = 10_000)]
    render_models: usize,

    /// OpenMedModel files in the repository `verify` is timed on.
    #[arg(long, default_value_t = 1000)]
    verify_files: usize,

    /// Commits on that repository's main branch.
    #[arg(long, default_value_t = 5000)]
    verify_commits: usize,

    /// Skip the cluster measurements.
    #[arg(long)]
    no_cluster: bool,

    /// Skip the offline measurements (render, verify).
    #[arg(long)]
    no_offline: bool,

    /// The control plane's state folder (started with tests/cluster/up
    /// unless it runs; stopped afterwards if this run started it).
    #[arg(long, default_value = "target/bench-cluster", value_name = "DIR")]
    cluster_dir: PathBuf,

    /// Leave a control plane this run started running.
    #[arg(long)]
    keep_cluster: bool,

    /// Write the results as JSON here, and as Markdown beside it (.md).
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,

    /// The machine's name in the results [default: <hostname>-<cpus>cpu-<GiB>g].
    #[arg(long)]
    machine: Option<String>,

    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

/// One operator under test.
#[derive(Debug, Clone)]
pub struct OperatorUnderTest {
    /// Its name in the results.
    pub name: String,
    /// The shell command that runs it.
    pub command: String,
}

/// The repository root: relative paths (commands, --out, --cluster-dir) are
/// taken from here.
pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The `openmed-op` binary `cargo bench` built with the bench profile (the
/// release settings), `target/release/openmed-op`.
pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_openmed-op")
}

/// `text` without machine-specific paths: the repository root becomes
/// relative, the home folder `~`. Results are committed.
pub fn redact(text: &str) -> String {
    let mut out = text.replace(&format!("{}/", root().display()), "");
    if let Ok(home) = std::env::var("HOME")
        && home.len() > 1
    {
        out = out.replace(&home, "~");
    }
    out
}

/// Prints progress on stderr with the time since the start.
pub fn log(message: impl AsRef<str>) {
    use std::sync::OnceLock;
    static START: OnceLock<Instant> = OnceLock::new();
    let start = START.get_or_init(Instant::now);
    eprintln!(
        "[{:>7.1}s] {}",
        start.elapsed().as_secs_f64(),
        message.as_ref()
    );
}

fn main() {
    let args = Args::parse();
    log("scale benchmark starting");
    let operators = operators(&args);
    let mut results = Results::new(args.machine.clone(), settings(&args, &operators));

    if !args.no_cluster && !args.models.is_empty() {
        let dir = root().join(&args.cluster_dir);
        let cluster = cluster::ControlPlane::start(&dir, args.keep_cluster);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let outcome = runtime.block_on(async {
            tokio::select! {
                r = cluster_runs(&args, &operators, &cluster, &mut results) => r,
                _ = tokio::signal::ctrl_c() => Err("interrupted".to_owned()),
            }
        });
        // Stops the operator (dropped with the future) before the cluster.
        drop(runtime);
        drop(cluster);
        if let Err(e) = outcome {
            log(format!("cluster measurements stopped: {e}"));
            results.errors.push(e);
        }
    }

    if !args.no_offline {
        results.offline = Some(offline::run(
            args.render_models,
            args.verify_files,
            args.verify_commits,
        ));
    }

    let table = report::table(&results);
    println!("{table}");
    if let Some(out) = &args.out {
        let out = root().join(out);
        if let Some(parent) = out.parent() {
            std::fs::create_dir_all(parent).expect("the --out folder");
        }
        let json = serde_json::to_string_pretty(&results).expect("results serialize");
        std::fs::write(&out, format!("{json}\n")).expect("--out is writable");
        let md = out.with_extension("md");
        std::fs::write(&md, report::markdown(&results)).expect("the Markdown file is writable");
        log(format!(
            "wrote {} and {}",
            redact(&out.display().to_string()),
            redact(&md.display().to_string())
        ));
    }
    if !results.errors.is_empty() || results.runs.iter().any(|r| !r.errors.is_empty()) {
        log("some measurements failed; see \"errors\" in the results");
    }
}

fn operators(args: &Args) -> Vec<OperatorUnderTest> {
    let commands = if args.operator_cmds.is_empty() {
        // Port 0: the metrics listener must not collide with anything.
        vec![format!("{} run --listen 127.0.0.1:0", binary())]
    } else {
        args.operator_cmds.clone()
    };
    commands
        .into_iter()
        .enumerate()
        .map(|(i, command)| {
            let name = args.operator_names.get(i).cloned().unwrap_or_else(|| {
                let program = command.split_whitespace().next().unwrap_or("operator");
                Path::new(program)
                    .file_name()
                    .map(|f| f.to_string_lossy().into_owned())
                    .unwrap_or_else(|| program.to_owned())
            });
            OperatorUnderTest { name, command }
        })
        .collect()
}

fn settings(args: &Args, operators: &[OperatorUnderTest]) -> report::Settings {
    report::Settings {
        models: if args.no_cluster {
            Vec::new()
        } else {
            args.models.clone()
        },
        operators: operators
            .iter()
            .map(|o| report::OperatorSetting {
                name: o.name.clone(),
                command: redact(&o.command),
            })
            .collect(),
        namespaces: args.namespaces,
        target_replicas: args.target_replicas,
        concurrency: args.concurrency,
        quiet_window_s: args.quiet,
        reaction_changes: args.changes,
        reaction_sample: args.sample,
        rollbacks: args.rollbacks,
        render_models: (!args.no_offline).then_some(args.render_models),
        verify_files: (!args.no_offline).then_some(args.verify_files),
        verify_commits: (!args.no_offline).then_some(args.verify_commits),
    }
}

/// What every run at every N shares.
struct Context<'a> {
    args: &'a Args,
    cluster: &'a cluster::ControlPlane,
    identity: cluster::Identity,
    admin: kube::Client,
    baseline: report::ClusterLoad,
}

/// Every N for every operator, on one control plane.
async fn cluster_runs(
    args: &Args,
    operators: &[OperatorUnderTest],
    cluster: &cluster::ControlPlane,
    results: &mut Results,
) -> Result<(), String> {
    let admin = cluster.admin().await?;
    cluster::install_crd(&admin).await?;
    let identity = cluster.operator_identity(&admin).await?;
    results.control_plane = Some(cluster::version(&admin).await);
    // What an interrupted run left behind would skew the baseline.
    workload::delete_namespaces(&admin, Duration::from_secs(600)).await?;

    log(format!(
        "baseline: {} s of the control plane with no operator and no models",
        args.quiet
    ));
    let baseline = api_load::baseline(&admin, Duration::from_secs(args.quiet)).await?;
    results.baseline = Some(baseline.clone());
    let context = Context {
        args,
        cluster,
        identity,
        admin,
        baseline,
    };

    for &n in &args.models {
        for operator in operators {
            log(format!("=== {} with {n} models ===", operator.name));
            let plan = workload::Workload::new(
                n,
                args.namespaces.clamp(1, n.max(1)),
                args.target_replicas,
            );
            results.runs.push(run_one(&context, operator, &plan).await);
        }
    }
    Ok(())
}

/// One operator at one N: fresh namespaces, a fresh process, every
/// measurement in turn, then the models deleted while it still runs (so it
/// releases what it manages, as users uninstall), then the namespaces.
async fn run_one(
    context: &Context<'_>,
    operator: &OperatorUnderTest,
    plan: &workload::Workload,
) -> Row {
    let admin = &context.admin;
    let mut row = Row::new(operator, plan);
    let outcome = async {
        workload::delete_namespaces(admin, cleanup_timeout(plan.models)).await?;
        workload::create_namespaces(admin, plan).await?;
        let log_file = context.cluster.log_dir().join(format!(
            "operator-{}-{}.log",
            sanitize(&operator.name),
            plan.models
        ));
        let process =
            operator::Process::start(&operator.command, &context.identity.kubeconfig, &log_file)?;
        let observer = observe::Observer::start(admin);
        let guard = || process.check_running();
        if let Err(e) = measure(context, plan, &observer, &process, &guard, &mut row).await {
            row.errors.push(e);
        }
        row.footprint = Some(process.footprint());
        if process.check_running().is_ok() {
            log("deleting the OpenMedModels (the operator releases every target)");
            match workload::delete_models(admin, plan, release_timeout(plan.models)).await {
                Ok(took) => {
                    row.release_s = Some(round(took.as_secs_f64()));
                    log(format!(
                        "every model released in {:.2} s",
                        took.as_secs_f64()
                    ));
                }
                Err(e) => row.errors.push(format!("release: {e}")),
            }
        }
        observer.stop();
        row.operator_exit = Some(process.stop());
        log("deleting the namespaces");
        let started = Instant::now();
        let cleanup = workload::delete_namespaces(admin, cleanup_timeout(plan.models)).await;
        row.cleanup_s = Some(round(started.elapsed().as_secs_f64()));
        cleanup
    }
    .await;
    if let Err(e) = outcome {
        log(format!("error: {e}"));
        row.errors.push(e);
    }
    row
}

/// The measurements in order; each needs the state the one before left.
async fn measure(
    context: &Context<'_>,
    plan: &workload::Workload,
    observer: &observe::Observer,
    process: &operator::Process,
    guard: &dyn Fn() -> Result<(), String>,
    row: &mut Row,
) -> Result<(), String> {
    let args = context.args;
    let admin = &context.admin;
    row.setup =
        Some(workload::create_targets(admin, plan, observer, args.concurrency, guard).await?);
    row.convergence = Some(
        convergence::measure(
            admin,
            plan,
            observer,
            process,
            context.cluster,
            &context.identity.username,
            args.concurrency,
            guard,
        )
        .await?,
    );
    row.api_load = Some(
        api_load::quiet_window(
            admin,
            &context.cluster.audit_log(),
            &context.identity.username,
            Some(&context.baseline),
            observer,
            process,
            Duration::from_secs(args.quiet),
        )
        .await?,
    );
    match reaction::measure(admin, plan, observer, args.changes, args.sample, guard).await {
        Ok(r) => row.reaction = Some(r),
        Err(e) => row.errors.push(format!("reaction: {e}")),
    }
    match rollback::measure(admin, plan, observer, args.rollbacks, guard).await {
        Ok(r) => row.rollback = Some(r),
        Err(e) => row.errors.push(format!("rollback: {e}")),
    }
    Ok(())
}

/// Releasing every model takes the operator a few requests per model.
fn release_timeout(models: usize) -> Duration {
    Duration::from_secs(120 + models as u64 / 3)
}

/// Namespace deletion waits for the namespace controller and the garbage
/// collector, which both scale with N.
fn cleanup_timeout(models: usize) -> Duration {
    Duration::from_secs(300 + models as u64)
}

fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect()
}

/// Seconds rounded to milliseconds, for readable JSON.
pub fn round(seconds: f64) -> f64 {
    (seconds * 1000.0).round() / 1000.0
}
