//! Kubernetes Events about OpenMedModels, as `events.k8s.io/v1`.
//!
//! Each event has a name derived from (resource UID, reason, generation,
//! note), so a reconcile that is retried never creates a second object for
//! the same occurrence; a genuine repeat (the same drift corrected twice in
//! one generation) finds the existing event and extends its `series`
//! instead of being dropped. The note is part of the name because the API
//! server keeps an event's note as first written: a canary's second step
//! is an event of its own, not a repeat of the first under its note. `eventTime` has microseconds, so the events of one rollout,
//! written within the same second, still list in the order they happened.
//! Messages carry lifecycle state only, never request text, model output,
//! patient data or credentials.
//!
//! kube's own `Recorder` writes the same API, but names each event after
//! the time it was sent: a create retried after a lost answer, or a second
//! operator instance, would write a second object for one occurrence.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as KubeEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use sha2::{Digest, Sha256};

use super::model::RawModel;
use crate::api::names::{EVENT_GENERATION_ANNOTATION, FIELD_MANAGER};
use crate::api::{API_VERSION, KIND};
use crate::plan::canonical::hex;
use crate::rollout::{self, Event, EventType};

/// An annotation with a value unique to one attempt to create an event: a
/// create that took effect but was answered with an error (a 504 after
/// commit, which the client retries) finds its own event on the retry, by
/// this value, and does not count itself twice.
const OCCURRENCE_ANNOTATION: &str = "openmed.ai/event-occurrence";

/// The API server refuses a `note` longer than this (bytes).
const NOTE_LIMIT: usize = 1024;

/// The API server refuses a `reportingInstance` longer than this (bytes).
const INSTANCE_LIMIT: usize = 128;

/// Writes events; remembers counts so repeats cost one request.
///
/// The counts are kept per resource (by UID) and only for its current
/// generation, since event names carry the generation: memory stays
/// bounded by the resources that exist. The model watch drops a deleted
/// one's ([`Recorder::forget`], [`Recorder::keep_only`]), whoever deleted
/// it: this process's clean-up, another instance's, or a finalizer removed
/// by hand. Clones share the counts.
#[derive(Clone)]
pub struct Recorder {
    client: Client,
    instance: String,
    counts: std::sync::Arc<Mutex<HashMap<String, GenerationCounts>>>,
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
            counts: Default::default(),
        }
    }

    /// Forgets the counts of a resource that is gone.
    pub fn forget(&self, resource: &RawModel) {
        let uid = resource.uid().unwrap_or_default();
        self.counts.lock().expect("event counts").remove(&uid);
    }

    /// Forgets the counts of every resource whose UID `exists` denies: after
    /// a watch relists, resources deleted while it was down sent no event.
    pub fn keep_only(&self, exists: impl Fn(&str) -> bool) {
        self.counts
            .lock()
            .expect("event counts")
            .retain(|uid, _| exists(uid));
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
    pub fn name(resource: &RawModel, reason: &str, note: &str) -> String {
        let uid = resource.uid().unwrap_or_default();
        let generation = resource.metadata.generation.unwrap_or(0);
        let digest = Sha256::digest(format!("{uid}/{reason}/{generation}/{note}").as_bytes());
        let name = resource.name_any();
        let keep = 253 - 17;
        let prefix: String = name.chars().take(keep).collect();
        // A name cut after a '-' or '.' would put it before the dot, which
        // events.k8s.io/v1 refuses (the name must be a DNS subdomain).
        let prefix = prefix.trim_end_matches(['-', '.']);
        format!("{prefix}.{}", &hex(&digest)[..16])
    }

    /// Records `event` on `resource`: creates it, or counts a repeat in
    /// its `series`. The time is taken here, to the microsecond, so events
    /// recorded one after another list in that order.
    pub async fn record(&self, resource: &RawModel, event: &Event) -> Result<(), kube::Error> {
        let namespace = resource.namespace().unwrap_or_default();
        let api: Api<KubeEvent> = Api::namespaced(self.client.clone(), &namespace);
        let name = Self::name(resource, event.reason, &event.message);
        let occurrence = uuid::Uuid::new_v4().to_string();
        let body = self.body(resource, event, &name, &occurrence, Timestamp::now());
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
                        let count = existing.series.as_ref().map_or(1, |s| s.count);
                        if existing.annotations().get(OCCURRENCE_ANNOTATION) == Some(&occurrence) {
                            // This very create took effect on an earlier try.
                            self.remember(resource, name, count);
                            return Ok(());
                        }
                        count
                    }
                } + 1;
                // Only the series may change: the API server keeps an
                // event's note, reason and times as first written.
                let series = EventSeries {
                    count,
                    last_observed_time: MicroTime(Timestamp::now()),
                };
                api.patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "series": series })),
                )
                .await?;
                self.remember(resource, name, count);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// The first occurrence's object.
    fn body(
        &self,
        resource: &RawModel,
        event: &Event,
        name: &str,
        occurrence: &str,
        at: Timestamp,
    ) -> KubeEvent {
        let namespace = resource.namespace().unwrap_or_default();
        let type_ = match event.type_ {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        };
        KubeEvent {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(namespace.clone()),
                annotations: Some(
                    [
                        (OCCURRENCE_ANNOTATION.to_owned(), occurrence.to_owned()),
                        (
                            EVENT_GENERATION_ANNOTATION.to_owned(),
                            resource.metadata.generation.unwrap_or(0).to_string(),
                        ),
                    ]
                    .into(),
                ),
                ..ObjectMeta::default()
            },
            regarding: Some(ObjectReference {
                api_version: Some(API_VERSION.to_owned()),
                kind: Some(KIND.to_owned()),
                name: Some(resource.name_any()),
                namespace: Some(namespace),
                uid: resource.uid(),
                resource_version: resource.resource_version(),
                ..ObjectReference::default()
            }),
            action: Some(rollout::action(event.reason).to_owned()),
            reason: Some(event.reason.to_owned()),
            note: Some(truncated(&event.message, NOTE_LIMIT).to_owned()),
            type_: Some(type_.to_owned()),
            event_time: Some(MicroTime(at)),
            reporting_controller: Some(FIELD_MANAGER.to_owned()),
            reporting_instance: Some(truncated(&self.instance, INSTANCE_LIMIT).to_owned()),
            ..KubeEvent::default()
        }
    }
}

