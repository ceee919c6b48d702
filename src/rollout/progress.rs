//! Reading a Deployment's progress for the generation the operator wrote.
//!
//! The Deployment controller reports progress in its status: counts, and the
//! `Progressing`, `Available` and `ReplicaFailure` conditions
//! (<https://kubernetes.io/docs/concepts/workloads/controllers/deployment/#deployment-status>).
//! A condition written before the operator's last write is about an older
//! rollout: after a template change the controller keeps a
//! `ProgressDeadlineExceeded` condition until it sees progress, so such a
//! condition counts only when it is newer than the write, or when the
//! deadline has passed since the write with no completion.

use k8s_openapi::api::apps::v1::{Deployment, DeploymentCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Where a Deployment stands for one generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// The controller has not yet seen that generation.
    NotObserved,
    /// Pods are being replaced.
    InProgress,
    /// Every pod runs the generation's template and is available.
    Complete,
    /// The rollout cannot finish: reason (`ProgressDeadlineExceeded` or
    /// `ReplicaFailure`) and the controller's message.
    Failed {
        /// Condition reason reported by the operator.
        reason: &'static str,
        /// The Deployment controller's message.
        message: String,
    },
    /// `spec.paused`: the controller will not roll until resumed.
    Paused,
}

/// Seconds past the progress deadline after which a rollout the
/// Deployment controller never reported on is judged failed by the
/// operator's own clock.
pub const UNREPORTED_GRACE_SECONDS: i64 = 5;

/// Judges `deployment` against `generation`, the one the operator's write
/// produced. `since` is when that write happened (conditions not newer are
/// stale), and `now` with the deadline lets a stale-looking but persisting
/// deadline condition count once the deadline has passed since the write.
pub fn judge(
    deployment: &Deployment,
    generation: i64,
    since: Option<&Time>,
    now: &Time,
) -> Progress {
    let spec = deployment.spec.as_ref();
    if spec.and_then(|s| s.paused) == Some(true) {
        return Progress::Paused;
    }
    let Some(status) = deployment.status.as_ref() else {
        return Progress::NotObserved;
    };
    if status.observed_generation.unwrap_or(0) < generation {
        return Progress::NotObserved;
    }
    if is_complete(deployment) {
        return Progress::Complete;
    }
    let deadline = spec
        .and_then(|s| s.progress_deadline_seconds)
        .unwrap_or(600);
    let conditions = status.conditions.as_deref().unwrap_or_default();
    let fresh = |c: &DeploymentCondition| match since {
        None => true,
        Some(since) => {
            let stamp = c
                .last_update_time
                .as_ref()
                .or(c.last_transition_time.as_ref());
            stamp.is_some_and(|t| t.0 > since.0)
                || now.0.as_second() >= since.0.as_second() + i64::from(deadline)
        }
    };
    for c in conditions {
        let failed = match (c.type_.as_str(), c.status.as_str(), c.reason.as_deref()) {
            ("Progressing", "False", Some("ProgressDeadlineExceeded")) => {
                Some("ProgressDeadlineExceeded")
            }
            ("ReplicaFailure", "True", _) => Some("ReplicaFailure"),
            _ => None,
        };
        if let Some(reason) = failed
            && fresh(c)
        {
            return Progress::Failed {
                reason,
                message: c.message.clone().unwrap_or_default(),
            };
        }
    }
    // The controller can lose its report on a rollout: when a status
    // update of its own conflicts with another write right after the
    // template changed, the next sync finds the new ReplicaSet already
    // made and keeps the `Progressing` condition of the rollout before
    // (`NewReplicaSetAvailable`), which it reads as complete, so it never
    // checks the deadline again. A condition it has not touched since the
    // write, a whole deadline after it, with the rollout unfinished, means
    // no progress within the deadline: the Deployment's own definition of
    // a failed rollout. A few seconds more than the deadline, so the
    // controller's own verdict, in its own words, comes first whenever it
    // comes at all.
    if let Some(since) = since
        && now.0.as_second() >= since.0.as_second() + i64::from(deadline) + UNREPORTED_GRACE_SECONDS
    {
        let reported = conditions
            .iter()
            .filter(|c| c.type_ == "Progressing")
            .filter_map(|c| {
                c.last_update_time
                    .as_ref()
                    .or(c.last_transition_time.as_ref())
            })
            .any(|t| t.0.as_second() > since.0.as_second());
        if !reported {
            return Progress::Failed {
                reason: "ProgressDeadlineExceeded",
                message: format!(
                    "no progress reported within the progress deadline ({deadline} s) since the rollout began"
                ),
            };
        }
    }
    Progress::InProgress
}

