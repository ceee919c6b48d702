//! `rollback` and `wait`: the commands that ask the cluster something and
//! then follow the OpenMedModel's status, from a watch, until it answers.
//!
//! Each returns the exit code a CI job needs: 0 when the outcome asked for
//! happened, 1 when the opposite did (or it was refused, or the time ran
//! out), 2 when the cluster could not be asked.

use std::sync::Mutex;
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams};
use kube::runtime::wait::await_condition;
use kube::{Client, ResourceExt};
use serde_json::json;

use super::{EXIT_FINDINGS, EXIT_OK, EXIT_USAGE};
use crate::api::names::ROLLBACK_TO_ANNOTATION;
use crate::api::{OpenMedModel, OpenMedModelStatus, Phase};
use crate::rollout::conditions::{READY, STALLED, is_true};
use crate::rollout::{self, reason};

/// Which OpenMedModel, and how long to follow it.
#[derive(Debug, clap::Args)]
pub struct Target {
    /// The OpenMedModel.
    name: String,

    /// Its namespace [default: the kubeconfig's].
    #[arg(short, long)]
    namespace: Option<String>,

    /// How long to follow it before giving up (exit 1).
    #[arg(long, default_value = "10m", value_parser = super::parse_duration)]
    timeout: Duration,
}

/// The `rollback` subcommand's arguments.
#[derive(Debug, clap::Args)]
pub struct RollbackArgs {
    #[command(flatten)]
    target: Target,

    /// The version to go back to: one of the two the operator retains.
    version: String,
}

/// What `wait` waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Outcome {
    /// The current spec is served: condition Ready=True for the current
    /// generation.
    Ready,
    /// The operator rolled back (automatically or by hand): phase
    /// RolledBack for the current generation.
    RolledBack,
}

/// The `wait` subcommand's arguments.
#[derive(Debug, clap::Args)]
pub struct WaitArgs {
    #[command(flatten)]
    target: Target,

    /// The outcome to wait for.
    #[arg(long = "for", value_enum)]
    outcome: Outcome,
}

/// A command's end, before it becomes an exit code.
enum End {
    Done(String),
    /// Refused, the opposite outcome, or out of time.
    Not(String),
    /// The API server refused or could not be reached.
    Api(String),
}

impl From<Result<String, String>> for End {
    /// The outcome asked for, or its opposite.
    fn from(answer: Result<String, String>) -> Self {
        match answer {
            Ok(message) => End::Done(message),
            Err(message) => End::Not(message),
        }
    }
}

fn exit(end: End) -> u8 {
    match end {
        End::Done(message) => {
            println!("{message}");
            EXIT_OK
        }
        End::Not(message) => {
            eprintln!("openmed-op: {message}");
            EXIT_FINDINGS
        }
        End::Api(message) => {
            eprintln!("openmed-op: {message}");
            EXIT_USAGE
        }
    }
}

async fn models(target: &Target) -> Result<Api<OpenMedModel>, End> {
    let client = Client::try_default()
        .await
        .map_err(|e| End::Api(format!("cannot reach the cluster: {e}")))?;
    let namespace = target
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_owned());
    Ok(Api::namespaced(client, &namespace))
}

fn block_on(future: impl Future<Output = End>) -> u8 {
    let runtime = tokio::runtime::Runtime::new().expect("a Tokio runtime");
    exit(runtime.block_on(future))
}

/// Checks the version against the retained ones, annotates, then follows
/// the rollback to its end.
pub fn rollback(args: &RollbackArgs) -> u8 {
    block_on(async {
        let api = match models(&args.target).await {
            Ok(api) => api,
            Err(end) => return end,
        };
        match start_rollback(&api, args).await {
            Ok(()) => {}
            Err(end) => return end,
        }
        let name = &args.target.name;
        let version = args.version.as_str();
        let ended = follow(&api, &args.target, |model| {
            let status = model.status.as_ref()?;
            let ready = status.conditions.iter().find(|c| c.type_ == READY);
            // Refused after all (the retained versions moved meanwhile).
            if let Some(c) = ready
                && c.reason == reason::ROLLBACK_TARGET_UNAVAILABLE
                && c.message
                    .starts_with(&format!("{ROLLBACK_TO_ANNOTATION}={version} "))
            {
                return Some(Err(format!("{name}: {}", c.message)));
            }
            if status.rollback_request.as_deref() != Some(&format!("manual:{version}")) {
                return None;
            }
            match status.phase {
                Some(Phase::RolledBack) if status.active_version.as_deref() == Some(version) => {
                    Some(Ok(format!(
                        "{name}: rolled back to {version}; {}",
                        ready_message(status)
                    )))
                }
                Some(Phase::Failed) => Some(Err(format!(
                    "{name}: the rollback to {version} failed: {}",
                    ready_message(status)
                ))),
                _ => None,
            }
        })
        .await;
        ended.map_or_else(|end| end, End::from)
    })
}

