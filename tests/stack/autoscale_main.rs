//! Autoscaling on the real stack (`autoscale.rs`), in a test binary of its
//! own: its load is meant to overwhelm two pods, and the pods it scales
//! to warm a model each, which must not share the CPUs with the scenarios
//! of `main.rs` and `canary_main.rs` that judge every request of theirs.
//!
//!     cargo test --test stack-autoscale                  # the scenario CI runs
//!     AUTOSCALE_ALL=1 cargo test --test stack-autoscale  # and the longer ones

// Shared with the other suites; this one uses a part.
#[allow(dead_code)]
#[path = "../e2e/support.rs"]
mod support;

#[allow(dead_code)]
#[path = "../e2e/env.rs"]
mod env;

#[allow(dead_code)]
mod app;
mod autoscale;

use libtest_mimic::Arguments;
pub use support::trial;

fn main() {
    support::use_cluster_dir(support::root().join("target/workload"));
    env::set_status_deadline(app::WARM);
    let mut args = Arguments::from_args();
    // One scenario at a time: each loads the machine's CPUs on purpose.
    args.test_threads.get_or_insert(1);
    let trials = autoscale::trials();
    let any_selected = trials.iter().any(|t| support::selected(&args, t.name()));
    let started = any_selected && !args.list && app::start_stack();
    let conclusion = libtest_mimic::run(&args, trials);
    if started {
        app::stop_stack();
    }
    support::print_failure_summary();
    conclusion.exit();
}
