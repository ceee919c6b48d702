//! The real-traffic canaries (`canary.rs`) on the real stack, in a test
//! binary of their own. Cargo runs test binaries one after the other, so
//! no canary moves the Gateway's routes, or loads its CPU, while the
//! scenarios of `main.rs` judge every request of theirs: run side by side,
//! those saw a single 503 from Envoy now and then, which they must not.
//!
//!     cargo test --test stack-canary

// Shared with the other suites; this one uses a part.
#[allow(dead_code)]
#[path = "../e2e/support.rs"]
mod support;

#[allow(dead_code)]
#[path = "../e2e/env.rs"]
mod env;

#[allow(dead_code)]
mod app;
mod canary;
// Shared with tests/render.rs, which keeps examples/autoscaling in step.
mod gauges;

use libtest_mimic::Arguments;
pub use support::trial;

fn main() {
    support::use_cluster_dir(support::root().join("target/workload"));
    env::set_status_deadline(app::WARM);
    let args = Arguments::from_args();
    let trials = canary::trials();
    let any_selected = trials.iter().any(|t| support::selected(&args, t.name()));
    let started = any_selected && !args.list && app::start_stack();
    if any_selected && !args.list {
        support::block_on(merge_canary_backends());
    }
    let conclusion = libtest_mimic::run(&args, trials);
    if started {
        app::stop_stack();
    }
    support::print_failure_summary();
    conclusion.exit();
}

/// Envoy Gateway makes one Envoy cluster per route rule, so its statistics
/// cannot tell a canary backend's requests from the stable one's. With
/// `mergeBackends` selecting the Services labelled
/// `openmed.ai/envoy-cluster: own` (the canary example's two), each is an
/// Envoy cluster of its own, `service/<namespace>/<name>/<port>/...`, which
/// the analysis queries select (docs/canary.md). Set here, for these
/// scenarios only: the other real-stack scenarios run on the stack as
/// `tests/workload/up` makes it.
async fn merge_canary_backends() {
    use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
    let client = support::admin().await;
    let gvk = GroupVersionKind::gvk("gateway.envoyproxy.io", "v1alpha1", "EnvoyProxy");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "envoyproxies");
    let proxies: Api<DynamicObject> =
        Api::namespaced_with(client, "envoy-gateway-system", &resource);
    let merge = serde_json::json!({"spec": {"mergeBackends": {
        "selector": {"matchLabels": {"openmed.ai/envoy-cluster": "own"}}}}});
    proxies
        .patch(
            "process-pods",
            &PatchParams::default(),
            &Patch::Merge(merge),
        )
        .await
        .expect("the EnvoyProxy of tests/workload/up takes mergeBackends");
}
