//! End-to-end tests on a real control plane: etcd, kube-apiserver and
//! kube-controller-manager built from the Kubernetes sources, and a test
//! kubelet (`tests/cluster`) that simulates most pods (Ready unless the
//! model version they would preload is listed as unready) and runs as
//! processes the pods whose images are in its image map.
//!
//! The harness starts the control plane once (or reuses one started with
//! `tests/cluster/up`), runs the tests in parallel, each in its own
//! namespace and with its own operator process, and stops the control plane
//! if it started it.

mod admission;
mod autoscaling;
mod canary;
mod cluster;
mod deploy;
// Shared with the offline tier of the documents' blocks.
#[allow(dead_code)]
#[path = "../doc_blocks/mod.rs"]
mod doc_blocks;
mod docs;
mod env;
mod faults;
mod flux;
mod gitops;
mod helm;
mod kubelet;
mod leader;
mod operator;
mod operator_pods;
mod plugin;
mod quickstart;
mod render;
mod snapshots;
mod soak;
mod support;

use libtest_mimic::Arguments;
pub use support::trial;

/// Trials at a time unless `--test-threads` says otherwise. They mostly
/// wait (on the control plane, the operator's timers, a soak, Flux's
/// intervals), so libtest's default here, one per core, left the two cores
/// of CI mostly idle.
const THREADS: usize = 4;

fn main() {
    let mut args = Arguments::from_args();
    args.test_threads = args.test_threads.or(Some(THREADS));
    let mut trials = Vec::new();
    // The quick start's walks first: each has a control plane of its own
    // and runs for minutes, mostly waiting, beside the trials below.
    trials.extend(quickstart::trials());
    trials.extend(cluster::trials());
    trials.extend(operator::trials());
    trials.extend(snapshots::trials());
    trials.extend(faults::trials());
    trials.extend(deploy::trials());
    trials.extend(gitops::trials());
    trials.extend(flux::trials());
    trials.extend(leader::trials());
    trials.extend(canary::trials());
    trials.extend(admission::trials());
    trials.extend(plugin::trials());
    trials.extend(helm::trials());
    trials.extend(render::trials());
    trials.extend(kubelet::trials());
    trials.extend(soak::trials());
    trials.extend(autoscaling::trials());
    trials.extend(docs::trials());
    let any_selected = trials.iter().any(|t| support::selected(&args, t.name()));
    let started = any_selected && !args.list && support::start_cluster();
    let conclusion = libtest_mimic::run(&args, trials);
    flux::stop();
    if started {
        support::stop_cluster();
    }
    support::print_failure_summary();
    conclusion.exit();
}
