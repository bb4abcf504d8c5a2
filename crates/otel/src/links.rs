//! Links to a message's trace in a tracing UI, for `msgtrail trace` and the listener's page.
//!
//! The trace ID is the message ID without dashes, so a link needs only the UI's base URL:
//!
//! | UI | base URL (example) | link |
//! | --- | --- | --- |
//! | Jaeger | `http://localhost:16686` | `{base}/trace/{trace-id}` |
//! | Grafana (Tempo datasource) | `http://localhost:3000` | Explore with the trace ID as the TraceQL query on datasource `tempo` |
//!
//! | any | a URL template: `http://jaeger:16686/trace/{trace_id}` | the template with `{trace_id}` (and `{span_id}`) filled in |
//!
//! [`ENV_TRACE_UI`] holds the base URL or a template, [`ENV_TRACE_UI_KIND`] `jaeger` (default)
//! or `grafana`/`tempo` (and [`ENV_GRAFANA_DATASOURCE`] the Tempo datasource UID, `tempo` by
//! default, as provisioned in deploy/). A value holding `{trace_id}` (or its percent-encoded
//! form `%7Btrace_id%7D`, as in a Grafana Explore URL copied from the address bar) is a
//! template whatever the kind: the trace ID goes where `{trace_id}` is, a span ID where
//! `{span_id}` is.
//!
//! A span's link opens its trace with that span selected: Jaeger's `?uiFind=<span>`,
//! Grafana's `panelsState.trace.spanId`, a template's `{span_id}` (without `{span_id}` a
//! template's span link is its trace link).

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
    /// A URL template holding `{trace_id}` and perhaps `{span_id}` (each perhaps
    /// percent-encoded, `%7Btrace_id%7D`).
    Template {
        /// The template, such as `http://jaeger:16686/trace/{trace_id}`.
        url: String,
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
        if slot_in(&base, TRACE_SLOT) {
            return Some(TraceUi::Template { url: base });
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
        self.link_to(trace_hex, None)
    }

    /// The link to one span (16 hex digits) of the trace with this hex trace ID: its trace
    /// with the span selected.
    pub fn span_link_hex(&self, trace_hex: &str, span_hex: &str) -> String {
        self.link_to(trace_hex, Some(span_hex))
    }

    fn link_to(&self, trace_hex: &str, span_hex: Option<&str>) -> String {
        match self {
            TraceUi::Jaeger { base } => match span_hex {
                None => format!("{base}/trace/{trace_hex}"),
                Some(span) => format!("{base}/trace/{trace_hex}?uiFind={span}"),
            },
            TraceUi::Template { url } => {
                let url = fill(url, TRACE_SLOT, trace_hex);
                fill(&url, SPAN_SLOT, span_hex.unwrap_or(""))
            }
            TraceUi::Grafana {
                base,
                datasource_uid,
            } => {
                let panels = span_hex
                    .map(|s| format!(r#","panelsState":{{"trace":{{"spanId":"{s}"}}}}"#))
                    .unwrap_or_default();
                let panes = format!(
                    r#"{{"a":{{"datasource":"{datasource_uid}","queries":[{{"refId":"A","datasource":{{"type":"tempo","uid":"{datasource_uid}"}},"queryType":"traceql","query":"{trace_hex}"}}],"range":{{"from":"now-24h","to":"now"}}{panels}}}}}"#
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

/// A template's trace ID slot.
const TRACE_SLOT: &str = "trace_id";
/// A template's span ID slot.
const SPAN_SLOT: &str = "span_id";

/// The two spellings of a slot: `{name}` and its percent-encoding `%7Bname%7D`.
fn spellings(name: &str) -> [String; 2] {
    [format!("{{{name}}}"), format!("%7B{name}%7D")]
}

/// Whether the template holds the slot, in either spelling (`%7b` too).
fn slot_in(template: &str, name: &str) -> bool {
    let t = template.replace("%7b", "%7B").replace("%7d", "%7D");
    spellings(name).iter().any(|s| t.contains(s.as_str()))
}

/// The template with every spelling of the slot replaced by `value`.
fn fill(template: &str, name: &str, value: &str) -> String {
    let mut out = template.replace("%7b", "%7B").replace("%7d", "%7D");
    for s in spellings(name) {
        out = out.replace(s.as_str(), value);
    }
    out
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
        let span = g.span_link_hex(&id.trace_hex(), "00f067aa0ba902b7");
        assert!(span.contains("panelsState") && span.contains("00f067aa0ba902b7"));
        assert_eq!(
            j.span_link_hex(&id.trace_hex(), "00f067aa0ba902b7"),
            "http://localhost:16686/trace/0193a5f27c1e7b2a9f103c4d5e6f7a8b?uiFind=00f067aa0ba902b7"
        );
    }

    /// A value holding `{trace_id}` is a template: filled in, never appended to (it read
    /// `…/trace/<id>/trace/%7Btrace_id%7D` before).
    #[test]
    fn a_url_template_is_filled_in() {
        let id: MessageId = "0193a5f2-7c1e-7b2a-9f10-3c4d5e6f7a8b".parse().unwrap();
        let hex = id.trace_hex();
        let ui = |url: &str, kind: Option<&str>| {
            let (url, kind) = (url.to_owned(), kind.map(str::to_owned));
            TraceUi::from_lookup(move |k| match k {
                ENV_TRACE_UI => Some(url.clone()),
                ENV_TRACE_UI_KIND => kind.clone(),
                _ => None,
            })
            .unwrap()
        };
        let j = ui("http://jaeger:16686/trace/{trace_id}", None);
        assert_eq!(j.link(&id), format!("http://jaeger:16686/trace/{hex}"));
        assert_eq!(
            j.span_link_hex(&hex, "00f067aa0ba902b7"),
            format!("http://jaeger:16686/trace/{hex}"),
            "no {{span_id}} slot: the trace's link"
        );
        let j = ui(
            "http://jaeger:16686/trace/{trace_id}?uiFind={span_id}",
            Some("grafana"),
        );
        assert_eq!(
            j.span_link_hex(&hex, "00f067aa0ba902b7"),
            format!("http://jaeger:16686/trace/{hex}?uiFind=00f067aa0ba902b7")
        );
        // Grafana's Explore URL as its address bar shows it: the slot percent-encoded.
        let tempo = ui(
            "http://grafana:3000/explore?panes=%7B%22a%22:%7B%22queries%22:%5B%7B%22query%22:%22%7Btrace_id%7D%22%7D%5D%7D%7D",
            Some("tempo"),
        );
        let link = tempo.link(&id);
        assert!(link.contains(&format!("%22{hex}%22")), "{link}");
        assert!(!link.contains("trace_id"), "{link}");
    }
}
