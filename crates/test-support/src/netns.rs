//! A small network of Linux network namespaces for partition tests: every process of a
//! scenario (a nats-server node, a broker, the listener) runs in a namespace of its own
//! ([`Host`]), joined to a bridge in a hub namespace by a veth pair; the test process itself
//! reaches the bridge through one more veth pair whose end stays in the root namespace (its
//! label is [`ROOT`]). All hosts share one /24 (`10.213.<n>.0/24`, the root end `.1`).
//!
//! A partition moves the hub ends of the cut-off side's veths from the bridge `main` to a
//! second bridge `cut` ([`Network::cut_off`]): the two sides cannot exchange a packet, and
//! nothing tells anyone — links stay up, no connection is reset, packets are dropped as by a
//! real partition (a black hole). Hosts on the same side still reach each other. Healing
//! moves them back ([`Network::heal`]); TCP retransmits what was in flight.
//!
//! This needs root and the `ip` command (iproute2) with kernel support for network
//! namespaces, veth and bridges; [`Network::create`] checks and fails saying how to install
//! what is missing. (`tc`'s netem, `iptables` and nftables are not needed: the kernel this
//! suite first ran on has none of them.)
//!
//! Clean-up: every namespace of a network is named `mtf-<pid>-<seq>-<label>` and deleted
//! when the [`Network`] drops (deleting the hub deletes the veth pairs and the root end).
//! Namespaces left by a crashed run (their pid no longer runs) are deleted by the next
//! [`Network::create`]; two networks of one process or of two processes never share a name.

use crate::process::ProcessSpec;
use std::ffi::OsString;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// The label of the root namespace's end (the test process's side).
pub const ROOT: &str = "root";

/// The prefix of every namespace this module creates.
const PREFIX: &str = "mtf-";

/// How to get the `ip` command, for error messages.
pub(crate) const IP_HINT: &str = "install iproute2 (`apt-get install iproute2`) and run the \
test as root: partition scenarios put processes in network namespaces (`ip netns`)";

/// Why a network could not be built or changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NetnsError {
    /// The `ip` command is missing.
    #[error("no `ip` command: {IP_HINT}")]
    NoIpCommand,
    /// The test does not run as root.
    #[error("network namespaces need root (effective uid {0}): {IP_HINT}")]
    NotRoot(u32),
    /// An `ip` command failed.
    #[error("`ip {args}` failed ({status}): {stderr}")]
    Command {
        /// The arguments.
        args: String,
        /// Its exit status.
        status: String,
        /// What it wrote on stderr.
        stderr: String,
    },
    /// No label of that name.
    #[error("no host labelled {0:?} in this network")]
    UnknownHost(String),
    /// Every /24 of 10.213.0.0/16 is in use in the root namespace.
    #[error("no free 10.213.<n>.0/24 subnet in the root namespace")]
    NoSubnet,
    /// Spawning `ip` failed.
    #[error("cannot run `ip`: {0}")]
    Io(#[from] std::io::Error),
}

/// One namespace of a [`Network`]: a label, its namespace name and its address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    label: String,
    netns: Option<String>,
    addr: Ipv4Addr,
    port: String,
}

impl Host {
    /// The label it was added with (`n1`, `broker-1`, [`ROOT`]).
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Its IPv4 address on the bridge.
    pub fn addr(&self) -> Ipv4Addr {
        self.addr
    }

    /// The namespace's name (`None` for [`ROOT`], the root namespace).
    pub fn netns(&self) -> Option<&str> {
        self.netns.as_deref()
    }

    /// `spec` run inside this host's namespace: `ip netns exec <ns> <program> <args…>`
    /// (`ip` execs the program, so the process ID is the program's and signals reach it).
    pub fn wrap(&self, spec: ProcessSpec) -> ProcessSpec {
        let Some(ns) = &self.netns else {
            return spec;
        };
        let mut args: Vec<OsString> = vec!["netns".into(), "exec".into(), ns.into()];
        args.push(spec.program.clone().into_os_string());
        args.extend(spec.args.iter().cloned());
        ProcessSpec {
            program: "ip".into(),
            args,
            ..spec
        }
    }
}

