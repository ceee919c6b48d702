//! The shell blocks of the documents, read and run: shared by the offline
//! tier (`tests/doc_commands.rs`), which runs the blocks a sandbox folder
//! is enough for, and the end-to-end suite (`tests/e2e/docs.rs`), which
//! runs the ones that need the control plane.
//!
//! A `console` block is a transcript: each `$ ` command runs in one bash
//! session (stderr with stdout, as a terminal shows them), and its output
//! must be what the document prints, where a line `...` stands for any
//! lines, a `...` within a line for any text, and commit ids and timings
//! are compared by shape (they differ per run).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pulldown_cmark::{CodeBlockKind, Event, Options, Parser, Tag, TagEnd};
use regex::Regex;

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The documents a user reads: README.md and docs/.
pub fn documents() -> Vec<String> {
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
pub enum Marker {
    Run(String),
    RunBy { path: String, label: Option<String> },
    NotRun,
    File,
    None,
}

#[derive(Debug, Clone)]
pub struct Block {
    pub doc: String,
    pub line: usize,
    pub lang: String,
    pub body: String,
    pub marker: Marker,
}

impl Block {
    pub fn at(&self) -> String {
        format!("{}:{}", self.doc, self.line)
    }
}

pub fn marker(comment: &str) -> Marker {
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
pub fn blocks(doc: &str) -> Vec<Block> {
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

/// The first shell block of `doc` after its first line that starts (past
/// its indentation) with `label`: how a tier that walks a page names the
/// block it runs (`<!-- run by PATH: LABEL -->` on the page).
pub fn block_after(doc: &str, label: &str) -> Block {
    let text = std::fs::read_to_string(root().join(doc)).unwrap();
    let at = text
        .lines()
        .position(|l| l.trim_start().starts_with(label))
        .unwrap_or_else(|| panic!("{doc} has no line starting {label:?}"))
        + 1;
    blocks(doc)
        .into_iter()
        .find(|b| b.line > at && is_shell(&b.lang))
        .unwrap_or_else(|| panic!("{doc} has no shell block after the line starting {label:?}"))
}

pub fn is_shell(lang: &str) -> bool {
    matches!(lang, "sh" | "console" | "bash" | "shell")
}

/// The commands of a block: `$ ` lines of a console block, every line of a
/// sh block, with their continuation lines, comments left to bash.
pub fn commands(block: &Block) -> Vec<String> {
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

/// A command without the comment a document adds after it.
pub fn strip_comment(command: &str) -> String {
    match command.find("  #") {
        Some(at) => command[..at].trim_end().to_owned(),
        None => command.trim_end().to_owned(),
    }
}

pub fn git(dir: &Path, args: &[&str]) {
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

/// The pull request a models repository has checked out.
#[derive(Clone, Copy)]
pub enum PullRequest {
    /// Asks for a rollback to v1, which the operator no longer retains.
    RollbackToV1,
    /// Changes nothing about the model (its notes), so Git still asks
    /// for v3.
    Notes,
}

/// The models repository of docs/verify.md and docs/tour.md: `main` moved
/// the model `openmed-service` in `namespace` from v2 to v3 (`version`
/// names them), and a branch holds `pr`.
pub fn verify_repository(
    dir: &Path,
    namespace: &str,
    version: &dyn Fn(&str) -> String,
    pr: PullRequest,
) {
    let model = |annotations: &str, version: &str| {
        format!(
            "apiVersion: openmed.ai/v1alpha1
kind: OpenMedModel
metadata:
  name: openmed-service
  namespace: {namespace}{annotations}
spec:
  family: pii
  tier: Small
  version: {version}
  replicas: 2
"
        )
    };
    let v3 = format!("{}   # raised in #128", version("synthetic-pii-v3"));
    std::fs::create_dir(dir.join("models")).unwrap();
    let file = dir.join("models/openmed-service.yaml");
    git(dir, &["init", "--quiet", "--initial-branch=main"]);
    std::fs::write(&file, model("", &version("synthetic-pii-v2"))).unwrap();
    git(dir, &["add", "."]);
    git(dir, &["commit", "--quiet", "-m", "openmed-service: v2"]);
    std::fs::write(&file, model("", &v3)).unwrap();
    git(
        dir,
        &["commit", "--quiet", "-am", "openmed-service: v3 (#128)"],
    );
    match pr {
        PullRequest::RollbackToV1 => {
            git(dir, &["checkout", "--quiet", "-b", "rollback"]);
            let annotation = format!(
                "\n  annotations:\n    openmed.ai/rollback-to: {}",
                version("synthetic-pii-v1")
            );
            std::fs::write(&file, model(&annotation, &v3)).unwrap();
            git(
                dir,
                &["commit", "--quiet", "-am", "openmed-service: back to v1"],
            );
        }
        PullRequest::Notes => {
            git(dir, &["checkout", "--quiet", "-b", "notes"]);
            std::fs::write(dir.join("models/NOTES.md"), "v3: raised for #128\n").unwrap();
            git(dir, &["add", "."]);
            git(dir, &["commit", "--quiet", "-m", "models: notes"]);
        }
    }
}

/// What may differ between a run and the document: commit ids, timings,
/// clock times, trailing spaces.
pub fn normalize(text: &str) -> String {
    let commit = Regex::new(r"\b[0-9a-f]{40}\b|\b[0-9a-f]{12}\b").unwrap();
    let timing = Regex::new(r"\bin [0-9]+(\.[0-9]+)?(ms|s)\b").unwrap();
    let clock = Regex::new(r"\b[0-2][0-9]:[0-5][0-9]:[0-5][0-9]\b").unwrap();
    let text = commit.replace_all(text, "<commit>");
    let text = timing.replace_all(&text, "in <time>");
    let text = clock.replace_all(&text, "<clock>");
    text.lines()
        .map(str::trim_end)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether `actual` reads as `expected`, where a line `...` is any lines
/// and `...` within a line any text.
pub fn matches(expected: &[&str], actual: &[&str]) -> bool {
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

pub fn line_matches(expected: &str, actual: &str) -> bool {
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
pub fn transcript(block: &Block) -> Vec<(String, String)> {
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

pub const STEP: &str = "@@openmed-op-doc-step@@\n";

/// How long one block may take.
const BLOCK_DEADLINE: Duration = Duration::from_secs(120);

/// Runs `command` with its stdout and stderr both into `log` (as a
/// terminal shows them), polling it to the end within `deadline`; returns
/// whether it succeeded, and its output.
pub fn run_logged(mut command: Command, log: &Path, deadline: Duration) -> (bool, String) {
    let out = std::fs::File::create(log).unwrap();
    let mut child = command
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap_or_else(|e| panic!("{command:?} cannot start: {e}"));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{command:?} did not finish in {deadline:?}:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (status.success(), std::fs::read_to_string(log).unwrap())
}

/// How blocks run: `openmed-op` and the tools on `path` come first on PATH,
/// `kubeconfig` (none: no cluster) is KUBECONFIG.
pub struct Shell {
    pub path: Vec<PathBuf>,
    pub kubeconfig: Option<PathBuf>,
}

impl Shell {
    /// Runs `script` with bash in `dir`; returns its status and output
    /// (stderr with stdout).
    pub fn bash(&self, dir: &Path, options: &[&str], script: &str) -> (bool, String) {
        let path = format!(
            "{}:{}",
            std::env::join_paths(&self.path).unwrap().to_string_lossy(),
            std::env::var("PATH").unwrap_or_default()
        );
        let log = dir.join(".transcript");
        let mut command = Command::new("bash");
        command
            .args(options)
            .arg("-c")
            .arg(script)
            .current_dir(dir)
            .env("PATH", path)
            .env("NO_COLOR", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            // A user's Git knows who they are.
            .env("GIT_AUTHOR_NAME", "Model Team")
            .env("GIT_AUTHOR_EMAIL", "models@hospital.example")
            .env("GIT_COMMITTER_NAME", "Model Team")
            .env("GIT_COMMITTER_EMAIL", "models@hospital.example")
            .env_remove("KUBECONFIG");
        if let Some(kubeconfig) = &self.kubeconfig {
            command.env("KUBECONFIG", kubeconfig);
        }
        let (ok, output) = run_logged(command, &log, BLOCK_DEADLINE);
        std::fs::remove_file(&log).unwrap();
        (ok, output)
    }

    /// Runs a console block in `dir` and returns what differs from the
    /// document, if anything; `local` turns what differs by design (names
    /// a test made unique) back into the document's.
    pub fn transcript(
        &self,
        dir: &Path,
        block: &Block,
        local: &dyn Fn(&str) -> String,
    ) -> Option<String> {
        let steps = transcript(block);
        let script: String = steps
            .iter()
            .map(|(command, _)| {
                format!("{command}\n__status=$?; printf '%s' '{STEP}'; (exit $__status)\n")
            })
            .collect();
        let (_, output) = self.bash(dir, &[], &script);
        let outputs: Vec<&str> = output.split(STEP).collect();
        let mut differences = String::new();
        for (i, (command, expected)) in steps.iter().enumerate() {
            let actual = normalize(&local(outputs.get(i).copied().unwrap_or("")));
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

    /// Runs a sh block in `dir` with `set -euo pipefail`; its output if it
    /// failed.
    pub fn script(&self, dir: &Path, block: &Block) -> Option<String> {
        let (ok, output) = self.bash(dir, &["-euo", "pipefail"], &block.body);
        (!ok).then_some(output)
    }
}
