//! Options shared by every command: how to reach NATS, and who the client is.

use anyhow::{bail, Context};
use clap::Args;
use msgtrail_client::{Identity, NatsOptions};
use msgtrail_core::ClientId;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Environment variable of the dev identity file's location.
pub(crate) const DEV_FILE_ENV: &str = "MSGTRAIL_DEV_FILE";

/// NATS connection options.
#[derive(Debug, Clone, Args)]
pub(crate) struct NatsArgs {
    /// NATS server URL(s), comma-separated. Defaults to the dev system's, then
    /// nats://127.0.0.1:4222 (`msgtrail_nats::DEFAULT_URL`).
    #[arg(long, env = "NATS_URL", global = true)]
    pub nats_url: Option<String>,
    /// NATS user (with --nats-password).
    #[arg(long, env = "NATS_USER", global = true)]
    pub nats_user: Option<String>,
    /// NATS password.
    #[arg(long, env = "NATS_PASSWORD", global = true, hide_env_values = true)]
    pub nats_password: Option<String>,
    /// NATS token.
    #[arg(long, env = "NATS_TOKEN", global = true, hide_env_values = true)]
    pub nats_token: Option<String>,
    /// NATS credentials file (.creds).
    #[arg(long, env = "NATS_CREDS", global = true)]
    pub nats_creds: Option<PathBuf>,
    /// NATS nkey seed file (for NATS' own nkey auth).
    #[arg(long, env = "NATS_NKEY", global = true)]
    pub nats_nkey: Option<PathBuf>,
    /// PEM CA file to trust for TLS.
    #[arg(long, env = "NATS_CA", global = true)]
    pub tls_ca: Option<PathBuf>,
    /// PEM client certificate for TLS.
    #[arg(long, env = "NATS_CERT", global = true)]
    pub tls_cert: Option<PathBuf>,
    /// PEM client key for TLS.
    #[arg(long, env = "NATS_KEY", global = true)]
    pub tls_key: Option<PathBuf>,
    /// Inbox prefix of the connection instead of _INBOX: replies and pushed messages arrive
    /// under it. Required where the NATS user may subscribe only to its own prefix, such as
    /// `_INBOX_CLIENT.<id>` in deploy/nats/accounts.conf.
    #[arg(long, env = "NATS_INBOX_PREFIX", global = true)]
    pub inbox_prefix: Option<String>,
    /// How long without traffic from NATS before the connection sends a PING; a server that
    /// stops answering (frozen, or cut off by the network) is left after 2–3 intervals and
    /// another cluster URL is tried. Default 2 s (`msgtrail_nats::DEFAULT_PING_INTERVAL`).
    #[arg(long, env = "NATS_PING_INTERVAL", global = true, value_parser = duration_arg)]
    pub nats_ping_interval: Option<humantime::Duration>,
}

impl NatsArgs {
    /// The connection options, falling back to the dev system's URL.
    pub(crate) fn options(&self) -> anyhow::Result<NatsOptions> {
        let url = match &self.nats_url {
            Some(u) => u.clone(),
            None => DevFile::load()
                .ok()
                .map(|d| d.nats_url)
                .unwrap_or_else(|| msgtrail_nats::DEFAULT_URL.into()),
        };
        let nkey_seed = match &self.nats_nkey {
            Some(p) => Some(
                std::fs::read_to_string(p)
                    .with_context(|| format!("reading nkey seed {}", p.display()))?
                    .trim()
                    .into(),
            ),
            None => None,
        };
        Ok(NatsOptions {
            urls: url
                .split(',')
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect(),
            user: self.nats_user.clone(),
            password: self.nats_password.as_deref().map(Into::into),
            token: self.nats_token.as_deref().map(Into::into),
            creds_file: self.nats_creds.clone(),
            nkey_seed,
            tls_ca: self.tls_ca.clone(),
            tls_cert: self.tls_cert.clone(),
            tls_key: self.tls_key.clone(),
            require_tls: false,
            name: Some("msgtrail".into()),
            inbox_prefix: self
                .inbox_prefix
                .as_deref()
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(str::to_owned),
            ping_interval: self.nats_ping_interval.map(Into::into),
        })
    }
}

/// Who the client is.
#[derive(Debug, Clone, Args)]
pub(crate) struct IdentityArgs {
    /// Client ID configured on the broker. Defaults to the dev system's identity.
    #[arg(long, env = "MSGTRAIL_CLIENT_ID")]
    pub client_id: Option<String>,
    /// File holding the client's nkey seed (SU…).
    #[arg(long, env = "MSGTRAIL_SEED_FILE")]
    pub seed_file: Option<PathBuf>,
    /// The client's OpenTelemetry service.name.
    #[arg(long, env = "MSGTRAIL_SERVICE_NAME")]
    pub service_name: Option<String>,
}

