//! The operator under test as a process: started from a shell command in a
//! process group of its own, sampled from /proc while it runs, stopped by
//! its pid.
//!
//! Memory and CPU are summed over the process group, so an operator started
//! through a wrapper (a shell, `python -m ...`) is measured whole.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::report::Footprint;
use crate::{log, redact, root, round};

/// How often memory is sampled for the peak.
const SAMPLE_EVERY: Duration = Duration::from_millis(200);

/// A running operator.
pub struct Process {
    pid: i32,
    child: Mutex<Child>,
    started: Instant,
    log: String,
    stats: Arc<Mutex<Stats>>,
    stop_sampling: Arc<AtomicBool>,
    sampler: Option<std::thread::JoinHandle<()>>,
}

/// What the sampler and the phases recorded.
#[derive(Debug, Default)]
struct Stats {
    peak_rss_kib: u64,
    max_processes: usize,
    steady_rss_kib: Option<u64>,
    cpu_convergence_s: Option<f64>,
    cpu_quiet_s: Option<f64>,
    quiet_s: Option<f64>,
}

/// One reading of the process group.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sample {
    /// Resident memory of every process in the group, KiB.
    pub rss_kib: u64,
    /// The group leader's high-water mark (VmHWM), KiB.
    pub hwm_kib: u64,
    /// User and system CPU seconds of the group and its reaped children.
    pub cpu_s: f64,
    /// Processes in the group.
    pub processes: usize,
}

