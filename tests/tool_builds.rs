//! Every cached tool build (`tests/*/build`) works on a fresh machine.
//!
//! A fresh machine has an empty Go module cache, and a step that reads a
//! module's files before anything downloaded it (`go list -m -f '{{.Dir}}'`
//! prints nothing then) passes only where an earlier build warmed the cache.
//! Each script's `--check` mode runs every step but the compiles against an
//! empty `GOMODCACHE` and `XDG_CACHE_HOME` (tests/cached-build.sh), in
//! seconds, so this suite runs it for every script there is, including
//! those added later.

use std::path::{Path, PathBuf};
use std::process::Command;

mod executables;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `tests/<tool>/build`.
fn build_scripts() -> Vec<PathBuf> {
    let mut scripts: Vec<PathBuf> = std::fs::read_dir(root().join("tests"))
        .unwrap()
        .map(|e| e.unwrap().path().join("build"))
        .filter(|p| p.is_file())
        .collect();
    scripts.sort();
    scripts
}

/// Runs `script --check`; returns (success, stdout, stderr).
fn check(script: &Path) -> (bool, String, String) {
    let out = Command::new(script)
        .arg("--check")
        .output()
        .unwrap_or_else(|e| panic!("{} runs: {e}", script.display()));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn every_tool_build_reads_only_modules_it_downloaded() {
    let scripts = build_scripts();
    let names: Vec<String> = scripts
        .iter()
        .map(|p| {
            p.parent()
                .unwrap()
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    for tool in ["canary", "cluster", "flux", "gitops", "helm"] {
        assert!(
            names.iter().any(|n| n == tool),
            "tests/{tool}/build is found: {names:?}"
        );
    }
    for script in &scripts {
        let text = std::fs::read_to_string(script).unwrap();
        assert!(
            text.contains("cached-build.sh") && text.contains("cached_build_start"),
            "{} uses the shared shape of tests/cached-build.sh",
            script.display()
        );
        let (ok, stdout, stderr) = check(script);
        assert!(ok, "{} --check failed:\n{stderr}", script.display());
        assert!(
            stderr.contains("every module-reading step works from empty caches"),
            "{} --check ran to its end:\n{stderr}",
            script.display()
        );
        assert!(
            stdout.is_empty(),
            "a check prints no cache folder: {stdout}"
        );
    }
}

/// A tool folder in a temporary directory with the canary tools' modules
/// and the given build script, beside a copy of the shared helper.
fn sandbox_tool(body: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let tool = dir.path().join("tool");
    std::fs::create_dir(&tool).unwrap();
    for file in ["go.mod", "go.sum", "tools.go"] {
        std::fs::copy(root().join("tests/canary").join(file), tool.join(file)).unwrap();
    }
    std::fs::copy(
        root().join("tests/cached-build.sh"),
        dir.path().join("cached-build.sh"),
    )
    .unwrap();
    let script = tool.join("build");
    executables::write_executable(
        &script,
        &format!(
            "#!/usr/bin/env bash\nset -euo pipefail\n. \"$(dirname \"${{BASH_SOURCE[0]}}\")/../cached-build.sh\"\n\
             cached_build_start sandbox \"$@\"\n{body}\ncached_build_finish\n"
        ),
    );
    (dir, script)
}

const CRD: &str = "config/crd/standard/gateway.networking.k8s.io_httproutes.yaml";

#[test]
fn the_check_fails_a_step_that_reads_a_module_it_did_not_download() {
    // The step that broke the canary build on a fresh machine.
    let (_dir, script) = sandbox_tool(&format!(
        "gateway=\"$(go list -m -f '{{{{.Dir}}}}' sigs.k8s.io/gateway-api)\"\ncp \"$gateway/{CRD}\" \"$BUILD_TMP/\""
    ));
    let (ok, _, stderr) = check(&script);
    assert!(!ok, "the check refuses it:\n{stderr}");
    assert!(stderr.contains("cannot stat"), "{stderr}");

    // The same step through the helper downloads first and passes.
    let (_dir, script) = sandbox_tool(&format!(
        "gateway=\"$(go_module_dir sigs.k8s.io/gateway-api)\"\ncp \"$gateway/{CRD}\" \"$BUILD_TMP/\""
    ));
    let (ok, _, stderr) = check(&script);
    assert!(ok, "go_module_dir downloads before it reads:\n{stderr}");
}

#[test]
fn a_module_the_script_does_not_require_is_an_error_not_an_empty_folder() {
    let (_dir, script) = sandbox_tool("go_module_dir example.com/not-required >/dev/null");
    let (ok, _, stderr) = check(&script);
    assert!(!ok, "{stderr}");
    assert!(stderr.contains("error:"), "{stderr}");
}

/// No script pipes a command into `grep -q`: under `set -o pipefail`, grep
/// exits at its first match, the writer dies of SIGPIPE, and the pipeline
/// fails on a match (the gateway build's Envoy version check failed one run
/// in three that way). Capture the output, then match it.
#[test]
fn no_script_pipes_into_an_early_exiting_grep() {
    let mut offenders = Vec::new();
    let mut stack = vec![
        root().join("tests"),
        root().join("examples"),
        root().join(".ci"),
    ];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            let shell = path.extension().is_some_and(|e| e == "sh")
                || text.starts_with("#!/usr/bin/env bash")
                || text.starts_with("#!/bin/bash")
                || text.starts_with("#!/bin/sh");
            if !shell {
                continue;
            }
            for (n, line) in text.lines().enumerate() {
                let code = line.split(" #").next().unwrap_or(line).trim_start();
                if code.starts_with('#') {
                    continue;
                }
                // `||` is not a pipe; `|&` is.
                let pipes = code.replace("||", "\u{0}\u{0}");
                let piped = pipes.split('|').skip(1).any(|after| {
                    after
                        .trim_start_matches('&')
                        .trim_start()
                        .starts_with("grep -q")
                });
                if piped {
                    offenders.push(format!("{}:{}: {line}", path.display(), n + 1));
                }
            }
        }
    }
    assert!(offenders.is_empty(), "{offenders:#?}");
}
