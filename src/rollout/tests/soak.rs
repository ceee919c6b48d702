//! The soak: `Soaked` for the version the spec asks for, set by a timer,
//! and a failure during it rolled back to the version before.

use super::*;
use crate::api::names::SOAK_ABORT_ANNOTATION;
use conditions::SOAKED;

pub(super) fn soaking_spec(version: &str, seconds: i64) -> Value {
    let mut spec = spec(version);
    spec["rolloutStrategy"] = json!({"soakSeconds": seconds});
    spec
}

impl World {
    /// `version` rolled out with a soak of `seconds`, soaked.
    pub(super) fn soaked_at(version: &str, seconds: i64) -> Self {
        let mut w = World::new(soaking_spec(version, seconds));
        w.reconcile();
        w.pods_ready();
        w.now += 10;
        w.reconcile();
        w.now += seconds;
        w.reconcile();
        assert_eq!(w.condition(SOAKED), ("True".into(), "Soaked".into()));
        w
    }

    /// Bumps to `version` and lets its pods get ready: its soak begins.
    pub(super) fn bump_to_soaking(&mut self, version: &str) {
        self.set_version(version);
        self.now += 10;
        self.reconcile();
        self.controller_rolls();
        self.pods_ready();
        self.now += 10;
        self.reconcile();
        assert_eq!(self.status().phase, Some(Phase::Ready));
        assert_eq!(self.condition(SOAKED), ("False".into(), "Soaking".into()));
    }
}

#[test]
fn soaked_turns_true_only_after_the_soak_by_a_timer_and_names_the_generation() {
    let mut w = World::soaked_at("v1", 300);
    w.set_version("v2");
    w.now += 10;
    w.reconcile();
    assert_eq!(
        w.condition(SOAKED),
        ("False".into(), "RollingOut".into()),
        "the status that starts a rollout already says the spec's version has not soaked"
    );
    w.pods_ready();
    w.now += 10;
    let events = w.reconcile();
    assert_eq!(reasons(&events), [reason::ROLLOUT_SUCCEEDED]);
    assert_eq!(w.condition(READY).0, "True");
    assert_eq!(w.condition(SOAKED), ("False".into(), "Soaking".into()));
    let s = w.status().clone();
    assert_eq!(
        s.last_successful_spec.as_ref().unwrap().version,
        "v1",
        "a version joins the history once it has soaked"
    );
    assert_eq!(s.soak.as_ref().unwrap().version, "v2");

    // A timer, not polling: the decision asks to be looked at when the soak
    // ends, and a pass before that writes nothing.
    let d = w.decide();
    assert_eq!(d.requeue_after, Some(Duration::from_secs(300)));
    w.now += 120;
    let d = w.decide();
    assert_eq!(d.status, s, "a pass during the soak changes nothing");
    assert_eq!(d.requeue_after, Some(Duration::from_secs(180)));
    assert!(d.writes.is_empty());

    w.now += 180;
    let events = w.reconcile();
    assert_eq!(reasons(&events), [reason::SOAKED]);
    let soaked = conditions::get(&w.status().conditions, SOAKED)
        .unwrap()
        .clone();
    assert_eq!(soaked.status, "True");
    assert_eq!(soaked.observed_generation, Some(w.resource.generation));
    assert!(
        soaked.message.starts_with("v2 soaked for 300 s, at "),
        "{}",
        soaked.message
    );
    let s = w.status();
    assert_eq!(s.last_successful_spec.as_ref().unwrap().version, "v2");
    assert_eq!(s.previous_successful_spec.as_ref().unwrap().version, "v1");
    assert!(s.soak.as_ref().unwrap().soaked_time.is_some());
    let d = w.decide();
    assert_eq!(d.requeue_after, None, "a soaked version asks for no timer");
}

#[test]
fn a_restart_during_the_soak_rolls_back_to_the_version_before_it() {
    let mut w = World::soaked_at("v1", 300);
    let v1_hash = w.status().applied_spec_hash.clone();
    w.bump_to_soaking("v2");
    w.now += 60;
    w.crashing_pod("svc-new-1", 1, "Killed");
    let events = w.reconcile();
    assert_eq!(
        reasons(&events),
        [reason::ROLLOUT_FAILED, reason::ROLLBACK_STARTED]
    );
    assert!(
        events[0]
            .message
            .starts_with("v2 failed its soak: pod svc-new-1 restarted during the soak"),
        "{}",
        events[0].message
    );
    assert_eq!(w.status().phase, Some(Phase::RolledBack));
    assert_eq!(w.status().applied_spec_hash, v1_hash, "v1 is applied again");
    assert_eq!(w.cm_version(), "v1");
    assert_eq!(w.condition(SOAKED).0, "False");

    w.pods.clear();
    w.pods_ready();
    w.now += 10;
    let events = w.reconcile();
    assert_eq!(reasons(&events), [reason::ROLLBACK_SUCCEEDED]);
    assert_eq!(w.condition(SOAKED), ("False".into(), "RolledBack".into()));
    assert_eq!(
        retained_versions(w.status()),
        ["v1"],
        "a version that failed its soak never joins the history"
    );
}

