//! A watch cache that answers "what is in this namespace" by looking only
//! at that namespace.
//!
//! Every resource is reconciled again each resync, and a reconcile gathers
//! the Deployments, ConfigMaps, ReplicaSets and pods of its namespace. A
//! kube store can only hand out every object it holds, so gathering from
//! it costs the whole cache: at 10,000 models about 70,000 objects per
//! reconcile, N² per resync. Beside each store this keeps the names of its
//! objects by namespace, updated from the same watch events right after
//! the store applies them, so a lookup costs what the namespace holds.
//!
//! The index trails the store by one event at most: an object the store
//! just gained may be missing from a lookup for that moment (as if the
//! cache were an event older, which any cache may be), and a name whose
//! object the store just dropped finds nothing and is skipped.
//!
//! It also counts the changes per namespace ([`ByNamespace::version`]), so
//! a resync can tell that a namespace holds what it held at the last
//! decision without looking at its objects.

use std::collections::{BTreeSet, HashMap};
use std::ops::Deref;
use std::sync::{Arc, RwLock};

use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

/// Names by namespace ("" for cluster-scoped objects).
type Names = HashMap<String, BTreeSet<String>>;

#[derive(Debug, Default)]
struct Index {
    live: Names,
    /// The list being received, swapped in when it ends, as the store does.
    relist: Option<Names>,
    /// Applies and deletes seen per namespace.
    changes: HashMap<String, u64>,
    /// Lists swapped in (each may change any namespace).
    relists: u64,
}

/// Where a namespace of a cache stands: two equal versions of the same
/// namespace mean the store held the same objects there both times.
/// Versions only grow, so equal also means nothing came and went between.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Version {
    relists: u64,
    changes: u64,
}

/// A kube store and the names of its objects by namespace.
#[derive(Debug)]
pub struct ByNamespace<K: Resource<DynamicType = ()> + 'static> {
    store: Store<K>,
    index: Arc<RwLock<Index>>,
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

    /// Follows one watch event, as the store's writer did.
    pub fn observe<E>(&self, event: &Result<watcher::Event<K>, E>) {
        let Ok(event) = event else { return };
        let mut index = self.index.write().unwrap_or_else(|e| e.into_inner());
        match event {
            watcher::Event::Init => index.relist = Some(Names::new()),
            watcher::Event::InitApply(object) => {
                insert(index.relist.get_or_insert_with(Names::new), object);
            }
            watcher::Event::InitDone => {
                if let Some(listed) = index.relist.take() {
                    index.live = listed;
                }
                index.relists += 1;
            }
            watcher::Event::Apply(object) => {
                changed(&mut index.changes, object);
                insert(&mut index.live, object);
            }
            watcher::Event::Delete(object) => {
                changed(&mut index.changes, object);
                let namespace = object.meta().namespace.as_deref().unwrap_or_default();
                let name = object.meta().name.as_deref().unwrap_or_default();
                if let Some(names) = index.live.get_mut(namespace) {
                    names.remove(name);
                    if names.is_empty() {
                        index.live.remove(namespace);
                    }
                }
            }
        }
    }

    /// The cached objects of `namespace`, by name.
    pub fn in_namespace(&self, namespace: &str) -> Vec<Arc<K>> {
        let names: Vec<String> = {
            let index = self.index.read().unwrap_or_else(|e| e.into_inner());
            match index.live.get(namespace) {
                Some(names) => names.iter().cloned().collect(),
                None => return Vec::new(),
            }
        };
        names
            .into_iter()
            .filter_map(|name| self.store.get(&ObjectRef::new(&name).within(namespace)))
            .collect()
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

fn changed<K: Resource>(changes: &mut HashMap<String, u64>, object: &K) {
    let namespace = object.meta().namespace.as_deref().unwrap_or_default();
    match changes.get_mut(namespace) {
        Some(n) => *n += 1,
        None => {
            changes.insert(namespace.to_owned(), 1);
        }
    }
}

fn insert<K: Resource>(names: &mut Names, object: &K) {
    let meta = object.meta();
    names
        .entry(meta.namespace.clone().unwrap_or_default())
        .or_default()
        .insert(meta.name.clone().unwrap_or_default());
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
    fn a_name_whose_object_the_store_lacks_is_skipped() {
        let (store, _writer) = reflector::store();
        let cache: ByNamespace<ConfigMap> = ByNamespace::new(store);
        // The index saw an object the store never applied.
        cache.observe(&Ok::<_, ()>(watcher::Event::Apply(cm("a", "x"))));
        assert!(cache.in_namespace("a").is_empty());
    }
}
