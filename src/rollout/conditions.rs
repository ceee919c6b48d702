//! Status conditions with metav1.Condition semantics.
//!
//! `lastTransitionTime` changes only when a condition's status changes, and
//! every condition carries the generation it was computed for, so a status
//! rewritten with the same meaning is byte-identical and no watch is
//! triggered by the operator's own no-op passes.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Condition types, in the order they are kept in status.
pub const READY: &str = "Ready";
/// A rollout or rollback is under way (or was just judged).
pub const PROGRESSING: &str = "Progressing";
/// The resource does not serve what its spec asks, or serves it poorly.
pub const DEGRADED: &str = "Degraded";
/// A rollback is in effect: Unknown while it runs, True once it succeeded.
pub const ROLLED_BACK: &str = "RolledBack";
/// kstatus: the operator is still working towards the spec.
pub const RECONCILING: &str = "Reconciling";
/// kstatus: the operator cannot make progress without a change.
pub const STALLED: &str = "Stalled";
/// The version `spec.version` asks for is Ready and has been judged for
/// `rolloutStrategy.soakSeconds` since: what a fleet's next wave waits for.
pub const SOAKED: &str = "Soaked";

const ORDER: [&str; 7] = [
    READY,
    PROGRESSING,
    DEGRADED,
    ROLLED_BACK,
    RECONCILING,
    STALLED,
    SOAKED,
];

/// Tri-state condition status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// `True`
    True,
    /// `False`
    False,
    /// `Unknown`
    Unknown,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        }
    }
}

impl From<bool> for Status {
    fn from(b: bool) -> Self {
        if b { Status::True } else { Status::False }
    }
}

/// Sets a condition, keeping `lastTransitionTime` unless the status changes.
pub fn set(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: impl Into<Status>,
    reason: &str,
    message: impl Into<String>,
    generation: i64,
    now: &Time,
) {
    let status = status.into().as_str();
    let message = message.into();
    if let Some(existing) = conditions.iter_mut().find(|c| c.type_ == type_) {
        if existing.status != status {
            existing.last_transition_time = now.clone();
        }
        existing.status = status.to_owned();
        existing.reason = reason.to_owned();
        existing.message = message;
        existing.observed_generation = Some(generation);
    } else {
        conditions.push(Condition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            reason: reason.to_owned(),
            message,
            observed_generation: Some(generation),
            last_transition_time: now.clone(),
        });
    }
    conditions.sort_by_key(|c| {
        ORDER
            .iter()
            .position(|t| *t == c.type_)
            .unwrap_or(ORDER.len())
    });
}

/// Keeps `lastTransitionTime` of every condition whose status is the one
/// it had in `before`: a decision may set a condition on one path and
/// again on the next (a rollback's conditions, then its failure's), and
/// only a change from the status it started with is a transition. Else a
/// decision taken a second later stamps a new time, writes a status, and
/// wakes itself again.
pub fn keep_transitions(conditions: &mut [Condition], before: &[Condition]) {
    for c in conditions {
        if let Some(old) = get(before, &c.type_)
            && old.status == c.status
        {
            c.last_transition_time = old.last_transition_time.clone();
        }
    }
}

/// The condition of that type, if present.
pub fn get<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// True when the condition is present with status `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    get(conditions, type_).is_some_and(|c| c.status == "True")
}

/// Keeps a standing error report (`Reconciling`, `RetryingAfterError`) in a
/// status written while the reconcile still has writes to make: only a
/// reconcile that gets to the end clears it. Clearing it on the way would
/// change the status, whose watch event starts the next reconcile at once,
/// which fails and reports again: a loop around the backoff.
pub fn keep_error_report(
    status: &mut crate::api::OpenMedModelStatus,
    stored: &crate::api::OpenMedModelStatus,
) {
    let Some(report) = stored.conditions.iter().find(|c| {
        c.type_ == RECONCILING && c.reason == crate::rollout::reason::RETRYING_AFTER_ERROR
    }) else {
        return;
    };
    status.conditions.retain(|c| c.type_ != RECONCILING);
    status.conditions.push(report.clone());
    // Keep the condition order the core uses, so the comparison with the
    // stored status sees no change.
    let order = |t: &str| stored.conditions.iter().position(|c| c.type_ == t);
    status
        .conditions
        .sort_by_key(|c| order(&c.type_).unwrap_or(usize::MAX));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_report_stays_until_a_reconcile_gets_to_the_end() {
        let t = Time(k8s_openapi::jiff::Timestamp::from_second(0).unwrap());
        let mut stored = crate::api::OpenMedModelStatus::default();
        set(
            &mut stored.conditions,
            READY,
            true,
            "RolloutSucceeded",
            "ok",
            1,
            &t,
        );
        set(
            &mut stored.conditions,
            RECONCILING,
            true,
            crate::rollout::reason::RETRYING_AFTER_ERROR,
            "failed",
            1,
            &t,
        );
        // The core's decision drops the report and says what it thinks.
        let mut decided = stored.clone();
        decided.conditions.retain(|c| c.type_ != RECONCILING);
        set(
            &mut decided.conditions,
            RECONCILING,
            false,
            "RolloutComplete",
            "ok",
            1,
            &t,
        );
        let mut written = decided.clone();
        keep_error_report(&mut written, &stored);
        assert_eq!(written, stored, "no status change while writes remain");
        let mut clean = crate::api::OpenMedModelStatus::default();
        keep_error_report(&mut clean, &crate::api::OpenMedModelStatus::default());
        assert_eq!(clean, crate::api::OpenMedModelStatus::default());
    }

    fn at(second: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(second).unwrap())
    }

    #[test]
    fn transition_time_changes_only_with_status() {
        let mut c = Vec::new();
        set(&mut c, READY, false, "RollingOut", "a", 1, &at(10));
        set(&mut c, READY, false, "Other", "b", 2, &at(20));
        assert_eq!(c[0].last_transition_time, at(10));
        assert_eq!(
            (c[0].reason.as_str(), c[0].observed_generation),
            ("Other", Some(2))
        );
        set(&mut c, READY, true, "Done", "c", 2, &at(30));
        assert_eq!(c[0].last_transition_time, at(30));
    }

    #[test]
    fn conditions_keep_a_stable_order() {
        let mut c = Vec::new();
        set(&mut c, STALLED, false, "r", "", 1, &at(1));
        set(&mut c, READY, false, "r", "", 1, &at(1));
        set(&mut c, PROGRESSING, Status::Unknown, "r", "", 1, &at(1));
        let types: Vec<&str> = c.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, [READY, PROGRESSING, STALLED]);
    }
}
