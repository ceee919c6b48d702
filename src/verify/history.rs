//! The versions each resource had on BASE's first-parent history.
//!
//! Without the cluster's status, the versions a manual rollback may name are
//! derived from Git: the last two distinct `spec.version` values of the
//! resource, walking BASE, its first parent, that commit's first parent, and
//! so on. The walk itself reads Git ([`super::git`]); this module only keeps
//! the state: which file holds which resources at the commit being looked
//! at, and the versions found so far. A resource is known by namespace and
//! name, not by file, so renames and moves between files do not break it.
//!
//! The walk is told only which files changed from one commit to its parent,
//! so it does work in proportion to the changes, not to the size of the
//! tree, and it stops as soon as every wanted resource has two versions.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use serde_json::Value;

use super::rules::{HistoryVersions, ResourceKey};
use crate::source::Document;

/// One OpenMedModel in a file: who it is and which version it asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The resource.
    pub key: ResourceKey,
    /// Its `spec.version`.
    pub version: String,
}

/// The OpenMedModels of one file's documents that have a string `spec.version`.
pub fn entries(docs: &[Document], default_namespace: &str) -> Vec<Entry> {
    docs.iter()
        .filter_map(|doc| {
            let key = ResourceKey::of(doc, default_namespace)?;
            let version = doc.value.pointer("/spec/version").and_then(Value::as_str)?;
            Some(Entry {
                key,
                version: version.to_owned(),
            })
        })
        .collect()
}

/// The state of a first-parent walk.
#[derive(Debug, Default)]
pub struct VersionHistory {
    /// Distinct versions found so far, for each wanted resource.
    found: HashMap<ResourceKey, Vec<String>>,
    /// Wanted resources with fewer than two versions found.
    pending: HashSet<ResourceKey>,
    /// What each file holds at the current commit.
    files: HashMap<String, Arc<Vec<Entry>>>,
    /// For each wanted resource, the files defining it at the current commit
    /// and the version each asks for (the first path wins, as in a tree).
    defined_in: HashMap<ResourceKey, BTreeMap<String, String>>,
    /// Commits looked at.
    commits: usize,
}

impl VersionHistory {
    /// A walk that looks for the versions of `wanted`.
    pub fn new(wanted: impl IntoIterator<Item = ResourceKey>) -> Self {
        let pending: HashSet<ResourceKey> = wanted.into_iter().collect();
        VersionHistory {
            found: pending.iter().map(|k| (k.clone(), Vec::new())).collect(),
            pending,
            ..Default::default()
        }
    }

    /// The first commit (BASE): every file that holds OpenMedModels.
    pub fn start(&mut self, files: impl IntoIterator<Item = (String, Arc<Vec<Entry>>)>) {
        self.step(files.into_iter().map(|(path, e)| (path, Some(e))));
    }

    /// The next commit back: the files that differ from the previous one,
    /// with what each holds now (`None` when the file does not exist).
    pub fn step(&mut self, changes: impl IntoIterator<Item = (String, Option<Arc<Vec<Entry>>>)>) {
        self.commits += 1;
        let mut touched = HashSet::new();
        for (path, now) in changes {
            if let Some(old) = self.files.remove(&path) {
                for entry in old.iter() {
                    if let Some(defs) = self.defined_in.get_mut(&entry.key) {
                        defs.remove(&path);
                        // Another file may still define it, with another version.
                        touched.insert(entry.key.clone());
                    }
                }
            }
            let Some(now) = now else { continue };
            let mut relevant = false;
            for entry in now.iter() {
                if self.pending.contains(&entry.key) {
                    self.defined_in
                        .entry(entry.key.clone())
                        .or_default()
                        .entry(path.clone())
                        .or_insert_with(|| entry.version.clone());
                    touched.insert(entry.key.clone());
                    relevant = true;
                }
            }
            if relevant {
                self.files.insert(path, now);
            }
        }
        for key in touched {
            let version = self
                .defined_in
                .get(&key)
                .and_then(|defs| defs.values().next());
            let (Some(version), Some(found)) = (version, self.found.get_mut(&key)) else {
                continue;
            };
            if !found.contains(version) {
                found.push(version.clone());
                if found.len() >= 2 {
                    self.pending.remove(&key);
                    self.defined_in.remove(&key);
                }
            }
        }
    }

