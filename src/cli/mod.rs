//! The command line: argument parsing, exit codes, and the `crd`, `render`
//! and `verify` shells. Each subcommand reads its inputs, calls the core, and
//! writes the result in one piece, so a failure never leaves half an output.

mod canary;
mod follow;
mod reference;
mod status;
mod watch;

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};

use crate::findings::Finding;
use crate::render;
use crate::source;
use crate::verify;

/// Exit code: success.
pub const EXIT_OK: u8 = 0;
/// Exit code: the input is invalid or a rule is violated (explained on stderr).
pub const EXIT_FINDINGS: u8 = 1;
/// Exit code: usage error, unreadable file, not YAML, not a Git repository.
pub const EXIT_USAGE: u8 = 2;

const AFTER_HELP: &str = "\
Exit codes (every subcommand):
  0  success
  1  the input is invalid or a rule is violated (explained on stderr)
  2  usage error, unreadable or too large input, malformed YAML, not a Git
     repository, unknown revision, output that cannot be written

Run `openmed-op <command> --help` for each command's options and examples.";

/// Declarative model versions for OpenMed REST Deployments.
///
/// An OpenMedModel (openmed.ai/v1alpha1) names the model family, version and
/// tier an existing OpenMed Deployment serves. The operator (`run`) writes
/// the model pointer into a ConfigMap, wires the Deployment to it, rolls the
/// pods so they warm the model before /readyz passes, and rolls back to the
/// last successful version when a rollout fails. `render` shows offline
/// exactly what it would write; `verify` checks a change in Git before it
/// merges.
#[derive(Debug, Parser)]
#[command(name = "openmed-op", version, after_help = AFTER_HELP)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The exit codes of the canary gates (`canary ...`, `promote`, `abort`,
/// `pause`, `resume`), for their help.
macro_rules! gate_exit_codes {
    () => {
        "Exit codes: 0 the operator acted on it, 1 no canary in progress or no
acknowledgement within --timeout, 2 no cluster access or the API server
refused."
    };
}

#[derive(Debug, clap::Args)]
struct CrdArgs {
    /// Print the field reference in Markdown instead of the CRD.
    #[arg(long)]
    reference: bool,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the OpenMedModel CustomResourceDefinition generated from the code.
    ///
    /// The output equals crds/openmedmodel.yaml. Install it with:
    ///
    ///   openmed-op crd | kubectl apply --server-side -f -
    ///
    /// With --reference, every field of the resource in Markdown instead
    /// (docs/reference.md): type, bounds, default, description and rules.
    Crd(CrdArgs),

    /// Show offline exactly what the operator would write.
    ///
    /// Reads Kubernetes manifests (files, directories searched recursively
    /// for *.yaml/*.yml in sorted order, or - for stdin) and writes them back
    /// as one stream: documents that are not OpenMedModels pass through
    /// unchanged and in order; each OpenMedModel is followed by the ConfigMap
    /// the operator would own; its target Deployment, when present in the
    /// input, gets the operator's fields (env entry, pod-template hash,
    /// replicas, strategy, progress deadline); otherwise a strategic-merge
    /// patch for kustomize `patches:` is emitted. The output is deterministic,
    /// and rendering it again changes nothing.
    ///
    /// Nothing is written when any input is invalid: the problems go to
    /// stderr with file, document, line and field.
    #[command(after_help = "\
Examples:
  openmed-op render examples/openmed/                 # the bundled example
  openmed-op render --summary examples/openmed/       # one line per OpenMedModel
  kustomize build overlays/prod | openmed-op render -
  openmed-op render --watch models/           # re-render on every save
  openmed-op render --base origin/main fleet/  # what this change does, wave by wave

Exit codes: 0 rendered, 1 invalid OpenMedModel or conflict, 2 unreadable
input or malformed YAML.")]
    Render(RenderArgs),

    /// Check a change to OpenMedModels in Git before it merges.
    ///
    /// Reads Git objects (no checkout: bare repositories, detached HEADs and
    /// CI clones work) and judges every OpenMedModel in the *.yaml/*.yml
    /// files at REV against BASE, BASE's first-parent history and, with
    /// --status, the cluster:
    ///
    ///   1. valid, as `render` and the API server judge it (InvalidSpec);
    ///   2. one OpenMedModel per Deployment and per ConfigMap (TargetConflict);
    ///   3. openmed.ai/rollback-to names a version the operator retains
    ///      (RollbackNotRetained): with --status, lastSuccessfulSpec and
    ///      previousSuccessfulSpec; without, the last two distinct
    ///      spec.version values on BASE's history (said so in the report);
    ///   4. a change moves spec.version or adds a rollback, not both
    ///      (OneIntentPerChange);
    ///   5. no return to a version the cluster saw fail without an
    ///      openmed.ai/retry-reason annotation (FailedVersionRetried);
    ///   6. warnings (errors with --strict): a rollback annotation left
    ///      behind (StaleRollbackAnnotation), a deleted OpenMedModel
    ///      (ModelDeleted), a moving version such as :latest or @main
    ///      (MutableVersion), a pointer the OpenMed service would refuse
    ///      (NotAServiceModelId: an error for a revision or digest, with
    ///      `:`, `@`, `+` or `~`), a new targetRef (TargetChanged);
    ///   7. with --status, after an automatic rollback, the one-line change
    ///      that makes Git agree with the cluster (GitBehindRollback);
    ///   8. in a fleet (openmed-fleet.yaml at the root), each cluster's
    ///      folder as its own cluster (--status DIR with DIR/<cluster>.yaml
    ///      for every cluster; --include/--exclude narrow each folder), and
    ///      no wave moved to a version the wave before does not ask for and
    ///      has not passed (WaveAhead) or, promoted on its own, has not
    ///      soaked (its status: WaveNotSoaked); the clusters of one wave ask
    ///      for the same version (WaveDisagrees); none is left on a version
    ///      that rolled back in an earlier wave (WaveBehindRollback). One
    ///      --fix is enough: the commit it makes passes.
    ///
    /// BASE defaults to the merge base of REV with the default branch
    /// (origin/HEAD, main or master), else REV's first parent. See
    /// docs/verify.md for every rule and the JSON schema.
    #[command(
        verbatim_doc_comment,
        about = "Check a change to OpenMedModels in Git before it merges",
        after_help = "\
Examples:
  openmed-op verify                              # HEAD against its merge base with main
  openmed-op verify --format github              # in CI: annotations on the pull request
  openmed-op verify --repo models.git --rev pr-head --base main   # a bare repository
  kubectl get omm -A -o yaml > status.yaml
  openmed-op verify --status status.yaml         # judge against the cluster's retained versions
  openmed-op verify --exclude 'charts/**' --strict
  openmed-op verify --watch                      # re-check the files on disk on every save
  openmed-op verify --status status.yaml --fix --dry-run   # the fixes as a diff

Exit codes: 0 no errors (warnings allowed), 1 errors, 2 not a Git repository,
unknown revision, bad glob, unreadable or malformed --status input; in a
fleet also a cluster without DIR/<cluster>.yaml, a BASE missing from a
shallow clone, or globs that hide every model of a cluster."
    )]
    Verify(VerifyArgs),

    /// Run the operator: reconcile OpenMedModels against their Deployments.
    ///
    /// Connects with the in-cluster service account, or with $KUBECONFIG /
    /// ~/.kube/config outside a cluster. Watches OpenMedModels (all
    /// namespaces, or those given with --namespace), writes each one's
    /// ConfigMap and Deployment fields with server-side apply (field manager
    /// openmed-operator), reports progress in status conditions and Events,
    /// and rolls back to the last successful version when a rollout exceeds
    /// its progress deadline. Serves /healthz and /metrics on --listen.
    /// Stops cleanly on SIGTERM.
    #[command(after_help = "\
