//! The GitOps integration with the real tools: the KRM function under
//! `kpt fn eval --exec` and a kustomize exec transformer, the Argo CD health
//! check under a real Lua 5.1 interpreter over its fixtures, the Argo CD
//! component built with kustomize, and the plugin's generate command.
//!
//! kpt is part of this machine kind; `lua5.1` comes from Debian
//! (`.ci/run` installs it); kustomize is built from its Go module by
//! `tests/gitops/build`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use serde::Deserialize;
use serde_json::{Value, json};

mod executables;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn run(program: impl AsRef<std::ffi::OsStr>, args: &[&str], dir: &Path, stdin: &str) -> Output {
    let mut child = Command::new(&program)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{} cannot run: {e}", program.as_ref().to_string_lossy()));
    let input = stdin.to_owned();
    let mut pipe = child.stdin.take().unwrap();
    std::thread::spawn(move || {
        let _ = pipe.write_all(input.as_bytes());
    });
    child.wait_with_output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn docs(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

/// A package directory holding a copy of the bundled example.
fn example_package() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for file in ["openmed-service.yaml", "openmedmodel.yaml"] {
        std::fs::copy(
            root().join("examples/openmed").join(file),
            dir.path().join(file),
        )
        .unwrap();
    }
    dir
}

/// An executable that runs `openmed-op render --krm`, for tools that take
/// a path to a function binary.
fn krm_function(dir: &Path) -> PathBuf {
    let path = dir.join("openmed-op-krm");
    executables::write_executable(
        &path,
        &format!(
            "#!/bin/sh\nexec '{}' render --krm\n",
            env!("CARGO_BIN_EXE_openmed-op")
        ),
    );
    path
}

fn resource_list(items: &[Value]) -> String {
    serde_yaml::to_string(&json!({
        "apiVersion": "config.kubernetes.io/v1",
        "kind": "ResourceList",
        "items": items,
        "functionConfig": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {"namespace": "team"}},
    }))
    .unwrap()
}

fn example_items() -> Vec<Value> {
    let mut items = Vec::new();
    for file in ["openmed-service.yaml", "openmedmodel.yaml"] {
        let text = std::fs::read_to_string(root().join("examples/openmed").join(file)).unwrap();
        for (i, mut doc) in docs(&text).into_iter().enumerate() {
            doc["metadata"]["annotations"]["internal.config.kubernetes.io/path"] = json!(file);
            doc["metadata"]["annotations"]["internal.config.kubernetes.io/index"] =
                json!(i.to_string());
            items.push(doc);
        }
    }
    items
}

// ---- the KRM function ----

