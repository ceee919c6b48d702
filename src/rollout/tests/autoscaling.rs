//! `spec.autoscaling`: the operator's own autoscaler, and rollouts,
//! rollbacks and removals that never take the count the autoscaler set.

use super::*;
use crate::rollout::autoscaling::{AUTOSCALED, reason as why};

fn autoscaled_spec(version: &str) -> Value {
    let mut spec = spec(version);
    spec["autoscaling"] = json!({"minReplicas": 2, "maxReplicas": 6});
    spec
}

impl World {
    /// The autoscaler's count: it scaled the target to `replicas` and
    /// reports so.
    fn autoscaler_scales_to(&mut self, replicas: i32) {
        self.dep()["spec"]["replicas"] = json!(replicas);
        let hpa = self
            .autoscalers
            .iter_mut()
            .find(|h| h.metadata.name.as_deref() == Some("svc"))
            .expect("the operator's autoscaler");
        hpa.status = Some(serde_json::from_value(json!({
            "currentReplicas": replicas, "desiredReplicas": replicas,
            "conditions": [{"type": "ScalingActive", "status": "True", "reason": "ValidMetricFound"}],
        })).unwrap());
    }

    fn replicas_written(&self) -> Vec<Value> {
        self.writes
            .iter()
            .filter_map(|w| match w {
                Write::ApplyDeployment { body, .. } => body["spec"].get("replicas").cloned(),
                Write::HandOverReplicas { replicas, .. } => Some(json!(*replicas)),
                _ => None,
            })
            .collect()
    }
}

#[test]
fn an_autoscaled_model_gets_one_autoscaler_of_its_own_and_its_apply_sends_no_replicas() {
    let mut w = World::new(autoscaled_spec("v1"));
    w.reconcile();
    let hpa = w
        .autoscalers
        .iter()
        .find(|h| h.metadata.name.as_deref() == Some("svc"));
    let spec = hpa
        .expect("the autoscaler is written")
        .spec
        .clone()
        .unwrap();
    assert_eq!((spec.min_replicas, spec.max_replicas), (Some(2), 6));
    assert_eq!(spec.scale_target_ref.name, "svc");
    for w in &w.writes {
        if let Write::ApplyDeployment { body, .. } = w {
            assert!(body["spec"].get("replicas").is_none(), "{body}");
        }
    }
    assert_eq!(
        w.condition(AUTOSCALED),
        ("False".into(), why::AUTOSCALER_PENDING.into())
    );
    w.autoscaler_scales_to(4);
    w.pods_ready();
    w.now += 10;
    w.reconcile();
    assert_eq!(
        w.condition(AUTOSCALED),
        ("True".into(), why::AUTOSCALER_ACTIVE.into())
    );
    let status = w.status().autoscaling.clone().unwrap();
    assert_eq!(
        (status.current_replicas, status.desired_replicas),
        (Some(4), Some(4))
    );
    let ready = conditions::get(&w.status().conditions, READY).unwrap();
    assert!(
        ready.message.contains("HorizontalPodAutoscaler"),
        "{}",
        ready.message
    );
}

#[test]
fn a_bump_a_rollback_and_a_manual_rollback_keep_the_count_the_autoscaler_set() {
    let mut w = World::new(autoscaled_spec("v1"));
    w.reconcile();
    w.autoscaler_scales_to(2);
    w.pods_ready();
    w.now += 10;
    w.reconcile();
    assert_eq!(w.status().phase, Some(Phase::Ready));
    // A scale-up, then a bump: the count stays the autoscaler's.
    w.autoscaler_scales_to(5);
    w.set_version("v2");
    w.now += 10;
    w.reconcile();
    assert_eq!(w.replicas_written(), Vec::<Value>::new());
    assert_eq!(w.dep()["spec"]["replicas"], 5);
    w.controller_rolls();
    w.pods_ready();
    w.now += 10;
    w.reconcile();
    assert_eq!(w.status().phase, Some(Phase::Ready));
    // A version that fails rolls back; neither writes the count.
    w.fail_rollout("v3");
    assert_eq!(w.status().phase, Some(Phase::RolledBack));
    assert_eq!(w.replicas_written(), Vec::<Value>::new());
    assert_eq!(w.dep()["spec"]["replicas"], 5);
    // A manual rollback to v1 neither.
    w.set_version("v2");
    w.now += 10;
    w.reconcile();
    w.annotate_rollback(Some("v1"));
    w.now += 10;
    w.reconcile();
    assert_eq!(w.status().rollback_request.as_deref(), Some("manual:v1"));
    assert_eq!(w.replicas_written(), Vec::<Value>::new());
    assert_eq!(w.dep()["spec"]["replicas"], 5);
}

