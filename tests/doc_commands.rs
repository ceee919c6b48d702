//! Every shell block the documents print (README.md and docs/) is run by a
//! test, so a document cannot drift from the product.
//!
//! The line before each ```sh or ```console block says how it is run:
//!
//! - `<!-- run: SANDBOX -->`: this file runs it. A `console` block is a
//!   transcript: each `$ ` command runs in one bash session in the sandbox
//!   (stderr with stdout, as a terminal shows them), and its output must be
//!   what the document prints, where a line `...` stands for any lines, a
//!   `...` within a line for any text, and commit ids and timings are
//!   compared by shape (they differ per run). A `sh` block runs with
//!   `set -euo pipefail` and must succeed.
//! - `<!-- run by PATH: LABEL -->`: the test at PATH reads the block by the
//!   line before it that starts with LABEL, and runs it (README's install
//!   blocks, docs/migration.md's steps); `<!-- run by PATH -->`: PATH runs
//!   each command of the block, word for word.
//! - `<!-- not run: WHY -->`: what no test here can run, and why.
//!
//! A block with none of these fails the test, as does a marker whose test
//! does not hold the block's label or commands.
//!
//! A sandbox is a temporary folder made for one document: `examples` holds
//! the bundled examples; `verify` is a models repository whose pull request
//! asks for a rollback the operator no longer retains; `krm` and
//! `kustomize` are each a copy of the bundled example with the KRM
//! function's two-line wrapper. A ```yaml block marked `<!-- file -->` is written into its
//! document's sandbox, one file per YAML document, named by its first line
//! (`# NAME`, a comment the file keeps), before the document's blocks run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pulldown_cmark::{CodeBlockKind, Event, Options, Parser, Tag, TagEnd};
use regex::Regex;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The documents a user reads: README.md and docs/.
fn documents() -> Vec<String> {
    let mut out = vec!["README.md".to_owned()];
    let mut docs: Vec<String> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    out.extend(docs);
    out
}

#[derive(Debug, Clone, PartialEq)]
enum Marker {
    Run(String),
    RunBy { path: String, label: Option<String> },
    NotRun,
    File,
    None,
}

#[derive(Debug, Clone)]
struct Block {
    doc: String,
    line: usize,
    lang: String,
    body: String,
    marker: Marker,
}

impl Block {
    fn at(&self) -> String {
        format!("{}:{}", self.doc, self.line)
    }
}

fn marker(comment: &str) -> Marker {
    let Some(inner) = comment
        .trim()
        .strip_prefix("<!--")
        .and_then(|c| c.strip_suffix("-->"))
        .map(str::trim)
    else {
        return Marker::None;
    };
    if let Some(sandbox) = inner.strip_prefix("run:") {
        Marker::Run(sandbox.trim().to_owned())
    } else if let Some(by) = inner.strip_prefix("run by ") {
        match by.split_once(": ") {
            Some((path, label)) => Marker::RunBy {
                path: path.trim().to_owned(),
                label: Some(label.trim().to_owned()),
            },
            None => Marker::RunBy {
                path: by.trim().to_owned(),
                label: None,
            },
        }
    } else if inner.starts_with("not run:") && inner.len() > "not run:".len() + 10 {
        Marker::NotRun
    } else if inner == "file" {
        Marker::File
    } else {
        Marker::None
    }
}