#[test]
fn the_krm_function_renders_items_as_render_does() {
    let input = resource_list(&example_items());
    let out = run(
        env!("CARGO_BIN_EXE_openmed-op"),
        &["render", "--krm"],
        root(),
        &input,
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let list: Value = serde_yaml::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(list["kind"], "ResourceList");
    assert!(
        list.get("results").is_none(),
        "no findings: {}",
        list["results"]
    );
    let items = list["items"].as_array().unwrap();
    let kinds: Vec<&str> = items.iter().map(|i| i["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "Namespace",
            "Deployment",
            "Service",
            "OpenMedModel",
            "ConfigMap",
            "ConfigMap"
        ]
    );
    // The same bytes as `render` on the same files, apart from the
    // function's own annotations.
    let rendered = run(
        env!("CARGO_BIN_EXE_openmed-op"),
        &["render", "-o", "json", "examples/openmed/"],
        root(),
        "",
    );
    let expected: Value = serde_json::from_slice(&rendered.stdout).unwrap();
    for (item, expected) in items.iter().zip(expected["items"].as_array().unwrap()) {
        let mut item = item.clone();
        if let Some(a) = item["metadata"]["annotations"].as_object_mut() {
            a.retain(|k, _| !k.starts_with("internal.config.kubernetes.io/"));
            if a.is_empty() {
                item["metadata"]
                    .as_object_mut()
                    .unwrap()
                    .remove("annotations");
            }
        }
        assert_eq!(&item, expected);
    }
    // Items keep their function annotations.
    assert_eq!(
        items[1]["metadata"]["annotations"]["internal.config.kubernetes.io/path"],
        "openmed-service.yaml"
    );
}

#[test]
fn krm_findings_become_results_and_the_items_stay_unchanged() {
    let mut items = example_items();
    let model = items
        .iter_mut()
        .find(|i| i["kind"] == "OpenMedModel")
        .unwrap();
    model["spec"]["tier"] = json!("Huge");
    let input = resource_list(&items);
    let out = run(
        env!("CARGO_BIN_EXE_openmed-op"),
        &["render", "--krm"],
        root(),
        &input,
    );
    assert_eq!(out.status.code(), Some(1), "errors exit non-zero");
    let list: Value = serde_yaml::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(
        list["items"].as_array().unwrap().len(),
        items.len(),
        "nothing added"
    );
    assert_eq!(list["items"][1], items[1], "nothing changed");
    let result = &list["results"][0];
    assert_eq!(result["severity"], "error");
    assert_eq!(
        result["resourceRef"],
        json!({"apiVersion": "openmed.ai/v1alpha1", "kind": "OpenMedModel", "name": "openmed-service", "namespace": "openmed"})
    );
    assert_eq!(result["field"]["path"], "spec.tier");
    assert_eq!(
        result["file"],
        json!({"path": "openmedmodel.yaml", "index": 0})
    );
    assert!(
        result["message"]
            .as_str()
            .unwrap()
            .contains("\"Huge\" is not one of")
    );
}

#[test]
fn a_krm_resource_without_its_deployment_gets_a_warning_not_a_patch() {
    let items: Vec<Value> = example_items()
        .into_iter()
        .filter(|i| i["kind"] != "Deployment")
        .collect();
    let out = run(
        env!("CARGO_BIN_EXE_openmed-op"),
        &["render", "--krm"],
        root(),
        &resource_list(&items),
    );
    assert_eq!(out.status.code(), Some(0));
    let list: Value = serde_yaml::from_str(&text(&out.stdout)).unwrap();
    let kinds: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "Namespace",
            "Service",
            "OpenMedModel",
            "ConfigMap",
            "ConfigMap"
        ]
    );
    assert_eq!(list["results"][0]["severity"], "warning");
}

#[test]
fn krm_input_that_is_not_a_resource_list_is_a_usage_error() {
    let out = run(
        env!("CARGO_BIN_EXE_openmed-op"),
        &["render", "--krm"],
        root(),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("ResourceList"));
}

#[test]
fn kpt_fn_eval_runs_the_function_on_a_package() {
    let package = example_package();
    let bin = tempfile::tempdir().unwrap();
    let function = krm_function(bin.path());
    let out = run(
        "kpt",
        &["fn", "eval", ".", "--exec", function.to_str().unwrap()],
        package.path(),
        "",
    );
    assert!(
        out.status.success(),
        "kpt fn eval failed:\n{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let deployment = std::fs::read_to_string(package.path().join("openmed-service.yaml")).unwrap();
    assert!(deployment.contains("openmed.ai/model-manifest-hash: sha256:c3431235760079558f503425f7527f3ce7afb855c2e78c7d14866dd6c9c87443"), "{deployment}");
    assert!(deployment.contains("configMapKeyRef"), "{deployment}");
    assert!(
        deployment.contains("# Your OpenMed REST image."),
        "kpt keeps comments: {deployment}"
    );
    let written = walk(package.path());
    let config_map = written
        .iter()
        .find(|p| {
            p.to_string_lossy()
                .contains("configmap_openmed-service-model-manifest")
        })
        .unwrap_or_else(|| panic!("no ConfigMap written: {written:?}"));
    assert!(
        std::fs::read_to_string(config_map)
            .unwrap()
            .contains("manifest.json")
    );
    // Running it again changes nothing.
    let before: Vec<String> = written
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    let again = run(
        "kpt",
        &["fn", "eval", ".", "--exec", function.to_str().unwrap()],
        package.path(),
        "",
    );
    assert!(again.status.success());
    let after: Vec<String> = walk(package.path())
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    assert_eq!(before, after);
}

#[test]
fn kpt_reports_findings_and_fails() {
    let package = example_package();
    let model = package.path().join("openmedmodel.yaml");
    let text_before = std::fs::read_to_string(&model)
        .unwrap()
        .replace("tier: Small", "tier: Huge");
    std::fs::write(&model, &text_before).unwrap();
    let bin = tempfile::tempdir().unwrap();
    let function = krm_function(bin.path());
    let out = run(
        "kpt",
        &["fn", "eval", ".", "--exec", function.to_str().unwrap()],
        package.path(),
        "",
    );
    assert!(!out.status.success());
    let report = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(
        report
            .contains("[error] openmed.ai/v1alpha1/OpenMedModel/openmed/openmed-service spec.tier"),
        "{report}"
    );
    assert_eq!(
        std::fs::read_to_string(&model).unwrap(),
        text_before,
        "the package is left as it was"
    );
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// The folder of the GitOps tools built from their Go modules.
fn gitops_tools() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = Command::new(root().join("tests/gitops/build"))
            .stderr(Stdio::inherit())
            .output()
            .unwrap();
        assert!(out.status.success(), "tests/gitops/build failed");
        PathBuf::from(text(&out.stdout).trim())
    })
}

