//! The monitoring bundle of `deploy/monitoring`: the alerts pass promtool's
//! checks and their unit tests (promtool built from the pinned Prometheus
//! module by `tests/canary/build`), and the dashboard is valid JSON whose
//! every query reads a metric the operator exports (checked against the
//! operator's registry in `src/operator/metrics.rs`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `bin/promtool`, built once per Prometheus version and cached.
fn promtool() -> PathBuf {
    let out = Command::new(root().join("tests/canary/build"))
        .stderr(Stdio::inherit())
        .output()
        .expect("tests/canary/build runs");
    assert!(out.status.success(), "tests/canary/build failed");
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim()).join("bin/promtool")
}

/// The PrometheusRule's rule groups, as a plain Prometheus rule file.
fn rule_file(dir: &Path) -> PathBuf {
    let text =
        std::fs::read_to_string(root().join("deploy/monitoring/prometheusrule.yaml")).unwrap();
    let rule: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    assert_eq!(rule["kind"], "PrometheusRule");
    let groups = serde_yaml::to_string(&serde_json::json!({
        "groups": serde_json::to_value(&rule["spec"]["groups"]).unwrap()
    }))
    .unwrap();
    let path = dir.join("openmed-operator.rules.yaml");
    std::fs::write(&path, groups).unwrap();
    path
}

fn run(program: &Path, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .expect("promtool runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

#[test]
fn the_alerts_pass_promtool_and_their_unit_tests() {
    let promtool = promtool();
    let dir = tempfile::tempdir().unwrap();
    let rules = rule_file(dir.path());
    let checked = run(&promtool, &["check", "rules", rules.to_str().unwrap()]);
    assert!(checked.contains("SUCCESS: 8 rules found"), "{checked}");
    let tests = std::fs::read_to_string(root().join("deploy/monitoring/tests/alerts.test.yaml"))
        .unwrap()
        .replace("RULES_FILE", rules.to_str().unwrap());
    let test_file = dir.path().join("alerts.test.yaml");
    std::fs::write(&test_file, tests).unwrap();
    let tested = run(&promtool, &["test", "rules", test_file.to_str().unwrap()]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

#[test]
fn every_alert_has_a_runbook() {
    let text =
        std::fs::read_to_string(root().join("deploy/monitoring/prometheusrule.yaml")).unwrap();
    let rule: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    let runbooks = std::fs::read_to_string(root().join("docs/operations.md")).unwrap();
    let mut alerts = 0;
    for group in rule["spec"]["groups"].as_sequence().unwrap() {
        for alert in group["rules"].as_sequence().unwrap() {
            let name = alert["alert"].as_str().unwrap();
            alerts += 1;
            assert_eq!(
                alert["annotations"]["runbook_url"].as_str(),
                Some(format!("docs/operations.md#{}", name.to_lowercase()).as_str())
            );
            assert!(
                runbooks.contains(&format!("### {name}\n")),
                "docs/operations.md has no runbook section for {name}"
            );
            assert!(alert["labels"]["severity"].is_string(), "{name}: severity");
        }
    }
    assert_eq!(alerts, 8);
}

#[test]
fn the_dashboard_is_grafana_json_with_prometheus_queries() {
    let text = std::fs::read_to_string(root().join("deploy/monitoring/dashboard.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(dashboard["uid"], "openmed-operator");
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 8);
    for panel in panels {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            assert!(
                expr.contains("job=\"openmed-operator-metrics\""),
                "{}: {expr}",
                panel["title"]
            );
        }
    }
}
