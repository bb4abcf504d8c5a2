//! Links to a message's trace in a tracing UI, for `msgtrail trace` and the listener's page.
//!
//! The trace ID is the message ID without dashes, so a link needs only the UI's base URL:
//!
//! | UI | base URL (example) | link |
//! | --- | --- | --- |
//! | Jaeger | `http://localhost:16686` | `{base}/trace/{trace-id}` |
//! | Grafana (Tempo datasource) | `http://localhost:3000` | Explore with the trace ID as the TraceQL query on datasource `tempo` |
//!
//! [`ENV_TRACE_UI`] holds the base URL, [`ENV_TRACE_UI_KIND`] `jaeger` (default) or `grafana`
//! (and [`ENV_GRAFANA_DATASOURCE`] the Tempo datasource UID, `tempo` by default, as
//! provisioned in deploy/).

use msgtrail_core::MessageId;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

/// Base URL of the tracing UI.
pub(crate) const ENV_TRACE_UI: &str = "MSGTRAIL_TRACE_UI_URL";
/// `jaeger` or `grafana`.
pub(crate) const ENV_TRACE_UI_KIND: &str = "MSGTRAIL_TRACE_UI_KIND";
/// UID of Grafana's Tempo datasource.
pub(crate) const ENV_GRAFANA_DATASOURCE: &str = "MSGTRAIL_GRAFANA_TEMPO_UID";

/// Which UI a link opens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TraceUi {
    /// Jaeger's UI.
    Jaeger {
        /// Base URL, such as `http://localhost:16686`.
        base: String,
    },
    /// Grafana's Explore on a Tempo datasource.
    Grafana {
        /// Base URL, such as `http://localhost:3000`.
        base: String,
        /// The Tempo datasource UID.
        datasource_uid: String,
    },
}

impl TraceUi {
    /// The UI configured in the environment, if `ENV_TRACE_UI` is set.
    pub fn from_env() -> Option<Self> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Like [`TraceUi::from_env`], reading variables through `get`.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Option<Self> {
        let base = get(ENV_TRACE_UI)?.trim().trim_end_matches('/').to_owned();
        if base.is_empty() {
            return None;
        }
        Some(match get(ENV_TRACE_UI_KIND).as_deref().map(str::trim) {
            Some("grafana") | Some("tempo") => TraceUi::Grafana {
                base,
                datasource_uid: get(ENV_GRAFANA_DATASOURCE).unwrap_or_else(|| "tempo".into()),
            },
            _ => TraceUi::Jaeger { base },
        })
    }

    /// The link to the trace with this hex trace ID.
    pub fn link_hex(&self, trace_hex: &str) -> String {
        match self {
            TraceUi::Jaeger { base } => format!("{base}/trace/{trace_hex}"),
            TraceUi::Grafana {
                base,
                datasource_uid,
            } => {
                let panes = format!(
                    r#"{{"a":{{"datasource":"{datasource_uid}","queries":[{{"refId":"A","datasource":{{"type":"tempo","uid":"{datasource_uid}"}},"queryType":"traceql","query":"{trace_hex}"}}],"range":{{"from":"now-24h","to":"now"}}}}}}"#
                );
                format!(
                    "{base}/explore?schemaVersion=1&panes={}",
                    percent_encode(&panes)
                )
            }
        }
    }

    /// The link to a message's trace.
    pub fn link(&self, message_id: &MessageId) -> String {
        self.link_hex(&message_id.trace_hex())
    }
}

/// Everything but RFC 3986 unreserved characters (`A-Z a-z 0-9 - . _ ~`).
const NOT_UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Percent-encodes everything but RFC 3986 unreserved characters.
fn percent_encode(s: &str) -> String {
    utf8_percent_encode(s, NOT_UNRESERVED).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jaeger_and_grafana_links() {
        let id: MessageId = "0193a5f2-7c1e-7b2a-9f10-3c4d5e6f7a8b".parse().unwrap();
        let j = TraceUi::from_lookup(|k| {
            (k == ENV_TRACE_UI).then(|| "http://localhost:16686/".to_owned())
        })
        .unwrap();
        assert_eq!(
            j.link(&id),
            "http://localhost:16686/trace/0193a5f27c1e7b2a9f103c4d5e6f7a8b"
        );
        let g = TraceUi::from_lookup(|k| match k {
            ENV_TRACE_UI => Some("http://localhost:3000".into()),
            ENV_TRACE_UI_KIND => Some("grafana".into()),
            _ => None,
        })
        .unwrap();
        let link = g.link(&id);
        assert!(link.starts_with("http://localhost:3000/explore?schemaVersion=1&panes=%7B%22a%22"));
        assert!(link.contains("0193a5f27c1e7b2a9f103c4d5e6f7a8b"));
        assert!(!link.contains('"') && !link.contains(' '));
        assert_eq!(TraceUi::from_lookup(|_| None), None);
    }
}