impl IdentityArgs {
    /// The identity; `dev_role` picks the dev identity when none is given.
    pub(crate) fn identity(&self, dev_producer: bool) -> anyhow::Result<Identity> {
        let identity = match (&self.client_id, &self.seed_file) {
            (Some(id), Some(path)) => {
                let seed = std::fs::read_to_string(path)
                    .with_context(|| format!("reading seed file {}", path.display()))?;
                Identity::from_seed(ClientId::new(id.as_str())?, &seed)?
            }
            (None, None) => {
                let dev = DevFile::load().context(
                    "no identity given (--client-id and --seed-file) and no dev system found: start one with `msgtrail dev`",
                )?;
                let who = if dev_producer {
                    dev.producer
                } else {
                    dev.consumer
                };
                Identity::from_seed(ClientId::new(who.id.as_str())?, &who.seed)?
            }
            _ => bail!("--client-id and --seed-file go together"),
        };
        Ok(match &self.service_name {
            Some(s) => identity.with_service_name(s.clone()),
            None => identity,
        })
    }
}

/// One dev identity.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct DevIdentity {
    /// Client ID.
    pub id: String,
    /// nkey seed.
    pub seed: String,
}

/// What `msgtrail dev` writes so that the other commands work with no setup.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct DevFile {
    /// The dev nats-server's URL.
    pub nats_url: String,
    /// The dev producer.
    pub producer: DevIdentity,
    /// The dev consumer.
    pub consumer: DevIdentity,
    /// The dev listener's HTTP address, if one runs.
    #[serde(default)]
    pub listener_url: Option<String>,
}

impl DevFile {
    /// Where the dev file lives: `$MSGTRAIL_DEV_FILE`, else
    /// `$XDG_CONFIG_HOME/msgtrail/dev.json`, else `~/.config/msgtrail/dev.json`.
    pub(crate) fn path() -> PathBuf {
        if let Some(p) = std::env::var_os(DEV_FILE_ENV) {
            return PathBuf::from(p);
        }
        let base = std::env::var_os("XDG_CONFIG_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
            .unwrap_or_else(|| PathBuf::from("."));
        base.join("msgtrail").join("dev.json")
    }

    /// Reads the dev file.
    pub(crate) fn load() -> anyhow::Result<DevFile> {
        let path = Self::path();
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
    }

    /// Writes the dev file (mode 0600: it holds seeds).
    #[cfg(feature = "dev")]
    pub(crate) fn save(&self) -> anyhow::Result<PathBuf> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = Self::path();
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)?;
        std::io::Write::write_all(&mut f, serde_json::to_string_pretty(self)?.as_bytes())?;
        Ok(path)
    }
}

/// Parses `k=v`.
pub(crate) fn parse_kv(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.trim().to_owned(), v.to_owned()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| format!("expected key=value, got {s:?}"))
}

/// Units humantime knows but the CLI refuses: a month or a year has no fixed length.
const VAGUE_UNITS: &[&str] = &["M", "month", "months", "y", "year", "years"];

/// Parses a duration in humantime's grammar (`500ms`, `30s`, `5m`, `12h`, `7d`, `1h 30m`;
/// a bare number is seconds), up to days and weeks. Every duration option of every command
/// goes through it, and shows its default in the same grammar.
pub(crate) fn duration_arg(s: &str) -> Result<humantime::Duration, String> {
    let s = s.trim();
    if let Ok(secs) = s.parse::<u64>() {
        return Ok(std::time::Duration::from_secs(secs).into());
    }
    let vague = s
        .split(|c: char| !c.is_ascii_alphabetic())
        .find(|unit| VAGUE_UNITS.contains(unit));
    if let Some(unit) = vague {
        return Err(format!(
            "invalid duration {s:?}: {unit:?} has no fixed length; use ms, s, m, h, d or w"
        ));
    }
    s.parse::<humantime::Duration>()
        .map_err(|e| format!("invalid duration {s:?}: {e} (use e.g. 500ms, 30s, 5m, 12h, 7d)"))
}

/// [`duration_arg`] as a plain `Duration`.
pub(crate) fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    duration_arg(s).map(Into::into)
}

/// Parses a size: `500`, `64KiB`, `100MiB`, `2GiB` (also KB/MB/GB as powers of 1000), in
/// bytesize's grammar, which is also how the defaults are shown.
pub(crate) fn size_arg(s: &str) -> Result<bytesize::ByteSize, String> {
    s.trim()
        .parse::<bytesize::ByteSize>()
        .map_err(|e| format!("invalid size {s:?}: {e} (use e.g. 500MiB or 2GiB)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_durations_and_pairs() {
        assert_eq!(parse_duration("500ms").unwrap().as_millis(), 500);
        assert_eq!(parse_duration("5s").unwrap().as_secs(), 5);
        assert_eq!(parse_duration("2m").unwrap().as_secs(), 120);
        assert_eq!(parse_duration("5h").unwrap().as_secs(), 5 * 3600);
        assert!(parse_duration("x").is_err());
        assert_eq!(
            parse_kv("category=refund").unwrap(),
            ("category".into(), "refund".into())
        );
        assert!(parse_kv("novalue").is_err());
    }
}
