//! The quality gate on the real stack: each new pod is sent the example's
//! probe set (`examples/real/probes.yaml`) at its own address before it
//! may become Ready, under real load through the Gateway. A model that
//! warms and answers 200 but never tags a date never serves a request,
//! and the rollout rolls back saying which label missed.

use std::time::Duration;

use libtest_mimic::Trial;
use serde_json::json;

use crate::app::*;
use crate::support::*;
use crate::trial;

pub fn trials() -> Vec<Trial> {
    vec![trial(
        "quality::a_model_that_misses_dates_never_serves_and_a_good_one_passes",
        a_model_that_misses_dates_never_serves_and_a_good_one_passes,
    )]
}

/// Warms, answers every request, and never tags a date.
const MISSES_DATE: &str = "OpenMed/synthetic-pii-misses-date";

/// A counter's value in the operator's metrics text, 0 when absent.
fn counter(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

fn a_model_that_misses_dates_never_serves_and_a_good_one_passes() {
    block_on(async {
        // v1 is rolled out through the gate: its pods pass it to be Ready.
        let app = App::deploy_gated("stack-quality").await;
        let passed_v1 = app.env.events(NAME).await;
        assert!(
            passed_v1.iter().any(|(r, m, _)| r == "QualityGatePassed"
                && m.contains("passed: DATE recall 1.00 (3/3)")),
            "the first rollout's pods passed the gate: {passed_v1:?}"
        );
        for pod in app.pods().await {
            let conditions = pod.status.unwrap().conditions.unwrap();
            let gate = conditions
                .iter()
                .find(|c| c.type_ == "openmed.ai/model-quality")
                .expect("every pod carries the gate's condition");
            assert_eq!(gate.status, "True", "{gate:?}");
        }

        let (stop, load) = app.load(Some(V1), 20.0, Duration::from_secs(240));
        tokio::time::sleep(Duration::from_secs(3)).await;
        // A good model passes.
        let bumped = now_ms();
        app.env.set_spec(NAME, json!({"version": V2})).await;
        app.env.wait_ready(NAME, V2).await;
        let v2_ready = now_ms();
        // One that misses dates never serves, and is rolled back.
        app.env
            .set_spec(NAME, json!({"version": MISSES_DATE}))
            .await;
        let status = rolled_back_within(
            &app,
            "the rollout of the model that misses dates to be rolled back",
            Duration::from_secs(150),
        )
        .await;
        let rolled_back = now_ms();
        assert_eq!(status.active_version.as_deref(), Some(V2));
        tokio::time::sleep(Duration::from_secs(3)).await;
        let _ = stop.send(());
        let records = load.await.unwrap();

        assert_all_served(&records);
        let leaked: Vec<_> = records
            .iter()
            .filter(|r| r.model_name.as_deref() == Some(MISSES_DATE))
            .collect();
        assert!(
            leaked.is_empty(),
            "answers from the model that misses dates reached clients: {}",
            leaked.len()
        );
        let events = app.env.events(NAME).await;
        let failed = events
            .iter()
            .find(|(r, _, _)| r == "RolloutFailed")
            .map(|(_, m, _)| m.clone())
            .expect("a RolloutFailed event");
        assert!(
            failed.contains("failed the quality gate: DATE recall 0.00 is below 1.00 (minRecall)"),
            "{failed}"
        );
        assert!(
            events.iter().any(|(r, _, _)| r == "QualityGateFailed"),
            "{events:?}"
        );
        // Bounded probe traffic: each text once per pod per round.
        let metrics = app
            .env
            .operator
            .metrics_in_netns()
            .expect("the operator's metrics");
        let answered = counter(
            &metrics,
            "openmed_quality_probe_requests_total{outcome=\"answered\"}",
        );
        let judged = counter(
            &metrics,
            "openmed_quality_gate_pods_total{outcome=\"passed\"}",
        ) + counter(
            &metrics,
            "openmed_quality_gate_pods_total{outcome=\"failed\"}",
        );
        let rounds = judged
            + counter(
                &metrics,
                "openmed_quality_gate_pods_total{outcome=\"inconclusive\"}",
            );
        assert!(
            judged >= 5.0,
            "2 v1, 2 v2 and a failed pod judged: {metrics}"
        );
        assert!(
            answered >= 3.0 * judged && answered <= 3.0 * rounds,
            "{answered} answers for {judged} judged pods in {rounds} rounds"
        );

        eprintln!("quality::a_model_that_misses_dates (20 requests/s through the Gateway):");
        let phases = vec![
            phase(
                "bump to v2 (gated) Ready",
                &sent_between(&records, bumped, v2_ready),
            ),
            phase(
                "bump to the model that misses dates, to rolled back",
                &sent_between(&records, v2_ready, rolled_back),
            ),
        ];
        let took = (rolled_back - v2_ready) / 1000.0;
        eprintln!("  bump → rolled back {took:.1} s; RolloutFailed: {failed}");
        eprintln!("  probe requests answered {answered}, pods judged {judged}, rounds {rounds}");
        record_result(json!({
            "scenario": "a_model_that_misses_dates_never_serves", "rps": 20, "phases": phases,
            "bump_to_rolled_back_s": (took * 10.0).round() / 10.0, "event": failed,
            "probe_requests_answered": answered, "pods_judged": judged,
        }));
        // docs/quality.md's commands, on the pods the gate judged.
        let (_tools, shell) = crate::docs::user_shell(&app.env.ns.name);
        let ran = crate::docs::run_page_blocks("stack-quality", &shell, &app.env.ns.name, &|_| {});
        assert!(
            ran > 0,
            "docs/quality.md marks its commands <!-- run: stack-quality -->"
        );
        app.env.finish().await;
    });
}
