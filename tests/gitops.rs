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
fn the_argo_cd_plugin_is_opt_in_and_generates_what_render_writes() {
    let plugin: Value = serde_yaml::from_str(
        &std::fs::read_to_string(root().join("deploy/argocd/cmp/plugin.yaml")).unwrap(),
    )
    .unwrap();
    // No discovery rule: Argo CD uses the plugin only for an Application
    // that names it (openmed-op-v1), never for one whose Deployment the
    // operator writes.
    assert!(
        plugin["spec"].get("discover").is_none(),
        "the plugin claims no application by itself"
    );
    assert_eq!(
        format!(
            "{}-{}",
            plugin["metadata"]["name"].as_str().unwrap(),
            plugin["spec"]["version"].as_str().unwrap()
        ),
        "openmed-op-v1",
        "the name docs/gitops.md tells an Application to use"
    );
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
    let args: Vec<&str> = plugin["spec"]["generate"]["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let generated = Command::new(args[0])
        .args(&args[1..])
        .current_dir(package.path())
        .env("PATH", &path)
        .env("ARGOCD_APP_NAMESPACE", "openmed")
        .output()
        .unwrap();
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
}

// ---- the CI recipe ----

/// A models repository as a user has it: `examples/openmed` under
/// `models/` and the CI example under `.github/workflows/`, on `main` in
/// a repository cloned from an `origin`, with a pull request's branch.
struct ModelsRepo {
    dir: tempfile::TempDir,
}

impl ModelsRepo {
    fn new() -> ModelsRepo {
        let dir = tempfile::tempdir().unwrap();
        let origin = dir.path().join("origin");
        std::fs::create_dir_all(origin.join("models")).unwrap();
        std::fs::create_dir_all(origin.join(".github/workflows")).unwrap();
        for file in ["openmed-service.yaml", "openmedmodel.yaml"] {
            std::fs::copy(
                root().join("examples/openmed").join(file),
                origin.join("models").join(file),
            )
            .unwrap();
        }
        std::fs::copy(
            root().join("examples/ci/openmed-op.yml"),
            origin.join(".github/workflows/openmed-op.yml"),
        )
        .unwrap();
        let repo = ModelsRepo { dir };
        repo.git(&origin, &["init", "-q", "-b", "main"]);
        repo.git(&origin, &["add", "."]);
        repo.git(&origin, &["commit", "-qm", "the models"]);
        repo.git(repo.dir.path(), &["clone", "-q", "origin", "work"]);
        repo
    }

    fn work(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    fn git(&self, dir: &Path, args: &[&str]) {
        let out = Command::new("git")
            .args(["-c", "user.email=ci@example.org", "-c", "user.name=ci"])
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {}", text(&out.stderr));
    }

    /// A pull request's branch: `edit` applied to `models/openmedmodel.yaml`.
    fn pull_request(&self, branch: &str, edit: impl Fn(&str) -> String) {
        let work = self.work();
        self.git(&work, &["checkout", "-q", "-B", branch, "origin/main"]);
        let model = work.join("models/openmedmodel.yaml");
        let edited = edit(&std::fs::read_to_string(&model).unwrap());
        std::fs::write(&model, edited).unwrap();
        self.git(&work, &["commit", "-qam", branch]);
    }
}

/// What one run of the workflow did.
struct WorkflowRun {
    /// Each `run:` step's name, exit status and output.
    steps: Vec<(String, i32, String)>,
    /// The body of each `gh pr comment`, with its arguments.
    comments: Vec<(String, String)>,
}

/// Runs the `run:` steps of `examples/ci/openmed-op.yml` as GitHub Actions
/// runs them (`bash -e`, the workflow's and the step's `env`, one shared
/// work tree), in order, for pull request 7 into `main`. The `uses:` steps
/// are the checkout (the work tree is already the pull request's) and the
/// cache, whose hit this run stands for: openmed-op is on PATH (the binary
/// under test), so the install step only checks it. `gh` is a stand-in
/// that records the comment it would post. `if: always()` steps run after
/// a failure, the others stop.
fn run_workflow(repo: &ModelsRepo) -> WorkflowRun {
    let workflow: Value = serde_yaml::from_str(
        &std::fs::read_to_string(root().join("examples/ci/openmed-op.yml")).unwrap(),
    )
    .unwrap();
    let shims = repo.dir.path().join("bin");
    std::fs::create_dir_all(&shims).unwrap();
    let comments = repo.dir.path().join("comments");
    std::fs::create_dir_all(&comments).unwrap();
    let gh = shims.join("gh");
    std::fs::write(
        &gh,
        format!(
            "#!/usr/bin/env bash\nset -eu\n[ \"$1 $2\" = \"pr comment\" ] && [ \"$4\" = --body-file ] && [ \"$GH_TOKEN\" = test-token ] || {{ echo \"gh stand-in: unexpected $*\" >&2; exit 2; }}\nn=$(ls {dir} | wc -l)\nprintf '%s\\n' \"$*\" > {dir}/$n.args\ncp \"$5\" {dir}/$n.body\n",
            dir = comments.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&gh, std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_openmed-op"))
        .parent()
        .unwrap();
    let path = format!(
        "{}:{}:{}",
        shims.display(),
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let expression = |value: &str| {
        value
            .replace("${{ github.token }}", "test-token")
            .replace("${{ github.event.pull_request.number }}", "7")
    };
    let mut env: Vec<(String, String)> = Vec::new();
    if let Some(vars) = workflow["env"].as_object() {
        for (k, v) in vars {
            env.push((k.clone(), expression(v.as_str().unwrap())));
        }
    }
    let mut steps = Vec::new();
    let mut failed = false;
    for step in workflow["jobs"]["openmed-op"]["steps"].as_array().unwrap() {
        let Some(script) = step["run"].as_str() else {
            continue;
        };
        if failed && step["if"].as_str() != Some("always()") {
            continue;
        }
        let mut command = Command::new("bash");
        command
            .args(["--noprofile", "--norc", "-e", "-c", script])
            .current_dir(repo.work())
            .env("PATH", &path)
            .env("GITHUB_BASE_REF", "main")
            .envs(env.iter().map(|(k, v)| (k, v)));
        if let Some(vars) = step["env"].as_object() {
            for (k, v) in vars {
                command.env(k, expression(v.as_str().unwrap()));
            }
        }
        let out = command.output().unwrap();
        let status = out.status.code().unwrap_or(-1);
        failed |= status != 0;
        steps.push((
            step["name"].as_str().unwrap_or_default().to_owned(),
            status,
            format!("{}{}", text(&out.stdout), text(&out.stderr)),
        ));
    }
    let mut posted: Vec<_> = std::fs::read_dir(&comments)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "body"))
        .collect();
    posted.sort();
    let comments = posted
        .iter()
        .map(|body| {
            (
                std::fs::read_to_string(body.with_extension("args")).unwrap(),
                std::fs::read_to_string(body).unwrap(),
            )
        })
        .collect();
    WorkflowRun { steps, comments }
}

/// The block of docs/gitops.md that shows the example's comment.
fn documented_comment() -> String {
    let doc = std::fs::read_to_string(root().join("docs/gitops.md")).unwrap();
    let section = &doc[doc.find("## The pull-request check").unwrap()..];
    let start = section
        .find("````markdown\n")
        .expect("a ````markdown block")
        + "````markdown\n".len();
    let end = start + section[start..].find("\n````").unwrap();
    section[start..end].to_owned() + "\n"
}

#[test]
fn the_ci_example_runs_as_written_and_comments_what_a_bump_does() {
    let repo = ModelsRepo::new();
    repo.pull_request("bump", |t| {
        t.replace("synthetic-pii-v1", "synthetic-pii-v2")
    });
    let run = run_workflow(&repo);
    let names: Vec<&str> = run.steps.iter().map(|(n, _, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["Install openmed-op", "Verify", "What the change does"],
        "{:#?}",
        run.steps
    );
    for (name, status, output) in &run.steps {
        assert_eq!(*status, 0, "{name}: {output}");
    }
    assert_eq!(run.comments.len(), 1, "one comment: {:#?}", run.steps);
    let (args, body) = &run.comments[0];
    assert_eq!(args, "pr comment 7 --body-file comment.md\n");
    assert_eq!(
        *body,
        documented_comment(),
        "docs/gitops.md shows the comment the example posts for this bump"
    );
}

#[test]
fn the_ci_example_fails_a_rollback_to_a_version_never_retained_and_stays_quiet_on_no_change() {
    let repo = ModelsRepo::new();
    repo.pull_request("rollback", |t| {
        t.replace(
            "metadata:\n",
            "metadata:\n  annotations:\n    openmed.ai/rollback-to: OpenMed/synthetic-pii-v0\n",
        )
    });
    let run = run_workflow(&repo);
    let verify = run.steps.iter().find(|(n, _, _)| n == "Verify").unwrap();
    assert_eq!(verify.1, 1, "{}", verify.2);
    assert!(
        verify.2.contains("::error ") && verify.2.contains("RollbackNotRetained"),
        "an annotation on the diff: {}",
        verify.2
    );
    assert!(
        run.steps
            .iter()
            .any(|(n, s, _)| n == "What the change does" && *s == 0),
        "the render step runs after a failure (if: always()): {:#?}",
        run.steps
    );

    let quiet = ModelsRepo::new();
    quiet.pull_request("comment-only", |t| format!("# reviewed\n{t}"));
    let run = run_workflow(&quiet);
    assert!(
        run.steps.iter().all(|(_, s, _)| *s == 0),
        "{:#?}",
        run.steps
    );
    assert!(run.comments.is_empty(), "nothing changed, nothing posted");
}

#[test]
fn the_flux_example_is_well_formed() {
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
