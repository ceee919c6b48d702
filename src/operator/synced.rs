//! Which watch caches hold a full list.
//!
//! kube's reflector stores have their own readiness signal, but it wakes
//! only the last task that waited on it (its one-shot channel keeps a single
//! waker). The controller's runner already waits on the OpenMedModel
//! store's, so a second waiter (readiness, a reconcile's cache wait) could
//! miss the moment and wait forever: a follower that stayed unready, a
//! leader whose first reconcile hit the 60 s cache timeout. The operator
//! therefore keeps its own record, set from the `InitDone` events that
//! pass through each watch stream, on a channel that wakes every waiter.

use kube::runtime::watcher;
use tokio::sync::watch;

/// The caches of one controller scope.
#[derive(Debug, Clone, Copy)]
pub enum Cache {
    Models = 1,
    Deployments = 2,
    ConfigMaps = 4,
    Autoscalers = 8,
    ReplicaSets = 16,
    Pods = 32,
    /// KEDA ScaledObjects, watched only with `--keda`.
    ScaledObjects = 64,
}

/// The caches every scope has.
const ALL: u8 = 63;

/// The caches of a scope that have received a full list.
#[derive(Debug)]
pub struct Synced {
    synced: watch::Sender<u8>,
    /// The caches this scope has.
    required: u8,
}

impl Default for Synced {
    fn default() -> Self {
        Synced {
            synced: watch::Sender::new(0),
            required: ALL,
        }
    }
}

impl Synced {
    /// The record of a scope that also watches ScaledObjects when `keda`.
    pub fn new(keda: bool) -> Self {
        Synced {
            required: if keda {
                ALL | Cache::ScaledObjects as u8
            } else {
                ALL
            },
            ..Synced::default()
        }
    }

    /// Notes `cache` as synced when `event` ends its (re)list.
    pub fn observe<K, E>(&self, cache: Cache, event: &Result<watcher::Event<K>, E>) {
        if matches!(event, Ok(watcher::Event::InitDone)) {
            self.synced.send_if_modified(|synced| {
                let before = *synced;
                *synced |= cache as u8;
                *synced != before
            });
        }
    }

    /// Completes once every cache has synced.
    pub async fn all(&self) {
        let mut rx = self.synced.subscribe();
        let required = self.required;
        let _ = rx.wait_for(|synced| *synced & required == required).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Event = Result<watcher::Event<k8s_openapi::api::core::v1::ConfigMap>, ()>;

    #[tokio::test]
    async fn every_waiter_is_woken_once_every_cache_has_synced() {
        let synced = std::sync::Arc::new(Synced::default());
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let synced = synced.clone();
                tokio::spawn(async move { synced.all().await })
            })
            .collect();
        tokio::task::yield_now().await;
        for cache in [
            Cache::Models,
            Cache::Deployments,
            Cache::ConfigMaps,
            Cache::Autoscalers,
            Cache::Pods,
        ] {
            synced.observe(cache, &Event::Ok(watcher::Event::InitDone));
        }
        // Not every cache yet, and an event that is not InitDone counts for nothing.
        synced.observe(Cache::ReplicaSets, &Event::Ok(watcher::Event::Init));
        tokio::task::yield_now().await;
        assert!(waiters.iter().all(|w| !w.is_finished()));
        synced.observe(Cache::ReplicaSets, &Event::Ok(watcher::Event::InitDone));
        for waiter in waiters {
            tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
                .await
                .expect("every waiter is woken")
                .unwrap();
        }
    }
}
