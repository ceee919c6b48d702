//! A watch cache that answers "what is in this namespace" by looking only
//! at that namespace.
//!
//! Every resource is reconciled again each resync, and a reconcile gathers
//! the Deployments, ConfigMaps, ReplicaSets and pods of its namespace. A
//! kube store can only hand out every object it holds, so gathering from
//! it costs the whole cache: at 10,000 models about 70,000 objects per
//! reconcile, N² per resync. Beside each store this keeps its objects by
//! namespace and name (the store's own `Arc`s, so nothing is copied),
//! updated from the same watch events right after the store applies them,
//! so a lookup costs what the namespace holds and neither hashes nor
//! allocates per object.
//!
//! The index trails the store by one event at most: a lookup may miss an
//! object the store just gained, or return one it just dropped or
//! replaced, as if the cache were an event older, which any cache may be.
//!
//! It also counts the changes per namespace ([`ByNamespace::version`]), so
//! a resync can tell that a namespace holds what it held at the last
//! decision without looking at its objects.

use std::collections::{BTreeMap, HashMap};
use std::ops::Deref;
use std::sync::{Arc, RwLock};

use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

/// Objects by namespace ("" for cluster-scoped objects) and name.
type Objects<K> = HashMap<String, BTreeMap<String, Arc<K>>>;

#[derive(Debug)]
struct Index<K> {
    live: Objects<K>,
    /// Applies and deletes seen per namespace.
    changes: HashMap<String, u64>,
    /// Lists swapped in (each may change any namespace).
    relists: u64,
}

impl<K> Default for Index<K> {
    fn default() -> Self {
        Index {
            live: HashMap::new(),
            changes: HashMap::new(),
            relists: 0,
        }
    }
}

/// Where a namespace of a cache stands: two equal versions of the same
/// namespace mean the store held the same objects there both times.
/// Versions only grow, so equal also means nothing came and went between.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Version {
    relists: u64,
    changes: u64,
}

/// A kube store and its objects by namespace.
#[derive(Debug)]
pub struct ByNamespace<K: Resource<DynamicType = ()> + 'static> {
    store: Store<K>,
    index: Arc<RwLock<Index<K>>>,
}

