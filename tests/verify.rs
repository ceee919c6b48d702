//! `openmed-op verify` as CI and people run it: the binary, real Git
//! repositories built with git2 (merges, renames, moves, bare, shallow),
//! `--status` files and directories, the three output formats, exit codes,
//! `--worktree` and `--watch`.

mod support;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;
use support::TestRepo;

fn openmed_op(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_openmed-op"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Runs `verify --repo <repo> <args>`.
fn verify(repo: &TestRepo, args: &[&str]) -> Output {
    let mut all = vec!["verify", "--repo", repo.path_str()];
    all.extend_from_slice(args);
    openmed_op(&all)
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8(out.stderr.clone()).unwrap()
}

fn code(out: &Output) -> i32 {
    out.status.code().unwrap()
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", stdout(out), stderr(out)))
}

/// An OpenMedModel named `name` in namespace `team` asking for `version`.
fn model(name: &str, version: &str) -> String {
    model_with(name, version, "")
}

/// The same, with extra lines under `metadata` (annotations).
fn model_with(name: &str, version: &str, metadata: &str) -> String {
    format!(
        "apiVersion: openmed.ai/v1alpha1\nkind: OpenMedModel\nmetadata:\n  name: {name}\n  namespace: team\n{metadata}spec:\n  family: pii\n  tier: Small\n  version: {version}\n"
    )
}

fn rollback_to(version: &str) -> String {
    format!("  annotations:\n    openmed.ai/rollback-to: {version}\n")
}

/// main: svc at v1, then v2; returns the repository.
fn two_versions() -> TestRepo {
    let repo = TestRepo::new();
    repo.commit("main", &[("models/svc.yaml", &model("svc", "v1"))]);
    repo.commit("main", &[("models/svc.yaml", &model("svc", "v2"))]);
    repo
}

/// Checks out `branch` off main's tip and commits `files` on it.
fn pull_request(repo: &TestRepo, files: &[(&str, &str)]) {
    let main = repo.tip("main").unwrap();
    repo.commit_on("pr", &[main], files);
}

#[test]
fn a_clean_version_bump_exits_0_and_names_base_and_rev() {
    let repo = two_versions();
    let base = repo.tip("main").unwrap();
    pull_request(
        &repo,
        &[("models/svc.yaml", &model("svc", "OpenMed/pii-v3"))],
    );
    let rev = repo.tip("pr").unwrap();
    let out = verify(&repo, &["--rev", "pr"]);
    assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));
    let text = stdout(&out);
    assert_eq!(
        text,
        format!(
            "openmed-op verify: no problems; 1 OpenMedModel at REV {} checked against BASE {}\n",
            &rev.to_string()[..12],
            &base.to_string()[..12]
        )
    );
}

#[test]
fn a_rollback_is_checked_against_first_parent_history_not_merged_branches() {
    let repo = TestRepo::new();
    let c1 = repo.commit("main", &[("svc.yaml", &model("svc", "v1"))]);
    let c2 = repo.commit("main", &[("svc.yaml", &model("svc", "v2"))]);
    // A side branch tried an experiment after c2 (later timestamps), then
    // landed v3 through a merge.
    repo.commit_on("side", &[c1], &[("svc.yaml", &model("svc", "experiment"))]);
    let side = repo.commit("side", &[("svc.yaml", &model("svc", "v3"))]);
    repo.commit_on("main", &[c2, side], &[("svc.yaml", &model("svc", "v3"))]);

    // First-parent history of main: v3 (merge), v2, v1. Retained: v3, v2.
    pull_request(
        &repo,
        &[("svc.yaml", &model_with("svc", "v3", &rollback_to("v2")))],
    );
    let out = verify(&repo, &["--rev", "pr", "--format", "json"]);
    assert_eq!(code(&out), 0, "{}", stdout(&out));
    let report = json(&out);
    assert_eq!(
        report["resources"][0]["retainedVersions"],
        serde_json::json!(["v3", "v2"])
    );
    assert_eq!(report["resources"][0]["retainedVersionsSource"], "history");

    pull_request(
        &repo,
        &[(
            "svc.yaml",
            &model_with("svc", "v3", &rollback_to("experiment")),
        )],
    );
    let out = verify(&repo, &["--rev", "pr"]);
    assert_eq!(code(&out), 1);
    let text = stdout(&out);
    assert!(
        text.contains("svc.yaml:7: document 1: error[RollbackNotRetained]: team/svc"),
        "{text}"
    );
    assert!(text.contains("it accepts only \"v3\" or \"v2\""), "{text}");
    assert!(text.contains("history-derived"), "{text}");
    assert!(text.contains("fix: openmed.ai/rollback-to: v2"), "{text}");
    assert!(
        text.contains(
            "note: rollback targets of 1 resource were checked against history-derived versions"
        ),
        "{text}"
    );
}

#[test]
fn renames_and_moves_between_multi_document_files_keep_a_resource_and_its_history() {
    let repo = TestRepo::new();
    let other = model("other", "o1");
    repo.commit(
        "main",
        &[("a.yaml", &model("svc", "v1")), ("b.yaml", &other)],
    );
    repo.commit(
        "main",
        &[("a.yaml", &model("svc", "v2")), ("b.yaml", &other)],
    );
    // Renamed.
    repo.commit(
        "main",
        &[("models/svc.yml", &model("svc", "v2")), ("b.yaml", &other)],
    );
    // Moved into a multi-document file beside another resource.
    let both = format!("{other}---\n{}", model("svc", "v2"));
    repo.commit("main", &[("models/all.yaml", &both)]);

    let both = format!(
        "{other}---\n{}",
        model_with("svc", "v2", &rollback_to("v1"))
    );
    pull_request(&repo, &[("models/all.yaml", &both)]);
    let out = verify(&repo, &["--rev", "pr", "--format", "json"]);
    assert_eq!(code(&out), 0, "{}", stdout(&out));
    let report = json(&out);
    assert_eq!(
        report["summary"]["warnings"], 0,
        "no ModelDeleted for a move"
    );
    let svc = &report["resources"][1];
    assert_eq!(svc["resource"], "team/svc");
    assert_eq!(svc["file"], "models/all.yaml");
    assert_eq!(svc["document"], 2);
    assert_eq!(svc["retainedVersions"], serde_json::json!(["v2", "v1"]));

    // The second document's problem names document 2 and its own line.
    let broken = format!(
        "{other}---\n{}",
        model("svc", "v2").replace("Small", "Huge")
    );
    pull_request(&repo, &[("models/all.yaml", &broken)]);
    let out = verify(&repo, &["--rev", "pr"]);
    assert_eq!(code(&out), 1);
    assert!(
        stdout(&out).contains(
            "models/all.yaml:18: document 2: error[InvalidSpec]: team/svc: spec.tier: \"Huge\" is not one of"
        ),
        "{}",
        stdout(&out)
    );
}

#[test]
fn a_bare_repository_is_read_without_a_checkout() {
    let repo = TestRepo::bare();
    repo.commit("main", &[("svc.yaml", &model("svc", "v1"))]);
    repo.commit("main", &[("svc.yaml", &model("svc", "v2"))]);
    pull_request(
        &repo,
        &[("svc.yaml", &model_with("svc", "v3", &rollback_to("v1")))],
    );
    let out = verify(&repo, &["--rev", "pr", "--format", "json"]);
    assert_eq!(code(&out), 1, "{}{}", stdout(&out), stderr(&out));
    let report = json(&out);
    assert_eq!(report["base"], repo.tip("main").unwrap().to_string());
    assert_eq!(report["rev"], repo.tip("pr").unwrap().to_string());
    let rules: Vec<&str> = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["rule"].as_str().unwrap())
        .collect();
    assert_eq!(rules, ["OneIntentPerChange"], "{report:#}");
}

