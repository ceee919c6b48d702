//! `openmed-op render` as a user runs it: the binary, real files, exit codes.
//!
//! Golden files live in `tests/golden/`; after an intended change to the
//! output, regenerate them with `UPDATE_GOLDEN=1 cargo test --test render`
//! and review the diff.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

#[allow(dead_code)]
mod support;

// What examples/autoscaling adds to examples/real, shared with the
// real-stack tiers that run it.
#[path = "stack/gauges.rs"]
mod gauges;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn openmed_op(args: &[&str], stdin: Option<&str>) -> Output {
    openmed_op_to(args, stdin, Stdio::piped())
}

/// The same, with stdout going to `stdout`.
fn openmed_op_to(args: &[&str], stdin: Option<&str>, stdout: Stdio) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_openmed-op"))
        .args(args)
        .current_dir(root())
        .stdin(Stdio::piped())
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let input = stdin.unwrap_or("").to_owned();
    let mut pipe = child.stdin.take().unwrap();
    std::thread::spawn(move || {
        let _ = pipe.write_all(input.as_bytes());
    });
    child.wait_with_output().unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8(out.stderr.clone()).unwrap()
}

/// The documents of `kind` in a `render -o json` list.
fn of_kind<'a>(list: &'a Value, kind: &str) -> Vec<&'a Value> {
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["kind"] == kind)
        .collect()
}

/// The Deployment in a `render -o json` list.
fn deployment_in(list: &Value) -> &Value {
    of_kind(list, "Deployment")
        .into_iter()
        .next()
        .expect("a Deployment in the output")
}

/// Exit `code`, nothing on stdout, and `message` on stderr.
fn refused(out: &Output, code: i32, message: &str) {
    assert_eq!(out.status.code(), Some(code), "{}", stderr(out));
    assert!(out.stdout.is_empty(), "nothing is written: {}", stdout(out));
    assert!(stderr(out).contains(message), "{}", stderr(out));
}

fn golden(name: &str, actual: &str) {
    let path = root().join("tests/golden").join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|_| panic!("{} is missing; run with UPDATE_GOLDEN=1", path.display()));
    assert!(
        expected == actual,
        "{name} differs from the golden file; if intended, run UPDATE_GOLDEN=1 cargo test --test render\n--- expected\n{expected}\n--- actual\n{actual}"
    );
}