/// Refuses at once a version the operator would reject, with the retained
/// ones; otherwise sets `openmed.ai/rollback-to`.
async fn start_rollback(api: &Api<OpenMedModel>, args: &RollbackArgs) -> Result<(), End> {
    let name = &args.target.name;
    let version = &args.version;
    let model = api
        .get(name)
        .await
        .map_err(|e| End::Api(format!("{name}: {e}")))?;
    let status = model.status.clone().unwrap_or_default();
    let retained = rollout::retained_versions(&status);
    if !retained.contains(version) {
        return Err(End::Not(rollout::not_retained(version, &retained)));
    }
    if status.active_version.as_deref() == Some(version.as_str())
        && model.annotations().get(ROLLBACK_TO_ANNOTATION) == Some(version)
    {
        return Err(End::Not(format!(
            "{name} already serves {version} by a rollback; nothing was changed"
        )));
    }
    let patch = json!({"metadata": {"annotations": {ROLLBACK_TO_ANNOTATION: version}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| End::Api(format!("{name}: {e}")))?;
    eprintln!("openmed-op: {name}: {ROLLBACK_TO_ANNOTATION}={version} set; following the rollback");
    Ok(())
}

/// Waits for the outcome, or its opposite, at the current generation.
pub fn wait(args: &WaitArgs) -> u8 {
    block_on(async {
        let api = match models(&args.target).await {
            Ok(api) => api,
            Err(end) => return end,
        };
        let name = &args.target.name;
        let wanted = args.outcome;
        let ended = follow(&api, &args.target, |model| {
            let status = model.status.as_ref()?;
            if status.observed_generation != model.metadata.generation {
                return None;
            }
            let ready = is_true(&status.conditions, READY);
            let rolled_back = status.phase == Some(Phase::RolledBack);
            let failed = status.phase == Some(Phase::Failed);
            let stalled = is_true(&status.conditions, STALLED);
            let summary = || {
                let serving = status.active_version.as_deref().unwrap_or("nothing yet");
                let message = ready_message(status);
                let detail = if message == format!("serving {serving}") {
                    String::new()
                } else {
                    format!("; {message}")
                };
                format!(
                    "{name}: phase {}, serving {serving}{detail}",
                    status.phase.map_or("unknown", Phase::as_str),
                )
            };
            match wanted {
                Outcome::Ready if ready => Some(Ok(summary())),
                Outcome::Ready if failed || (rolled_back && stalled) => Some(Err(summary())),
                Outcome::RolledBack if rolled_back => Some(Ok(summary())),
                Outcome::RolledBack if failed || (ready && !rolled_back) => Some(Err(summary())),
                _ => None,
            }
        })
        .await;
        ended.map_or_else(|end| end, End::from)
    })
}

/// Follows `target` from a watch until `verdict` gives an answer, printing
/// each new phase and Ready message on stderr as progress.
async fn follow(
    api: &Api<OpenMedModel>,
    target: &Target,
    verdict: impl Fn(&OpenMedModel) -> Option<Result<String, String>>,
) -> Result<Result<String, String>, End> {
    let name = &target.name;
    let answer: Mutex<Option<Result<String, String>>> = Mutex::new(None);
    let last: Mutex<String> = Mutex::new(String::new());
    let seen = std::sync::atomic::AtomicBool::new(false);
    let condition = |model: Option<&OpenMedModel>| {
        use std::sync::atomic::Ordering::Relaxed;
        let Some(model) = model else {
            // Not there yet (a GitOps sync may create it later): wait; gone
            // after it was seen: that is the answer.
            if seen.load(Relaxed) {
                *answer.lock().unwrap() = Some(Err(format!("{name} was deleted")));
                return true;
            }
            let mut last = last.lock().unwrap();
            if last.is_empty() {
                *last = "not found yet".to_owned();
                eprintln!("openmed-op: {name}: not found yet; waiting for it");
            }
            return false;
        };
        seen.store(true, Relaxed);
        if let Some(status) = &model.status {
            let line = format!(
                "{}: {}",
                status.phase.map_or("unknown", Phase::as_str),
                ready_message(status)
            );
            let mut last = last.lock().unwrap();
            if *last != line {
                eprintln!("openmed-op: {name}: {line}");
                *last = line;
            }
        }
        match verdict(model) {
            Some(found) => {
                *answer.lock().unwrap() = Some(found);
                true
            }
            None => false,
        }
    };
    match tokio::time::timeout(
        target.timeout,
        await_condition(api.clone(), name, condition),
    )
    .await
    {
        Err(_) => Err(End::Not(format!(
            "{name}: no answer within {:?}; last seen: {}",
            target.timeout,
            last.lock().unwrap()
        ))),
        Ok(Err(e)) => Err(End::Api(format!("{name}: {e}"))),
        Ok(Ok(_)) => Ok(answer
            .lock()
            .unwrap()
            .take()
            .unwrap_or_else(|| Err(format!("{name} was not found")))),
    }
}

fn ready_message(status: &OpenMedModelStatus) -> &str {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == READY)
        .map_or("", |c| c.message.as_str())
}
