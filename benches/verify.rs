//! How long `verify` takes on a large GitOps repository.
//!
//! Builds, with git2 in a temporary directory, a repository of 1,000
//! OpenMedModel files (each beside its Deployment) and 5,000 commits on
//! `main` (every 50th a merge of a side branch), plus a pull request that
//! bumps some versions and rolls others back. 100 resources never change, so
//! the history walk has to go all the way to the first commit. Then it times
//! `verify` end to end (open, read REV and BASE, walk history, rules, text
//! output) a few times and prints the figures.
//!
//! Run with `cargo bench --bench verify`; `VERIFY_BENCH_FILES` and
//! `VERIFY_BENCH_COMMITS` change the size.

#[path = "common/gitops_repo.rs"]
mod gitops_repo;

use std::time::{Duration, Instant};

use git2::Repository;
use gitops_repo::Builder;
use openmed_op::verify::{self, Options};

const RUNS: usize = 5;

fn main() {
    let files = size("VERIFY_BENCH_FILES", 1000);
    let commits = size("VERIFY_BENCH_COMMITS", 5000);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let started = Instant::now();
    let mut builder = Builder::new(Repository::init_bare(dir.path()).expect("a repository"));
    builder.build(files, commits);
    println!(
        "repository: {files} OpenMedModel files, {commits} commits on main (+ side branches), built in {:.1?}",
        started.elapsed()
    );

    let options = Options {
        repo: dir.path().to_path_buf(),
        rev: Some("pr".into()),
        ..Options::default()
    };
    let mut times = Vec::new();
    let mut last = None;
    for _ in 0..RUNS {
        let start = Instant::now();
        let report = verify::verify(&options).expect("verify runs");
        let text = verify::output::text(&report);
        times.push(start.elapsed());
        last = Some((report, text));
    }
    let (report, text) = last.expect("at least one run");
    times.sort();
    println!(
        "verify --rev pr: {} resources, {} history commits walked, {} findings",
        report.resources.len(),
        report.history_commits,
        report.findings.len()
    );
    println!(
        "time over {RUNS} runs: min {}, median {}, max {}",
        ms(times[0]),
        ms(times[RUNS / 2]),
        ms(times[RUNS - 1])
    );
    println!("{}", text.lines().last().unwrap_or_default());
}

fn size(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}
