//! The fault-injection suite: the operator under crashes, API errors, cut
//! watches and a second instance, on the real control plane, with its
//! promises checked continuously ([`invariants`]) while each fault is
//! active.
//!
//! Every scenario is seeded. A run prints its seed; the same seed replays
//! the same faults at the same points:
//!
//! ```text
//! cargo test --test chaos                                  # the bounded subset CI runs
//! CHAOS_SEED=1234 cargo test --test chaos -- crash_sweep_rollout   # replay one run
//! CHAOS_FULL=1 CHAOS_RESULTS=benches/results/chaos.jsonl cargo test --release --test chaos
//! ```
//!
//! `CHAOS_FULL=1` runs every crash point of every sweep and each scenario
//! `CHAOS_RUNS` times (default 20); without it, each sweep visits a seeded
//! sample of points once. `CHAOS_RESULTS` appends one JSON line per
//! scenario: runs, violations, seeds and the time each run took to converge.
//! docs/reliability.md explains the scenarios and the committed results.

#[allow(dead_code)]
#[path = "../e2e/support.rs"]
mod support;

#[allow(dead_code)]
#[path = "../e2e/env.rs"]
mod env;

mod invariants;
mod proxy;
mod scenarios;
mod stage;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use libtest_mimic::{Arguments, Trial};

fn main() {
    let args = Arguments::from_args();
    let trials = scenarios::all()
        .into_iter()
        .map(|(name, scenario)| {
            Trial::test(format!("chaos::{name}"), move || {
                run(name, scenario).map_err(Into::into)
            })
        })
        .collect::<Vec<_>>();
    let any_selected = trials.iter().any(|t| support::selected(&args, t.name()));
    let started = any_selected && !args.list && support::start_cluster();
    let conclusion = libtest_mimic::run(&args, trials);
    if started {
        support::stop_cluster();
    }
    conclusion.exit();
}

/// How much of the suite runs.
#[derive(Debug, Clone, Copy)]
pub struct Mode {
    /// Every crash point, not a sample.
    pub full: bool,
    /// Runs per scenario.
    pub runs: u32,
}

impl Mode {
    fn from_env() -> Mode {
        let full = std::env::var("CHAOS_FULL").is_ok_and(|v| v == "1");
        let runs = std::env::var("CHAOS_RUNS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(if full { 20 } else { 1 });
        Mode { full, runs }
    }
}

/// The seed of the first run (`CHAOS_SEED`, else the clock); run `i` uses
/// seed + i, so a printed seed replays with `CHAOS_SEED=<seed> CHAOS_RUNS=1`.
fn base_seed() -> u64 {
    std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                % 1_000_000_007
        })
}

/// What a scenario run reports.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Broken promises.
    pub violations: Vec<String>,
    /// Promises a scenario breaks on purpose (two writers without leader
    /// election), to show what leader election prevents.
    pub expected_breakage: Vec<String>,
    /// Time to converge after each fault.
    pub converge: Vec<Duration>,
    /// Crash points or faults visited.
    pub points: u32,
}

pub type Scenario = fn(Mode, u64) -> Outcome;

/// Scenarios that restart a control-plane component run alone: every other
/// scenario's test client would see the outage too.
static CONTROL_PLANE: std::sync::RwLock<()> = std::sync::RwLock::new(());

fn run(name: &str, scenario: Scenario) -> Result<(), String> {
    let _turn = if name.starts_with("restart_") {
        Ok(CONTROL_PLANE.write().unwrap_or_else(|e| e.into_inner()))
    } else {
        Err(CONTROL_PLANE.read().unwrap_or_else(|e| e.into_inner()))
    };
    let mode = Mode::from_env();
    let base = base_seed();
    let mut failures = Vec::new();
    let mut seeds = Vec::new();
    let mut all = Outcome::default();
    let started = Instant::now();
    for i in 0..mode.runs {
        let seed = base.wrapping_add(u64::from(i));
        seeds.push(seed);
        eprintln!(
            "chaos::{name}: run {}/{} seed {seed} (replay: CHAOS_SEED={seed} CHAOS_RUNS=1{} cargo test --test chaos -- {name})",
            i + 1,
            mode.runs,
            if mode.full { " CHAOS_FULL=1" } else { "" }
        );
        // A run that panics (a wait that timed out) is a violation of its
        // own, with its seed; the other runs go on.
        let outcome = std::panic::catch_unwind(|| scenario(mode, seed)).unwrap_or_else(|panic| {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panicked".into());
            Outcome {
                violations: vec![format!("the run did not complete: {message}")],
                ..Outcome::default()
            }
        });
        record(name, mode, &[seed], &outcome, Some(i + 1), Duration::ZERO);
        if !outcome.violations.is_empty() {
            failures.push(format!("seed {seed}: {:#?}", outcome.violations));
        }
        all.violations.extend(outcome.violations);
        all.expected_breakage.extend(outcome.expected_breakage);
        all.converge.extend(outcome.converge);
        all.points += outcome.points;
    }
    record(name, mode, &seeds, &all, None, started.elapsed());
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!("invariants violated:\n{}", failures.join("\n")))
    }
}

/// Appends results to `CHAOS_RESULTS`, if set: one line per run (`run`:
/// its number), so a long full run keeps what it has done, and one line
/// for the scenario (`run`: null) when all its runs are done.
fn record(
    name: &str,
    mode: Mode,
    seeds: &[u64],
    outcome: &Outcome,
    run: Option<u32>,
    took: Duration,
) {
    let mut converge: Vec<f64> = outcome.converge.iter().map(Duration::as_secs_f64).collect();
    converge.sort_by(f64::total_cmp);
    let quantile = |q: f64| {
        converge
            .get(((converge.len() as f64 - 1.0) * q).round() as usize)
            .copied()
    };
    let line = serde_json::json!({
        "scenario": name,
        "run": run,
        "full": mode.full,
        "runs": if run.is_some() { 1 } else { mode.runs },
        "points": outcome.points,
        "violations": outcome.violations.len(),
        "violation_messages": outcome.violations,
        "expected_breakage": outcome.expected_breakage.len(),
        "expected_breakage_messages": outcome.expected_breakage,
        "seeds": seeds,
        "converge_seconds": {"p50": quantile(0.5), "p90": quantile(0.9), "max": quantile(1.0)},
        "wall_seconds": took.as_secs_f64(),
    });
    if run.is_none() {
        eprintln!("chaos::{name}: {line}");
    }
    if let Ok(path) = std::env::var("CHAOS_RESULTS") {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .expect("CHAOS_RESULTS is writable");
        writeln!(file, "{line}").unwrap();
    }
}
