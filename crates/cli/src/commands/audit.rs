//! `msgtrail audit [--since-secs N] [--json]`: checks every trajectory the listener holds
//! from the last N seconds against what a trajectory must never show
//! ([`Trajectory::audit`](msgtrail_core::trajectory::Trajectory::audit)): a hop ending
//! before it starts, a delivery before the message was deliverable, a state moving back,
//! two hops sharing a span ID, a hop whose four NTP timestamps were all reported but that
//! has no clock bound. Exits non-zero when any is found, so a script can run it after a
//! load (`scripts/demo-audit.sh` does, after `msgtrail dev --demo`).

use super::trace::ListenerArgs;
use anyhow::Context;
use clap::Args as ClapArgs;
use msgtrail_listener::MessageSummary;
use msgtrail_listener_client::encode;
use serde::Serialize;
use std::collections::BTreeMap;

/// Options of `msgtrail audit`.
#[derive(Debug, ClapArgs)]
pub(crate) struct Args {
    /// Check the messages whose first record is at most this many seconds old.
    #[arg(long, default_value_t = 3600)]
    pub since_secs: u64,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Where the listener is.
    #[command(flatten)]
    pub listener: ListenerArgs,
}

/// What the audit found.
#[derive(Debug, Default, Serialize)]
pub(crate) struct AuditFindings {
    /// Trajectories checked.
    pub checked: u64,
    /// Hops in them.
    pub hops: u64,
    /// Hops carrying a clock bound.
    pub hops_with_clock_bound: u64,
    /// Trajectories that could not be read (vanished to retention, or an error).
    pub unreadable: u64,
    /// Violations by kind (the words before the first detail).
    pub violations: BTreeMap<String, u64>,
    /// Up to 20 examples: message key and what is wrong.
    pub examples: Vec<(String, String)>,
}

/// How many summaries one page of the search asks for (the API's most).
const PAGE: usize = 10_000;

/// Runs the audit; errs (non-zero exit) when a violation was found.
pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    let client = args.listener.client()?;
    let messages = list(&client, args.since_secs).await?;
    let mut report = AuditFindings::default();
    for s in messages {
        // An orphan upload (no message ID) is looked up by its producer's request ID.
        let (id, producer) = match (&s.message_id, &s.request_id) {
            (Some(m), _) => (m.to_string(), None),
            (None, Some(q)) => (
                q.as_str().to_owned(),
                s.producer.as_ref().map(|p| p.as_str()),
            ),
            (None, None) => (s.key.clone(), None),
        };
        let key = s.key.clone();
        let t = match client.trajectory(&id, producer).await {
            Ok(t) => t,
            Err(e) if e.is_not_found() => {
                report.unreadable += 1;
                continue;
            }
            Err(e) => return Err(e).context(format!("reading the trajectory of {key}")),
        };
        report.checked += 1;
        report.hops += t.hops.len() as u64;
        report.hops_with_clock_bound += t.hops.iter().filter(|h| h.clock.is_some()).count() as u64;
        for v in t.audit() {
            *report.violations.entry(kind_of(&v)).or_default() += 1;
            if report.examples.len() < 20 {
                report.examples.push((key.clone(), v));
            }
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report));
    }
    let found: u64 = report.violations.values().sum();
    anyhow::ensure!(
        found == 0,
        "{found} violations in {} trajectories",
        report.checked
    );
    Ok(())
}

/// Every message of the last `since_secs` seconds, page by page (each page ends where the
/// previous one's oldest first record was), each once.
async fn list(
    client: &msgtrail_listener_client::ListenerClient,
    since_secs: u64,
) -> anyhow::Result<Vec<MessageSummary>> {
    let mut all: BTreeMap<String, MessageSummary> = BTreeMap::new();
    let mut to: Option<u64> = None;
    loop {
        let mut q = format!("since_secs={since_secs}&limit={PAGE}");
        if let Some(t) = to {
            q.push_str(&format!("&to={}", encode(&t.to_string())));
        }
        let page: Vec<MessageSummary> = client.search(&q).await.context("listing messages")?;
        let full = page.len() >= PAGE;
        let oldest = page.iter().map(|s| s.first_at).min();
        all.extend(page.into_iter().map(|s| (s.key.clone(), s)));
        match (full, oldest) {
            // `to` is exclusive: messages sharing the oldest time of a full page are read
            // again on the next one, and deduplicated below.
            (true, Some(o)) if Some(o) != to => to = Some(o + 1),
            _ => break,
        }
    }
    Ok(all.into_values().collect())
}

/// The kind of a violation: its words without the hop key or state named in it.
fn kind_of(v: &str) -> String {
    if v.contains("ends before it starts") {
        "hop ends before it starts".into()
    } else if v.contains("before the message was deliverable") {
        "delivery before deliverable".into()
    } else if v.contains("share span ID") {
        "span ID collision".into()
    } else if v.contains("no clock bound") {
        "hop without clock bound".into()
    } else {
        "state regression".into()
    }
}

/// The report in words.
pub(crate) fn render(r: &AuditFindings) -> String {
    let mut o = format!(
        "checked {} trajectories ({} hops, {} with a clock bound); {} unreadable\n",
        r.checked, r.hops, r.hops_with_clock_bound, r.unreadable
    );
    if r.violations.is_empty() {
        o.push_str("no violations: no state regression, no hop ending before it starts, no delivery before deliverable, no span-ID collision, a clock bound wherever both sides reported\n");
    }
    for (kind, n) in &r.violations {
        o.push_str(&format!("{n:>8}  {kind}\n"));
    }
    for (key, v) in &r.examples {
        o.push_str(&format!("  {key}: {v}\n"));
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_rendering() {
        assert_eq!(
            kind_of("hop store ends before it starts"),
            "hop ends before it starts"
        );
        assert_eq!(
            kind_of("group g moved back to delivered"),
            "state regression"
        );
        let mut r = AuditFindings {
            checked: 2,
            hops: 8,
            hops_with_clock_bound: 4,
            ..Default::default()
        };
        assert!(render(&r).contains("no violations"));
        r.violations.insert("span ID collision".into(), 1);
        r.examples
            .push(("m".into(), "hops a and b share span ID x".into()));
        let text = render(&r);
        assert!(text.contains("1  span ID collision") && text.contains("m: hops a and b"));
    }
}
