//! Kubernetes Events about OpenMedModels.
//!
//! Each event has a name derived from (resource UID, reason, generation), so
//! a reconcile that is retried never creates a second object for the same
//! occurrence; a genuine repeat (drift corrected twice in one generation)
//! finds the existing event and increments its `count` instead of being
//! dropped. Messages carry lifecycle state only, never request text, model
//! output, patient data or credentials.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::{Event as KubeEvent, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use sha2::{Digest, Sha256};

use super::model::RawModel;
use crate::api::names::FIELD_MANAGER;
use crate::api::{API_VERSION, KIND};
use crate::plan::canonical::hex;
use crate::rollout::{Event, EventType};

/// An annotation with a value unique to one attempt to create an event: a
/// create that took effect but was answered with an error (a 504 after
/// commit, which the client retries) finds its own event on the retry, by
/// this value, and does not count itself twice.
const OCCURRENCE_ANNOTATION: &str = "openmed.ai/event-occurrence";

/// Writes events; remembers counts so repeats cost one request.
///
/// The counts are kept per resource (by UID) and only for its current
/// generation, since event names carry the generation: memory stays
/// bounded by the resources that exist, and [`Recorder::forget`] drops a
/// deleted one's.
pub struct Recorder {
    client: Client,
    instance: String,
    counts: Mutex<HashMap<String, GenerationCounts>>,
}

/// The counts of one resource's events in one generation.
#[derive(Default)]
struct GenerationCounts {
    generation: i64,
    by_name: HashMap<String, i32>,
}

impl Recorder {
    /// A recorder reporting as `instance` (the operator pod's name).
    pub fn new(client: Client, instance: String) -> Self {
        Recorder {
            client,
            instance,
            counts: Mutex::new(HashMap::new()),
        }
    }

    /// Forgets the counts of a resource that is gone.
    pub fn forget(&self, resource: &RawModel) {
        let uid = resource.uid().unwrap_or_default();
        self.counts.lock().expect("event counts").remove(&uid);
    }

    fn known(&self, resource: &RawModel, name: &str) -> Option<i32> {
        let uid = resource.uid().unwrap_or_default();
        let generation = resource.metadata.generation.unwrap_or(0);
        let counts = self.counts.lock().expect("event counts");
        let of = counts.get(&uid).filter(|c| c.generation == generation)?;
        of.by_name.get(name).copied()
    }

    fn remember(&self, resource: &RawModel, name: String, count: i32) {
        let uid = resource.uid().unwrap_or_default();
        let generation = resource.metadata.generation.unwrap_or(0);
        let mut counts = self.counts.lock().expect("event counts");
        let of = counts.entry(uid).or_default();
        if of.generation != generation {
            // A new generation names new events: the old counts are done.
            *of = GenerationCounts {
                generation,
                by_name: HashMap::new(),
            };
        }
        of.by_name.insert(name, count);
    }

    /// How many resources have counts remembered (for tests).
    #[cfg(test)]
    fn remembered(&self) -> usize {
        self.counts.lock().expect("event counts").len()
    }

    /// The deterministic name of an occurrence.
    pub fn name(resource: &RawModel, reason: &str) -> String {
        let uid = resource.uid().unwrap_or_default();
        let generation = resource.metadata.generation.unwrap_or(0);
        let digest = Sha256::digest(format!("{uid}/{reason}/{generation}").as_bytes());
        let name = resource.name_any();
        let keep = 253 - 17;
        let prefix: String = name.chars().take(keep).collect();
        format!("{prefix}.{}", &hex(&digest)[..16])
    }

    /// Records `event` on `resource`: creates it, or counts a repeat.
    pub async fn record(
        &self,
        resource: &RawModel,
        event: &Event,
        now: &Time,
    ) -> Result<(), kube::Error> {
        let namespace = resource.namespace().unwrap_or_default();
        let api: Api<KubeEvent> = Api::namespaced(self.client.clone(), &namespace);
        let name = Self::name(resource, event.reason);
        let type_ = match event.type_ {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        };
        let occurrence = uuid::Uuid::new_v4().to_string();
        let body = KubeEvent {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
                annotations: Some([(OCCURRENCE_ANNOTATION.to_owned(), occurrence.clone())].into()),
                ..ObjectMeta::default()
            },
            involved_object: ObjectReference {
                api_version: Some(API_VERSION.to_owned()),
                kind: Some(KIND.to_owned()),
                name: Some(resource.name_any()),
                namespace: Some(namespace.clone()),
                uid: resource.uid(),
                resource_version: resource.resource_version(),
                ..ObjectReference::default()
            },
            reason: Some(event.reason.to_owned()),
            message: Some(event.message.clone()),
            type_: Some(type_.to_owned()),
            count: Some(1),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now.clone()),
            event_time: None::<MicroTime>,
            source: Some(EventSource {
                component: Some(FIELD_MANAGER.to_owned()),
                host: None,
            }),
            reporting_component: Some(FIELD_MANAGER.to_owned()),
            reporting_instance: Some(self.instance.clone()),
            ..KubeEvent::default()
        };
        match api.create(&PostParams::default(), &body).await {
            Ok(_) => {
                self.remember(resource, name, 1);
                Ok(())
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                let count = match self.known(resource, &name) {
                    Some(c) => c,
                    None => {
                        let existing = api.get(&name).await?;
                        let count = existing.count.unwrap_or(1);
                        if existing.annotations().get(OCCURRENCE_ANNOTATION) == Some(&occurrence) {
                            // This very create took effect on an earlier try.
                            self.remember(resource, name, count);
                            return Ok(());
                        }
                        count
                    }
                } + 1;
                let patch =
                    json!({ "count": count, "lastTimestamp": now, "message": event.message });
                api.patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                    .await?;
                self.remember(resource, name, count);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(uid: &str, generation: i64) -> RawModel {
        serde_json::from_value(json!({
            "apiVersion": API_VERSION, "kind": KIND,
            "metadata": {"name": "m", "namespace": "ns", "uid": uid, "generation": generation},
            "spec": {},
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn counts_are_kept_per_resource_for_its_current_generation_only() {
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let recorder = Recorder::new(Client::try_from(config).unwrap(), "test".into());
        recorder.remember(&model("a", 1), "m.1".into(), 3);
        recorder.remember(&model("b", 1), "m.2".into(), 1);
        assert_eq!(recorder.known(&model("a", 1), "m.1"), Some(3));
        recorder.remember(&model("a", 2), "m.3".into(), 1);
        assert_eq!(
            recorder.known(&model("a", 1), "m.1"),
            None,
            "a new generation drops the old counts"
        );
        assert_eq!(recorder.remembered(), 2);
        recorder.forget(&model("a", 2));
        recorder.forget(&model("b", 1));
        assert_eq!(
            recorder.remembered(),
            0,
            "a deleted resource leaves nothing"
        );
    }
}
