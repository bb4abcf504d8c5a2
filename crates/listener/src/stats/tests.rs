use super::*;
use std::io;

fn stats_with(latencies: Vec<(String, Segment, u64, Option<MessageId>)>) -> Stats {
    let s = Stats::new(Duration::from_secs(60), 1, BTreeMap::new(), BTreeMap::new());
    let outcome = ApplyOutcome {
        latencies,
        ..Default::default()
    };
    s.record_batch(1, &outcome, 2_000_000_000);
    s
}

fn render(s: &Stats, format: Exposition) -> String {
    let mut r = Registry::default();
    s.register_metrics(&mut r, 3_000_000_000);
    format.encode(&r).unwrap()
}

#[test]
fn openmetrics_buckets_carry_the_last_sample_s_trace_id() {
    let (a, b) = (MessageId::new(), MessageId::new());
    let s = stats_with(vec![
        ("orders".into(), Segment::EndToEnd, 3_000_000, Some(a)),
        ("orders".into(), Segment::EndToEnd, 4_000_000, Some(b)),
        ("orders".into(), Segment::EndToEnd, 40_000_000_000, None),
    ]);
    let text = render(&s, Exposition::OpenMetrics);
    let bucket = |le: &str| {
        let head =
            format!("msgtrail_hop_latency_seconds_bucket{{le=\"{le}\",topic=\"orders\",segment=\"end_to_end\"}}");
        text.lines()
            .find(|l| l.starts_with(&head))
            .unwrap_or_else(|| panic!("no {head} in {text}"))
            .to_owned()
    };
    // 3 ms and 4 ms fall in (2.5 ms, 5 ms]: the later one is the exemplar.
    assert_eq!(
        bucket("0.005"),
        format!(
            "msgtrail_hop_latency_seconds_bucket{{le=\"0.005\",topic=\"orders\",segment=\"end_to_end\"}} 2 # {{trace_id=\"{}\"}} 0.004 2.0",
            b.trace_hex()
        )
    );
    // A sample without a message ID counts and leaves no exemplar.
    assert_eq!(
        bucket("60.0"),
        "msgtrail_hop_latency_seconds_bucket{le=\"60.0\",topic=\"orders\",segment=\"end_to_end\"} 3"
    );
    assert!(
        text.contains("# TYPE msgtrail_hop_latency_seconds histogram\n"),
        "{text}"
    );
    assert!(
        text.contains("# UNIT msgtrail_hop_latency_seconds seconds\n"),
        "{text}"
    );
    assert!(text.ends_with("# EOF\n"), "{text}");
}

#[test]
fn prometheus_text_keeps_the_names_and_has_no_exemplars() {
    let s = stats_with(vec![(
        "orders".into(),
        Segment::EndToEnd,
        3_000_000,
        Some(MessageId::new()),
    )]);
    let text = render(&s, Exposition::Prometheus);
    for line in [
        "# TYPE msgtrail_hop_latency_seconds histogram\n",
        "msgtrail_hop_latency_seconds_count{topic=\"orders\",segment=\"end_to_end\"} 1\n",
        "msgtrail_funnel_messages_total{step=\"acked\"} 0\n",
        "# TYPE msgtrail_listener_decode_errors_total counter\n",
        "msgtrail_listener_decode_errors_total 0\n",
        "msgtrail_listener_pending_messages 0\n",
        "msgtrail_messages{state=\"consumed\"} 0\n",
    ] {
        assert!(text.contains(line), "{line:?} missing from {text}");
    }
    assert!(!text.contains("trace_id"), "{text}");
    assert!(!text.contains("# EOF"), "{text}");
}

#[test]
fn openmetrics_only_when_asked_for() {
    use Exposition::*;
    let prometheus_2 = "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
    assert_eq!(Exposition::negotiate(Some(prometheus_2)), OpenMetrics);
    assert_eq!(
        Exposition::negotiate(Some("application/openmetrics-text")),
        OpenMetrics
    );
    assert_eq!(Exposition::negotiate(None), Prometheus);
    assert_eq!(Exposition::negotiate(Some("*/*")), Prometheus);
    assert_eq!(Exposition::negotiate(Some("application/json")), Prometheus);
    assert_eq!(
        Exposition::negotiate(Some("text/plain, application/openmetrics-text;q=0.5")),
        Prometheus
    );
    assert_eq!(
        Exposition::negotiate(Some("application/openmetrics-text;q=0")),
        Prometheus
    );
}

const SEC: u64 = 1_000_000_000;

