//! The served set of every template the operator writes: expand with the
//! new version, contract with the next, refuse what cannot be managed.

use serde_json::{Value, json};

use super::*;
use crate::api::names::SERVED_ENV;

/// The served set of the target's template, `None` when it lists none.
fn served(w: &mut World) -> Option<String> {
    served_of(w.dep())
}

fn served_of(d: &Value) -> Option<String> {
    d["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == SERVED_ENV)
        .map(|e| e["value"].as_str().unwrap_or_default().to_owned())
}

/// `entries`, then the service's default ids: a set written where the
/// container had none keeps answering what the service answered then.
fn defaults_after(entries: &str) -> String {
    format!(
        "{entries},{}",
        crate::plan::served::SERVICE_DEFAULTS.join(",")
    )
}

fn set_served(w: &mut World, entry: Value) {
    let env = w.dep()["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array_mut()
        .unwrap();
    env.retain(|e| e["name"] != SERVED_ENV);
    env.push(entry);
}

#[test]
fn a_bump_serves_the_new_and_the_old_version_and_the_next_one_drops_the_oldest() {
    let mut w = World::ready_at("v1");
    assert_eq!(
        served(&mut w).as_deref(),
        Some(defaults_after("v1").as_str()),
        "the version the Deployment preloaded by hand is not the model's: a rollback to v1 writes this template again"
    );
    w.set_version("v2");
    w.now += 10;
    w.reconcile();
    assert_eq!(
        served(&mut w).as_deref(),
        Some(defaults_after("v2,v1").as_str()),
        "the new pods answer clients still naming v1"
    );
    w.pods_ready();
    w.now += 10;
    w.reconcile();
    assert_eq!(w.status().phase, Some(Phase::Ready));
    // The status catching up changes nothing in the template.
    w.now += 60;
    assert!(w.reconcile().is_empty());
    assert!(w.writes.is_empty(), "{:?}", w.writes);
    assert_eq!(
        served(&mut w).as_deref(),
        Some(defaults_after("v2,v1").as_str())
    );
    w.upgrade("v3");
    assert_eq!(
        served(&mut w).as_deref(),
        Some(defaults_after("v3,v2").as_str()),
        "v1 leaves the set"
    );
}

#[test]
fn an_automatic_rollback_brings_back_the_old_versions_own_template() {
    let mut w = World::ready_at("v1");
    w.upgrade("v2");
    let v2_template = w.dep()["spec"]["template"].clone();
    w.fail_rollout("v3");
    assert_eq!(w.status().rollback_request.as_deref(), Some("automatic:v2"));
    assert_eq!(
        w.dep()["spec"]["template"],
        v2_template,
        "the Deployment controller can take back v2's own ReplicaSet"
    );
    assert_eq!(
        served(&mut w).as_deref(),
        Some(defaults_after("v2,v1").as_str())
    );
}

#[test]
fn a_rollback_to_the_first_version_after_an_adoption_brings_back_its_template() {
    // The Deployment preloaded "boot" by hand before v1: v1's template must
    // come back exactly, which a set naming "boot" would break.
    let mut w = World::ready_at("v1");
    let v1_template = w.dep()["spec"]["template"].clone();
    w.fail_rollout("v2");
    assert_eq!(w.status().rollback_request.as_deref(), Some("automatic:v1"));
    assert_eq!(w.dep()["spec"]["template"], v1_template);
}

#[test]
fn a_manual_rollback_serves_the_version_it_restores_and_the_one_it_replaces() {
    let mut w = World::ready_at("v1");
    w.upgrade("v2");
    w.annotate_rollback(Some("v1"));
    w.reconcile();
    assert_eq!(
        served(&mut w).as_deref(),
        Some(defaults_after("v1,v2").as_str())
    );
    w.pods_ready();
    w.reconcile();
    assert_eq!(
        w.status().last_successful_spec.as_ref().unwrap().version,
        "v1"
    );
    w.now += 60;
    w.reconcile();
    assert!(w.writes.is_empty(), "{:?}", w.writes);
    assert_eq!(
        served(&mut w).as_deref(),
        Some(defaults_after("v1,v2").as_str())
    );
}

#[test]
fn entries_someone_else_listed_stay_after_the_models_own() {
    let mut w = World::new(spec("v1"));
    set_served(&mut w, json!({"name": SERVED_ENV, "value": "team/ner, v1"}));
    w.reconcile();
    assert_eq!(served(&mut w).as_deref(), Some("v1,team/ner"));
    w.pods_ready();
    w.now += 10;
    w.reconcile();
    w.upgrade("v2");
    assert_eq!(
        served(&mut w).as_deref(),
        Some("v2,v1,team/ner"),
        "the team's name stays after the model's"
    );
    w.upgrade("v3");
    assert_eq!(served(&mut w).as_deref(), Some("v3,v2,team/ner"));
    // Released, the set keeps what was not the model's.
    w.resource.deleting = true;
    w.reconcile();
    assert_eq!(served(&mut w).as_deref(), Some("team/ner"));
}

#[test]
fn a_set_read_from_a_config_map_is_refused_before_any_write() {
    let mut w = World::ready_at("v1");
    set_served(
        &mut w,
        json!({"name": SERVED_ENV, "valueFrom": {"configMapKeyRef": {"name": "team", "key": "served"}}}),
    );
    let before = w.dep().clone();
    w.set_version("v2");
    w.now += 10;
    let events = w.reconcile();
    assert!(w.writes.is_empty(), "{:?}", w.writes);
    assert_eq!(w.dep(), &before, "no pod is replaced");
    assert_eq!(
        w.condition(READY),
        ("False".into(), reason::SERVED_SET_REFUSED.into())
    );
    let event = events
        .iter()
        .find(|e| e.reason == reason::SERVED_SET_REFUSED)
        .expect("said once in an Event");
    assert!(
        event.message.contains("ConfigMap team"),
        "{}",
        event.message
    );
}

/// The served set as a GitOps tool applies it: its value, its field.
fn kept_by_git(w: &mut World, value: &str) {
    set_served(w, json!({"name": SERVED_ENV, "value": value}));
    w.dep()["metadata"]["managedFields"] = json!([{
        "manager": "kustomize-controller", "operation": "Apply",
        "fieldsV1": {"f:spec": {"f:template": {"f:spec": {"f:containers": {
            "k:{\"name\":\"openmed-service\"}": {"f:env": {
                "k:{\"name\":\"OPENMED_SERVICE_SERVED_MODELS\"}": {".": {}, "f:name": {}, "f:value": {}}}}}}}}}
    }]);
}

#[test]
fn a_set_another_tool_applies_is_its_own_and_must_list_the_version() {
    let mut w = World::ready_at("v1");
    kept_by_git(&mut w, "v1,team/ner");
    w.set_version("v2");
    w.now += 10;
    w.reconcile();
    assert!(w.writes.is_empty(), "{:?}", w.writes);
    let (_, why) = w.condition(READY);
    assert_eq!(why, reason::SERVED_SET_REFUSED);
    // With the version listed in Git, the operator rolls and leaves the
    // tool's value alone: no fight over the field.
    kept_by_git(&mut w, "v2,v1,team/ner");
    w.now += 10;
    w.reconcile();
    assert_eq!(w.status().phase, Some(Phase::RollingOut));
    assert_eq!(served(&mut w).as_deref(), Some("v2,v1,team/ner"));
    assert!(w.writes.iter().all(|write| match write {
        Write::ApplyDeployment { body, .. } => served_of(body).is_none(),
        _ => true,
    }));
}

#[test]
fn adopting_a_template_of_the_same_model_adds_no_set_and_restarts_no_pod() {
    let mut w = World::ready_at("v1");
    let env = w.dep()["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array_mut()
        .unwrap();
    env.retain(|e| e["name"] != SERVED_ENV);
    let before = w.dep()["spec"]["template"].clone();
    w.now += 60;
    w.reconcile();
    assert!(w.writes.is_empty(), "{:?}", w.writes);
    assert_eq!(w.dep()["spec"]["template"], before);
    // The next version brings the set.
    w.upgrade("v2");
    assert_eq!(
        served(&mut w).as_deref(),
        Some(defaults_after("v2,v1").as_str())
    );
}