/// Every fenced block of a document, with the marker on the line before it.
fn blocks(doc: &str) -> Vec<Block> {
    let text = std::fs::read_to_string(root().join(doc)).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut open: Option<(usize, String, String)> = None;
    for (event, range) in Parser::new_ext(&text, Options::all()).into_offset_iter() {
        match event {
            Event::Start(Tag::CodeBlock(CodeBlockKind::Fenced(lang))) => {
                let line = text[..range.start].matches('\n').count() + 1;
                open = Some((line, lang.to_string(), String::new()));
            }
            Event::Text(t) => {
                if let Some((_, _, body)) = open.as_mut() {
                    body.push_str(&t);
                }
            }
            Event::End(TagEnd::CodeBlock) => {
                if let Some((line, lang, body)) = open.take() {
                    let before = lines[..line - 1]
                        .iter()
                        .rev()
                        .find(|l| !l.trim().is_empty())
                        .copied()
                        .unwrap_or("");
                    out.push(Block {
                        doc: doc.to_owned(),
                        line,
                        lang,
                        body,
                        marker: marker(before),
                    });
                }
            }
            _ => {}
        }
    }
    out
}

fn is_shell(lang: &str) -> bool {
    matches!(lang, "sh" | "console" | "bash" | "shell")
}

/// The commands of a block: `$ ` lines of a console block, every line of a
/// sh block, with their continuation lines, comments left to bash.
fn commands(block: &Block) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut continuing = false;
    for line in block.body.lines() {
        if continuing {
            let last = out.last_mut().unwrap();
            last.push('\n');
            last.push_str(line);
        } else if block.lang == "console" {
            match line.strip_prefix("$ ") {
                Some(command) => out.push(command.to_owned()),
                None => continue,
            }
        } else if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        } else {
            out.push(line.to_owned());
        }
        continuing = line.ends_with('\\');
    }
    out
}

