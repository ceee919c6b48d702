//! Wire compatibility with the earlier Python operator: for every vector in
//! `tests/vectors/`, `validate` and `plan` produce the same names, bytes and
//! hashes, so a cluster can switch operators without restarting a pod.

use std::path::Path;

use openmed_op::api::{self, names};
use openmed_op::plan::{self, ResourceId, TargetOptions};
use serde_json::Value;

fn vectors() -> Vec<(String, Value)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vectors");
    let mut out: Vec<(String, Value)> = std::fs::read_dir(&dir)
        .expect("tests/vectors exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (
                p.display().to_string(),
                serde_json::from_str(&text).unwrap(),
            )
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(out.len() >= 3, "the vectors are missing");
    out
}

fn plan_for(vector: &Value) -> plan::Plan {
    let resource = &vector["resource"];
    let spec = api::validate(resource, None).expect("every vector is valid");
    let id = ResourceId {
        namespace: resource["metadata"]["namespace"]
            .as_str()
            .unwrap()
            .to_owned(),
        name: resource["metadata"]["name"].as_str().unwrap().to_owned(),
        uid: resource["metadata"]["uid"].as_str().map(str::to_owned),
    };
    plan::plan(&id, &spec, TargetOptions::default())
}

#[test]
fn every_vector_matches_byte_for_byte() {
    for (file, vector) in vectors() {
        let plan = plan_for(&vector);
        assert_eq!(
            plan.manifest_json,
            vector["manifestJson"].as_str().unwrap(),
            "{file}: manifestJson"
        );
        assert_eq!(
            plan.manifest_hash,
            vector["manifestHash"].as_str().unwrap(),
            "{file}: manifestHash"
        );
        assert_eq!(
            plan.spec_hash,
            vector["specHash"].as_str().unwrap(),
            "{file}: specHash"
        );
        assert_eq!(
            serde_json::to_value(&plan.normalized).unwrap(),
            vector["normalizedSpec"],
            "{file}: normalizedSpec"
        );
        let cm = &plan.config_map;
        assert_eq!(
            cm.metadata.name.as_deref(),
            vector["configMapName"].as_str(),
            "{file}: configMapName"
        );
        let data = cm.data.as_ref().unwrap();
        assert_eq!(
            data[names::MANIFEST_KEY],
            vector["manifestJson"].as_str().unwrap(),
            "{file}"
        );
        assert_eq!(
            data[names::PRELOAD_ENV],
            vector["normalizedSpec"]["version"].as_str().unwrap(),
            "{file}: the ConfigMap holds the version pointer"
        );
        assert_eq!(
            plan.deployment.name,
            vector["deploymentName"].as_str().unwrap(),
            "{file}"
        );
        assert_eq!(
            plan.deployment.container,
            vector["containerName"].as_str().unwrap(),
            "{file}"
        );
    }
}

#[test]
fn the_normalized_spec_of_a_vector_hashes_to_its_spec_hash() {
    // Status written by the earlier operator holds normalized specs; hashing
    // them again must give the stored hash, or rollback history is lost.
    for (file, vector) in vectors() {
        let normalized: api::OpenMedModelSpec =
            serde_json::from_value(vector["normalizedSpec"].clone()).unwrap();
        assert_eq!(
            plan::spec_hash(&normalized),
            vector["specHash"].as_str().unwrap(),
            "{file}"
        );
        let name = vector["resource"]["metadata"]["name"].as_str().unwrap();
        assert_eq!(
            plan::normalize(name, &normalized),
            normalized,
            "{file}: normalize is idempotent"
        );
    }
}