fn latency(topic: &str, millis: u64) -> (String, Segment, u64, Option<MessageId>) {
    (topic.into(), Segment::EndToEnd, millis * 1_000_000, None)
}

fn record(s: &Stats, at: u64, latencies: Vec<(String, Segment, u64, Option<MessageId>)>) {
    let outcome = ApplyOutcome {
        latencies,
        ..Default::default()
    };
    s.record_batch(1, &outcome, at);
}

#[test]
fn the_window_forgets_old_samples_and_the_total_keeps_them() {
    let s = Stats::new(Duration::from_secs(60), 0, BTreeMap::new(), BTreeMap::new());
    record(&s, 10 * SEC, vec![latency("orders", 5)]);
    let row = s.snapshot(None, 20 * SEC).latency.remove(0);
    assert_eq!((row.window.count, row.total.count), (1, 1));
    // Two significant digits: within 1 % of 5 ms.
    assert!((row.window.p50_ms - 5.0).abs() < 0.05, "{row:?}");
    assert!((row.window.max_ms - 5.0).abs() < 0.05, "{row:?}");
    // The window is 60 s in 5 slots of 12 s: the sample's slot (0 to 12 s) is gone once
    // the current slot is 5 slots later.
    let row = s.snapshot(None, 59 * SEC).latency.remove(0);
    assert_eq!(row.window.count, 1, "still inside the window at 59 s");
    let row = s.snapshot(None, 61 * SEC).latency.remove(0);
    assert_eq!((row.window.count, row.total.count), (0, 1), "{row:?}");
}

#[test]
fn rates_divide_by_the_window_or_the_uptime_when_shorter() {
    let s = Stats::new(Duration::from_secs(60), 0, BTreeMap::new(), BTreeMap::new());
    record(&s, SEC, (0..10).map(|_| latency("orders", 2)).collect());
    let row = s.snapshot(None, 5 * SEC).latency.remove(0);
    assert!((row.window.rate_per_sec - 2.0).abs() < 1e-9, "{row:?}");
    assert!((row.total.rate_per_sec - 2.0).abs() < 1e-9, "{row:?}");
    let row = s.snapshot(None, 50 * SEC).latency.remove(0);
    assert!((row.window.rate_per_sec - 0.2).abs() < 1e-9, "{row:?}");
}

#[test]
fn state_changes_move_counts_and_a_topic_filter_keeps_its_own() {
    let s = Stats::new(Duration::from_secs(60), 0, BTreeMap::new(), BTreeMap::new());
    let st = |t: &str, m: MessageState| Some((t.to_owned(), m));
    s.apply_state_changes(&[
        (None, st("a", MessageState::Enqueued)),
        (None, st("a", MessageState::Enqueued)),
        (None, st("b", MessageState::Enqueued)),
        (
            st("a", MessageState::Enqueued),
            st("a", MessageState::Consumed),
        ),
        // A removal of a state never counted does not go below zero.
        (st("b", MessageState::Failed), None),
    ]);
    record(&s, SEC, vec![latency("a", 1), latency("b", 2)]);
    let all = s.snapshot(None, 2 * SEC);
    let want = |pairs: &[(MessageState, u64)]| pairs.iter().copied().collect::<BTreeMap<_, _>>();
    assert_eq!(
        all.states,
        want(&[(MessageState::Enqueued, 2), (MessageState::Consumed, 1)])
    );
    assert_eq!(all.topics["b"], want(&[(MessageState::Enqueued, 1)]));
    assert_eq!(all.latency.len(), 2);
    let a = s.snapshot(Some("a"), 2 * SEC);
    assert_eq!(
        a.states,
        want(&[(MessageState::Enqueued, 1), (MessageState::Consumed, 1)])
    );
    assert!(
        a.topics.is_empty(),
        "the per-topic map is for the unfiltered view"
    );
    assert_eq!(a.latency.len(), 1);
    assert_eq!(a.latency[0].topic, "a");
    s.apply_state_changes(&[(st("b", MessageState::Enqueued), None)]);
    assert!(
        !s.snapshot(None, 3 * SEC).topics.contains_key("b"),
        "zeros are dropped"
    );
}

