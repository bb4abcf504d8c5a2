//! nats-server processes that a fault test kills and starts again: one node whose port and
//! JetStream store outlive the process ([`NatsNode`]), and a cluster of such nodes
//! ([`NatsCluster`], three nodes in deploy/nats/nats.conf's shape: one cluster named
//! `msgtrail`, every node routing to every node, JetStream on each).
//!
//! A node keeps its client port and its store directory across [`NatsNode::kill9`] and
//! [`NatsNode::restart`], so clients reconnect to the same URL and JetStream recovers the
//! same streams from disk. The log of each incarnation is kept ([`NatsNode::logs`]).
//!
//! Every node also opens an HTTP monitoring port (a fresh one per incarnation), so a test can
//! read its `/jsz` ([`NatsNode::jsz`]) — where a cluster's JetStream meta leader is found
//! ([`NatsCluster::meta_leader`]): no JetStream API request names it without the system
//! account, which these nodes do not configure.

use crate::nats_netns::{NetnsNats, ROUTE_PORT};
use crate::netns::{Host, NetnsError, Network};
use crate::process::{free_port, free_ports};
use crate::{NatsServer, NatsServerError, NatsServerOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// One nats-server whose port and store survive its process.
#[derive(Debug)]
pub struct NatsNode {
    name: String,
    options: NatsServerOptions,
    server: Option<NatsServer>,
    /// The process when the node runs in a network namespace (then `server` stays `None`).
    netns: Option<NetnsNats>,
    url: String,
    earlier_logs: String,
}

impl NatsNode {
    /// Starts a single JetStream node on a free port with its store in `store_dir`.
    pub fn start(store_dir: &Path) -> Result<Self, NatsServerError> {
        Self::start_with("nats", store_dir, free_port(), String::new())
    }

    /// Starts a node named `name` on `port`, its store in `store_dir`, with `extra_config`
    /// (a cluster block, say) appended to the generated configuration, and a monitoring port.
    pub fn start_with(
        name: &str,
        store_dir: &Path,
        port: u16,
        extra_config: String,
    ) -> Result<Self, NatsServerError> {
        let options = NatsServerOptions {
            store_dir: Some(store_dir.to_path_buf()),
            port: Some(port),
            extra_config,
            monitoring: true,
            ..Default::default()
        };
        let server = NatsServer::start_with(options.clone())?;
        let url = server.url().to_owned();
        Ok(NatsNode {
            name: name.to_owned(),
            options,
            server: Some(server),
            netns: None,
            url,
            earlier_logs: String::new(),
        })
    }

    /// Starts a node named `name` in `host`'s network namespace, listening on the host's
    /// address (ports [`crate::CLIENT_PORT`], [`crate::MONITOR_PORT`]), its store in
    /// `store_dir`, `extra_config` appended, JetStream syncing every write when
    /// `sync_always` (`sync_interval: always`; otherwise nats-server's default, every 2 min).
    pub fn start_in(
        host: &Host,
        name: &str,
        store_dir: &Path,
        extra_config: String,
        sync_always: bool,
    ) -> Result<Self, NatsServerError> {
        let server = NetnsNats::start(host, name, store_dir, &extra_config, sync_always)?;
        let options = NatsServerOptions {
            store_dir: Some(store_dir.to_path_buf()),
            extra_config,
            monitoring: true,
            ..Default::default()
        };
        Ok(NatsNode {
            name: name.to_owned(),
            options,
            server: None,
            url: server.url().to_owned(),
            netns: Some(server),
            earlier_logs: String::new(),
        })
    }

    /// The node's name (its `server_name` in a cluster).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The client URL; the same across restarts.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The HTTP monitoring URL of the running incarnation (`None` while it is down).
    pub fn monitor_url(&self) -> Option<&str> {
        match &self.netns {
            Some(n) => n.pid().map(|_| n.monitor_url()),
            None => self.server.as_ref().and_then(NatsServer::monitor_url),
        }
    }

    /// `GET <path>` of the node's monitoring port (`/jsz`, `/connz?subs=1`) as JSON, read
    /// with a 2 s timeout. Blocking.
    pub fn monitor(&self, path: &str) -> Result<serde_json::Value, String> {
        let url = self
            .monitor_url()
            .ok_or_else(|| format!("{} is not running", self.name))?;
        let body = http_get(url, path, Duration::from_secs(2))
            .map_err(|e| format!("{}: GET {url}{path}: {e}", self.name))?;
        serde_json::from_str(&body).map_err(|e| format!("{}: {path} is not JSON: {e}", self.name))
    }

    /// The node's `GET /jsz` (JetStream information: `meta_cluster.leader` in a cluster).
    /// Blocking.
    pub fn jsz(&self) -> Result<serde_json::Value, String> {
        self.monitor("/jsz")
    }

    /// Whether the node's process is running.
    pub fn is_running(&self) -> bool {
        self.pid().is_some()
    }

    /// The process ID, while it runs.
    pub fn pid(&self) -> Option<u32> {
        match &self.netns {
            Some(n) => n.pid(),
            None => self.server.as_ref().map(NatsServer::pid),
        }
    }

    /// The JetStream store directory.
    pub fn store_dir(&self) -> PathBuf {
        self.options.store_dir.clone().expect("a node has a store")
    }

    /// `kill -9` (the server's drop is a SIGKILL and a wait); its log is kept.
    pub fn kill9(&mut self) {
        if let Some(n) = &mut self.netns {
            n.kill9();
            return;
        }
        if let Some(s) = self.server.take() {
            self.earlier_logs.push_str(&s.log());
            self.earlier_logs
                .push_str(&format!("=== {} killed (SIGKILL) ===\n", self.name));
            drop(s);
        }
    }

    /// SIGSTOP: the node freezes (connections stay open; no reply, no route traffic, no
    /// heartbeat) until [`NatsNode::resume`].
    pub fn pause(&mut self) -> Result<(), crate::ProcessError> {
        match self.pid() {
            Some(pid) => crate::signal(pid, "STOP"),
            None => Ok(()),
        }
    }

    /// SIGCONT: a paused node carries on.
    pub fn resume(&mut self) -> Result<(), crate::ProcessError> {
        match self.pid() {
            Some(pid) => crate::signal(pid, "CONT"),
            None => Ok(()),
        }
    }

    /// Starts the node again on the same port and store (killing it first if it runs). The
    /// port may linger for a moment after a kill: this retries for up to 10 s.
    pub fn restart(&mut self) -> Result<(), NatsServerError> {
        if let Some(n) = &mut self.netns {
            return n.restart();
        }
        self.kill9();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match NatsServer::start_with(self.options.clone()) {
                Ok(s) => {
                    self.server = Some(s);
                    return Ok(());
                }
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The logs of every incarnation so far.
    pub fn logs(&self) -> String {
        if let Some(n) = &self.netns {
            return n.log();
        }
        let mut out = self.earlier_logs.clone();
        if let Some(s) = &self.server {
            out.push_str(&s.log());
        }
        out
    }
}

/// A JetStream cluster of [`NatsNode`]s on loopback, in deploy/nats/nats.conf's shape.
#[derive(Debug)]
pub struct NatsCluster {
    /// The nodes, `faults-n1` … `faults-nN`.
    pub nodes: Vec<NatsNode>,
    _dir: tempfile::TempDir,
}

/// The name of the cluster (as in deploy/nats/nats.conf).
pub(crate) const CLUSTER_NAME: &str = "msgtrail";

impl NatsCluster {
    /// Starts `n` nodes (3 for R3 streams) routed to each other, each with its own store.
    /// The client and route ports are `2n` different free ports; when a node does not come
    /// up (another process took a port in the meantime) the whole cluster is started again on
    /// new ports, up to 3 times.
    pub fn start(n: usize) -> Result<Self, NatsServerError> {
        let mut tries = 0;
        loop {
            tries += 1;
            match Self::start_once(n) {
                Err(NatsServerError::Start(e)) if tries < 3 => {
                    let first = e.lines().next().unwrap_or_default().to_owned();
                    eprintln!("a nats cluster node did not start ({first}); again on new ports");
                }
                other => return other,
            }
        }
    }

    fn start_once(n: usize) -> Result<Self, NatsServerError> {
        let dir = tempfile::Builder::new()
            .prefix("msgtrail-cluster-")
            .tempdir()?;
        let ports = free_ports(2 * n);
        let (client_ports, route_ports) = ports.split_at(n);
        let routes = route_ports
            .iter()
            .map(|p| format!("\"nats-route://127.0.0.1:{p}\""))
            .collect::<Vec<_>>()
            .join(", ");
        let mut nodes = Vec::with_capacity(n);
        for i in 0..n {
            let name = format!("faults-n{}", i + 1);
            let extra = format!(
                "server_name: {name}\n\
                 cluster {{\n  name: {CLUSTER_NAME}\n  listen: \"127.0.0.1:{}\"\n  routes: [ {routes} ]\n}}\n",
                route_ports[i]
            );
            let store = dir.path().join(format!("store-{}", i + 1));
            nodes.push(NatsNode::start_with(&name, &store, client_ports[i], extra)?);
        }
        Ok(NatsCluster { nodes, _dir: dir })
    }

    /// Starts `n` nodes in namespaces of `network` (hosts `n1` … `nN`, nodes `faults-n1` …),
    /// routed to each other on the bridge, each with its own store; JetStream syncs every
    /// write when `sync_always`. A partition of the network then cuts routes and client
    /// connections alike ([`Network::cut_off`]).
    pub fn start_in(
        network: &mut Network,
        n: usize,
        sync_always: bool,
    ) -> Result<Self, NatsServerError> {
        let netns = |e: NetnsError| NatsServerError::Start(e.to_string());
        let dir = tempfile::Builder::new()
            .prefix("msgtrail-cluster-")
            .tempdir()?;
        let hosts = (1..=n)
            .map(|i| network.add_host(&format!("n{i}")))
            .collect::<Result<Vec<Host>, _>>()
            .map_err(netns)?;
        let routes = hosts
            .iter()
            .map(|h| format!("\"nats-route://{}:{ROUTE_PORT}\"", h.addr()))
            .collect::<Vec<_>>()
            .join(", ");
        let mut nodes = Vec::with_capacity(n);
        for (i, host) in hosts.iter().enumerate() {
            let name = format!("faults-n{}", i + 1);
            let extra = format!(
                "server_name: {name}\n\
                 cluster {{\n  name: {CLUSTER_NAME}\n  listen: \"{}:{ROUTE_PORT}\"\n  routes: [ {routes} ]\n}}\n",
                host.addr()
            );
            let store = dir.path().join(format!("store-{}", i + 1));
            nodes.push(NatsNode::start_in(host, &name, &store, extra, sync_always)?);
        }
        Ok(NatsCluster { nodes, _dir: dir })
    }

    /// Every node's client URL (each is a seed for clients).
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url().to_owned()).collect()
    }

    /// The index of the node named `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name() == name)
    }

    /// The node names, in order.
    pub fn names(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.name().to_owned()).collect()
    }

    /// The JetStream meta leader (the leader of the meta group, which places streams and
    /// consumers), as every running node's `/jsz` names it (`meta_cluster.leader`). Retries
    /// until the running nodes agree on one that is running (after a kill the others name the
    /// dead leader for a moment), for up to `within`. Blocking.
    pub fn meta_leader(&self, within: Duration) -> Result<String, String> {
        let deadline = Instant::now() + within;
        loop {
            let seen: Vec<Result<String, String>> = self
                .nodes
                .iter()
                .filter(|n| n.is_running())
                .map(|n| {
                    let v = n.jsz()?;
                    v["meta_cluster"]["leader"]
                        .as_str()
                        .filter(|l| !l.is_empty())
                        .map(str::to_owned)
                        .ok_or_else(|| format!("{} knows no meta leader", n.name()))
                })
                .collect();
            let first = seen.first().cloned();
            match first {
                Some(Ok(l))
                    if seen.iter().all(|s| s.as_ref() == Ok(&l))
                        && self.index_of(&l).is_none_or(|i| self.nodes[i].is_running()) =>
                {
                    return Ok(l)
                }
                _ if Instant::now() > deadline => {
                    return Err(format!("no agreed meta leader: {seen:?}"))
                }
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// The logs of every node, one after the other.
    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("---- {} ----\n{}", n.name(), n.logs()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// `GET <path>` of `base` (`http://host:port`) over HTTP/1.0; the body on a 200. Blocking.
fn http_get(base: &str, path: &str, timeout: Duration) -> Result<String, String> {
    let authority = base.strip_prefix("http://").unwrap_or(base);
    let addr = std::net::ToSocketAddrs::to_socket_addrs(authority)
        .map_err(|e| e.to_string())?
        .next()
        .ok_or("no address")?;
    let mut s = std::net::TcpStream::connect_timeout(&addr, timeout).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {authority}\r\n\r\n").map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text.split_once("\r\n\r\n").ok_or("no HTTP header")?;
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("200") {
        return Err(format!("answered {status}"));
    }
    Ok(body.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_keeps_its_port_and_store_across_a_kill() {
        let store = tempfile::tempdir().unwrap();
        let mut node = NatsNode::start(store.path()).expect("nats-server must start");
        let url = node.url().to_owned();
        let port: u16 = url.rsplit(':').next().unwrap().parse().unwrap();
        node.kill9();
        assert!(!node.is_running());
        assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
        node.restart().unwrap();
        assert_eq!(node.url(), url);
        assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
        assert!(node.logs().contains("killed (SIGKILL)"));
        assert_eq!(node.store_dir(), store.path());
        // A fresh monitoring port per incarnation, and /jsz on it.
        assert!(node.jsz().unwrap()["config"]["store_dir"].is_string());
    }

    #[test]
    fn a_cluster_names_its_meta_leader_and_elects_another_when_it_dies() {
        let mut cluster = NatsCluster::start(3).expect("a 3-node cluster starts");
        let leader = cluster.meta_leader(Duration::from_secs(20)).unwrap();
        let i = cluster.index_of(&leader).expect("the leader is a node");
        cluster.nodes[i].kill9();
        // What is tested is that the helper names the new leader, not how fast nats-server
        // elects one: on a loaded 2-core machine one full-suite run saw no leader for 20 s.
        let next = cluster.meta_leader(Duration::from_secs(60)).unwrap();
        assert_ne!(next, leader);
        assert!(cluster.names().contains(&next));
    }

    /// A cluster in namespaces: the meta leader cut off alone, the two others elect another
    /// (its own `/jsz` is unreachable from this side of the cut); healed, all three agree
    /// again. Each node also keeps its client URL on the bridge.
    #[test]
    fn a_cut_off_meta_leader_is_replaced_and_rejoins_after_healing() {
        let mut net = Network::create().expect("network namespaces (root, ip)");
        let cluster = NatsCluster::start_in(&mut net, 3, false).expect("a cluster in netns");
        for (node, host) in cluster.nodes.iter().zip(&net.hosts()[1..]) {
            assert_eq!(
                node.url(),
                format!("nats://{}:{}", host.addr(), crate::CLIENT_PORT)
            );
        }
        let leader = cluster.meta_leader(Duration::from_secs(60)).unwrap();
        let i = cluster.index_of(&leader).unwrap();
        // Cut only once the leader sees both followers current: followers that have not yet
        // caught up with the meta log were seen (twice, on a loaded machine) to elect no one
        // for a whole minute after the cut — a cluster just started, not the fault tested.
        let settled = Instant::now() + Duration::from_secs(60);
        loop {
            let jsz = cluster.nodes[i].jsz().unwrap_or_default();
            let replicas = jsz["meta_cluster"]["replicas"].as_array().cloned();
            let current = replicas.as_ref().is_some_and(|r| {
                r.len() == 2 && r.iter().all(|p| p["current"].as_bool() == Some(true))
            });
            if current {
                break;
            }
            assert!(
                Instant::now() < settled,
                "the meta leader's followers are not current: {:?}",
                jsz["meta_cluster"]
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        net.cut_off(&[&format!("n{}", i + 1)]).unwrap();
        assert!(
            cluster.nodes[i].jsz().is_err(),
            "the cut node still answers"
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        let next = loop {
            let seen: Vec<Option<String>> = cluster
                .nodes
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, n)| {
                    n.jsz()
                        .ok()
                        .and_then(|v| v["meta_cluster"]["leader"].as_str().map(str::to_owned))
                })
                .collect();
            match &seen[..] {
                [Some(a), Some(b)] if a == b && *a != leader => break a.clone(),
                _ if Instant::now() > deadline => panic!("no new meta leader: {seen:?}"),
                _ => std::thread::sleep(Duration::from_millis(200)),
            }
        };
        net.heal().unwrap();
        let after = cluster.meta_leader(Duration::from_secs(60)).unwrap();
        assert_eq!(after, next, "the healed node follows the new leader");
    }
}