fn temp_dir(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in files {
        let path = dir.path().join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    dir
}

fn docs(yaml: &str) -> Vec<Value> {
    use serde::Deserialize;
    serde_yaml::Deserializer::from_str(yaml)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

const MODEL: &str = "\
apiVersion: openmed.ai/v1alpha1
kind: OpenMedModel
metadata:
  name: svc
  namespace: team
spec:
  family: pii
  tier: Small
  version: OpenMed/pii-v2
  replicas: 3
";

const DEPLOYMENT: &str = "\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: svc
  namespace: team
spec:
  replicas: 1
  minReadySeconds: 5
  selector:
    matchLabels: {app: svc}
  template:
    metadata:
      labels: {app: svc}
    spec:
      containers:
      - name: sidecar
        image: busybox
      - name: openmed-service
        image: openmed
        env:
        - name: FIRST
          value: one
        - name: OPENMED_SERVICE_PRELOAD_MODELS
          value: OpenMed/pii-v1
        - name: LAST
          value: two
";

#[test]
fn the_bundled_example_renders_as_in_the_golden_file() {
    let out = openmed_op(&["render", "examples/openmed/"], None);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    golden("examples.yaml", &stdout(&out));
}

#[test]
fn the_examples_hash_is_the_one_plan_computes() {
    let out = openmed_op(&["render", "-o", "json", "examples/openmed/"], None);
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(list["kind"], "List");
    let deployment = deployment_in(&list);
    let vector: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("tests/vectors/basic-v1.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        deployment["spec"]["template"]["metadata"]["annotations"]["openmed.ai/model-manifest-hash"],
        vector["manifestHash"]
    );
}

#[test]
fn a_target_in_the_input_gets_exactly_the_operator_fields() {
    let dir = temp_dir(&[("all.yaml", &format!("{DEPLOYMENT}---\n{MODEL}"))]);
    let out = openmed_op(&["render", dir.path().to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    golden(
        "full-deployment.yaml",
        &text.replace(dir.path().to_str().unwrap(), "DIR"),
    );
    let output = docs(&text);
    assert_eq!(
        output.len(),
        4,
        "Deployment, OpenMedModel, pointer and snapshot ConfigMaps"
    );
    let input = docs(DEPLOYMENT).remove(0);
    let mut rendered = output[0].clone();
    // Everything but the owned fields is untouched.
    let env = rendered["spec"]["template"]["spec"]["containers"][1]["env"].take();
    assert_eq!(env[0]["name"], "FIRST");
    assert_eq!(env[1]["name"], "OPENMED_SERVICE_PRELOAD_MODELS");
    assert!(
        env[1].get("value").is_none(),
        "the literal value is replaced"
    );
    let snapshot = &output[3];
    assert_eq!(snapshot["immutable"], true);
    assert_eq!(
        env[1]["valueFrom"]["configMapKeyRef"]["name"], snapshot["metadata"]["name"],
        "the template reads the immutable snapshot"
    );
    assert_eq!(
        snapshot["data"], output[2]["data"],
        "same bytes as the pointer"
    );
    assert_eq!(env[2]["name"], "LAST");
    assert_eq!(rendered["spec"]["replicas"], 3);
    assert_eq!(rendered["spec"]["selector"], input["spec"]["selector"]);
    assert_eq!(
        rendered["spec"]["template"]["spec"]["containers"][0],
        input["spec"]["template"]["spec"]["containers"][0]
    );
    assert_eq!(output[1], docs(MODEL)[0], "the OpenMedModel passes through");
    assert_eq!(output[2]["kind"], "ConfigMap");
}

#[test]
fn a_quality_gate_shows_as_the_templates_readiness_gate() {
    let gated = MODEL.replace(
        "spec:\n",
        "spec:\n  qualityGate:\n    configMapRef: {name: pii-probes}\n",
    );
    assert_ne!(gated, MODEL);
    for input in [format!("{DEPLOYMENT}---\n{gated}"), gated.clone()] {
        let out = openmed_op(&["render", "-", "-o", "json"], Some(&input));
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let list: Value = serde_json::from_str(&stdout(&out)).unwrap();
        assert_eq!(
            deployment_in(&list)["spec"]["template"]["spec"]["readinessGates"],
            serde_json::json!([{"conditionType": "openmed.ai/model-quality"}]),
            "in a full Deployment and in a patch"
        );
    }
}

#[test]
fn without_its_target_a_resource_gets_a_strategic_merge_patch() {
    let out = openmed_op(&["render", "-"], Some(MODEL));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    golden("patch.yaml", &stdout(&out));
    let output = docs(&stdout(&out));
    let patch = &output[3];
    assert_eq!(patch["kind"], "Deployment");
    assert!(
        patch["spec"].get("selector").is_none(),
        "a patch holds only owned fields"
    );
    let env = &patch["spec"]["template"]["spec"]["containers"][0]["env"][0];
    assert!(
        env["value"].is_null() && env.get("value").is_some(),
        "value: null deletes a base's literal"
    );
}

#[test]
fn other_documents_pass_through_unchanged_and_in_order() {
    let other =
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: s\nspec:\n  ports:\n  - port: 80\n";
    let cm = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: unrelated\ndata:\n  z: '1'\n  a: '2'\n";
    let input = format!("{other}---\n{MODEL}---\n{cm}");
    let out = openmed_op(&["render", "-"], Some(&input));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let output = docs(&stdout(&out));
    let kinds: Vec<&str> = output.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "Service",
            "OpenMedModel",
            "ConfigMap",
            "ConfigMap",
            "Deployment",
            "ConfigMap"
        ]
    );
    assert_eq!(output[0], docs(other)[0]);
    assert_eq!(output[5], docs(cm)[0]);
    // Key order is kept too, so diffs stay small.
    assert!(
        stdout(&out).contains("data:\n  z: '1'\n  a: '2'\n"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn rendering_is_deterministic_and_idempotent() {
    let first = stdout(&openmed_op(&["render", "examples/openmed/"], None));
    let second = stdout(&openmed_op(&["render", "examples/openmed/"], None));
    assert_eq!(first, second);
    let again = openmed_op(&["render", "-"], Some(&first));
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    assert_eq!(
        stdout(&again),
        first,
        "rendering rendered output changes nothing"
    );
    let patched = stdout(&openmed_op(&["render", "-"], Some(MODEL)));
    assert_eq!(
        stdout(&openmed_op(&["render", "-"], Some(&patched))),
        patched
    );
}

#[test]
fn summary_prints_one_row_per_resource() {
    let out = openmed_op(&["render", "--summary", "examples/openmed/"], None);
    assert_eq!(out.status.code(), Some(0));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[0].starts_with("RESOURCE"));
    for cell in [
        "openmed/openmed-service",
        "openmed-service/openmed-service",
        "OpenMed/synthetic-pii-v1",
        "openmed-service-model-manifest",
        "sha256:c3431235760079558f503425f7527f3ce7afb855c2e78c7d14866dd6c9c87443",
    ] {
        assert!(lines[1].contains(cell), "{cell} missing in {text}");
    }
}

#[test]
fn an_invalid_resource_exits_1_naming_file_document_line_and_field_and_writes_nothing() {
    let bad = MODEL.replace("tier: Small", "tier: Huge");
    let dir = temp_dir(&[("a.yaml", DEPLOYMENT), ("b.yaml", &format!("---\n{bad}"))]);
    let out = openmed_op(&["render", dir.path().to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty(), "no partial output");
    let err = stderr(&out);
    let file = dir.path().join("b.yaml");
    assert!(
        err.contains(&format!(
            "{}:9: document 1: error[InvalidSpec]: team/svc: spec.tier: \"Huge\" is not one of",
            file.display()
        )),
        "{err}"
    );
}

#[test]
fn a_missing_container_is_a_finding_listing_the_containers() {
    let model = MODEL.replace("version:", "targetRef:\n    containerName: api\n  version:");
    let out = openmed_op(&["render", "-"], Some(&format!("{DEPLOYMENT}---\n{model}")));
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = stderr(&out);
    assert!(err.contains("error[ContainerNotFound]"), "{err}");
    assert!(err.contains("it has: sidecar, openmed-service"), "{err}");
}

/// The served set of the `openmed-service` container in a rendered stream.
fn served_in(text: &str) -> (String, String) {
    let output = docs(text);
    let deployment = output.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let env = deployment["spec"]["template"]["spec"]["containers"][1]["env"]
        .as_array()
        .unwrap();
    let value = env
        .iter()
        .find(|e| e["name"] == "OPENMED_SERVICE_SERVED_MODELS")
        .map(|e| e["value"].as_str().unwrap().to_owned())
        .unwrap_or_default();
    let versions = deployment["metadata"]["annotations"]["openmed.ai/served-versions"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    (value, versions)
}

#[test]
fn a_bump_rendered_over_the_last_render_serves_the_old_and_the_new_name() {
    const DEFAULTS: &str =
        "disease_detection_superclinical,OpenMed/OpenMed-PII-SuperClinical-Small-44M-v1";
    // v1 over a Deployment that preloaded a version by hand: the hand-set
    // name is not the model's (the operator writes the same).
    let v1 = MODEL.replace("version: OpenMed/pii-v2", "version: OpenMed/pii-v1");
    let first = openmed_op(&["render", "-"], Some(&format!("{DEPLOYMENT}---\n{v1}")));
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    let first = stdout(&first);
    assert_eq!(
        served_in(&first),
        (
            format!("OpenMed/pii-v1,{DEFAULTS}"),
            "OpenMed/pii-v1".to_owned()
        ),
        "the version, and what the service answered without a set"
    );
    // The bump, over what Git now holds: clients naming v1 are answered by
    // the new pods too.
    let bumped = openmed_op(
        &["render", "-"],
        Some(&first.replace("version: OpenMed/pii-v1", "version: OpenMed/pii-v2")),
    );
    assert_eq!(bumped.status.code(), Some(0), "{}", stderr(&bumped));
    let bumped = stdout(&bumped);
    assert_eq!(
        served_in(&bumped),
        (
            format!("OpenMed/pii-v2,OpenMed/pii-v1,{DEFAULTS}"),
            "OpenMed/pii-v2,OpenMed/pii-v1".to_owned()
        )
    );
    // Rendering the output again changes nothing.
    let again = openmed_op(&["render", "-"], Some(&bumped));
    assert_eq!(stdout(&again), bumped);
    // The next bump: v1 leaves the set.
    let next = openmed_op(
        &["render", "-"],
        Some(&bumped.replace("version: OpenMed/pii-v2", "version: OpenMed/pii-v3")),
    );
    assert_eq!(next.status.code(), Some(0), "{}", stderr(&next));
    assert_eq!(
        served_in(&stdout(&next)),
        (
            format!("OpenMed/pii-v3,OpenMed/pii-v2,{DEFAULTS}"),
            "OpenMed/pii-v3,OpenMed/pii-v2".to_owned()
        )
    );
}

#[test]
fn a_served_set_read_from_a_config_map_is_refused_with_its_line() {
    let deployment = DEPLOYMENT.replace(
        "        - name: LAST\n",
        "        - name: OPENMED_SERVICE_SERVED_MODELS\n          valueFrom:\n            configMapKeyRef: {name: team-models, key: served}\n        - name: LAST\n",
    );
    let dir = temp_dir(&[("all.yaml", &format!("{deployment}---\n{MODEL}"))]);
    let out = openmed_op(&["render", dir.path().to_str().unwrap()], None);
    refused(&out, 1, "error[ServedSetReferenced]");
    let err = stderr(&out);
    // The entry's line in the Deployment's file.
    let line = deployment
        .lines()
        .position(|l| l.contains("name: OPENMED_SERVICE_SERVED_MODELS"))
        .unwrap()
        + 1;
    assert!(err.contains(&format!("all.yaml:{line}:")), "{err}");
    assert!(err.contains("ConfigMap team-models"), "{err}");
}

#[test]
fn the_progress_deadline_is_checked_against_the_target_in_the_input() {
    let model = MODEL.replace(
        "replicas: 3",
        "replicas: 3\n  rolloutStrategy:\n    progressDeadlineSeconds: 5",
    );
    let out = openmed_op(&["render", "-"], Some(&format!("{DEPLOYMENT}---\n{model}")));
    refused(&out, 1, "minReadySeconds (5)");
}

#[test]
fn two_resources_for_one_deployment_conflict() {
    let second = MODEL
        .replace("name: svc", "name: other")
        .replace("replicas: 3", "replicas: 3\n  targetRef:\n    name: svc");
    let out = openmed_op(&["render", "-"], Some(&format!("{MODEL}---\n{second}")));
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("error[TargetConflict]: team/other"), "{err}");
    assert!(
        err.contains("already claimed by OpenMedModel svc at <stdin>:"),
        "{err}"
    );
}

#[test]
fn an_autoscaled_target_keeps_its_replicas() {
    let hpa = "apiVersion: autoscaling/v2\nkind: HorizontalPodAutoscaler\nmetadata:\n  name: svc\n  namespace: team\nspec:\n  scaleTargetRef:\n    apiVersion: apps/v1\n    kind: Deployment\n    name: svc\n  maxReplicas: 5\n";
    let out = openmed_op(
        &["render", "-"],
        Some(&format!("{DEPLOYMENT}---\n{MODEL}---\n{hpa}")),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(docs(&stdout(&out))[0]["spec"]["replicas"], 1);
}

#[test]
fn unreadable_or_malformed_input_exits_2_and_writes_nothing() {
    let out = openmed_op(&["render", "no/such/file.yaml"], None);
    refused(&out, 2, "no/such/file.yaml: cannot read");

    let out = openmed_op(
        &["render", "-"],
        Some(&format!("{MODEL}---\nkind: [unclosed\n")),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert!(
        stderr(&out).contains("document 2: not valid YAML"),
        "{}",
        stderr(&out)
    );

    let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..10 {
        let p = i - 1;
        bomb.push_str(&format!(
            "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
        ));
    }
    let out = openmed_op(&["render", "-"], Some(&bomb));
    refused(&out, 2, "possible alias bomb");
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(openmed_op(&["render"], None).status.code(), Some(2));
    assert_eq!(
        openmed_op(&["render", "--output", "toml", "examples"], None)
            .status
            .code(),
        Some(2)
    );
    assert_eq!(openmed_op(&["frobnicate"], None).status.code(), Some(2));
}

#[test]
fn directories_are_read_recursively_in_sorted_order() {
    let dir = temp_dir(&[
        ("b/model.yml", MODEL),
        (
            "a/z.yaml",
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: team\n",
        ),
        ("a/notes.txt", "not yaml: ["),
    ]);
    let out = openmed_op(&["render", dir.path().to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let kinds: Vec<String> = docs(&stdout(&out))
        .iter()
        .map(|d| d["kind"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        kinds,
        [
            "Namespace",
            "OpenMedModel",
            "ConfigMap",
            "ConfigMap",
            "Deployment"
        ]
    );
}

#[test]
fn crd_prints_the_committed_crd() {
    let out = openmed_op(&["crd"], None);
    assert_eq!(out.status.code(), Some(0));
    let committed = std::fs::read_to_string(root().join("crds/openmedmodel.yaml")).unwrap();
    assert_eq!(stdout(&out), committed);
}

#[test]
fn watch_renders_again_when_an_input_changes() {
    use std::io::{BufRead, BufReader};
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    let dir = temp_dir(&[("model.yaml", MODEL)]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_openmed-op"))
        .args(["render", "--watch", dir.path().to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if tx.send(line.unwrap()).is_err() {
                break;
            }
        }
    });
    let wait_for = |needle: &str| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
        }
    };
    let first = wait_for("OPENMED_SERVICE_PRELOAD_MODELS: OpenMed/pii-v2");
    // Keep editing until the watcher has seen a change: the first write may
    // land before the watch is registered.
    let mut second = false;
    for attempt in 0..10 {
        let version = format!("OpenMed/pii-v{}", 3 + attempt);
        std::fs::write(
            dir.path().join("model.yaml"),
            MODEL.replace("OpenMed/pii-v2", &version),
        )
        .unwrap();
        if wait_for(&format!("OPENMED_SERVICE_PRELOAD_MODELS: {version}")) {
            second = true;
            break;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(first, "the first render never appeared");
    assert!(second, "no render after the file changed");
}

/// The documents of a YAML stream, empty ones left out.
fn yaml_documents(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .filter(|v: &Value| !v.is_null())
        .collect()
}

/// The documents of a file of the repository.
fn file_documents(path: &str) -> Vec<Value> {
    yaml_documents(&std::fs::read_to_string(root().join(path)).unwrap())
}

/// `examples/autoscaling` is `examples/real` with the service's gauges
/// exported (as the real-stack tiers export them) and `spec.autoscaling`
/// through KEDA, nothing else; it renders the model's ScaledObject with a
/// trigger per gauge and no autoscaler of the operator's.
#[test]
fn the_autoscaling_example_is_the_real_one_with_its_gauges_exported() {
    let mut real = file_documents("examples/real/openmed-service.yaml");
    for d in real.iter_mut().filter(|d| d["kind"] == "Deployment") {
        gauges::export_gauges(d);
    }
    assert_eq!(
        real,
        file_documents("examples/autoscaling/openmed-service.yaml"),
        "examples/autoscaling/openmed-service.yaml is examples/real's with its gauges exported"
    );
    let mut model = file_documents("examples/real/openmedmodel.yaml").remove(0);
    let autoscaled = file_documents("examples/autoscaling/openmedmodel.yaml").remove(0);
    model["spec"]["autoscaling"] = autoscaled["spec"]["autoscaling"].clone();
    assert_eq!(
        model, autoscaled,
        "examples/autoscaling/openmedmodel.yaml is examples/real's with spec.autoscaling"
    );

    let out = openmed_op(&["render", "examples/autoscaling/"], None);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let rendered = stdout(&out);
    let docs = yaml_documents(&rendered);
    let scaled = docs
        .iter()
        .find(|d| d["kind"] == "ScaledObject" && d["metadata"]["name"] == "openmed-service")
        .unwrap_or_else(|| panic!("no ScaledObject openmed-service in:\n{rendered}"));
    let queries: Vec<&str> = scaled["spec"]["triggers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["metadata"]["query"].as_str().unwrap())
        .collect();
    assert_eq!(queries.len(), 2, "{queries:?}");
    for gauge in [
        "openmed_service_admission_queue_depth",
        "openmed_service_inflight_requests",
    ] {
        assert!(
            queries.iter().any(|q| q.contains(gauge)),
            "{gauge}: {queries:?}"
        );
    }
    assert!(
        !docs.iter().any(|d| d["kind"] == "HorizontalPodAutoscaler"),
        "KEDA's way: the autoscaler is KEDA's, not the operator's"
    );
    golden("autoscaling.yaml", &rendered);
}

#[test]
fn the_canary_example_renders_as_in_the_golden_files() {
    let out = openmed_op(&["render", "examples/canary/"], None);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let rendered = stdout(&out);
    // The canary Deployment reads the same snapshot as the stable one.
    let docs = yaml_documents(&rendered);
    let reads = |name: &str| {
        let d = docs
            .iter()
            .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == name)
            .unwrap();
        d["spec"]["template"]["spec"]["containers"][0]["env"][0]["valueFrom"]["configMapKeyRef"]
            ["name"]
            .clone()
    };
    assert_eq!(reads("openmed-service"), reads("openmed-service-canary"));
    golden("canary.yaml", &rendered);

    let out = openmed_op(&["render", "--canary", "examples/canary/"], None);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    golden("canary-plan.yaml", &stdout(&out));
}

#[test]
fn a_canary_that_would_not_split_traffic_is_refused_with_its_line() {
    let service = std::fs::read_to_string(root().join("examples/canary/service.yaml")).unwrap();
    let model = std::fs::read_to_string(root().join("examples/canary/openmedmodel.yaml")).unwrap();
    // The canary's weight in Git must be 0.
    let weighted = service.replacen("          weight: 0", "          weight: 5", 1);
    let out = openmed_op(&["render", "-"], Some(&format!("{weighted}---\n{model}")));
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("CanaryWeightNotZero"), "{err}");
    assert!(err.contains("has weight 5"), "{err}");
    assert!(err.contains("nothing was written"), "{err}");
    assert!(stdout(&out).is_empty());
    // A Service that selects both tracks would make the weights moot.
    let both = service.replacen(
        "  selector: {app.kubernetes.io/name: openmed-service, openmed.ai/track: canary}",
        "  selector: {app.kubernetes.io/name: openmed-service}",
        1,
    );
    let out = openmed_op(&["render", "-"], Some(&format!("{both}---\n{model}")));
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("ServiceSelectsBoth"), "{err}");
    assert!(err.contains("Service openmed-service-canary"), "{err}");
}

// Hostile input: what a trial of bad inputs found, each held here.

/// Runs with stdout on `/dev/full`, where every write fails.
fn to_full_disk(args: &[&str], stdin: Option<&str>) -> Output {
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    openmed_op_to(args, stdin, Stdio::from(full))
}

#[test]
fn a_failed_write_to_stdout_is_exit_2_and_a_closed_pipe_is_quiet() {
    for args in [
        &["render", "examples/openmed/"][..],
        &["render", "-o", "json", "examples/openmed/"],
        &["render", "--summary", "examples/openmed/"],
        &["crd"],
        &["man"],
        &["completions", "bash"],
    ] {
        let out = to_full_disk(args, None);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("cannot write to standard output"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    // The KRM function writes its ResourceList the same way.
    let list = format!(
        "apiVersion: config.kubernetes.io/v1\nkind: ResourceList\nitems:\n{}",
        MODEL
            .lines()
            .enumerate()
            .map(|(i, l)| format!("{}{l}\n", if i == 0 { "- " } else { "  " }))
            .collect::<String>()
    );
    let out = to_full_disk(&["render", "--krm"], Some(&list));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));

    // A reader that stops early (`| head`) is not an error.
    let mut child = Command::new(env!("CARGO_BIN_EXE_openmed-op"))
        .args(["render", "examples/openmed/"])
        .current_dir(root())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stderr(&out), "");
}

/// `MODEL` with `line` in place of its `replicas: 3`.
fn model_with_replicas(line: &str) -> String {
    MODEL.replace("  replicas: 3\n", &format!("{line}\n"))
}

#[test]
fn values_the_api_server_refuses_are_refused() {
    let cases: &[(&str, i32, &str)] = &[
        (".nan", 2, ".nan is not a number JSON can hold"),
        (".inf", 2, ".inf is not a number JSON can hold"),
        ("-.inf", 2, "-.inf is not a number JSON can hold"),
        (
            "1e23",
            1,
            "spec.replicas: 100000000000000000000000 is out of range",
        ),
    ];
    for (value, code, message) in cases {
        let out = openmed_op(
            &["render", "-"],
            Some(&model_with_replicas(&format!("  replicas: {value}"))),
        );
        assert_eq!(out.status.code(), Some(*code), "{value}: {}", stderr(&out));
        assert!(stderr(&out).contains(message), "{value}: {}", stderr(&out));
        assert!(out.stdout.is_empty());
    }

    let bad_namespace = MODEL.replace("namespace: team", "namespace: Bad_NS");
    let out = openmed_op(&["render", "-"], Some(&bad_namespace));
    refused(
        &out,
        1,
        "metadata.namespace: \"Bad_NS\" is not a valid namespace name",
    );
    let out = openmed_op(&["render", "-n", "Bad NS!", "-"], Some(MODEL));
    refused(&out, 2, "not a valid namespace name");

    let unknown = format!("{MODEL}extra: 1\n");
    let out = openmed_op(&["render", "-"], Some(&unknown));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out)
            .contains(":11: document 1: error[InvalidSpec]: team/svc: extra: unknown field"),
        "{}",
        stderr(&out)
    );

    // A key set twice: the API server refuses it; we say where both are.
    let twice = MODEL.replace("  tier: Small\n", "  tier: Small\n  tier: Large\n");
    let out = openmed_op(&["render", "-"], Some(&twice));
    refused(
        &out,
        2,
        "<stdin>:9: document 1: not valid YAML: key \"tier\" is set twice, first on line 8",
    );
}

#[test]
fn numbers_are_read_as_the_api_server_reads_them() {
    // YAML 1.1, as kubectl and the API server read it: 0x10 is 16, 0o7 is
    // 7, 010 is octal 8, 1_0 is 10, 1.0 is 1 (tests/e2e shows the server).
    for (value, replicas) in [
        ("0x10", 16),
        ("0o7", 7),
        ("010", 8),
        ("1_0", 10),
        ("1.0", 1),
    ] {
        let out = openmed_op(
            &["render", "-o", "json", "-"],
            Some(&format!(
                "{}---\n{DEPLOYMENT}",
                model_with_replicas(&format!("  replicas: {value}"))
            )),
        );
        assert_eq!(out.status.code(), Some(0), "{value}: {}", stderr(&out));
        let list: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            deployment_in(&list)["spec"]["replicas"],
            replicas,
            "{value}"
        );
    }
}

#[test]
fn documents_it_does_not_own_come_out_as_the_api_server_would_store_them() {
    let input = "\
apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
  namespace: team
data:
  quoted: \"yes\"
  feature: \"on\"
  count: \"1_000\"
  octal: \"0o7\"
  secret: !!binary aGVsbG8=
  date: 2001-12-14
---
apiVersion: v1
kind: Service
metadata:
  name: svc
  namespace: team
  labels: &labels
    app: svc
spec:
  selector: *labels
  <<: {type: ClusterIP}
  ports:
  - port: 0x50
";
    let out = openmed_op(&["render", "-"], Some(input));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    // Strings YAML 1.1 would read as something else keep their quotes.
    for line in [
        "quoted: 'yes'",
        "feature: 'on'",
        "count: '1_000'",
        "octal: '0o7'",
        "date: '2001-12-14'",
    ] {
        assert!(text.contains(line), "{line}:\n{text}");
    }
    let docs = docs(&text);
    assert_eq!(docs[0]["data"]["secret"], "hello");
    assert_eq!(docs[1]["spec"]["selector"]["app"], "svc");
    assert_eq!(docs[1]["spec"]["type"], "ClusterIP");
    assert_eq!(docs[1]["spec"]["ports"][0]["port"], 80);
    // Rendering the output again changes nothing.
    let again = openmed_op(&["render", "-"], Some(&text));
    assert_eq!(stdout(&again), text);
}

#[test]
fn long_values_are_cut_in_messages() {
    let long = "v".repeat(1_000_000);
    let out = openmed_op(
        &["render", "-"],
        Some(&MODEL.replace("OpenMed/pii-v2", &long)),
    );
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.len() < 2_000, "{} bytes of stderr", err.len());
    assert!(err.contains("…\" (1000000 characters)"), "{err}");
}

#[test]
fn input_is_bounded_per_stream_and_per_document() {
    // More than the stream limit on stdin: refused without reading it all.
    let mut child = Command::new(env!("CARGO_BIN_EXE_openmed-op"))
        .args(["render", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut pipe = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        let chunk = vec![b'#'; 1 << 20];
        // 65 MiB at most, then stop: the reader stops at 64 MiB and one byte.
        for _ in 0..65 {
            if pipe.write_all(&chunk).is_err() {
                break;
            }
        }
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    refused(
        &out,
        2,
        "<stdin>: larger than 64 MiB, the most one input may hold",
    );

    // One document over the API server's 3 MiB request limit.
    let big = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: big}}\ndata:\n  blob: {}\n",
        "x".repeat(3 * 1024 * 1024 + 1)
    );
    let out = openmed_op(&["render", "-"], Some(&big));
    refused(
        &out,
        2,
        "more than the 3 MiB the API server accepts in one request",
    );
}

#[test]
fn a_byte_order_mark_and_utf16_are_read_as_kubectl_reads_them() {
    let expected = stdout(&openmed_op(&["render", "-"], Some(MODEL)));
    let mut bom = vec![0xEF, 0xBB, 0xBF];
    bom.extend_from_slice(MODEL.as_bytes());
    let mut le = vec![0xFF, 0xFE];
    le.extend(MODEL.encode_utf16().flat_map(u16::to_le_bytes));
    let mut be = vec![0xFE, 0xFF];
    be.extend(MODEL.encode_utf16().flat_map(u16::to_be_bytes));
    let dir = tempfile::tempdir().unwrap();
    for (name, bytes) in [("bom.yaml", bom), ("le.yaml", le), ("be.yaml", be)] {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        let out = openmed_op(&["render", path.to_str().unwrap()], None);
        assert_eq!(out.status.code(), Some(0), "{name}: {}", stderr(&out));
        assert_eq!(stdout(&out), expected, "{name}");
    }
    // UTF-16 without a byte-order mark is said to be so.
    let bare: Vec<u8> = MODEL.encode_utf16().flat_map(u16::to_le_bytes).collect();
    let path = dir.path().join("bare.yaml");
    std::fs::write(&path, bare).unwrap();
    let out = openmed_op(&["render", path.to_str().unwrap()], None);
    refused(&out, 2, "UTF-16 without a byte-order mark?");
}

#[test]
fn a_file_named_twice_is_read_once() {
    let dir = temp_dir(&[("svc.yaml", MODEL)]);
    let file = dir.path().join("svc.yaml");
    let once = openmed_op(&["render", file.to_str().unwrap()], None);
    let out = openmed_op(
        &[
            "render",
            file.to_str().unwrap(),
            dir.path().to_str().unwrap(),
            file.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), stdout(&once));
}

#[test]
fn help_about_help_and_the_exit_codes() {
    let out = openmed_op(&["help", "--help"], None);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("Usage: openmed-op help"),
        "{}",
        stdout(&out)
    );
    let out = openmed_op(&["--help"], None);
    assert!(
        stdout(&out).contains("unknown revision"),
        "{}",
        stdout(&out)
    );
}

// Output at size: the same bytes, in the same order, for a large input that
// mixes every kind of document render treats differently.

/// One generated workload of `models` OpenMedModels over `models / 50`
/// namespaces: targets before, after, in another file and absent; canaries
/// with and without their route; autoscalers; explicit, long and reused
/// ConfigMap names; owner UIDs; documents render does not own, with text
/// that needs quoting; empty documents.
fn mixed_workload(models: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let write = |path: String, text: &str| {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        file.write_all(text.as_bytes()).unwrap();
    };
    let tiers = [
        "Tiny",
        "Small",
        "Medium",
        "Base",
        "Large",
        "XLarge",
        "Accurate-XLarge",
    ];
    for i in 0..models {
        let team = i % (models / 50).max(1);
        let name = if i % 97 == 5 {
            format!("{}{i:05}", "a".repeat(55))
        } else {
            format!("svc-{i:05}")
        };
        // Every tenth resource takes the default namespace.
        let namespace = if i % 10 == 9 {
            String::new()
        } else {
            format!("  namespace: team-{team:02}\n")
        };
        let (target, container) = if i % 17 == 9 {
            (format!("{name}-backend"), "api")
        } else {
            (name.clone(), "openmed-service")
        };
        let mut spec = format!(
            "  family: {}\n  tier: {}\n  version: OpenMed/model-r{}\n",
            // The quality gate judges PII models only.
            if i % 13 == 8 {
                "pii"
            } else {
                ["pii", "disease-detection", "anatomy"][i % 3]
            },
            tiers[i % tiers.len()],
            i % 13
        );
        if i % 8 != 0 {
            spec.push_str(&format!("  replicas: {}\n", 1 + i % 4));
        }
        if i % 17 == 9 {
            spec.push_str(&format!(
                "  targetRef:\n    name: {target}\n    containerName: {container}\n"
            ));
        }
        match i % 11 {
            6 => spec.push_str(
                "  rolloutStrategy:\n    type: Recreate\n    progressDeadlineSeconds: 900\n",
            ),
            7 => spec.push_str(
                "  rolloutStrategy:\n    maxSurge: 50%\n    maxUnavailable: 1\n    rollbackOnFailure: false\n",
            ),
            _ => {}
        }
        if i % 13 == 8 {
            spec.push_str("  qualityGate:\n    configMapRef: {name: probes}\n    minRecall: {NAME: 0.95, '*': 1.0}\n");
        }
        if i % 23 == 11 {
            spec.push_str(&format!("  manifestConfigMapName: pinned-{i}\n"));
        }
        let canary = i % 19 == 10 && i % 97 != 5;
        if canary {
            spec.push_str(&format!(
                "  canary:\n    targetRef: {{name: {name}-canary, containerName: {container}}}\n    trafficRef:\n      httpRoute: {name}\n      ruleName: main\n      stableBackend: {name}\n      canaryBackend: {name}-canary\n    steps:\n    - {{weight: 10, pause: 5m}}\n    - {{weight: 50, pause: 10m}}\n"
            ));
        }
        let uid = if i % 31 == 13 {
            format!("  uid: 00000000-0000-0000-0000-{i:012}\n")
        } else {
            String::new()
        };
        let model = format!(
            "# model {i}\napiVersion: openmed.ai/v1alpha1\nkind: OpenMedModel\nmetadata:\n  name: {name}\n{namespace}{uid}spec:\n{spec}"
        );
        let deployment = |deployment: &str, track: &str| {
            let sidecar = if container == "api" {
                "      - name: sidecar\n        image: busybox\n"
            } else {
                ""
            };
            format!(
                "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {deployment}\n{namespace}  labels: {{app: {name}, \"on\": \"yes\"}}\nspec:\n  replicas: {}\n  minReadySeconds: {}\n  selector:\n    matchLabels: {{app: {name}, track: {track}}}\n  template:\n    metadata:\n      labels: {{app: {name}, track: {track}}}\n    spec:\n      containers:\n{sidecar}      - name: {container}\n        image: openmed/openmed-service:1.{}.0\n        args: [--port, \"8080\", '0o7', 1_000]\n        env:\n        - name: FIRST\n          value: \"one\"\n        - name: OPENMED_SERVICE_PRELOAD_MODELS\n          value: boot\n",
                1 + i % 3,
                i % 5,
                i % 4
            )
        };
        let file = format!("team-{:02}/{name}.yaml", team);
        match i % 4 {
            0 => write(file, &model),
            1 => write(
                file,
                &format!("{model}---\n{}", deployment(&target, "stable")),
            ),
            2 => write(
                file,
                &format!("{}---\n---\n{model}", deployment(&target, "stable")),
            ),
            _ => {
                write(file, &model);
                write(
                    format!("deployments/{name}.yml"),
                    &deployment(&target, "stable"),
                );
            }
        }
        if i % 7 == 3 {
            write(
                format!("team-{:02}/{name}-hpa.yaml", team),
                &format!(
                    "apiVersion: autoscaling/v2\nkind: HorizontalPodAutoscaler\nmetadata:\n  name: {name}\n{namespace}spec:\n  scaleTargetRef: {{apiVersion: apps/v1, kind: Deployment, name: {target}}}\n  maxReplicas: 5\n"
                ),
            );
        }
        if canary {
            let mut text = deployment(&format!("{name}-canary"), "canary");
            if i % 38 == 10 {
                text.push_str(&format!(
                    "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n{namespace}spec:\n  selector: {{app: {name}, track: stable}}\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: {name}-canary\n{namespace}spec:\n  selector: {{app: {name}, track: canary}}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata:\n  name: {name}\n{namespace}spec:\n  rules:\n  - name: main\n    backendRefs:\n    - {{name: {name}, port: 80, weight: 100}}\n    - {{name: {name}-canary, port: 80, weight: 0}}\n"
                ));
            }
            write(format!("team-{:02}/{name}-canary.yaml", team), &text);
        }
        if i % 29 == 12 && !namespace.is_empty() {
            // A pointer ConfigMap from an earlier render, with stale data.
            let config_map = if i % 23 == 11 {
                format!("pinned-{i}")
            } else {
                format!("{name}-model-manifest")
            };
            write(
                format!("rendered/{name}.yaml"),
                &format!(
                    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {config_map}\n{namespace}  annotations:\n    openmed.ai/model-resource: team-{team:02}/{name}\ndata:\n  OPENMED_SERVICE_PRELOAD_MODELS: OpenMed/old\n"
                ),
            );
        }
        if i % 50 == 25 {
            write(
                format!("team-{:02}/other-{i}.yaml", team),
                &format!(
                    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes-{i}\n{namespace}data:\n  z: '1'\n  a: \"2\"\n  text: |\n    line one\n    line: two\n  empty: \"\"\n  yes: \"on\"\n  unicode: \"caf\\u00e9 \\U0001F600\"\n---\n# nothing here\n---\napiVersion: v1\nkind: Namespace\nmetadata: {{name: team-{team:02}, labels: {{n: \"{i}\"}}}}\n"
                ),
            );
        }
    }
    dir
}

fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn a_large_mixed_input_renders_the_same_bytes_as_before() {
    let dir = mixed_workload(1500);
    let path = dir.path().to_str().unwrap();
    // Digests of what render printed at commit c6397c4, when it still held
    // its whole output before printing it. A change to how the output is
    // produced must not change a byte; a change to what it says must be
    // deliberate, with the new digests (the failure shows them): the
    // served set each Deployment now lists changed them once.
    for (args, expected) in [
        (
            &["render", path][..],
            "e5aae7447d58ba3b393152b28dcb1991843590306155674fa6eb23dda774ad91",
        ),
        (
            &["render", "-o", "json", path],
            "bec012df478a501b126ed2a2ab0fb02b153b201f45d8ab515674ce5eb8489b0d",
        ),
        (
            &["render", "--summary", path],
            "b787b9869445b8719b73bd1641508e7e8f755fa0468d8e5311d8b71b28c940cd",
        ),
        (
            &["render", "--canary", path],
            "80aea219ad8d06314da0228663a81f5d120779670ccd1211d12287cba2a07d4b",
        ),
        (
            &["render", "--canary", "-o", "json", path],
            "c0b2aa5587b23e8c805e57076c7ae14610cc2ded1a1426fd626d829ce74ff4da",
        ),
        (
            &["render", "-n", "elsewhere", path],
            "efbf0e39113e8e7ae8f91358b6435fe58f5a66b0ec159b6046a4b85b423c1b98",
        ),
    ] {
        let out = openmed_op(args, None);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
        assert_eq!(sha256(&out.stdout), expected, "{args:?}");
    }
}

#[test]
fn one_bad_document_at_the_end_of_a_large_input_means_no_output() {
    let dir = mixed_workload(1500);
    let late = dir.path().join("zz/late.yaml");
    std::fs::create_dir_all(late.parent().unwrap()).unwrap();
    std::fs::write(
        &late,
        format!(
            "{DEPLOYMENT}---\n{}",
            MODEL.replace("tier: Small", "tier: Huge")
        ),
    )
    .unwrap();
    for args in [
        &["render", dir.path().to_str().unwrap()][..],
        &["render", "-o", "json", dir.path().to_str().unwrap()],
    ] {
        let out = openmed_op(args, None);
        refused(
            &out,
            1,
            &format!(
                "{}:35: document 2: error[InvalidSpec]: team/svc: spec.tier: \"Huge\" is not one of",
                late.display()
            ),
        );
        assert!(
            stderr(&out).ends_with("openmed-op: 1 problem found; nothing was written\n"),
            "{}",
            stderr(&out)
        );
    }
}

#[test]
fn a_fleet_renders_wave_by_wave_in_its_order_each_as_its_folder_alone() {
    let out = openmed_op(&["render", "examples/fleet"], None);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let headings: Vec<&str> = text.lines().filter(|l| l.starts_with("# wave ")).collect();
    assert_eq!(
        headings,
        [
            "# wave 1 of 3: staging (clusters/staging)",
            "# wave 2 of 3: hospital-a (clusters/hospital-a)",
            "# wave 3 of 3: hospital-b (clusters/hospital-b)",
        ]
    );
    // Each wave is what rendering its folder alone writes.
    let mut expected = Vec::new();
    for wave in ["staging", "hospital-a", "hospital-b"] {
        let alone = openmed_op(
            &["render", &format!("examples/fleet/clusters/{wave}")],
            None,
        );
        assert!(alone.status.success(), "{}", stderr(&alone));
        expected.extend(docs(&stdout(&alone)));
    }
    assert_eq!(docs(&text), expected);

    let summary = stdout(&openmed_op(
        &["render", "--summary", "examples/fleet"],
        None,
    ));
    let lines: Vec<&str> = summary
        .lines()
        .filter(|l| l.starts_with("# wave ") || l.starts_with("openmed/"))
        .collect();
    // A heading, then its wave's one resource, three times.
    assert_eq!(lines.len(), 6, "{summary}");
    for pair in lines.chunks(2) {
        assert!(
            pair[0].starts_with("# wave ") && pair[1].starts_with("openmed/openmed-service "),
            "{summary}"
        );
    }
}

#[test]
fn a_fleet_file_in_error_is_refused_with_its_line_and_a_bad_wave_writes_nothing() {
    let fleet = "apiVersion: openmed.ai/v1alpha1\nkind: OpenMedFleet\nwaves:\n  - name: staging\n    path: ../elsewhere\n";
    let dir = temp_dir(&[
        ("openmed-fleet.yaml", fleet),
        ("clusters/staging/model.yaml", MODEL),
    ]);
    let out = openmed_op(&["render", dir.path().to_str().unwrap()], None);
    refused(
        &out,
        2,
        "openmed-fleet.yaml:5: waves[0].path: \"../elsewhere\" must be a folder inside the repository",
    );

    let fleet = fleet.replace("../elsewhere", "clusters/staging")
        + "  - name: hospital-a\n    path: clusters/hospital-a\n";
    let broken = MODEL.replace("tier: Small", "tier: Huge");
    let dir = temp_dir(&[
        ("openmed-fleet.yaml", &fleet),
        ("clusters/staging/model.yaml", MODEL),
        ("clusters/hospital-a/model.yaml", &broken),
    ]);
    let out = openmed_op(&["render", dir.path().to_str().unwrap()], None);
    refused(&out, 1, "clusters/hospital-a/model.yaml");
}

#[test]
fn a_wave_of_several_clusters_renders_each_cluster_under_its_wave() {
    let fleet = "apiVersion: openmed.ai/v1alpha1\nkind: OpenMedFleet\nwaves:\n  - name: staging\n    path: clusters/staging\n  - name: hospitals\n    clusters:\n      - name: hospital-a\n        path: clusters/hospital-a\n      - name: hospital-b\n        path: clusters/hospital-b\n";
    let dir = temp_dir(&[
        ("openmed-fleet.yaml", fleet),
        ("clusters/staging/model.yaml", MODEL),
        ("clusters/hospital-a/model.yaml", MODEL),
        ("clusters/hospital-b/model.yaml", MODEL),
    ]);
    let path = dir.path().to_str().unwrap();
    let out = openmed_op(&["render", "--summary", path], None);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let headings: Vec<&str> = text.lines().filter(|l| l.starts_with("# wave ")).collect();
    assert_eq!(
        headings,
        [
            "# wave 1 of 2: staging (clusters/staging)",
            "# wave 2 of 2: hospitals: cluster hospital-a (clusters/hospital-a)",
            "# wave 2 of 2: hospitals: cluster hospital-b (clusters/hospital-b)",
        ]
    );
    let out = openmed_op(&["render", "-o", "json", path], None);
    assert!(out.status.success(), "{}", stderr(&out));
    let all: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let order: Vec<(&str, &str, &str)> = all["waves"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            (
                w["wave"].as_str().unwrap(),
                w["cluster"].as_str().unwrap(),
                w["path"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        order,
        [
            ("staging", "staging", "clusters/staging"),
            ("hospitals", "hospital-a", "clusters/hospital-a"),
            ("hospitals", "hospital-b", "clusters/hospital-b"),
        ]
    );
}

/// The bundled fleet, committed into a fresh repository and checked out.
fn fleet_repo() -> support::TestRepo {
    let repo = support::TestRepo::new();
    let example = root().join("examples/fleet");
    let mut files = Vec::new();
    for entry in walkdir::WalkDir::new(&example) {
        let entry = entry.unwrap();
        if entry.file_type().is_file() {
            let path = entry.path().strip_prefix(&example).unwrap();
            let text = std::fs::read_to_string(entry.path()).unwrap();
            files.push((path.to_str().unwrap().to_owned(), text));
        }
    }
    let files: Vec<(&str, &str)> = files
        .iter()
        .map(|(p, t)| (p.as_str(), t.as_str()))
        .collect();
    repo.commit("main", &files);
    repo.checkout("main");
    repo
}

#[test]
fn with_base_a_fleet_shows_what_the_change_does_wave_by_wave() {
    let repo = fleet_repo();
    let staging = repo.path().join("clusters/staging/openmedmodel.yaml");
    let text = std::fs::read_to_string(&staging).unwrap();
    std::fs::write(
        &staging,
        text.replace("synthetic-pii-v1", "synthetic-pii-v2"),
    )
    .unwrap();

    let out = openmed_op(&["render", "--base", "HEAD", repo.path_str()], None);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0], "# wave 1 of 3: staging (clusters/staging)",
        "{text}"
    );
    assert_eq!(
        lines[1],
        "openmed/openmed-service (openmed-service/openmed-service): changed: the pods roll",
        "{text}"
    );
    for field in [
        "  version                         OpenMed/synthetic-pii-v1 -> OpenMed/synthetic-pii-v2",
        "  OPENMED_SERVICE_PRELOAD_MODELS  OpenMed/synthetic-pii-v1 -> OpenMed/synthetic-pii-v2",
        "  pod-template hash               sha256:",
        "  snapshot ConfigMap              openmed-service-model-manifest-",
    ] {
        assert!(
            lines.iter().any(|l| l.starts_with(field)),
            "{field}: {text}"
        );
    }
    // The new pods serve the version the cluster runs at BASE beside the
    // new one, as the operator writes them for a bump (docs/concepts.md,
    // what clients send): a preview that dropped it would show clients of
    // v1 refused where the operator keeps them served.
    let served = lines
        .iter()
        .find(|l| l.starts_with("  OPENMED_SERVICE_SERVED_MODELS"))
        .unwrap_or_else(|| panic!("no served set: {text}"));
    let after = served.split(" -> ").nth(1).unwrap();
    assert!(
        after.starts_with("OpenMed/synthetic-pii-v2,OpenMed/synthetic-pii-v1,"),
        "{served}"
    );
    // The hospitals lag: they change nothing yet.
    let rest = &text[text.find("# wave 2 of 3").expect("wave 2")..];
    assert_eq!(
        rest,
        "# wave 2 of 3: hospital-a (clusters/hospital-a)\nopenmed/openmed-service (openmed-service/openmed-service): unchanged\n# wave 3 of 3: hospital-b (clusters/hospital-b)\nopenmed/openmed-service (openmed-service/openmed-service): unchanged\n"
    );

    // The same, as JSON, from one cluster's folder.
    let folder = repo.path().join("clusters/staging");
    let out = openmed_op(
        &[
            "render",
            "--base",
            "HEAD",
            "-o",
            "json",
            folder.to_str().unwrap(),
        ],
        None,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let change = &report["changes"][0];
    assert_eq!(change["what"], "changed");
    assert_eq!(change["rolls"], true);
    assert_eq!(change["fields"][0]["name"], "version");
    assert_eq!(change["fields"][0]["after"], "OpenMed/synthetic-pii-v2");
}

#[test]
fn with_base_a_new_folder_is_added_and_bad_input_writes_nothing() {
    let repo = fleet_repo();
    let added = repo.path().join("clusters/new");
    std::fs::create_dir_all(&added).unwrap();
    std::fs::copy(
        repo.path().join("clusters/staging/openmedmodel.yaml"),
        added.join("openmedmodel.yaml"),
    )
    .unwrap();
    let out = openmed_op(&["render", "--base", "HEAD", added.to_str().unwrap()], None);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with(
            "openmed/openmed-service (openmed-service/openmed-service): added: the operator adopts the Deployment"
        ),
        "{}",
        stdout(&out)
    );

    let path = repo.path_str();
    for (args, says) in [
        (
            vec!["render", "--base", "no-such-rev", path],
            "--base no-such-rev: unknown revision",
        ),
        (vec!["render", "--base", "HEAD", "-"], "not from stdin"),
        (
            vec!["render", "--base", "HEAD", "--summary", path],
            "cannot be used with",
        ),
    ] {
        let out = openmed_op(&args, Some(""));
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
    }
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("m.yaml"), MODEL).unwrap();
    let out = openmed_op(
        &["render", "--base", "HEAD", outside.path().to_str().unwrap()],
        None,
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("not in a Git repository"),
        "{}",
        stderr(&out)
    );
}

