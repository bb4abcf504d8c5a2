//! Connecting to NATS with the usual options: server URLs, user and password, token, creds
//! file, nkey seed, TLS, inbox prefix, ping interval. The broker, the listener, the SDK and
//! the CLI use the same options.
//!
//! **Leaving a dead server.** A connection whose server froze or was cut off by the network
//! (no RST, no FIN: a black hole) is noticed only by its pings. async-nats sends a PING
//! after `ping_interval` without any traffic from the server and drops the connection when
//! a third PING would be outstanding, so a black-holed connection is left
//! **2–3 × `ping_interval`** after the last byte the server sent, and the client then
//! reconnects to another URL of the cluster. async-nats' default interval is 60 s (up to
//! 3 minutes on a dead node); msgtrail's is [`DEFAULT_PING_INTERVAL`] (2 s: a dead
//! server is left within 4–6 s), set per part with `--nats-ping-interval` /
//! `NATS_PING_INTERVAL`. A server paused longer than that is left as well: the client
//! reconnects (to it again once it answers, on a single node).

use secrecy::{ExposeSecret, SecretString};
use std::path::PathBuf;
use std::time::Duration;

/// The NATS server a part connects to when none is configured (a local `nats-server`).
pub const DEFAULT_URL: &str = "nats://127.0.0.1:4222";

/// How long a connection may go without traffic from its server before the client sends a
/// PING (see the module doc: a silent server is left after 2–3 intervals). 2 s costs one
/// 6-byte PING/PONG pair per idle connection every 2 s; nats-server itself pings clients
/// every 2 minutes.
pub const DEFAULT_PING_INTERVAL: Duration = Duration::from_secs(2);

/// How to reach and authenticate with NATS. The secrets are [`SecretString`]s: `Debug`
/// shows `[REDACTED]`, and their memory is zeroed when dropped.
#[derive(Debug, Clone, Default)]
pub struct NatsOptions {
    /// Server URLs (`nats://host:4222`, `tls://…`); several for a cluster.
    pub urls: Vec<String>,
    /// User name (with `password`).
    pub user: Option<String>,
    /// Password (with `user`).
    pub password: Option<SecretString>,
    /// Authentication token.
    pub token: Option<SecretString>,
    /// A `.creds` file (JWT + nkey seed).
    pub creds_file: Option<PathBuf>,
    /// An nkey seed (`SU…`) for nkey authentication with NATS itself.
    pub nkey_seed: Option<SecretString>,
    /// PEM file of CA certificates to trust.
    pub tls_ca: Option<PathBuf>,
    /// PEM client certificate (with `tls_key`).
    pub tls_cert: Option<PathBuf>,
    /// PEM client key (with `tls_cert`).
    pub tls_key: Option<PathBuf>,
    /// Refuse to connect without TLS.
    pub require_tls: bool,
    /// Connection name shown by the server's monitoring.
    pub name: Option<String>,
    /// Prefix of this connection's inboxes instead of `_INBOX` (async-nats
    /// `custom_inbox_prefix`): replies to its requests and pushed messages arrive on
    /// `<prefix>.<random>…`. Where clients must not see each other's replies, NATS lets each
    /// user subscribe only to its own prefix (deploy/nats/accounts.conf: `_INBOX_CLIENT.<id>`),
    /// and the client must then connect with that prefix.
    pub inbox_prefix: Option<String>,
    /// How long without traffic from the server before a PING; `None`:
    /// [`DEFAULT_PING_INTERVAL`]. A silent server is left after 2–3 intervals.
    pub ping_interval: Option<Duration>,
}

/// Why connecting failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The options are inconsistent or a file cannot be read.
    #[error("invalid NATS options: {reason}")]
    Options {
        /// What is wrong, in words (the cause, if any, is the source).
        reason: String,
        /// What refused the option: the file system, the URL parser.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// NATS refused or could not be reached.
    #[error("cannot connect to NATS at {urls}")]
    Connect {
        /// The URLs tried.
        urls: String,
        /// The client's error.
        source: async_nats::ConnectError,
    },
}

