//! Two operators with `--leader-elect`, as `deploy/operator` runs them, on
//! the real API server and with the install's own RBAC for the Lease: only
//! the holder writes, the other takes over when the holder is SIGKILLed, and
//! with both running no event is recorded twice.
//!
//! One trial: the Lease `openmed-system/openmed-operator` is the install's,
//! so two trials could not use it at once.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams};
use libtest_mimic::Trial;
use serde_json::json;

use crate::operator::{Env, ROLLOUT, deployment_yaml, model_yaml};
use crate::support::*;
use crate::trial;

pub fn trials() -> Vec<Trial> {
    vec![trial(
        "leader::one_instance_writes_and_the_other_takes_over_when_it_is_killed",
        one_instance_writes_and_the_other_takes_over_when_it_is_killed,
    )]
}

/// Rollout-and-rollback cycles with both instances running.
const CYCLES: usize = 20;

const ELECT: &[&str] = &[
    "--leader-elect",
    "--leader-elect-resource-namespace=openmed-system",
];

/// The kube-controller-manager defaults, which the failover figure is for.
const LEASE_DURATION: Duration = Duration::from_secs(15);

fn leases(client: &kube::Client) -> Api<Lease> {
    Api::namespaced(client.clone(), "openmed-system")
}

async fn holder(env: &Env) -> Option<String> {
    leases(&env.client)
        .get_opt("openmed-operator")
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec?.holder_identity)
}

async fn leads(operator: &Operator) -> Option<bool> {
    let metrics = http_get(&operator.addr, "/metrics").await?;
    let line = metrics
        .lines()
        .find(|l| l.starts_with("leader_election_master_status{name=\"openmed-operator\"}"))?;
    Some(line.ends_with(" 1"))
}

/// Waits until exactly one of `operators` says it leads; returns its index.
async fn the_leader(operators: &[&Operator]) -> usize {
    wait_for("exactly one operator to lead", ROLLOUT, || async {
        let mut leading = Vec::new();
        for (i, operator) in operators.iter().enumerate() {
            match leads(operator).await {
                Some(true) => leading.push(i),
                Some(false) => {}
                None => return None,
            }
        }
        (leading.len() == 1).then(|| leading[0])
    })
    .await
}

/// The instance (its Lease identity) behind each write request about the
/// test's namespace in the audit log since `from`, with its time.
fn writers(namespace: &str, from: u64) -> Vec<(String, String, SystemTime)> {
    operator_requests(namespace, from)
        .into_iter()
        .filter(|e| {
            matches!(
                e["verb"].as_str(),
                Some("create" | "update" | "patch" | "delete")
            )
        })
        .map(|e| {
            let agent = e["userAgent"].as_str().unwrap_or_default();
            let identity = agent
                .split_once(" (")
                .map(|(_, rest)| rest.trim_end_matches(')').to_owned())
                .unwrap_or_default();
            let at: k8s_openapi::jiff::Timestamp = e["requestReceivedTimestamp"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap();
            let uri = e["requestURI"].as_str().unwrap_or_default().to_owned();
            (identity, uri, SystemTime::from(at))
        })
        .collect()
}

fn one_instance_writes_and_the_other_takes_over_when_it_is_killed() {
    block_on(async {
        let mut env = Env::with_operator_args("leader", ELECT).await;
        // Begin from no Lease, whatever an earlier run left.
        let _ = leases(&env.client)
            .delete("openmed-operator", &DeleteParams::default())
            .await;
        env.operator.restart();
        let mut second = Operator::start_instance(&env.ns.name, "b", ELECT);
        let (v1, v2) = (env.version("v1"), env.version("v2"));
        env.apply(&deployment_yaml("svc", "openmed-service", "boot"))
            .await;
        let from = audit_log_end();
        env.apply(&model_yaml("svc", &v1, "")).await;
        env.wait_ready("svc", &v1).await;

        // Exactly one leads; every write came from the Lease's holder.
        let leader = the_leader(&[&env.operator, &second]).await;
        let holding = holder(&env).await.expect("a holder");
        let written = writers(&env.ns.name, from);
        assert!(!written.is_empty());
        let foreign: Vec<_> = written.iter().filter(|(who, ..)| *who != holding).collect();
        assert!(
            foreign.is_empty(),
            "writes by an instance that does not hold the Lease ({holding}): {foreign:?}"
        );
        // The follower is warm: synced and ready to take over.
        let follower_addr = if leader == 0 {
            second.addr.clone()
        } else {
            env.operator.addr.clone()
        };
        wait_for("the follower's /readyz", ROLLOUT, || {
            http_get(&follower_addr, "/readyz")
        })
        .await;

        // SIGKILL the leader, then ask for a rollout: the other instance
        // makes its first write once the Lease has expired.
        if leader == 0 {
            env.operator.kill();
        } else {
            second.kill();
        }
        let killed_at = SystemTime::now();
        let from = audit_log_end();
        env.set_spec("svc", json!({"version": v2})).await;
        env.wait_ready("svc", &v2).await;
        let successor = holder(&env).await.expect("a holder");
        assert_ne!(successor, holding, "the Lease changed hands");
        let written = writers(&env.ns.name, from);
        assert!(
            written.iter().all(|(who, ..)| *who == successor),
            "{written:?}"
        );
        let first = written.iter().map(|(.., at)| *at).min().unwrap();
        let failover = first.duration_since(killed_at).unwrap_or_default();
        println!(
            "failover: leader SIGKILLed → first write by the new leader: {:.2} s (lease duration {} s)",
            failover.as_secs_f64(),
            LEASE_DURATION.as_secs()
        );
        let lease = leases(&env.client).get("openmed-operator").await.unwrap();
        assert!(lease.spec.unwrap().lease_transitions.unwrap_or(0) >= 1);

        // The killed one comes back as a follower; with both running, over
        // many rollouts and rollbacks, every event is recorded once.
        if leader == 0 {
            env.operator.restart();
        } else {
            second.restart();
        }
        let from = audit_log_end();
        for _ in 0..CYCLES {
            env.annotate("svc", "openmed.ai/rollback-to", Some(&v1))
                .await;
            env.wait_manual_rollback("svc", &v1).await;
            env.annotate("svc", "openmed.ai/rollback-to", None).await;
            env.wait_ready("svc", &v2).await;
        }
        let written = writers(&env.ns.name, from);
        assert!(
            written.iter().all(|(who, ..)| *who == successor),
            "only the leader writes"
        );
        // Each cycle decides one RollbackSucceeded; a second writer would
        // record it twice (or count it twice).
        let events = env.event_reasons("svc").await;
        let succeeded: i32 = events
            .iter()
            .filter(|(reason, _)| reason == "RollbackSucceeded")
            .map(|(_, n)| *n)
            .sum();
        assert_eq!(
            succeeded as usize, CYCLES,
            "one RollbackSucceeded per cycle: {events:?}"
        );

        // A clean stop releases the Lease (the follower is stopped first,
        // so nobody takes it at once).
        let (client, ns, first) = env.into_parts();
        let (mut successor_process, mut follower) = if leader == 0 {
            (second, first)
        } else {
            (first, second)
        };
        follower.kill();
        assert_eq!(successor_process.terminate(), Some(0));
        let released = leases(&client)
            .get("openmed-operator")
            .await
            .unwrap()
            .spec
            .unwrap();
        assert_eq!(released.holder_identity, None, "released on a clean stop");
        assert_eq!(released.lease_duration_seconds, Some(1));
        ns.delete().await;
    });
}