const AUTOSCALING: &str = "  autoscaling:\n    minReplicas: 3\n    maxReplicas: 12\n    scaleDownStabilizationSeconds: 60\n";

#[test]
fn an_autoscaled_model_renders_its_autoscaler_and_no_replicas() {
    let dir = temp_dir(&[
        ("model.yaml", &format!("{MODEL}{AUTOSCALING}")),
        ("deployment.yaml", DEPLOYMENT),
    ]);
    let out = openmed_op(
        &["render", "-o", "json", dir.path().to_str().unwrap()],
        None,
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let list: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(
        deployment_in(&list)["spec"]["replicas"],
        1,
        "the autoscaler owns the count: spec.replicas is not written"
    );
    let hpas = of_kind(&list, "HorizontalPodAutoscaler");
    assert_eq!(hpas.len(), 1);
    let hpa = hpas[0];
    assert_eq!(hpa["apiVersion"], "autoscaling/v2");
    assert_eq!(hpa["metadata"]["name"], "svc");
    assert_eq!(hpa["metadata"]["namespace"], "team");
    assert_eq!(
        hpa["metadata"]["annotations"]["openmed.ai/model-resource"],
        "team/svc"
    );
    assert_eq!(hpa["spec"]["scaleTargetRef"]["name"], "svc");
    assert_eq!(
        (
            hpa["spec"]["minReplicas"].clone(),
            hpa["spec"]["maxReplicas"].clone()
        ),
        (3.into(), 12.into())
    );
    assert_eq!(
        hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"],
        60
    );
    let names: Vec<&str> = hpa["spec"]["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["pods"]["metric"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "openmed_service_admission_queue_depth",
            "openmed_service_inflight_requests"
        ]
    );
}

