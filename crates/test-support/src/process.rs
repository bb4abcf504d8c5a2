//! Real `msgtrail` processes for fault-injection tests: finding (and building) the `msgtrail`
//! binary, and child processes that a test can SIGKILL, stop gracefully and start again.
//!
//! ## The binary
//! [`msgtrail_binary`] returns `$MSGTRAIL_BIN` when it is set. Otherwise it returns
//! `target/<profile>/msgtrail` (the target directory and profile of the running test
//! executable), after running `cargo build -p msgtrail-cli --bin msgtrail` once per test
//! process unless that binary is newer than every source under `crates/` (`cargo test
//! --workspace` has just built it, then). A test crate cannot depend on another package's
//! binary (`CARGO_BIN_EXE_*` exists only for the tests of the package that has it), hence
//! the build. When the build fails but an older binary exists, that one is used with a
//! warning on stderr; when there is none, the error says how to get one.
//!
//! ## Child processes
//! [`ChildProcess`] runs a program with its stdout and stderr appended to a log file (kept
//! across restarts, with a marker line per start), and is SIGKILLed when dropped.
//! [`ChildProcess::kill9`] is `kill -9`; [`ChildProcess::terminate`] is SIGTERM then, after a
//! grace period, SIGKILL; [`ChildProcess::restart`] starts the same command line again;
//! [`ChildProcess::pause`] / [`ChildProcess::resume`] are SIGSTOP / SIGCONT (a process that
//! freezes and comes back: a GC stall, a stopped container), also for any pid with
//! [`signal`].

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Environment variable naming the `msgtrail` binary to use (skips the build).
pub(crate) const MSGTRAIL_BIN_ENV: &str = "MSGTRAIL_BIN";

/// How to get the binary, for error messages.
pub(crate) const MSGTRAIL_BIN_HINT: &str =
    "build it with `cargo build -p msgtrail-cli` (it lands in \
target/debug/msgtrail), or set MSGTRAIL_BIN to the path of a msgtrail binary";

/// Why a process could not be found, built or started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProcessError {
    /// The `msgtrail` binary is missing and could not be built.
    #[error("no msgtrail binary: {0}")]
    NoBinary(String),
    /// Spawning or signalling failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Sends `sig` (`"STOP"`, `"CONT"`, `"TERM"`, …) to `pid` with the `kill` command.
pub fn signal(pid: u32, sig: &str) -> Result<(), ProcessError> {
    let status = Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(ProcessError::Io(std::io::Error::other(format!(
            "kill -{sig} {pid} failed ({status})"
        ))))
    }
}

/// The workspace root (this crate is `crates/test-support`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
}

/// The target directory and profile directory name of the running executable, when it runs
/// from `<target>/<profile>/deps/` (a test) or `<target>/<profile>/` (a binary).
fn running_layout() -> Option<(PathBuf, String)> {
    let exe = std::env::current_exe().ok()?;
    let mut dir = exe.parent()?;
    if dir.file_name()? == "deps" {
        dir = dir.parent()?;
    }
    let profile = dir.file_name()?.to_str()?.to_owned();
    let target = dir.parent()?.to_path_buf();
    // Only a plain `<target>/<profile>` layout (no `--target <triple>` level).
    target
        .join("CACHEDIR.TAG")
        .exists()
        .then_some((target, profile))
}

