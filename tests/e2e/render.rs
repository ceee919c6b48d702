//! `render` against the API server's own reading of YAML: each document
//! goes to the server as a YAML body (strict field validation, dry run),
//! once as written and once as `render` wrote it, and the server must store
//! the same object both times. What the server refuses, `render` refuses.
//!
//! This is where the YAML 1.1 table of `src/source/yaml/scalar.rs` is held
//! to the truth: `yes` is a boolean, `010` is 8, `0o7` is 7, `!!binary` is
//! decoded, merge keys apply.

use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use libtest_mimic::Trial;
use serde_json::Value;

use crate::support::*;
use crate::trial;

pub fn trials() -> Vec<Trial> {
    vec![
        trial(
            "render::documents_it_does_not_own_are_stored_as_the_input_would_be",
            documents_it_does_not_own_are_stored_as_the_input_would_be,
        ),
        trial(
            "render::what_the_server_refuses_render_refuses",
            what_the_server_refuses_render_refuses,
        ),
    ]
}

/// A kind that keeps any field, to see the server's reading of a scalar.
const BAG_CRD: &str = "\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: bags.e2e.openmed.test
spec:
  group: e2e.openmed.test
  names: {kind: Bag, plural: bags, singular: bag}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true
";

async fn install_bag_crd(client: &Client) {
    static DONE: OnceLock<()> = OnceLock::new();
    if DONE.get().is_some() {
        return;
    }
    let crd: CustomResourceDefinition = serde_yaml::from_str(BAG_CRD).unwrap();
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    api.patch(
        "bags.e2e.openmed.test",
        &PatchParams::apply("openmed-op-tests").force(),
        &Patch::Apply(&crd),
    )
    .await
    .unwrap();
    // Established, and served: a dry-run create answers.
    wait_for("the Bag CRD to serve", Duration::from_secs(60), || async {
        let probe = "apiVersion: e2e.openmed.test/v1\nkind: Bag\nmetadata: {name: probe}\n";
        server_reads(client, "default", probe).await.ok()
    })
    .await;
    let _ = DONE.set(());
}

/// Where a document of this kind is created.
fn collection(namespace: &str, kind: &str) -> String {
    match kind {
        "ConfigMap" => format!("/api/v1/namespaces/{namespace}/configmaps"),
        "Deployment" => format!("/apis/apps/v1/namespaces/{namespace}/deployments"),
        "Bag" => format!("/apis/e2e.openmed.test/v1/namespaces/{namespace}/bags"),
        other => panic!("no collection for {other}"),
    }
}

/// What the API server stores from `yaml`, sent as it is (a YAML body,
/// strict field validation, dry run), without the fields it generates;
/// or the server's refusal.
async fn server_reads(client: &Client, namespace: &str, yaml: &str) -> Result<Value, String> {
    let kind = yaml
        .lines()
        .find_map(|l| l.strip_prefix("kind: "))
        .expect("a kind line")
        .trim();
    let request = http::Request::post(format!(
        "{}?dryRun=All&fieldValidation=Strict",
        collection(namespace, kind)
    ))
    .header("Content-Type", "application/yaml")
    .header("Accept", "application/json")
    .body(yaml.as_bytes().to_vec())
    .unwrap();
    let text = client
        .request_text(request)
        .await
        .map_err(|e| e.to_string())?;
    let mut stored: Value = serde_json::from_str(&text).unwrap();
    let meta = stored["metadata"].as_object_mut().unwrap();
    for generated in [
        "uid",
        "creationTimestamp",
        "resourceVersion",
        "managedFields",
        "generation",
    ] {
        meta.remove(generated);
    }
    Ok(stored)
}

