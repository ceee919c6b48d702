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
//! The reading and running is in `doc_blocks/`, shared with the
//! end-to-end suite, which runs the blocks marked `<!-- run: cluster -->`
//! on the control plane (tests/e2e/docs.rs).
//!
//! A sandbox is a temporary folder made for one document: `examples` holds
//! the bundled examples; `verify` is a models repository whose pull request
//! asks for a rollback the operator no longer retains; `krm` and
//! `kustomize` are each a copy of the bundled example with the KRM
//! function's two-line wrapper; `system` runs a block as root in a mount
//! namespace where the folders it installs into are empty. A ```yaml block marked `<!-- file -->` is written into its
//! document's sandbox, one file per YAML document, named by its first line
//! (`# NAME`, a comment the file keeps), before the document's blocks run.

// Shared with the end-to-end suite, which uses a part.
#[allow(dead_code)]
mod doc_blocks;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use doc_blocks::*;

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
                    if let Some((_, runner)) = ON_THE_CLUSTER.iter().find(|(s, _)| s == sandbox) {
                        let text =
                            std::fs::read_to_string(root().join(runner)).unwrap_or_default();
                        if !text.contains(&format!("{sandbox:?}")) {
                            problems.push(format!(
                                "{}: {runner} does not run the blocks of {sandbox:?}",
                                block.at()
                            ));
                        }
                    } else if !SANDBOXES.contains(&sandbox.as_str()) {
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
const NOT_YET_RUN: &[(&str, &str, &str)] = &[];

const SANDBOXES: [&str; 5] = ["examples", "verify", "krm", "kustomize", "system"];

/// The folders a `system` block writes to, each an empty tmpfs in a mount
/// namespace of the block's own, so it runs as printed and the machine's
/// folders stay as they were.
const SYSTEM_FOLDERS: [&str; 3] = [
    "/usr/local/bin",
    "/usr/local/share",
    "/etc/bash_completion.d",
];

/// Runs a sh block in a mount namespace where [`SYSTEM_FOLDERS`] are empty
/// (needs root, as the control-plane tiers do), then checks that what it
/// installs is there: the plugin link, its completions and its manual.
fn run_as_the_system(shell: &Shell, dir: &std::path::Path, block: &Block) -> Option<String> {
    std::fs::write(dir.join("block.sh"), &block.body).unwrap();
    let mounts: String = SYSTEM_FOLDERS
        .iter()
        .map(|f| format!("mount -t tmpfs openmed-doc {f}; "))
        .collect();
    let script = format!(
        "exec unshare --mount --propagation private bash -euo pipefail -c '{mounts}\
         bash -euo pipefail ./block.sh; \
         test -x /usr/local/bin/kubectl-openmed; \
         grep -q kubectl-openmed /etc/bash_completion.d/kubectl-openmed; \
         test -s /usr/local/share/man/man1/kubectl-openmed-canary.1'"
    );
    let (ok, output) = shell.bash(dir, &["-euo", "pipefail"], &script);
    (!ok).then_some(output)
}

/// The sandboxes of the blocks that need the control plane, and the test
/// that runs them: the end-to-end suite, or the real stack's quality test
/// (the gate's verdicts on the OpenMed service's pods).
const ON_THE_CLUSTER: [(&str, &str); 2] = [
    ("cluster", "tests/e2e/docs.rs"),
    ("stack-quality", "tests/stack/quality.rs"),
];

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
        "system" => {}
        "verify" => verify_repository(
            dir.path(),
            "openmed",
            &|v| format!("OpenMed/{v}"),
            PullRequest::RollbackToV1,
        ),
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

#[test]
fn the_blocks_marked_to_run_here_do_what_the_documents_print() {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_openmed-op"));
    let shell = Shell {
        path: [vec![bin.parent().unwrap().to_path_buf()], tool_folders()].concat(),
        kubeconfig: None,
    };
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
            if ON_THE_CLUSTER.iter().any(|(s, _)| s == name) {
                continue;
            }
            let dir = sandboxes
                .entry(name.clone())
                .or_insert_with(|| sandbox(name, &doc));
            ran += 1;
            let failed = if name == "system" {
                run_as_the_system(&shell, dir.path(), &block)
            } else if block.lang == "console" {
                shell.transcript(dir.path(), &block, &|output| output.to_owned())
            } else {
                shell.script(dir.path(), &block)
            };
            if let Some(failed) = failed {
                failures.push(format!("{}:\n{failed}", block.at()));
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

/// The folders of the test tools the documents call by name (kustomize;
/// kubectl, the control plane's), built on first use and cached
/// (tests/cached-build.sh).
fn tool_folders() -> Vec<PathBuf> {
    ["tests/gitops/build", "tests/cluster/build"]
        .iter()
        .map(|script| {
            let out = Command::new(root().join(script))
                .stderr(Stdio::inherit())
                .output()
                .unwrap();
            assert!(out.status.success(), "{script} failed");
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        })
        .collect()
}