#[test]
fn a_detached_commit_id_and_an_explicit_base_work() {
    let repo = two_versions();
    let v1 = repo
        .repo
        .revparse_single("main~1")
        .unwrap()
        .id()
        .to_string();
    pull_request(&repo, &[("models/svc.yaml", &model("svc", "v3"))]);
    let rev = repo.tip("pr").unwrap().to_string();
    let out = verify(&repo, &["--rev", &rev, "--base", &v1, "--format", "json"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(json(&out)["base"], v1);
}

#[test]
fn on_the_default_branch_the_base_is_the_first_parent() {
    let repo = two_versions();
    let first = repo
        .repo
        .revparse_single("main~1")
        .unwrap()
        .id()
        .to_string();
    let out = verify(&repo, &["--rev", "main", "--format", "json"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(json(&out)["base"], first);
}

const STATUS_LIST: &str = "\
apiVersion: v1
kind: List
items:
- apiVersion: openmed.ai/v1alpha1
  kind: OpenMedModel
  metadata:
    name: svc
    namespace: team
  spec: {family: pii, tier: Small, version: v3}
  status:
    phase: RolledBack
    desiredVersion: v3
    activeVersion: v2
    lastSuccessfulSpec: {family: pii, tier: Small, version: v2}
    previousSuccessfulSpec: {family: pii, tier: Small, version: v1}
    rollbackSpec: {family: pii, tier: Small, version: v2}
";

#[test]
fn status_from_a_file_gives_the_retained_versions_and_the_fix_after_a_rollback() {
    let repo = two_versions();
    repo.commit("main", &[("models/svc.yaml", &model("svc", "v3"))]);
    // The cluster then rolled v3 back; main's next change is elsewhere.
    repo.commit(
        "main",
        &[
            ("models/svc.yaml", &model("svc", "v3")),
            ("notes.yaml", "a: 1\n"),
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    let status = dir.path().join("status.yaml");
    std::fs::write(&status, STATUS_LIST).unwrap();

    // Git still asks for v3, which the cluster rolled back from.
    let out = verify(
        &repo,
        &["--rev", "main", "--status", status.to_str().unwrap()],
    );
    assert_eq!(code(&out), 0, "a warning: {}", stdout(&out));
    let text = stdout(&out);
    assert!(
        text.starts_with(
            "models/svc.yaml:9: document 1: warning[GitBehindRollback]: team/svc: spec.version:"
        ),
        "{text}"
    );
    assert!(text.contains("\n  fix: version: v2\n"), "{text}");

    // Trying v3 again in a new change is an error without a reason...
    pull_request(&repo, &[("models/svc.yaml", &model("svc", "v2"))]);
    let main = repo.tip("pr").unwrap();
    repo.commit_on(
        "retry",
        &[main],
        &[("models/svc.yaml", &model("svc", "v3"))],
    );
    let args = [
        "--rev",
        "retry",
        "--base",
        "pr",
        "--status",
        status.to_str().unwrap(),
    ];
    let out = verify(&repo, &args);
    assert_eq!(code(&out), 1);
    assert!(
        stdout(&out).contains("error[FailedVersionRetried]"),
        "{}",
        stdout(&out)
    );
    // ...and accepted with one.
    let reason = "  annotations:\n    openmed.ai/retry-reason: the tokenizer bug is fixed\n";
    repo.commit_on(
        "retry",
        &[main],
        &[("models/svc.yaml", &model_with("svc", "v3", reason))],
    );
    let out = verify(&repo, &args);
    assert_eq!(code(&out), 0, "{}", stdout(&out));

    // A rollback is judged against the cluster's retained versions.
    repo.commit_on(
        "rollback",
        &[main],
        &[(
            "models/svc.yaml",
            &model_with("svc", "v2", &rollback_to("v1")),
        )],
    );
    let out = verify(
        &repo,
        &[
            "--rev",
            "rollback",
            "--base",
            "pr",
            "--status",
            status.to_str().unwrap(),
            "--format",
            "json",
        ],
    );
    assert_eq!(code(&out), 0, "{}", stdout(&out));
    let report = json(&out);
    assert_eq!(report["resources"][0]["retainedVersionsSource"], "status");
    assert_eq!(
        report["resources"][0]["retainedVersions"],
        serde_json::json!(["v2", "v1"])
    );
    assert_eq!(report["notes"], serde_json::json!([]));
}

#[test]
fn status_from_a_directory_of_yaml_and_json_files() {
    let repo = two_versions();
    pull_request(
        &repo,
        &[
            (
                "models/svc.yaml",
                &model_with("svc", "v2", &rollback_to("v0")),
            ),
            (
                "models/api.yaml",
                &model_with("api", "a2", &rollback_to("a1")),
            ),
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("svc.yaml"),
        STATUS_LIST.replace("version: v1}", "version: v0}"),
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("more")).unwrap();
    let api = serde_json::json!({
        "apiVersion": "openmed.ai/v1alpha1", "kind": "OpenMedModel",
        "metadata": {"name": "api", "namespace": "team"},
        "status": {"phase": "Ready",
                   "lastSuccessfulSpec": {"family": "pii", "tier": "Small", "version": "a2"},
                   "previousSuccessfulSpec": {"family": "pii", "tier": "Small", "version": "a1"}}
    });
    std::fs::write(dir.path().join("more/api.json"), api.to_string()).unwrap();
    std::fs::write(dir.path().join("more/notes.txt"), "not read").unwrap();
    let out = verify(
        &repo,
        &[
            "--rev",
            "pr",
            "--status",
            dir.path().to_str().unwrap(),
            "--format",
            "json",
        ],
    );
    assert_eq!(code(&out), 0, "{}", stdout(&out));
    let report = json(&out);
    for r in report["resources"].as_array().unwrap() {
        assert_eq!(r["retainedVersionsSource"], "status", "{r}");
    }
}

#[test]
fn an_unreadable_or_malformed_status_exits_2() {
    let repo = two_versions();
    let out = verify(&repo, &["--status", "no/such/status.yaml"]);
    assert_eq!(code(&out), 2);
    assert!(
        stderr(&out).contains("--status: no/such/status.yaml: cannot read"),
        "{}",
        stderr(&out)
    );
    assert!(out.stdout.is_empty());

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("status.yaml");
    std::fs::write(&bad, "kind: List\nitems: [unclosed\n").unwrap();
    let out = verify(&repo, &["--status", bad.to_str().unwrap()]);
    assert_eq!(code(&out), 2);
    assert!(stderr(&out).contains("not valid YAML"), "{}", stderr(&out));

    std::fs::write(
        &bad,
        STATUS_LIST.replace("phase: RolledBack", "phase: Melted"),
    )
    .unwrap();
    let out = verify(&repo, &["--status", bad.to_str().unwrap()]);
    assert_eq!(code(&out), 2);
    assert!(
        stderr(&out).contains("team/svc: status cannot be read"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn usage_problems_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let out = openmed_op(&["verify", "--repo", dir.path().to_str().unwrap()]);
    assert_eq!(code(&out), 2);
    assert!(
        stderr(&out).contains("not a Git repository"),
        "{}",
        stderr(&out)
    );

    let repo = two_versions();
    let out = verify(&repo, &["--rev", "no-such-branch"]);
    assert_eq!(code(&out), 2);
    assert!(
        stderr(&out).contains("unknown revision \"no-such-branch\" (--rev)"),
        "{}",
        stderr(&out)
    );
    let out = verify(&repo, &["--base", "v9.9"]);
    assert_eq!(code(&out), 2);
    let out = verify(&repo, &["--include", "a[b"]);
    assert_eq!(code(&out), 2);
    let out = verify(&repo, &["--format", "xml"]);
    assert_eq!(code(&out), 2);
    let out = verify(&repo, &["--rev", "main", "--worktree"]);
    assert_eq!(code(&out), 2, "--rev and --worktree exclude each other");
    let bare = TestRepo::bare();
    bare.commit("main", &[("a.yaml", &model("svc", "v1"))]);
    let out = verify(&bare, &["--worktree"]);
    assert_eq!(code(&out), 2);
    assert!(stderr(&out).contains("bare"), "{}", stderr(&out));
}

#[test]
fn warnings_exit_0_and_strict_makes_them_errors() {
    let repo = TestRepo::new();
    repo.commit(
        "main",
        &[
            ("svc.yaml", &model("svc", "v1")),
            ("old.yaml", &model("old", "v1")),
        ],
    );
    pull_request(&repo, &[("svc.yaml", &model("svc", "latest"))]);
    let out = verify(&repo, &["--rev", "pr"]);
    assert_eq!(code(&out), 0, "{}", stdout(&out));
    let text = stdout(&out);
    // Grouped by file (sorted), a blank line between files.
    let old = text
        .find("old.yaml:4: document 1: warning[ModelDeleted]: team/old")
        .unwrap();
    let svc = text
        .find("svc.yaml:9: document 1: warning[MutableVersion]: team/svc")
        .unwrap();
    assert!(old < svc, "{text}");
    assert!(
        text.contains("ModelDeleted]: team/old: this OpenMedModel is deleted"),
        "{text}"
    );
    assert!(text.contains("\n\nsvc.yaml:9:"), "{text}");
    // MutableVersion for svc, ModelDeleted for old.
    assert!(text.contains("0 errors, 2 warnings in 2 files"), "{text}");

    let out = verify(&repo, &["--rev", "pr", "--strict"]);
    assert_eq!(code(&out), 1);
    assert!(
        stdout(&out).contains("2 errors, 0 warnings"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn errors_come_before_warnings_within_a_file() {
    let repo = two_versions();
    let text = format!(
        "{}---\n{}",
        model("a", "OpenMed/pii:latest"),
        model("b", "v1").replace("tier: Small", "tier: Huge")
    );
    pull_request(
        &repo,
        &[
            ("models/svc.yaml", &model("svc", "v2")),
            ("models/z.yaml", &text),
        ],
    );
    let out = verify(&repo, &["--rev", "pr"]);
    assert_eq!(code(&out), 1);
    let text = stdout(&out);
    let error = text.find("error[InvalidSpec]").unwrap();
    let warning = text.find("warning[MutableVersion]").unwrap();
    assert!(error < warning, "{text}");
}

#[test]
fn json_output_follows_the_documented_schema() {
    let repo = two_versions();
    pull_request(
        &repo,
        &[(
            "models/svc.yaml",
            &model_with("svc", "v2", &rollback_to("v0")),
        )],
    );
    let out = verify(&repo, &["--rev", "pr", "--format", "json"]);
    assert_eq!(code(&out), 1);
    let report = json(&out);
    let keys: Vec<&str> = report
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "schemaVersion",
            "base",
            "rev",
            "summary",
            "resources",
            "findings",
            "notes"
        ]
    );
    assert_eq!(report["schemaVersion"], 1);
    assert_eq!(report["summary"]["errors"], 1);
    assert_eq!(report["summary"]["warnings"], 0);
    assert_eq!(report["summary"]["resources"], 1);
    let finding = &report["findings"][0];
    assert_eq!(
        finding,
        &serde_json::json!({
            "file": "models/svc.yaml",
            "document": 1,
            "line": 7,
            "resource": "team/svc",
            "rule": "RollbackNotRetained",
            "severity": "error",
            "field": "metadata.annotations[\"openmed.ai/rollback-to\"]",
            "message": finding["message"],
            "suggestedFix": "openmed.ai/rollback-to: v1",
        })
    );
    let resource = &report["resources"][0];
    assert_eq!(resource["rollbackTo"], "v0");
    assert_eq!(resource["version"], "v2");
    assert_eq!(resource["line"], 4);
}

#[test]
fn github_output_is_workflow_commands_on_the_changed_lines() {
    let repo = TestRepo::new();
    repo.commit("main", &[("models/svc.yaml", &model("svc", "pii-v1"))]);
    repo.commit("main", &[("models/svc.yaml", &model("svc", "latest"))]);
    pull_request(
        &repo,
        &[(
            "models/svc.yaml",
            &model_with("svc", "latest", &rollback_to("v0%")),
        )],
    );
    let out = verify(&repo, &["--rev", "pr", "--format", "github"]);
    assert_eq!(code(&out), 1);
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    assert!(
        lines[0].starts_with("::error file=models/svc.yaml,line=7,title=RollbackNotRetained::team/svc: metadata.annotations[\"openmed.ai/rollback-to\"]: \"v0%25\" is not a retained version"),
        "{text}"
    );
    assert!(
        lines[0].ends_with("%0Afix: openmed.ai/rollback-to: pii-v1"),
        "{text}"
    );
    assert!(
        lines[1].starts_with("::warning file=models/svc.yaml,line=11,title=MutableVersion::team/svc: spec.version: \"latest\" names \"latest\""),
        "{text}"
    );
    assert!(
        lines[2].starts_with("::notice title=openmed-op verify::rollback targets"),
        "{text}"
    );
    assert!(
        lines[3].starts_with("openmed-op verify: 1 error, 1 warning"),
        "{text}"
    );
}

#[test]
fn include_and_exclude_choose_the_files() {
    let repo = TestRepo::new();
    let broken = model("chart", "v1").replace("tier: Small", "tier: {{ .Values.tier }}");
    repo.commit(
        "main",
        &[
            ("models/svc.yaml", &model("svc", "v1")),
            ("charts/x/templates/model.yaml", &broken),
        ],
    );
    let out = verify(&repo, &["--rev", "main"]);
    assert_eq!(
        code(&out),
        1,
        "a broken file that mentions OpenMedModel is an error"
    );
    assert!(
        stdout(&out).contains("error[InvalidYaml]"),
        "{}",
        stdout(&out)
    );

    let out = verify(&repo, &["--rev", "main", "--exclude", "charts"]);
    assert_eq!(code(&out), 0, "{}", stdout(&out));
    let out = verify(
        &repo,
        &[
            "--rev",
            "main",
            "--include",
            "models/**",
            "--format",
            "json",
        ],
    );
    assert_eq!(code(&out), 0, "{}", stdout(&out));
    assert_eq!(json(&out)["summary"]["resources"], 1);

    // YAML that is not a manifest and never mentions OpenMedModel is ignored.
    repo.commit(
        "main",
        &[
            ("models/svc.yaml", &model("svc", "v1")),
            ("ansible/site.yml", "- hosts: all\n  tasks: []\n"),
        ],
    );
    let out = verify(&repo, &["--rev", "main"]);
    assert_eq!(code(&out), 0, "{}", stdout(&out));
}

#[test]
fn a_shallow_clone_says_history_is_incomplete() {
    let repo = TestRepo::new();
    repo.commit("main", &[("svc.yaml", &model("svc", "v1"))]);
    let edge = repo.commit("main", &[("svc.yaml", &model("svc", "v2"))]);
    repo.commit(
        "main",
        &[("svc.yaml", &model("svc", "v2")), ("x.yaml", "a: 1\n")],
    );
    // What a depth-2 clone records: history before `edge` is not here.
    std::fs::write(repo.repo.path().join("shallow"), format!("{edge}\n")).unwrap();
    pull_request(
        &repo,
        &[("svc.yaml", &model_with("svc", "v2", &rollback_to("v1")))],
    );
    let out = verify(&repo, &["--rev", "pr"]);
    assert_eq!(
        code(&out),
        1,
        "v1 is beyond the shallow edge: {}",
        stdout(&out)
    );
    assert!(
        stdout(&out).contains("note: history is shallow"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn worktree_checks_the_files_on_disk() {
    let repo = two_versions();
    repo.checkout("main");
    let file = repo.path().join("models/svc.yaml");
    std::fs::write(&file, model_with("svc", "v2", &rollback_to("v1"))).unwrap();
    std::fs::write(repo.path().join("ignored.yaml"), "kind: OpenMedModel\n: [").unwrap();
    std::fs::write(repo.path().join(".gitignore"), "ignored.yaml\n").unwrap();
    let out = verify(&repo, &["--worktree", "--format", "json"]);
    assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));
    let report = json(&out);
    assert_eq!(report["rev"], "worktree");
    assert_eq!(report["base"], repo.tip("main").unwrap().to_string());
    assert_eq!(report["resources"][0]["rollbackTo"], "v1");

    std::fs::write(&file, model_with("svc", "v2", &rollback_to("v0"))).unwrap();
    let out = verify(&repo, &["--worktree"]);
    assert_eq!(code(&out), 1);
    assert!(stdout(&out).contains("REV worktree"), "{}", stdout(&out));
}

#[test]
fn help_teaches_the_rules_and_exit_codes() {
    let out = openmed_op(&["verify", "--help"]);
    assert_eq!(code(&out), 0);
    let text = stdout(&out);
    for words in [
        "RollbackNotRetained",
        "GitBehindRollback",
        "--format github",
        "Exit codes: 0 no errors",
    ] {
        assert!(text.contains(words), "{words} missing in {text}");
    }
}

#[test]
fn watch_checks_again_when_a_file_changes() {
    use std::io::{BufRead, BufReader};
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    let repo = two_versions();
    repo.checkout("main");
    let file = repo.path().join("models/svc.yaml");
    let mut child = Command::new(env!("CARGO_BIN_EXE_openmed-op"))
        .args(["verify", "--watch", "--repo", repo.path_str()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            if tx.send(line.unwrap()).is_err() {
                break;
            }
        }
    });
    let wait_for = |needle: &str| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
        }
    };
    let first = wait_for("no problems");
    // Keep editing until the watcher has seen a change: the first write may
    // land before the watch is registered.
    let mut second = false;
    for attempt in 0..10 {
        let bad = format!("v0-{attempt}");
        std::fs::write(&file, model_with("svc", "v2", &rollback_to(&bad))).unwrap();
        if wait_for(&format!("\"{bad}\" is not a retained version")) {
            second = true;
            break;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(first, "the first check never appeared");
    assert!(second, "no check after the file changed");
}

#[test]
fn the_repository_can_be_found_from_a_subdirectory() {
    let repo = two_versions();
    repo.checkout("main");
    let sub = repo.path().join("models");
    let out = openmed_op(&["verify", "--repo", sub.to_str().unwrap()]);
    assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));
    assert!(Path::new(&sub).is_dir());
}

/// The rule ids `verify` reports for a pull request on top of `main`.
fn rules_for(main: &[&[(&str, &str)]], pr: &[(&str, &str)], status: Option<&str>) -> Vec<String> {
    let repo = TestRepo::new();
    for files in main {
        repo.commit("main", files);
    }
    pull_request(&repo, pr);
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["--rev", "pr", "--format", "json"];
    let path = dir.path().join("status.yaml");
    if let Some(status) = status {
        std::fs::write(&path, status).unwrap();
        args.extend(["--status", path.to_str().unwrap()]);
    }
    let out = verify(&repo, &args);
    let report = json(&out);
    let errors = report["summary"]["errors"].as_u64().unwrap();
    assert_eq!(code(&out), if errors > 0 { 1 } else { 0 }, "{report:#}");
    report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["rule"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn every_rule_both_ways_on_a_repository() {
    let v1 = model("svc", "v1");
    let v2 = model("svc", "v2");
    let history: &[&[(&str, &str)]] = &[&[("svc.yaml", &v1)], &[("svc.yaml", &v2)]];
    let annotated = |version: &str, metadata: &str| model_with("svc", version, metadata);
    let targeting = |name: &str, target: &str| {
        model(name, "v1").replace(
            "  version: v1\n",
            &format!("  version: v1\n  targetRef:\n    name: {target}\n"),
        )
    };
    let ready = "kind: OpenMedModel\nmetadata: {name: svc, namespace: team}\nstatus:\n  phase: Ready\n  lastSuccessfulSpec: {family: pii, tier: Small, version: v2}\n  previousSuccessfulSpec: {family: pii, tier: Small, version: v1}\n";
    let failed_v3 = STATUS_LIST;
    let reason = "  annotations:\n    openmed.ai/retry-reason: fixed the tokenizer\n";
    let none: Vec<String> = Vec::new();
    let only = |id: &str| vec![id.to_owned()];

    // 1. Valid.
    let huge = v2.replace("Small", "Huge");
    assert_eq!(
        rules_for(history, &[("svc.yaml", &huge)], None),
        only("InvalidSpec")
    );
    assert_eq!(
        rules_for(history, &[("svc.yaml", &model("svc", "v3"))], None),
        none
    );
    // 2. One owner per target.
    let two = [
        ("svc.yaml", v2.as_str()),
        ("b.yaml", &targeting("b", "svc")),
    ];
    assert_eq!(rules_for(history, &two, None), only("TargetConflict"));
    let two = [
        ("svc.yaml", v2.as_str()),
        ("b.yaml", &targeting("b", "other")),
    ];
    assert_eq!(rules_for(history, &two, None), none);
    // 3. Rollback only to a retained version.
    let to = |v: &str| annotated("v2", &rollback_to(v));
    assert_eq!(
        rules_for(history, &[("svc.yaml", &to("v0"))], None),
        only("RollbackNotRetained")
    );
    assert_eq!(rules_for(history, &[("svc.yaml", &to("v1"))], None), none);
    // 4. One intent per change.
    let both = annotated("v3", &rollback_to("v1"));
    assert_eq!(
        rules_for(history, &[("svc.yaml", &both)], None),
        only("OneIntentPerChange")
    );
    // 5. No return to a known-failed version.
    let v3 = model("svc", "v3");
    assert_eq!(
        rules_for(history, &[("svc.yaml", &v3)], Some(failed_v3)),
        only("FailedVersionRetried")
    );
    let retry = annotated("v3", reason);
    assert_eq!(
        rules_for(history, &[("svc.yaml", &retry)], Some(failed_v3)),
        none
    );
    // 6. Hygiene.
    let stale = annotated("v2", &rollback_to("v2"));
    assert_eq!(
        rules_for(history, &[("svc.yaml", &stale)], None),
        only("StaleRollbackAnnotation")
    );
    assert_eq!(
        rules_for(
            history,
            &[("other.yaml", &v1.replace("svc", "other"))],
            None
        ),
        only("ModelDeleted")
    );
    assert_eq!(rules_for(history, &[("renamed/svc.yml", &v2)], None), none);
    let latest = model("svc", "OpenMed/pii:latest");
    assert_eq!(
        rules_for(history, &[("svc.yaml", &latest)], None),
        vec!["NotAServiceModelId".to_owned(), "MutableVersion".to_owned()],
        "a revision the service refuses is an error, before the warning"
    );
    // A bare moving name is a model id to the service, but still moves.
    let bare = model("svc", "latest");
    assert_eq!(
        rules_for(history, &[("svc.yaml", &bare)], None),
        only("MutableVersion")
    );
    // Pinned, but the OpenMed service reads only `org/model` ids.
    let pinned = model("svc", "OpenMed/pii@sha256:0123abcd");
    assert_eq!(
        rules_for(history, &[("svc.yaml", &pinned)], None),
        only("NotAServiceModelId")
    );
    let nested = model("svc", "OpenMed/pii/v2");
    assert_eq!(
        rules_for(history, &[("svc.yaml", &nested)], None),
        only("NotAServiceModelId")
    );
    let moved = v2.replace(
        "  version: v2\n",
        "  version: v2\n  targetRef:\n    name: elsewhere\n",
    );
    assert_eq!(
        rules_for(history, &[("svc.yaml", &moved)], None),
        only("TargetChanged")
    );
    let scaled = v2.replace("  version: v2\n", "  version: v2\n  replicas: 3\n");
    assert_eq!(rules_for(history, &[("svc.yaml", &scaled)], None), none);
    // 7. Git agrees with the cluster after an automatic rollback.
    let on_v3: &[&[(&str, &str)]] = &[&[("svc.yaml", &v2)], &[("svc.yaml", &v3)]];
    let unrelated = [("svc.yaml", v3.as_str()), ("notes.yaml", "a: 1\n")];
    assert_eq!(
        rules_for(on_v3, &unrelated, Some(failed_v3)),
        only("GitBehindRollback")
    );
    assert_eq!(
        rules_for(on_v3, &[("svc.yaml", &v2)], Some(failed_v3)),
        none
    );
    // The rollback in the status is judged against the cluster's versions.
    assert_eq!(
        rules_for(history, &[("svc.yaml", &to("v1"))], Some(ready)),
        none
    );
    assert_eq!(
        rules_for(history, &[("svc.yaml", &to("v0"))], Some(ready)),
        only("RollbackNotRetained")
    );
}

/// The canary example's files, with `edit` applied to the route file.
fn canary_files(edit: impl Fn(String) -> String) -> Vec<(&'static str, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/canary");
    let read = |f: &str| std::fs::read_to_string(root.join(f)).unwrap();
    vec![
        ("canary/service.yaml", edit(read("service.yaml"))),
        ("canary/openmedmodel.yaml", read("openmedmodel.yaml")),
    ]
}

#[test]
fn a_canary_is_checked_against_its_route_and_services_in_the_tree() {
    let repo = TestRepo::new();
    let files = canary_files(|s| s);
    let refs: Vec<(&str, &str)> = files.iter().map(|(p, s)| (*p, s.as_str())).collect();
    repo.commit("main", &refs);
    let out = verify(&repo, &["--rev", "main"]);
    assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));

    // A pull request that gives the canary traffic in Git, and names a
    // rule the route does not have.
    let files = canary_files(|s| s.replacen("          weight: 0", "          weight: 10", 1));
    let refs: Vec<(&str, &str)> = files.iter().map(|(p, s)| (*p, s.as_str())).collect();
    pull_request(&repo, &refs);
    let out = verify(&repo, &["--rev", "pr", "--format", "json"]);
    assert_eq!(code(&out), 1, "{}{}", stdout(&out), stderr(&out));
    let report = json(&out);
    let findings = report["findings"].as_array().unwrap();
    let weight = findings
        .iter()
        .find(|f| f["rule"] == "CanaryWeightNotZero")
        .unwrap_or_else(|| panic!("{report:#}"));
    assert_eq!(weight["field"], "spec.canary.trafficRef.canaryBackend");
    assert!(
        weight["message"]
            .as_str()
            .unwrap()
            .contains("canary/service.yaml"),
        "{weight:#}"
    );

    let files = canary_files(|s| s.replace("    - name: main\n", "    - name: primary\n"));
    let refs: Vec<(&str, &str)> = files.iter().map(|(p, s)| (*p, s.as_str())).collect();
    pull_request(&repo, &refs);
    let out = verify(&repo, &["--rev", "pr", "--format", "json"]);
    assert_eq!(code(&out), 1);
    let report = json(&out);
    assert!(
        report["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["rule"] == "RouteInvalid"
                && f["message"]
                    .as_str()
                    .unwrap()
                    .contains("no rule named main")),
        "{report:#}"
    );
}

/// A model file as people write it: comments, a quoted annotation, CRLF
/// optional, and a second document.
fn hand_written(version: &str, rollback: &str, line_end: &str) -> String {
    format!(
        "# svc: the PII model of the NLP team\n\
         apiVersion: openmed.ai/v1alpha1\n\
         kind: OpenMedModel\n\
         metadata:\n  name: svc\n  namespace: team\n\
         \x20 annotations:\n    openmed.ai/rollback-to: \"{rollback}\"   # on-call, INC-7\n\
         spec:\n  family: pii\n  tier: Small\n  version: {version}   # bumped in #12\n\
         ---\n# unrelated\nkind: ConfigMap\napiVersion: v1\nmetadata: {{name: x, namespace: team}}\n"
    )
    .replace('\n', line_end)
}

const STATUS_READY: &str = "\
apiVersion: v1
kind: List
items:
- apiVersion: openmed.ai/v1alpha1
  kind: OpenMedModel
  metadata: {name: svc, namespace: team}
  spec: {family: pii, tier: Small, version: v2}
  status:
    phase: Ready
    desiredVersion: v2
    activeVersion: v2
    lastSuccessfulSpec: {family: pii, tier: Small, version: v2}
    previousSuccessfulSpec: {family: pii, tier: Small, version: v1}
";

#[test]
fn fix_changes_only_the_value_it_names_and_dry_run_only_shows_it() {
    for line_end in ["\n", "\r\n"] {
        let repo = two_versions();
        repo.checkout("main");
        let dir = tempfile::tempdir().unwrap();
        let status = dir.path().join("status.yaml");
        std::fs::write(&status, STATUS_READY).unwrap();
        let status = status.to_str().unwrap();
        // At v2, a rollback to v0, which was never retained: v1 is the one
        // version that can be meant.
        let file = repo.path().join("models/svc.yaml");
        let before = hand_written("v2", "v0", line_end);
        std::fs::write(&file, &before).unwrap();

        let out = verify(&repo, &["--status", status, "--fix", "--dry-run"]);
        assert_eq!(code(&out), 1, "the error is still there: {}", stderr(&out));
        let diff = stdout(&out);
        assert!(
            diff.starts_with("--- a/models/svc.yaml\n+++ b/models/svc.yaml\n"),
            "{diff}"
        );
        assert!(
            diff.contains("+    openmed.ai/rollback-to: \"v1\"   # on-call, INC-7"),
            "{diff}"
        );
        assert!(
            stderr(&out).contains("would fix 1 finding(s) in 1 file(s); nothing was written"),
            "{}",
            stderr(&out)
        );
        assert_eq!(std::fs::read_to_string(&file).unwrap(), before);

        let out = verify(&repo, &["--status", status, "--fix"]);
        assert_eq!(code(&out), 0, "fixed: {}", stderr(&out));
        assert!(stderr(&out).contains("fixed 1 finding(s) in 1 file(s)"));
        // Byte for byte, but the value: comments, quoting, line ends, the
        // other document.
        assert_eq!(
            std::fs::read_to_string(&file).unwrap(),
            hand_written("v2", "v1", line_end)
        );
    }
}

#[test]
fn fix_follows_the_cluster_after_a_rollback_and_drops_a_stale_annotation() {
    let repo = two_versions();
    repo.commit("main", &[("models/svc.yaml", &model("svc", "v3"))]);
    repo.checkout("main");
    let dir = tempfile::tempdir().unwrap();
    let status = dir.path().join("status.yaml");
    std::fs::write(&status, STATUS_LIST).unwrap();
    let status = status.to_str().unwrap();
    // The cluster rolled v3 back to v2; Git still asks for v3.
    let file = repo.path().join("models/svc.yaml");
    let text = model("svc", "v3");
    std::fs::write(&file, &text).unwrap();
    let out = verify(&repo, &["--status", status, "--fix"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        text.replace("version: v3", "version: v2")
    );

    // A rollback annotation naming spec.version: it goes, and the
    // `annotations:` it leaves empty with it.
    let stale = model_with("svc", "v2", &rollback_to("v2"));
    std::fs::write(&file, &stale).unwrap();
    let out = verify(&repo, &["--status", status, "--fix"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), model("svc", "v2"));

    // Nothing to fix: said, and the file is untouched.
    let out = verify(&repo, &["--status", status, "--fix"]);
    assert_eq!(code(&out), 0);
    assert!(
        stderr(&out).contains("nothing that --fix can change"),
        "{}",
        stderr(&out)
    );
    assert_eq!(stdout(&out), "");
}

// Hostile input: what a trial of bad inputs found, each held here.

#[test]
fn a_failed_write_to_stdout_is_exit_2() {
    let repo = two_versions();
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_openmed-op"))
        .args(["verify", "--repo", repo.path_str(), "--rev", "main"])
        .stdin(Stdio::null())
        .stdout(full)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("cannot write to standard output"),
        "{}",
        stderr(&out)
    );
}

/// main at v2 with two models, each asking for a rollback that only one
/// retained version can mean, checked out.
fn two_files_to_fix() -> (TestRepo, tempfile::TempDir, String) {
    let repo = TestRepo::new();
    repo.commit(
        "main",
        &[
            ("models/a.yaml", &model("svc", "v2")),
            ("models/b.yaml", &model("other", "v2")),
        ],
    );
    repo.checkout("main");
    let dir = tempfile::tempdir().unwrap();
    let status = dir.path().join("status.yaml");
    let other = STATUS_READY.replace("name: svc", "name: other");
    let both = format!(
        "{STATUS_READY}{}",
        &other[other.find("- apiVersion").unwrap()..]
    );
    std::fs::write(&status, both).unwrap();
    for (file, name) in [("models/a.yaml", "svc"), ("models/b.yaml", "other")] {
        std::fs::write(
            repo.path().join(file),
            model_with(name, "v2", &rollback_to("v0")),
        )
        .unwrap();
    }
    let status = status.to_str().unwrap().to_owned();
    (repo, dir, status)
}

#[test]
fn fix_writes_every_file_or_none() {
    let (repo, _dir, status) = two_files_to_fix();
    let a = repo.path().join("models/a.yaml");
    let b = repo.path().join("models/b.yaml");
    let (a_before, b_before) = (
        std::fs::read_to_string(&a).unwrap(),
        std::fs::read_to_string(&b).unwrap(),
    );
    // The second file cannot be replaced: its temporary file's place is
    // taken by a directory (which stops root too).
    let blocker = repo.path().join("models/.b.yaml.openmed-op-fix");
    std::fs::create_dir(&blocker).unwrap();
    let out = verify(&repo, &["--status", &status, "--fix"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("models/b.yaml: cannot write the fix beside it")
            && stderr(&out).contains("nothing was changed"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        std::fs::read_to_string(&a).unwrap(),
        a_before,
        "a.yaml untouched"
    );
    assert_eq!(std::fs::read_to_string(&b).unwrap(), b_before);
    assert!(!repo.path().join("models/.a.yaml.openmed-op-fix").exists());

    // A read-only file is refused the same way.
    std::fs::remove_dir(&blocker).unwrap();
    let mut permissions = std::fs::metadata(&b).unwrap().permissions();
    permissions.set_readonly(true);
    std::fs::set_permissions(&b, permissions).unwrap();
    let out = verify(&repo, &["--status", &status, "--fix"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("models/b.yaml: the file is read-only; nothing was changed"),
        "{}",
        stderr(&out)
    );
    assert_eq!(std::fs::read_to_string(&a).unwrap(), a_before);

    // Both writable: both fixed.
    let mut permissions = std::fs::metadata(&b).unwrap().permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    permissions.set_readonly(false);
    std::fs::set_permissions(&b, permissions).unwrap();
    let out = verify(&repo, &["--status", &status, "--fix"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        std::fs::read_to_string(&a)
            .unwrap()
            .contains("rollback-to: v1")
    );
    assert!(
        std::fs::read_to_string(&b)
            .unwrap()
            .contains("rollback-to: v1")
    );
}

#[test]
fn fix_dry_run_honours_format_json() {
    let (repo, _dir, status) = two_files_to_fix();
    let out = verify(
        &repo,
        &[
            "--status",
            &status,
            "--fix",
            "--dry-run",
            "--format",
            "json",
        ],
    );
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let document = json(&out);
    assert_eq!(document["dryRun"], true);
    assert_eq!(document["written"], false);
    assert_eq!(
        document["files"],
        serde_json::json!([{"file": "models/a.yaml", "fixes": 1}, {"file": "models/b.yaml", "fixes": 1}])
    );
    assert!(
        document["diff"]
            .as_str()
            .unwrap()
            .starts_with("--- a/models/a.yaml\n")
    );
    assert!(document["report"]["findings"].as_array().unwrap().len() >= 2);
}

#[test]
fn a_fix_from_the_status_is_validated_before_it_is_suggested() {
    let repo = two_versions();
    repo.commit("main", &[("models/svc.yaml", &model("svc", "v3"))]);
    repo.checkout("main");
    let dir = tempfile::tempdir().unwrap();
    let status = dir.path().join("status.yaml");
    std::fs::write(
        &status,
        STATUS_LIST.replace(
            "rollbackSpec: {family: pii, tier: Small, version: v2}",
            "rollbackSpec: {family: pii, tier: Small, version: bad version with spaces}",
        ),
    )
    .unwrap();
    let file = repo.path().join("models/svc.yaml");
    let before = std::fs::read_to_string(&file).unwrap();
    let out = verify(&repo, &["--status", status.to_str().unwrap(), "--fix"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("nothing that --fix can change"),
        "{}",
        stderr(&out)
    );
    assert!(
        stderr(&out).contains("which is not a valid spec.version"),
        "{}",
        stderr(&out)
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), before);
}

#[test]
fn a_status_without_the_operators_shape_is_exit_2() {
    let repo = two_versions();
    let dir = tempfile::tempdir().unwrap();
    for (name, text, message) in [
        ("empty.yaml", "", "holds no objects"),
        (
            "items.yaml",
            "apiVersion: v1\nkind: List\nitems: 5\n",
            "List.items is not a list",
        ),
        (
            "other.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
            "a \"ConfigMap\" is neither an OpenMedModel nor a List of them",
        ),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let out = verify(
            &repo,
            &["--rev", "main", "--status", path.to_str().unwrap()],
        );
        assert_eq!(code(&out), 2, "{name}: {}", stderr(&out));
        assert!(stderr(&out).contains(message), "{name}: {}", stderr(&out));
    }
    // A cluster with no OpenMedModels prints an empty List: that is fine.
    let path = dir.path().join("none.yaml");
    std::fs::write(&path, "apiVersion: v1\nkind: List\nitems: []\n").unwrap();
    let out = verify(
        &repo,
        &["--rev", "main", "--status", path.to_str().unwrap()],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
}

#[test]
fn verify_reads_a_utf16_file_as_render_does() {
    let repo = TestRepo::new();
    repo.commit("main", &[("models/svc.yaml", &model("svc", "v1"))]);
    // The same resource, saved as UTF-16 with a byte-order mark.
    let text = model("svc", "v2");
    let mut utf16 = vec![0xFF, 0xFE];
    utf16.extend(text.encode_utf16().flat_map(u16::to_le_bytes));
    let file = repo.path().join("models/svc.yaml");
    repo.checkout("main");
    std::fs::write(&file, &utf16).unwrap();
    let out = verify(&repo, &["--worktree", "--format", "json"]);
    assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));
    let report = json(&out);
    assert_eq!(
        report["findings"],
        serde_json::json!([]),
        "not ModelDeleted"
    );
    assert_eq!(report["resources"][0]["version"], "v2");
    let render = openmed_op(&["render", "--summary", file.to_str().unwrap()]);
    assert_eq!(code(&render), 0, "{}", stderr(&render));
}

#[test]
fn a_tree_or_a_blob_given_as_a_revision_is_said_in_words() {
    let repo = two_versions();
    for (spec, kind) in [("main:models/svc.yaml", "blob"), ("main^{tree}", "tree")] {
        let out = verify(&repo, &["--rev", spec]);
        assert_eq!(code(&out), 2);
        assert!(
            stderr(&out).contains(&format!("it names a {kind}, not a commit")),
            "{}",
            stderr(&out)
        );
        assert!(!stderr(&out).contains("git_object_t"), "{}", stderr(&out));
    }
}

#[test]
fn an_unreadable_user_git_config_is_skipped_with_a_warning() {
    let repo = two_versions();
    // A HOME whose files cannot even be looked at (for root too): a loop.
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::os::unix::fs::symlink(&home, &home).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_openmed-op"))
        .args(["verify", "--repo", repo.path_str(), "--rev", "main"])
        .env("HOME", &home)
        .env_remove("XDG_CONFIG_HOME")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stderr(&out).contains(".gitconfig: Too many levels of symbolic links")
            && stderr(&out).contains("going on without it"),
        "{}",
        stderr(&out)
    );
}

/// A fleet of three waves, each folder holding `svc` at its version.
fn fleet_files(versions: [&str; 3]) -> Vec<(String, String)> {
    let waves = ["staging", "hospital-a", "hospital-b"];
    let mut files = vec![(
        "openmed-fleet.yaml".to_owned(),
        "apiVersion: openmed.ai/v1alpha1\nkind: OpenMedFleet\nwaves:\n  - name: staging\n    path: clusters/staging\n  - name: hospital-a\n    path: clusters/hospital-a\n  - name: hospital-b\n    path: clusters/hospital-b\n".to_owned(),
    )];
    for (wave, version) in waves.iter().zip(versions) {
        files.push((format!("clusters/{wave}/svc.yaml"), model("svc", version)));
    }
    files
}

fn commit_fleet(repo: &TestRepo, branch: &str, versions: [&str; 3]) {
    let files = fleet_files(versions);
    let files: Vec<(&str, &str)> = files
        .iter()
        .map(|(p, t)| (p.as_str(), t.as_str()))
        .collect();
    repo.commit(branch, &files);
}

#[test]
fn in_a_fleet_each_wave_is_its_own_cluster_and_a_wave_may_lag_but_never_run_ahead() {
    let repo = TestRepo::new();
    commit_fleet(&repo, "main", ["v1", "v1", "v1"]);
    // The same model in every folder is no conflict: each wave is a cluster.
    // One commit that bumps every wave passes; so does staging alone.
    for versions in [["v2", "v2", "v2"], ["v2", "v1", "v1"]] {
        let repo = TestRepo::new();
        commit_fleet(&repo, "main", ["v1", "v1", "v1"]);
        commit_fleet(&repo, "main", versions);
        let out = verify(&repo, &[]);
        assert_eq!(
            code(&out),
            0,
            "{versions:?}: {}{}",
            stdout(&out),
            stderr(&out)
        );
        assert!(
            stdout(&out).contains("3 OpenMedModels at REV"),
            "{}",
            stdout(&out)
        );
    }

    // Hospital A moved to a version staging does not ask for: ahead, with
    // the fix that takes staging's; hospital B, left behind, only lags.
    commit_fleet(&repo, "main", ["v1", "v2", "v1"]);
    let out = verify(&repo, &["--format", "json"]);
    assert_eq!(code(&out), 1, "{}", stdout(&out));
    let report = json(&out);
    let findings = report["findings"].as_array().unwrap();
    assert_eq!(findings.len(), 1, "{findings:#?}");
    let f = &findings[0];
    assert_eq!(f["rule"], "WaveAhead");
    assert_eq!(f["file"], "clusters/hospital-a/svc.yaml");
    assert_eq!(f["suggestedFix"], "version: v1");
    assert!(
        f["message"]
            .as_str()
            .unwrap()
            .contains("wave hospital-a asks for v2, and wave staging before it asks for v1"),
        "{f}"
    );

    // A fleet file in error is a usage error naming its line.
    let broken = TestRepo::new();
    let mut files = fleet_files(["v1", "v1", "v1"]);
    files[0].1 = files[0]
        .1
        .replace("path: clusters/hospital-b", "path: /abs");
    let files: Vec<(&str, &str)> = files
        .iter()
        .map(|(p, t)| (p.as_str(), t.as_str()))
        .collect();
    broken.commit("main", &files);
    let out = verify(&broken, &[]);
    assert_eq!(code(&out), 2, "{}", stdout(&out));
    assert!(
        stderr(&out).contains("openmed-fleet.yaml:9: waves[2].path"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn after_a_rollback_in_one_wave_fix_sets_every_folder_back_in_step() {
    let repo = TestRepo::new();
    commit_fleet(&repo, "main", ["v1", "v1", "v1"]);
    commit_fleet(&repo, "main", ["v3", "v3", "v3"]);
    // Staging rolled v3 back to v1, and the hospitals never got it; the
    // next change on main is elsewhere.
    let mut files = fleet_files(["v3", "v3", "v3"]);
    files.push(("notes.yaml".to_owned(), "a: 1\n".to_owned()));
    let files: Vec<(&str, &str)> = files
        .iter()
        .map(|(p, t)| (p.as_str(), t.as_str()))
        .collect();
    repo.commit("main", &files);
    repo.checkout("main");
    let statuses = tempfile::tempdir().unwrap();
    let staging = STATUS_LIST
        .replace("version: v3}", "version: v3}\n")
        .replace("activeVersion: v2", "activeVersion: v1")
        .replace("rollbackSpec: {family: pii, tier: Small, version: v2}", "rollbackSpec: {family: pii, tier: Small, version: v1}\n    rollbackRequest: automatic:v1");
    std::fs::write(statuses.path().join("staging.yaml"), staging).unwrap();
    for hospital in ["hospital-a", "hospital-b"] {
        let file = statuses.path().join(format!("{hospital}.yaml"));
        std::fs::write(file, soak_status("v1", "v1", true)).unwrap();
    }
    let dir = statuses.path().to_str().unwrap();

    let out = verify(&repo, &["--status", dir]);
    assert_eq!(code(&out), 1, "{}", stdout(&out));
    let text = stdout(&out);
    assert!(
        text.contains("clusters/staging/svc.yaml:9: document 1: warning[GitBehindRollback]"),
        "{text}"
    );
    for wave in ["hospital-a", "hospital-b"] {
        assert!(
            text.contains(&format!("clusters/{wave}/svc.yaml:9: document 1: error[WaveBehindRollback]: team/svc: spec.version: wave {wave} asks for v3, which rolled back in wave staging (the cluster restored v1)")),
            "{text}"
        );
    }

    // One --fix sets every folder back; then nothing is left to say.
    let out = verify(&repo, &["--status", dir, "--fix"]);
    assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));
    for wave in ["staging", "hospital-a", "hospital-b"] {
        let text =
            std::fs::read_to_string(repo.path().join(format!("clusters/{wave}/svc.yaml"))).unwrap();
        assert!(text.contains("version: v1"), "{wave}: {text}");
    }
    // A status file that is not a directory is refused in a fleet.
    let file = statuses.path().join("staging.yaml");
    let out = verify(&repo, &["--status", file.to_str().unwrap()]);
    assert_eq!(code(&out), 2);
    assert!(
        stderr(&out).contains("one file per wave"),
        "{}",
        stderr(&out)
    );
}

/// A cluster's status of `svc` (`kubectl get omm -A -o yaml`): Git asks it
/// for `version`, and `status` is the status block's lines, indented by four.
fn svc_status(version: &str, status: &str) -> String {
    format!(
        "apiVersion: v1\nkind: List\nitems:\n- apiVersion: openmed.ai/v1alpha1\n  kind: OpenMedModel\n  metadata: {{name: svc, namespace: team}}\n  spec: {{family: pii, tier: Small, version: {version}}}\n  status:\n{status}"
    )
}

/// The hash the operator gives `svc` at `version` (`status.failedSpecHash`).
fn spec_hash(version: &str) -> String {
    let doc = &openmed_op::source::parse_stream("svc.yaml", &model("svc", version)).unwrap()[0];
    let spec = openmed_op::api::validate(&doc.value, None).unwrap();
    openmed_op::plan::spec_hash(&openmed_op::plan::normalize("svc", &spec))
}

/// `svc` Ready at `version` and soaked, `previous` the version before.
fn soaked_status(version: &str, previous: &str) -> String {
    svc_status(
        version,
        &format!(
            "    phase: Ready\n    desiredVersion: {version}\n    activeVersion: {version}\n    lastSuccessfulSpec: {{family: pii, tier: Small, version: {version}}}\n    previousSuccessfulSpec: {{family: pii, tier: Small, version: {previous}}}\n    conditions:\n    - {{type: Soaked, status: \"True\", reason: Soaked, message: soaked, lastTransitionTime: \"2026-12-06T07:00:00Z\"}}\n    soak: {{version: {version}, specHash: abc, startTime: \"2026-12-06T06:50:00Z\", endTime: \"2026-12-06T07:00:00Z\", soakedTime: \"2026-12-06T07:00:00Z\"}}\n"
        ),
    )
}

/// `svc`'s rollout of `failed` failed and rolled back automatically to
/// `restored`.
fn rolled_back_status(failed: &str, restored: &str) -> String {
    svc_status(
        failed,
        &format!(
            "    phase: RolledBack\n    desiredVersion: {failed}\n    activeVersion: {restored}\n    lastSuccessfulSpec: {{family: pii, tier: Small, version: {restored}}}\n    rollbackSpec: {{family: pii, tier: Small, version: {restored}}}\n    rollbackRequest: automatic:{restored}\n    failedSpecHash: {}\n",
            spec_hash(failed)
        ),
    )
}

#[test]
fn after_a_rollback_in_a_later_wave_the_fix_commit_passes_and_stays_fixed() {
    // Staging took v2 and soaked it; both hospitals were promoted, and
    // hospital A's rollout of v2 rolled back to v1, so Flux never applied
    // v2 to hospital B.
    let repo = TestRepo::new();
    commit_fleet(&repo, "main", ["v1", "v1", "v1"]);
    commit_fleet(&repo, "main", ["v2", "v1", "v1"]);
    commit_fleet(&repo, "main", ["v2", "v2", "v2"]);
    repo.checkout("main");
    let statuses = tempfile::tempdir().unwrap();
    for (cluster, status) in [
        ("staging", soaked_status("v2", "v1")),
        ("hospital-a", rolled_back_status("v2", "v1")),
        ("hospital-b", soaked_status("v1", "v0")),
    ] {
        std::fs::write(statuses.path().join(format!("{cluster}.yaml")), status).unwrap();
    }
    let dir = statuses.path().to_str().unwrap();

    // --fix sets both hospitals back to the version hospital A restored.
    let out = verify(&repo, &["--status", dir, "--fix"]);
    assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));
    let folder = |cluster: &str| {
        std::fs::read_to_string(repo.path().join(format!("clusters/{cluster}/svc.yaml"))).unwrap()
    };
    assert!(folder("staging").contains("version: v2"));
    assert!(
        folder("hospital-a").contains("version: v1"),
        "{}",
        stdout(&out)
    );
    assert!(
        folder("hospital-b").contains("version: v1"),
        "{}",
        stdout(&out)
    );

    // That fix, committed on main or in a pull request, passes with and
    // without the statuses: going back to a version the wave before has
    // passed, or to the one the cluster restored, is not running ahead.
    // And a second --fix changes nothing.
    let fixed = fleet_files(["v2", "v1", "v1"]);
    let fixed: Vec<(&str, &str)> = fixed
        .iter()
        .map(|(p, t)| (p.as_str(), t.as_str()))
        .collect();
    let main = repo.tip("main").unwrap();
    repo.commit_on("fix", &[main], &fixed);
    repo.commit("main", &fixed);
    for branch in ["main", "fix"] {
        repo.checkout(branch);
        for args in [
            vec!["--rev", branch],
            vec!["--rev", branch, "--status", dir],
        ] {
            let out = verify(&repo, &args);
            assert_eq!(
                code(&out),
                0,
                "{branch} {args:?}: {}{}",
                stdout(&out),
                stderr(&out)
            );
        }
        let out = verify(&repo, &["--status", dir, "--fix"]);
        assert_eq!(code(&out), 0, "{branch}: {}{}", stdout(&out), stderr(&out));
        assert!(
            stdout(&out).is_empty() && stderr(&out).contains("nothing that --fix can change"),
            "{branch}: {}{}",
            stdout(&out),
            stderr(&out)
        );
        assert!(folder("hospital-a").contains("version: v1"), "{branch}");
    }
}

/// A status of `svc` in one cluster: `desired` asked for, `active` served,
/// and a soak of `desired` that is over when `soaked`.
fn soak_status(desired: &str, active: &str, soaked: bool) -> String {
    let (condition, soaked_time) = if soaked {
        (
            format!(
                "{{type: Soaked, status: \"True\", reason: Soaked, message: {desired} soaked for 600 s, lastTransitionTime: \"2026-12-06T07:00:00Z\"}}"
            ),
            "\n      soakedTime: \"2026-12-06T07:00:00Z\"",
        )
    } else {
        (
            "{type: Soaked, status: \"False\", reason: Soaking, message: soaking, lastTransitionTime: \"2026-12-06T06:50:00Z\"}".to_owned(),
            "",
        )
    };
    let soak = if desired == active {
        format!(
            "\n    soak:\n      version: {desired}\n      specHash: abc\n      startTime: \"2026-12-06T06:50:00Z\"\n      endTime: \"2026-12-06T07:00:00Z\"{soaked_time}"
        )
    } else {
        String::new()
    };
    format!(
        "apiVersion: v1\nkind: List\nitems:\n- apiVersion: openmed.ai/v1alpha1\n  kind: OpenMedModel\n  metadata: {{name: svc, namespace: team}}\n  spec: {{family: pii, tier: Small, version: {desired}}}\n  status:\n    phase: Ready\n    desiredVersion: {desired}\n    activeVersion: {active}\n    conditions:\n    - {condition}{soak}\n"
    )
}

#[test]
fn a_wave_promoted_on_its_own_moves_only_to_a_version_the_wave_before_has_soaked() {
    // Staging took v2 in an earlier change; this one promotes hospital A.
    let repo = TestRepo::new();
    commit_fleet(&repo, "main", ["v1", "v1", "v1"]);
    commit_fleet(&repo, "main", ["v2", "v1", "v1"]);
    commit_fleet(&repo, "main", ["v2", "v2", "v1"]);
    repo.checkout("main");
    let statuses = tempfile::tempdir().unwrap();
    let dir = statuses.path().to_str().unwrap();
    let staging = statuses.path().join("staging.yaml");
    for hospital in ["hospital-a", "hospital-b"] {
        let file = statuses.path().join(format!("{hospital}.yaml"));
        std::fs::write(file, soak_status("v1", "v1", true)).unwrap();
    }

    // Without staging's status nothing says whether it soaked.
    assert_eq!(code(&verify(&repo, &[])), 0);

    // Still soaking, not yet rolled, or failed: refused, with the fix that
    // keeps hospital A where it was.
    for (status, why) in [
        (
            soak_status("v2", "v2", false),
            "v2 soaks until 2026-12-06T07:00:00Z",
        ),
        (
            soak_status("v1", "v1", true),
            "it runs v1 and has not taken v2 yet",
        ),
        (
            soak_status("v2", "v2", true)
                .replace("phase: Ready", "phase: Failed")
                .replace("status: \"True\"", "status: \"False\""),
            "v2 failed there and it runs v2",
        ),
    ] {
        std::fs::write(&staging, status).unwrap();
        let out = verify(&repo, &["--status", dir, "--format", "json"]);
        assert_eq!(code(&out), 1, "{why}: {}{}", stdout(&out), stderr(&out));
        let report = json(&out);
        let findings = report["findings"].as_array().unwrap();
        assert_eq!(findings.len(), 1, "{why}: {findings:#?}");
        let f = &findings[0];
        assert_eq!(f["rule"], "WaveNotSoaked");
        assert_eq!(f["file"], "clusters/hospital-a/svc.yaml");
        assert_eq!(f["line"], 9);
        assert_eq!(f["suggestedFix"], "version: v1");
        let message = f["message"].as_str().unwrap();
        assert!(
            message.starts_with(&format!("wave hospital-a moves to v2, which wave staging before it has not soaked: its status says {why}; ")),
            "{message}"
        );
    }

    // Soaked at v2: the promotion passes.
    std::fs::write(&staging, soak_status("v2", "v2", true)).unwrap();
    let out = verify(&repo, &["--status", dir]);
    assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));

    // One commit that bumps every wave passes whatever staging runs: Flux
    // applies it wave by wave, each after the one before has soaked.
    let together = TestRepo::new();
    commit_fleet(&together, "main", ["v1", "v1", "v1"]);
    commit_fleet(&together, "main", ["v2", "v2", "v2"]);
    together.checkout("main");
    std::fs::write(&staging, soak_status("v1", "v1", true)).unwrap();
    let out = verify(&together, &["--status", dir]);
    assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));

    // The promotion edited on disk, not yet committed: --fix keeps
    // hospital A on v1 while staging soaks.
    let edited = TestRepo::new();
    commit_fleet(&edited, "main", ["v1", "v1", "v1"]);
    commit_fleet(&edited, "main", ["v2", "v1", "v1"]);
    edited.checkout("main");
    let file = edited.path().join("clusters/hospital-a/svc.yaml");
    std::fs::write(&file, model("svc", "v2")).unwrap();
    std::fs::write(&staging, soak_status("v2", "v2", false)).unwrap();
    let out = verify(&edited, &["--worktree", "--status", dir]);
    assert_eq!(code(&out), 1, "{}{}", stdout(&out), stderr(&out));
    assert!(
        stdout(&out).contains("clusters/hospital-a/svc.yaml:9: document 1: error[WaveNotSoaked]"),
        "{}",
        stdout(&out)
    );
    let out = verify(&edited, &["--status", dir, "--fix"]);
    assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains("version: v1"), "{text}");
}

#[test]
fn a_fleet_whose_base_is_not_in_a_shallow_clone_is_refused() {
    // Staging alone moves to v2: the waves need BASE to tell that hospital
    // A only lags. A depth-1 clone has REV and not its parent.
    let repo = TestRepo::new();
    commit_fleet(&repo, "main", ["v1", "v1", "v1"]);
    commit_fleet(&repo, "main", ["v2", "v1", "v1"]);
    let tip = repo.tip("main").unwrap();
    std::fs::write(repo.repo.path().join("shallow"), format!("{tip}\n")).unwrap();
    let out = verify(&repo, &[]);
    assert_eq!(code(&out), 2, "{}{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).is_empty(), "{}", stdout(&out));
    let said = stderr(&out);
    for words in [
        "no BASE: REV's parent is not in this shallow clone",
        "WaveAhead, WaveNotSoaked and WaveDisagrees",
        "git fetch --deepen=1",
        "fetch-depth: 0",
        "--base",
    ] {
        assert!(said.contains(words), "{words}: {said}");
    }

    // A first commit has no BASE either, and nothing is missing: every
    // model is added, the report says so, and Flux applies it wave by wave.
    let first = TestRepo::new();
    commit_fleet(&first, "main", ["v1", "v1", "v1"]);
    let out = verify(&first, &[]);
    assert_eq!(code(&out), 0, "{}{}", stdout(&out), stderr(&out));
    assert!(
        stdout(&out).contains("note: cluster staging: no BASE: REV is a root commit"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn in_a_fleet_every_cluster_needs_its_status_file() {
    // Hospital A is promoted on its own while staging still soaks v2; the
    // status directory spells staging's file wrong.
    let repo = TestRepo::new();
    commit_fleet(&repo, "main", ["v1", "v1", "v1"]);
    commit_fleet(&repo, "main", ["v2", "v1", "v1"]);
    commit_fleet(&repo, "main", ["v2", "v2", "v1"]);
    let statuses = tempfile::tempdir().unwrap();
    let dir = statuses.path().to_str().unwrap();
    std::fs::write(
        statuses.path().join("Staging.yaml"),
        soak_status("v2", "v2", false),
    )
    .unwrap();
    std::fs::write(
        statuses.path().join("hospital-a.yaml"),
        soak_status("v1", "v1", true),
    )
    .unwrap();
    let out = verify(&repo, &["--status", dir]);
    assert_eq!(code(&out), 2, "{}{}", stdout(&out), stderr(&out));
    let said = stderr(&out);
    for words in [
        format!("--status {dir}: no status for clusters staging, hospital-b"),
        format!("{dir}/staging.yaml"),
        format!("{dir} also holds Staging.yaml, which names no cluster of the fleet"),
        "WaveNotSoaked cannot judge the wave after that cluster".to_owned(),
    ] {
        assert!(said.contains(&words), "{words}: {said}");
    }

    // Named right, staging's status refuses the promotion.
    std::fs::rename(
        statuses.path().join("Staging.yaml"),
        statuses.path().join("staging.yaml"),
    )
    .unwrap();
    std::fs::write(
        statuses.path().join("hospital-b.yaml"),
        "apiVersion: v1\nkind: List\nitems: []\n",
    )
    .unwrap();
    let out = verify(&repo, &["--status", dir]);
    assert_eq!(code(&out), 1, "{}{}", stdout(&out), stderr(&out));
    assert!(
        stdout(&out).contains("clusters/hospital-a/svc.yaml:9: document 1: error[WaveNotSoaked]"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn in_a_fleet_include_and_exclude_narrow_each_clusters_folder() {
    // Hospital A runs ahead; staging's folder also holds a chart template
    // that is not YAML yet.
    let template = model("svc", "v1").replace("tier: Small", "tier: {{ .Values.tier }}");
    let repo = TestRepo::new();
    for versions in [["v1", "v1", "v1"], ["v1", "v2", "v1"]] {
        let mut files = fleet_files(versions);
        files.push((
            "clusters/staging/templates/model.yaml".to_owned(),
            template.clone(),
        ));
        let files: Vec<(&str, &str)> = files
            .iter()
            .map(|(p, t)| (p.as_str(), t.as_str()))
            .collect();
        repo.commit("main", &files);
    }
    let rules = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--format", "json"]);
        let out = verify(&repo, &all);
        let report = json(&out);
        let rules: Vec<(String, String)> = report["findings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                (
                    f["file"].as_str().unwrap().to_owned(),
                    f["rule"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        (code(&out), rules)
    };
    let ahead = (
        "clusters/hospital-a/svc.yaml".to_owned(),
        "WaveAhead".to_owned(),
    );
    let template = (
        "clusters/staging/templates/model.yaml".to_owned(),
        "InvalidYaml".to_owned(),
    );
    assert_eq!(rules(&[]), (1, vec![ahead.clone(), template]));
    // The user's globs and each cluster's folder must both match: the
    // template is left out, and the waves are still judged.
    assert_eq!(rules(&["--include", "svc.yaml"]), (1, vec![ahead.clone()]));
    assert_eq!(
        rules(&["--include", "clusters/**/svc.yaml"]),
        (1, vec![ahead.clone()])
    );
    assert_eq!(rules(&["--exclude", "templates"]), (1, vec![ahead]));

    // Globs that leave out every model of a cluster would blind the waves.
    let out = verify(&repo, &["--include", "clusters/hospital-a"]);
    assert_eq!(code(&out), 2, "{}{}", stdout(&out), stderr(&out));
    assert!(
        stderr(&out).contains("--include/--exclude leave out every file of cluster staging (clusters/staging/) that holds an OpenMedModel"),
        "{}",
        stderr(&out)
    );
}

/// Staging, then one wave of two hospitals applied together.
fn two_hospital_fleet(repo: &TestRepo, versions: [&str; 3]) {
    let fleet = "apiVersion: openmed.ai/v1alpha1\nkind: OpenMedFleet\nwaves:\n  - name: staging\n    path: clusters/staging\n  - name: hospitals\n    clusters:\n      - name: hospital-a\n        path: clusters/hospital-a\n      - name: hospital-b\n        path: clusters/hospital-b\n";
    let files: Vec<(String, String)> = ["staging", "hospital-a", "hospital-b"]
        .iter()
        .zip(versions)
        .map(|(c, v)| (format!("clusters/{c}/svc.yaml"), model("svc", v)))
        .collect();
    let mut all = vec![("openmed-fleet.yaml", fleet)];
    all.extend(files.iter().map(|(p, t)| (p.as_str(), t.as_str())));
    repo.commit("main", &all);
}

#[test]
fn the_clusters_of_one_wave_ask_for_the_same_version() {
    // Both hospitals with staging: passes; a wave of two may lag together.
    for versions in [["v2", "v2", "v2"], ["v2", "v1", "v1"]] {
        let repo = TestRepo::new();
        two_hospital_fleet(&repo, ["v1", "v1", "v1"]);
        two_hospital_fleet(&repo, versions);
        let out = verify(&repo, &[]);
        assert_eq!(
            code(&out),
            0,
            "{versions:?}: {}{}",
            stdout(&out),
            stderr(&out)
        );
    }

    // Hospital A alone: the wave disagrees, and the fix is hospital B's.
    let repo = TestRepo::new();
    two_hospital_fleet(&repo, ["v1", "v1", "v1"]);
    two_hospital_fleet(&repo, ["v2", "v2", "v1"]);
    let out = verify(&repo, &["--format", "json"]);
    assert_eq!(code(&out), 1, "{}", stdout(&out));
    let report = json(&out);
    let findings = report["findings"].as_array().unwrap();
    assert_eq!(findings.len(), 1, "{findings:#?}");
    let f = &findings[0];
    assert_eq!(f["rule"], "WaveDisagrees");
    assert_eq!(f["file"], "clusters/hospital-a/svc.yaml");
    assert_eq!(f["suggestedFix"], "version: v1");
    assert!(
        f["message"].as_str().unwrap().starts_with("wave hospitals (cluster hospital-a) asks for v2, and cluster hospital-b of the same wave asks for v1"),
        "{f}"
    );

    // Both hospitals ahead of staging: each is ahead, once.
    let repo = TestRepo::new();
    two_hospital_fleet(&repo, ["v1", "v1", "v1"]);
    two_hospital_fleet(&repo, ["v1", "v2", "v3"]);
    let out = verify(&repo, &["--format", "json"]);
    let report = json(&out);
    let rules: Vec<(&str, &str)> = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["file"].as_str().unwrap(), f["rule"].as_str().unwrap()))
        .collect();
    assert_eq!(
        rules,
        [
            ("clusters/hospital-a/svc.yaml", "WaveAhead"),
            ("clusters/hospital-b/svc.yaml", "WaveAhead")
        ],
        "{report:#}"
    );
}