#[test]
fn every_shell_block_says_how_it_is_run() {
    let mut problems = Vec::new();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    let mut pending = Vec::new();
    for doc in documents() {
        for block in blocks(&doc) {
            if !is_shell(&block.lang) {
                if matches!(block.marker, Marker::Run(_) | Marker::RunBy { .. }) {
                    problems.push(format!(
                        "{}: a ```{} block is not a shell block; mark it `<!-- file -->` or nothing",
                        block.at(),
                        block.lang
                    ));
                }
                continue;
            }
            if block.marker == Marker::None
                && let Some(&(_, needle, why)) = NOT_YET_RUN
                    .iter()
                    .find(|(doc_, needle, _)| *doc_ == doc && block.body.contains(needle))
            {
                *counts.entry("not yet run").or_default() += 1;
                pending.push(format!("{}: {needle:?}: {why}", block.at()));
                continue;
            }
            match &block.marker {
                Marker::None | Marker::File => problems.push(format!(
                    "{}: a ```{} block with no `<!-- run: SANDBOX -->`, `<!-- run by PATH[: LABEL] -->` or `<!-- not run: WHY -->` on the line before it",
                    block.at(),
                    block.lang
                )),
                Marker::NotRun => *counts.entry("not run").or_default() += 1,
                Marker::Run(sandbox) => {
                    *counts.entry("run here").or_default() += 1;
                    if !SANDBOXES.contains(&sandbox.as_str()) {
                        problems.push(format!(
                            "{}: no sandbox {sandbox:?} (there are {SANDBOXES:?})",
                            block.at()
                        ));
                    }
                }
                Marker::RunBy { path, label } => {
                    *counts.entry("run by another test").or_default() += 1;
                    let Ok(runner) = std::fs::read_to_string(root().join(path)) else {
                        problems.push(format!("{}: {path} does not exist", block.at()));
                        continue;
                    };
                    match label {
                        Some(label) => {
                            if !runner.contains(label.as_str()) {
                                problems.push(format!(
                                    "{}: {path} does not read the block by its label {label:?}",
                                    block.at()
                                ));
                            }
                            // The runner takes the first shell block after
                            // the label's line: it must be this one.
                            let text = std::fs::read_to_string(root().join(&doc)).unwrap();
                            let label_line = text
                                .lines()
                                .take(block.line)
                                .enumerate()
                                .filter(|(_, l)| l.trim_start().starts_with(label.as_str()))
                                .map(|(i, _)| i + 1)
                                .last();
                            let first_after = label_line.and_then(|at| {
                                blocks(&doc)
                                    .into_iter()
                                    .find(|b| b.line > at && is_shell(&b.lang))
                            });
                            if first_after.map(|b| b.line) != Some(block.line) {
                                problems.push(format!(
                                    "{}: the first shell block after a line starting {label:?} is not this one",
                                    block.at()
                                ));
                            }
                        }
                        None => {
                            for command in commands(&block) {
                                let command = strip_comment(&command);
                                if !runner.contains(command.as_str()) {
                                    problems.push(format!(
                                        "{}: {path} does not run {command:?}",
                                        block.at()
                                    ));
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    eprintln!("shell blocks: {counts:?}");
    eprintln!("not yet run by a test:\n  {}", pending.join("\n  "));
    for (doc, needle, _) in NOT_YET_RUN {
        let unmarked = blocks(doc)
            .into_iter()
            .any(|b| b.marker == Marker::None && is_shell(&b.lang) && b.body.contains(needle));
        if !unmarked {
            problems.push(format!(
                "NOT_YET_RUN names {doc}: {needle:?}, and no unmarked block of {doc} holds it: take it off the list"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The blocks no test runs yet, each with what running it needs: the
/// list only shrinks (an entry that no longer names an unmarked block
/// fails the test, and a new block needs a marker).
const NOT_YET_RUN: &[(&str, &str, &str)] = &[
    (
        "README.md",
        "examples/quickstart --canary",
        "the quickstart on a control plane of its own",
    ),
    (
        "docs/canary.md",
        "$ examples/quickstart --canary",
        "the quickstart on a control plane of its own",
    ),
    (
        "docs/tour.md",
        "$ examples/quickstart\n",
        "the quickstart on a control plane of its own",
    ),
    (
        "docs/gitops.md",
        "GitBehindRollback",
        "status.yaml from a model the control plane rolled back",
    ),
    (
        "docs/gitops.md",
        "FailedVersionRetried",
        "status.yaml from a model the control plane rolled back",
    ),
    (
        "docs/tour.md",
        "$ kubectl get omm -A -o yaml > status.yaml",
        "a model the control plane rolled back",
    ),
    (
        "docs/tour.md",
        "--fix --dry-run",
        "a model the control plane rolled back",
    ),
    (
        "docs/verify.md",
        "$ kubectl get omm -A -o yaml > status.yaml",
        "a model the control plane rolled back",
    ),
    (
        "docs/verify.md",
        "--fix --dry-run",
        "a model the control plane rolled back",
    ),
    (
        "docs/tour.md",
        "--watch",
        "a rollout in progress on the control plane",
    ),
    (
        "docs/tour.md",
        "openmed-op crd | kubectl apply",
        "the control plane",
    ),
    (
        "docs/operations.md",
        "kubectl get configmap -l",
        "a model's ConfigMaps on the control plane",
    ),
    (
        "docs/operations.md",
        "kubectl openmed status svc",
        "a model's Events on the control plane",
    ),
    (
        "docs/operations.md",
        "kubectl openmed completions bash",
        "a sandbox for the folders it writes to",
    ),
    (
        "docs/operations.md",
        "kubectl apply -k deploy/monitoring",
        "the Prometheus Operator's CRDs on the control plane",
    ),
    (
        "docs/operations.md",
        "kubectl describe omm",
        "names for its placeholders, and a model on the control plane",
    ),
    (
        "docs/quality.md",
        "openmed.ai/model-quality",
        "the real stack's quality gate",
    ),
    (
        "docs/migration.md",
        "kubectl get omm -A        # PHASE",
        "the migration tier running each block as printed",
    ),
    (
        "docs/migration.md",
        "grep '[:@+~]'",
        "the migration tier running each block as printed",
    ),
    (
        "docs/migration.md",
        "--for=delete pod",
        "the migration tier running each block as printed",
    ),
    (
        "docs/migration.md",
        "rollout status deployment openmed-operator",
        "the migration tier running each block as printed",
    ),
    (
        "docs/migration.md",
        "custom-columns=NAME",
        "the migration tier running each block as printed",
    ),
    (
        "docs/migration.md",
        "select(. != \"openmed.ai/release-target\")",
        "the migration tier running each block as printed",
    ),
    (
        "docs/migration.md",
        "-f rbac.yaml",
        "the migration tier running each block as printed",
    ),
];

/// A command without the comment a document adds after it.
fn strip_comment(command: &str) -> String {
    match command.find("  #") {
        Some(at) => command[..at].trim_end().to_owned(),
        None => command.trim_end().to_owned(),
    }
}

const SANDBOXES: [&str; 4] = ["examples", "verify", "krm", "kustomize"];

/// A sandbox's folder, made as its name says, with the document's files in
/// it.
fn sandbox(name: &str, doc: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    match name {
        "examples" => {
            std::os::unix::fs::symlink(root().join("examples"), dir.path().join("examples"))
                .unwrap();
        }
        "krm" | "kustomize" => {
            for file in ["openmed-service.yaml", "openmedmodel.yaml"] {
                std::fs::copy(
                    root().join("examples/openmed").join(file),
                    dir.path().join(file),
                )
                .unwrap();
            }
            let wrapper = dir.path().join("openmed-op-krm");
            std::fs::write(&wrapper, "#!/bin/sh\nexec openmed-op render --krm\n").unwrap();
            std::fs::set_permissions(
                &wrapper,
                std::os::unix::fs::PermissionsExt::from_mode(0o755),
            )
            .unwrap();
        }
        "verify" => verify_repository(dir.path()),
        other => panic!("no sandbox {other:?}"),
    }
    for block in blocks(doc) {
        if block.marker != Marker::File {
            continue;
        }
        for document in block.body.split("\n---\n") {
            let first = document.lines().next().unwrap_or_default();
            let name = first
                .strip_prefix("# ")
                .unwrap_or_else(|| panic!("{}: a file block starts with `# NAME`", block.at()))
                .trim();
            std::fs::write(dir.path().join(name), document.trim_end().to_owned() + "\n").unwrap();
        }
    }
    dir
}

fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", "Model Team")
        .env("GIT_AUTHOR_EMAIL", "models@hospital.example")
        .env("GIT_COMMITTER_NAME", "Model Team")
        .env("GIT_COMMITTER_EMAIL", "models@hospital.example")
        .env("GIT_AUTHOR_DATE", "2026-11-02T09:00:00Z")
        .env("GIT_COMMITTER_DATE", "2026-11-02T09:00:00Z")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The models repository of docs/verify.md and docs/tour.md: `main` moved
/// the model from v2 to v3, and the pull request (the branch checked out)
/// asks for a rollback to v1.
fn verify_repository(dir: &Path) {
    let model = |annotations: &str, version: &str| {
        format!(
            "apiVersion: openmed.ai/v1alpha1
kind: OpenMedModel
metadata:
  name: openmed-service
  namespace: openmed{annotations}
spec:
  family: pii
  tier: Small
  version: {version}
  replicas: 2
  targetRef:
    name: openmed-service
"
        )
    };
    std::fs::create_dir(dir.join("models")).unwrap();
    let file = dir.join("models/openmed-service.yaml");
    git(dir, &["init", "--quiet", "--initial-branch=main"]);
    std::fs::write(&file, model("", "OpenMed/synthetic-pii-v2")).unwrap();
    git(dir, &["add", "."]);
    git(dir, &["commit", "--quiet", "-m", "openmed-service: v2"]);
    std::fs::write(
        &file,
        model("", "OpenMed/synthetic-pii-v3   # raised in #128"),
    )
    .unwrap();
    git(
        dir,
        &["commit", "--quiet", "-am", "openmed-service: v3 (#128)"],
    );
    git(dir, &["checkout", "--quiet", "-b", "rollback"]);
    std::fs::write(
        &file,
        model(
            "\n  annotations:\n    openmed.ai/rollback-to: OpenMed/synthetic-pii-v1",
            "OpenMed/synthetic-pii-v3   # raised in #128",
        ),
    )
    .unwrap();
    git(
        dir,
        &["commit", "--quiet", "-am", "openmed-service: back to v1"],
    );
}

/// What may differ between a run and the document: commit ids, timings,
/// trailing spaces.
fn normalize(text: &str) -> String {
    let commit = Regex::new(r"\b[0-9a-f]{40}\b|\b[0-9a-f]{12}\b").unwrap();
    let timing = Regex::new(r"\bin [0-9]+(\.[0-9]+)?(ms|s)\b").unwrap();
    let text = commit.replace_all(text, "<commit>");
    let text = timing.replace_all(&text, "in <time>");
    text.lines()
        .map(str::trim_end)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether `actual` reads as `expected`, where a line `...` is any lines
/// and `...` within a line any text.
fn matches(expected: &[&str], actual: &[&str]) -> bool {
    match expected.split_first() {
        None => actual.is_empty(),
        Some((first, rest)) if first.trim() == "..." => {
            (0..=actual.len()).any(|skip| matches(rest, &actual[skip..]))
        }
        Some((first, rest)) => match actual.split_first() {
            Some((line, more)) => line_matches(first, line) && matches(rest, more),
            None => false,
        },
    }
}

fn line_matches(expected: &str, actual: &str) -> bool {
    if !expected.contains("...") {
        return expected == actual;
    }
    let pattern = expected
        .split("...")
        .map(regex::escape)
        .collect::<Vec<_>>()
        .join(".*");
    Regex::new(&format!("^{pattern}$"))
        .unwrap()
        .is_match(actual)
}

/// A console block's commands with the output the document prints for
/// each.
fn transcript(block: &Block) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut continuing = false;
    for line in block.body.lines() {
        if continuing {
            let (command, _) = out.last_mut().unwrap();
            command.push('\n');
            command.push_str(line);
            continuing = line.ends_with('\\');
        } else if let Some(command) = line.strip_prefix("$ ") {
            out.push((command.to_owned(), String::new()));
            continuing = line.ends_with('\\');
        } else {
            let (_, output) = out
                .last_mut()
                .unwrap_or_else(|| panic!("{}: output before the first `$ `", block.at()));
            output.push_str(line);
            output.push('\n');
        }
    }
    out
}

const STEP: &str = "@@openmed-op-doc-step@@\n";

/// How long one block may take.
const BLOCK_DEADLINE: Duration = Duration::from_secs(120);

/// Runs `script` with bash in `dir`, `openmed-op` and the built tools first
/// on PATH, and returns its status and output (stderr with stdout).
fn bash(dir: &Path, options: &[&str], script: &str) -> (bool, String) {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_openmed-op"));
    let mut path = vec![bin.parent().unwrap().to_path_buf()];
    path.extend(tool_folders());
    let path = format!(
        "{}:{}",
        std::env::join_paths(path).unwrap().to_string_lossy(),
        std::env::var("PATH").unwrap_or_default()
    );
    let log = dir.join(".transcript");
    let out = std::fs::File::create(&log).unwrap();
    let mut child = Command::new("bash")
        .args(options)
        .arg("-c")
        .arg(format!("exec 2>&1\n{script}"))
        .current_dir(dir)
        .env("PATH", path)
        .env("NO_COLOR", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("bash runs");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > BLOCK_DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "did not finish in {BLOCK_DEADLINE:?}:\n{script}\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let output = std::fs::read_to_string(&log).unwrap();
    std::fs::remove_file(&log).unwrap();
    (status.success(), output)
}

/// The folders of the test tools the documents call by name (kustomize),
/// built on first use and cached (tests/cached-build.sh).
fn tool_folders() -> Vec<PathBuf> {
    let out = Command::new(root().join("tests/gitops/build"))
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "tests/gitops/build failed");
    vec![PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())]
}

/// Runs a console block in `dir` and returns what differs from the
/// document, if anything.
fn run_transcript(dir: &Path, block: &Block) -> Option<String> {
    let steps = transcript(block);
    let script: String = steps
        .iter()
        .map(|(command, _)| {
            format!("{command}\n__status=$?; printf '%s' '{STEP}'; (exit $__status)\n")
        })
        .collect();
    let (_, output) = bash(dir, &[], &script);
    let outputs: Vec<&str> = output.split(STEP).collect();
    let mut differences = String::new();
    for (i, (command, expected)) in steps.iter().enumerate() {
        let actual = normalize(outputs.get(i).copied().unwrap_or(""));
        let expected = normalize(expected);
        let want: Vec<&str> = expected.lines().collect();
        let got: Vec<&str> = actual.lines().collect();
        if !matches(&want, &got) {
            differences.push_str(&format!(
                "$ {command}\n--- the document prints:\n{expected}\n--- the command printed:\n{actual}\n"
            ));
        }
    }
    (!differences.is_empty()).then_some(differences)
}

#[test]
fn the_blocks_marked_to_run_here_do_what_the_documents_print() {
    let mut failures = Vec::new();
    let mut ran = 0;
    for doc in documents() {
        let mut sandboxes: BTreeMap<String, tempfile::TempDir> = BTreeMap::new();
        for block in blocks(&doc) {
            let Marker::Run(name) = &block.marker else {
                continue;
            };
            if !is_shell(&block.lang) {
                continue;
            }
            let dir = sandboxes
                .entry(name.clone())
                .or_insert_with(|| sandbox(name, &doc));
            ran += 1;
            if block.lang == "console" {
                if let Some(differences) = run_transcript(dir.path(), &block) {
                    failures.push(format!("{}:\n{differences}", block.at()));
                }
            } else {
                let (ok, output) = bash(dir.path(), &["-euo", "pipefail"], &block.body);
                if !ok {
                    failures.push(format!("{}: failed:\n{}\n{output}", block.at(), block.body));
                }
            }
        }
    }
    eprintln!("ran {ran} blocks");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_matching_reads_elisions_as_the_documents_use_them() {
    let lines = |s: &'static str| s.lines().collect::<Vec<_>>();
    assert!(matches(&lines("a\n...\nd"), &lines("a\nb\nc\nd")));
    assert!(matches(&lines("a\n...\nb"), &lines("a\nb")));
    assert!(!matches(&lines("a\n...\nd"), &lines("a\nb\nc")));
    assert!(matches(
        &lines("x: \"v1\" is not; ...\","),
        &lines("x: \"v1\" is not; kept (own)\",")
    ));
    assert!(!matches(&lines("a"), &lines("a\nb")));
    assert_eq!(
        normalize("at REV 14b6c81d77f6 in 600ms  \n"),
        "at REV <commit> in <time>"
    );
}

#[test]
fn the_quick_subset_names_only_tests_that_exist() {
    let testing = std::fs::read_to_string(root().join("docs/testing.md")).unwrap();
    let block = blocks("docs/testing.md")
        .into_iter()
        .find(|b| b.body.starts_with("cargo test --lib"))
        .expect("docs/testing.md prints the quick subset");
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let words: Vec<&str> = block.body.split_whitespace().collect();
    let named: Vec<&str> = words
        .windows(2)
        .filter(|w| w[0] == "--test")
        .map(|w| w[1])
        .collect();
    assert!(named.len() > 5, "{testing}");
    for name in named {
        let file = root().join(format!("tests/{name}.rs"));
        assert!(
            file.exists() || manifest.contains(&format!("name = \"{name}\"")),
            "docs/testing.md's quick subset names --test {name}, which is not a test"
        );
    }
}
