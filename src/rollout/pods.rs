//! What the operator keeps of a pod of a managed template, and the news a
//! decision reads from it: a container that keeps crashing
//! ([`super::crash_loop`]) and a pod whose model the quality gate is to
//! judge, or has judged ([`super::quality`]).
//!
//! Pure: the shell reduces each watched pod (those with the snapshot
//! label) to a [`PodView`].
//!
//! Which pods a rollout is judged by ([`of_rollout`]): those of the
//! ReplicaSet the Deployment controller made for the generation being
//! rolled out, of this resource, and not being deleted. Not those that
//! merely carry the same snapshot label: the label is a hash of the model
//! (family, tier, version) alone, so a canary's pods, another resource
//! serving the same model in the namespace, and the pods of an earlier
//! template of the same model all carry it too.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;

use crate::api::quality::QUALITY_CONDITION;

/// What the operator keeps of a pod.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct PodView {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its `openmed.ai/model-resource` annotation (from its template): the
    /// OpenMedModel whose model it runs, `<namespace>/<name>`.
    pub owner: Option<String>,
    /// Its template's snapshot label (the revision it runs), if any.
    pub snapshot: Option<String>,
    /// The ReplicaSet that controls it (its controller owner reference).
    pub replica_set: Option<String>,
    /// Its creation time on the API server's clock, in seconds since the
    /// epoch.
    pub created: Option<i64>,
    /// Being deleted: its restarts say nothing about the rollout.
    pub terminating: bool,
    /// Its containers' states.
    pub containers: Vec<ContainerView>,
    /// `status.podIP`, once it has one.
    pub ip: Option<String>,
    /// Its `ContainersReady` condition is True: every container passes its
    /// readiness probe (the model is warm), whatever the readiness gates say.
    pub containers_ready: bool,
    /// Its template carries the quality gate's readiness gate.
    pub gated: bool,
    /// The quality gate's condition on it, once judged.
    pub quality: Option<QualityMark>,
}

/// The quality gate's condition on a pod, as written by the operator.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct QualityMark {
    /// `True`: the pod passed; `False`: it failed.
    pub passed: bool,
    /// The condition's message (the recall figures).
    pub message: String,
}

/// One container's state, as the kubelet reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct ContainerView {
    /// The container's name.
    pub name: String,
    /// `restartCount`.
    pub restarts: i32,
    /// `lastState.terminated` (or `state.terminated`): exit code, reason
    /// and message.
    pub last_exit: Option<(i32, String, String)>,
    /// When that exit happened (`finishedAt`, the kubelet's clock), in
    /// seconds since the epoch.
    pub last_exit_at: Option<i64>,
    /// `state.waiting.reason` (`CrashLoopBackOff` while the kubelet holds
    /// a crashed container back), if it waits.
    pub waiting: Option<String>,
    /// `state.running.startedAt` (the kubelet's clock), in seconds since
    /// the epoch, while it runs: since when its model has been warming or
    /// serving. A pod whose container never ran (unscheduled, its image
    /// being pulled) has none.
    pub running_since: Option<i64>,
}

/// The kubelet's reason for a container it holds back after crashes.
pub const CRASH_LOOP_BACK_OFF: &str = "CrashLoopBackOff";

impl ContainerView {
    /// Whether this container crashed during a rollout that began at
    /// `since` (seconds, the API server's clock) in a pod created at
    /// `created`, often enough to count: `restarts` restarts when the pod
    /// is the rollout's own (created since it began), so every restart
    /// happened during it; for an older pod, whose restart count may be a
    /// week old (an OOM kill, a node hiccup), only while the kubelet holds
    /// it back after a failed exit that happened since.
    pub fn crashed_since(&self, created: Option<i64>, since: Option<i64>, restarts: i32) -> bool {
        if self.restarts < restarts {
            return false;
        }
        let Some(since) = since else {
            // Nothing says when the rollout began: count no history.
            return self.crash_looping_since(None);
        };
        if created.is_some_and(|c| c >= since) {
            return true;
        }
        self.crash_looping_since(Some(since))
    }

    /// Held back after a failed exit (at or after `since`, when given).
    fn crash_looping_since(&self, since: Option<i64>) -> bool {
        let failed = self
            .last_exit
            .as_ref()
            .is_some_and(|(code, _, _)| *code != 0);
        let recent = match (since, self.last_exit_at) {
            (None, _) => true,
            (Some(since), Some(at)) => at >= since,
            (Some(_), None) => false,
        };
        self.waiting.as_deref() == Some(CRASH_LOOP_BACK_OFF) && failed && recent
    }
}

