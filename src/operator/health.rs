//! Readiness: are the caches synced, and are the watches alive?
//!
//! The operator decides from its watch caches. A watch that keeps failing
//! (the API server unreachable, RBAC removed, a resource version too old
//! over and over) leaves those caches frozen, and automatic rollback would
//! silently stop. `/readyz` says so: it fails until every cache has synced
//! and while any watch has been failing for longer than
//! [`WATCH_FAILURE_BOUND`], so the Deployment's readiness probe, `kubectl
//! get pods` and alerts on unready pods all show it.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long a watch may keep failing before the operator reports itself
/// unready: longer than the watcher's own backoff needs to ride out an API
/// server restart (its retries cap near 30 s), short enough that a frozen
/// cache is noticed well within a model's default progress deadline (600 s).
pub const WATCH_FAILURE_BOUND: Duration = Duration::from_secs(60);

/// Shared health state.
#[derive(Debug)]
pub struct Health {
    /// Scopes whose caches have not synced yet.
    unsynced: AtomicUsize,
    /// Per watch, since when it has been failing (`None`: healthy).
    failing: Mutex<BTreeMap<String, Option<Instant>>>,
}

impl Health {
    /// Health for `scopes` controller scopes, none synced yet.
    pub fn new(scopes: usize) -> Self {
        Health {
            unsynced: AtomicUsize::new(scopes),
            failing: Mutex::new(BTreeMap::new()),
        }
    }

    /// One scope's caches have synced.
    pub fn synced(&self) {
        let _ = self
            .unsynced
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
    }

    /// A watch produced an event (`ok`) or an error.
    pub fn observe(&self, watch: &str, ok: bool, now: Instant) {
        let mut failing = self.failing.lock().expect("health");
        match failing.get_mut(watch) {
            Some(since) if ok => *since = None,
            Some(since) => {
                since.get_or_insert(now);
            }
            None => {
                failing.insert(watch.to_owned(), (!ok).then_some(now));
            }
        }
    }

    /// `Ok` when ready, else why not.
    pub fn ready(&self, now: Instant) -> Result<(), String> {
        let unsynced = self.unsynced.load(Ordering::SeqCst);
        if unsynced > 0 {
            return Err(format!(
                "{unsynced} controller scope(s) still syncing their caches"
            ));
        }
        let failing = self.failing.lock().expect("health");
        let stuck: Vec<String> = failing
            .iter()
            .filter_map(|(watch, since)| {
                let for_ = now.duration_since((*since)?);
                (for_ > WATCH_FAILURE_BOUND)
                    .then(|| format!("{watch} failing for {}s", for_.as_secs()))
            })
            .collect();
        if stuck.is_empty() {
            Ok(())
        } else {
            Err(format!("watches failing: {}", stuck.join(", ")))
        }
    }

    /// How many watches are failing now (a metric).
    pub fn failing_watches(&self) -> usize {
        let failing = self.failing.lock().expect("health");
        failing.values().filter(|s| s.is_some()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unready_until_synced_and_while_a_watch_fails_past_the_bound() {
        let t0 = Instant::now();
        let h = Health::new(2);
        assert!(h.ready(t0).is_err());
        h.synced();
        assert!(h.ready(t0).is_err(), "one scope still syncing");
        h.synced();
        assert_eq!(h.ready(t0), Ok(()));
        h.observe("deployments", false, t0);
        assert_eq!(
            h.ready(t0 + WATCH_FAILURE_BOUND),
            Ok(()),
            "within the bound"
        );
        h.observe("deployments", false, t0 + Duration::from_secs(30));
        let late = t0 + WATCH_FAILURE_BOUND + Duration::from_secs(1);
        let err = h.ready(late).unwrap_err();
        assert!(err.contains("deployments failing for 61s"), "{err}");
        assert_eq!(h.failing_watches(), 1);
        h.observe("deployments", true, late);
        assert_eq!(h.ready(late), Ok(()), "one good event heals it");
    }
}