impl Process {
    /// Starts `command` with `sh -c` from the repository root, with
    /// `KUBECONFIG` set, output appended to `log_file`.
    pub fn start(command: &str, kubeconfig: &Path, log_file: &Path) -> Result<Self, String> {
        use std::os::unix::process::CommandExt;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log_file)
            .map_err(|e| format!("{}: {e}", redact(&log_file.display().to_string())))?;
        let stderr = file.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new("sh")
            .arg("-c")
            .arg(shell_command(command))
            .current_dir(root())
            .env("KUBECONFIG", kubeconfig)
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(stderr)
            .process_group(0)
            .spawn()
            .map_err(|e| format!("starting {command:?}: {e}"))?;
        let pid = child.id() as i32;
        let log_shown = redact(&log_file.display().to_string());
        log(format!(
            "operator started: pid {pid}, log {log_shown}: {}",
            redact(command)
        ));
        let stats = Arc::new(Mutex::new(Stats::default()));
        let stop_sampling = Arc::new(AtomicBool::new(false));
        let sampler = {
            let stats = stats.clone();
            let stop = stop_sampling.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let s = sample(pid);
                    {
                        let mut stats = stats.lock().expect("stats");
                        stats.peak_rss_kib = stats.peak_rss_kib.max(s.rss_kib).max(s.hwm_kib);
                        stats.max_processes = stats.max_processes.max(s.processes);
                    }
                    std::thread::sleep(SAMPLE_EVERY);
                }
            })
        };
        Ok(Process {
            pid,
            child: Mutex::new(child),
            started: Instant::now(),
            log: log_shown,
            stats,
            stop_sampling,
            sampler: Some(sampler),
        })
    }

    /// A fresh reading.
    pub fn sample(&self) -> Sample {
        sample(self.pid)
    }

    /// `Err` once the operator has exited: every wait gives up at once
    /// instead of running into its timeout.
    pub fn check_running(&self) -> Result<(), String> {
        let mut child = self.child.lock().expect("child");
        match child.try_wait() {
            Ok(Some(status)) => Err(format!(
                "the operator exited ({status}); see its log {}",
                self.log
            )),
            _ => Ok(()),
        }
    }

    /// Records the CPU seconds the convergence took.
    pub fn record_convergence(&self, cpu_s: f64) {
        self.stats.lock().expect("stats").cpu_convergence_s = Some(cpu_s);
    }

    /// Records the quiet window: its length, the CPU seconds in it and the
    /// memory at its end.
    pub fn record_quiet(&self, seconds: f64, cpu_s: f64, rss_kib: u64) {
        let mut stats = self.stats.lock().expect("stats");
        stats.quiet_s = Some(seconds);
        stats.cpu_quiet_s = Some(cpu_s);
        stats.steady_rss_kib = Some(rss_kib);
    }

    /// Memory and CPU so far.
    pub fn footprint(&self) -> Footprint {
        let now = self.sample();
        let stats = self.stats.lock().expect("stats");
        let mib = |kib: u64| round(kib as f64 / 1024.0);
        Footprint {
            peak_rss_mib: mib(stats.peak_rss_kib.max(now.rss_kib).max(now.hwm_kib)),
            steady_rss_mib: stats.steady_rss_kib.map(mib),
            cpu_convergence_s: stats.cpu_convergence_s.map(round),
            cpu_quiet_s: stats.cpu_quiet_s.map(round),
            cpu_quiet_percent: match (stats.cpu_quiet_s, stats.quiet_s) {
                (Some(cpu), Some(window)) if window > 0.0 => Some(round(100.0 * cpu / window)),
                _ => None,
            },
            cpu_total_s: round(now.cpu_s),
            uptime_s: round(self.started.elapsed().as_secs_f64()),
            processes: stats.max_processes.max(now.processes),
        }
    }

    /// SIGTERM to the group, then SIGKILL after 30 s; says how it ended.
    pub fn stop(mut self) -> String {
        let outcome = self.terminate();
        log(format!("operator stopped: {outcome}"));
        outcome
    }

    fn terminate(&mut self) -> String {
        self.stop_sampling.store(true, Ordering::Relaxed);
        if let Some(sampler) = self.sampler.take() {
            let _ = sampler.join();
        }
        let mut child = self.child.lock().expect("child");
        if let Ok(Some(status)) = child.try_wait() {
            signal_group(self.pid, libc::SIGKILL);
            return format!("had already exited ({status})");
        }
        let started = Instant::now();
        signal_group(self.pid, libc::SIGTERM);
        let outcome = loop {
            if let Ok(Some(status)) = child.try_wait() {
                break format!(
                    "{status} {:.2} s after SIGTERM",
                    started.elapsed().as_secs_f64()
                );
            }
            if started.elapsed() > Duration::from_secs(30) {
                signal_group(self.pid, libc::SIGKILL);
                let _ = child.wait();
                break "killed (SIGKILL) after 30 s without exiting on SIGTERM".to_owned();
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        // Anything the command left behind in its group.
        signal_group(self.pid, libc::SIGKILL);
        outcome
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.sampler.is_some() {
            // Not stopped in order (a panic or an interrupt): no grace.
            self.stop_sampling.store(true, Ordering::Relaxed);
            signal_group(self.pid, libc::SIGKILL);
            let _ = self.child.lock().map(|mut c| c.wait());
        }
    }
}

/// `exec` the command when it is a simple one, so the shell does not stay
/// in between.
fn shell_command(command: &str) -> String {
    if command.contains(['|', '&', ';', '(', ')', '\n', '<', '>', '`', '$']) {
        command.to_owned()
    } else {
        format!("exec {command}")
    }
}

fn signal_group(pgid: i32, signal: i32) {
    // SAFETY: kill(2) with a negative pid signals the process group that
    // this harness created (process_group(0) made the child its leader).
    unsafe {
        libc::kill(-pgid, signal);
    }
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

fn page_kib() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 { size as u64 / 1024 } else { 4 }
}

/// Reads every process of group `pgid` from /proc.
fn sample(pgid: i32) -> Sample {
    let mut out = Sample::default();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    let ticks = clock_ticks();
    let page = page_kib();
    let mut cpu_ticks = 0u64;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let field = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0)
        };
        if fields.get(2).and_then(|f| f.parse::<i32>().ok()) != Some(pgid) {
            continue;
        }
        out.processes += 1;
        // utime, stime, cutime, cstime (fields 14 to 17 of stat(5)).
        cpu_ticks += field(11) + field(12) + field(13) + field(14);
        // rss in pages (field 24).
        out.rss_kib += field(21) * page;
        if pid == pgid {
            out.hwm_kib = status_kib(pid, "VmHWM:");
        }
    }
    out.cpu_s = cpu_ticks as f64 / ticks;
    out
}

/// User and system CPU seconds of one process (not its children), or None
/// when it is gone.
pub fn cpu_seconds(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Some((field(11) + field(12)) as f64 / clock_ticks())
}

fn status_kib(pid: i32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}
