//! What the operator wrote that its watch caches may not show yet.
//!
//! A write's own watch event wakes the resource again, and the caches of
//! the other kinds may still hold the object as it was before the write: a
//! decision on them would take the operator's own change for another
//! writer's and write again. Reading every object live before each write
//! prevented that, at several requests per write. Instead, every object a
//! write returns is kept here until the cache holds it or something newer,
//! and decisions look at the newer of the two.
//!
//! Newer is decided by resourceVersion. Kubernetes treated resourceVersions
//! as opaque until 1.35 made them comparable (KEP-5504: decimal integers
//! without leading zeros, ordered by value, per resource). A version that
//! does not have that form compares as unknown, and the write is kept until
//! it expires: correctness never rests on this memory, since every write
//! carries a precondition (the resourceVersion or UID it was decided on) and
//! a refused write is decided again on live reads. It only saves the
//! requests of a decision that would be refused.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::runtime::watcher;

/// How long a write is remembered at most while its kind's watch works:
/// long enough for a working watch to deliver it, short enough that
/// objects which leave a cache's selector (a released Deployment) do not
/// stay. While the watch is broken (the API server restarting) nothing
/// expires: the cache cannot have caught up, and a write forgotten then
/// made the operator take its own ConfigMap, created while the watch was
/// down, for one another writer had deleted ("DriftCorrected" two
/// minutes after an API server restart, in the chaos suite).
const KEEP: Duration = Duration::from_secs(120);

/// The operator's recent writes, per kind it decides on.
#[derive(Debug)]
pub struct Written {
    /// OpenMedModels (finalizer and status writes).
    pub models: Recent<super::RawModel>,
    /// Deployments.
    pub deployments: Recent<super::deployment::CachedDeployment>,
    /// ConfigMaps.
    pub config_maps: Recent<super::config_map::CachedConfigMap>,
}

/// Each kind is kept as its cache keeps it: a write's answer carries
/// `managedFields`, often half the object, and at 10,000 models the
/// writes of two minutes are most of the operator's memory.
impl Default for Written {
    fn default() -> Self {
        Written {
            models: Recent::new(super::forget_write_records),
            deployments: Recent::new(super::keep_own_apply_time),
            config_maps: Recent::new(super::forget_write_records),
        }
    }
}

impl Written {
    /// Whether any write in `namespace` is kept.
    pub fn holds_any_in(&self, namespace: &str) -> bool {
        self.models.holds_any_in(namespace)
            || self.deployments.holds_any_in(namespace)
            || self.config_maps.holds_any_in(namespace)
    }
}

/// Orders two resourceVersions when both are comparable (positive decimal
/// integers without leading zeros).
pub fn compare(a: &str, b: &str) -> Option<Ordering> {
    let comparable =
        |v: &str| !v.is_empty() && !v.starts_with('0') && v.bytes().all(|b| b.is_ascii_digit());
    if !(comparable(a) && comparable(b)) {
        return None;
    }
    Some(a.len().cmp(&b.len()).then_with(|| a.cmp(b)))
}

/// One remembered object, or the deletion of one.
#[derive(Debug, Clone)]
enum Kept<K> {
    Object(Arc<K>),
    /// Deleted by the operator: the object with this UID is gone even while
    /// the cache still lists it.
    Deleted {
        uid: Option<String>,
    },
}

#[derive(Debug)]
struct Entry<K> {
    kept: Kept<K>,
    at: Instant,
}

/// Objects of one kind the operator wrote, by namespace and name.
#[derive(Debug)]
pub struct Recent<K> {
    entries: Mutex<State<K>>,
    /// What is dropped of an object before it is kept (as its cache does).
    trim: fn(&mut K),
    /// The kind's watch failed, or is listing again, and has not delivered
    /// a full list or an event since ([`Recent::watch_event`]).
    behind: AtomicBool,
}

#[derive(Debug)]
struct State<K> {
    /// Ordered, so one namespace's entries are a range of it.
    by_name: BTreeMap<(String, String), Entry<K>>,
    swept: Instant,
}

impl<K> Recent<K> {
    /// Keeps objects as `trim` leaves them.
    pub fn new(trim: fn(&mut K)) -> Self {
        Recent {
            entries: Mutex::new(State {
                by_name: BTreeMap::new(),
                swept: Instant::now(),
            }),
            trim,
            behind: AtomicBool::new(false),
        }
    }

    /// Follows the kind's watch stream: an error or a new list puts the
    /// cache behind, the list's end or an event brings it back.
    pub fn watch_event<E>(&self, event: &Result<watcher::Event<K>, E>) {
        let behind = match event {
            Err(_) | Ok(watcher::Event::Init) => true,
            // Part of a list still coming: nothing changes yet.
            Ok(watcher::Event::InitApply(_)) => return,
            Ok(_) => false,
        };
        self.behind.store(behind, AtomicOrdering::Relaxed);
    }

    /// Whether an entry written at `at` is too old to keep at `now`.
    fn expired(&self, at: Instant, now: Instant) -> bool {
        now.duration_since(at) > KEEP && !self.behind.load(AtomicOrdering::Relaxed)
    }
}