fn build_msgtrail() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os(MSGTRAIL_BIN_ENV) {
        let p = PathBuf::from(p);
        return if is_executable(&p) {
            Ok(p)
        } else {
            Err(format!(
                "{MSGTRAIL_BIN_ENV}={} is not an executable file; {MSGTRAIL_BIN_HINT}",
                p.display()
            ))
        };
    }
    let root = workspace_root();
    let (target, profile) =
        running_layout().unwrap_or_else(|| (root.join("target"), "debug".to_owned()));
    let binary = target.join(&profile).join("msgtrail");
    // A binary newer than every source needs no cargo run (and no lock on the target
    // directory, which a concurrent build may hold).
    if let (Some(built), Some(sources)) = (mtime(&binary), newest_source(&root)) {
        if built > sources {
            return Ok(binary);
        }
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let cargo_profile = if profile == "debug" {
        "dev"
    } else {
        profile.as_str()
    };
    let started = Instant::now();
    let out = Command::new(&cargo)
        .current_dir(&root)
        .args([
            "build",
            "--quiet",
            "-p",
            "msgtrail-cli",
            "--bin",
            "msgtrail",
        ])
        .arg("--profile")
        .arg(cargo_profile)
        .arg("--target-dir")
        .arg(&target)
        .stdin(Stdio::null())
        .output();
    match out {
        Ok(o) if o.status.success() && is_executable(&binary) => {
            if started.elapsed() > Duration::from_secs(5) {
                eprintln!(
                    "built {} in {:.0?} (cargo build -p msgtrail-cli)",
                    binary.display(),
                    started.elapsed()
                );
            }
            Ok(binary)
        }
        other => {
            let why = match other {
                Ok(o) => format!(
                    "`cargo build -p msgtrail-cli` failed ({}): {}",
                    o.status,
                    String::from_utf8_lossy(&o.stderr).trim()
                ),
                Err(e) => format!("cannot run {}: {e}", Path::new(&cargo).display()),
            };
            if is_executable(&binary) {
                eprintln!(
                    "warning: {why}\nwarning: using the existing {} (it may be stale)",
                    binary.display()
                );
                Ok(binary)
            } else {
                Err(format!("{why}; {MSGTRAIL_BIN_HINT}"))
            }
        }
    }
}

fn mtime(p: &Path) -> Option<std::time::SystemTime> {
    p.metadata().and_then(|m| m.modified()).ok()
}

/// The newest modification time among the workspace's manifests, lock file and the sources
/// under `crates/`.
fn newest_source(root: &Path) -> Option<std::time::SystemTime> {
    fn walk(dir: &Path, newest: &mut Option<std::time::SystemTime>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, newest);
            } else if p
                .extension()
                .is_some_and(|x| x == "rs" || x == "toml" || x == "html")
            {
                *newest = (*newest).max(mtime(&p));
            }
        }
    }
    let mut newest = mtime(&root.join("Cargo.lock")).max(mtime(&root.join("Cargo.toml")));
    walk(&root.join("crates"), &mut newest);
    newest
}

/// The `msgtrail` binary: `$MSGTRAIL_BIN`, or `target/<profile>/msgtrail` after `cargo build
/// -p msgtrail-cli` (once per process; see the module docs).
pub fn msgtrail_binary() -> Result<PathBuf, ProcessError> {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BIN.get_or_init(build_msgtrail)
        .clone()
        .map_err(ProcessError::NoBinary)
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// A free TCP port on 127.0.0.1 (free when asked: another process may take it before use).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// `n` different free TCP ports on 127.0.0.1: each is held until all are chosen, so no two
/// are the same (calls of [`free_port`] one after the other may return one port twice).
pub(crate) fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("a free loopback port"))
        .collect();
    held.iter()
        .map(|l| l.local_addr().expect("a bound port").port())
        .collect()
}

/// What to run: a program, its arguments and extra environment.
#[derive(Debug, Clone)]
pub struct ProcessSpec {
    /// A short name for messages (`broker-1`).
    pub name: String,
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Environment variables added to the test's own.
    pub envs: Vec<(OsString, OsString)>,
    /// Environment variables of the test's own that the process does not get.
    pub envs_removed: Vec<OsString>,
    /// Where stdout and stderr go (appended).
    pub log: PathBuf,
}

impl ProcessSpec {
    /// A spec running `program` with no arguments, logging to `log`.
    pub fn new(name: impl Into<String>, program: impl Into<PathBuf>, log: PathBuf) -> Self {
        ProcessSpec {
            name: name.into(),
            program: program.into(),
            args: Vec::new(),
            envs: Vec::new(),
            envs_removed: Vec::new(),
            log,
        }
    }

    /// Adds arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Adds an environment variable.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.envs.push((key.into(), value.into()));
        self
    }

    /// Leaves an environment variable of the test's own out.
    pub fn env_remove(mut self, key: impl Into<OsString>) -> Self {
        self.envs_removed.push(key.into());
        self
    }
}

/// A running child process; SIGKILLed and reaped when dropped.
#[derive(Debug)]
pub struct ChildProcess {
    spec: ProcessSpec,
    child: Option<Child>,
    starts: u32,
}

impl ChildProcess {
    /// Starts `spec`.
    pub fn spawn(spec: ProcessSpec) -> Result<Self, ProcessError> {
        let mut p = ChildProcess {
            spec,
            child: None,
            starts: 0,
        };
        p.start()?;
        Ok(p)
    }

