//! README's quick start, run as printed: each line of its
//! `examples/quickstart` block, on a control plane of its own
//! (`target/quickstart/<variant>`, so the suite's own is untouched; they
//! start first and run beside the other trials, mostly waiting), with
//! the binary under test as `OPENMED_OP` (the script would otherwise
//! build a release one). The walk on the real stack (`--real`) runs in
//! the stack suite, on its stack (tests/stack/quickstart.rs). Each must
//! succeed, and the transcripts docs/tour.md and docs/canary.md print must
//! be what it printed (clock times and ages compared by shape; a line
//! `...` in the page stands for the status lines a half-second sampling
//! may or may not catch).

use std::process::Command;
use std::time::Duration;

use crate::doc_blocks::{
    block_after, blocks, commands, matches, normalize, root, run_logged, strip_comment, transcript,
};
use crate::trial;

pub fn trials() -> Vec<libtest_mimic::Trial> {
    vec![
        trial(
            "quickstart::it_rolls_out_then_rolls_back_as_the_tour_prints",
            it_rolls_out_then_rolls_back_as_the_tour_prints,
        ),
        trial(
            "quickstart::its_canary_steps_and_promotes_as_canary_md_prints",
            its_canary_steps_and_promotes_as_canary_md_prints,
        ),
    ]
}

/// The README line before the block.
const LABEL: &str = "To watch the operator work";

/// How long one walk may take, once the tools it starts are built.
const DEADLINE: Duration = Duration::from_secs(300);

/// The command of README's block whose flag is `flag` (none: the plain one).
fn readme_command(flag: Option<&str>) -> String {
    let block = block_after("README.md", LABEL);
    commands(&block)
        .into_iter()
        .map(|c| strip_comment(&c))
        .find(|c| c.split_whitespace().nth(1) == flag)
        .unwrap_or_else(|| panic!("README's quick start has no line with {flag:?}"))
}

/// Runs `command` from the repository's root, polling it to the end within
/// [`DEADLINE`]; returns its output (stderr with stdout).
fn run(command: &str, variant: &str) -> String {
    let dir = root().join("target/quickstart").join(variant);
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("transcript.log");
    eprintln!("quickstart: {command} (QUICKSTART_DIR={})", dir.display());
    let mut bash = Command::new("bash");
    bash.arg("-c")
        .arg(command)
        .current_dir(root())
        .env("OPENMED_OP", crate::support::binary())
        .env("QUICKSTART_DIR", &dir)
        .env_remove("KUBECONFIG");
    let (ok, output) = run_logged(bash, &log, DEADLINE);
    assert!(ok, "{command} failed:\n{output}");
    output
}

/// What the page's transcript of `command` says it prints.
fn page_transcript(doc: &str, command: &str) -> String {
    let block = blocks(doc)
        .into_iter()
        .find(|b| b.lang == "console" && b.body.starts_with(&format!("$ {command}\n")))
        .unwrap_or_else(|| panic!("{doc} has no transcript of {command}"));
    let mut steps = transcript(&block);
    assert_eq!(steps.len(), 1, "{}: one command", block.at());
    steps.remove(0).1
}

fn assert_reads_as(doc: &str, command: &str, output: &str) {
    let expected = normalize(&page_transcript(doc, command));
    let actual = normalize(output);
    let want: Vec<&str> = expected.lines().collect();
    let got: Vec<&str> = actual.lines().collect();
    assert!(
        matches(&want, &got),
        "{doc} prints for {command}:\n{expected}\n--- it printed:\n{actual}"
    );
}

/// The pages that print a walk's transcript, and the command they show.
const TOUR: (&str, &str) = ("docs/tour.md", "examples/quickstart");
const CANARY: (&str, &str) = ("docs/canary.md", "examples/quickstart --canary");

fn it_rolls_out_then_rolls_back_as_the_tour_prints() {
    let command = readme_command(None);
    assert_eq!(command, TOUR.1, "README and {} show one command", TOUR.0);
    let output = run(&command, "plain");
    assert_reads_as(TOUR.0, &command, &output);
}

fn its_canary_steps_and_promotes_as_canary_md_prints() {
    let command = readme_command(Some("--canary"));
    assert_eq!(
        command, CANARY.1,
        "README and {} show one command",
        CANARY.0
    );
    // The walk installs the Gateway API CRDs from the canary tools; a
    // first build of them (in CI, still under way beside the first tiers)
    // is not the walk's time.
    crate::support::built_tools("tests/canary/build");
    let output = run(&command, "canary");
    assert_reads_as(CANARY.0, &command, &output);
}
