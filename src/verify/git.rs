//! Reading Git for `verify`: revisions, trees, blobs and first-parent history.
//!
//! Everything is read from the object database with libgit2 (through
//! `git2`), never by checking out, so `verify` works the same on a bare
//! repository, a detached HEAD or a CI clone. This module decides nothing:
//! it lists files and hands their bytes over; the rules are in
//! [`super::rules`] and the history state is in [`super::history`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use git2::{Commit, DiffOptions, ObjectType, Oid, Repository, Tree};

use super::history::{Entry, VersionHistory};

/// Opens the repository at `path` or in a directory above it (bare or not).
pub fn open(path: &Path) -> Result<Repository, git2::Error> {
    skip_unreadable_user_config();
    Repository::discover(path)
}

/// A user configuration file that exists but cannot be read (run as
/// another user with `HOME=/root`) would make libgit2 refuse to open any
/// repository. `verify` reads objects and needs nothing from it, so, as
/// git itself does, it warns and goes on without that file.
fn skip_unreadable_user_config() {
    use std::sync::Once;
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let home = std::env::var_os("HOME").map(PathBuf::from);
        let xdg = std::env::var_os("XDG_CONFIG_HOME")
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join(".config")));
        let levels = [
            (
                git2::ConfigLevel::Global,
                home.map(|h| h.join(".gitconfig")),
            ),
            (git2::ConfigLevel::XDG, xdg.map(|x| x.join("git/config"))),
        ];
        for (level, file) in levels {
            let Some(file) = file else { continue };
            match std::fs::metadata(&file) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    eprintln!(
                        "openmed-op: warning: cannot read {}: {e}; going on without it",
                        file.display()
                    );
                    // SAFETY: libgit2's global options are set once, before
                    // this process opens any repository or starts threads
                    // that use libgit2.
                    let _ = unsafe { git2::opts::set_search_path(level, "") };
                }
                _ => {}
            }
        }
    });
}

/// The commit `spec` names: a commit id, a branch, a tag, `HEAD~2`, ...
/// A name of a tree or a blob is said in words, not in libgit2's.
pub fn commit<'r>(repo: &'r Repository, spec: &str) -> Result<Commit<'r>, git2::Error> {
    let object = repo.revparse_single(spec)?;
    let kind = object.kind();
    object.peel_to_commit().map_err(|e| match kind {
        Some(kind @ (ObjectType::Tree | ObjectType::Blob)) => git2::Error::new(
            e.code(),
            e.class(),
            format!(
                "it names a {}, not a commit (a revision is a commit, a branch, a tag or HEAD~N)",
                kind.str()
            ),
        ),
        _ => e,
    })
}

/// The tip of the repository's default branch, when one can be found:
/// `origin/HEAD`; for a bare repository its `HEAD`; the branch named by
/// `init.defaultBranch`; then `main` or `master`, local or on `origin`.
pub fn default_branch(repo: &Repository) -> Option<Oid> {
    let mut candidates = vec!["refs/remotes/origin/HEAD".to_owned()];
    if repo.is_bare()
        && let Ok(head) = repo.find_reference("HEAD")
        && let Ok(Some(target)) = head.symbolic_target()
    {
        candidates.push(target.to_owned());
    }
    let mut names = Vec::new();
    if let Ok(name) = repo
        .config()
        .and_then(|c| c.get_string("init.defaultBranch"))
    {
        names.push(name);
    }
    names.extend(["main".to_owned(), "master".to_owned()]);
    for name in names {
        candidates.push(format!("refs/heads/{name}"));
        candidates.push(format!("refs/remotes/origin/{name}"));
    }
    candidates.iter().find_map(|name| {
        let reference = repo.find_reference(name).ok()?.resolve().ok()?;
        Some(reference.peel_to_commit().ok()?.id())
    })
}

/// Why the default BASE is what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BaseChoice {
    /// Named with `--base`.
    Given(Oid),
    /// The merge base of REV with the default branch.
    MergeBase(Oid),
    /// REV's first parent (REV is on the default branch, or none was found).
    FirstParent(Oid),
    /// The commit checked out (`--worktree`).
    Head(Oid),
    /// REV has no parent in this repository: a root commit, or the edge of a
    /// shallow clone.
    None {
        /// The repository is a shallow clone.
        shallow: bool,
    },
}

impl BaseChoice {
    /// The chosen commit.
    pub fn oid(self) -> Option<Oid> {
        match self {
            BaseChoice::Given(o)
            | BaseChoice::MergeBase(o)
            | BaseChoice::FirstParent(o)
            | BaseChoice::Head(o) => Some(o),
            BaseChoice::None { .. } => None,
        }
    }
}

/// The default BASE of `rev`: its merge base with the default branch when
/// that is not `rev` itself, else its first parent.
pub fn default_base(repo: &Repository, rev: &Commit) -> BaseChoice {
    if let Some(tip) = default_branch(repo)
        && let Ok(base) = repo.merge_base(rev.id(), tip)
        && base != rev.id()
    {
        return BaseChoice::MergeBase(base);
    }
    match rev.parent(0) {
        Ok(parent) => BaseChoice::FirstParent(parent.id()),
        Err(_) => BaseChoice::None {
            shallow: repo.is_shallow(),
        },
    }
}

/// The default BASE of the files on disk: the merge base of HEAD with the
/// default branch, else HEAD (the files on disk are a commit on top of it).
pub fn worktree_base(repo: &Repository) -> BaseChoice {
    let Ok(head) = repo.head().and_then(|h| h.peel_to_commit()) else {
        return BaseChoice::None { shallow: false };
    };
    if let Some(tip) = default_branch(repo)
        && let Ok(base) = repo.merge_base(head.id(), tip)
    {
        return BaseChoice::MergeBase(base);
    }
    BaseChoice::Head(head.id())
}