/// No pod of an older template remains: the controller has seen the
/// current generation and every pod it counts is an updated one. From then
/// on nothing can start a pod that reads what an older template named.
pub fn settled(deployment: &Deployment) -> bool {
    let generation = deployment.metadata.generation.unwrap_or(0);
    let Some(s) = deployment.status.as_ref() else {
        return false;
    };
    s.observed_generation.unwrap_or(0) >= generation
        && s.replicas.unwrap_or(0) == s.updated_replicas.unwrap_or(0)
}

/// When the operator's last server-side apply changed the Deployment, by
/// the API server's clock (its `managedFields` entry), when the object
/// carries it: the write's own response does.
pub fn applied_at(deployment: &Deployment) -> Option<Time> {
    deployment
        .metadata
        .managed_fields
        .as_deref()?
        .iter()
        .find(|m| {
            m.manager.as_deref() == Some(crate::api::names::FIELD_MANAGER)
                && m.operation.as_deref() == Some("Apply")
                && m.subresource.as_deref().unwrap_or_default().is_empty()
        })?
        .time
        .clone()
}

/// The Deployment's `spec.replicas` when the operator's own server-side
/// apply owns it (its `managedFields` entry lists `f:spec.f:replicas`):
/// an apply that stops sending the field must hand it over first.
pub fn replicas_owned_by_operator(deployment: &Deployment) -> Option<i32> {
    let replicas = deployment.spec.as_ref()?.replicas?;
    let owned = deployment
        .metadata
        .managed_fields
        .as_deref()?
        .iter()
        .filter(|m| {
            m.manager.as_deref() == Some(crate::api::names::FIELD_MANAGER)
                && m.operation.as_deref() == Some("Apply")
                && m.subresource.as_deref().unwrap_or_default().is_empty()
        })
        .any(|m| {
            m.fields_v1
                .as_ref()
                .is_some_and(|f| f.0.pointer("/f:spec/f:replicas").is_some())
        });
    owned.then_some(replicas)
}

/// The replica count the Deployment wants (its own `spec.replicas`, which
/// the operator or an autoscaler sets).
pub fn wanted_replicas(deployment: &Deployment) -> i32 {
    deployment
        .spec
        .as_ref()
        .and_then(|s| s.replicas)
        .unwrap_or(1)
}

/// All pods are updated, ready and available, none unavailable, and no
/// old pod remains, not even a terminating one: a pod being deleted stays
/// in its Service's endpoints (serving) through its preStop hook and grace
/// period, so until it is gone a client may still be answered by the old
/// model. (`terminatingReplicas` is reported by Kubernetes 1.33 and later;
/// earlier clusters leave it out, and then only the other counts decide.)
fn is_complete(deployment: &Deployment) -> bool {
    let want = wanted_replicas(deployment);
    let Some(s) = deployment.status.as_ref() else {
        return false;
    };
    s.updated_replicas.unwrap_or(0) == want
        && s.ready_replicas.unwrap_or(0) == want
        && s.available_replicas.unwrap_or(0) == want
        && s.unavailable_replicas.unwrap_or(0) == 0
        && s.replicas.unwrap_or(0) == want
        && s.terminating_replicas.unwrap_or(0) == 0
}