#[cfg(test)]
impl<K> Default for Recent<K> {
    fn default() -> Self {
        Recent::new(|_| {})
    }
}

fn key(namespace: &str, name: &str) -> (String, String) {
    (namespace.to_owned(), name.to_owned())
}

impl<K: kube::Resource + Clone> Recent<K> {
    /// Remembers what a write (or a live read) returned, unless a newer
    /// copy is already kept.
    pub fn wrote(&self, object: &K) {
        let namespace = object.namespace().unwrap_or_default();
        let name = object.name_any();
        let mut state = self.entries.lock().expect("recent writes");
        let now = Instant::now();
        if now.duration_since(state.swept) > KEEP && !self.behind.load(AtomicOrdering::Relaxed) {
            state
                .by_name
                .retain(|_, e| now.duration_since(e.at) <= KEEP);
            state.swept = now;
        }
        let k = key(&namespace, &name);
        let newer = match state.by_name.get(&k).map(|e| &e.kept) {
            Some(Kept::Object(kept)) => {
                compare(
                    &kept.resource_version().unwrap_or_default(),
                    &object.resource_version().unwrap_or_default(),
                ) != Some(Ordering::Greater)
            }
            _ => true,
        };
        if newer {
            let mut copy = object.clone();
            (self.trim)(&mut copy);
            let kept = Kept::Object(Arc::new(copy));
            state.by_name.insert(k, Entry { kept, at: now });
        }
    }

    /// Remembers that the operator deleted the object with `uid`.
    pub fn deleted(&self, namespace: &str, name: &str, uid: Option<String>) {
        let mut state = self.entries.lock().expect("recent writes");
        state.by_name.insert(
            key(namespace, name),
            Entry {
                kept: Kept::Deleted { uid },
                at: Instant::now(),
            },
        );
    }

    /// The newer of the cached object and the remembered one (`None`: the
    /// operator deleted it, or neither exists). A remembered object the
    /// cache has caught up with is forgotten.
    pub fn newest(&self, namespace: &str, name: &str, cached: Option<Arc<K>>) -> Option<Arc<K>> {
        self.newest_at(namespace, name, cached, Instant::now())
    }

    fn newest_at(
        &self,
        namespace: &str,
        name: &str,
        cached: Option<Arc<K>>,
        now: Instant,
    ) -> Option<Arc<K>> {
        let mut state = self.entries.lock().expect("recent writes");
        let k = key(namespace, name);
        let Some(entry) = state.by_name.get(&k) else {
            return cached;
        };
        let (kept_wins, forget) = match (&entry.kept, &cached) {
            (Kept::Object(_), None) => (true, false),
            (Kept::Object(kept), Some(c)) => match compare(
                &c.resource_version().unwrap_or_default(),
                &kept.resource_version().unwrap_or_default(),
            ) {
                Some(Ordering::Less) => (true, false),
                Some(_) => (false, true),
                // Not comparable: the same version is the same object;
                // otherwise trust the write until it expires.
                None => {
                    let same = c.resource_version() == kept.resource_version();
                    (!same, same)
                }
            },
            (Kept::Deleted { uid }, Some(c)) => {
                if c.uid() == *uid {
                    (true, false)
                } else {
                    // Created again since: the cache is newer.
                    (false, true)
                }
            }
            (Kept::Deleted { .. }, None) => (true, true),
        };
        let expired = self.expired(entry.at, now);
        let answer = if kept_wins && !expired {
            match &entry.kept {
                Kept::Object(kept) => Some(kept.clone()),
                Kept::Deleted { .. } => None,
            }
        } else {
            cached
        };
        if forget || expired {
            state.by_name.remove(&k);
        }
        answer
    }

    /// Names of the objects kept in `namespace`, for decisions that look
    /// at every object of a kind there.
    pub fn names_in(&self, namespace: &str) -> Vec<String> {
        let state = self.entries.lock().expect("recent writes");
        state
            .by_name
            .range(key(namespace, "")..)
            .take_while(|((ns, _), _)| ns == namespace)
            .map(|((_, name), _)| name.clone())
            .collect()
    }

    /// Whether anything is kept in `namespace`: a decision there may see
    /// these writes rather than the caches.
    pub fn holds_any_in(&self, namespace: &str) -> bool {
        let state = self.entries.lock().expect("recent writes");
        state
            .by_name
            .range(key(namespace, "")..)
            .next()
            .is_some_and(|((ns, _), _)| ns == namespace)
    }