#[test]
fn autoscaling_on_a_deployment_another_autoscaler_scales_is_refused_at_its_line() {
    let theirs = "\
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: svc-hpa
  namespace: team
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: svc}
  maxReplicas: 4
";
    let dir = temp_dir(&[
        ("model.yaml", &format!("{MODEL}{AUTOSCALING}")),
        ("deployment.yaml", DEPLOYMENT),
        ("hpa.yaml", theirs),
    ]);
    let out = openmed_op(&["render", dir.path().to_str().unwrap()], None);
    refused(&out, 1, "AutoscalerConflict");
    assert!(stderr(&out).contains("model.yaml:11"), "{}", stderr(&out));
    assert!(stderr(&out).contains("hpa.yaml:4"), "{}", stderr(&out));
}

#[test]
fn bounds_that_make_no_sense_are_refused_at_their_line() {
    for (autoscaling, message) in [
        (
            "  autoscaling:\n    minReplicas: 5\n    maxReplicas: 2\n",
            "model.yaml:12: document 1: error[InvalidSpec]: team/svc: spec.autoscaling.minReplicas: minReplicas must not exceed maxReplicas",
        ),
        (
            "  autoscaling:\n    queueDepthPerPod: 0\n",
            "model.yaml:12: document 1: error[InvalidSpec]: team/svc: spec.autoscaling.queueDepthPerPod: 0 is out of range",
        ),
        (
            "  autoscaling:\n    minReplicas: 2\n    inflightRequestsPerPod: -3\n",
            "model.yaml:13: document 1: error[InvalidSpec]: team/svc: spec.autoscaling.inflightRequestsPerPod: -3 is out of range",
        ),
    ] {
        let dir = temp_dir(&[("model.yaml", &format!("{MODEL}{autoscaling}"))]);
        let out = openmed_op(&["render", dir.path().to_str().unwrap()], None);
        refused(&out, 1, message);
    }
}