/// Why a Deployment that finished rolling out serves less than it should,
/// if it does: reason and message.
pub fn degradation(deployment: &Deployment) -> Option<(&'static str, String)> {
    let conditions = deployment.status.as_ref()?.conditions.as_deref()?;
    let find = |type_: &str, status: &str| {
        conditions
            .iter()
            .find(|c| c.type_ == type_ && c.status == status)
            .map(|c| c.message.clone().unwrap_or_default())
    };
    if let Some(message) = find("ReplicaFailure", "True") {
        return Some(("ReplicaFailure", message));
    }
    if let Some(message) = find("Available", "False") {
        return Some(("MinimumReplicasUnavailable", message));
    }
    None
}

/// The Deployment's `spec.minReadySeconds` (0 when unset).
pub fn min_ready_seconds(deployment: &Deployment) -> i32 {
    deployment
        .spec
        .as_ref()
        .and_then(|s| s.min_ready_seconds)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deployment(status: serde_json::Value) -> Deployment {
        serde_json::from_value(json!({
            "metadata": {"name": "svc", "generation": 2},
            "spec": {"replicas": 2, "selector": {}, "template": {}},
            "status": status,
        }))
        .unwrap()
    }

    fn now() -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(2_000_000_000).unwrap())
    }

    fn at(second: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(second).unwrap())
    }

    #[test]
    fn a_rollout_the_controller_never_reports_on_fails_a_deadline_after_the_write() {
        // Seen on the test control plane: a Recreate rollout whose pods
        // never became ready, the Deployment still saying the rollout
        // before had progressed, 13 minutes on.
        let write = 2_000_000_000;
        let mut d = deployment(json!({
            "observedGeneration": 2, "replicas": 2, "updatedReplicas": 2,
            "unavailableReplicas": 2,
            "conditions": [{
                "type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable",
                "message": "ReplicaSet \"svc-old\" has successfully progressed.",
                "lastUpdateTime": "2033-05-18T03:33:20Z", "lastTransitionTime": "2033-05-18T03:33:19Z",
            }],
        }));
        d.spec.as_mut().unwrap().progress_deadline_seconds = Some(8);
        let since = at(write);
        let grace = UNREPORTED_GRACE_SECONDS;
        assert_eq!(
            judge(&d, 2, Some(&since), &at(write + 7 + grace)),
            Progress::InProgress,
            "the controller's own verdict has its time first"
        );
        let Progress::Failed { reason, message } =
            judge(&d, 2, Some(&since), &at(write + 8 + grace))
        else {
            panic!("a whole deadline without a report is a failed rollout");
        };
        assert_eq!(reason, "ProgressDeadlineExceeded");
        assert!(message.contains("8 s"), "{message}");
        // Progress the controller reported after the write keeps it going,
        // and the controller's own deadline decides.
        d.status.as_mut().unwrap().conditions.as_mut().unwrap()[0] =
            serde_json::from_value(json!({
                "type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated",
                "lastUpdateTime": "2033-05-18T03:33:25Z", "lastTransitionTime": "2033-05-18T03:33:19Z",
            }))
            .unwrap();
        assert_eq!(
            judge(&d, 2, Some(&since), &at(write + 9 + grace)),
            Progress::InProgress
        );
    }

    #[test]
    fn a_rollout_is_complete_only_once_no_old_pod_is_left_terminating() {
        let done = json!({"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2,
                          "readyReplicas": 2, "availableReplicas": 2});
        assert_eq!(
            judge(&deployment(done.clone()), 2, None, &now()),
            Progress::Complete
        );
        let mut terminating = done.clone();
        terminating["terminatingReplicas"] = json!(1);
        assert_eq!(
            judge(&deployment(terminating), 2, None, &now()),
            Progress::InProgress,
            "an old pod in its preStop hook may still answer"
        );
        let mut gone = done;
        gone["terminatingReplicas"] = json!(0);
        assert_eq!(
            judge(&deployment(gone), 2, None, &now()),
            Progress::Complete
        );
    }
}