Examples:
  openmed-op run                                  # all namespaces
  openmed-op run -n team-a -n team-b              # only these namespaces
  openmed-op run --require-target-label           # only Deployments labelled openmed.ai/managed=true
  RUST_LOG=debug openmed-op run --log-format json

  openmed-op run --leader-elect                   # one of several replicas; the Lease holder writes

Exit codes: 0 stopped by a signal, 1 lost the leader Lease (restart to follow),
2 cannot start (no cluster access, port in use, leader-election timings that overlap).")]
    Run(RunArgs),

    /// Act on a canary in progress: promote, abort, pause or resume.
    ///
    /// Sets the annotation the operator acts on once per value
    /// (openmed.ai/canary-promote, openmed.ai/canary-abort) or while present
    /// (openmed.ai/canary-pause), then waits until the status shows the
    /// operator acted on it. Refused when the resource has no canary in
    /// progress. `kubectl annotate` with the same annotations works too.
    #[command(after_help = concat!("\
Examples:
  openmed-op canary promote openmed-service -n openmed          # end the current step
  openmed-op canary promote openmed-service -n openmed --full   # skip every remaining step
  openmed-op canary abort openmed-service -n openmed            # weights back now, stable version stays
  openmed-op canary pause openmed-service -n openmed            # hold at this step
  openmed-op canary resume openmed-service -n openmed

",
        gate_exit_codes!()
    ))]
    Canary(canary::CanaryArgs),

    /// Promote a canary: end its current step now (--full: every step).
    ///
    /// The same as `canary promote`: sets openmed.ai/canary-promote and
    /// waits until the operator has moved on.
    #[command(after_help = concat!("\
Examples:
  kubectl openmed promote openmed-service -n openmed
  kubectl openmed promote openmed-service -n openmed --full

",
        gate_exit_codes!()
    ))]
    Promote(canary::PromoteArgs),

    /// Abort a canary: the weights go back, the stable version stays.
    ///
    /// The same as `canary abort`.
    #[command(after_help = gate_exit_codes!())]
    Abort(canary::GateArgs),

    /// Pause a canary at its step until `resume`.
    ///
    /// The same as `canary pause`.
    #[command(after_help = gate_exit_codes!())]
    Pause(canary::GateArgs),

    /// Resume a paused canary.
    ///
    /// The same as `canary resume`.
    #[command(after_help = gate_exit_codes!())]
    Resume(canary::GateArgs),

    /// Show an OpenMedModel: versions, conditions, ReplicaSets, canary, events.
    ///
    /// The phase, the desired, active and retained versions, the
    /// conditions, the target Deployment's ReplicaSets with the version each
    /// one serves and how many of its pods are ready, the canary's step and
    /// weight when there is one, and the last events. With --watch it
    /// redraws on every change the watches report (the resource, the
    /// ReplicaSets, the events) until Ctrl-C.
    #[command(after_help = "\
Examples:
  openmed-op status openmed-service -n openmed
  kubectl openmed status openmed-service -n openmed --watch

Exit codes: 0 shown, 2 no cluster access, no such resource, or the API
server refused.")]
    Status(status::StatusArgs),

    /// List OpenMedModels: phase, desired and active versions, rollbacks.
    #[command(after_help = "\
Examples:
  openmed-op list -n openmed
  kubectl openmed list -A")]
    List(status::ListArgs),

    /// Roll back to a retained version and follow the rollback to its end.
    ///
    /// Refuses at once, listing the retained versions, a version the
    /// operator would reject (only status.lastSuccessfulSpec and
    /// status.previousSuccessfulSpec are accepted); otherwise sets
    /// openmed.ai/rollback-to and follows the status from a watch until the
    /// rollback succeeded or failed, printing each step on stderr. Remove
    /// the annotation (or set spec.version to the restored version in Git)
    /// to leave the rollback.
    #[command(after_help = "\
