//! Resources at rest, and what they were decided on.
//!
//! Every resource is looked at again each resync, from the caches. At rest
//! that decision is the same each time: nothing to write, nothing to say.
//! Making it still costs gathering the namespace (its Deployments,
//! ConfigMaps, ReplicaSets and pods), and at 10,000 models that was most
//! of a core, all of it spent deciding nothing.
//!
//! A decision depends on the resource, on the caches' objects of its
//! namespace, on the operator's recent writes not yet in the caches, on
//! live reads, on measurements and on the clock. A resource is settled
//! when its last decision wrote nothing, said nothing and set no timer,
//! and used neither live reads, nor measurements, nor recent writes: its
//! only inputs were the resource and the caches. While the resource keeps
//! its resourceVersion and no cache changed in its namespace, deciding
//! again would decide the same, so the resync skips it.
//!
//! The clock is an input only through timers: a decision that depends on
//! how long something has taken asks to be looked at again when that
//! changes, and a decision that asked for that is never settled.

use std::collections::HashMap;
use std::sync::Mutex;

use super::by_namespace::Version;

/// What a decision was made on, as far as a resync can tell cheaply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inputs {
    /// The resource's UID and resourceVersion.
    pub resource: (String, String),
    /// Where each cache stood in the resource's namespace, taken before
    /// the decision read them.
    pub caches: [Version; 7],
}

/// How many settled resources may be remembered past those that still
/// exist before the gone ones are dropped (checked every so many
/// settlements, so the cost stays flat per reconcile).
const PRUNE_EVERY: u64 = 1024;

/// Resources whose last decision was settled, by `namespace/name`.
#[derive(Debug, Default)]
pub struct Settled {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    by_key: HashMap<String, Inputs>,
    settled: u64,
}

impl Settled {
    /// Whether the resource `key` was settled on exactly `inputs`.
    pub fn is_settled(&self, key: &str, inputs: &Inputs) -> bool {
        let state = self.state.lock().expect("settled");
        state.by_key.get(key) == Some(inputs)
    }

    /// Records the outcome of a decision on `inputs`: settled or not.
    /// `exists` answers whether a resource still exists, for dropping
    /// the ones that are gone now and then.
    pub fn record(&self, key: &str, inputs: Option<Inputs>, exists: impl Fn(&str) -> bool) {
        let mut state = self.state.lock().expect("settled");
        let Some(inputs) = inputs else {
            state.by_key.remove(key);
            return;
        };
        state.by_key.insert(key.to_owned(), inputs);
        state.settled += 1;
        if state.settled.is_multiple_of(PRUNE_EVERY) {
            state.by_key.retain(|k, _| exists(k));
        }
    }

    /// Forgets the resource `key` (deleted, or its decision failed).
    pub fn forget(&self, key: &str) {
        self.state.lock().expect("settled").by_key.remove(key);
    }

    /// How many resources are remembered as settled.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.state.lock().expect("settled").by_key.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(resource_version: &str) -> Inputs {
        Inputs {
            resource: ("uid".into(), resource_version.into()),
            caches: [Version::default(); 7],
        }
    }

    #[test]
    fn only_the_same_inputs_are_settled() {
        let settled = Settled::default();
        assert!(!settled.is_settled("a/x", &inputs("1")));
        settled.record("a/x", Some(inputs("1")), |_| true);
        assert!(settled.is_settled("a/x", &inputs("1")));
        assert!(!settled.is_settled("a/x", &inputs("2")));
        assert!(!settled.is_settled("a/y", &inputs("1")));
    }

    #[test]
    fn an_unsettled_decision_forgets_the_earlier_one() {
        let settled = Settled::default();
        settled.record("a/x", Some(inputs("1")), |_| true);
        settled.record("a/x", None, |_| true);
        assert!(!settled.is_settled("a/x", &inputs("1")));
        settled.record("a/x", Some(inputs("1")), |_| true);
        settled.forget("a/x");
        assert!(!settled.is_settled("a/x", &inputs("1")));
    }

    #[test]
    fn resources_that_are_gone_are_dropped_in_time() {
        let settled = Settled::default();
        settled.record("gone/x", Some(inputs("1")), |_| true);
        for i in 1..PRUNE_EVERY {
            settled.record(&format!("a/{i}"), Some(inputs("1")), |k| k != "gone/x");
        }
        assert_eq!(settled.len(), PRUNE_EVERY as usize - 1);
        assert!(!settled.is_settled("gone/x", &inputs("1")));
    }
}
