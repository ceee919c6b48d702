//! One scenario run's set-up: a namespace, the proxy, an operator that
//! talks to the API server only through it, and the invariant watcher.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use openmed_op::api::OpenMedModelStatus;

use crate::env::Env;
use crate::invariants::Invariants;
use crate::proxy::{Hook, Match, Proxy};
use crate::support::*;

/// How long a scenario waits for the operator to converge after a fault.
pub const CONVERGE: Duration = Duration::from_secs(120);

/// The same, where not converging is an expected breakage.
const TOLERATED_CONVERGE: Duration = Duration::from_secs(30);

pub struct Stage {
    pub env: Env,
    pub proxy: Proxy,
    pub invariants: Invariants,
    /// The kubeconfig through the proxy.
    pub kubeconfig: PathBuf,
    /// The current operator process, for hooks that kill it.
    pid: Arc<AtomicU32>,
    args: Vec<String>,
    vars: Vec<(String, String)>,
    pub rng: fastrand::Rng,
    /// Restarts after a kill.
    pub restarts: u32,
    /// How long a change may take to converge.
    pub converge_within: Duration,
}

impl Stage {
    /// A namespace `prefix-…`, the proxy, the invariant watcher, and an
    /// operator (with `args`) through the proxy.
    pub async fn new(prefix: &str, seed: u64, args: &[&str]) -> Stage {
        Self::with_env(prefix, seed, args, &[]).await
    }

    /// [`Stage::new`], the operator with extra environment variables.
    pub async fn with_env(prefix: &str, seed: u64, args: &[&str], vars: &[(&str, &str)]) -> Stage {
        let client = admin().await;
        install_crd(&client).await;
        let ns = TestNamespace::create(&client, prefix).await;
        let pki = cluster_dir().join("pki");
        let proxy = Proxy::start(
            client.clone(),
            &pki.join("apiserver.crt"),
            &pki.join("apiserver.key"),
            seed,
        )
        .await;
        let kubeconfig = cluster_dir().join(format!("chaos-{}.kubeconfig", ns.name));
        proxy.kubeconfig(&operator_kubeconfig(), &kubeconfig);
        let invariants = Invariants::start(&client, &ns.name);
        let args: Vec<String> = args.iter().map(|a| a.replace("{ns}", &ns.name)).collect();
        let operator = Operator::start_with_env(
            &kubeconfig,
            &ns.name,
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
            vars,
        );
        let pid = Arc::new(AtomicU32::new(operator.pid()));
        Stage {
            env: Env::of(client, ns, operator),
            proxy,
            invariants,
            kubeconfig,
            pid,
            args,
            vars: vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            rng: fastrand::Rng::with_seed(seed),
            restarts: 0,
            converge_within: CONVERGE,
        }
    }

    /// The namespace's name.
    pub fn namespace(&self) -> String {
        self.env.ns.name.clone()
    }

    /// Every write of the operator in this namespace.
    pub fn writes(&self) -> Match {
        Match {
            namespace: Some(self.namespace()),
            writes: true,
            ..Match::default()
        }
    }

    /// A hook that SIGKILLs the operator, as a crash would.
    pub fn kill_hook(&self) -> Hook {
        let pid = self.pid.clone();
        Arc::new(move |_| {
            let pid = pid.load(Ordering::SeqCst) as i32;
            // SAFETY: kill(2) on a child process id we started.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        })
    }

    /// Restarts the operator if it has died; returns whether it had.
    pub fn revive(&mut self) -> bool {
        if !self.env.operator.exited() {
            return false;
        }
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        let vars: Vec<(&str, &str)> = self
            .vars
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        self.env.operator =
            Operator::start_with_env(&self.kubeconfig, &self.env.ns.name, &args, &vars);
        self.pid.store(self.env.operator.pid(), Ordering::SeqCst);
        self.restarts += 1;
        true
    }

    /// Makes `version` one that never gets ready (the fake kubelet's list),
    /// and tells the invariant watcher so: it may never be retained.
    pub async fn never_ready(&self, version: &str) {
        mark_unready(&self.env.client, &[version]).await;
        self.invariants
            .expect
            .unready
            .lock()
            .unwrap()
            .insert(version.to_owned());
    }

    /// Waits until `ok` holds of `name`'s status, restarting the operator
    /// whenever it dies (a hook killed it); returns the status and how long
    /// it took.
    pub async fn converge(
        &mut self,
        name: &str,
        what: &str,
        mut ok: impl FnMut(&OpenMedModelStatus) -> bool,
    ) -> (OpenMedModelStatus, Duration) {
        let started = Instant::now();
        // Where a scenario breaks promises on purpose (two writers without
        // leader election), not converging is one of the things it shows.
        let tolerated = self.invariants.expect.tolerate.load(Ordering::SeqCst);
        loop {
            self.revive();
            let status = self.env.status(name).await;
            if ok(&status) {
                return (status, started.elapsed());
            }
            if tolerated && started.elapsed() > TOLERATED_CONVERGE {
                self.invariants.report(format!(
                    "{what}: not converged within {TOLERATED_CONVERGE:?}"
                ));
                return (status, started.elapsed());
            }
            if started.elapsed() > self.converge_within {
                panic!(
                    "{what}: not converged within {:?} ({}/{name}; operator log {}); last status: {status:#?}",
                    self.converge_within,
                    self.env.ns.name,
                    self.env.operator.log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until `check` (given an admin client) holds, restarting the
    /// operator whenever it dies; returns how long it took.
    pub async fn until<F, Fut>(&mut self, what: &str, mut check: F) -> Duration
    where
        F: FnMut(kube::Client) -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let started = Instant::now();
        loop {
            self.revive();
            if check(self.env.client.clone()).await {
                return started.elapsed();
            }
            if started.elapsed() > CONVERGE {
                panic!(
                    "{what}: not within {CONVERGE:?} ({}; operator log {})",
                    self.env.ns.name,
                    self.env.operator.log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops everything; returns the violations seen.
    pub async fn finish(self) -> Vec<String> {
        let violations = self.invariants.violations();
        let Stage {
            env, kubeconfig, ..
        } = self;
        env.finish().await;
        let _ = std::fs::remove_file(kubeconfig);
        violations
    }
}