/// The longest prefix of `text` that fits in `limit` bytes, on a character
/// boundary.
fn truncated(text: &str, limit: usize) -> &str {
    let mut end = text.len().min(limit);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
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

    fn recorder(instance: &str) -> Recorder {
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        Recorder::new(Client::try_from(config).unwrap(), instance.into())
    }

    #[tokio::test]
    async fn the_first_occurrence_is_an_events_v1_object_the_api_server_accepts() {
        let event = Event {
            type_: EventType::Warning,
            reason: crate::rollout::reason::ROLLOUT_FAILED,
            message: "é".repeat(600),
        };
        let at: Timestamp = "2026-12-01T10:00:00.123456Z".parse().unwrap();
        let body = recorder(&"p".repeat(200)).body(&model("a", 3), &event, "m.x", "o", at);
        let wire = serde_json::to_value(&body).unwrap();
        assert_eq!(wire["eventTime"], "2026-12-01T10:00:00.123456Z");
        assert_eq!(wire["action"], "Rollout");
        assert_eq!(wire["reportingController"], FIELD_MANAGER);
        assert_eq!(wire["regarding"]["kind"], KIND);
        assert_eq!(wire["type"], "Warning");
        assert!(
            wire.get("series").is_none(),
            "a first occurrence has no series"
        );
        let note = wire["note"].as_str().unwrap();
        assert_eq!(
            note.len(),
            NOTE_LIMIT,
            "cut to the limit on a character boundary"
        );
        assert_eq!(
            wire["reportingInstance"].as_str().unwrap().len(),
            INSTANCE_LIMIT
        );
    }

    #[test]
    fn a_long_name_cut_at_a_dash_still_makes_a_dns_subdomain() {
        let long = format!("{}-{}", "a".repeat(235), "b".repeat(17));
        let mut resource = model("u", 1);
        resource.metadata.name = Some(long);
        let name = Recorder::name(&resource, "RolloutStarted", "note");
        assert!(name.len() <= 253, "{}", name.len());
        assert!(!name.contains("-."), "{name}");
        assert!(name.starts_with(&"a".repeat(235)), "{name}");
        assert_ne!(
            Recorder::name(&resource, "RolloutStarted", "another note"),
            name,
            "the note is part of the name"
        );
    }

    #[tokio::test]
    async fn counts_are_kept_per_resource_for_its_current_generation_only() {
        let recorder = recorder("test");
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

    #[tokio::test]
    async fn counts_of_resources_deleted_while_the_watch_was_down_are_dropped() {
        let recorder = recorder("test");
        recorder.remember(&model("a", 1), "m.1".into(), 3);
        recorder.remember(&model("b", 1), "m.2".into(), 1);
        let clone = recorder.clone();
        clone.keep_only(|uid| uid == "b");
        assert_eq!(recorder.remembered(), 1, "clones share the counts");
        assert_eq!(recorder.known(&model("b", 1), "m.2"), Some(1));
    }
}
