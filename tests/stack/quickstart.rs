//! README's `examples/quickstart --real`, run as printed on the stack this
//! suite started (the walk's default folder is the suite's, and the walk
//! leaves a stack it found running): a bump under load, then a model the
//! service cannot load, crash-looping and rolled back, while clients of the
//! serving version keep being served.

use std::process::Command;
use std::time::Duration;

use crate::doc_blocks::{block_after, commands, run_logged, strip_comment};
use crate::support::*;

pub fn trials() -> Vec<libtest_mimic::Trial> {
    vec![trial(
        "quickstart::the_real_walk_serves_every_request_through_a_bump_and_a_crash_loop",
        the_real_walk_serves_every_request_through_a_bump_and_a_crash_loop,
    )]
}

/// The README line before the block.
const LABEL: &str = "and on the real OpenMed service behind Envoy Gateway";

/// The walk: about 40 s of bump and 60 s of crash loop under load, the
/// warm-up of four pods and the rollback's, on a shared machine.
const DEADLINE: Duration = Duration::from_secs(420);

/// The one command of README's block after [`LABEL`].
fn readme_command() -> String {
    let block = block_after("README.md", LABEL);
    let mut lines = commands(&block);
    assert_eq!(lines.len(), 1, "{}: one command", block.at());
    strip_comment(&lines.remove(0))
}

/// The load generator `cargo test` built beside the tests (the walk would
/// otherwise build a release one).
fn load_generator() -> std::path::PathBuf {
    let path = root().join("target/debug/openmed-load");
    if !path.exists() {
        let status = Command::new(env!("CARGO"))
            .args(["build", "--quiet", "-p", "openmed-load"])
            .current_dir(root())
            .status()
            .expect("cargo runs");
        assert!(status.success(), "cargo build -p openmed-load");
    }
    path
}

/// A phase's line: `  NAME: N requests in S s, F failed; ...`, as
/// (requests, failed).
fn phase(output: &str, name: &str) -> (usize, usize) {
    let prefix = format!("  {name}: ");
    let line = output
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no line for the phase {name:?}:\n{output}"));
    let number = |before: &str| -> usize {
        let end = line
            .find(before)
            .unwrap_or_else(|| panic!("{name}: {line}"));
        line[..end]
            .rsplit(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{name}: {line}"))
    };
    (number(" requests"), number(" failed"))
}

fn the_real_walk_serves_every_request_through_a_bump_and_a_crash_loop() {
    let command = readme_command();
    assert_eq!(command, "examples/quickstart --real");
    let dir = cluster_dir();
    let log = dir.join("logs/quickstart-real.log");
    let mut bash = Command::new("bash");
    bash.arg("-c")
        .arg(&command)
        .current_dir(root())
        .env("OPENMED_OP", binary())
        .env("OPENMED_LOAD", load_generator())
        .env_remove("QUICKSTART_DIR")
        .env_remove("KUBECONFIG");
    let (ok, output) = run_logged(bash, &log, DEADLINE);
    assert!(ok, "{command} failed:\n{output}");
    assert!(
        output.contains(&format!(
            "using the running real stack in {}",
            "target/workload"
        )),
        "the walk used the suite's stack:\n{output}"
    );
    for name in ["the bump", "the crash loop and the rollback"] {
        let (requests, failed) = phase(&output, name);
        assert!(requests > 0, "{name}: no request was sent:\n{output}");
        assert_eq!(failed, 0, "{name}: requests failed:\n{output}");
    }
    // The events: v2 rolled out, the missing model's pods crash-looped
    // (the event quotes the service's own error), and the rollback.
    for (reason, says) in [
        (
            "RolloutSucceeded",
            "OpenMed/synthetic-pii-v2 is ready on every pod",
        ),
        ("RolloutFailed", "keeps crashing"),
        ("RollbackSucceeded", "restored OpenMed/synthetic-pii-v2"),
    ] {
        assert!(
            output
                .lines()
                .any(|l| l.contains(&format!(" {reason} ")) && l.contains(says)),
            "no {reason} event saying {says:?}:\n{output}"
        );
    }
    // The stack is still up for the other trials.
    assert!(
        dir.join("gateway-url").exists() && cluster_running(),
        "the walk stopped the suite's stack"
    );
}