impl PodView {
    /// Whether the pod is Ready and so gets requests: its model warm and,
    /// when the quality gate guards it, passed. A gated pod that failed
    /// the gate never served anyone.
    pub fn serves(&self) -> bool {
        self.containers_ready && (!self.gated || self.quality.as_ref().is_some_and(|q| q.passed))
    }

    /// The part of a pod that a decision reads.
    pub fn of(pod: &Pod) -> PodView {
        let status = pod.status.as_ref();
        let containers = status
            .and_then(|s| s.container_statuses.as_ref())
            .map(|statuses| {
                statuses
                    .iter()
                    .map(|c| {
                        let terminated = c
                            .last_state
                            .as_ref()
                            .and_then(|s| s.terminated.as_ref())
                            .or_else(|| c.state.as_ref().and_then(|s| s.terminated.as_ref()));
                        ContainerView {
                            name: c.name.clone(),
                            restarts: c.restart_count,
                            last_exit: terminated.map(|t| {
                                (
                                    t.exit_code,
                                    t.reason.clone().unwrap_or_default(),
                                    t.message.clone().unwrap_or_default(),
                                )
                            }),
                            last_exit_at: terminated
                                .and_then(|t| t.finished_at.as_ref())
                                .map(|t| t.0.as_second()),
                            waiting: c
                                .state
                                .as_ref()
                                .and_then(|s| s.waiting.as_ref())
                                .and_then(|w| w.reason.clone()),
                            running_since: c
                                .state
                                .as_ref()
                                .and_then(|s| s.running.as_ref())
                                .and_then(|r| r.started_at.as_ref())
                                .map(|t| t.0.as_second()),
                        }
                    })
                    .collect()
            })
            .unwrap_or_default();
        let conditions = status.and_then(|s| s.conditions.as_deref()).unwrap_or(&[]);
        let condition = |kind: &str| conditions.iter().find(|c| c.type_ == kind);
        PodView {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            owner: pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(crate::api::names::MODEL_RESOURCE_ANNOTATION))
                .cloned(),
            snapshot: pod
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(crate::api::names::MANIFEST_SNAPSHOT_LABEL))
                .cloned(),
            replica_set: pod
                .metadata
                .owner_references
                .iter()
                .flatten()
                .find(|o| o.controller == Some(true) && o.kind == "ReplicaSet")
                .map(|o| o.name.clone()),
            created: pod
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.as_second()),
            terminating: pod.metadata.deletion_timestamp.is_some(),
            containers,
            ip: status
                .and_then(|s| s.pod_ip.clone())
                .filter(|ip| !ip.is_empty()),
            containers_ready: condition("ContainersReady").is_some_and(|c| c.status == "True"),
            gated: pod
                .spec
                .as_ref()
                .and_then(|s| s.readiness_gates.as_ref())
                .is_some_and(|gates| gates.iter().any(|g| g.condition_type == QUALITY_CONDITION)),
            quality: condition(QUALITY_CONDITION)
                .filter(|c| c.status == "True" || c.status == "False")
                .map(|c| QualityMark {
                    passed: c.status == "True",
                    message: c.message.clone().unwrap_or_default(),
                }),
        }
    }

    /// A container restarted or exited: news about a pod that a decision
    /// reads (pods coming and going show in the Deployment's status
    /// already).
    pub fn crashed(&self) -> bool {
        self.containers
            .iter()
            .any(|c| c.restarts > 0 || c.last_exit.is_some())
    }

    /// A gated pod whose model is warm and not yet judged: the quality
    /// gate is to probe it.
    pub fn awaits_judgement(&self) -> bool {
        self.gated && self.containers_ready && self.quality.is_none() && !self.terminating
    }

    /// Whether this pod is news for the models of its namespace: a
    /// crash, a model to judge, or one that failed. (A pod that passed
    /// turns Ready, which the Deployment's status shows.)
    pub fn is_news(&self) -> bool {
        self.crashed()
            || self.awaits_judgement()
            || self.quality.as_ref().is_some_and(|q| !q.passed)
    }
}

/// The pods of template `snapshot` in `namespace` that are not being
/// deleted.
pub fn of_template<'a>(
    pods: &'a [PodView],
    namespace: &'a str,
    snapshot: &'a str,
) -> impl Iterator<Item = &'a PodView> {
    pods.iter().filter(move |p| {
        p.namespace == namespace && !p.terminating && p.snapshot.as_deref() == Some(snapshot)
    })
}

