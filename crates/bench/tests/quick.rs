//! The harness keeps working: a `--quick` run (300 ms windows after 100 ms of warm-up, two
//! interleaved repetitions; even smaller counts for S4–S6 in debug builds) produces every
//! scenario with non-zero counts and finite ratios, the medians under the existing keys with
//! each repetition and the spread beside them, S4's write amplification and peak RSS, S7's
//! searches of every kind selecting a fraction of the store (and finding it), and S8's
//! application alone and observed, with the listener storing records of what it observed.
//! No speed is asserted: benchmarks are not tests.

use msgtrail_bench::BenchConfig;
use serde_json::Value;

fn config() -> BenchConfig {
    let mut c = BenchConfig::quick();
    if cfg!(debug_assertions) {
        c.messages = 150;
        c.lookup_messages = 500;
        c.lookup_queries = 100;
        c.export_spans = 500;
    }
    // Exercise the durable variant too.
    c.durable = true;
    assert_eq!((c.reps, c.measure_window.as_millis()), (2, 300));
    c
}

fn num(v: &Value, path: &str) -> f64 {
    let mut cur = v;
    for k in path.split('.') {
        cur = match k.parse::<usize>() {
            Ok(i) => &cur[i],
            Err(_) => &cur[k],
        };
    }
    cur.as_f64()
        .unwrap_or_else(|| panic!("{path} is not a number: {cur}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_run_reports_every_scenario() {
    let c = config();
    let report = msgtrail_bench::run(c.clone(), false)
        .await
        .expect("quick bench runs");
    let json = serde_json::to_value(&report).unwrap();
    let table = report.table();

    let positive = |path: &str| {
        let x = num(&json, path);
        assert!(x.is_finite() && x > 0.0, "{path} = {x}\n{table}");
    };
    for variant in ["runs", "durable"] {
        let runs = json[variant]
            .as_array()
            .unwrap_or_else(|| panic!("{variant} missing"));
        assert_eq!(runs.len(), c.payload_sizes.len(), "{variant}");
        for i in 0..runs.len() {
            let p = |s: &str| format!("{variant}.{i}.{s}");
            for s in [
                "s1.publish.count",
                "s1.publish.per_sec",
                "s1.consume.per_sec",
                "s1.pipeline.per_sec",
                "s1.e2e.count",
                "s1.e2e.p99_ms",
                "s2.throughput.per_sec",
                "s2.broker.uploads",
                "s2.broker.acks",
                "s2.e2e.count",
                "s2.e2e.p99_ms",
                "s3.throughput.per_sec",
                "s3.broker.uploads",
                "s3.broker.stage_records",
                "s3.broker.stage_batches",
                "s3.e2e.p99_ms",
                "s3.listener.records",
                "s3.listener.batches",
                "ratios.s2_over_s1",
                "ratios.s3_over_s2",
                "ratios.stage_messages_per_message",
                "ratios.e2e_p99_s3_over_s2",
                "ratios.e2e_p99_s2_over_s1",
                "ratios.e2e_p99_s3_over_s2_saturated",
                "ratios.s3l_over_s2",
                "ratios.s2_batch1_over_s1",
                "ratios.batching_gain",
                "s2_batch1.throughput.per_sec",
                "s2_batch1.broker.uploads",
                "s3l.throughput.per_sec",
                "s3l.listener.records",
                "s3l.listener.batches",
                "s1.paced.e2e.count",
                "s2.paced.e2e.p99_ms",
                "s3.paced.e2e.p99_ms",
                "s3.paced.send.count",
                // nats-server >= 2.14 (scripts/install-nats-server.sh installs 2.15):
                // raw fast-ingest batches, and the broker storing its uploads with them.
                "s1f.per_sec",
                "ratios.s2_over_s1f",
                "s2.broker.fast_batches",
            ] {
                positive(&p(s));
            }
            // One message per upload and settle request without batching.
            assert_eq!(
                num(&json, &p("s2_batch1.broker.upload_requests")),
                num(&json, &p("s2_batch1.broker.uploads")),
                "{table}"
            );
            assert_eq!(
                num(&json, &p("s2_batch1.broker.settle_requests")),
                num(&json, &p("s2_batch1.broker.acks")),
                "{table}"
            );
            // Recording off writes no stage stream.
            assert_eq!(num(&json, &p("s2.broker.stage_batches")), 0.0, "{table}");
            // The broker stored what the throughput run sent, and the latency run's messages
            // when the fields come from the first repetition (the only one with it).
            let paced = if num(&json, &p("s3.repetition")) == 0.0 {
                c.latency_messages as f64
            } else {
                0.0
            };
            positive(&p("s3.sent"));
            assert_eq!(
                num(&json, &p("s3.broker.uploads")),
                num(&json, &p("s3.sent")) + paced,
                "{table}"
            );
            // Repetitions: each one's rate, the median under the existing key, the spread.
            assert_eq!(num(&json, &p("repetitions")), f64::from(c.reps));
            for (scenario, rate) in [
                ("s1", "s1.pipeline.per_sec"),
                ("s2", "s2.throughput.per_sec"),
                ("s2_batch1", "s2_batch1.throughput.per_sec"),
                ("s3", "s3.throughput.per_sec"),
                ("s3l", "s3l.throughput.per_sec"),
            ] {
                let reps: Vec<f64> = json[variant][i][scenario]["reps"]
                    .as_array()
                    .unwrap_or_else(|| panic!("{scenario}.reps missing"))
                    .iter()
                    .map(|v| v.as_f64().unwrap())
                    .collect();
                assert_eq!(reps.len(), c.reps as usize, "{scenario}.reps");
                assert!(reps.iter().all(|r| *r > 0.0), "{scenario}.reps {reps:?}");
                let (lo, hi) = (reps[0].min(reps[1]), reps[0].max(reps[1]));
                let median = num(&json, &p(rate));
                assert!((median - (lo + hi) / 2.0).abs() < 1e-9 * hi, "{scenario}");
                let spread = num(&json, &p(&format!("{scenario}.spread")));
                assert!((spread - (hi - lo) / median).abs() < 1e-9, "{scenario}");
            }
            // CPU per message in each timed window, both sides of the NATS connection
            // (the bench's own nats-server is its child process).
            for cpu in ["s1.pipeline.cpu", "s2.throughput.cpu", "s3.throughput.cpu"] {
                positive(&p(&format!("{cpu}.bench_us_per_msg")));
                positive(&p(&format!("{cpu}.nats_server_us_per_msg")));
                let total = num(&json, &p(&format!("{cpu}.total_us_per_msg")));
                let parts = num(&json, &p(&format!("{cpu}.bench_us_per_msg")))
                    + num(&json, &p(&format!("{cpu}.nats_server_us_per_msg")));
                assert!(
                    (total - parts).abs() < 1e-6 * total,
                    "{cpu}: {total} vs {parts}"
                );
            }
            for r in [
                "s2_over_s1",
                "s3_over_s2",
                "s3l_over_s2",
                "batching_gain",
                "s2_over_s1f",
            ] {
                let (lo, hi) = (
                    num(&json, &p(&format!("paired.{r}.min"))),
                    num(&json, &p(&format!("paired.{r}.max"))),
                );
                assert!(lo > 0.0 && lo <= hi, "paired.{r}: {lo}..{hi}");
                assert_eq!(
                    json[variant][i]["paired"][r]["reps"]
                        .as_array()
                        .map(Vec::len),
                    Some(c.reps as usize)
                );
            }
            assert_eq!(
                json[variant][i]["s1f_reps"].as_array().map(Vec::len),
                Some(c.reps as usize)
            );
        }
    }
    for s in [
        "s4.records.count",
        "s4p.records",
        "s4p.one_listener_records_per_sec",
        "s4p.two_listeners_records_per_sec",
        "s4p.per_listener_records_per_sec.0",
        "s4p.per_listener_records_per_sec.1",
        "ratios.s4p_scaling",
        "s4p.scaling_spread.0",
        "s4p.scaling_spread.1",
        "s4p.fanout.lookup_local_ms.p50_ms",
        "s4p.fanout.lookup_forwarded_ms.p50_ms",
        "s4p.fanout.search_local_ms.p50_ms",
        "s4p.fanout.search_merged_ms.p50_ms",
        "s4p.fanout.lookup_p50_ratio",
        "s4p.fanout.search_p50_ratio",
        "s4.records.per_sec",
        "s4.new_records",
        "s4.messages",
        "s4.inflight_messages",
        "s4.store_bytes_per_message",
        "s5.stored_messages",
        "s5.latency.count",
        "s5.latency.p99_ms",
        "s5.found",
        "s6.export.count",
        "s6.export.per_sec",
        "s6.received_spans",
        "s6.mapping.per_sec",
        "s6.latency_at_80pct.count",
        "s6.latency_at_80pct.p99_ms",
        "s6.paced.offered_per_sec",
        "s6.paced.target_per_sec",
        "s6.paced.spans",
        "s4.counted_bytes_per_inflight_message",
        "s4.recorded_records.per_sec",
        "s4.transaction_ms.count",
        "s4.logical_bytes",
        "s4.disk_write_bytes",
        "s4.write_amplification",
        "s4.peak_rss_bytes",
        "estimated_seconds",
    ] {
        positive(s);
    }
    assert_eq!(
        num(&json, "s4p.reps"),
        f64::from(c.reps),
        "S4P repeats like S1–S3"
    );
    assert!(
        num(&json, "s4p.scaling_spread.0") <= num(&json, "ratios.s4p_scaling")
            && num(&json, "ratios.s4p_scaling") <= num(&json, "s4p.scaling_spread.1"),
        "S4P's scaling is the median of its repetitions"
    );
    assert_eq!(num(&json, "s4.drops"), 0.0, "{table}");
    assert!(
        json["s4"]["peak_rss_method"]
            .as_str()
            .is_some_and(|m| m.starts_with("VmHWM") || m.starts_with("VmRSS")),
        "{table}"
    );
    // The synthetic mix redelivers one stage message in a hundred: skipped as repeats.
    positive("s4.repeated_records");
    assert_eq!(num(&json, "s5.found"), c.lookup_queries as f64, "{table}");
    // S7: every kind of search finds some of what its filters select, a fraction.
    for s in [
        "s7.stored_messages",
        "s7.records",
        "s7.sample",
        "s7.latency.count",
        "s7.latency.p50_ms",
        "s7.latency.p99_ms",
        "s7.searches.per_sec",
        "s7.results",
    ] {
        positive(s);
    }
    assert_eq!(num(&json, "s7.stored_messages"), c.lookup_messages as f64);
    let kinds = json["s7"]["kinds"].as_object().expect("s7.kinds");
    assert_eq!(kinds.len(), 5, "{table}");
    for kind in [
        "topic",
        "attribute",
        "topic_attribute",
        "failed",
        "dead_lettered",
    ] {
        let k = |f: &str| format!("s7.kinds.{kind}.{f}");
        for f in ["p50_ms", "p99_ms", "max_ms", "results", "mean_results"] {
            positive(&k(f));
        }
        assert_eq!(num(&json, &k("queries")), c.search_queries as f64);
        let sel = num(&json, &k("selectivity"));
        assert!(sel > 0.0 && sel < 0.5, "{kind} selects {sel}\n{table}");
        assert!(num(&json, &k("mean_results")) <= 100.0, "{table}");
        assert!(num(&json, &k("p99_ms")) >= num(&json, &k("p50_ms")));
    }
    assert_eq!(
        num(&json, "s7.latency.count"),
        5.0 * c.search_queries as f64,
        "{table}"
    );
    // S8: both runs of every repetition, the ratio of the medians, the listener's records.
    for s in [
        "s8.raw.per_sec",
        "s8.observed.per_sec",
        "s8.records_per_message",
        "s8.paired.min",
    ] {
        positive(s);
    }
    let ratio = num(&json, "ratios.s8_observed_over_raw");
    assert!(ratio > 0.0 && ratio < 2.0, "S8 ratio {ratio}\n{table}");
    assert!(
        (ratio - num(&json, "s8.observed.per_sec") / num(&json, "s8.raw.per_sec")).abs() < 1e-9
    );
    for key in ["raw_reps", "observed_reps", "listener"] {
        assert_eq!(
            json["s8"][key].as_array().map(Vec::len),
            Some(c.reps as usize),
            "s8.{key}"
        );
    }
    for l in json["s8"]["listener"].as_array().unwrap() {
        // Every published message was seen stored, and its acks observed.
        assert!(l["published"].as_f64().unwrap() > 0.0, "{l}");
        assert!(
            l["records"].as_f64().unwrap() >= l["published"].as_f64().unwrap(),
            "{l}"
        );
        assert!(l["consumed"].as_f64().unwrap() > 0.0, "{l}");
    }
    assert!(!report.targets.is_empty());
    assert!(
        report
            .targets
            .iter()
            .any(|t| t.name.starts_with("S7 search p99") && t.target == "≤ 50 ms"),
        "{table}"
    );
    assert!(
        table.contains("S1 raw both at once")
            && table.contains("Targets")
            && table.contains("spread")
            && table.contains("ratios over paired repetitions")
            && table.contains("write amplification")
            && table.contains("S7 search with")
            && table.contains("S7 dead_lettered")
            && table.contains("S8 observe mode"),
        "{table}"
    );
}
