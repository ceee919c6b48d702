//! `spec.autoscaling`: the operator's own HorizontalPodAutoscaler, kept as
//! the spec asks, reported in the status and the `Autoscaled` condition.
//!
//! The autoscaler owns the target's count. The operator never writes
//! `spec.replicas` while the spec asks for one ([`crate::plan::TargetOptions`]),
//! so a rollout or a rollback never undoes a scale-up: the Deployment
//! controller surges above whatever count the autoscaler set. Removing
//! `spec.autoscaling` deletes the autoscaler; the Deployment keeps the
//! count it had, and `spec.replicas`, if set, is applied from the next
//! pass on.
//!
//! Two autoscalers of one Deployment fight (the controller then scales
//! neither), so the operator writes none while another one scales the
//! target, and never writes over an autoscaler of its name that is not
//! its own.

use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use serde_json::Value;

use super::decision::Write;
use crate::api::{Autoscaling, AutoscalingStatus};
use crate::plan::{ResourceId, autoscaler};

/// The condition on the operator's autoscaler, present while the spec
/// asks for one.
pub const AUTOSCALED: &str = "Autoscaled";

/// Reasons of [`AUTOSCALED`].
pub mod reason {
    /// The autoscaler scales the target on its metrics.
    pub const AUTOSCALER_ACTIVE: &str = "AutoscalerActive";
    /// The autoscaler is written, and has not reported yet.
    pub const AUTOSCALER_PENDING: &str = "AutoscalerPending";
    /// The autoscaler cannot read its metrics (its `ScalingActive` is
    /// False): it keeps the count within its bounds and changes it no
    /// further.
    pub const AUTOSCALER_NOT_SCALING: &str = "AutoscalerNotScaling";
    /// Another autoscaler scales the target, or holds the name.
    pub const AUTOSCALER_CONFLICT: &str = "AutoscalerConflict";
    /// `spec.autoscaling.keda`, and the operator does not watch
    /// ScaledObjects (`--keda`).
    pub const KEDA_NOT_WATCHED: &str = "KedaNotWatched";
}

/// What to do about the autoscaler on this pass.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The writes: an apply of the planned autoscaler, or a deletion of
    /// the operator's own one, or none.
    pub writes: Vec<Write>,
    /// `status.autoscaling`.
    pub status: Option<AutoscalingStatus>,
    /// The [`AUTOSCALED`] condition: `(true/false, reason, message)`;
    /// `None` removes it.
    pub condition: Option<(bool, &'static str, String)>,
}

/// What the shell observed of autoscaling in the resource's namespace.
#[derive(Debug, Clone, Copy, Default)]
pub struct Seen<'a> {
    /// The HorizontalPodAutoscalers that scale the target or carry the
    /// resource's name (or KEDA's name for its ScaledObject's).
    pub autoscalers: &'a [&'a HorizontalPodAutoscaler],
    /// The ScaledObject of the resource's name, as JSON, when the operator
    /// watches ScaledObjects (`--keda`) and it exists.
    pub scaled_object: Option<&'a Value>,
    /// The operator watches ScaledObjects (`--keda`).
    pub keda: bool,
}

