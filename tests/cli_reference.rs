//! The command line's generated reference: shell completions and manual
//! pages come from the same clap definitions the binary parses, and the
//! binary answers as the kubectl plugin when installed as `kubectl-openmed`.

use std::path::Path;
use std::process::{Command, Output};

const BINARY: &str = env!("CARGO_BIN_EXE_openmed-op");

/// Every subcommand a user can type.
const COMMANDS: [&str; 14] = [
    "crd",
    "render",
    "verify",
    "run",
    "canary",
    "promote",
    "abort",
    "pause",
    "resume",
    "status",
    "list",
    "rollback",
    "wait",
    "completions",
];

fn run(program: &Path, args: &[&str]) -> Output {
    Command::new(program).args(args).output().expect("runs")
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

#[test]
fn completions_name_every_command_in_every_shell() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script = stdout(&run(Path::new(BINARY), &["completions", shell]));
        for command in COMMANDS {
            assert!(script.contains(command), "{shell}: no {command}");
        }
        // Where the shell completes values, the outcomes of `wait --for`.
        if ["bash", "zsh", "fish"].contains(&shell) {
            assert!(
                script.contains("rolled-back"),
                "{shell}: no wait --for values"
            );
        }
    }
    let out = run(Path::new(BINARY), &["completions", "tcsh"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "an unknown shell is a usage error"
    );
}

#[test]
fn man_writes_a_page_per_command() {
    let top = stdout(&run(Path::new(BINARY), &["man"]));
    assert!(
        top.starts_with(".ie") || top.contains(".TH openmed-op 1"),
        "{top}"
    );
    for command in COMMANDS {
        assert!(top.contains(command), "the top page lists {command}");
    }
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        Path::new(BINARY),
        &["man", "--dir", dir.path().to_str().unwrap()],
    );
    assert!(out.status.success());
    for command in COMMANDS {
        let page = std::fs::read_to_string(dir.path().join(format!("openmed-op-{command}.1")))
            .unwrap_or_else(|e| panic!("openmed-op-{command}.1: {e}"));
        assert!(
            page.contains(&format!(".TH openmed-op-{command} 1")),
            "{page}"
        );
    }
    let rollback = std::fs::read_to_string(dir.path().join("openmed-op-rollback.1")).unwrap();
    assert!(
        rollback.contains("retained"),
        "the long help is in the page"
    );
}

#[test]
fn installed_as_kubectl_openmed_it_is_the_plugin() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = dir.path().join("kubectl-openmed");
    std::os::unix::fs::symlink(BINARY, &plugin).unwrap();
    let help = stdout(&run(&plugin, &["--help"]));
    assert!(help.contains("Usage: kubectl openmed <COMMAND>"), "{help}");
    let help = stdout(&run(&plugin, &["wait", "--help"]));
    assert!(help.contains("Usage: kubectl openmed wait"), "{help}");
    // Its completions are for the name it is installed as.
    let script = stdout(&run(&plugin, &["completions", "bash"]));
    assert!(script.contains("kubectl-openmed"), "{script}");
    // Under its own name, nothing changes.
    let help = stdout(&run(Path::new(BINARY), &["--help"]));
    assert!(help.contains("Usage: openmed-op <COMMAND>"), "{help}");
}