/// `openmed-op render ARGS -` on `yaml`: exit code, stdout, stderr.
fn render_with(args: &[&str], yaml: &str) -> (i32, String, String) {
    let all: Vec<&str> = ["render"]
        .iter()
        .chain(args)
        .chain(&["-"])
        .copied()
        .collect();
    let out = run_with_input(&all, yaml);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn render(yaml: &str) -> (i32, String, String) {
    render_with(&[], yaml)
}

/// Documents a manifest may hold that are not OpenMedModels, each with the
/// YAML habits `render` must read as the server does.
const PASS_THROUGH: &[&str] = &[
    "\
apiVersion: v1
kind: ConfigMap
metadata:
  name: quoted
data:
  a: \"yes\"
  b: \"on\"
  c: \"y\"
  d: \"1_000\"
  e: \"0o7\"
  f: \"010\"
  g: \"2001-12-14\"
  h: \"~\"
  i: \"<<\"
  j: \"- item\"
  k: 'it''s # not a comment'
  l: \"line one\\nline two\\n\"
  m: \"tab\\there\"
",
    "\
apiVersion: v1
kind: ConfigMap
metadata:
  name: binary
data:
  text: !!binary aGVsbG8gd29ybGQ=
  folded: !!binary |
    aGVs
    bG8=
  tagged: !!str 123
  local: !custom 5
",
    "\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: anchors
  labels: &labels
    app: anchors
spec:
  replicas: 0x2
  selector:
    matchLabels: *labels
  template:
    metadata:
      labels: *labels
    spec:
      containers:
      - name: app
        <<: &common
          image: busybox
          env:
          - {name: \"ON\", value: \"on\"}
          - {name: COUNT, value: \"010\"}
      - name: sidecar
        <<: *common
",
    "\
apiVersion: e2e.openmed.test/v1
kind: Bag
metadata:
  name: scalars
v:
  bools: [yes, Yes, on, y, n, No, off, TRUE, tRue]
  ints: [0x10, -0x10, 0o7, 010, 08, 1_000, 0b11, +12, 99999999999999999999]
  floats: [1.0, 1e23, .5, -.5, 1.e5, 1e400]
  strings: [1:20, 2001-12-14, 1.0.0, _1, 0b, nULL]
  nulls: [~, null, Null]
  keys: {1: int, true: bool, 1.5: float, 2001-12-14: date}
  merged:
    <<: [{a: 1}, {b: 2}]
    c: 3
",
];

fn documents_it_does_not_own_are_stored_as_the_input_would_be() {
    block_on(async {
        let client = admin().await;
        install_bag_crd(&client).await;
        let ns = TestNamespace::create(&client, "render-yaml").await;
        for input in PASS_THROUGH {
            let from_input = server_reads(&client, &ns.name, input)
                .await
                .unwrap_or_else(|e| panic!("the server refuses the input: {e}\n{input}"));
            let (code, output, err) = render(input);
            assert_eq!(code, 0, "{err}\n{input}");
            let from_output = server_reads(&client, &ns.name, &output)
                .await
                .unwrap_or_else(|e| panic!("the server refuses render's output: {e}\n{output}"));
            assert_eq!(
                from_output, from_input,
                "the server stores render's output differently from its input\n--- input\n{input}\n--- output\n{output}"
            );
            // And render read it as the server did: its JSON output holds
            // the fields the server stored.
            let (_, json, _) = render_with(&["-o", "json"], input);
            let list: Value = serde_json::from_str(&json).unwrap();
            let read = &list["items"][0];
            for field in ["data", "v"] {
                if let Some(stored) = from_input.get(field) {
                    assert_eq!(&read[field], stored, "{field} of\n{input}");
                }
            }
            if from_input["kind"] == "Deployment" {
                assert_eq!(read["spec"]["replicas"], from_input["spec"]["replicas"]);
                assert_eq!(
                    read["spec"]["template"]["spec"]["containers"][1]["env"],
                    from_input["spec"]["template"]["spec"]["containers"][1]["env"]
                );
            }
        }
        ns.delete().await;
    });
}

/// Each of these the server refuses; `render` must refuse it too, not
/// pass on something the server would store differently.
const REFUSED: &[&str] = &[
    "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: twice}\ndata:\n  a: \"1\"\n  a: \"2\"\n",
    "apiVersion: e2e.openmed.test/v1\nkind: Bag\nmetadata: {name: nan}\nv: .nan\n",
    "apiVersion: e2e.openmed.test/v1\nkind: Bag\nmetadata: {name: inf}\nv: -.inf\n",
    "apiVersion: e2e.openmed.test/v1\nkind: Bag\nmetadata: {name: merge}\nv: {a: 1, <<: {a: 2}}\n",
    "apiVersion: e2e.openmed.test/v1\nkind: Bag\nmetadata: {name: keys}\nv: {y: 1, true: 2}\n",
    "apiVersion: e2e.openmed.test/v1\nkind: Bag\nmetadata: {name: nullkey}\nv: {~: 1}\n",
    "apiVersion: e2e.openmed.test/v1\nkind: Bag\nmetadata: {name: badint}\nv: !!int 1.5\n",
];

fn what_the_server_refuses_render_refuses() {
    block_on(async {
        let client = admin().await;
        install_bag_crd(&client).await;
        let ns = TestNamespace::create(&client, "render-refused").await;
        for input in REFUSED {
            let server = server_reads(&client, &ns.name, input).await;
            assert!(server.is_err(), "the server stores it: {server:?}\n{input}");
            let (code, output, err) = render(input);
            assert_eq!(code, 2, "render accepts it:\n{output}\n{input}");
            assert!(output.is_empty() && err.contains("not valid YAML"), "{err}");
        }
        ns.delete().await;
    });
}