    /// True when every wanted resource has two versions: walking further
    /// cannot change the result.
    pub fn done(&self) -> bool {
        self.pending.is_empty()
    }

    /// Commits looked at so far.
    pub fn commits(&self) -> usize {
        self.commits
    }

    /// The versions found, most recent first.
    pub fn finish(self) -> HistoryVersions {
        self.found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ResourceKey {
        ResourceKey {
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    fn file(items: &[(&str, &str)]) -> Option<Arc<Vec<Entry>>> {
        Some(Arc::new(
            items
                .iter()
                .map(|(name, version)| Entry {
                    key: key(name),
                    version: (*version).into(),
                })
                .collect(),
        ))
    }

    #[test]
    fn keeps_the_last_two_distinct_versions_and_stops() {
        let mut h = VersionHistory::new([key("a")]);
        h.start([("a.yaml".into(), file(&[("a", "v3")]).unwrap())]);
        assert!(!h.done());
        // A commit that only touched another field: same version.
        h.step([("a.yaml".into(), file(&[("a", "v3")]))]);
        assert!(!h.done());
        h.step([("a.yaml".into(), file(&[("a", "v2")]))]);
        assert!(h.done());
        assert_eq!(h.commits(), 3);
        assert_eq!(h.finish()[&key("a")], ["v3", "v2"]);
    }

    #[test]
    fn a_resource_moved_between_files_is_the_same_resource() {
        let mut h = VersionHistory::new([key("a")]);
        h.start([("new/place.yaml".into(), file(&[("a", "v2")]).unwrap())]);
        // Going back past the move: the new file did not exist, the old did.
        h.step([
            ("new/place.yaml".into(), None),
            ("old.yaml".into(), file(&[("b", "x"), ("a", "v2")])),
        ]);
        assert!(!h.done(), "a move is not a version change");
        h.step([("old.yaml".into(), file(&[("a", "v1")]))]);
        assert_eq!(h.finish()[&key("a")], ["v2", "v1"]);
    }

    #[test]
    fn a_commit_without_the_resource_adds_nothing() {
        let mut h = VersionHistory::new([key("a"), key("b")]);
        h.start([("a.yaml".into(), file(&[("a", "v2")]).unwrap())]);
        h.step([("a.yaml".into(), None)]);
        h.step([("a.yaml".into(), file(&[("a", "v2")]))]);
        let found = h.finish();
        assert_eq!(found[&key("a")], ["v2"]);
        assert!(found[&key("b")].is_empty());
    }

    #[test]
    fn when_one_of_two_definitions_goes_the_other_one_counts() {
        let mut h = VersionHistory::new([key("a")]);
        h.start([
            ("a.yaml".into(), file(&[("a", "v2")]).unwrap()),
            ("b.yaml".into(), file(&[("a", "v1")]).unwrap()),
        ]);
        h.step([("a.yaml".into(), None)]);
        assert_eq!(h.finish()[&key("a")], ["v2", "v1"]);
    }

    #[test]
    fn a_version_seen_before_is_not_counted_twice() {
        let mut h = VersionHistory::new([key("a")]);
        h.start([("a.yaml".into(), file(&[("a", "v2")]).unwrap())]);
        h.step([("a.yaml".into(), file(&[("a", "v1")]))]);
        h.step([("a.yaml".into(), file(&[("a", "v2")]))]);
        h.step([("a.yaml".into(), file(&[("a", "v0")]))]);
        assert_eq!(h.finish()[&key("a")], ["v2", "v1"]);
    }
}
