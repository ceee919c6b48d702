//! The real OpenMed REST service (openmed 3.1.0 from PyPI, its CPU ONNX
//! backend, installed by `tests/workload/build`) serving the synthetic
//! models `tests/workload/make-model` writes: each model tags what it was
//! made to tag, misses what it was made to miss, fails requests when made
//! to, and a pointer the service cannot load ends the process with its
//! reason. The service's own `validate_model_name` and our
//! `is_service_model_id` give the same answer on the same inputs.
//!
//! Every process listens on 127.0.0.1 only and is stopped at the end of
//! its test; every wait has a deadline.

#[path = "workload/service.rs"]
mod service;

use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use service::*;

const TEXT: &str = "Patient John Smith from Boston was seen on 2024-03-15, phone 617-555-0142.";

/// `(label, text)` of every entity found.
fn entities(answer: &Value) -> Vec<(String, String)> {
    answer["entities"]
        .as_array()
        .unwrap_or_else(|| panic!("no entities in {answer}"))
        .iter()
        .map(|e| {
            (
                e["label"].as_str().unwrap().to_owned(),
                e["text"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn a_synthetic_model_warms_and_tags_what_it_was_made_to_tag() {
    runtime().block_on(async {
        let client = client();
        let mut service = Service::start("OpenMed/synthetic-pii-v1", None);
        service.ready(&client).await;
        let live = client.get(service.url("/livez")).send().await.unwrap();
        assert_eq!(live.status(), 200);
        let (status, answer) = service
            .extract(&client, "OpenMed/synthetic-pii-v1", TEXT)
            .await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["model_name"], "OpenMed/synthetic-pii-v1");
        let found = entities(&answer);
        for (label, text) in [
            ("NAME", "John Smith"),
            ("LOCATION", "Boston"),
            ("DATE", "2024-03-15"),
            ("PHONE", "617-555-0142"),
        ] {
            assert!(
                found.contains(&(label.to_owned(), text.to_owned())),
                "{label} {text:?} not in {found:?}"
            );
        }
        // A model it does not serve is refused, not answered by another.
        let (status, _) = service
            .extract(&client, "OpenMed/synthetic-pii-v2", TEXT)
            .await;
        assert_eq!(status, 422);
    });
}

#[test]
fn a_model_made_to_miss_a_label_never_tags_it() {
    runtime().block_on(async {
        let client = client();
        let cache = tempfile::tempdir().unwrap();
        make_model(cache.path(), "OpenMed/misses-name", &["--misses", "NAME"]);
        let mut service = Service::start("OpenMed/misses-name", Some(cache.path()));
        service.ready(&client).await;
        let (status, answer) = service.extract(&client, "OpenMed/misses-name", TEXT).await;
        assert_eq!(status, 200, "{answer}");
        let found = entities(&answer);
        assert!(found.iter().all(|(label, _)| label != "NAME"), "{found:?}");
        assert!(
            found.contains(&("LOCATION".to_owned(), "Boston".to_owned())),
            "{found:?}"
        );
    });
}

#[test]
fn a_model_made_to_fail_requests_warms_and_then_fails_every_request() {
    runtime().block_on(async {
        let client = client();
        let cache = tempfile::tempdir().unwrap();
        make_model(cache.path(), "OpenMed/fails", &["--fail-requests"]);
        let mut service = Service::start("OpenMed/fails", Some(cache.path()));
        service.ready(&client).await;
        for _ in 0..3 {
            let (status, answer) = service.extract(&client, "OpenMed/fails", TEXT).await;
            assert!(status >= 500, "{status}: {answer}");
        }
        let ready = client.get(service.url("/readyz")).send().await.unwrap();
        assert_eq!(ready.status(), 200, "readiness does not see inference fail");
    });
}

#[test]
fn a_pointer_the_service_cannot_load_ends_the_process_with_its_reason() {
    let cases = [
        ("OpenMed/not-in-the-cache", "LocalEntryNotFoundError"),
        ("OpenMed/pii:v2", "InputError"),
    ];
    for (pointer, cause) in cases {
        let mut service = Service::start(pointer, None);
        assert_eq!(
            service.exit_code(),
            Some(3),
            "{pointer}:\n{}",
            service.log()
        );
        let log = service.log();
        assert!(
            log.contains("Application startup failed"),
            "{pointer}:\n{log}"
        );
        assert!(log.contains(cause), "{pointer}: no {cause}:\n{log}");
    }
}

#[test]
fn make_model_is_deterministic_and_writes_whole_models_only() {
    let one = tempfile::tempdir().unwrap();
    let two = tempfile::tempdir().unwrap();
    let a = make_model(one.path(), "OpenMed/same", &["--labels", "NAME,DATE"]);
    let b = make_model(two.path(), "OpenMed/same", &["--labels", "NAME,DATE"]);
    assert_eq!(a["commit"], b["commit"]);
    let model = |dir: &Path| {
        std::fs::read(
            dir.join("models--OpenMed--same/snapshots")
                .join(a["commit"].as_str().unwrap())
                .join("model.onnx"),
        )
        .unwrap()
    };
    assert_eq!(model(one.path()), model(two.path()));
    // Again with the same arguments: nothing to do. With others: refused
    // unless --force, and nothing half-written is left either way.
    make_model(one.path(), "OpenMed/same", &["--labels", "NAME,DATE"]);
    let out = Command::new(root().join("tests/workload/make-model"))
        .args([
            "OpenMed/same",
            "--cache",
            one.path().to_str().unwrap(),
            "--misses",
            "NAME",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let names: Vec<String> = std::fs::read_dir(one.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["models--OpenMed--same"]);
}

/// Runs `script` in the installed service's Python with `inputs` as JSON
/// on its stdin, from a folder where no input names an existing path, and
/// returns the JSON it prints.
fn ask_the_service(script: &str, inputs: &[&str]) -> Value {
    let empty = tempfile::tempdir().unwrap();
    let mut child = Command::new(workload().join("venv/bin/python"))
        .args(["-c", script])
        .current_dir(empty.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    serde_json::to_writer(child.stdin.take().unwrap(), inputs).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The service's own rule, asked of the installed service on each input
/// (from a folder where no input names an existing path).
#[test]
fn our_pointer_rule_is_the_services_own() {
    let inputs = [
        "OpenMed/pii-v2",
        "pii",
        "OpenMed/synthetic_pii.v1",
        "a-b/c.d_e",
        "a/b/c",
        "OpenMed/pii:v2",
        "org/model@main",
        "OpenMed/pii@sha256:0123abcd",
        "OpenMed/pii+local",
        "OpenMed/pii~1",
        "OpenMed/",
        "/pii",
        "bad name",
    ];
    let script = "\
import json, sys
from openmed.utils.validation import validate_model_name
answers = {}
for name in json.load(sys.stdin):
    try:
        validate_model_name(name)
        answers[name] = True
    except Exception:
        answers[name] = False
print(json.dumps(answers))
";
    let service = ask_the_service(script, &inputs);
    let service = service.as_object().unwrap();
    for input in inputs {
        assert_eq!(
            openmed_op::api::rules::is_service_model_id(input),
            service[input] == true,
            "{input:?}: the service says {}",
            service[input]
        );
    }
}

/// The served-set rule and the service's default ids are the service's
/// own: its `_is_served_identifier` and `DEFAULT_SERVED_MODELS`, asked of
/// the installed service.
#[test]
fn our_served_set_rules_are_the_services_own() {
    let inputs = [
        "OpenMed/pii-v2",
        "pii",
        "_private/x",
        "OpenMed/synthetic_pii.v1",
        "a/b/c",
        "a..b",
        "OpenMed/pii:v2",
        "org/model@main",
        "OpenMed/pii+local",
        "-lead/x",
        ".hidden",
        "OpenMed/",
        "/pii",
        "bad name",
        "",
    ];
    let script = "\
import json, sys
from openmed.service import runtime
answers = {name: bool(runtime._is_served_identifier(name)) for name in json.load(sys.stdin)}
print(json.dumps({'answers': answers, 'defaults': list(runtime.DEFAULT_SERVED_MODELS)}))
";
    let service = ask_the_service(script, &inputs);
    for input in inputs {
        assert_eq!(
            openmed_op::plan::served::is_served_name(input),
            service["answers"][input] == true,
            "{input:?}: the service says {}",
            service["answers"][input]
        );
    }
    assert_eq!(
        service["defaults"],
        json!(openmed_op::plan::served::SERVICE_DEFAULTS),
        "the ids the service serves without a set"
    );
}

/// The test image's app answers a request that names no model with the
/// model it preloaded, names its pod in a header, and leaves every other
/// request to the service.
#[test]
fn the_image_defaults_to_its_preloaded_model_and_changes_nothing_else() {
    runtime().block_on(async {
        let client = client();
        // Without the image's app, the service's own default is a model
        // that is not preloaded: what a rollout's clients would hit.
        let mut plain = Service::start("OpenMed/synthetic-pii-v2", None);
        plain.ready(&client).await;
        let unnamed = json!({"text": TEXT, "use_smart_merging": false});
        let answer = client
            .post(plain.url("/pii/extract"))
            .json(&unnamed)
            .send()
            .await
            .unwrap();
        assert_ne!(
            answer.status(),
            200,
            "the service's default model is not preloaded here"
        );
        drop(plain);

        let mut service =
            Service::start_app("OpenMed/synthetic-pii-v2", None, Some("openmed_image:app"));
        service.ready(&client).await;
        let answer = client
            .post(service.url("/pii/extract"))
            .json(&unnamed)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200);
        assert_eq!(
            answer.headers()["x-openmed-pod"],
            Service::POD_NAME,
            "every answer names the pod that gave it"
        );
        let body: Value = answer.json().await.unwrap();
        assert_eq!(body["model_name"], "OpenMed/synthetic-pii-v2", "{body}");
        assert!(
            entities(&body).contains(&("NAME".to_owned(), "John Smith".to_owned())),
            "{body}"
        );
        // Named models get the service's own answers.
        let (status, body) = service
            .extract(&client, "OpenMed/synthetic-pii-v2", TEXT)
            .await;
        assert_eq!(
            (status, &body["model_name"]),
            (200, &json!("OpenMed/synthetic-pii-v2"))
        );
        let (status, _) = service
            .extract(&client, "OpenMed/synthetic-pii-v1", TEXT)
            .await;
        assert_eq!(status, 422, "a model it did not preload is still refused");
        // Malformed JSON is the service's to answer.
        let answer = client
            .post(service.url("/pii/extract"))
            .header("content-type", "application/json")
            .body("{not json")
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 422);
    });
}
