//! The stack holds no fixed port of this machine: every process
//! `tests/workload/up` started (the control plane, Envoy Gateway,
//! Prometheus) listens, in this machine's network namespace, on loopback
//! only and on the ports chosen at start (`DIR/ports`,
//! `DIR/workload-ports`); Envoy Gateway, whose ports are fixed, listens in
//! the network namespace of the stack's node. So a second stack, or
//! anything else on the machine, never meets "address already in use".

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;

use libtest_mimic::Trial;

use crate::support::{cluster_dir, trial};

pub fn trials() -> Vec<Trial> {
    vec![trial(
        "ports::the_stack_listens_on_loopback_ports_chosen_at_start_only",
        the_stack_listens_on_loopback_ports_chosen_at_start_only,
    )]
}

fn the_stack_listens_on_loopback_ports_chosen_at_start_only() {
    let dir = cluster_dir();
    let chosen: BTreeSet<u16> = ["ports", "workload-ports"]
        .iter()
        .flat_map(|f| chosen_ports(&dir.join(f)))
        .collect();
    let ours = std::fs::read_link("/proc/self/ns/net").expect("our network namespace");
    let mut seen = Vec::new();
    let mut wrong = Vec::new();
    for entry in std::fs::read_dir(dir.join("pids")).expect("DIR/pids") {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("pid") {
            continue;
        }
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let pid: u32 = std::fs::read_to_string(&path)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let Ok(netns) = std::fs::read_link(format!("/proc/{pid}/ns/net")) else {
            panic!("{name} (pid {pid}) is not running");
        };
        if netns != ours {
            seen.push((name, None));
            continue;
        }
        let sockets = socket_inodes(pid);
        let listening: Vec<(IpAddr, u16)> = listeners(pid)
            .into_iter()
            .filter(|(_, _, inode)| sockets.contains(inode))
            .map(|(ip, port, _)| (ip, port))
            .collect();
        for (ip, port) in &listening {
            if !ip.to_canonical().is_loopback() || !chosen.contains(port) {
                wrong.push(format!("{name} listens on {ip}:{port}"));
            }
        }
        seen.push((name, Some(listening)));
    }
    eprintln!("ports chosen at start: {chosen:?}");
    for (name, listening) in &seen {
        match listening {
            None => eprintln!("{name}: in a network namespace of its own"),
            Some(l) => eprintln!("{name}: listens on {l:?}"),
        }
    }
    let gateway = seen.iter().find(|(n, _)| n == "envoy-gateway");
    assert!(
        matches!(gateway, Some((_, None))),
        "Envoy Gateway's fixed ports are not in a network namespace of their own: {gateway:?}"
    );
    assert!(
        seen.iter()
            .any(|(n, l)| n == "kube-apiserver" && l.as_ref().is_some_and(|l| !l.is_empty())),
        "the API server was found listening: {seen:?}"
    );
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// The values of `KEY=port` lines.
fn chosen_ports(path: &Path) -> Vec<u16> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter_map(|l| l.split_once('=')?.1.trim().parse().ok())
        .collect()
}

/// The inodes of the sockets a process holds open.
fn socket_inodes(pid: u32) -> BTreeSet<u64> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return BTreeSet::new();
    };
    fds.flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy().into_owned();
            target
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect()
}

/// The TCP sockets listening in a process's network namespace: address,
/// port and inode, from `/proc/PID/net/tcp` and `tcp6`.
fn listeners(pid: u32) -> Vec<(IpAddr, u16, u64)> {
    let mut found = Vec::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // sl local_address rem_address st ... inode (the tenth field).
            if fields.len() < 10 || fields[3] != "0A" {
                continue;
            }
            let (addr, port) = fields[1].split_once(':').unwrap();
            let port = u16::from_str_radix(port, 16).unwrap();
            let inode = fields[9].parse().unwrap();
            found.push((kernel_address(addr), port, inode));
        }
    }
    found
}

/// An address as the kernel prints it: 32-bit words in host byte order.
fn kernel_address(hex: &str) -> IpAddr {
    let words: Vec<u32> = (0..hex.len() / 8)
        .map(|i| u32::from_str_radix(&hex[i * 8..i * 8 + 8], 16).unwrap())
        .collect();
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    match bytes.len() {
        4 => IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3])),
        _ => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(bytes).unwrap())),
    }
}