Examples:
  openmed-op rollback openmed-service OpenMed/synthetic-pii-v1 -n openmed
  kubectl openmed rollback openmed-service OpenMed/synthetic-pii-v1 -n openmed --timeout 5m

Exit codes: 0 rolled back, 1 refused (not a retained version), failed or
no end within --timeout, 2 no cluster access or the API server refused.")]
    Rollback(follow::RollbackArgs),

    /// Wait until an OpenMedModel is ready, or rolled back.
    ///
    /// For CI after a Git change syncs: follows the status from a watch
    /// (the resource may not exist yet) until the outcome holds for the
    /// current generation (status.observedGeneration), or its opposite
    /// does: with --for ready, a rollback or a failure; with --for
    /// rolled-back, the spec served or a failure.
    #[command(after_help = "\
Examples:
  openmed-op wait openmed-service -n openmed --for ready --timeout 15m
  kubectl openmed wait openmed-service -n openmed --for rolled-back

Exit codes: 0 the outcome holds, 1 the opposite happened or --timeout
passed, 2 no cluster access or the API server refused.")]
    Wait(follow::WaitArgs),

    /// Print shell completions for bash, zsh, fish, elvish or PowerShell.
    #[command(after_help = "\
Examples:
  openmed-op completions bash > /etc/bash_completion.d/openmed-op
  openmed-op completions zsh > \"${fpath[1]}/_openmed-op\"
  kubectl-openmed completions bash    # completes `kubectl-openmed ...`")]
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },

    /// Print the manual page, or write one per command into a directory.
    #[command(after_help = "\
Examples:
  openmed-op man | man -l -
  openmed-op man --dir /usr/local/share/man/man1")]
    Man {
        /// Write openmed-op.1 and openmed-op-<command>.1 here instead.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// Watch only this namespace; repeat for several. Default: all namespaces.
    #[arg(short = 'n', long = "namespace", value_name = "NAMESPACE")]
    namespaces: Vec<String>,

    /// How often a steady resource is looked at again, from the watch caches
    /// (no API requests): 15s, 1m, or a number of seconds.
    #[arg(long, default_value = "15s", value_parser = parse_duration, value_name = "DURATION")]
    resync: std::time::Duration,

    /// Address for /healthz and /metrics.
    #[arg(long, default_value = "0.0.0.0:8080", value_name = "ADDR")]
    listen: std::net::SocketAddr,

    /// How many OpenMedModels are reconciled at once; bounds memory and the
    /// burst of API requests when many change together.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..), value_name = "N")]
    concurrency: u16,

    /// Act only on Deployments labelled openmed.ai/managed=true, so that
    /// being allowed to create OpenMedModels does not mean being able to take
    /// over any Deployment.
    #[arg(long)]
    require_target_label: bool,

    /// Let canary analysis call endpoints under this URL prefix: the same
    /// scheme, host and port, and a path that starts with the prefix's,
    /// segment by segment (e.g. http://prometheus.monitoring:9090). Repeat
    /// for several. Without any, no Prometheus query or webhook is sent: a
    /// canary with analysis holds with reason AnalysisEndpointNotAllowed.
    #[arg(long = "analysis-allow", value_name = "PREFIX")]
    analysis_allow: Vec<crate::api::endpoints::AllowedPrefix>,

    /// Watch KEDA ScaledObjects (keda.sh/v1alpha1), so a model with
    /// spec.autoscaling.keda gets one. Needs KEDA's CRDs in the cluster and
    /// RBAC on scaledobjects (Helm: keda.enabled=true). Without it nothing of
    /// KEDA is read, and such a model says KedaNotWatched.
    #[arg(long)]
    keda: bool,

    /// Log format; the level comes from RUST_LOG (default info).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,

    /// Take part in leader election (as kube-controller-manager does): every
    /// instance watches and keeps its caches warm, only the holder of a
    /// coordination.k8s.io/v1 Lease writes. For two or more replicas. A
    /// leader that cannot renew within the renew deadline stops writing and
    /// exits with 1, so it restarts as a follower.
    #[arg(
        long,
        help_heading = "Leader election",
        num_args = 0..=1,
        require_equals = true,
        default_value_t = false,
        default_missing_value = "true",
        action = clap::ArgAction::Set,
        value_name = "BOOL"
    )]
    leader_elect: bool,

    /// How long followers wait after they last saw the Lease renewed before
    /// they take it: the longest a dead leader's resources go unattended.
    #[arg(long, help_heading = "Leader election", default_value = "15s", value_parser = parse_duration, value_name = "DURATION")]
    leader_elect_lease_duration: std::time::Duration,

    /// How long the leader keeps trying to renew before it stops writing.
    /// Shorter than the lease duration; the difference covers a write
    /// already on its way.
    #[arg(long, help_heading = "Leader election", default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    leader_elect_renew_deadline: std::time::Duration,

    /// How long to wait between attempts to acquire or renew the Lease.
    #[arg(long, help_heading = "Leader election", default_value = "2s", value_parser = parse_duration, value_name = "DURATION")]
    leader_elect_retry_period: std::time::Duration,

    /// The Lease's name.
    #[arg(
        long,
        help_heading = "Leader election",
        default_value = "openmed-operator",
        value_name = "NAME"
    )]
    leader_elect_resource_name: String,

    /// The Lease's namespace. Default: the pod's namespace (POD_NAMESPACE,
    /// from the downward API), else the kubeconfig's.
    #[arg(long, help_heading = "Leader election", value_name = "NAMESPACE")]
    leader_elect_resource_namespace: Option<String>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// `500ms`, `15s`, `2m`, `1h` or plain seconds.
fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => text.split_at(i),
        None => (text, "s"),
    };
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 15s or 1m"))?;
    let millis = match unit {
        "ms" => n,
        "s" => n.saturating_mul(1000),
        "m" => n.saturating_mul(60_000),
        "h" => n.saturating_mul(3_600_000),
        _ => return Err(format!("{text:?}: use ms, s, m or h")),
    };
    if millis == 0 {
        return Err("must be more than 0".into());
    }
    Ok(std::time::Duration::from_millis(millis))
}

