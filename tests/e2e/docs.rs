//! The documents' shell blocks that need a cluster (marked
//! `<!-- run: cluster -->`), run on the control plane as the pages print
//! them, after the cluster has done what the page says it did: the model
//! `openmed-service`, Ready on v2, was bumped to a v3 that never warms and
//! rolled back, and the Prometheus Operator's CRDs are installed (for
//! operations.md's monitoring bundle). The blocks of each document run in
//! order, in a models repository whose `main` moved it from v2 to v3
//! (`tests/doc_blocks`) and the checkout's `deploy/` beside it, with `openmed-op`, kubectl and the plugin on PATH
//! and the model's namespace as the kubeconfig context's. The namespace
//! and version names are the test's own (so no other test's pods see them)
//! and are read back as the page's, `openmed` and
//! `OpenMed/synthetic-pii-vN`, before the output is compared.

use std::path::PathBuf;

use serde_json::json;

use crate::doc_blocks::{self, Marker, PullRequest, Shell};
use crate::env::*;
use crate::support::*;
use crate::trial;

/// The sandbox name the pages use for these blocks.
const SANDBOX: &str = "cluster";

pub fn trials() -> Vec<libtest_mimic::Trial> {
    vec![trial(
        "docs::the_blocks_that_need_a_cluster_do_what_the_pages_print",
        the_blocks_that_need_a_cluster_do_what_the_pages_print,
    )]
}

fn the_blocks_that_need_a_cluster_do_what_the_pages_print() {
    block_on(async {
        let env = Env::new("docs").await;
        let name = "openmed-service";
        let (v2, v3) = (
            env.version("synthetic-pii-v2"),
            env.version("synthetic-pii-v3"),
        );
        mark_unready(&env.client, &[&v3]).await;
        env.apply(&deployment_yaml(name, "openmed-service", "boot"))
            .await;
        env.apply(&model_yaml(
            name,
            &v2,
            "  rolloutStrategy:\n    progressDeadlineSeconds: 8\n",
        ))
        .await;
        env.wait_ready(name, &v2).await;
        env.set_spec(name, json!({"version": v3})).await;
        env.wait_rolled_back(name).await;

        // operations.md's `kubectl apply -k deploy/monitoring` is for a
        // cluster with the Prometheus Operator: its CRDs, from its module.
        let crds = built_tools("tests/monitoring-crds/build");
        let (ok, _, err) = kubectl(&["apply", "--server-side", "-f", crds.to_str().unwrap()]);
        assert!(ok, "the Prometheus Operator's CRDs: {err}");
        let (ok, _, err) = kubectl(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "-f",
            crds.to_str().unwrap(),
        ]);
        assert!(ok, "the Prometheus Operator's CRDs established: {err}");

        let ns = env.ns.name.clone();
        let (_tools, shell) = user_shell(&ns);
        let ran = run_page_blocks(SANDBOX, &shell, &ns, &|dir| {
            doc_blocks::verify_repository(dir, &ns, &|v| env.version(v), PullRequest::Notes);
            // operations.md applies the checkout's bundles by their paths.
            std::os::unix::fs::symlink(root().join("deploy"), dir.join("deploy")).unwrap();
        });
        assert!(ran > 0, "no block is marked <!-- run: {SANDBOX} -->");
        env.finish().await;
    });
}

/// kubectl as a user has it: `kubectl openmed` installed, `namespace` the
/// context's; with `openmed-op` on PATH. The folder holds the plugin and
/// the kubeconfig, and goes when dropped.
pub fn user_shell(namespace: &str) -> (tempfile::TempDir, Shell) {
    let tools = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(binary(), tools.path().join("kubectl-openmed")).unwrap();
    let config = tools.path().join("kubeconfig");
    std::fs::copy(kubeconfig(), &config).unwrap();
    let set = std::process::Command::new(kubectl_binary())
        .args([
            "config",
            "set-context",
            "--current",
            "--namespace",
            namespace,
        ])
        .env("KUBECONFIG", &config)
        .output()
        .unwrap();
    assert!(
        set.status.success(),
        "kubectl config set-context: {}",
        String::from_utf8_lossy(&set.stderr)
    );
    let shell = Shell {
        path: vec![
            tools.path().to_path_buf(),
            PathBuf::from(binary()).parent().unwrap().to_path_buf(),
            kubectl_binary().parent().unwrap().to_path_buf(),
        ],
        kubeconfig: Some(config),
    };
    (tools, shell)
}

/// Runs the blocks marked `<!-- run: SANDBOX -->` of every page, in order,
/// each page's in a folder `prepare` fills; compares transcripts with the
/// test's namespace `namespace` and its `-<namespace>` version suffix read
/// as the page's `openmed`. Panics with every difference; returns how many
/// blocks ran.
pub fn run_page_blocks(
    sandbox: &str,
    shell: &Shell,
    namespace: &str,
    prepare: &dyn Fn(&std::path::Path),
) -> usize {
    let local = |text: &str| {
        text.replace(&format!("-{namespace}"), "")
            .replace(namespace, "openmed")
    };
    let mut ran = 0;
    let mut failures = Vec::new();
    for doc in doc_blocks::documents() {
        let blocks: Vec<_> = doc_blocks::blocks(&doc)
            .into_iter()
            .filter(|b| b.marker == Marker::Run(sandbox.to_owned()))
            .collect();
        if blocks.is_empty() {
            continue;
        }
        let dir = tempfile::tempdir().unwrap();
        prepare(dir.path());
        for block in blocks {
            ran += 1;
            let failed = if block.lang == "console" {
                shell.transcript(dir.path(), &block, &local)
            } else {
                shell.script(dir.path(), &block)
            };
            if let Some(failed) = failed {
                failures.push(format!("{}:\n{failed}", block.at()));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    ran
}