/// The annotation the Deployment controller numbers a Deployment's
/// rollouts with, on the Deployment (its latest) and on each ReplicaSet
/// (the one it made it for).
pub const REVISION_ANNOTATION: &str = "deployment.kubernetes.io/revision";

/// One ReplicaSet as the rollout rules read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaSetRef<'a> {
    /// Its name.
    pub name: &'a str,
    /// The UID of the Deployment that controls it.
    pub deployment: Option<&'a str>,
    /// Its [`REVISION_ANNOTATION`].
    pub revision: Option<&'a str>,
}

/// The ReplicaSet of `target`'s current template, once the Deployment
/// controller has seen generation `generation` (the one being rolled
/// out): the one it controls with the Deployment's own revision. Before
/// that the revision still names the previous template's, so nothing.
pub fn current_replica_set<'a>(
    target: &Deployment,
    generation: Option<i64>,
    replica_sets: impl IntoIterator<Item = ReplicaSetRef<'a>>,
) -> Option<&'a str> {
    let observed = target.status.as_ref().and_then(|s| s.observed_generation);
    let generation = generation?;
    if observed.is_none_or(|o| o < generation) {
        return None;
    }
    let uid = target.metadata.uid.as_deref()?;
    let revision = target
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(REVISION_ANNOTATION))?;
    replica_sets
        .into_iter()
        .find(|rs| rs.deployment == Some(uid) && rs.revision == Some(revision.as_str()))
        .map(|rs| rs.name)
}

/// The pods of one rollout: those of `replica_set` (see
/// [`current_replica_set`]) in `namespace` that run the model of the
/// resource `owner` (`<namespace>/<name>`) and are not being deleted.
pub fn of_rollout<'a, 'b>(
    pods: &'a [PodView],
    namespace: &'b str,
    owner: &'b str,
    replica_set: &'b str,
) -> impl Iterator<Item = &'a PodView> + 'b
where
    'a: 'b,
{
    pods.iter().filter(move |p| {
        p.namespace == namespace
            && !p.terminating
            && p.owner.as_deref() == Some(owner)
            && p.replica_set.as_deref() == Some(replica_set)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn target(generation: i64, observed: i64, revision: &str) -> Deployment {
        serde_json::from_value(json!({
            "metadata": {"name": "svc", "uid": "d-1", "generation": generation,
                "annotations": {REVISION_ANNOTATION: revision}},
            "status": {"observedGeneration": observed},
        }))
        .unwrap()
    }

    fn rs<'a>(name: &'a str, deployment: &'a str, revision: &'a str) -> ReplicaSetRef<'a> {
        ReplicaSetRef {
            name,
            deployment: Some(deployment),
            revision: Some(revision),
        }
    }

    #[test]
    fn the_current_replica_set_is_the_targets_at_its_revision_once_observed() {
        let sets = [
            rs("svc-old", "d-1", "1"),
            rs("svc-new", "d-1", "2"),
            rs("other-new", "d-2", "2"),
        ];
        assert_eq!(
            current_replica_set(&target(3, 3, "2"), Some(3), sets),
            Some("svc-new")
        );
        assert_eq!(
            current_replica_set(&target(3, 2, "1"), Some(3), sets),
            None,
            "the written generation is not observed yet: the revision is the last one's"
        );
        assert_eq!(
            current_replica_set(&target(3, 3, "2"), None, sets),
            None,
            "no generation recorded: the write has not landed"
        );
        assert_eq!(
            current_replica_set(&target(3, 3, "3"), Some(3), sets),
            None,
            "the ReplicaSet is not in the cache yet"
        );
    }

    #[test]
    fn a_rollouts_pods_are_its_replica_sets_of_this_resource_not_leaving() {
        let pod = |name: &str, owner: &str, replica_set: &str, terminating: bool| PodView {
            namespace: "ns".into(),
            name: name.into(),
            owner: Some(owner.into()),
            replica_set: Some(replica_set.into()),
            terminating,
            ..PodView::default()
        };
        let pods = [
            pod("a", "ns/svc", "svc-new", false),
            pod("b", "ns/svc", "svc-old", false),
            pod("c", "ns/other", "svc-new", false),
            pod("d", "ns/svc", "svc-new", true),
        ];
        let names: Vec<&str> = of_rollout(&pods, "ns", "ns/svc", "svc-new")
            .map(|p| p.name.as_str())
            .collect();
        assert_eq!(names, ["a"]);
        assert_eq!(of_rollout(&pods, "other", "ns/svc", "svc-new").count(), 0);
    }
}