#[derive(Debug, clap::Args)]
struct RenderArgs {
    /// Files or directories to read; - reads stdin. A directory that holds
    /// openmed-fleet.yaml is a fleet: each wave's folder is rendered on its
    /// own, in the waves' order, each under a heading (docs/fleet.md).
    #[arg(required_unless_present = "krm", value_name = "INPUT")]
    inputs: Vec<PathBuf>,

    /// Run as a KRM function (kpt fn eval --exec, kustomize exec
    /// transformers): read a ResourceList on stdin, write one on stdout with
    /// the items rendered and findings as results. A resource whose
    /// Deployment is not among the items gets only its ConfigMap and a
    /// warning. The default namespace comes from the function config's
    /// data.namespace.
    #[arg(long, conflicts_with_all = ["summary", "canary", "watch", "inputs"])]
    krm: bool,

    /// Output format: a YAML stream, or a JSON v1 List.
    #[arg(short, long, value_enum, default_value_t = Format::Yaml)]
    output: Format,

    /// Print a table (resource, target, version, ConfigMap, pod-template
    /// hash) instead of the manifests.
    #[arg(long, conflicts_with = "canary")]
    summary: bool,

    /// Print what a version change does for each resource with a canary
    /// instead of the manifests: the canary Deployment, each step's weight,
    /// pause and the exact JSON Patch of the HTTPRoute (when the route is
    /// in the input), the patch back to Git's weights, and the worst-case
    /// duration. YAML, or JSON with -o json.
    #[arg(long)]
    canary: bool,

    /// Print what the change from the Git revision REV to the inputs on
    /// disk does instead of the manifests: for each OpenMedModel (and in a
    /// fleet, wave by wave and cluster by cluster, in order) the version,
    /// the ConfigMaps, OPENMED_SERVICE_PRELOAD_MODELS and
    /// OPENMED_SERVICE_SERVED_MODELS, the pod-template hash, and whether
    /// the pods roll. Text, or JSON with -o json. The inputs must be in a
    /// Git repository's work tree; an input absent at REV is new.
    #[arg(long, value_name = "REV", conflicts_with_all = ["summary", "canary", "watch", "krm"])]
    base: Option<String>,

    /// Namespace of documents that do not set one, as kubectl assumes.
    #[arg(short, long, default_value = "default", value_name = "NAMESPACE", value_parser = parse_namespace)]
    namespace: String,

    /// Render again whenever an input file changes (not with stdin).
    #[arg(long)]
    watch: bool,
}

#[derive(Debug, Clone, clap::Args)]
struct VerifyArgs {
    /// The repository, or a directory inside it; bare repositories work.
    #[arg(long, default_value = ".", value_name = "PATH")]
    repo: PathBuf,

    /// The revision to verify [default: HEAD].
    #[arg(long, value_name = "REV", conflicts_with_all = ["worktree", "watch"])]
    rev: Option<String>,

    /// The revision to compare with [default: the merge base of REV with the
    /// default branch, else REV's first parent].
    #[arg(long, value_name = "REV")]
    base: Option<String>,

    /// The cluster's OpenMedModels with their status (a YAML or JSON file, or
    /// a directory of them), e.g. the output of `kubectl get omm -A -o yaml`.
    #[arg(long, value_name = "FILE|DIR")]
    status: Option<PathBuf>,

    /// Read only paths matching GLOB (repeatable; `*` stops at `/`, `**`
    /// crosses it, a glob without `/` matches at any depth).
    #[arg(long, value_name = "GLOB")]
    include: Vec<String>,

    /// Skip paths matching GLOB (repeatable), e.g. Helm templates.
    #[arg(long, value_name = "GLOB")]
    exclude: Vec<String>,

    /// Report warnings as errors.
    #[arg(long)]
    strict: bool,

    /// Output: text for people, json for programs, github for workflow
    /// annotations on a pull request.
    #[arg(long, value_enum, default_value_t = VerifyFormat::Text)]
    format: VerifyFormat,

    /// Namespace of documents that do not set one, as kubectl assumes.
    #[arg(short, long, default_value = "default", value_name = "NAMESPACE", value_parser = parse_namespace)]
    namespace: String,

    /// Check the files on disk instead of a revision (BASE: the merge base of
    /// HEAD with the default branch, else HEAD).
    #[arg(long)]
    worktree: bool,

    /// Check the files on disk again on every change (implies --worktree).
    #[arg(long)]
    watch: bool,

    /// Apply the fixes verify suggests to the files on disk: spec.version to
    /// the restored version (GitBehindRollback), openmed.ai/rollback-to to
    /// the one version that can be meant (RollbackNotRetained), a stale
    /// rollback annotation removed (StaleRollbackAnnotation). Comments, key
    /// order, quoting, indentation and line ends stay byte for byte. Prints
    /// a unified diff on stdout and what remains on stderr. Implies
    /// --worktree; nothing is written unless every fix applies exactly.
    #[arg(long, conflicts_with_all = ["rev", "watch"])]
    fix: bool,

    /// With --fix: print the diff, write nothing.
    #[arg(long, requires = "fix")]
    dry_run: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum VerifyFormat {
    Text,
    Json,
    Github,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Format {
    Yaml,
    Json,
}

/// A namespace name as the API server accepts it: an RFC 1123 label.
fn parse_namespace(text: &str) -> Result<String, String> {
    if crate::api::rules::is_dns_label(text) {
        Ok(text.to_owned())
    } else {
        Err(format!(
            "{} is not a valid namespace name: lowercase letters, digits and '-', starting and ending with a letter or digit, at most 63 characters",
            crate::text::quote(text)
        ))
    }
}

/// The name the binary answers to: installed as `kubectl-openmed`, it is
/// the kubectl plugin and its help says `kubectl openmed`.
pub fn command() -> clap::Command {
    let invoked = std::env::args_os()
        .next()
        .map(PathBuf::from)
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()));
    let cmd = Cli::command();
    if invoked.as_deref() == Some("kubectl-openmed") {
        cmd.name("kubectl-openmed").bin_name("kubectl openmed")
    } else {
        cmd
    }
}