/// The autoscaler for `asked` (the valid spec's `autoscaling`), scaling
/// the Deployment `target`.
pub fn decide(
    resource: &ResourceId,
    target: &str,
    asked: Option<&Autoscaling>,
    seen: Seen,
) -> Outcome {
    let ours = seen
        .autoscalers
        .iter()
        .copied()
        .find(|h| autoscaler::is_owned(h, resource));
    let our_scaled_object = seen
        .scaled_object
        .filter(|o| autoscaler::is_owned_scaled_object(o, resource));
    let kedas = seen
        .autoscalers
        .iter()
        .copied()
        .find(|h| autoscaler::is_kedas_for(h, resource));
    let delete_hpa = |h: &HorizontalPodAutoscaler| Write::DeleteAutoscaler {
        name: autoscaler::autoscaler_name(resource),
        uid: h.metadata.uid.clone(),
    };
    let delete_scaled_object = |o: &Value| Write::DeleteScaledObject {
        name: autoscaler::autoscaler_name(resource),
        uid: o
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .map(str::to_owned),
    };
    let Some(asked) = asked else {
        return Outcome {
            writes: ours
                .map(delete_hpa)
                .into_iter()
                .chain(our_scaled_object.map(delete_scaled_object))
                .collect(),
            status: None,
            condition: None,
        };
    };
    let conflict = |why: &'static str, message: String| Outcome {
        writes: Vec::new(),
        status: None,
        condition: Some((false, why, message)),
    };
    if let Some(message) = taken(
        resource,
        target,
        asked,
        &seen,
        ours,
        our_scaled_object,
        kedas,
    ) {
        return conflict(reason::AUTOSCALER_CONFLICT, message);
    }
    let mut writes = Vec::new();
    let (name, reporting) = match &asked.keda {
        None => {
            let name = autoscaler::autoscaler_name(resource);
            writes.extend(our_scaled_object.map(delete_scaled_object));
            if let Some(h) = kedas.filter(|_| kedas_ours(asked, &seen, our_scaled_object)) {
                // Moving off KEDA: its autoscaler goes with the
                // ScaledObject; a second one meanwhile would fight it.
                let kedas_name = h.metadata.name.clone().unwrap_or_default();
                return Outcome {
                    writes,
                    status: None,
                    condition: Some((
                        false,
                        reason::AUTOSCALER_PENDING,
                        format!("waiting for KEDA to remove {kedas_name} before {name} is written"),
                    )),
                };
            }
            let planned = autoscaler::autoscaler(resource, target, asked);
            if ours.is_none_or(|h| autoscaler::drift(h, &planned)) {
                writes.push(Write::ApplyAutoscaler(Box::new(planned)));
            }
            (name, ours)
        }
        Some(keda) => {
            if !seen.keda {
                return conflict(
                    reason::KEDA_NOT_WATCHED,
                    "spec.autoscaling.keda asks for a KEDA ScaledObject, and this operator runs \
                     without --keda: it neither reads nor writes ScaledObjects; start it with \
                     --keda (Helm: keda.enabled=true), or remove spec.autoscaling.keda"
                        .to_owned(),
                );
            }
            let name = autoscaler::keda_autoscaler_name(resource);
            if let Some(h) = ours {
                // Moving to KEDA: the operator's own autoscaler goes first,
                // or KEDA's would fight it.
                return Outcome {
                    writes: vec![delete_hpa(h)],
                    status: None,
                    condition: Some((
                        false,
                        reason::AUTOSCALER_PENDING,
                        format!(
                            "removing HorizontalPodAutoscaler {} before the ScaledObject is written",
                            autoscaler::autoscaler_name(resource)
                        ),
                    )),
                };
            }
            let planned = autoscaler::scaled_object(resource, target, asked, keda);
            if our_scaled_object.is_none_or(|o| autoscaler::scaled_object_drift(o, &planned)) {
                writes.push(Write::ApplyScaledObject(Box::new(planned)));
            }
            (name, kedas)
        }
    };
    let (status, condition) = report(&name, target, asked, reporting);
    Outcome {
        writes,
        status: Some(status),
        condition: Some(condition),
    }
}