/// A bridge with hosts on it; deleted with all its namespaces when dropped.
#[derive(Debug)]
pub struct Network {
    name: String,
    hub: String,
    subnet: u8,
    hosts: Vec<Host>,
    cut: Vec<String>,
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// Runs `ip <args>`; its stdout on success.
fn ip(args: &[&str]) -> Result<String, NetnsError> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => NetnsError::NoIpCommand,
            _ => NetnsError::Io(e),
        })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(NetnsError::Command {
            args: args.join(" "),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

fn effective_uid() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(str::to_owned))
        })
        .and_then(|u| u.parse().ok())
        .unwrap_or(u32::MAX)
}

/// Deletes the namespaces named `mtf-<pid>-…` whose pid no longer runs (a crashed run's).
fn sweep_stale() {
    let Ok(list) = ip(&["netns", "list"]) else {
        return;
    };
    for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "delete", name]);
        }
    }
}

/// A `10.213.<n>.0/24` no address of the root namespace is in, trying from `start`.
fn free_subnet(start: u8) -> Result<u8, NetnsError> {
    let used = ip(&["-4", "-o", "addr", "show"])?;
    (0..=255u16)
        .map(|i| start.wrapping_add(i as u8))
        .find(|n| !used.contains(&format!("10.213.{n}.")))
        .ok_or(NetnsError::NoSubnet)
}

impl Network {
    /// Checks root and `ip`, deletes stale namespaces of crashed runs, and creates the hub
    /// (bridges `main` and `cut`) with the root namespace's end on `main`.
    pub fn create() -> Result<Network, NetnsError> {
        ip(&["-V"])?;
        let uid = effective_uid();
        if uid != 0 {
            return Err(NetnsError::NotRoot(uid));
        }
        sweep_stale();
        let pid = std::process::id();
        let seq = SEQ.fetch_add(1, Ordering::SeqCst);
        let name = format!("{PREFIX}{pid}-{seq}");
        let hub = format!("{name}-hub");
        let subnet = free_subnet((pid.wrapping_mul(31).wrapping_add(seq)) as u8)?;
        ip(&["netns", "add", &hub])?;
        let mut net = Network {
            name,
            hub,
            subnet,
            hosts: vec![],
            cut: vec![],
        };
        for bridge in ["main", "cut"] {
            net.hub_ip(&["link", "add", bridge, "type", "bridge"])?;
            net.hub_ip(&["link", "set", bridge, "up"])?;
        }
        // The root end: a name unique in the root namespace (at most 15 bytes).
        let root_if = format!("mtf{}x{seq}", pid % 1_000_000);
        let addr = Ipv4Addr::new(10, 213, subnet, 1);
        ip(&[
            "link", "add", &root_if, "type", "veth", "peer", "name", "p-root", "netns", &net.hub,
        ])?;
        ip(&["addr", "add", &format!("{addr}/24"), "dev", &root_if])?;
        ip(&["link", "set", &root_if, "up"])?;
        net.hub_ip(&["link", "set", "p-root", "master", "main", "up"])?;
        net.hosts.push(Host {
            label: ROOT.into(),
            netns: None,
            addr,
            port: "p-root".into(),
        });
        Ok(net)
    }

    fn hub_ip(&self, args: &[&str]) -> Result<String, NetnsError> {
        let mut all = vec!["-n", self.hub.as_str()];
        all.extend_from_slice(args);
        ip(&all)
    }

    /// Adds a host `label` (at most 8 bytes of letters, digits and `-`): a namespace with
    /// loopback up and `eth0` on the bridge at the next address.
    pub fn add_host(&mut self, label: &str) -> Result<Host, NetnsError> {
        let n = self.hosts.len() + 1;
        let netns = format!("{}-{label}", self.name);
        let port = format!("p{n}");
        let addr = Ipv4Addr::new(10, 213, self.subnet, n as u8);
        ip(&["netns", "add", &netns])?;
        self.hub_ip(&[
            "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &netns,
        ])?;
        self.hub_ip(&["link", "set", &port, "master", "main", "up"])?;
        ip(&[
            "-n",
            &netns,
            "addr",
            "add",
            &format!("{addr}/24"),
            "dev",
            "eth0",
        ])?;
        ip(&["-n", &netns, "link", "set", "eth0", "up"])?;
        ip(&["-n", &netns, "link", "set", "lo", "up"])?;
        let host = Host {
            label: label.into(),
            netns: Some(netns),
            addr,
            port,
        };
        self.hosts.push(host.clone());
        Ok(host)
    }