impl<K: Resource<DynamicType = ()> + 'static> Clone for ByNamespace<K> {
    fn clone(&self) -> Self {
        ByNamespace {
            store: self.store.clone(),
            index: self.index.clone(),
        }
    }
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> ByNamespace<K> {
    /// Indexes `store`; feed it every event the store's writer applied,
    /// after it applied it ([`ByNamespace::observe`]).
    pub fn new(store: Store<K>) -> Self {
        ByNamespace {
            store,
            index: Arc::default(),
        }
    }

    /// What a watch stream inspects right after `.reflect(writer)`, so the
    /// index follows every event the store applied.
    pub fn observer<E>(&self) -> impl Fn(&Result<watcher::Event<K>, E>) + use<K, E> {
        let this = self.clone();
        move |event| this.observe(event)
    }

    /// Follows one watch event, as the store's writer did: the store
    /// applied it already, so the object to keep is the store's copy.
    pub fn observe<E>(&self, event: &Result<watcher::Event<K>, E>) {
        let Ok(event) = event else { return };
        match event {
            // The store keeps a list being received apart and swaps it in
            // when it ends; so does the index, by reading the new store.
            watcher::Event::Init | watcher::Event::InitApply(_) => {}
            watcher::Event::InitDone => {
                let mut listed: Objects<K> = HashMap::new();
                for object in self.store.state() {
                    let (namespace, name) = names(&*object);
                    listed
                        .entry(namespace.to_owned())
                        .or_default()
                        .insert(name.to_owned(), object.clone());
                }
                let mut index = self.index.write().unwrap_or_else(|e| e.into_inner());
                index.live = listed;
                index.relists += 1;
            }
            watcher::Event::Apply(object) => {
                let stored = self.store.get(&ObjectRef::from_obj(object));
                let (namespace, name) = names(object);
                let mut index = self.index.write().unwrap_or_else(|e| e.into_inner());
                changed(&mut index.changes, namespace);
                if let Some(stored) = stored {
                    index
                        .live
                        .entry(namespace.to_owned())
                        .or_default()
                        .insert(name.to_owned(), stored);
                }
            }
            watcher::Event::Delete(object) => {
                let (namespace, name) = names(object);
                let mut index = self.index.write().unwrap_or_else(|e| e.into_inner());
                changed(&mut index.changes, namespace);
                if let Some(objects) = index.live.get_mut(namespace) {
                    objects.remove(name);
                    if objects.is_empty() {
                        index.live.remove(namespace);
                    }
                }
            }
        }
    }

    /// The cached objects of `namespace`, by name.
    pub fn in_namespace(&self, namespace: &str) -> Vec<Arc<K>> {
        let index = self.index.read().unwrap_or_else(|e| e.into_inner());
        index
            .live
            .get(namespace)
            .map(|objects| objects.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Where `namespace` stands now. Taken before a lookup, it is never
    /// newer than what the lookup sees: the store applies an event before
    /// the index counts it.
    pub fn version(&self, namespace: &str) -> Version {
        let index = self.index.read().unwrap_or_else(|e| e.into_inner());
        Version {
            relists: index.relists,
            changes: index.changes.get(namespace).copied().unwrap_or(0),
        }
    }
}

fn names<K: Resource>(object: &K) -> (&str, &str) {
    let meta = object.meta();
    (
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default(),
    )
}

fn changed(changes: &mut HashMap<String, u64>, namespace: &str) {
    match changes.get_mut(namespace) {
        Some(n) => *n += 1,
        None => {
            changes.insert(namespace.to_owned(), 1);
        }
    }
}

/// Everything a kube store answers (`get`, `state`, readiness) stays
/// available.
impl<K: Resource<DynamicType = ()> + 'static> Deref for ByNamespace<K> {
    type Target = Store<K>;

    fn deref(&self) -> &Store<K> {
        &self.store
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::reflector;

    fn cm(namespace: &str, name: &str) -> ConfigMap {
        let mut cm = ConfigMap::default();
        cm.metadata.namespace = Some(namespace.into());
        cm.metadata.name = Some(name.into());
        cm
    }

    /// Applies `event` to the store and then to the index, in the order
    /// the operator's streams do.
    fn feed(
        writer: &mut reflector::store::Writer<ConfigMap>,
        cache: &ByNamespace<ConfigMap>,
        event: watcher::Event<ConfigMap>,
    ) {
        writer.apply_watcher_event(&event);
        cache.observe(&Ok::<_, ()>(event));
    }

    fn names(cache: &ByNamespace<ConfigMap>, namespace: &str) -> Vec<String> {
        cache
            .in_namespace(namespace)
            .iter()
            .map(|c| c.metadata.name.clone().unwrap_or_default())
            .collect()
    }

    #[test]
    fn a_lookup_returns_only_its_namespace_and_follows_applies_and_deletes() {
        let (store, mut writer) = reflector::store();
        let cache = ByNamespace::new(store);
        feed(&mut writer, &cache, watcher::Event::Init);
        for (ns, name) in [("a", "x"), ("a", "y"), ("b", "x")] {
            feed(&mut writer, &cache, watcher::Event::InitApply(cm(ns, name)));
        }
        feed(&mut writer, &cache, watcher::Event::InitDone);
        assert_eq!(names(&cache, "a"), ["x", "y"]);
        assert_eq!(names(&cache, "b"), ["x"]);
        assert!(names(&cache, "c").is_empty());

        feed(&mut writer, &cache, watcher::Event::Apply(cm("c", "z")));
        feed(&mut writer, &cache, watcher::Event::Delete(cm("a", "x")));
        assert_eq!(names(&cache, "a"), ["y"]);
        assert_eq!(names(&cache, "c"), ["z"]);
        // What a whole-store scan would have found, namespace by namespace.
        let mut scanned: Vec<(String, String)> = cache
            .state()
            .iter()
            .map(|c| {
                (
                    c.metadata.namespace.clone().unwrap_or_default(),
                    c.metadata.name.clone().unwrap_or_default(),
                )
            })
            .collect();
        scanned.sort();
        let mut indexed: Vec<(String, String)> = ["a", "b", "c"]
            .iter()
            .flat_map(|ns| names(&cache, ns).into_iter().map(|n| (ns.to_string(), n)))
            .collect();
        indexed.sort();
        assert_eq!(indexed, scanned);
    }

    #[test]
    fn a_relist_replaces_the_index_when_it_ends_as_it_replaces_the_store() {
        let (store, mut writer) = reflector::store();
        let cache = ByNamespace::new(store);
        feed(&mut writer, &cache, watcher::Event::Init);
        feed(
            &mut writer,
            &cache,
            watcher::Event::InitApply(cm("a", "gone")),
        );
        feed(&mut writer, &cache, watcher::Event::InitDone);
        // A relist after a missed deletion: the old name stays until the
        // new list is complete, then disappears with the store's copy.
        feed(&mut writer, &cache, watcher::Event::Init);
        feed(
            &mut writer,
            &cache,
            watcher::Event::InitApply(cm("a", "new")),
        );
        assert_eq!(names(&cache, "a"), ["gone"]);
        feed(&mut writer, &cache, watcher::Event::InitDone);
        assert_eq!(names(&cache, "a"), ["new"]);
    }

    #[test]
    fn a_lookup_hands_out_the_store_s_own_copies() {
        let (store, mut writer) = reflector::store();
        let cache = ByNamespace::new(store);
        feed(&mut writer, &cache, watcher::Event::Init);
        feed(&mut writer, &cache, watcher::Event::InitApply(cm("a", "x")));
        feed(&mut writer, &cache, watcher::Event::InitDone);
        feed(&mut writer, &cache, watcher::Event::Apply(cm("a", "y")));
        for object in cache.in_namespace("a") {
            let stored = cache.get(&ObjectRef::from_obj(&*object)).unwrap();
            assert!(Arc::ptr_eq(&object, &stored));
        }
    }

    #[test]
    fn a_namespace_s_version_moves_with_its_own_changes_and_every_relist() {
        let (store, mut writer) = reflector::store();
        let cache = ByNamespace::new(store);
        let start = (cache.version("a"), cache.version("b"));
        feed(&mut writer, &cache, watcher::Event::Apply(cm("a", "x")));
        let applied = (cache.version("a"), cache.version("b"));
        assert_ne!(applied.0, start.0);
        assert_eq!(applied.1, start.1, "another namespace's change");
        feed(&mut writer, &cache, watcher::Event::Delete(cm("a", "x")));
        let deleted = cache.version("a");
        assert_ne!(deleted, applied.0);
        assert_eq!(cache.version("a"), deleted, "nothing happened since");
        feed(&mut writer, &cache, watcher::Event::Init);
        feed(&mut writer, &cache, watcher::Event::InitApply(cm("c", "z")));
        assert_eq!(cache.version("b"), applied.1, "a list not yet swapped in");
        feed(&mut writer, &cache, watcher::Event::InitDone);
        assert_ne!(cache.version("a"), deleted);
        assert_ne!(cache.version("b"), applied.1);
    }

    #[test]
    fn a_name_whose_object_the_store_lacks_is_skipped() {
        let (store, _writer) = reflector::store();
        let cache: ByNamespace<ConfigMap> = ByNamespace::new(store);
        // The index saw an object the store never applied.
        cache.observe(&Ok::<_, ()>(watcher::Event::Apply(cm("a", "x"))));
        assert!(cache.in_namespace("a").is_empty());
    }
}