/// The command line, with `help --help` (and `-h`) read as `help help`:
/// clap would take the flag for the name of a command and exit 2.
fn arguments() -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.len() == 3 && args[1] == "help" && (args[2] == "--help" || args[2] == "-h") {
        args[2] = "help".into();
    }
    args
}

/// Parses the command line and runs the command.
pub fn main() -> ExitCode {
    let cli = match Cli::from_arg_matches(&command().get_matches_from(arguments())) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    ExitCode::from(match cli.command {
        Command::Crd(args) if args.reference => {
            exit_after(print(&crate::api::reference::markdown()), EXIT_OK)
        }
        Command::Crd(_) => exit_after(print(&crate::api::crd_yaml()), EXIT_OK),
        Command::Render(args) if args.watch => {
            let inputs = args.inputs.clone();
            match watch::watch(&inputs, || {
                let code = render_once(&args);
                eprintln!(
                    "openmed-op: render exited {code}; watching for changes (Ctrl-C to stop)"
                );
            }) {
                Ok(()) => EXIT_OK,
                Err(e) => {
                    eprintln!("openmed-op: {e}");
                    EXIT_USAGE
                }
            }
        }
        Command::Render(args) if args.krm => render_krm(),
        Command::Render(args) => render_once(&args),
        Command::Run(args) => run_operator(args),
        Command::Canary(args) => canary::run(&args),
        Command::Promote(args) => canary::promote(&args),
        Command::Abort(args) => canary::run_gate(canary::Gate::Abort, &args, false),
        Command::Pause(args) => canary::run_gate(canary::Gate::Pause, &args, false),
        Command::Resume(args) => canary::run_gate(canary::Gate::Resume, &args, false),
        Command::Status(args) => status::status(&args),
        Command::List(args) => status::list(&args),
        Command::Rollback(args) => follow::rollback(&args),
        Command::Wait(args) => follow::wait(&args),
        Command::Completions { shell } => reference::completions(shell),
        Command::Man { dir } => reference::man(dir.as_deref()),
        Command::Verify(args) if args.watch => verify_watch(&args),
        Command::Verify(args) if args.fix => verify_fix(&args),
        Command::Verify(args) => verify_once(&args),
    })
}

fn run_operator(args: RunArgs) -> u8 {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match args.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
    let options = crate::operator::Options {
        namespaces: args.namespaces,
        resync: args.resync,
        listen: args.listen,
        concurrency: args.concurrency,
        settings: crate::rollout::Settings {
            require_target_label: args.require_target_label,
            analysis_allow: crate::api::endpoints::AllowList::new(args.analysis_allow),
            keda: args.keda,
        },
        leader_election: args.leader_elect.then(|| crate::operator::LeaderElection {
            name: args.leader_elect_resource_name.clone(),
            namespace: args.leader_elect_resource_namespace.clone(),
            timing: crate::operator::leader::Timing {
                lease_duration: args.leader_elect_lease_duration,
                renew_deadline: args.leader_elect_renew_deadline,
                retry_period: args.leader_elect_retry_period,
            },
        }),
    };
    if let Some(election) = &options.leader_election
        && let Err(e) = election.timing.check()
    {
        eprintln!("openmed-op run: {e}");
        return EXIT_USAGE;
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("openmed-op: cannot start the runtime: {e}");
            return EXIT_USAGE;
        }
    };
    match runtime.block_on(crate::operator::run(options)) {
        Ok(()) => EXIT_OK,
        Err(e) if e.is::<crate::operator::LostLease>() => {
            tracing::error!(error = %e, "stopped");
            EXIT_FINDINGS
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot run");
            EXIT_USAGE
        }
    }
}

fn verify_options(args: &VerifyArgs) -> verify::Options {
    verify::Options {
        repo: args.repo.clone(),
        rev: args.rev.clone(),
        base: args.base.clone(),
        worktree: args.worktree || args.watch || args.fix,
        status: args.status.clone(),
        include: args.include.clone(),
        exclude: args.exclude.clone(),
        strict: args.strict,
        namespace: args.namespace.clone(),
    }
}

fn verify_once(args: &VerifyArgs) -> u8 {
    match verify::verify(&verify_options(args)) {
        Ok(report) => {
            let written = print(&match args.format {
                VerifyFormat::Text => verify::output::text(&report),
                VerifyFormat::Json => verify::output::json(&report),
                VerifyFormat::Github => verify::output::github(&report),
            });
            exit_after(
                written,
                if report.has_errors() {
                    EXIT_FINDINGS
                } else {
                    EXIT_OK
                },
            )
        }
        Err(e) => {
            eprintln!("openmed-op: {e}");
            EXIT_USAGE
        }
    }
}

/// The repository's work tree, for `--FLAG` which needs files to WHAT;
/// exit 2 (said on stderr) for a bare repository or no repository.
fn work_tree(args: &VerifyArgs, flag: &str, what: &str) -> Result<PathBuf, u8> {
    match verify::git::open(&args.repo) {
        Ok(repo) => repo.workdir().map(|dir| dir.to_path_buf()).ok_or_else(|| {
            eprintln!(
                "openmed-op: --{flag}: {}: a bare repository has no files to {what}",
                args.repo.display()
            );
            EXIT_USAGE
        }),
        Err(e) => {
            eprintln!(
                "openmed-op: {}: not a Git repository: {}",
                args.repo.display(),
                e.message()
            );
            Err(EXIT_USAGE)
        }
    }
}