impl ConnectError {
    fn options(reason: impl Into<String>) -> Self {
        ConnectError::Options {
            reason: reason.into(),
            source: None,
        }
    }

    fn options_caused(
        reason: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        ConnectError::Options {
            reason: reason.into(),
            source: Some(source.into()),
        }
    }
}

impl NatsOptions {
    /// Options for one server URL and nothing else.
    pub fn url(url: impl Into<String>) -> Self {
        NatsOptions {
            urls: vec![url.into()],
            ..Default::default()
        }
    }

    /// Connects. Reconnection is async-nats' default (retry forever with backoff).
    pub async fn connect(&self) -> Result<async_nats::Client, ConnectError> {
        if self.urls.is_empty() {
            return Err(ConnectError::options("no NATS server URL given"));
        }
        let mut opts = async_nats::ConnectOptions::new();
        match (&self.user, &self.password) {
            (Some(u), Some(p)) => {
                opts = opts.user_and_password(u.clone(), p.expose_secret().to_owned())
            }
            (None, None) => {}
            _ => return Err(ConnectError::options("user and password go together")),
        }
        if let Some(t) = &self.token {
            opts = opts.token(t.expose_secret().to_owned());
        }
        if let Some(path) = &self.creds_file {
            opts = opts.credentials_file(path).await.map_err(|e| {
                let reason = format!("cannot read creds file {}", path.display());
                ConnectError::options_caused(reason, e)
            })?;
        }
        if let Some(seed) = &self.nkey_seed {
            opts = opts.nkey(seed.expose_secret().to_owned());
        }
        if let Some(ca) = &self.tls_ca {
            opts = opts.add_root_certificates(ca.clone());
        }
        match (&self.tls_cert, &self.tls_key) {
            (Some(c), Some(k)) => opts = opts.add_client_certificate(c.clone(), k.clone()),
            (None, None) => {}
            _ => return Err(ConnectError::options("tls cert and key go together")),
        }
        if self.require_tls {
            opts = opts.require_tls(true);
        }
        if let Some(name) = &self.name {
            opts = opts.name(name.clone());
        }
        if let Some(prefix) = &self.inbox_prefix {
            check_inbox_prefix(prefix)?;
            opts = opts.custom_inbox_prefix(prefix);
        }
        let ping = self.ping_interval.unwrap_or(DEFAULT_PING_INTERVAL);
        if ping.is_zero() {
            return Err(ConnectError::options("the ping interval must be above 0"));
        }
        opts = opts.ping_interval(ping);
        // Every URL is a seed: the client tries them all, and learns the rest of the cluster.
        let addrs = self
            .urls
            .iter()
            .map(|u| {
                u.parse::<async_nats::ServerAddr>()
                    .map_err(|e| ConnectError::options_caused(format!("invalid NATS URL {u:?}"), e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let urls = self.urls.join(",");
        opts.connect(addrs)
            .await
            .map_err(|source| ConnectError::Connect { urls, source })
    }
}

/// An inbox prefix is one or more subject tokens: no wildcard, no empty token, no whitespace.
fn check_inbox_prefix(prefix: &str) -> Result<(), ConnectError> {
    let ok = !prefix.is_empty()
        && prefix.split('.').all(|t| {
            !t.is_empty() && t != "*" && t != ">" && !t.contains(|c: char| c.is_whitespace())
        });
    if ok {
        Ok(())
    } else {
        Err(ConnectError::options(format!(
            "invalid inbox prefix {prefix:?}: use subject tokens without wildcards, such as _INBOX_CLIENT.shop"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    #[test]
    fn debug_shows_no_secret() {
        let opts = NatsOptions {
            user: Some("app".into()),
            password: Some("pw-1234".into()),
            token: Some("tok-5678".into()),
            nkey_seed: Some("SUAIBDPBAUTWCWBKIO6XHQNINK5FWJW4OHLXC3HQ2KFE4PEJUA44CNHTC4".into()),
            ..NatsOptions::url(DEFAULT_URL)
        };
        let shown = format!("{opts:?}");
        assert!(
            shown.contains("app") && shown.contains(DEFAULT_URL),
            "{shown}"
        );
        for secret in ["pw-1234", "tok-5678", "SUAIB"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
    }

    #[tokio::test]
    async fn every_url_is_a_seed_and_bad_urls_are_named() {
        let server = msgtrail_devkit::NatsServer::start().unwrap();
        // The first seed is dead; the client moves on to the second.
        let opts = NatsOptions {
            urls: vec!["nats://127.0.0.1:1".into(), server.url().into()],
            ..Default::default()
        };
        let client = opts
            .connect()
            .await
            .expect("connects through the second seed");
        client.flush().await.unwrap();
        let bad = NatsOptions::url("nats://[not a url");
        let err = bad.connect().await.unwrap_err().to_string();
        assert!(err.contains("invalid NATS URL"), "{err}");
    }

    fn signal(pid: u32, sig: &str) {
        let ok = std::process::Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .expect("runs kill")
            .success();
        assert!(ok, "kill {sig} {pid}");
    }

    /// A frozen server (SIGSTOP: the socket stays open, nothing answers) is left within 2–3
    /// ping intervals, and the connection comes back once the server answers again.
    #[tokio::test]
    async fn a_silent_server_is_left_after_its_pings_go_unanswered() {
        let server = msgtrail_devkit::NatsServer::start().unwrap();
        let interval = Duration::from_millis(300);
        let opts = NatsOptions {
            ping_interval: Some(interval),
            ..NatsOptions::url(server.url())
        };
        let client = opts.connect().await.expect("connects");
        client.flush().await.unwrap();
        signal(server.pid(), "-STOP");
        let stopped = std::time::Instant::now();
        let connected = || {
            matches!(
                client.connection_state(),
                async_nats::connection::State::Connected
            )
        };
        while connected() && stopped.elapsed() < Duration::from_secs(10) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let left_after = stopped.elapsed();
        signal(server.pid(), "-CONT");
        assert!(!connected(), "still connected 10 s after the server froze");
        assert!(
            left_after >= interval * 2 && left_after <= interval * 3 + Duration::from_millis(700),
            "left after {left_after:?} with a {interval:?} ping interval"
        );
        let back = std::time::Instant::now();
        while !connected() && back.elapsed() < Duration::from_secs(10) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(connected(), "reconnects once the server answers");
        let zero = NatsOptions {
            ping_interval: Some(Duration::ZERO),
            ..NatsOptions::url(server.url())
        };
        let err = zero.connect().await.unwrap_err().to_string();
        assert!(err.contains("ping interval"), "{err}");
    }

    #[tokio::test]
    async fn inbox_prefix_is_applied_and_checked() {
        let server = msgtrail_devkit::NatsServer::start().unwrap();
        let opts = NatsOptions {
            inbox_prefix: Some("_INBOX_CLIENT.shop".into()),
            ..NatsOptions::url(server.url())
        };
        let client = opts.connect().await.expect("connects");
        // new_inbox is what push subscriptions use; requests build their reply subject on it.
        assert!(client.new_inbox().starts_with("_INBOX_CLIENT.shop."));
        let echo = client.clone();
        let mut sub = echo.subscribe("echo").await.unwrap();
        let responder = tokio::spawn(async move {
            let m = sub.next().await.unwrap();
            let reply = m.reply.unwrap();
            echo.publish(reply.clone(), "pong".into()).await.unwrap();
            reply
        });
        client.flush().await.unwrap();
        let pong = client.request("echo", "ping".into()).await.unwrap();
        assert_eq!(&pong.payload[..], b"pong");
        let reply = responder.await.unwrap();
        assert!(reply.starts_with("_INBOX_CLIENT.shop."), "{reply}");
        for bad in ["", "_INBOX.>", "a..b", "a.*", "has space", "trailing."] {
            let opts = NatsOptions {
                inbox_prefix: Some(bad.into()),
                ..NatsOptions::url(server.url())
            };
            let err = opts.connect().await.unwrap_err().to_string();
            assert!(err.contains("invalid inbox prefix"), "{bad:?}: {err}");
        }
    }
}
