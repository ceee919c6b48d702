//! The fuzz targets' bodies: each feeds bytes to one of the parsers a user
//! or Git can reach and checks what a bad input must get, a clear error,
//! never a panic. `tests/fuzz_corpus.rs` replays the committed corpus
//! through these same functions on stable Rust, so every input that once
//! found a bug stays a test.

use openmed_op::operator::RawModel;
use openmed_op::render::{self, MissingTarget};
use openmed_op::rollout::{self, Observed, Settings};
use openmed_op::source;
use openmed_op::verify::rules::ClusterStatus;
use openmed_op::verify::{history, status};

/// `render FILE`: a YAML stream, then the render of its documents.
pub fn render_stream(data: &[u8]) {
    // Bytes, as a file is read: a BOM, UTF-16, the size limits.
    let Ok(docs) = source::parse_bytes("fuzz.yaml", data) else {
        return;
    };
    for missing in [MissingTarget::Patch, MissingTarget::Warn] {
        match render::render(&docs, "default", missing) {
            // The stream is laid out after the judgement, as it is written.
            Ok(rendered) => {
                render::write_yaml(&mut std::io::sink(), rendered.documents()).expect("a sink");
                render::write_json(&mut std::io::sink(), rendered.documents()).expect("a sink");
            }
            Err(findings) => {
                assert!(!findings.is_empty(), "an error names at least one finding");
                for finding in findings {
                    assert!(
                        !finding.to_string().is_empty(),
                        "every finding says something"
                    );
                }
            }
        }
    }
}

/// `render --krm`: a KRM ResourceList on standard input.
pub fn render_krm(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(message) = render::krm::run(text) {
        assert!(!message.is_empty(), "a refused ResourceList says why");
    }
}

/// `verify`: the objects of a file in Git (its history entries) and the
/// same text as a `--status` file.
pub fn verify_objects(data: &[u8]) {
    let Ok(docs) = source::parse_bytes("models.yaml", data) else {
        return;
    };
    let _ = history::entries(&docs, "default");
    let mut cluster = ClusterStatus::new();
    if let Err(e) = status::collect(&docs, "default", &mut cluster) {
        assert!(!e.to_string().is_empty());
    }
}

/// The operator's stored-object path: a JSON object as the API server
/// would send it, read as an OpenMedModel, viewed and decided on.
pub fn stored_object(data: &[u8]) {
    let Ok(model) = serde_json::from_slice::<RawModel>(data) else {
        return;
    };
    let view = model.view();
    let deployment: k8s_openapi::api::apps::v1::Deployment = serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": model.target_name(), "namespace": "default", "generation": 1},
        "spec": {"selector": {"matchLabels": {"app": "x"}},
                 "template": {"metadata": {"labels": {"app": "x"}},
                              "spec": {"containers": [{"name": "openmed-service", "image": "x"}]}}},
    }))
    .expect("a valid Deployment");
    for target in [None, Some(&deployment)] {
        let _ = rollout::decide(&Observed {
            resource: &view,
            target,
            canary_target: target,
            route: None,
            measurements: &[],
            probes: &[],
            autoscalers: &[],
            scaled_object: None,
            rivals: &[],
            claimed: &[],
            config_maps: &[],
            snapshot_uses: &[],
            pods: &[],
            settings: Settings::default(),
            now: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap(),
            ),
        });
    }
}