/// Runs `work` on a Tokio runtime with a client of the kubeconfig's
/// cluster; a cluster that cannot be reached is exit 2.
fn with_cluster<F, Fut>(work: F) -> u8
where
    F: FnOnce(kube::Client) -> Fut,
    Fut: Future<Output = u8>,
{
    let runtime = tokio::runtime::Runtime::new().expect("a Tokio runtime");
    runtime.block_on(async {
        match kube::Client::try_default().await {
            Ok(client) => work(client).await,
            Err(e) => {
                eprintln!("openmed-op: cannot reach the cluster: {e}");
                EXIT_USAGE
            }
        }
    })
}

/// `namespace`, else the kubeconfig's.
fn namespace_or_default(client: &kube::Client, namespace: &Option<String>) -> String {
    namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_owned())
}

/// `verify --fix [--dry-run]`. With text or github output: the diff on
/// stdout, the findings that remain on stderr in that format. With json:
/// one document on stdout (`dryRun`, `written`, `files`, `diff`, `report`).
/// The exit code is by the findings that remain.
fn verify_fix(args: &VerifyArgs) -> u8 {
    let options = verify_options(args);
    let root = match work_tree(args, "fix", "fix") {
        Ok(root) => root,
        Err(code) => return code,
    };
    let report = match verify::verify(&options) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("openmed-op: {e}");
            return EXIT_USAGE;
        }
    };
    let format = |report: &verify::Report| match args.format {
        VerifyFormat::Text => verify::output::text(report),
        VerifyFormat::Json => verify::output::json(report),
        VerifyFormat::Github => verify::output::github(report),
    };
    let exit = |report: &verify::Report| {
        if report.has_errors() {
            EXIT_FINDINGS
        } else {
            EXIT_OK
        }
    };
    let fixes = match verify::fixes::plan(&report.findings, &root) {
        Ok(fixes) => fixes,
        Err(e) => {
            eprint!("{}", format(&report));
            eprintln!("openmed-op: cannot fix {e}; nothing was changed");
            return EXIT_FINDINGS;
        }
    };
    let count: usize = fixes.iter().map(|f| f.fixes).sum();
    let diff = verify::fixes::diff(&fixes);
    let write = !fixes.is_empty() && !args.dry_run;
    if write && let Err(e) = verify::fixes::write(&fixes) {
        eprintln!("openmed-op: {e}");
        return EXIT_USAGE;
    }
    let after = if write {
        match verify::verify(&options) {
            Ok(after) => after,
            Err(e) => {
                eprintln!("openmed-op: {e}");
                return EXIT_USAGE;
            }
        }
    } else {
        report
    };
    let summary = if fixes.is_empty() {
        "nothing that --fix can change".to_owned()
    } else if args.dry_run {
        format!(
            "--dry-run: would fix {count} finding(s) in {} file(s); nothing was written",
            fixes.len()
        )
    } else {
        format!("fixed {count} finding(s) in {} file(s)", fixes.len())
    };
    if let VerifyFormat::Json = args.format {
        let files: Vec<serde_json::Value> = fixes
            .iter()
            .map(|f| serde_json::json!({"file": f.file, "fixes": f.fixes}))
            .collect();
        let report: serde_json::Value =
            serde_json::from_str(&verify::output::json(&after)).expect("the report is JSON");
        let document = serde_json::json!({
            "dryRun": args.dry_run,
            "written": write,
            "files": files,
            "diff": diff,
            "report": report,
        });
        let text = serde_json::to_string_pretty(&document).expect("JSON serializes") + "\n";
        eprintln!("openmed-op: {summary}");
        return exit_after(print(&text), exit(&after));
    }
    if let Err(code) = print(&diff) {
        return code;
    }
    // A dry run that found fixes shows the diff alone, as before.
    if fixes.is_empty() || write {
        eprint!("{}", format(&after));
    }
    eprintln!("openmed-op: {summary}");
    exit(&after)
}

fn verify_watch(args: &VerifyArgs) -> u8 {
    let root = match work_tree(args, "watch", "watch") {
        Ok(root) => root,
        Err(code) => return code,
    };
    match watch::watch(&[root], || {
        let code = verify_once(args);
        eprintln!("openmed-op: verify exited {code}; watching for changes (Ctrl-C to stop)");
    }) {
        Ok(()) => EXIT_OK,
        Err(e) => {
            eprintln!("openmed-op: {e}");
            EXIT_USAGE
        }
    }
}

fn render_krm() -> u8 {
    let mut input = String::new();
    if let Err(e) = std::io::Read::read_to_string(&mut std::io::stdin(), &mut input) {
        eprintln!("openmed-op: <stdin>: cannot read: {e}");
        return EXIT_USAGE;
    }
    match render::krm::run(&input) {
        Ok(output) => {
            if let Err(code) = print(&output.text) {
                return code;
            }
            if output.failed {
                eprintln!("openmed-op: the ResourceList has errors; see its results");
                EXIT_FINDINGS
            } else {
                EXIT_OK
            }
        }
        Err(e) => {
            eprintln!("openmed-op: {e}");
            EXIT_USAGE
        }
    }
}

fn render_once(args: &RenderArgs) -> u8 {
    if let Some(base) = &args.base {
        return render_changes(args, base);
    }
    if let [dir] = args.inputs.as_slice()
        && dir.join(crate::fleet::FILE_NAME).is_file()
    {
        return render_fleet(args, dir);
    }
    let docs = match source::read_inputs(&args.inputs) {
        Ok(docs) => docs,
        Err(e) => {
            eprintln!("openmed-op: {e}");
            return EXIT_USAGE;
        }
    };
    match render::render(&docs, &args.namespace, render::MissingTarget::Patch) {
        Ok(rendered) => {
            let written = if args.summary {
                print(&render::summary_table(&rendered.rows))
            } else if args.canary {
                print(&match args.output {
                    Format::Yaml => crate::source::yaml::write::document(
                        &serde_json::to_value(&rendered.canaries).expect("reports serialize"),
                    ),
                    Format::Json => {
                        serde_json::to_string_pretty(&rendered.canaries).expect("reports serialize")
                            + "\n"
                    }
                })
            } else {
                // The whole input is valid: the stream is written as it is
                // laid out, never held whole.
                write_stream(|out| match args.output {
                    Format::Yaml => render::write_yaml(out, rendered.documents()),
                    Format::Json => render::write_json(out, rendered.documents()),
                })
            };
            exit_after(written, EXIT_OK)
        }
        Err(findings) => {
            report(&findings);
            EXIT_FINDINGS
        }
    }
}

