//! The example Gateway's retry policy (`examples/real/gateway.yaml`) at
//! work: a request Envoy cannot connect with reached no pod, so Envoy sends
//! it again to another one, and a pod that does not listen (yet, or any
//! more) costs no request. Without the policy, a share of requests as large
//! as the refusing endpoints' would fail with a 503 (`UF`).
//!
//! The test gives the route's Service one more endpoint, in an
//! EndpointSlice of its own, that refuses every connection: a ready pod's
//! address on a port nothing in that pod listens on. Envoy balances over it
//! with the real pods; the load sees no failure while Envoy meets refused
//! connections and retries them on the real pods.

use std::time::Duration;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, Patch, PatchParams};
use libtest_mimic::Trial;
use serde_json::json;

use crate::app::*;
use crate::support::*;
use crate::trial;

pub fn trials() -> Vec<Trial> {
    vec![trial(
        "retry::a_request_refused_at_connect_is_sent_to_another_pod",
        a_request_refused_at_connect_is_sent_to_another_pod,
    )]
}

/// A port no pod of the example listens on (the service listens on 8080).
const REFUSING_PORT: i32 = 1;

fn a_request_refused_at_connect_is_sent_to_another_pod() {
    block_on(async {
        let app = App::deploy("stack-retry").await;
        let ns = app.env.ns.name.clone();
        let pods = app.pods().await;
        let address = pods
            .iter()
            .find_map(|p| p.status.as_ref()?.pod_ip.clone())
            .expect("a pod with an address");
        let slice: EndpointSlice = serde_json::from_value(json!({
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": "openmed-service-refusing",
                "labels": {
                    "kubernetes.io/service-name": NAME,
                    // Not the EndpointSlice controller's: it leaves it.
                    "endpointslice.kubernetes.io/managed-by": "openmed-op-tests",
                },
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [address], "conditions": {"ready": true}}],
            "ports": [{"name": "http", "port": REFUSING_PORT, "protocol": "TCP"}],
        }))
        .unwrap();
        let slices: Api<EndpointSlice> = Api::namespaced(app.env.client.clone(), &ns);
        slices
            .patch(
                "openmed-service-refusing",
                &PatchParams::apply("openmed-op-tests").force(),
                &Patch::Apply(&slice),
            )
            .await
            .expect("the refusing EndpointSlice");

        // Envoy has the endpoint once its cluster has one member more than
        // the ready pods.
        let cluster = format!("httproute/{ns}/");
        let members = pods.len() as f64 + 1.0;
        wait_for(
            "Envoy to balance over the refusing endpoint too",
            Duration::from_secs(60),
            || async {
                let total = envoy_counter(&cluster, "membership_total").await;
                (total >= members).then_some(())
            },
        )
        .await;
        let refused_before = envoy_counter(&cluster, "upstream_cx_connect_fail").await;
        let retried_before = envoy_counter(&cluster, "upstream_rq_retry_success").await;

        // 300 requests at 20/s; with one endpoint in three refusing, about
        // a hundred meet it first.
        let (_stop, load) = app.load(Some(V1), 20.0, Duration::from_secs(15));
        let records = load.await.unwrap();
        let refused = envoy_counter(&cluster, "upstream_cx_connect_fail").await - refused_before;
        let retried = envoy_counter(&cluster, "upstream_rq_retry_success").await - retried_before;
        eprintln!(
            "retry::a_request_refused_at_connect_is_sent_to_another_pod: {} requests, {} failed; Envoy: {refused} connections refused, {retried} requests retried with success",
            records.len(),
            records.iter().filter(|r| !r.ok()).count()
        );
        assert!(records.len() >= 200, "the load ran: {}", records.len());
        assert_all_served(&records);
        assert_answered_as_named(&records, V1);
        assert!(
            refused > 0.0,
            "Envoy met the refusing endpoint (connections refused: {refused})"
        );
        assert!(
            retried > 0.0,
            "Envoy retried what was refused on another pod (successful retries: {retried})"
        );
        record_result(json!({
            "scenario": "a_request_refused_at_connect_is_sent_to_another_pod",
            "rps": 20, "requests": records.len(),
            "failed": records.iter().filter(|r| !r.ok()).count(),
            "connections_refused": refused, "retries_succeeded": retried,
        }));
        app.env.finish().await;
    });
}
