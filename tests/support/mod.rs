//! Git repositories built with git2 for the `verify` tests: whole trees
//! written per commit, branches moved explicitly, deterministic timestamps.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::path::Path;

use git2::{Oid, Repository, Signature, Time};

/// A repository in a temporary directory.
pub struct TestRepo {
    pub dir: tempfile::TempDir,
    pub repo: Repository,
    clock: Cell<i64>,
}

impl TestRepo {
    /// A repository with a working directory.
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        Self::with(dir, repo)
    }

    /// A bare repository whose HEAD is `main`.
    pub fn bare() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init_bare(dir.path()).unwrap();
        Self::with(dir, repo)
    }

    fn with(dir: tempfile::TempDir, repo: Repository) -> Self {
        repo.set_head("refs/heads/main").unwrap();
        TestRepo {
            dir,
            repo,
            clock: Cell::new(1_700_000_000),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn path_str(&self) -> &str {
        self.path().to_str().unwrap()
    }

    /// Commits exactly `files` as the tree, with the tip of `branch` (if
    /// any) as parent, and moves `branch` to it.
    pub fn commit(&self, branch: &str, files: &[(&str, &str)]) -> Oid {
        let parent = self.tip(branch);
        self.commit_on(branch, &parent.into_iter().collect::<Vec<_>>(), files)
    }

    /// Commits `files` with `parents` (the first is the first parent) and
    /// moves `branch` to it.
    pub fn commit_on(&self, branch: &str, parents: &[Oid], files: &[(&str, &str)]) -> Oid {
        let map: BTreeMap<&str, &[u8]> = files.iter().map(|(p, t)| (*p, t.as_bytes())).collect();
        let tree = self.repo.find_tree(self.tree(&map)).unwrap();
        let now = self.clock.get() + 60;
        self.clock.set(now);
        let who = Signature::new("Test", "test@example.com", &Time::new(now, 0)).unwrap();
        let parents: Vec<git2::Commit> = parents
            .iter()
            .map(|p| self.repo.find_commit(*p).unwrap())
            .collect();
        let refs: Vec<&git2::Commit> = parents.iter().collect();
        let oid = self
            .repo
            .commit(None, &who, &who, "change", &tree, &refs)
            .unwrap();
        self.repo
            .reference(&format!("refs/heads/{branch}"), oid, true, "test")
            .unwrap();
        oid
    }

    /// The commit `branch` points at.
    pub fn tip(&self, branch: &str) -> Option<Oid> {
        self.repo
            .find_reference(&format!("refs/heads/{branch}"))
            .ok()
            .and_then(|r| r.target())
    }

    /// Checks `branch` out into the working directory (files and index).
    pub fn checkout(&self, branch: &str) {
        self.repo.set_head(&format!("refs/heads/{branch}")).unwrap();
        self.repo
            .checkout_head(Some(git2::build::CheckoutBuilder::new().force()))
            .unwrap();
    }

    fn tree(&self, files: &BTreeMap<&str, &[u8]>) -> Oid {
        let mut blobs = Vec::new();
        let mut dirs: BTreeMap<&str, BTreeMap<&str, &[u8]>> = BTreeMap::new();
        for (path, content) in files {
            match path.split_once('/') {
                Some((dir, rest)) => {
                    dirs.entry(dir).or_default().insert(rest, content);
                }
                None => blobs.push((*path, *content)),
            }
        }
        let mut builder = self.repo.treebuilder(None).unwrap();
        for (name, content) in blobs {
            let oid = self.repo.blob(content).unwrap();
            builder.insert(name, oid, 0o100644).unwrap();
        }
        for (name, sub) in dirs {
            let oid = self.tree(&sub);
            builder.insert(name, oid, 0o040000).unwrap();
        }
        builder.write().unwrap()
    }
}