#[test]
fn an_abort_annotation_fails_the_running_soak_once_per_value() {
    let mut w = World::soaked_at("v1", 300);
    w.bump_to_soaking("v2");
    w.resource
        .annotations
        .insert(SOAK_ABORT_ANNOTATION.into(), "incident-7".into());
    w.now += 30;
    let events = w.reconcile();
    assert_eq!(
        reasons(&events),
        [reason::ROLLOUT_FAILED, reason::ROLLBACK_STARTED]
    );
    assert!(
        events[0].message.contains("incident-7"),
        "{}",
        events[0].message
    );
    w.pods_ready();
    w.now += 10;
    w.reconcile();
    assert_eq!(w.status().active_version.as_deref(), Some("v1"));

    // The next version's soak is not aborted by the value already acted on.
    w.bump_to_soaking("v3");
    w.now += 300;
    let events = w.reconcile();
    assert_eq!(reasons(&events), [reason::SOAKED]);
    assert_eq!(w.condition(SOAKED).0, "True");
}

#[test]
fn editing_soak_seconds_moves_the_end_and_rolls_nothing() {
    let mut w = World::soaked_at("v1", 300);
    w.bump_to_soaking("v2");
    let hash = w.status().applied_spec_hash.clone();
    w.now += 100;
    let mut longer = w.resource.spec.clone();
    longer["rolloutStrategy"]["soakSeconds"] = json!(900);
    w.set_spec(longer);
    let events = w.reconcile();
    assert!(events.is_empty(), "{events:?}");
    assert!(w.writes.is_empty(), "{:?}", w.writes);
    assert_eq!(w.status().applied_spec_hash, hash);
    assert_eq!(w.decide().requeue_after, Some(Duration::from_secs(800)));
    w.now += 800;
    assert_eq!(reasons(&w.reconcile()), [reason::SOAKED]);
}

#[test]
fn without_a_soak_soaked_turns_true_with_ready() {
    let w = World::ready_at("v1");
    let (status, why) = w.condition(SOAKED);
    assert_eq!((status.as_str(), why.as_str()), ("True", "Soaked"));
    assert_eq!(
        w.status().last_successful_spec.as_ref().unwrap().version,
        "v1"
    );
}

#[test]
fn a_model_ready_before_soaks_were_judged_counts_as_soaked_once() {
    let mut w = World::ready_at("v1");
    // As an operator before soaks left it.
    w.resource.status.soak = None;
    w.resource.status.conditions.retain(|c| c.type_ != SOAKED);
    w.now += 60;
    let events = w.reconcile();
    assert!(events.is_empty());
    assert_eq!(w.condition(SOAKED).0, "True");
    let again = w.decide();
    assert_eq!(again.status, *w.status(), "recorded once");
}

#[test]
fn a_new_version_in_git_is_not_soaked_even_before_its_rollout_starts() {
    let mut w = World::soaked_at("v1", 60);
    // The target is missing: nothing rolls, yet Soaked may not stay True
    // for a spec that asks for another version.
    w.deployment = None;
    w.set_version("v2");
    w.reconcile();
    assert_eq!(w.condition(SOAKED), ("False".into(), "NotServedYet".into()));
}

#[test]
fn git_put_back_on_a_version_that_soaked_is_soaked_again_without_a_new_soak() {
    let mut w = World::soaked_at("v1", 60);
    w.bump_to_soaking("v2");
    w.now += 60;
    w.reconcile();
    assert_eq!(
        w.condition(SOAKED).0,
        "True",
        "{:?}",
        conditions::get(&w.status().conditions, SOAKED)
    );
    // A version that never warms rolls back to v2 ...
    w.fail_rollout("v3");
    w.pods_ready();
    w.now += 10;
    w.reconcile();
    assert_eq!(w.condition(SOAKED), ("False".into(), "RolledBack".into()));
    // ... and Git is put back on v2: soaked as it was, nothing rolls.
    w.set_version("v2");
    w.now += 10;
    let events = w.reconcile();
    assert!(w.writes.is_empty(), "{:?}", w.writes);
    assert!(
        !reasons(&events).contains(&reason::ROLLOUT_STARTED),
        "{events:?}"
    );
    assert_eq!(w.condition(SOAKED), ("True".into(), "Soaked".into()));
    let again = w.decide();
    assert_eq!(
        again.status,
        *w.status(),
        "the message is the same at every pass"
    );
}