    fn start(&mut self) -> Result<(), ProcessError> {
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.spec.log)?;
        self.starts += 1;
        writeln!(
            log,
            "=== {} start #{} ({} {}) ===",
            self.spec.name,
            self.starts,
            self.spec.program.display(),
            self.spec
                .args
                .iter()
                .map(|a| a.to_string_lossy())
                .collect::<Vec<_>>()
                .join(" ")
        )?;
        let mut command = Command::new(&self.spec.program);
        for k in &self.spec.envs_removed {
            command.env_remove(k);
        }
        let child = command
            .args(&self.spec.args)
            .envs(self.spec.envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| {
                ProcessError::Io(std::io::Error::new(
                    e.kind(),
                    format!("{}: {}: {e}", self.spec.name, self.spec.program.display()),
                ))
            })?;
        self.child = Some(child);
        Ok(())
    }

    /// The name given in the spec.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The process ID of the current incarnation (`None` once killed or exited and reaped).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// How many times the process was started.
    pub fn starts(&self) -> u32 {
        self.starts
    }

    /// Its exit status if it has exited (reaping it), `None` while it runs.
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        match child.try_wait() {
            Ok(Some(status)) => {
                self.child = None;
                Some(status)
            }
            _ => None,
        }
    }

    /// Whether it is running.
    pub fn is_running(&mut self) -> bool {
        self.try_exit().is_none() && self.child.is_some()
    }

    /// `kill -9`: SIGKILL, then reap. Nothing of the process runs after this returns.
    pub fn kill9(&mut self) -> Result<(), ProcessError> {
        if let Some(mut child) = self.child.take() {
            match child.kill() {
                Ok(()) => {}
                // Already exited.
                Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {}
                Err(e) => return Err(e.into()),
            }
            child.wait()?;
        }
        Ok(())
    }

    /// SIGTERM, then waits up to `grace` for it to exit, then SIGKILL. Returns its exit status
    /// when it exited on its own.
    pub fn terminate(&mut self, grace: Duration) -> Result<Option<ExitStatus>, ProcessError> {
        let Some(pid) = self.pid() else {
            return Ok(None);
        };
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Some(status) = self.try_exit() {
                return Ok(Some(status));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill9()?;
        Ok(None)
    }

    /// SIGSTOP: the process freezes (its sockets stay open, nothing is read or answered)
    /// until [`ChildProcess::resume`].
    pub fn pause(&mut self) -> Result<(), ProcessError> {
        match self.pid() {
            Some(pid) => signal(pid, "STOP"),
            None => Ok(()),
        }
    }

    /// SIGCONT: a paused process carries on where it stopped.
    pub fn resume(&mut self) -> Result<(), ProcessError> {
        match self.pid() {
            Some(pid) => signal(pid, "CONT"),
            None => Ok(()),
        }
    }

    /// Starts the same command line again (killing the current incarnation first if it
    /// still runs).
    pub fn restart(&mut self) -> Result<(), ProcessError> {
        self.kill9()?;
        self.start()
    }

    /// Everything the process wrote so far, all incarnations.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.spec.log).unwrap_or_default()
    }

    /// The last `n` lines of the log, for failure messages.
    pub fn log_tail(&self, n: usize) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        let _ = self.kill9();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kill9_restart_and_terminate() {
        let dir = tempfile::tempdir().unwrap();
        let spec = ProcessSpec::new("sleeper", "sleep", dir.path().join("sleep.log")).args(["30"]);
        let mut p = ChildProcess::spawn(spec).unwrap();
        assert!(p.is_running());
        let first = p.pid().unwrap();
        p.kill9().unwrap();
        assert!(!p.is_running());
        assert!(!Path::new(&format!("/proc/{first}/status")).exists());
        p.restart().unwrap();
        assert!(p.is_running());
        assert_ne!(p.pid(), Some(first));
        assert_eq!(p.starts(), 2);
        // sleep exits on SIGTERM (killed by the signal, so no exit code).
        let status = p.terminate(Duration::from_secs(5)).unwrap();
        assert!(status.is_some());
        assert!(p.log().contains("sleeper start #2"));
    }

    #[test]
    fn free_ports_are_different() {
        let ports = free_ports(16);
        let distinct: std::collections::HashSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), 16);
    }
}
