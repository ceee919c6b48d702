//! The quality gate's probe set format (`PIIProbeSet` in a ConfigMap's
//! `probes.yaml`): the example users copy reads, and every malformed shape
//! is refused with the path of what is wrong.

use openmed_op::api::quality::{PROBE_SET_KEY, parse_probe_set};
use openmed_op::source::parse_stream;
use serde_json::{Value, json};

fn probe_set_document(text: &str) -> Value {
    let docs = parse_stream("probes", text).expect("YAML");
    assert_eq!(docs.len(), 1);
    docs[0].value.clone()
}

#[test]
fn the_example_probe_set_reads_and_its_spans_are_the_entities_words() {
    let root = env!("CARGO_MANIFEST_DIR");
    let text = std::fs::read_to_string(format!("{root}/examples/real/probes.yaml")).unwrap();
    let docs = parse_stream("examples/real/probes.yaml", &text).unwrap();
    let inner = docs[0].value["data"][PROBE_SET_KEY].as_str().unwrap();
    let set = parse_probe_set(&probe_set_document(inner)).unwrap();
    assert_eq!(set.labels(), ["DATE", "LOCATION", "NAME", "PHONE"]);
    assert_eq!(set.request["use_smart_merging"], json!(false));
    let first = &set.probes[0];
    let word = |i: usize| -> String {
        let e = &first.entities[i];
        first
            .text
            .chars()
            .skip(e.start)
            .take(e.end - e.start)
            .collect()
    };
    assert_eq!(
        (0..4).map(word).collect::<Vec<_>>(),
        ["John Smith", "Boston", "2024-03-15", "617-555-0142"]
    );
}

fn errors(doc: Value) -> Vec<String> {
    parse_probe_set(&doc)
        .expect_err("refused")
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn a_malformed_probe_set_is_refused_with_the_path_of_each_problem() {
    let base = |probes: Value| json!({"apiVersion": "openmed.ai/v1alpha1", "kind": "PIIProbeSet", "probes": probes});
    assert_eq!(
        errors(json!({"apiVersion": "v1", "kind": "PIIProbeSet", "probes": []})),
        [
            "apiVersion: must be openmed.ai/v1alpha1, not \"v1\"",
            "probes: needs at least one probe"
        ]
    );
    assert_eq!(
        errors(base(
            json!([{"text": "abc", "entities": [{"label": "NAME", "start": 2, "end": 9}]}])
        )),
        [
            "probes[0].entities[0]: span 2..9 is not inside the text's 3 characters (start < end <= length)"
        ]
    );
    assert_eq!(
        errors(base(json!([{"text": "abc", "entites": []}]))),
        ["probes[0].entites: unknown field; known fields: text, entities"]
    );
    assert_eq!(
        errors(base(
            json!([{"text": "abc", "entities": [{"label": "has space", "start": 0, "end": 1}]}])
        )),
        [
            "probes[0].entities[0].label: \"has space\" is not a label: letters, digits, _ . -, at most 63"
        ]
    );
    assert_eq!(
        errors(base(json!([{"text": "abc"}]))),
        ["probes: no probe names an entity: there is nothing to measure recall on"]
    );
    let mut with_text =
        base(json!([{"text": "a", "entities": [{"label": "NAME", "start": 0, "end": 1}]}]));
    with_text["request"] = json!({"text": "x"});
    assert_eq!(
        errors(with_text),
        ["request.text: is set by the gate itself; remove it"]
    );
    let many: Vec<Value> = (0..101).map(|_| json!({"text": "a"})).collect();
    assert_eq!(
        errors(base(json!(many))),
        ["probes: 101 probes; at most 100 (each is sent to every new pod)"]
    );
}

#[test]
fn spans_count_characters_as_the_service_does_not_bytes() {
    // "Zoë Müller" is 10 characters and 12 bytes.
    let set = parse_probe_set(&json!({
        "apiVersion": "openmed.ai/v1alpha1", "kind": "PIIProbeSet",
        "probes": [{"text": "Zoë Müller", "entities": [{"label": "NAME", "start": 0, "end": 10}]}],
    }))
    .unwrap();
    assert_eq!(set.probes[0].entities[0].end, 10);
}
