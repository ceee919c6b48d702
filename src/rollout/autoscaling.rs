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

/// The autoscaler for `asked` (the valid spec's `autoscaling`), scaling
/// the Deployment `target`, given every autoscaler in the namespace.
pub fn decide(
    resource: &ResourceId,
    target: &str,
    asked: Option<&Autoscaling>,
    observed: &[&HorizontalPodAutoscaler],
) -> Outcome {
    let name = autoscaler::autoscaler_name(resource);
    let ours = observed
        .iter()
        .copied()
        .find(|h| autoscaler::is_owned(h, resource));
    let Some(asked) = asked else {
        return Outcome {
            writes: ours
                .map(|h| Write::DeleteAutoscaler {
                    name: name.clone(),
                    uid: h.metadata.uid.clone(),
                })
                .into_iter()
                .collect(),
            status: None,
            condition: None,
        };
    };
    let conflict = |message: String| Outcome {
        writes: Vec::new(),
        status: None,
        condition: Some((false, reason::AUTOSCALER_CONFLICT, message)),
    };
    if ours.is_none()
        && observed
            .iter()
            .any(|h| h.metadata.name.as_deref() == Some(name.as_str()))
    {
        return conflict(format!(
            "a HorizontalPodAutoscaler named {name} exists and is not this resource's \
             (no openmed.ai/model-resource: {}); the operator writes none over it: delete it \
             to let spec.autoscaling scale Deployment {target}, or remove spec.autoscaling",
            resource.key()
        ));
    }
    let rivals: Vec<&str> = observed
        .iter()
        .filter(|h| !autoscaler::is_owned(h, resource) && scales(h, target))
        .filter_map(|h| h.metadata.name.as_deref())
        .collect();
    if !rivals.is_empty() {
        return conflict(format!(
            "HorizontalPodAutoscaler {} already scales Deployment {target}; two autoscalers of \
             one Deployment fight and the controller then scales it on neither, so the operator \
             writes none: delete it to let spec.autoscaling scale the Deployment, or remove \
             spec.autoscaling",
            rivals.join(", ")
        ));
    }
    let planned = autoscaler::autoscaler(resource, target, asked);
    let mut writes = Vec::new();
    if ours.is_none_or(|h| autoscaler::drift(h, &planned)) {
        writes.push(Write::ApplyAutoscaler(Box::new(planned)));
    }
    let Some(ours) = ours else {
        return Outcome {
            writes,
            status: Some(AutoscalingStatus {
                name: name.clone(),
                current_replicas: None,
                desired_replicas: None,
                last_scale_time: None,
                not_scaling: None,
            }),
            condition: Some((
                false,
                reason::AUTOSCALER_PENDING,
                format!("HorizontalPodAutoscaler {name} is written and has not reported yet"),
            )),
        };
    };
    let status = ours.status.as_ref();
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
        name: name.clone(),
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
    Outcome {
        writes,
        status: Some(reported),
        condition: Some(condition),
    }
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
    fn asked_for_and_missing_the_autoscaler_is_written_and_pending() {
        let asked = Autoscaling::default();
        let out = decide(&resource(), "openmed", Some(&asked), &[]);
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
        let out = decide(&resource(), "openmed", Some(&asked), &[&hpa]);
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
        let out = decide(&resource(), "openmed", Some(&asked), &[&edited]);
        assert!(
            matches!(&out.writes[..], [Write::ApplyAutoscaler(h)] if h.spec.as_ref().unwrap().max_replicas == 10)
        );

        let raised = Autoscaling {
            max_replicas: 20,
            ..asked.clone()
        };
        let hpa = reporting(ours(&asked), 2, 2);
        let out = decide(&resource(), "openmed", Some(&raised), &[&hpa]);
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
        let out = decide(&resource(), "openmed", Some(&asked), &[&hpa]);
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
        let out = decide(&resource(), "openmed", Some(&asked), &[&theirs]);
        assert!(out.writes.is_empty());
        let (ok, why, message) = out.condition.unwrap();
        assert!(!ok);
        assert_eq!(why, reason::AUTOSCALER_CONFLICT);
        assert!(
            message.contains("openmed-hpa already scales Deployment openmed"),
            "{message}"
        );

        let same_name = stranger("deid", "elsewhere");
        let out = decide(&resource(), "openmed", Some(&asked), &[&same_name]);
        assert!(out.writes.is_empty());
        assert_eq!(out.condition.unwrap().1, reason::AUTOSCALER_CONFLICT);

        // One of another Deployment is no business of this resource.
        let unrelated = stranger("other", "elsewhere");
        let out = decide(&resource(), "openmed", Some(&asked), &[&unrelated]);
        assert!(matches!(&out.writes[..], [Write::ApplyAutoscaler(_)]));
    }

    #[test]
    fn removing_autoscaling_deletes_only_the_operators_own_autoscaler() {
        let hpa = reporting(ours(&Autoscaling::default()), 4, 4);
        let out = decide(&resource(), "openmed", None, &[&hpa]);
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
        let out = decide(&resource(), "openmed", None, &[&theirs]);
        assert!(out.writes.is_empty(), "somebody else's autoscaler stays");
    }
}