#[test]
fn a_kustomize_exec_transformer_runs_the_function() {
    let package = example_package();
    let bin = tempfile::tempdir().unwrap();
    let function = krm_function(bin.path());
    std::fs::write(
        package.path().join("kustomization.yaml"),
        "resources:\n  - openmed-service.yaml\n  - openmedmodel.yaml\ntransformers:\n  - openmed-op.yaml\n",
    )
    .unwrap();
    std::fs::write(
        package.path().join("openmed-op.yaml"),
        format!(
            "apiVersion: openmed.ai/v1alpha1\nkind: RenderFunction\nmetadata:\n  name: openmed-op\n  annotations:\n    config.kubernetes.io/function: |\n      exec:\n        path: {}\n",
            function.display()
        ),
    )
    .unwrap();
    let kustomize = gitops_tools().join("kustomize");
    let out = run(
        &kustomize,
        &["build", "--enable-alpha-plugins", "--enable-exec", "."],
        package.path(),
        "",
    );
    assert!(
        out.status.success(),
        "kustomize build failed: {}",
        text(&out.stderr)
    );
    let built = docs(&text(&out.stdout));
    let deployment = built.iter().find(|d| d["kind"] == "Deployment").unwrap();
    assert_eq!(
        deployment["spec"]["template"]["metadata"]["annotations"]["openmed.ai/model-manifest-hash"],
        "sha256:c3431235760079558f503425f7527f3ce7afb855c2e78c7d14866dd6c9c87443"
    );
    assert!(
        built.iter().any(|d| d["kind"] == "ConfigMap"
            && d["metadata"]["name"] == "openmed-service-model-manifest")
    );
}

// ---- Argo CD ----