/// `render DIR` where DIR holds `openmed-fleet.yaml`: each wave's folder
/// rendered on its own (the same model is in every cluster's folder), in
/// the waves' order, each under a heading; nothing is written when any
/// wave has a problem.
fn render_fleet(args: &RenderArgs, dir: &std::path::Path) -> u8 {
    use crate::fleet;
    let file = dir.join(fleet::FILE_NAME);
    let shown = file.display().to_string();
    let waves = match std::fs::read_to_string(&file) {
        Ok(text) => match fleet::parse(&shown, &text) {
            Ok(waves) => waves,
            Err(e) => {
                eprintln!("openmed-op: {e}");
                return EXIT_USAGE;
            }
        },
        Err(e) => {
            eprintln!("openmed-op: {shown}: cannot read: {e}");
            return EXIT_USAGE;
        }
    };
    let mut inputs = Vec::new();
    for (_, wave, cluster) in fleet::clusters(&waves) {
        match source::read_inputs(&[dir.join(&cluster.path)]) {
            Ok(docs) => inputs.push(docs),
            Err(e) => {
                eprintln!("openmed-op: wave {}: {e}", wave.label(cluster));
                return EXIT_USAGE;
            }
        }
    }
    let mut rendered = Vec::new();
    let mut findings = Vec::new();
    for ((i, wave, cluster), docs) in fleet::clusters(&waves).zip(&inputs) {
        match render::render(docs, &args.namespace, render::MissingTarget::Patch) {
            Ok(r) => rendered.push((i, wave, cluster, r)),
            Err(problems) => findings.extend(problems),
        }
    }
    if !findings.is_empty() {
        report(&findings);
        return EXIT_FINDINGS;
    }
    let count = waves.len();
    let heading = |i: usize, wave: &fleet::Wave, cluster: &fleet::Cluster| {
        format!("# wave {} of {count}: {}\n", i + 1, wave.label(cluster))
    };
    let written = if args.summary {
        let mut out = String::new();
        for (i, wave, cluster, r) in &rendered {
            out.push_str(&heading(*i, wave, cluster));
            out.push_str(&render::summary_table(&r.rows));
        }
        print(&out)
    } else if args.canary || matches!(args.output, Format::Json) {
        let waves: Vec<serde_json::Value> = rendered
            .iter()
            .map(|(_, wave, cluster, r)| {
                let body = if args.canary {
                    serde_json::to_value(&r.canaries).expect("reports serialize")
                } else {
                    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": r.documents().collect::<Vec<_>>()})
                };
                serde_json::json!({"wave": wave.name, "cluster": cluster.name, "path": cluster.path, "rendered": body})
            })
            .collect();
        let all = serde_json::json!({ "waves": waves });
        print(&match args.output {
            Format::Yaml => crate::source::yaml::write::document(&all),
            Format::Json => serde_json::to_string_pretty(&all).expect("reports serialize") + "\n",
        })
    } else {
        write_stream(|out| {
            for (n, (i, wave, cluster, r)) in rendered.iter().enumerate() {
                if n > 0 {
                    out.write_all(b"---\n")?;
                }
                out.write_all(heading(*i, wave, cluster).as_bytes())?;
                render::write_yaml(out, r.documents())?;
            }
            Ok(())
        })
    };
    exit_after(written, EXIT_OK)
}

