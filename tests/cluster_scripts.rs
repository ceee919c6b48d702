//! The process bookkeeping of `tests/cluster` (state.sh), without a cluster:
//! `up` and `down` must track exactly the processes they start, by pid,
//! however slowly those processes get going.
//!
//! A stand-in component is a copy of `tail -f` named like a component and
//! kept where the cache keeps built binaries, so `cluster_pid` accepts it.

use std::path::{Path, PathBuf};
use std::process::Command;

mod executables;

struct Sandbox {
    dir: tempfile::TempDir,
}

impl Sandbox {
    /// A cache with an `etcd` that is really `tail`, and a cluster folder.
    fn new() -> Sandbox {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("cache/openmed-op/cluster/test/bin");
        std::fs::create_dir_all(&bin).unwrap();
        let tail = which("tail");
        executables::install_executable(&tail, &bin.join("etcd"));
        for sub in ["cluster/pids", "cluster/logs"] {
            std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        }
        std::fs::write(dir.path().join("cluster/input"), "").unwrap();
        // Execs its arguments a second late, as a loaded machine may.
        let slow = dir.path().join("slow-exec");
        executables::write_executable(&slow, "#!/usr/bin/env bash\nsleep 1\nexec \"$@\"\n");
        Sandbox { dir }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Runs `script` with state.sh's helpers loaded and DIR set; returns
    /// (success, stdout, stderr).
    fn bash(&self, script: &str) -> (bool, String, String) {
        let cluster = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cluster");
        let prelude = format!(
            ". '{}/lib.sh' && . '{}/state.sh' && cluster_init_dir '{}'\n",
            cluster.display(),
            cluster.display(),
            self.path("cluster").display()
        );
        let out = Command::new("bash")
            .arg("-c")
            .arg(prelude + script)
            .env("XDG_CACHE_HOME", self.path("cache"))
            .output()
            .expect("bash runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn etcd(&self) -> String {
        self.path("cache/openmed-op/cluster/test/bin/etcd")
            .display()
            .to_string()
    }

    fn recorded_pid(&self) -> Option<i32> {
        std::fs::read_to_string(self.path("cluster/pids/etcd.pid"))
            .ok()
            .map(|s| s.trim().parse().unwrap())
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        // Never leave a stand-in behind, whatever the test did: every
        // process a test starts names a path in the sandbox.
        let _ = Command::new("pkill")
            .arg("-KILL")
            .arg("-f")
            .arg(self.dir.path())
            .status();
    }
}

fn which(tool: &str) -> PathBuf {
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{tool} is installed");
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

fn alive(pid: i32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"));
    // A zombie has exited; only its parent has not reaped it yet.
    stat.is_ok_and(|s| s.split_whitespace().nth(2) != Some("Z"))
}

#[test]
fn a_component_that_execs_late_is_tracked_from_launch() {
    let sandbox = Sandbox::new();
    let (ok, out, err) = sandbox.bash(&format!(
        "cluster_launch etcd '{}' '{}' -f '{}' && cluster_pid etcd",
        sandbox.path("slow-exec").display(),
        sandbox.etcd(),
        sandbox.path("cluster/input").display()
    ));
    assert!(ok, "launched and recognised at once; stderr:\n{err}");
    let pid: i32 = out.trim().parse().expect("cluster_pid prints the pid");
    assert_eq!(sandbox.recorded_pid(), Some(pid), "the pid file is kept");
    assert!(alive(pid));

    let (ok, _, err) = sandbox.bash("cluster_stop etcd");
    assert!(ok, "{err}");
    assert!(err.contains(&format!("stopping etcd (pid {pid})")), "{err}");
    assert!(!alive(pid), "stopped by its recorded pid");
    assert_eq!(sandbox.recorded_pid(), None, "and forgotten");
}

#[test]
fn a_component_that_exits_at_once_is_reported_not_running() {
    let sandbox = Sandbox::new();
    // tail on a missing file exits with an error straight away.
    let (ok, out, err) = sandbox.bash(&format!(
        "cluster_launch etcd '{}' -f '{}'; cluster_wait_for $((SECONDS + 30)) 'something' false etcd",
        sandbox.etcd(),
        sandbox.path("cluster/missing").display(),
    ));
    assert!(!ok, "the wait fails: stdout {out}");
    assert!(
        err.contains("error: etcd exited while waiting for something"),
        "{err}"
    );
    assert!(
        err.contains("cannot open"),
        "the component's own error is shown from its log:\n{err}"
    );
}

#[test]
fn stop_stops_what_up_started_and_nothing_else() {
    let sandbox = Sandbox::new();
    // Same binary name, same folder in its arguments, but not started by us.
    let mut stranger = Command::new(sandbox.etcd())
        .arg("-f")
        .arg(sandbox.path("cluster/input"))
        .spawn()
        .unwrap();
    let (ok, out, err) = sandbox.bash(&format!(
        "cluster_launch etcd '{}' -f '{}' && cluster_pid etcd && cluster_stop_all",
        sandbox.etcd(),
        sandbox.path("cluster/input").display()
    ));
    assert!(ok, "{err}");
    let ours: i32 = out.trim().parse().unwrap();
    assert!(!alive(ours), "the launched process is stopped");
    assert!(
        stranger.try_wait().unwrap().is_none(),
        "a process it did not start keeps running"
    );
    stranger.kill().unwrap();
    stranger.wait().unwrap();
}

/// `down` removes the network namespaces a killed kubelet left behind (its
/// process pods' and the node's), and the processes still inside them, but
/// no namespace of another cluster. Needs root, as process pods do.
#[test]
fn down_sweeps_the_network_namespaces_of_its_cluster_only() {
    let sandbox = Sandbox::new();
    // Ports no real cluster here uses: 1 and 2 are privileged.
    let ours = ["fk1-node", "fk1-7"];
    let theirs = "fk2-7";
    let ip = |args: &[&str]| {
        let out = Command::new("ip").args(args).output().expect("ip runs");
        assert!(
            out.status.success(),
            "ip {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    for ns in ours.iter().chain([&theirs]) {
        let _ = Command::new("ip").args(["netns", "del", ns]).output();
        ip(&["netns", "add", ns]);
    }
    let mut inside = Command::new("ip")
        .args(["netns", "exec", "fk1-7", "sh", "-c", "sleep 300"])
        .arg(sandbox.path("marker")) // its $0, for the sandbox's clean-up
        .spawn()
        .unwrap();
    let pid = inside.id() as i32;
    let start = std::time::Instant::now();
    while !String::from_utf8_lossy(
        &Command::new("ip")
            .args(["netns", "pids", "fk1-7"])
            .output()
            .unwrap()
            .stdout,
    )
    .split_whitespace()
    .any(|p| p == pid.to_string())
    {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "the process entered the namespace"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }

    let (ok, _, err) = sandbox.bash("APISERVER_PORT=1 cluster_sweep_netns");
    let status = inside.wait().unwrap();
    let left: Vec<String> = std::fs::read_dir("/run/netns")
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let _ = Command::new("ip").args(["netns", "del", theirs]).output();
    assert!(ok, "{err}");
    assert!(
        !status.success() && !alive(pid),
        "the process inside was killed"
    );
    for ns in ours {
        assert!(!left.iter().any(|n| n == ns), "{ns} is removed: {left:?}");
    }
    assert!(
        left.iter().any(|n| n == theirs),
        "another cluster's namespace stays: {left:?}"
    );
}

/// The test kubelet's own unit tests (the environment, `$(VAR)`
/// expansion, the crash back-off, the image map), in Go.
#[test]
fn the_test_kubelets_unit_tests_pass() {
    // The flags of tests/cluster/build (`-trimpath`, no DWARF, no cgo;
    // tests/cached-build.sh), so the Kubernetes packages it compiled come
    // from the Go build cache: with other flags a cold CI compiled them all
    // again, about 2.5 minutes.
    let out = Command::new("go")
        .args([
            "test",
            "-count=1",
            "-trimpath",
            "-gcflags=all=-dwarf=false",
            "./cmd/fake-kubelet",
        ])
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cluster"))
        .env("GOFLAGS", "-mod=readonly")
        .env("CGO_ENABLED", "0")
        .output()
        .expect("go runs");
    assert!(
        out.status.success(),
        "go test ./cmd/fake-kubelet:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