/// A JSON value as a Lua 5.1 table constructor.
fn lua(value: &Value) -> String {
    match value {
        Value::Null => "nil".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => {
            let mut out = String::from("\"");
            for c in s.chars() {
                match c {
                    '"' => out.push_str("\\\""),
                    '\\' => out.push_str("\\\\"),
                    '\n' => out.push_str("\\n"),
                    c => out.push(c),
                }
            }
            out.push('"');
            out
        }
        Value::Array(items) => format!(
            "{{{}}}",
            items.iter().map(lua).collect::<Vec<_>>().join(", ")
        ),
        Value::Object(map) => format!(
            "{{{}}}",
            map.iter()
                .map(|(k, v)| format!("[{}] = {}", lua(&json!(k)), lua(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Runs the health check on `obj` the way Argo CD does: `obj` is a global,
/// the script's return value is the health.
fn health(script: &str, obj: &Value) -> (String, String) {
    let program = format!(
        "obj = {}\nlocal function check()\n{script}\nend\nlocal hs = check()\nio.write(hs.status, \"\\n\", hs.message or \"\")\n",
        lua(obj)
    );
    let out = run("lua5.1", &["-"], root(), &program);
    assert!(out.status.success(), "lua5.1 failed: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let (status, message) = stdout.split_once('\n').unwrap();
    (status.to_owned(), message.to_owned())
}

#[test]
fn the_argo_cd_health_check_passes_its_fixtures_under_lua_5_1() {
    let dir = root().join("deploy/argocd/health/openmed.ai/OpenMedModel");
    let script = std::fs::read_to_string(dir.join("health.lua")).unwrap();
    let version = run("lua5.1", &["-v"], root(), "");
    assert!(text(&version.stdout).contains("Lua 5.1") || text(&version.stderr).contains("Lua 5.1"));
    let tests: Value =
        serde_yaml::from_str(&std::fs::read_to_string(dir.join("health_test.yaml")).unwrap())
            .unwrap();
    let tests = tests["tests"].as_array().unwrap();
    assert!(tests.len() >= 10, "every state has a fixture");
    let mut failures = Vec::new();
    for test in tests {
        let input = test["inputPath"].as_str().unwrap();
        let obj: Value =
            serde_yaml::from_str(&std::fs::read_to_string(dir.join(input)).unwrap()).unwrap();
        let (status, message) = health(&script, &obj);
        let want = &test["healthStatus"];
        if status != want["status"] || message != want["message"] {
            failures.push(format!(
                "{input}: got {status}: {message}\n  want {}: {}",
                want["status"], want["message"]
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let statuses: std::collections::BTreeSet<&str> = tests
        .iter()
        .map(|t| t["healthStatus"]["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        statuses.into_iter().collect::<Vec<_>>(),
        ["Degraded", "Healthy", "Progressing", "Suspended"]
    );
}

#[test]
fn the_argo_cd_component_adds_the_health_check_and_the_plugin_sidecar() {
    // A minimal stand-in for an Argo CD install, with our component added.
    // Components load by relative path: the stand-in lives in target/.
    let scratch = root().join("target");
    std::fs::create_dir_all(&scratch).unwrap();
    let dir = tempfile::tempdir_in(&scratch).unwrap();
    let base = dir.path();
    std::fs::write(
        base.join("argocd.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: argocd-cm\ndata:\n  url: https://argocd.example.org\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: argocd-repo-server\nspec:\n  selector: {matchLabels: {app: repo}}\n  template:\n    metadata: {labels: {app: repo}}\n    spec:\n      containers:\n      - name: argocd-repo-server\n        image: quay.io/argoproj/argocd\n      volumes:\n      - name: var-files\n        emptyDir: {}\n      - name: plugins\n        emptyDir: {}\n",
    )
    .unwrap();
    std::fs::write(
        base.join("kustomization.yaml"),
        "resources:\n  - argocd.yaml\ncomponents:\n  - ../../deploy/argocd\n",
    )
    .unwrap();
    let out = run(gitops_tools().join("kustomize"), &["build", "."], base, "");
    assert!(
        out.status.success(),
        "kustomize build failed: {}",
        text(&out.stderr)
    );
    let built = docs(&text(&out.stdout));
    let cm = built
        .iter()
        .find(|d| d["metadata"]["name"] == "argocd-cm")
        .unwrap();
    assert_eq!(
        cm["data"]["url"], "https://argocd.example.org",
        "merged, not replaced"
    );
    let lua = cm["data"]["resource.customizations.health.openmed.ai_OpenMedModel"]
        .as_str()
        .unwrap();
    assert_eq!(
        lua,
        std::fs::read_to_string(
            root().join("deploy/argocd/health/openmed.ai/OpenMedModel/health.lua")
        )
        .unwrap()
    );
    let repo = built
        .iter()
        .find(|d| d["metadata"]["name"] == "argocd-repo-server")
        .unwrap();
    let containers = repo["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    let sidecar = containers
        .iter()
        .find(|c| c["name"] == "openmed-op")
        .unwrap();
    assert_eq!(
        sidecar["command"],
        json!(["/var/run/argocd/argocd-cmp-server"])
    );
    assert!(
        containers.iter().any(|c| c["name"] == "argocd-repo-server"),
        "the repo server stays"
    );
    let plugin = built
        .iter()
        .find(|d| d["metadata"]["name"] == "openmed-op-cmp")
        .unwrap();
    let plugin: Value =
        serde_yaml::from_str(plugin["data"]["plugin.yaml"].as_str().unwrap()).unwrap();
    assert_eq!(plugin["kind"], "ConfigManagementPlugin");
}

#[test]
fn the_argo_cd_plugin_commands_discover_and_render_an_application() {
    let plugin: Value = serde_yaml::from_str(
        &std::fs::read_to_string(root().join("deploy/argocd/cmp/plugin.yaml")).unwrap(),
    )
    .unwrap();
    let package = example_package();
    let bin = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_openmed-op"),
        bin.path().join("openmed-op"),
    )
    .unwrap();
    let path = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap()
    );
    let sh = |command: &Value| {
        let args: Vec<&str> = command
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        Command::new(args[0])
            .args(&args[1..])
            .current_dir(package.path())
            .env("PATH", &path)
            .env("ARGOCD_APP_NAMESPACE", "openmed")
            .output()
            .unwrap()
    };
    let found = sh(&plugin["spec"]["discover"]["find"]["command"]);
    assert!(
        !text(&found.stdout).trim().is_empty(),
        "the application is discovered"
    );
    let generated = sh(&plugin["spec"]["generate"]["command"]);
    assert!(generated.status.success(), "{}", text(&generated.stderr));
    let rendered = run(
        env!("CARGO_BIN_EXE_openmed-op"),
        &["render", "examples/openmed/"],
        root(),
        "",
    );
    assert_eq!(
        text(&generated.stdout),
        text(&rendered.stdout),
        "generate is render"
    );
    let elsewhere = tempfile::tempdir().unwrap();
    std::fs::write(
        elsewhere.path().join("app.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
    )
    .unwrap();
    let args: Vec<String> = plugin["spec"]["discover"]["find"]["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    let other = Command::new(&args[0])
        .args(&args[1..])
        .current_dir(elsewhere.path())
        .output()
        .unwrap();
    assert!(
        text(&other.stdout).trim().is_empty(),
        "other applications are left to other tools"
    );
}

// ---- the CI recipe ----

#[test]
fn the_ci_render_diff_shows_what_a_version_bump_changes() {
    let repo = tempfile::tempdir().unwrap();
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .args(["-c", "user.email=ci@example.org", "-c", "user.name=ci"])
            .args(args)
            .current_dir(repo.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {}", text(&out.stderr));
    };
    git(&["init", "-q"]);
    for file in ["openmed-service.yaml", "openmedmodel.yaml"] {
        std::fs::copy(
            root().join("examples/openmed").join(file),
            repo.path().join(file),
        )
        .unwrap();
    }
    git(&["add", "."]);
    git(&["commit", "-qm", "v1"]);
    let model = repo.path().join("openmedmodel.yaml");
    std::fs::write(
        &model,
        std::fs::read_to_string(&model)
            .unwrap()
            .replace("synthetic-pii-v1", "synthetic-pii-v2"),
    )
    .unwrap();
    git(&["commit", "-qam", "v2"]);
    let bin = Path::new(env!("CARGO_BIN_EXE_openmed-op"))
        .parent()
        .unwrap()
        .to_owned();
    let out = Command::new(root().join("examples/ci/render-diff"))
        .args(["HEAD~1", "HEAD"])
        .current_dir(repo.path())
        .env(
            "PATH",
            format!("{}:{}", bin.display(), std::env::var("PATH").unwrap()),
        )
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "differences: {}",
        text(&out.stderr)
    );
    let diff = text(&out.stdout);
    let vectors = |name: &str| -> Value {
        serde_json::from_str(
            &std::fs::read_to_string(root().join("tests/vectors").join(name)).unwrap(),
        )
        .unwrap()
    };
    let (v1, v2) = (vectors("basic-v1.json"), vectors("basic-v2.json"));
    assert!(
        diff.contains(&format!(
            "-        openmed.ai/model-manifest-hash: {}",
            v1["manifestHash"].as_str().unwrap()
        )),
        "{diff}"
    );
    assert!(
        diff.contains(&format!(
            "+        openmed.ai/model-manifest-hash: {}",
            v2["manifestHash"].as_str().unwrap()
        )),
        "{diff}"
    );
    assert!(
        diff.contains("+  OPENMED_SERVICE_PRELOAD_MODELS: OpenMed/synthetic-pii-v2"),
        "{diff}"
    );
    let same = Command::new(root().join("examples/ci/render-diff"))
        .args(["HEAD", "HEAD"])
        .current_dir(repo.path())
        .env(
            "PATH",
            format!("{}:{}", bin.display(), std::env::var("PATH").unwrap()),
        )
        .output()
        .unwrap();
    assert_eq!(same.status.code(), Some(0));
}

#[test]
fn the_example_workflow_and_flux_kustomization_are_well_formed() {
    let workflow: Value = serde_yaml::from_str(
        &std::fs::read_to_string(root().join("examples/ci/openmed-op.yml")).unwrap(),
    )
    .unwrap();
    let steps = workflow["jobs"]["openmed-op"]["steps"].as_array().unwrap();
    let runs: Vec<&str> = steps.iter().filter_map(|s| s["run"].as_str()).collect();
    assert!(
        runs.iter()
            .any(|r| r.contains("openmed-op verify") && r.contains("--format github"))
    );
    assert!(runs.iter().any(|r| r.contains("examples/ci/render-diff")));
    // The Flux objects the end-to-end tests adapt (tests/e2e/flux.rs).
    let flux =
        docs(&std::fs::read_to_string(root().join("examples/flux/flux-system.yaml")).unwrap());
    let kustomization = flux
        .iter()
        .find(|d| d["kind"] == "Kustomization")
        .expect("a Flux Kustomization");
    assert_eq!(kustomization["spec"]["wait"], true);
    assert_eq!(kustomization["spec"]["prune"], true);
    assert_eq!(kustomization["spec"]["path"], "./models");
}

/// The Git route and the same route as the cluster holds it mid-canary,
/// after Argo CD's normalization with the Application's jqPathExpressions
/// (`del(expr)`, evaluated by gojq as Argo CD does): equal, so a canary
/// shows no diff; any other change still shows.
#[test]
fn argo_cd_ignores_the_canary_weights_and_nothing_else() {
    let app =
        docs(&std::fs::read_to_string(root().join("deploy/argocd/application.yaml")).unwrap());
    let ignore = app[0]["spec"]["ignoreDifferences"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["kind"] == "HTTPRoute")
        .expect("the Application ignores the canary weights")
        .clone();
    let expressions: Vec<&str> = ignore["jqPathExpressions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    let git = docs(&std::fs::read_to_string(root().join("examples/canary/service.yaml")).unwrap())
        .into_iter()
        .find(|d| d["kind"] == "HTTPRoute")
        .unwrap();
    assert_eq!(ignore["name"], git["metadata"]["name"]);
    let normalize = |route: &Value| -> Value {
        let mut program = String::from(".");
        for e in &expressions {
            program.push_str(&format!(" | del({e})"));
        }
        let out = run(
            gitops_tools().join("gojq"),
            &["-c", &program],
            root(),
            &serde_json::to_string(route).unwrap(),
        );
        assert!(out.status.success(), "gojq: {}", text(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let weights = |route: &mut Value, stable: i64, canary: i64| {
        let refs = &mut route["spec"]["rules"][0]["backendRefs"];
        refs[0]["weight"] = stable.into();
        refs[1]["weight"] = canary.into();
    };
    let mut mid_canary = git.clone();
    weights(&mut mid_canary, 50, 50);
    assert_eq!(
        normalize(&mid_canary),
        normalize(&git),
        "a canary shows no diff"
    );

    let mut rematched = mid_canary.clone();
    rematched["spec"]["rules"][0]["matches"] = serde_json::json!([{"path": {"value": "/v2"}}]);
    assert_ne!(normalize(&rematched), normalize(&git), "a new match shows");
    let mut renamed = git.clone();
    renamed["spec"]["rules"][0]["backendRefs"][1]["name"] = "someone-else".into();
    weights(&mut renamed, 100, 0);
    assert_ne!(
        normalize(&renamed),
        normalize(&git),
        "another backend shows"
    );
    let mut other_port = git.clone();
    other_port["spec"]["rules"][0]["backendRefs"][0]["port"] = 8081.into();
    assert_ne!(normalize(&other_port), normalize(&git), "a port shows");
}