#[test]
fn editing_autoscaling_rewrites_the_autoscaler_and_starts_no_rollout() {
    let mut w = World::new(autoscaled_spec("v1"));
    w.reconcile();
    w.pods_ready();
    w.now += 10;
    w.reconcile();
    let hash = w.status().applied_spec_hash.clone();
    w.resource.spec["autoscaling"]["maxReplicas"] = json!(9);
    w.resource.generation += 1;
    w.now += 10;
    let events = w.reconcile();
    assert!(reasons(&events).is_empty(), "{events:?}");
    assert!(
        matches!(&w.writes[..], [Write::ApplyAutoscaler(h)] if h.spec.as_ref().unwrap().max_replicas == 9)
    );
    assert_eq!(w.status().applied_spec_hash, hash);
    assert_eq!(w.status().phase, Some(Phase::Ready));
}

#[test]
fn removing_autoscaling_deletes_the_autoscaler_and_keeps_the_count_until_replicas_says_otherwise() {
    let mut spec = autoscaled_spec("v1");
    spec.as_object_mut().unwrap().remove("replicas");
    let mut w = World::new(spec);
    w.reconcile();
    w.autoscaler_scales_to(5);
    w.pods_ready();
    w.now += 10;
    w.reconcile();
    w.resource
        .spec
        .as_object_mut()
        .unwrap()
        .remove("autoscaling");
    w.resource.generation += 1;
    w.now += 10;
    w.reconcile();
    assert!(
        w.writes
            .iter()
            .any(|x| matches!(x, Write::DeleteAutoscaler { name, .. } if name == "svc"))
    );
    assert!(w.autoscalers.is_empty());
    assert!(conditions::get(&w.status().conditions, AUTOSCALED).is_none());
    assert_eq!(w.status().autoscaling, None);
    // No spec.replicas: the count stays where the autoscaler left it.
    assert_eq!(w.replicas_written(), Vec::<Value>::new());
    assert_eq!(w.dep()["spec"]["replicas"], 5);
    w.now += 10;
    w.reconcile();
    assert_eq!(w.dep()["spec"]["replicas"], 5);
    // spec.replicas set afterwards is applied.
    w.resource.spec["replicas"] = json!(3);
    w.resource.generation += 1;
    w.now += 10;
    w.reconcile();
    assert_eq!(w.dep()["spec"]["replicas"], 3);
}

#[test]
fn another_autoscaler_of_the_target_is_left_alone_and_said() {
    let mut w = World::new(autoscaled_spec("v1"));
    w.another_autoscaler();
    let events = w.reconcile();
    assert!(
        reasons(&events).contains(&why::AUTOSCALER_CONFLICT),
        "{events:?}"
    );
    assert_eq!(w.autoscalers.len(), 1, "no autoscaler of its own");
    assert_eq!(
        w.condition(AUTOSCALED),
        ("False".into(), why::AUTOSCALER_CONFLICT.into())
    );
    assert_eq!(w.replicas_written(), Vec::<Value>::new());
    // The conflict is said once, not on every pass.
    w.now += 10;
    assert!(!reasons(&w.reconcile()).contains(&why::AUTOSCALER_CONFLICT));
}

impl World {
    /// KEDA's autoscaler for a ScaledObject of the resource's name scales
    /// the target (KEDA's name and owner reference).
    fn kedas_autoscaler(&mut self) {
        let mut kedas = crate::plan::autoscaler::autoscaler(
            &self.resource.id(),
            &target_name(&self.resource),
            &crate::api::Autoscaling::default(),
        );
        kedas.metadata.name = Some(crate::plan::autoscaler::keda_autoscaler_name(
            &self.resource.id(),
        ));
        kedas.metadata.annotations = None;
        kedas.metadata.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "keda.sh/v1alpha1".into(),
                kind: "ScaledObject".into(),
                name: self.resource.name.clone(),
                uid: "so-1".into(),
                controller: Some(true),
                ..Default::default()
            },
        ]);
        self.autoscalers.push(kedas);
    }
}

#[test]
fn without_keda_kedas_autoscaler_of_the_target_is_a_conflict_not_a_wait() {
    // Without --keda no ScaledObject is read, so nothing says KEDA's
    // autoscaler is the model's: it is another autoscaler of the target.
    let mut w = World::new(autoscaled_spec("v1"));
    assert!(!w.settings.keda);
    w.kedas_autoscaler();
    let events = w.reconcile();
    assert!(
        reasons(&events).contains(&why::AUTOSCALER_CONFLICT),
        "{events:?}"
    );
    assert_eq!(
        w.condition(AUTOSCALED),
        ("False".into(), why::AUTOSCALER_CONFLICT.into())
    );
    assert_eq!(w.autoscalers.len(), 1, "no autoscaler of its own");
    let message = &conditions::get(&w.status().conditions, AUTOSCALED)
        .unwrap()
        .message;
    assert!(message.contains("keda-hpa-svc"), "{message}");

    // Asking for KEDA there says the operator does not watch it.
    let mut w = World::new(autoscaled_spec("v1"));
    w.resource.spec["autoscaling"]["keda"] =
        json!({"prometheusAddress": "http://prometheus.monitoring:9090"});
    w.kedas_autoscaler();
    w.reconcile();
    assert_eq!(
        w.condition(AUTOSCALED),
        ("False".into(), why::KEDA_NOT_WATCHED.into())
    );
    assert_eq!(w.autoscalers.len(), 1, "nothing written");
}
