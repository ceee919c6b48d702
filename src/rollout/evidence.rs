//! What the rollout's own pods say about it before the Deployment
//! controller does: which pods are the rollout's ([`super::pods`]), a pod
//! of them that keeps crashing ([`super::crash_loop`]), the quality gate's
//! verdicts on them and a pod that failed it ([`super::quality`]), and
//! what a failing pod said last.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::{Plan, Step, Write, crash_loop, pods, quality, reason};

impl<'a> Step<'a> {
    /// Evidence from the rollout's own pods that it has failed before the
    /// Deployment controller says so: a pod that keeps crashing (when
    /// fail-fast is on), or one that failed the quality gate. The reason
    /// and the message.
    pub(super) fn failed_early(
        &self,
        wanted: &Plan,
        target: &Deployment,
        since: Option<&Time>,
    ) -> Option<(&'static str, String)> {
        let container = &wanted.deployment.container;
        let crash = wanted
            .normalized
            .rollout_strategy
            .fail_fast_restarts()
            .and_then(|restarts| {
                let since = since.map(|t| t.0.as_second());
                crash_loop::crash_loop(self.rollout_pods(target), container, restarts, since)
            })
            .map(|crash| (reason::CRASH_LOOP, crash.message(container)));
        let quality = || {
            wanted.deployment.quality_gate.then(|| {
                quality::failure(self.rollout_pods(target))
                    .map(|message| (reason::QUALITY_GATE_FAILED, message))
            })?
        };
        crash.or_else(quality)
    }

    /// The quality gate's verdicts on the pods its rounds measured: a
    /// mark to write on each pod judged, an Event for each, and a look
    /// again while a pod still awaits judgement.
    pub(super) fn judge_quality(&mut self) {
        let owner = self.obs.resource.key();
        let judged = quality::judge_gate(self.obs.probes, self.obs.pods, &owner);
        self.events.extend(judged.events);
        // A spec refused for its bounds waits for a change, not a timer.
        if quality::gate_of(self.obs.resource).is_some()
            && quality::awaiting(self.obs.pods, &owner, &judged.marks)
            && quality::unmatched_bounds(self.obs.probes).is_empty()
        {
            let retry = Duration::from_secs(quality::RETRY_SECONDS);
            self.requeue_after = Some(self.requeue_after.map_or(retry, |d| d.min(retry)));
        }
        self.writes
            .extend(judged.marks.into_iter().map(|mark| Write::MarkPod {
                name: mark.pod,
                passed: mark.passed,
                reason: mark.reason,
                message: mark.message,
            }));
    }

    /// What a failing pod of the rollout said last.
    pub(super) fn last_words(&self, wanted: &Plan, target: &Deployment) -> Option<String> {
        crash_loop::last_words(self.rollout_pods(target), &wanted.deployment.container)
    }

    /// The pods of the rollout being judged on `target`: those of the
    /// ReplicaSet the Deployment controller made for the generation this
    /// resource wrote, and of this resource (see [`pods::of_rollout`]).
    /// None until the controller has seen that generation.
    pub(super) fn rollout_pods(&self, target: &Deployment) -> Vec<&'a pods::PodView> {
        let obs = self.obs;
        let replica_sets = obs.snapshot_uses.iter().map(|u| pods::ReplicaSetRef {
            name: &u.replica_set,
            deployment: u.deployment.as_deref(),
            revision: u.revision.as_deref(),
        });
        let generation = self.status.target_deployment_generation;
        let Some(replica_set) = pods::current_replica_set(target, generation, replica_sets) else {
            return Vec::new();
        };
        let owner = obs.resource.key();
        pods::of_rollout(obs.pods, &obs.resource.namespace, &owner, replica_set).collect()
    }
}