#[test]
fn with_keda_the_model_renders_a_scaled_object_instead() {
    let keda = "  autoscaling:\n    maxReplicas: 6\n    keda:\n      prometheusAddress: http://prometheus.monitoring:9090\n";
    let dir = temp_dir(&[
        ("model.yaml", &format!("{MODEL}{keda}")),
        ("deployment.yaml", DEPLOYMENT),
    ]);
    let out = openmed_op(
        &["render", "-o", "json", dir.path().to_str().unwrap()],
        None,
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let list: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert!(of_kind(&list, "HorizontalPodAutoscaler").is_empty());
    let scaled_objects = of_kind(&list, "ScaledObject");
    let object = scaled_objects.first().expect("a ScaledObject");
    assert_eq!(object["apiVersion"], "keda.sh/v1alpha1");
    assert_eq!(object["spec"]["maxReplicaCount"], 6);
    assert_eq!(object["spec"]["scaleTargetRef"]["name"], "svc");
    let trigger = &object["spec"]["triggers"][0];
    assert_eq!(trigger["type"], "prometheus");
    assert_eq!(
        trigger["metadata"]["query"],
        r#"sum(avg_over_time(openmed_service_admission_queue_depth{namespace="team",pod=~"svc-[a-z0-9]+-[a-z0-9]+"}[30s]))"#
    );
    assert_eq!(
        trigger["metadata"]["serverAddress"],
        "http://prometheus.monitoring:9090"
    );
    assert_eq!(deployment_in(&list)["spec"]["replicas"], 1);
}
