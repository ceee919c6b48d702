//! What the operator keeps of a pod of a managed template, and the news a
//! decision reads from it: a container that keeps crashing
//! ([`super::crash_loop`]) and a pod whose model the quality gate is to
//! judge, or has judged ([`super::quality`]).
//!
//! Pure: the shell reduces each watched pod (those with the snapshot
//! label) to a [`PodView`].

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
}

impl PodView {
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
