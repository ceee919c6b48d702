//! `openmed-op canary promote|abort|pause|resume` (also `promote`, `abort`,
//! `pause`, `resume` at the top, as `kubectl argo rollouts` has them): the
//! canary's gates, as annotations the operator acts on once per value, then
//! the operator's acknowledgement read back from the status.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::{EXIT_FINDINGS, EXIT_OK, EXIT_USAGE};
use crate::api::names::{
    CANARY_ABORT_ANNOTATION, CANARY_PAUSE_ANNOTATION, CANARY_PROMOTE_ANNOTATION,
};
use crate::api::{CanaryState, CanaryStatus, OpenMedModel};

/// What to ask of the canary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Gate {
    /// End the current step now (with --full: every remaining step).
    Promote,
    /// Stop the canary: the weights go back, the stable version stays.
    Abort,
    /// Hold the canary at its step until `resume`.
    Pause,
    /// Let a paused canary go on.
    Resume,
}

/// The `canary` subcommand's arguments.
#[derive(Debug, clap::Args)]
pub struct CanaryArgs {
    /// What to do.
    #[arg(value_enum)]
    gate: Gate,

    /// The OpenMedModel.
    name: String,

    /// Its namespace [default: the kubeconfig's].
    #[arg(short, long)]
    namespace: Option<String>,

    /// With promote: skip every remaining step, not only the current one.
    #[arg(long)]
    full: bool,

    /// How long to wait for the operator to acknowledge.
    #[arg(long, default_value = "60s", value_parser = super::parse_duration)]
    timeout: Duration,
}

/// The arguments of a top-level gate command (`abort NAME`, ...).
#[derive(Debug, clap::Args)]
pub struct GateArgs {
    /// The OpenMedModel.
    name: String,

    /// Its namespace [default: the kubeconfig's].
    #[arg(short, long)]
    namespace: Option<String>,

    /// How long to wait for the operator to acknowledge.
    #[arg(long, default_value = "60s", value_parser = super::parse_duration)]
    timeout: Duration,
}

/// `promote NAME [--full]`.
#[derive(Debug, clap::Args)]
pub struct PromoteArgs {
    #[command(flatten)]
    target: GateArgs,

    /// Skip every remaining step, not only the current one.
    #[arg(long)]
    full: bool,
}

/// `promote NAME`: `canary promote NAME`.
pub fn promote(args: &PromoteArgs) -> u8 {
    run_gate(Gate::Promote, &args.target, args.full)
}

/// `abort|pause|resume NAME`: `canary abort|pause|resume NAME`.
pub fn run_gate(gate: Gate, target: &GateArgs, full: bool) -> u8 {
    run(&CanaryArgs {
        gate,
        name: target.name.clone(),
        namespace: target.namespace.clone(),
        full,
        timeout: target.timeout,
    })
}

/// Sets the gate's annotation and waits for the operator to act on it.
pub fn run(args: &CanaryArgs) -> u8 {
    super::with_cluster(|client| async move {
        let namespace = super::namespace_or_default(&client, &args.namespace);
        let api: Api<OpenMedModel> = Api::namespaced(client, &namespace);
        match gate(&api, args).await {
            Ok(message) => {
                println!("{message}");
                EXIT_OK
            }
            Err(Failure::Refused(message)) => {
                eprintln!("openmed-op: {message}");
                EXIT_FINDINGS
            }
            Err(Failure::Api(e)) => {
                eprintln!("openmed-op: {namespace}/{}: {e}", args.name);
                EXIT_USAGE
            }
        }
    })
}

enum Failure {
    /// Nothing to act on, or the operator did not acknowledge in time.
    Refused(String),
    /// The API server refused or could not be reached.
    Api(kube::Error),
}

impl From<kube::Error> for Failure {
    fn from(e: kube::Error) -> Self {
        Failure::Api(e)
    }
}

async fn gate(api: &Api<OpenMedModel>, args: &CanaryArgs) -> Result<String, Failure> {
    let name = &args.name;
    let model = api.get(name).await?;
    let in_progress = canary(&model).filter(|c| !c.state.is_over()).cloned();
    let Some(before) = in_progress else {
        return Err(Failure::Refused(format!(
            "{} has no canary in progress (phase {}); nothing was changed",
            model.name_any(),
            model
                .status
                .as_ref()
                .and_then(|s| s.phase)
                .map_or("unknown", |p| p.as_str())
        )));
    };
    let token = format!(
        "{}{}",
        if args.full { "full-" } else { "" },
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis())
    );
    let (key, value) = match args.gate {
        Gate::Promote => (CANARY_PROMOTE_ANNOTATION, Some(token.clone())),
        Gate::Abort => (CANARY_ABORT_ANNOTATION, Some(token.clone())),
        Gate::Pause => (CANARY_PAUSE_ANNOTATION, Some(token.clone())),
        Gate::Resume => (CANARY_PAUSE_ANNOTATION, None),
    };
    let patch = json!({"metadata": {"annotations": {key: value}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let acknowledged = |c: &CanaryStatus| match args.gate {
        Gate::Promote => c.promote_handled.as_deref() == Some(token.as_str()),
        Gate::Abort => c.abort_handled.as_deref() == Some(token.as_str()),
        Gate::Pause => {
            c.state == CanaryState::Paused && c.message.contains(CANARY_PAUSE_ANNOTATION)
        }
        Gate::Resume => !c.message.contains(CANARY_PAUSE_ANNOTATION),
    };
    let started = Instant::now();
    loop {
        let model = api.get(name).await?;
        if let Some(c) = canary(&model)
            && acknowledged(c)
        {
            return Ok(format!(
                "{}: canary of {} {} (step {}, {}): {}",
                model.name_any(),
                c.version,
                c.state.as_str(),
                c.step,
                super::status::traffic_share(c),
                c.message
            ));
        }
        if started.elapsed() > args.timeout {
            return Err(Failure::Refused(format!(
                "the operator did not act on {key} within {:?} (canary of {} was {} at step {}); the annotation stays and is acted on when it does",
                args.timeout,
                before.version,
                before.state.as_str(),
                before.step
            )));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn canary(model: &OpenMedModel) -> Option<&CanaryStatus> {
    model.status.as_ref()?.canary.as_ref()
}
