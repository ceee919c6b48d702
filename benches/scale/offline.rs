//! The offline commands at size, end to end as users run them (process
//! start, reading, work, output): `openmed-op render` over generated
//! OpenMedModels with their Deployments, and `openmed-op verify` over the
//! generated Git repository of the verify benchmark. Peak memory is the
//! process's own maximum resident set, from wait4(2).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::gitops_repo::Builder;
use crate::report::{Offline, OfflineRun};
use crate::{binary, log, round};

/// Runs of each command; the median is reported.
const RUNS: usize = 3;

pub fn run(render_models: usize, verify_files: usize, verify_commits: usize) -> Offline {
    let mut errors = Vec::new();
    let mut keep = |result: Result<OfflineRun, String>, what: &str| match result {
        Ok(run) => Some(run),
        Err(e) => {
            log(format!("{what}: {e}"));
            errors.push(format!("{what}: {e}"));
            None
        }
    };
    let render = keep(render(render_models), "render");
    let verify = keep(verify(verify_files, verify_commits), "verify");
    Offline {
        render,
        verify,
        errors,
    }
}

fn render(models: usize) -> Result<OfflineRun, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let input = dir.path().join("models");
    let mut bytes = 0u64;
    for i in 0..models {
        let folder = input.join(format!("team-{:02}", i % 100));
        std::fs::create_dir_all(&folder).map_err(|e| e.to_string())?;
        let text = manifest(i);
        bytes += text.len() as u64;
        std::fs::write(folder.join(format!("svc-{i:05}.yaml")), text).map_err(|e| e.to_string())?;
    }
    log(format!(
        "render: {models} OpenMedModels with their Deployments, {:.1} MiB of YAML",
        bytes as f64 / 1048576.0
    ));
    let output = dir.path().join("rendered.yaml");
    let mut runs = Vec::new();
    for _ in 0..RUNS {
        let out = std::fs::File::create(&output).map_err(|e| e.to_string())?;
        let mut command = Command::new(binary());
        command
            .arg("render")
            .arg(&input)
            .stdout(out)
            .stderr(Stdio::piped());
        let measured = measure(&mut command)?;
        if measured.code != Some(0) {
            return Err(format!("render exited with {:?}", measured.code));
        }
        runs.push(measured);
    }
    let output_bytes = std::fs::metadata(&output).map_or(0, |m| m.len());
    let result = summarize(
        format!(
            "render {models} OpenMedModels (+ their Deployments, {} files)",
            models
        ),
        models,
        &runs,
        Some(output_bytes),
    );
    log(format!(
        "render: median {} s, {} models/s, peak RSS {} MiB",
        result.median_s, result.items_per_s, result.peak_rss_mib
    ));
    Ok(result)
}

fn verify(files: usize, commits: usize) -> Result<OfflineRun, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let started = Instant::now();
    let repo = git2::Repository::init_bare(dir.path()).map_err(|e| e.to_string())?;
    Builder::new(repo).build(files, commits);
    log(format!(
        "verify: repository of {files} files and {commits} commits built in {:.1} s",
        started.elapsed().as_secs_f64()
    ));
    let mut runs = Vec::new();
    for _ in 0..RUNS {
        let mut command = Command::new(binary());
        command
            .args(["verify", "--rev", "pr", "--repo"])
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let measured = measure(&mut command)?;
        // 1 is "findings"; anything else is a failure to run.
        if !matches!(measured.code, Some(0) | Some(1)) {
            return Err(format!("verify exited with {:?}", measured.code));
        }
        runs.push(measured);
    }
    let result = summarize(
        format!("verify --rev pr: {files} OpenMedModel files, {commits} commits"),
        files,
        &runs,
        None,
    );
    log(format!(
        "verify: median {} s, peak RSS {} MiB",
        result.median_s, result.peak_rss_mib
    ));
    Ok(result)
}

struct Measured {
    elapsed: Duration,
    max_rss_kib: u64,
    code: Option<i32>,
}

/// Runs `command` to its end; its wall time and its own peak memory.
fn measure(command: &mut Command) -> Result<Measured, String> {
    let started = Instant::now();
    let child = command.spawn().map_err(|e| e.to_string())?;
    let pid = child.id() as libc::pid_t;
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain data; wait4 fills it for the child we just
    // spawned, which nothing else waits for.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let elapsed = started.elapsed();
    if waited != pid {
        return Err(format!("wait4: {}", std::io::Error::last_os_error()));
    }
    // The child is reaped; std must not wait for it again.
    std::mem::forget(child);
    let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
    Ok(Measured {
        elapsed,
        // ru_maxrss is in KiB on Linux.
        max_rss_kib: usage.ru_maxrss.max(0) as u64,
        code,
    })
}

fn summarize(
    what: String,
    items: usize,
    runs: &[Measured],
    output_bytes: Option<u64>,
) -> OfflineRun {
    let mut times: Vec<f64> = runs.iter().map(|r| r.elapsed.as_secs_f64()).collect();
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    let peak = runs.iter().map(|r| r.max_rss_kib).max().unwrap_or(0);
    OfflineRun {
        what,
        runs: runs.len(),
        min_s: round(times[0]),
        median_s: round(median),
        max_s: round(times[times.len() - 1]),
        items_per_s: round(items as f64 / median),
        peak_rss_mib: round(peak as f64 / 1024.0),
        output_bytes,
    }
}

/// One OpenMedModel beside its target Deployment, as in a GitOps repository.
fn manifest(i: usize) -> String {
    format!(
        "apiVersion: openmed.ai/v1alpha1
kind: OpenMedModel
metadata:
  name: svc-{i:05}
  namespace: team-{ns:02}
spec:
  family: pii
  tier: Small
  version: OpenMed/pii-r{v}
  replicas: 2
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: svc-{i:05}
  namespace: team-{ns:02}
spec:
  replicas: 2
  selector:
    matchLabels: {{app: svc-{i:05}}}
  template:
    metadata:
      labels: {{app: svc-{i:05}}}
    spec:
      containers:
      - name: openmed-service
        image: openmed/openmed-service:1.0.0
        env:
        - name: OPENMED_SERVICE_PRELOAD_MODELS
          value: boot
",
        ns = i % 100,
        v = i % 7
    )
}