/// Why the target's autoscaler is not the resource's to write: another
/// autoscaler scales the target, or one that is not the resource's holds
/// the name the resource's would have.
fn taken(
    resource: &ResourceId,
    target: &str,
    asked: &Autoscaling,
    seen: &Seen,
    ours: Option<&HorizontalPodAutoscaler>,
    our_scaled_object: Option<&Value>,
    kedas: Option<&HorizontalPodAutoscaler>,
) -> Option<String> {
    let name = autoscaler::autoscaler_name(resource);
    let writes = match asked.keda {
        None => "HorizontalPodAutoscaler",
        Some(_) => "ScaledObject",
    };
    let name_taken = match asked.keda {
        None => {
            ours.is_none()
                && seen
                    .autoscalers
                    .iter()
                    .any(|h| h.metadata.name.as_deref() == Some(name.as_str()))
        }
        Some(_) => seen.scaled_object.is_some() && our_scaled_object.is_none(),
    };
    if name_taken {
        return Some(format!(
            "a {writes} named {name} exists and is not this resource's (no openmed.ai/model-resource: {}); \
             the operator writes none over it: delete it to let spec.autoscaling scale Deployment {target}, \
             or remove spec.autoscaling",
            resource.key()
        ));
    }
    let kedas_is_ours = kedas_ours(asked, seen, our_scaled_object);
    let is_ours = |h: &HorizontalPodAutoscaler| {
        ours.is_some_and(|o| std::ptr::eq(o, h))
            || (kedas_is_ours && kedas.is_some_and(|k| std::ptr::eq(k, h)))
    };
    let rivals: Vec<&str> = seen
        .autoscalers
        .iter()
        .copied()
        .filter(|h| !is_ours(h) && scales(h, target))
        .filter_map(|h| h.metadata.name.as_deref())
        .collect();
    (!rivals.is_empty()).then(|| {
        format!(
            "HorizontalPodAutoscaler {} already scales Deployment {target}; two autoscalers of \
             one Deployment fight and the controller then scales it on neither, so the operator \
             writes none: delete it to let spec.autoscaling scale the Deployment, or remove \
             spec.autoscaling",
            rivals.join(", ")
        )
    })
}

/// Whether KEDA's autoscaler for a ScaledObject of the resource's name is
/// the resource's: while it asks for KEDA, while its own ScaledObject is
/// seen going, and once no ScaledObject of that name is seen (KEDA's
/// autoscaler outlives its ScaledObject until the garbage collector takes
/// it). A ScaledObject of that name that is somebody else's makes it
/// theirs: another autoscaler of the target. Without `--keda` no
/// ScaledObject is read, so an unseen one proves nothing and the
/// autoscaler is another one of the target (asking for KEDA there is
/// `KedaNotWatched`, not a conflict).
fn kedas_ours(asked: &Autoscaling, seen: &Seen, our_scaled_object: Option<&Value>) -> bool {
    asked.keda.is_some()
        || our_scaled_object.is_some()
        || (seen.keda && seen.scaled_object.is_none())
}