    /// The host labelled `label`.
    pub fn host(&self, label: &str) -> Result<&Host, NetnsError> {
        self.hosts
            .iter()
            .find(|h| h.label == label)
            .ok_or_else(|| NetnsError::UnknownHost(label.into()))
    }

    /// Every host, [`ROOT`] first.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// Partitions the network: the hosts labelled `side` (they still reach each other) from
    /// every other host. Replaces an earlier partition.
    pub fn cut_off(&mut self, side: &[&str]) -> Result<(), NetnsError> {
        self.heal()?;
        for label in side {
            let port = self.host(label)?.port.clone();
            self.hub_ip(&["link", "set", &port, "master", "cut"])?;
            self.cut.push(label.to_string());
        }
        Ok(())
    }

    /// The labels cut off now (empty: no partition).
    pub fn cut_side(&self) -> &[String] {
        &self.cut
    }

    /// Ends the partition: every host on one bridge again.
    pub fn heal(&mut self) -> Result<(), NetnsError> {
        for label in std::mem::take(&mut self.cut) {
            let port = self.host(&label)?.port.clone();
            self.hub_ip(&["link", "set", &port, "master", "main"])?;
        }
        Ok(())
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        for h in &self.hosts {
            if let Some(ns) = &h.netns {
                let _ = ip(&["netns", "delete", ns]);
            }
        }
        let _ = ip(&["netns", "delete", &self.hub]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::time::Duration;

    /// A TCP echo server in a namespace: reached from the root namespace, black-holed while
    /// cut off (no reset, no error: the read times out), reached again after healing, and
    /// every namespace gone after the drop.
    #[test]
    fn a_cut_black_holes_and_a_heal_restores() {
        let mut net = Network::create().expect("network namespaces (root, ip)");
        let host = net.add_host("echo").unwrap();
        let ns = host.netns().unwrap().to_owned();
        let script = format!(
            "import socket\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
             s.bind(('{}',7))\ns.listen()\nc,_=s.accept()\nwhile True:\n d=c.recv(64)\n if not d: break\n c.sendall(d)\n",
            host.addr()
        );
        let dir = tempfile::tempdir().unwrap();
        let spec = ProcessSpec::new("echo", "python3", dir.path().join("echo.log"))
            .args(["-c".to_owned(), script]);
        let _echo = crate::ChildProcess::spawn(host.wrap(spec)).unwrap();
        let addr = std::net::SocketAddr::from((host.addr(), 7));
        let mut conn = (0..50)
            .find_map(|_| {
                std::thread::sleep(Duration::from_millis(100));
                std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()
            })
            .expect("the echo server answers");
        conn.set_read_timeout(Some(Duration::from_millis(800)))
            .unwrap();
        let mut buf = [0u8; 1];
        conn.write_all(b"a").unwrap();
        conn.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"a");
        net.cut_off(&["echo"]).unwrap();
        assert_eq!(net.cut_side(), ["echo".to_owned()]);
        conn.write_all(b"b").unwrap();
        let err = conn.read_exact(&mut buf).unwrap_err();
        assert!(
            matches!(
                err.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "{err}"
        );
        net.heal().unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        conn.read_exact(&mut buf).unwrap();
        assert_eq!(
            &buf, b"b",
            "the byte sent during the cut arrives after healing"
        );
        drop(conn);
        drop(_echo);
        drop(net);
        let left = ip(&["netns", "list"]).unwrap();
        assert!(!left.contains(&ns), "{ns} left behind: {left}");
    }

    #[test]
    fn two_networks_get_different_names_and_subnets() {
        let a = Network::create().unwrap();
        let b = Network::create().unwrap();
        assert_ne!(a.hub, b.hub);
        assert_ne!(a.subnet, b.subnet);
        assert_eq!(a.host(ROOT).unwrap().addr().octets()[3], 1);
        assert!(matches!(a.host("nope"), Err(NetnsError::UnknownHost(_))));
    }
}
