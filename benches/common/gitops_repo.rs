//! A generated GitOps repository for the `verify` benchmarks: 1,000
//! OpenMedModel files (each beside its Deployment) and 5,000 commits on
//! `main` by default, every 50th a merge of a side branch, plus a branch `pr`
//! that bumps five versions and rolls five others back to their previous
//! version. A tenth of the resources never change, so a history walk has to
//! go all the way to the first commit.
//!
//! Shared by `benches/verify.rs` (verify as a library call) and
//! `benches/scale` (the `openmed-op verify` command end to end).

use std::collections::BTreeMap;

use git2::{Oid, Repository, Signature, Time};

const DIRS: usize = 20;

fn manifest(i: usize, version: &str, annotations: &str) -> String {
    format!(
        "apiVersion: openmed.ai/v1alpha1
kind: OpenMedModel
metadata:
  name: svc-{i:04}
  namespace: team-{ns}
{annotations}spec:
  family: pii
  tier: Small
  version: {version}
  replicas: 2
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: svc-{i:04}
  namespace: team-{ns}
spec:
  replicas: 2
  selector:
    matchLabels: {{app: svc-{i:04}}}
  template:
    metadata:
      labels: {{app: svc-{i:04}}}
    spec:
      containers:
      - name: openmed-service
        image: openmed/openmed-service:1.0.0
",
        ns = i % 10
    )
}

fn path(i: usize) -> (String, String) {
    (
        format!("models/d{:02}", i % DIRS),
        format!("svc-{i:04}.yaml"),
    )
}

/// Writes commits by updating one file at a time: only the changed
/// directory's tree and the root are rebuilt.
pub struct Builder {
    repo: Repository,
    dirs: BTreeMap<String, Oid>,
    root: Option<Oid>,
    clock: i64,
}

impl Builder {
    /// A builder writing into `repo` (an empty repository).
    pub fn new(repo: Repository) -> Self {
        repo.set_head("refs/heads/main").expect("HEAD");
        Builder {
            repo,
            dirs: BTreeMap::new(),
            root: None,
            clock: 1_600_000_000,
        }
    }

    /// Writes `files` files and `commits` commits on `main`, then `pr`.
    pub fn build(&mut self, files: usize, commits: usize) {
        // The first commit holds every file at its first version.
        let mut by_dir: BTreeMap<String, Vec<(String, Oid)>> = BTreeMap::new();
        for i in 0..files {
            let (dir, name) = path(i);
            let blob = self.blob(&manifest(i, "OpenMed/pii@r0", ""));
            by_dir.entry(dir).or_default().push((name, blob));
        }
        let models = {
            let mut models = self.repo.treebuilder(None).expect("tree");
            for (dir, entries) in by_dir {
                let mut tree = self.repo.treebuilder(None).expect("tree");
                for (name, blob) in entries {
                    tree.insert(&name, blob, 0o100644).expect("insert");
                }
                let oid = tree.write().expect("write");
                models
                    .insert(dir.trim_start_matches("models/"), oid, 0o040000)
                    .expect("insert");
                self.dirs.insert(dir, oid);
            }
            models.write().expect("write")
        };
        self.root = Some(self.root_with(models));
        let mut main = self.commit(&[]);

        // Resources 0..changing move forward one version per commit.
        let changing = files - files / 10;
        let mut versions = vec![0usize; files];
        for n in 1..commits {
            let i = (n * 7) % changing;
            versions[i] += 1;
            self.update(i, &format!("OpenMed/pii@r{}", versions[i]), "");
            main = if n % 50 == 0 {
                // A merge: the side branch made the change, main merges it.
                let side = self.commit(&[main]);
                self.commit(&[main, side])
            } else {
                self.commit(&[main])
            };
        }
        self.reference("main", main);

        // The pull request: five bumps and five rollbacks to the previous version.
        for (i, v) in versions.iter().enumerate().take(10) {
            if i < 5 {
                self.update(i, &format!("OpenMed/pii@r{}", v + 1), "");
            } else {
                let previous = format!("OpenMed/pii@r{}", v - 1);
                let annotation =
                    format!("  annotations:\n    openmed.ai/rollback-to: {previous}\n");
                self.update(i, &format!("OpenMed/pii@r{v}"), &annotation);
            }
        }
        let pr = self.commit(&[main]);
        self.reference("pr", pr);
    }

    fn blob(&self, text: &str) -> Oid {
        self.repo.blob(text.as_bytes()).expect("blob")
    }

    fn update(&mut self, i: usize, version: &str, annotations: &str) {
        let (dir, name) = path(i);
        let blob = self.blob(&manifest(i, version, annotations));
        let old = self.repo.find_tree(self.dirs[&dir]).expect("dir tree");
        let mut tree = self.repo.treebuilder(Some(&old)).expect("tree");
        tree.insert(&name, blob, 0o100644).expect("insert");
        let oid = tree.write().expect("write");
        self.dirs.insert(dir.clone(), oid);
        let root = self.repo.find_tree(self.root.expect("root")).expect("root");
        let models = root.get_name("models").expect("models").id();
        let models = self.repo.find_tree(models).expect("models");
        let mut models = self.repo.treebuilder(Some(&models)).expect("tree");
        models
            .insert(dir.trim_start_matches("models/"), oid, 0o040000)
            .expect("insert");
        let models = models.write().expect("write");
        self.root = Some(self.root_with(models));
    }

    fn root_with(&self, models: Oid) -> Oid {
        let mut root = self.repo.treebuilder(None).expect("tree");
        root.insert("models", models, 0o040000).expect("insert");
        root.write().expect("write")
    }

    fn commit(&mut self, parents: &[Oid]) -> Oid {
        self.clock += 60;
        let who = Signature::new("Bench", "bench@example.com", &Time::new(self.clock, 0))
            .expect("signature");
        let tree = self.repo.find_tree(self.root.expect("root")).expect("tree");
        let parents: Vec<git2::Commit> = parents
            .iter()
            .map(|p| self.repo.find_commit(*p).expect("parent"))
            .collect();
        let refs: Vec<&git2::Commit> = parents.iter().collect();
        self.repo
            .commit(None, &who, &who, "change", &tree, &refs)
            .expect("commit")
    }

    fn reference(&self, branch: &str, oid: Oid) {
        self.repo
            .reference(&format!("refs/heads/{branch}"), oid, true, "bench")
            .expect("reference");
    }
}