/// `render --base REV`: the inputs rendered at REV (read from Git) and on
/// disk, compared resource by resource ([`render::changes`]); a fleet
/// cluster by cluster, in the waves' order.
fn render_changes(args: &RenderArgs, base: &str) -> u8 {
    use crate::{fleet, verify::git};
    let fail = |message: String| {
        eprintln!("openmed-op: {message}");
        EXIT_USAGE
    };
    if args.inputs.iter().any(|i| i.as_os_str() == "-") {
        return fail("--base reads the inputs at REV from Git, so not from stdin".into());
    }
    let repo = match git::open(&args.inputs[0]) {
        Ok(repo) => repo,
        Err(e) => {
            return fail(format!(
                "--base: {}: not in a Git repository: {}",
                args.inputs[0].display(),
                e.message()
            ));
        }
    };
    let Some(root) = repo.workdir().and_then(|w| std::fs::canonicalize(w).ok()) else {
        return fail("--base: a bare repository has no files on disk to compare with".into());
    };
    let tree = match git::commit(&repo, base).and_then(|c| c.tree()) {
        Ok(tree) => tree,
        Err(e) => return fail(format!("--base {base}: unknown revision: {}", e.message())),
    };
    // Each input's path in the repository, '/'-separated, "" for its root.
    let in_repo = |input: &std::path::Path| -> Result<String, String> {
        let full = std::fs::canonicalize(input)
            .map_err(|e| format!("{}: cannot read: {e}", input.display()))?;
        let inside = full.strip_prefix(&root).map_err(|_| {
            format!(
                "{}: not inside the repository at {}",
                input.display(),
                root.display()
            )
        })?;
        Ok(inside
            .components()
            .map(|c| c.as_os_str().to_string_lossy())
            .collect::<Vec<_>>()
            .join("/"))
    };
    // The sections: one per fleet cluster, else one of every input.
    let mut sections: Vec<(Option<String>, Vec<PathBuf>)> = Vec::new();
    let mut fleet_members = Vec::new();
    if let [dir] = args.inputs.as_slice()
        && dir.join(fleet::FILE_NAME).is_file()
    {
        let file = dir.join(fleet::FILE_NAME);
        let shown = file.display().to_string();
        let waves = match std::fs::read_to_string(&file) {
            Ok(text) => match fleet::parse(&shown, &text) {
                Ok(waves) => waves,
                Err(e) => return fail(e.to_string()),
            },
            Err(e) => return fail(format!("{shown}: cannot read: {e}")),
        };
        let count = waves.len();
        for (i, wave, cluster) in fleet::clusters(&waves) {
            sections.push((
                Some(format!(
                    "# wave {} of {count}: {}\n",
                    i + 1,
                    wave.label(cluster)
                )),
                vec![dir.join(&cluster.path)],
            ));
            fleet_members.push((
                wave.name.clone(),
                cluster.name.clone(),
                cluster.path.clone(),
            ));
        }
    } else {
        sections.push((None, args.inputs.clone()));
    }
    let mut out = Vec::new();
    for (heading, inputs) in &sections {
        let now = match source::read_inputs(inputs) {
            Ok(docs) => docs,
            Err(e) => return fail(e.to_string()),
        };
        let mut then = Vec::new();
        for input in inputs {
            let prefix = match in_repo(input) {
                Ok(prefix) => prefix,
                Err(e) => return fail(e),
            };
            let keep = |path: &str| {
                let under =
                    prefix.is_empty() || path == prefix || path.starts_with(&format!("{prefix}/"));
                under && source::is_yaml_name(std::path::Path::new(path))
            };
            let files = match git::files(&repo, &tree, &keep) {
                Ok(files) => files,
                Err(e) => return fail(format!("--base {base}: {}", e.message())),
            };
            for (path, oid) in files {
                let origin = format!("{path} at {base}");
                let parsed = git::blob(&repo, oid)
                    .map_err(|e| e.message().to_owned())
                    .and_then(|bytes| {
                        source::parse_bytes(&origin, &bytes).map_err(|e| e.to_string())
                    });
                match parsed {
                    Ok(docs) => then.extend(docs),
                    Err(e) => return fail(e),
                }
            }
        }
        let rows = |docs: &[source::Document], running: &HashMap<String, String>| {
            render::render_running(docs, &args.namespace, render::MissingTarget::Patch, running)
                .map(|r| r.rows)
        };
        let before = match rows(&then, &HashMap::new()) {
            Ok(rows) => rows,
            Err(findings) => {
                eprintln!("openmed-op: at {base}, the inputs do not render:");
                report(&findings);
                return EXIT_FINDINGS;
            }
        };
        // The cluster runs what BASE asks for: a bump's new pods serve that
        // version beside the new one, as the operator writes them.
        let running: HashMap<String, String> = before
            .iter()
            .map(|row| (row.resource.clone(), row.version.clone()))
            .collect();
        let after = match rows(&now, &running) {
            Ok(rows) => rows,
            Err(findings) => {
                report(&findings);
                return EXIT_FINDINGS;
            }
        };
        out.push((heading.clone(), render::changes::between(&before, &after)));
    }
    let written = match args.output {
        Format::Json => {
            let all = if fleet_members.is_empty() {
                serde_json::json!({"base": base, "changes": out[0].1})
            } else {
                let waves: Vec<serde_json::Value> = fleet_members
                    .iter()
                    .zip(&out)
                    .map(|((wave, cluster, path), (_, changes))| {
                        serde_json::json!({"wave": wave, "cluster": cluster, "path": path, "changes": changes})
                    })
                    .collect();
                serde_json::json!({"base": base, "waves": waves})
            };
            print(&(serde_json::to_string_pretty(&all).expect("changes serialize") + "\n"))
        }
        Format::Yaml => {
            let mut text = String::new();
            for (heading, changes) in &out {
                if let Some(heading) = heading {
                    text.push_str(heading);
                }
                text.push_str(&render::changes::text(changes));
            }
            print(&text)
        }
    };
    exit_after(written, EXIT_OK)
}

/// Writes findings to stderr, then a one-line count.
fn report(findings: &[Finding]) {
    let mut err = std::io::stderr().lock();
    for finding in findings {
        let _ = writeln!(err, "{finding}");
    }
    let _ = writeln!(
        err,
        "openmed-op: {} problem{} found; nothing was written",
        findings.len(),
        if findings.len() == 1 { "" } else { "s" }
    );
}

/// Writes the whole output at once. A closed pipe (`| head`) is not an
/// error; any other failure (a full disk) is said on stderr and is exit 2,
/// so a job never takes a truncated file for success.
fn print(text: &str) -> Result<(), u8> {
    write_stdout(text.as_bytes())
}

fn write_stdout(bytes: &[u8]) -> Result<(), u8> {
    let mut out = std::io::stdout().lock();
    written(out.write_all(bytes).and_then(|()| out.flush()))
}

/// Writes to standard output through a buffer as `write` produces the
/// output, for output too large to hold whole; failures as [`print`].
fn write_stream(
    write: impl FnOnce(&mut std::io::BufWriter<std::io::StdoutLock<'static>>) -> std::io::Result<()>,
) -> Result<(), u8> {
    let mut out = std::io::BufWriter::with_capacity(64 * 1024, std::io::stdout().lock());
    written(write(&mut out).and_then(|()| out.flush()))
}

/// The outcome of a write to standard output, as [`print`] says it.
fn written(result: std::io::Result<()>) -> Result<(), u8> {
    match result {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => {
            eprintln!("openmed-op: cannot write to standard output: {e}; the output is incomplete");
            Err(EXIT_USAGE)
        }
    }
}

/// `code` when the output was written, else the write's exit code.
fn exit_after(written: Result<(), u8>, code: u8) -> u8 {
    written.err().unwrap_or(code)
}
