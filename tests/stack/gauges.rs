//! What `examples/autoscaling` adds to `examples/real`'s Deployment, as a
//! function: the real-stack tiers apply it to the canary example's
//! Deployment, and `tests/render.rs` checks that the autoscaling example is
//! exactly `examples/real` with it applied, so the two examples cannot drift.

use serde_json::{Value, json};

/// A Deployment of the service made to export its gauges to the pods'
/// Prometheus, as docs/autoscaling.md and `examples/autoscaling` tell
/// users: metrics on, dynamic batching on (the queue gauge exists only
/// with it), the pod's own address a trusted Host (the scrape's), and the
/// scrape annotation.
pub fn export_gauges(deployment: &mut Value) {
    let template = &mut deployment["spec"]["template"];
    template["metadata"]["annotations"]["prometheus.io/scrape"] = json!("true");
    for container in template["spec"]["containers"].as_array_mut().unwrap() {
        let env = container["env"].as_array_mut().unwrap();
        for e in env.iter_mut() {
            if e["name"] == "OPENMED_SERVICE_TRUSTED_HOSTS" {
                e["value"] = json!(format!("{},$(POD_IP)", e["value"].as_str().unwrap()));
            }
        }
        // Before its use in $(POD_IP).
        env.insert(
            0,
            json!({"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}),
        );
        env.push(json!({"name": "OPENMED_SERVICE_METRICS_ENABLED", "value": "true"}));
        env.push(json!({"name": "OPENMED_SERVICE_BATCHING_ENABLED", "value": "true"}));
    }
}