#[test]
fn ingest_and_lag_figures_reach_the_snapshot() {
    let s = Stats::new(Duration::from_secs(60), 0, BTreeMap::new(), BTreeMap::new());
    s.record_stored_batch(10, 3, None, SEC);
    s.record_stored_batch(5, 0, Some(&ApplyOutcome::default()), SEC);
    s.decode_error();
    assert!(
        s.store_failed(2 * SEC, &io::Error::other("disk full")),
        "the first failure begins an outage"
    );
    s.set_pending(7, 2, 4 * SEC);
    s.set_last_lag(12.5);
    s.set_stored_pending(1, 0, 5 * SEC);
    let snap = s.snapshot(None, 6 * SEC);
    assert_eq!(snap.ingest.stored_messages, 15);
    assert_eq!(snap.ingest.stored_without_evidence, 3);
    assert_eq!(
        snap.ingest.transactions, 1,
        "only the batch with evidence wrote"
    );
    assert_eq!(
        (snap.ingest.decode_errors, snap.ingest.store_errors),
        (1, 1)
    );
    assert_eq!((snap.lag.pending, snap.lag.ack_pending), (7, 2));
    assert_eq!(snap.lag.polled_at, Some(4 * SEC));
    assert_eq!(snap.lag.last_lag_ms, Some(12.5));
    assert_eq!(snap.lag.stored_pending, 1);
    assert_eq!(snap.lag.stored_polled_at, Some(5 * SEC));
}

#[test]
fn a_store_outage_is_one_episode_from_first_failure_to_next_commit() {
    let s = Stats::new(Duration::from_secs(60), 0, BTreeMap::new(), BTreeMap::new());
    assert!(s.store_writable());
    assert_eq!(s.store_written(SEC), None, "no outage, nothing ended");
    assert!(s.store_failed(2 * SEC, &io::Error::other("No space left on device")));
    assert!(
        !s.store_failed(3 * SEC, &io::Error::other("again")),
        "the same outage: no new episode"
    );
    assert!(!s.store_failed(4 * SEC, &io::Error::other("again")));
    assert!(!s.store_writable());
    assert_eq!(
        s.store_outage(),
        Some((2 * SEC, "No space left on device".to_owned()))
    );
    let snap = s.snapshot(None, 5 * SEC);
    assert_eq!(snap.ingest.store_unwritable_since, Some(2 * SEC));
    assert_eq!(
        (snap.ingest.store_errors, snap.ingest.store_outages),
        (3, 1)
    );
    assert_eq!(
        s.store_written(6 * SEC),
        Some(OutageEnd {
            lasted_nanos: 4 * SEC,
            failures: 3
        })
    );
    assert!(s.store_writable());
    assert_eq!(s.store_outage(), None);
    assert!(
        s.store_failed(7 * SEC, &io::Error::other("full again")),
        "a second episode"
    );
    let snap = s.snapshot(None, 8 * SEC);
    assert_eq!(
        (snap.ingest.store_errors, snap.ingest.store_outages),
        (4, 2)
    );
}

/// `/healthz` shows the outage's reason: every level of the store's error once, its root
/// cause once (no level writes its cause into its own message as well as returning it).
#[tokio::test]
async fn an_outage_reason_names_each_level_of_the_store_error_once() {
    use crate::error::StoreError;
    let enospc = || io::Error::from_raw_os_error(28);
    let root = enospc().to_string();
    let panicked = tokio::spawn(async { panic!("store thread gave up") })
        .await
        .unwrap_err();
    let join_text = panicked.to_string();
    let cases: Vec<(StoreError, &str, String)> = vec![
        (
            fjall::Error::Io(enospc()).into(),
            "store engine failed",
            root.clone(),
        ),
        (
            fjall::Error::Storage(fjall::LsmError::Io(enospc())).into(),
            "store engine failed",
            root.clone(),
        ),
        (
            fjall::Error::Poisoned.into(),
            "store engine failed",
            fjall::Error::Poisoned.to_string(),
        ),
        (
            redb::Error::Io(enospc()).into(),
            "store migration (redb) failed",
            redb::Error::Io(enospc()).to_string(),
        ),
        (StoreError::Task(panicked), "store task failed", join_text),
    ];
    for (error, level, cause) in cases {
        let s = Stats::new(Duration::from_secs(60), 0, BTreeMap::new(), BTreeMap::new());
        assert!(s.store_failed(SEC, &error));
        let (_, reason) = s.store_outage().expect("an outage is on");
        assert_eq!(reason, format!("{level}: {cause}"));
        for part in [
            level,
            "No space left on device",
            "store thread gave up",
            "Poisoned",
        ] {
            assert!(
                reason.matches(part).count() <= 1,
                "{part:?} more than once in {reason:?}"
            );
        }
    }
}
