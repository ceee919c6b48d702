//! End-to-end tests on the real stack (`tests/workload/up`): the OpenMed
//! REST service from PyPI in pods that are real processes, Envoy Gateway
//! with a real Envoy in front of them, real load through the Gateway while
//! the operator rolls the model, and Prometheus scraping Envoy.
//!
//! The harness brings the stack up once in `target/workload` (or reuses a
//! running one), runs the tests, each in its own namespace with its own
//! operator and its own route (`/<namespace>/...` on the shared Gateway),
//! and takes the stack down again if it brought it up. README's
//! `examples/quickstart --real` walks on the same stack (tests/stack/quickstart.rs).

// Shared with the end-to-end and chaos suites; this one uses a part.
#[allow(dead_code)]
#[path = "../e2e/support.rs"]
mod support;

#[allow(dead_code)]
#[path = "../e2e/env.rs"]
mod env;

// The pages' blocks, run where the stack shows what they show.
#[allow(dead_code)]
#[path = "../doc_blocks/mod.rs"]
mod doc_blocks;
#[allow(dead_code)]
#[path = "../e2e/docs.rs"]
mod docs;

// Shared with the other real-stack binaries; this one uses a part.
#[allow(dead_code)]
mod app;
mod crash;
mod ports;
mod quality;
mod quickstart;
mod recreate;
mod retry;
mod rollout;

use libtest_mimic::{Arguments, Trial};
pub use support::trial;

fn main() {
    support::use_cluster_dir(support::root().join("target/workload"));
    env::set_status_deadline(app::WARM);
    let args = Arguments::from_args();
    let mut trials: Vec<Trial> = rollout::trials();
    trials.extend(crash::trials());
    trials.extend(recreate::trials());
    trials.extend(quality::trials());
    trials.extend(ports::trials());
    trials.extend(retry::trials());
    trials.extend(quickstart::trials());
    let any_selected = trials.iter().any(|t| support::selected(&args, t.name()));
    let started = any_selected && !args.list && app::start_stack();
    let conclusion = libtest_mimic::run(&args, trials);
    if started {
        app::stop_stack();
    }
    support::print_failure_summary();
    conclusion.exit();
}
