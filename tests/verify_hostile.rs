//! `verify` on hostile repositories, as a pull request from anyone can make
//! them: corrupt objects, a huge blob, a deep tree, symlinks, submodules and
//! paths that are not UTF-8. Whatever the repository holds, verify answers
//! with one of its exit codes (0, 1, 2) and a message, never a panic, never
//! reads outside the repository, and stays within memory and time a CI job
//! has.

#[allow(dead_code)] // the Git helpers are shared with tests/verify.rs
mod support;

use std::os::unix::ffi::OsStrExt;
use std::process::{Command, Output, Stdio};

use git2::{Oid, Repository, Signature, Time};
use support::TestRepo;

fn verify(repo: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_openmed-op"))
        .args(["verify", "--repo", repo.to_str().unwrap()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Exit 0, 1 or 2 (never a panic, 101, or a signal), and a message on
/// stderr whenever it is 2.
fn answered_cleanly(out: &Output) -> i32 {
    let code = out
        .status
        .code()
        .unwrap_or_else(|| panic!("killed by a signal: {out:?}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        [0, 1, 2].contains(&code),
        "exit {code}\n{stderr}\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    if code == 2 {
        assert!(!stderr.trim().is_empty(), "exit 2 says why");
    }
    code
}

fn model(name: &str, version: &str) -> String {
    format!(
        "apiVersion: openmed.ai/v1alpha1\nkind: OpenMedModel\nmetadata:\n  name: {name}\nspec:\n  family: pii\n  tier: Small\n  version: {version}\n"
    )
}

/// Commits a tree made by `build` on `main`, after a first commit holding
/// a valid model (so there is a base to compare with).
fn commit_raw(repo: &Repository, build: impl FnOnce(&Repository) -> Oid) -> Oid {
    let who = Signature::new("Test", "test@example.com", &Time::new(1_700_000_000, 0)).unwrap();
    let base_tree = {
        let blob = repo
            .blob(model("svc", "OpenMed/pii-v1").as_bytes())
            .unwrap();
        let mut models = repo.treebuilder(None).unwrap();
        models.insert("svc.yaml", blob, 0o100644).unwrap();
        let models = models.write().unwrap();
        let mut root = repo.treebuilder(None).unwrap();
        root.insert("models", models, 0o040000).unwrap();
        root.write().unwrap()
    };
    let base = repo
        .commit(
            None,
            &who,
            &who,
            "base",
            &repo.find_tree(base_tree).unwrap(),
            &[],
        )
        .unwrap();
    let tree = build(repo);
    let head = repo
        .commit(
            None,
            &who,
            &who,
            "hostile",
            &repo.find_tree(tree).unwrap(),
            &[&repo.find_commit(base).unwrap()],
        )
        .unwrap();
    repo.reference("refs/heads/main", base, true, "base")
        .unwrap();
    repo.reference("refs/heads/pr", head, true, "pr").unwrap();
    head
}

/// A root tree holding `models/` with the given entries.
fn models_tree(repo: &Repository, entries: &[(&[u8], Oid, i32)]) -> Oid {
    let mut models = repo.treebuilder(None).unwrap();
    for (name, oid, mode) in entries {
        models
            .insert(std::ffi::OsStr::from_bytes(name), *oid, *mode)
            .unwrap();
    }
    let models = models.write().unwrap();
    let mut root = repo.treebuilder(None).unwrap();
    root.insert("models", models, 0o040000).unwrap();
    root.write().unwrap()
}

#[test]
fn a_symlink_is_read_as_what_git_stores_never_followed() {
    let repo = TestRepo::bare();
    commit_raw(&repo.repo, |r| {
        let good = r.blob(model("svc", "OpenMed/pii-v2").as_bytes()).unwrap();
        let link = r.blob(b"/etc/passwd").unwrap();
        models_tree(
            r,
            &[
                (b"svc.yaml", good, 0o100644),
                (b"passwd.yaml", link, 0o120000),
            ],
        )
    });
    let out = verify(repo.path(), &["--rev", "pr", "--base", "main"]);
    answered_cleanly(&out);
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!all.contains("root:"), "a symlink was followed: {all}");
}

#[test]
fn a_submodule_is_skipped() {
    let repo = TestRepo::bare();
    commit_raw(&repo.repo, |r| {
        let good = r.blob(model("svc", "OpenMed/pii-v2").as_bytes()).unwrap();
        // A gitlink to a commit this repository does not have.
        let elsewhere = Oid::from_str("1234567890abcdef1234567890abcdef12345678").unwrap();
        models_tree(
            r,
            &[
                (b"svc.yaml", good, 0o100644),
                (b"vendored.yaml", elsewhere, 0o160000),
            ],
        )
    });
    let out = verify(repo.path(), &["--rev", "pr", "--base", "main"]);
    assert_eq!(answered_cleanly(&out), 0, "{out:?}");
}

#[test]
fn a_path_that_is_not_utf8_is_answered_cleanly() {
    let repo = TestRepo::bare();
    commit_raw(&repo.repo, |r| {
        let good = r.blob(model("svc", "OpenMed/pii-v2").as_bytes()).unwrap();
        let other = r.blob(model("other", "OpenMed/pii-v1").as_bytes()).unwrap();
        models_tree(
            r,
            &[
                (b"svc.yaml", good, 0o100644),
                (b"\xff\xfe.yaml", other, 0o100644),
            ],
        )
    });
    let out = verify(repo.path(), &["--rev", "pr", "--base", "main"]);
    assert_eq!(answered_cleanly(&out), 0);
    // Both files are checked: a model cannot hide behind its file name.
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("2 OpenMedModels"), "{stdout}");
}

#[test]
fn a_directory_that_is_not_utf8_is_answered_cleanly() {
    let repo = TestRepo::bare();
    commit_raw(&repo.repo, |r| {
        let good = r.blob(model("svc", "OpenMed/pii-v2").as_bytes()).unwrap();
        let other = r.blob(model("other", "OpenMed/pii-v1").as_bytes()).unwrap();
        let mut odd = r.treebuilder(None).unwrap();
        odd.insert("other.yaml", other, 0o100644).unwrap();
        let odd = odd.write().unwrap();
        let mut models = r.treebuilder(None).unwrap();
        models.insert("svc.yaml", good, 0o100644).unwrap();
        models
            .insert(std::ffi::OsStr::from_bytes(b"\xfe\xff"), odd, 0o040000)
            .unwrap();
        let models = models.write().unwrap();
        let mut root = r.treebuilder(None).unwrap();
        root.insert("models", models, 0o040000).unwrap();
        root.write().unwrap()
    });
    let out = verify(repo.path(), &["--rev", "pr", "--base", "main"]);
    assert_eq!(answered_cleanly(&out), 0);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("2 OpenMedModels"), "{stdout}");
}

#[test]
fn a_deep_tree_does_not_exhaust_the_stack() {
    let repo = TestRepo::bare();
    commit_raw(&repo.repo, |r| {
        let blob = r.blob(model("deep", "OpenMed/pii-v1").as_bytes()).unwrap();
        let mut tree = {
            let mut b = r.treebuilder(None).unwrap();
            b.insert("deep.yaml", blob, 0o100644).unwrap();
            b.write().unwrap()
        };
        for _ in 0..400 {
            let mut b = r.treebuilder(None).unwrap();
            b.insert("d", tree, 0o040000).unwrap();
            tree = b.write().unwrap();
        }
        let good = r.blob(model("svc", "OpenMed/pii-v2").as_bytes()).unwrap();
        let mut models = r.treebuilder(None).unwrap();
        models.insert("svc.yaml", good, 0o100644).unwrap();
        let models = models.write().unwrap();
        let mut root = r.treebuilder(None).unwrap();
        root.insert("models", models, 0o040000).unwrap();
        root.insert("d", tree, 0o040000).unwrap();
        root.write().unwrap()
    });
    let out = verify(repo.path(), &["--rev", "pr", "--base", "main"]);
    answered_cleanly(&out);
}

#[test]
fn a_huge_blob_is_answered_cleanly() {
    let repo = TestRepo::bare();
    commit_raw(&repo.repo, |r| {
        let good = r.blob(model("svc", "OpenMed/pii-v2").as_bytes()).unwrap();
        // 64 MiB of one YAML comment line.
        let mut huge = b"# ".to_vec();
        huge.resize(64 << 20, b'x');
        huge.push(b'\n');
        let big = r.blob(&huge).unwrap();
        models_tree(
            r,
            &[(b"svc.yaml", good, 0o100644), (b"huge.yaml", big, 0o100644)],
        )
    });
    let out = verify(repo.path(), &["--rev", "pr", "--base", "main"]);
    answered_cleanly(&out);
}

#[test]
fn a_corrupt_object_is_an_error_that_says_so() {
    let repo = TestRepo::bare();
    let mut damaged = None;
    commit_raw(&repo.repo, |r| {
        let good = r.blob(model("svc", "OpenMed/pii-v3").as_bytes()).unwrap();
        damaged = Some(good);
        models_tree(r, &[(b"svc.yaml", good, 0o100644)])
    });
    // Overwrite the loose object's compressed bytes.
    let oid = damaged.unwrap().to_string();
    let path = repo.path().join("objects").join(&oid[..2]).join(&oid[2..]);
    let mut perms = std::fs::metadata(&path).unwrap().permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    perms.set_readonly(false);
    std::fs::set_permissions(&path, perms).unwrap();
    std::fs::write(&path, b"this is not a zlib stream").unwrap();
    let out = verify(repo.path(), &["--rev", "pr", "--base", "main"]);
    assert_eq!(answered_cleanly(&out), 2, "{out:?}");
}