    /// How many objects are kept.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.lock().expect("recent writes").by_name.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    fn cm(rv: &str, uid: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some("m".into()),
                namespace: Some("ns".into()),
                resource_version: Some(rv.into()),
                uid: Some(uid.into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    fn rv(found: Option<Arc<ConfigMap>>) -> Option<String> {
        found.and_then(|c| c.metadata.resource_version.clone())
    }

    #[test]
    fn a_write_is_kept_as_its_cache_would_keep_it() {
        let written = Written::default();
        let mut c = cm("1", "u");
        c.metadata.managed_fields = Some(vec![Default::default()]);
        written
            .config_maps
            .wrote(&super::super::config_map::CachedConfigMap::of(&c));
        let kept = written.config_maps.newest("ns", "m", None).expect("kept");
        assert_eq!(kept.metadata.managed_fields, None);
        assert_eq!(kept.metadata.resource_version.as_deref(), Some("1"));
    }

    #[test]
    fn names_in_a_namespace_are_that_namespace_s_alone() {
        let recent = Recent::default();
        for (ns, name) in [("a", "x"), ("ab", "y"), ("a", "z"), ("", "w"), ("b", "x")] {
            let mut c = cm("1", "u");
            c.metadata.namespace = Some(ns.into());
            c.metadata.name = Some(name.into());
            recent.wrote(&c);
        }
        recent.deleted("a", "gone", None);
        assert_eq!(recent.names_in("a"), ["gone", "x", "z"]);
        assert_eq!(recent.names_in("ab"), ["y"]);
        assert_eq!(recent.names_in(""), ["w"]);
        assert!(recent.names_in("c").is_empty());
        assert!(recent.holds_any_in("a") && recent.holds_any_in("ab") && recent.holds_any_in(""));
        assert!(!recent.holds_any_in("c") && !recent.holds_any_in("aa"));
    }

    #[test]
    fn a_write_outlives_its_keep_while_its_watch_is_behind() {
        type Event = Result<watcher::Event<ConfigMap>, ()>;
        let recent = Recent::default();
        recent.wrote(&cm("5", "u"));
        let late = Instant::now() + KEEP + Duration::from_secs(1);
        // The API server restarts: the watch fails, then lists again.
        recent.watch_event(&Event::Err(()));
        assert_eq!(
            rv(recent.newest_at("ns", "m", None, late)),
            Some("5".into())
        );
        recent.watch_event(&Event::Ok(watcher::Event::Init));
        assert_eq!(
            rv(recent.newest_at("ns", "m", None, late)),
            Some("5".into())
        );
        // The list is in: an object it lacks is gone, the write expires.
        recent.watch_event(&Event::Ok(watcher::Event::InitDone));
        assert_eq!(rv(recent.newest_at("ns", "m", None, late)), None);
        assert_eq!(recent.len(), 0);
    }

    #[test]
    fn resource_versions_compare_by_value_and_only_when_well_formed() {
        assert_eq!(compare("9", "10"), Some(Ordering::Less));
        assert_eq!(compare("123", "123"), Some(Ordering::Equal));
        assert_eq!(compare("1000", "999"), Some(Ordering::Greater));
        assert_eq!(compare("", "1"), None);
        assert_eq!(compare("01", "1"), None);
        assert_eq!(compare("0", "1"), None);
        assert_eq!(compare("12a", "1"), None);
    }

    #[test]
    fn a_write_is_seen_until_the_cache_catches_up_then_forgotten() {
        let recent = Recent::default();
        recent.wrote(&cm("10", "u"));
        let stale = Some(Arc::new(cm("9", "u")));
        assert_eq!(
            rv(recent.newest("ns", "m", stale.clone())),
            Some("10".into())
        );
        assert_eq!(rv(recent.newest("ns", "m", None)), Some("10".into()));
        assert_eq!(recent.len(), 1);
        let caught_up = Some(Arc::new(cm("12", "u")));
        assert_eq!(rv(recent.newest("ns", "m", caught_up)), Some("12".into()));
        assert_eq!(recent.len(), 0, "forgotten once the cache holds it");
        assert_eq!(rv(recent.newest("ns", "m", stale)), Some("9".into()));
    }

    #[test]
    fn an_older_write_never_replaces_a_newer_one() {
        let recent = Recent::default();
        recent.wrote(&cm("20", "u"));
        recent.wrote(&cm("19", "u"));
        assert_eq!(rv(recent.newest("ns", "m", None)), Some("20".into()));
    }

    #[test]
    fn a_deletion_hides_the_cached_object_with_its_uid_only() {
        let recent = Recent::<ConfigMap>::default();
        recent.deleted("ns", "m", Some("u".into()));
        assert!(
            recent
                .newest("ns", "m", Some(Arc::new(cm("5", "u"))))
                .is_none()
        );
        let again = Some(Arc::new(cm("7", "v")));
        assert_eq!(rv(recent.newest("ns", "m", again)), Some("7".into()));
        assert_eq!(recent.len(), 0);
    }

    #[test]
    fn versions_that_do_not_compare_trust_the_write_unless_equal() {
        let recent = Recent::default();
        recent.wrote(&cm("b", "u"));
        let other = Some(Arc::new(cm("a", "u")));
        assert_eq!(rv(recent.newest("ns", "m", other)), Some("b".into()));
        let same = Some(Arc::new(cm("b", "u")));
        assert_eq!(rv(recent.newest("ns", "m", same)), Some("b".into()));
        assert_eq!(recent.len(), 0);
    }
}