/// `status.autoscaling` and the [`AUTOSCALED`] condition from the
/// autoscaler that scales the target for the resource (`name`), as last
/// observed.
fn report(
    name: &str,
    target: &str,
    asked: &Autoscaling,
    hpa: Option<&HorizontalPodAutoscaler>,
) -> (AutoscalingStatus, (bool, &'static str, String)) {
    let Some(hpa) = hpa else {
        return (
            AutoscalingStatus {
                name: name.to_owned(),
                current_replicas: None,
                desired_replicas: None,
                last_scale_time: None,
                not_scaling: None,
            },
            (
                false,
                reason::AUTOSCALER_PENDING,
                format!("HorizontalPodAutoscaler {name} is not there yet"),
            ),
        );
    };
    let status = hpa.status.as_ref();
    let not_scaling = status
        .and_then(|s| s.conditions.as_deref())
        .and_then(|c| c.iter().find(|c| c.type_ == "ScalingActive"))
        .filter(|c| c.status == "False")
        .map(|c| {
            format!(
                "{}: {}",
                c.reason.as_deref().unwrap_or("ScalingInactive"),
                c.message.as_deref().unwrap_or_default()
            )
        });
    let reported = AutoscalingStatus {
        name: name.to_owned(),
        current_replicas: status.and_then(|s| s.current_replicas),
        desired_replicas: status.map(|s| s.desired_replicas),
        last_scale_time: status.and_then(|s| s.last_scale_time.clone()),
        not_scaling: not_scaling.clone(),
    };
    let counts = match (reported.current_replicas, reported.desired_replicas) {
        (Some(current), Some(desired)) => format!("{current} pods, asks for {desired}"),
        _ => "no count reported yet".to_owned(),
    };
    let bounds = format!("{} to {}", asked.min_replicas, asked.max_replicas);
    let condition = match (&not_scaling, status) {
        (Some(why), _) => (
            false,
            reason::AUTOSCALER_NOT_SCALING,
            format!(
                "HorizontalPodAutoscaler {name} keeps Deployment {target} within {bounds} pods \
                 but cannot read its metrics ({why}); {counts}"
            ),
        ),
        (None, None) => (
            false,
            reason::AUTOSCALER_PENDING,
            format!("HorizontalPodAutoscaler {name} has not reported yet"),
        ),
        (None, Some(_)) => (
            true,
            reason::AUTOSCALER_ACTIVE,
            format!(
                "HorizontalPodAutoscaler {name} scales Deployment {target} ({bounds} pods): {counts}"
            ),
        ),
    };
    (reported, condition)
}

/// The canary Deployment's pods for a canary with `weight` percent of the
/// traffic while the stable Deployment has `stable` pods: its share of
/// the stable count, rounded up, and at least one (a warming canary, at 0
/// %, needs a pod to warm).
pub fn canary_replicas(weight: i32, stable: i32) -> i32 {
    let share = (i64::from(weight.clamp(0, 100)) * i64::from(stable.max(0)) + 99) / 100;
    i32::try_from(share).unwrap_or(i32::MAX).max(1)
}

/// `asked` with its minimum raised to `floor` (within its maximum): the
/// stable pods a canary in progress keeps (`status.canary.stableReplicas`).
pub fn with_floor(asked: &Autoscaling, floor: Option<i32>) -> Autoscaling {
    let mut raised = asked.clone();
    if let Some(floor) = floor {
        raised.min_replicas = raised.min_replicas.max(floor).min(raised.max_replicas);
    }
    raised
}

/// The autoscalers a decision about `resource` (whose target is the
/// Deployment `target`) reads: those that scale the target, and those
/// with the names the resource's own would have (its own, or KEDA's for
/// its ScaledObject), whatever they scale.
pub fn concerns(hpa: &HorizontalPodAutoscaler, resource: &ResourceId, target: &str) -> bool {
    let name = hpa.metadata.name.as_deref();
    scales(hpa, target)
        || name == Some(autoscaler::autoscaler_name(resource).as_str())
        || name == Some(autoscaler::keda_autoscaler_name(resource).as_str())
}

/// True when `hpa` scales the Deployment `target`.
pub fn scales(hpa: &HorizontalPodAutoscaler, target: &str) -> bool {
    hpa.spec.as_ref().is_some_and(|s| {
        s.scale_target_ref.kind == "Deployment" && s.scale_target_ref.name == target
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::autoscaling::v2::{
        HorizontalPodAutoscalerCondition, HorizontalPodAutoscalerStatus,
    };

    fn hpas<'a>(autoscalers: &'a [&'a HorizontalPodAutoscaler]) -> Seen<'a> {
        Seen {
            autoscalers,
            ..Seen::default()
        }
    }

    fn resource() -> ResourceId {
        ResourceId {
            namespace: "clinic".into(),
            name: "deid".into(),
            uid: Some("u-1".into()),
        }
    }

    fn ours(asked: &Autoscaling) -> HorizontalPodAutoscaler {
        let mut hpa = autoscaler::autoscaler(&resource(), "openmed", asked);
        hpa.metadata.uid = Some("h-1".into());
        hpa
    }

    fn reporting(
        mut hpa: HorizontalPodAutoscaler,
        current: i32,
        desired: i32,
    ) -> HorizontalPodAutoscaler {
        hpa.status = Some(HorizontalPodAutoscalerStatus {
            current_replicas: Some(current),
            desired_replicas: desired,
            conditions: Some(vec![HorizontalPodAutoscalerCondition {
                type_: "ScalingActive".into(),
                status: "True".into(),
                reason: Some("ValidMetricFound".into()),
                ..HorizontalPodAutoscalerCondition::default()
            }]),
            ..HorizontalPodAutoscalerStatus::default()
        });
        hpa
    }

    fn stranger(name: &str, target: &str) -> HorizontalPodAutoscaler {
        let mut hpa = autoscaler::autoscaler(&resource(), target, &Autoscaling::default());
        hpa.metadata.name = Some(name.into());
        hpa.metadata.annotations = None;
        hpa.metadata.owner_references = None;
        hpa
    }

    #[test]
    fn a_canary_runs_its_share_of_the_stable_pods_and_at_least_one() {
        assert_eq!(canary_replicas(0, 10), 1, "warming");
        assert_eq!(canary_replicas(20, 10), 2);
        assert_eq!(canary_replicas(20, 6), 2, "1.2 rounds up");
        assert_eq!(canary_replicas(10, 3), 1);
        assert_eq!(canary_replicas(50, 9), 5);
        assert_eq!(canary_replicas(99, 1000), 990);
    }

    #[test]
    fn a_floor_raises_the_minimum_within_the_maximum() {
        let asked = Autoscaling {
            min_replicas: 2,
            max_replicas: 8,
            ..Autoscaling::default()
        };
        assert_eq!(with_floor(&asked, None).min_replicas, 2);
        assert_eq!(with_floor(&asked, Some(5)).min_replicas, 5);
        assert_eq!(with_floor(&asked, Some(1)).min_replicas, 2);
        assert_eq!(with_floor(&asked, Some(12)).min_replicas, 8);
    }

    #[test]
    fn asked_for_and_missing_the_autoscaler_is_written_and_pending() {
        let asked = Autoscaling::default();
        let out = decide(&resource(), "openmed", Some(&asked), hpas(&[]));
        assert!(
            matches!(&out.writes[..], [Write::ApplyAutoscaler(h)] if h.metadata.name.as_deref() == Some("deid"))
        );
        let (ok, why, _) = out.condition.unwrap();
        assert!(!ok);
        assert_eq!(why, reason::AUTOSCALER_PENDING);
        assert_eq!(out.status.unwrap().name, "deid");
    }

    #[test]
    fn an_autoscaler_as_asked_is_not_written_again_and_its_counts_are_reported() {
        let asked = Autoscaling::default();
        let hpa = reporting(ours(&asked), 3, 5);
        let out = decide(&resource(), "openmed", Some(&asked), hpas(&[&hpa]));
        assert!(out.writes.is_empty(), "{:?}", out.writes);
        let status = out.status.unwrap();
        assert_eq!(
            (status.current_replicas, status.desired_replicas),
            (Some(3), Some(5))
        );
        let (ok, why, message) = out.condition.unwrap();
        assert!(ok);
        assert_eq!(why, reason::AUTOSCALER_ACTIVE);
        assert!(message.contains("3 pods, asks for 5"), "{message}");
        assert!(message.contains("2 to 10 pods"), "{message}");
    }

    #[test]
    fn a_changed_bound_or_a_hand_edit_is_applied_again() {
        let asked = Autoscaling::default();
        let mut edited = reporting(ours(&asked), 2, 2);
        edited.spec.as_mut().unwrap().max_replicas = 50;
        let out = decide(&resource(), "openmed", Some(&asked), hpas(&[&edited]));
        assert!(
            matches!(&out.writes[..], [Write::ApplyAutoscaler(h)] if h.spec.as_ref().unwrap().max_replicas == 10)
        );

        let raised = Autoscaling {
            max_replicas: 20,
            ..asked.clone()
        };
        let hpa = reporting(ours(&asked), 2, 2);
        let out = decide(&resource(), "openmed", Some(&raised), hpas(&[&hpa]));
        assert!(
            matches!(&out.writes[..], [Write::ApplyAutoscaler(h)] if h.spec.as_ref().unwrap().max_replicas == 20)
        );
    }

    #[test]
    fn metrics_it_cannot_read_are_said_in_its_own_words() {
        let asked = Autoscaling::default();
        let mut hpa = reporting(ours(&asked), 2, 2);
        let conditions = hpa.status.as_mut().unwrap().conditions.as_mut().unwrap();
        conditions[0].status = "False".into();
        conditions[0].reason = Some("FailedGetPodsMetric".into());
        conditions[0].message =
            Some("unable to get metric openmed_service_inflight_requests".into());
        let out = decide(&resource(), "openmed", Some(&asked), hpas(&[&hpa]));
        let (ok, why, message) = out.condition.unwrap();
        assert!(!ok);
        assert_eq!(why, reason::AUTOSCALER_NOT_SCALING);
        assert!(
            message.contains("FailedGetPodsMetric: unable to get metric"),
            "{message}"
        );
        assert!(out.status.unwrap().not_scaling.is_some());
    }

    #[test]
    fn another_autoscaler_of_the_target_or_of_the_name_is_never_written_over() {
        let asked = Autoscaling::default();
        let theirs = stranger("openmed-hpa", "openmed");
        let out = decide(&resource(), "openmed", Some(&asked), hpas(&[&theirs]));
        assert!(out.writes.is_empty());
        let (ok, why, message) = out.condition.unwrap();
        assert!(!ok);
        assert_eq!(why, reason::AUTOSCALER_CONFLICT);
        assert!(
            message.contains("openmed-hpa already scales Deployment openmed"),
            "{message}"
        );

        let same_name = stranger("deid", "elsewhere");
        let out = decide(&resource(), "openmed", Some(&asked), hpas(&[&same_name]));
        assert!(out.writes.is_empty());
        assert_eq!(out.condition.unwrap().1, reason::AUTOSCALER_CONFLICT);

        // One of another Deployment is no business of this resource.
        let unrelated = stranger("other", "elsewhere");
        let out = decide(&resource(), "openmed", Some(&asked), hpas(&[&unrelated]));
        assert!(matches!(&out.writes[..], [Write::ApplyAutoscaler(_)]));
    }

    #[test]
    fn removing_autoscaling_deletes_only_the_operators_own_autoscaler() {
        let hpa = reporting(ours(&Autoscaling::default()), 4, 4);
        let out = decide(&resource(), "openmed", None, hpas(&[&hpa]));
        assert_eq!(
            out.writes,
            vec![Write::DeleteAutoscaler {
                name: "deid".into(),
                uid: Some("h-1".into())
            }]
        );
        assert_eq!(out.condition, None);
        assert_eq!(out.status, None);

        let theirs = stranger("deid", "openmed");
        let out = decide(&resource(), "openmed", None, hpas(&[&theirs]));
        assert!(out.writes.is_empty(), "somebody else's autoscaler stays");
    }

    fn keda_asked() -> Autoscaling {
        Autoscaling {
            keda: Some(crate::api::Keda {
                prometheus_address: "http://prometheus.monitoring:9090".into(),
                series_selector: None,
            }),
            ..Autoscaling::default()
        }
    }

    fn kedas_autoscaler(current: i32, desired: i32) -> HorizontalPodAutoscaler {
        let mut hpa = reporting(ours(&Autoscaling::default()), current, desired);
        hpa.metadata.name = Some("keda-hpa-deid".into());
        hpa.metadata.annotations = None;
        hpa.metadata.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "keda.sh/v1alpha1".into(),
                kind: "ScaledObject".into(),
                name: "deid".into(),
                uid: "so-1".into(),
                controller: Some(true),
                ..Default::default()
            },
        ]);
        hpa
    }

    #[test]
    fn with_keda_the_operator_writes_a_scaled_object_and_reports_kedas_autoscaler() {
        let asked = keda_asked();
        let seen = |autoscalers, scaled_object| Seen {
            autoscalers,
            scaled_object,
            keda: true,
        };
        let out = decide(&resource(), "openmed", Some(&asked), seen(&[], None));
        let [Write::ApplyScaledObject(planned)] = &out.writes[..] else {
            panic!("{:?}", out.writes)
        };
        assert_eq!(planned["kind"], "ScaledObject");
        assert_eq!(planned["spec"]["minReplicaCount"], 2);
        let query = planned["spec"]["triggers"][1]["metadata"]["query"]
            .as_str()
            .unwrap();
        assert_eq!(
            query,
            r#"sum(avg_over_time(openmed_service_inflight_requests{namespace="clinic",pod=~"openmed-[a-z0-9]+-[a-z0-9]+"}[30s]))"#
        );
        assert_eq!(planned["spec"]["triggers"][1]["metadata"]["threshold"], "8");
        assert_eq!(out.condition.unwrap().1, reason::AUTOSCALER_PENDING);

        // Written and reported on: KEDA's autoscaler is no rival, and the
        // status counts come from it.
        let mut stored = (**planned).clone();
        stored["metadata"]["uid"] = "so-1".into();
        let kedas = kedas_autoscaler(3, 4);
        let with_kedas = [&kedas];
        let out = decide(
            &resource(),
            "openmed",
            Some(&asked),
            seen(&with_kedas, Some(&stored)),
        );
        assert!(out.writes.is_empty(), "{:?}", out.writes);
        let status = out.status.unwrap();
        assert_eq!(status.name, "keda-hpa-deid");
        assert_eq!(
            (status.current_replicas, status.desired_replicas),
            (Some(3), Some(4))
        );
        assert_eq!(out.condition.unwrap().1, reason::AUTOSCALER_ACTIVE);

        // Back to a plain autoscaler: the ScaledObject goes, and nothing is
        // written beside KEDA's until it has gone with it.
        let plain = Autoscaling::default();
        let out = decide(
            &resource(),
            "openmed",
            Some(&plain),
            seen(&with_kedas, Some(&stored)),
        );
        assert_eq!(
            out.writes,
            vec![Write::DeleteScaledObject {
                name: "deid".into(),
                uid: Some("so-1".into())
            }]
        );
        let out = decide(&resource(), "openmed", Some(&plain), seen(&[], None));
        assert!(matches!(&out.writes[..], [Write::ApplyAutoscaler(_)]));
    }

    #[test]
    fn moving_to_keda_removes_the_operators_autoscaler_first() {
        let hpa = reporting(ours(&Autoscaling::default()), 2, 2);
        let seen = Seen {
            autoscalers: &[&hpa],
            scaled_object: None,
            keda: true,
        };
        let out = decide(&resource(), "openmed", Some(&keda_asked()), seen);
        assert_eq!(
            out.writes,
            vec![Write::DeleteAutoscaler {
                name: "deid".into(),
                uid: Some("h-1".into())
            }]
        );
    }

    #[test]
    fn keda_without_the_watch_or_over_a_stranger_writes_nothing_and_says_why() {
        let out = decide(&resource(), "openmed", Some(&keda_asked()), Seen::default());
        assert!(out.writes.is_empty());
        let (ok, why, message) = out.condition.unwrap();
        assert!(!ok);
        assert_eq!(why, reason::KEDA_NOT_WATCHED);
        assert!(message.contains("--keda"), "{message}");

        let stranger = serde_json::json!({"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
            "metadata": {"name": "deid", "namespace": "clinic"}, "spec": {}});
        let seen = Seen {
            autoscalers: &[],
            scaled_object: Some(&stranger),
            keda: true,
        };
        let out = decide(&resource(), "openmed", Some(&keda_asked()), seen);
        assert!(out.writes.is_empty());
        assert_eq!(out.condition.unwrap().1, reason::AUTOSCALER_CONFLICT);
        // And removing autoscaling never deletes it.
        let out = decide(&resource(), "openmed", None, seen);
        assert!(out.writes.is_empty());
    }

    #[test]
    fn kedas_autoscaler_of_somebodys_scaled_object_is_a_rival_and_a_leftover_is_waited_for() {
        let kedas = kedas_autoscaler(2, 2);
        let with_kedas = [&kedas];
        let theirs = serde_json::json!({"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
            "metadata": {"name": "deid", "namespace": "clinic"}, "spec": {}});
        let plain = Autoscaling::default();
        let seen = Seen {
            autoscalers: &with_kedas,
            scaled_object: Some(&theirs),
            keda: true,
        };
        let out = decide(&resource(), "openmed", Some(&plain), seen);
        assert!(out.writes.is_empty());
        assert_eq!(out.condition.unwrap().1, reason::AUTOSCALER_CONFLICT);
        // Its ScaledObject gone (ours, deleted a moment ago): KEDA's
        // autoscaler is waited for, not fought and not called a rival.
        let seen = Seen {
            autoscalers: &with_kedas,
            scaled_object: None,
            keda: true,
        };
        let out = decide(&resource(), "openmed", Some(&plain), seen);
        assert!(out.writes.is_empty());
        assert_eq!(out.condition.unwrap().1, reason::AUTOSCALER_PENDING);
    }
}