/// Every blob of `tree` whose path `keep` accepts, as (path, blob id),
/// sorted by path.
///
/// The walk is its own (a stack, not recursion), because a pull request
/// can hold anything: a name that is not UTF-8 is still a file GitOps tools
/// apply, so it is checked under its lossy spelling rather than skipped or
/// allowed to stop the walk; a tree thousands of levels deep does not
/// exhaust the stack; submodules (commits) are not followed.
pub fn files(
    repo: &Repository,
    tree: &Tree,
    keep: &dyn Fn(&str) -> bool,
) -> Result<Vec<(String, Oid)>, git2::Error> {
    let mut files = Vec::new();
    let mut pending = vec![(String::new(), tree.clone())];
    while let Some((dir, tree)) = pending.pop() {
        for entry in tree.iter() {
            let path = format!("{dir}{}", String::from_utf8_lossy(entry.name_bytes()));
            match entry.kind() {
                Some(ObjectType::Blob) if keep(&path) => files.push((path, entry.id())),
                Some(ObjectType::Tree) => {
                    pending.push((format!("{path}/"), repo.find_tree(entry.id())?))
                }
                _ => {}
            }
        }
    }
    files.sort();
    Ok(files)
}

/// The bytes of a blob.
pub fn blob(repo: &Repository, oid: Oid) -> Result<Vec<u8>, git2::Error> {
    Ok(repo.find_blob(oid)?.content().to_vec())
}

/// How a history walk ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WalkEnd {
    /// Every wanted resource had two versions.
    Found,
    /// The first commit of the repository was reached.
    Root,
    /// The edge of a shallow clone was reached: older history is missing.
    Shallow,
}

/// Walks the first-parent history of `base` once, feeding `history` with
/// the files that change from each commit to its parent, until it is done or
/// history ends. `parse` turns a blob (path, bytes) into the resources it
/// holds; it is called once per distinct blob.
pub fn walk_first_parent(
    repo: &Repository,
    base: &Commit,
    keep: &dyn Fn(&str) -> bool,
    history: &mut VersionHistory,
    mut parse: impl FnMut(&str, &[u8]) -> Vec<Entry>,
) -> Result<WalkEnd, git2::Error> {
    let mut cache: HashMap<Oid, Arc<Vec<Entry>>> = HashMap::new();
    let mut options = DiffOptions::new();
    options.ignore_submodules(true).skip_binary_check(true);
    let mut commit = base.clone();
    let mut tree = commit.tree()?;
    loop {
        if history.done() {
            return Ok(WalkEnd::Found);
        }
        if commit.parent_count() == 0 {
            return Ok(if repo.is_shallow() && is_shallow_edge(repo, commit.id()) {
                WalkEnd::Shallow
            } else {
                WalkEnd::Root
            });
        }
        let Ok(parent) = commit.parent(0) else {
            return Ok(WalkEnd::Shallow);
        };
        let parent_tree = parent.tree()?;
        let diff = repo.diff_tree_to_tree(Some(&parent_tree), Some(&tree), Some(&mut options))?;
        let mut changes = Vec::new();
        for delta in diff.deltas() {
            let old = delta.old_file();
            let Some(path) = old
                .path()
                .or_else(|| delta.new_file().path())
                .and_then(Path::to_str)
            else {
                continue;
            };
            if !keep(path) {
                continue;
            }
            let now = if old.exists() {
                let id = old.id();
                Some(match cache.get(&id) {
                    Some(entries) => entries.clone(),
                    None => {
                        let entries = match repo.find_blob(id) {
                            Ok(blob) => Arc::new(parse(path, blob.content())),
                            Err(_) => Arc::new(Vec::new()),
                        };
                        cache.insert(id, entries.clone());
                        entries
                    }
                })
            } else {
                None
            };
            changes.push((path.to_owned(), now));
        }
        history.step(changes);
        commit = parent;
        tree = parent_tree;
    }
}

/// True when `oid` is listed in the repository's `shallow` file.
fn is_shallow_edge(repo: &Repository, oid: Oid) -> bool {
    let file = repo.path().join("shallow");
    std::fs::read_to_string(file)
        .map(|text| text.lines().any(|l| l.trim() == oid.to_string()))
        .unwrap_or(true)
}

/// Every file below the working directory that `keep` accepts and Git does
/// not ignore, as (path relative to the root, absolute path), sorted.
pub fn worktree_files(
    repo: &Repository,
    keep: &dyn Fn(&str) -> bool,
) -> Result<Vec<(String, PathBuf)>, std::io::Error> {
    let Some(root) = repo.workdir() else {
        return Err(std::io::Error::other(
            "--worktree needs a working directory; this repository is bare",
        ));
    };
    let mut files = Vec::new();
    let mut pending = vec![(root.to_path_buf(), String::new())];
    while let Some((dir, prefix)) = pending.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            let relative = format!("{prefix}{name}");
            let kind = entry.file_type()?;
            if kind.is_dir() {
                if name == ".git"
                    || repo
                        .is_path_ignored(format!("{relative}/"))
                        .unwrap_or(false)
                {
                    continue;
                }
                pending.push((entry.path(), format!("{relative}/")));
            } else if kind.is_file()
                && keep(&relative)
                && !repo.is_path_ignored(&relative).unwrap_or(false)
            {
                files.push((relative, entry.path()));
            }
        }
    }
    files.sort();
    Ok(files)
}
