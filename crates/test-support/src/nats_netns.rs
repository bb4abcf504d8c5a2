//! A nats-server process inside a network namespace ([`crate::Host`]): its configuration,
//! its start through `ip netns exec`, and the wait until it listens.
//!
//! The devkit's launcher runs nats-server in the test's own namespace on loopback; this one
//! listens on the host's bridge address with fixed ports (each namespace has its own port
//! space, so nothing else can hold them): clients on [`CLIENT_PORT`], routes on
//! [`ROUTE_PORT`], monitoring on [`MONITOR_PORT`]. The process is a [`ChildProcess`], so a
//! kill, a restart on the same store, SIGSTOP/SIGCONT and its log work as for any other.

use crate::netns::Host;
use crate::process::{ChildProcess, ProcessSpec};
use crate::{find_nats_server, NatsServerError};
use std::path::Path;
use std::time::{Duration, Instant};

/// The client port of a node in a namespace.
pub const CLIENT_PORT: u16 = 4222;
/// The route (cluster) port of a node in a namespace.
pub const ROUTE_PORT: u16 = 6222;
/// The HTTP monitoring port of a node in a namespace.
pub const MONITOR_PORT: u16 = 8222;

/// A nats-server in a namespace (SIGKILLed when dropped).
#[derive(Debug)]
pub(crate) struct NetnsNats {
    child: ChildProcess,
    url: String,
    monitor_url: String,
    addr: std::net::SocketAddr,
    _dir: tempfile::TempDir,
}

impl NetnsNats {
    /// Writes the configuration (the host's address, `store_dir`, JetStream's
    /// `sync_interval: always` when `sync_always`, the client pings deploy/nats/nats.conf
    /// sets — every 5 s, three missed drop the client — then `extra_config`) and starts the server
    /// in `host`'s namespace; returns once its client port accepts connections.
    pub(crate) fn start(
        host: &Host,
        name: &str,
        store_dir: &Path,
        extra_config: &str,
        sync_always: bool,
    ) -> Result<Self, NatsServerError> {
        let bin = find_nats_server()?;
        let dir = tempfile::Builder::new()
            .prefix("msgtrail-nats-netns-")
            .tempdir()?;
        let ip = host.addr();
        let sync = if sync_always {
            ", sync_interval: always"
        } else {
            ""
        };
        let config = format!(
            "listen: \"{ip}:{CLIENT_PORT}\"\nhttp: \"{ip}:{MONITOR_PORT}\"\n\
             ping_interval: \"5s\"\nping_max: 3\n\
             jetstream {{ store_dir: {:?}{sync} }}\n{extra_config}\n",
            store_dir.display().to_string()
        );
        let config_path = dir.path().join("nats.conf");
        std::fs::write(&config_path, config)?;
        let spec = ProcessSpec::new(name, bin, dir.path().join("nats.log"))
            .args([std::ffi::OsString::from("-c"), config_path.into_os_string()]);
        let child = ChildProcess::spawn(host.wrap(spec))
            .map_err(|e| NatsServerError::Start(e.to_string()))?;
        let mut server = NetnsNats {
            child,
            url: format!("nats://{ip}:{CLIENT_PORT}"),
            monitor_url: format!("http://{ip}:{MONITOR_PORT}"),
            addr: (ip, CLIENT_PORT).into(),
            _dir: dir,
        };
        server.wait_listening()?;
        Ok(server)
    }

    fn wait_listening(&mut self) -> Result<(), NatsServerError> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if !self.child.is_running() {
                return Err(NatsServerError::Start(format!(
                    "exited; log:\n{}",
                    self.child.log_tail(30)
                )));
            }
            if std::net::TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(NatsServerError::Start(format!(
                    "not listening on {} after 20 s; log:\n{}",
                    self.url,
                    self.child.log_tail(30)
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The client URL.
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// The monitoring URL.
    pub(crate) fn monitor_url(&self) -> &str {
        &self.monitor_url
    }

    /// The process ID while it runs.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.pid()
    }

    /// SIGKILL and reap.
    pub(crate) fn kill9(&mut self) {
        let _ = self.child.kill9();
    }

    /// Starts the same configuration again (same store) and waits until it listens.
    pub(crate) fn restart(&mut self) -> Result<(), NatsServerError> {
        self.child
            .restart()
            .map_err(|e| NatsServerError::Start(e.to_string()))?;
        self.wait_listening()
    }

    /// The log of every incarnation (each start marked).
    pub(crate) fn log(&self) -> String {
        self.child.log()
    }
}
