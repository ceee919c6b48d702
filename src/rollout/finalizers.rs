//! Which finalizers the operator puts on a resource and takes off it, and
//! so which deletions are its to carry out.
//!
//! A resource the operator has not yet seen may already be deleted: one
//! deleted after the earlier (Kopf) operator stopped and before openmed-op
//! first reconciled it carries only that operator's finalizer. Nothing
//! else will ever remove it, so such a deletion is the operator's like one
//! under its own finalizer: the target is released the same way, then both
//! finalizers go.

use crate::api::names::{EARLIER_OPERATOR_FINALIZER, FINALIZER};

/// The finalizers the operator removes once a deletion's release is done:
/// its own, and the earlier operator's, which stood for the same release.
const RELEASED_ON_DELETION: [&str; 2] = [FINALIZER, EARLIER_OPERATOR_FINALIZER];

/// What one reconcile does with a resource, as its deletion and its
/// finalizers stand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    /// Put the operator's finalizer on first, so the target is never
    /// claimed by a resource that could vanish without releasing it.
    AddFinalizer,
    /// Decide and carry out the spec.
    Reconcile,
    /// Being deleted under a finalizer the operator removes: release the
    /// target, then remove those finalizers ([`kept_after_release`]).
    Release,
    /// Being deleted, and no finalizer on it is the operator's to remove:
    /// another controller's business, or already done.
    Leave,
}

/// What to do with a resource that is being `deleting` and carries
/// `finalizers`.
pub fn lifecycle(deleting: bool, finalizers: &[String]) -> Lifecycle {
    let has = |name: &str| finalizers.iter().any(|f| f == name);
    match (deleting, has(FINALIZER)) {
        (false, false) => Lifecycle::AddFinalizer,
        (false, true) => Lifecycle::Reconcile,
        (true, _) if RELEASED_ON_DELETION.iter().any(|f| has(f)) => Lifecycle::Release,
        (true, _) => Lifecycle::Leave,
    }
}

/// The finalizers left on a resource once its release is done, in their
/// order: every one but those the operator removes.
pub fn kept_after_release(finalizers: &[String]) -> Vec<String> {
    finalizers
        .iter()
        .filter(|f| !RELEASED_ON_DELETION.contains(&f.as_str()))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn a_live_resource_gets_the_operators_finalizer_before_anything_else() {
        assert_eq!(lifecycle(false, &[]), Lifecycle::AddFinalizer);
        // The earlier operator's finalizer is not the operator's own: the
        // resource still needs the one that makes the release its duty.
        assert_eq!(
            lifecycle(false, &list(&[EARLIER_OPERATOR_FINALIZER])),
            Lifecycle::AddFinalizer
        );
        assert_eq!(
            lifecycle(false, &list(&[EARLIER_OPERATOR_FINALIZER, FINALIZER])),
            Lifecycle::Reconcile
        );
    }

    #[test]
    fn a_deletion_under_only_the_earlier_operators_finalizer_is_released_and_both_go() {
        // Deleted between stopping the earlier operator and openmed-op's
        // first look at it: nothing else would ever remove that finalizer.
        let earlier_only = list(&["example.com/keep", EARLIER_OPERATOR_FINALIZER]);
        assert_eq!(lifecycle(true, &earlier_only), Lifecycle::Release);
        assert_eq!(
            kept_after_release(&earlier_only),
            list(&["example.com/keep"])
        );

        let both = list(&[EARLIER_OPERATOR_FINALIZER, FINALIZER]);
        assert_eq!(lifecycle(true, &both), Lifecycle::Release);
        assert_eq!(kept_after_release(&both), Vec::<String>::new());
        assert_eq!(lifecycle(true, &list(&[FINALIZER])), Lifecycle::Release);
    }

    #[test]
    fn a_deletion_under_other_finalizers_only_is_left_to_their_controllers() {
        assert_eq!(lifecycle(true, &[]), Lifecycle::Leave);
        assert_eq!(
            lifecycle(true, &list(&["example.com/keep"])),
            Lifecycle::Leave
        );
    }
}
