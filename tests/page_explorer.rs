//! The page as a trace explorer (issue 23), in a real headless Chromium against a real
//! nats-server, broker and listener, each behaviour at 1440 px and at 800 px: the layout
//! (the timeline gets the width, the list is in sight, a clicked message opens in view), the
//! result list (durations with bars, groups, producer, sorting, distinct IDs, the scatter
//! plot, the search in the address, lookback, max duration, From/To and their zone), the
//! exact waterfall (one reference for offsets, ticks that follow the zoom, zoom at the cursor
//! and towards a hop, the minimap, dead letters and redeliveries marked, groups still
//! waiting, the exported attributes, copy, links to the tracing UI, the JSON download), the
//! list that holds still while read, and the rest (token, errors, favicon, views' links,
//! accessibility).

use msgtrail_client::Outgoing;
use msgtrail_core::trajectory::{MessageState, Trajectory};
use msgtrail_e2e::browser::{dead_letter, http_get, pull, sub, Browser};
use msgtrail_e2e::{TestListener, TestSystem};
use serde_json::Value;
use std::time::Duration;

/// The widths every behaviour is checked at.
const WIDTHS: [u32; 2] = [1440, 800];

fn consumed_by(t: &Trajectory, groups: usize) -> bool {
    t.state == MessageState::Consumed
        && t.groups.len() == groups
        && t.hops.iter().all(|h| h.end.is_some())
}

fn get_json(l: &TestListener, path: &str) -> Value {
    let (status, _, body) = http_get(l, path);
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap()
}

/// A duration as the page writes it (by magnitude): 830 ns, 41.2 µs, 3.27 ms, 1.350 s.
fn page_dur(n: f64) -> String {
    let a = n.abs();
    let s = if n < 0.0 { "−" } else { "" };
    let fixed = |v: f64, d: usize| format!("{v:.d$}");
    if a < 1e3 {
        format!("{s}{} ns", a.round())
    } else if a < 1e6 {
        let d = if a < 1e4 {
            2
        } else if a < 1e5 {
            1
        } else {
            0
        };
        format!("{s}{} µs", fixed(a / 1e3, d))
    } else if a < 1e9 {
        let d = if a < 1e7 {
            2
        } else if a < 1e8 {
            1
        } else {
            0
        };
        format!("{s}{} ms", fixed(a / 1e6, d))
    } else if a < 60e9 {
        format!("{s}{} s", fixed(a / 1e9, if a < 1e10 { 3 } else { 2 }))
    } else {
        let m = (a / 60e9).floor();
        format!("{s}{m} min {:.1} s", (a - m * 60e9) / 1e9)
    }
}

/// A summary's end to end as the list shows it: its slowest group's, else its records' span.
fn summary_duration(m: &Value) -> u64 {
    let e2e = m["segments"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s[0] == "end_to_end")
        .map(|s| s[1].as_u64().unwrap())
        .max();
    e2e.unwrap_or_else(|| m["last_at"].as_u64().unwrap() - m["first_at"].as_u64().unwrap())
}

/// Resizes the window and waits until the page has that width.
async fn width(b: &Browser, w: u32) {
    b.client.set_window_size(w, 900).await.unwrap();
    b.until(
        &format!("the page at {w} px"),
        &format!("Math.abs(window.innerWidth - {w}) <= 16"),
        "window.innerWidth",
    )
    .await;
}

/// No section and not the page scrolls sideways.
async fn nothing_cut_off(b: &Browser, w: u32) {
    let overflow = b
        .js("return [document.documentElement, ...document.querySelectorAll('section')].filter(e => !e.hidden && e.scrollWidth > e.clientWidth + 1).map(e => e.id || e.tagName)")
        .await;
    assert_eq!(overflow, serde_json::json!([]), "cut off at {w} px");
}

/// Four messages: billing fails `refund` once (then consumes it), `food` waits in the queue
/// (stuck), two more are consumed by billing and audit; (refund, food, the others).
async fn traffic(sys: &TestSystem, l: &TestListener) -> (String, String, Vec<String>) {
    let producer = sys.producer("shop").await;
    let billing = sys.consumer("billing-1").await;
    let audit = sys.consumer("audit-1").await;
    let send = async |topic: &str, body: &'static str, category: &str| {
        producer
            .send_message(Outgoing::new(topic, body).attr("category", category))
            .await
            .unwrap()
            .message_id
            .to_string()
    };
    let refund = send("orders.eu", "{\"order\": 42}", "refund").await;
    pull(&billing, "billing", "orders.*", Some("card declined")).await;
    pull(&billing, "billing", "orders.*", None).await;
    let food = send("payments.eu", "food", "food").await;
    let mut others = vec![];
    for topic in ["orders.us", "orders.apac"] {
        others.push(send(topic, "{\"order\": 43}", "sale").await);
        tokio::time::sleep(Duration::from_millis(30)).await;
        pull(&billing, "billing", "orders.*", None).await;
    }
    for _ in 0..3 {
        pull(&audit, "audit", "orders.*", None).await;
    }
    l.trajectory_when(&refund, |t| consumed_by(t, 2)).await;
    for id in &others {
        l.trajectory_when(id, |t| consumed_by(t, 2)).await;
    }
    l.trajectory_when(&food, |t| t.state == MessageState::Stuck)
        .await;
    (refund, food, others)
}

fn short_deadlines(c: &mut msgtrail_listener::ListenerConfig) {
    c.deadlines.delivered_ms = 300;
}

const ROWS: &str = "[...document.querySelectorAll('#list tr.msg')]";

/// Layout and the result list, at 1440 and 800 px.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layout_and_a_result_list_to_scan() {
    let sys = TestSystem::start().await;
    let l = sys.start_listener(short_deadlines).await;
    let (refund, food, others) = traffic(&sys, &l).await;
    let api: Vec<Value> = serde_json::from_value(get_json(&l, "/api/messages?limit=50")).unwrap();
    assert_eq!(api.len(), 4);
    let b = Browser::start(WIDTHS[0]).await;
    b.open(&l.url()).await;
    b.until(
        "four rows",
        &format!("{ROWS}.length === 4"),
        "document.querySelector('#list').innerText",
    )
    .await;
    // And 1000 px, the other end of the narrow layouts.
    for w in [WIDTHS[0], 1000, WIDTHS[1]] {
        width(&b, w).await;
        // The timeline gets most of the width (beside the list, or the whole width below
        // it); the statistics a slim bar; the list starts in sight.
        let geo = b
            .js(r#"const r = e => document.querySelector(e).getBoundingClientRect();
                return { trace: r('#trace').width, page: window.innerWidth, stats: r('#stats').height,
                         list: r('#listwrap').top, fold: window.innerHeight };"#)
            .await;
        let f = |k: &str| geo[k].as_f64().unwrap();
        assert!(f("trace") >= 0.6 * f("page"), "{w} px: {geo}");
        assert!(
            f("stats") <= if w > 1000 { 60.0 } else { 120.0 },
            "{w} px: {geo}"
        );
        assert!(
            f("list") < f("fold") - 150.0,
            "{w} px: the list in sight: {geo}"
        );
        nothing_cut_off(&b, w).await;
        if w < 1200 {
            // Narrow, the bar keeps states and the funnel; "more" shows the rest.
            assert!(!b.text("#statsBody").await.contains("redeliveries"));
            b.click("#statsMore").await;
            assert!(b.text("#statsBody").await.contains("redeliveries"));
            b.click("#statsMore").await;
        }

        // Each row: its end to end as a number and a bar, its groups, its producer, an ID
        // tail that tells it from the others.
        let rows = b
            .js(&format!(r#"return {ROWS}.map(r => ({{ id: r.dataset.id, cells: [...r.cells].map(c => c.innerText),
                nanos: +r.querySelector('td.dur').dataset.nanos,
                bar: r.querySelector('.mini i').getBoundingClientRect().width / r.querySelector('.mini').getBoundingClientRect().width,
                tail: r.querySelector('.mono').innerText, producer: r.querySelector('.prod').innerText,
                groups: r.cells[2].firstChild.textContent, attempts: r.querySelector('.attempts')?.innerText }}));"#))
            .await;
        let rows = rows.as_array().unwrap();
        let longest = api.iter().map(summary_duration).max().unwrap() as f64;
        let mut tails: Vec<&str> = rows.iter().map(|r| r["tail"].as_str().unwrap()).collect();
        tails.sort();
        tails.dedup();
        assert_eq!(tails.len(), 4, "IDs that differ: {rows:?}");
        for m in &api {
            let id = m["message_id"].as_str().unwrap();
            let row = rows.iter().find(|r| r["id"] == id).unwrap();
            let d = summary_duration(m);
            assert_eq!(
                row["nanos"].as_u64().unwrap(),
                d,
                "exact nanoseconds: {row}"
            );
            assert!(
                row["cells"][3]
                    .as_str()
                    .unwrap()
                    .starts_with(&page_dur(d as f64)),
                "{row}"
            );
            let bar = row["bar"].as_f64().unwrap();
            assert!(
                (bar - d as f64 / longest).abs() < 0.02,
                "bar ∝ duration: {row}"
            );
            let groups = m["groups"].as_object().unwrap().len();
            assert_eq!(row["groups"], groups.to_string(), "{row}");
            // Its delivery attempts over all groups, as the API counts them: at least one per
            // group that got it.
            let attempts = m["attempts"]
                .as_u64()
                .expect("a new summary counts attempts");
            assert!(attempts >= groups as u64, "{m}");
            assert_eq!(row["attempts"], format!("{attempts} att."), "{row}");
            assert_eq!(row["producer"], "shop", "{row}");
        }
        // Sorting by the end-to-end column: longest first, then shortest first.
        b.click("#list th[data-sort=\"longest\"]").await;
        let order = b
            .js(&format!(
                "return {ROWS}.map(r => +r.querySelector('td.dur').dataset.nanos)"
            ))
            .await;
        let order: Vec<u64> = serde_json::from_value(order).unwrap();
        assert!(order.windows(2).all(|p| p[0] >= p[1]), "{order:?}");
        assert!(b
            .js("return location.search")
            .await
            .as_str()
            .unwrap()
            .contains("sort=longest"));
        b.click("#list th[data-sort=\"longest\"]").await;
        let order: Vec<u64> = serde_json::from_value(
            b.js(&format!(
                "return {ROWS}.map(r => +r.querySelector('td.dur').dataset.nanos)"
            ))
            .await,
        )
        .unwrap();
        assert!(order.windows(2).all(|p| p[0] <= p[1]), "{order:?}");
        // The scatter plot: one dot per message, higher for longer; a dot opens its message.
        let dots = b
            .js("return [...document.querySelectorAll('#scatter circle.pt')].map(c => [+c.dataset.nanos, +c.getAttribute('cy'), c.dataset.id])")
            .await;
        let mut dots: Vec<(u64, f64, String)> = serde_json::from_value(dots).unwrap();
        assert_eq!(dots.len(), 4);
        dots.sort_by_key(|d| d.0);
        assert!(
            dots.windows(2).all(|p| p[0].1 >= p[1].1),
            "longer is higher: {dots:?}"
        );
        let top = dots.last().unwrap().2.clone();
        b.js(&format!("document.querySelector('#scatter circle[data-id=\"{top}\"]').dispatchEvent(new MouseEvent('click', {{ bubbles: true }})); return 1"))
            .await;
        b.until(
            "the dot's trajectory",
            &format!("document.querySelector('#traceBody').innerText.includes('{top}') && document.querySelector('table.wf')"),
            "document.querySelector('#traceBody').innerText",
        )
        .await;
        // A clicked row opens its trajectory in view.
        b.js("window.scrollTo(0, 0); return 1").await;
        b.click(&format!("#list tr.msg[data-id=\"{}\"]", others[0]))
            .await;
        b.until(
            "the clicked row's trajectory, in view",
            &format!("document.querySelector('#traceBody').innerText.includes('{}') && document.querySelector('table.wf') && (r => r.top >= -1 && r.top < window.innerHeight - 100)(document.querySelector('#trace').getBoundingClientRect())", others[0]),
            "JSON.stringify(document.querySelector('#trace').getBoundingClientRect())",
        )
        .await;
        // The waterfall's columns do not overlap: offset and took beside the bars, the bars
        // wide enough to read, the ticks apart.
        let cols = b
            .js(r#"const row = document.querySelector('table.wf tr.hop'), r = i => row.cells[i].getBoundingClientRect();
                const ticks = [...document.querySelectorAll('table.wf .axis span')].map(s => s.getBoundingClientRect());
                return { off: r(1).width, took: r(2).width, tookRight: r(2).right, barLeft: r(3).left, bar: row.querySelector('.track').getBoundingClientRect().width,
                  ticksApart: ticks.every((t, i) => i === 0 || t.left >= ticks[i - 1].right), ticks: ticks.length };"#)
            .await;
        assert!(cols["off"].as_f64().unwrap() > 40.0, "{w} px: {cols}");
        assert!(cols["took"].as_f64().unwrap() > 40.0, "{w} px: {cols}");
        assert!(
            cols["tookRight"].as_f64().unwrap() <= cols["barLeft"].as_f64().unwrap() + 0.5,
            "{w} px: {cols}"
        );
        assert!(cols["bar"].as_f64().unwrap() > 200.0, "{w} px: {cols}");
        assert_eq!(cols["ticksApart"], true, "{w} px: {cols}");
        nothing_cut_off(&b, w).await;
        b.click("#f-sort").await;
        b.js("const s = document.querySelector('#f-sort'); s.value = 'recent'; s.dispatchEvent(new Event('change')); return 1").await;
    }

    // The search in the address: reload and a shared link keep it.
    let ids = format!("{ROWS}.map(r => r.dataset.id).sort().join(',')");
    b.type_into("#f-topic", "orders.*").await;
    b.click("#f-redelivered").await;
    b.click("#search button[type=submit]").await;
    b.until("redelivered orders", &format!("{ids} === '{refund}'"), &ids)
        .await;
    let search = b.js("return location.search").await;
    let search = search.as_str().unwrap();
    assert!(
        search.contains("topic=orders.*") || search.contains("topic=orders.%2A"),
        "{search}"
    );
    assert!(search.contains("redelivered=true"), "{search}");
    b.open(&format!("{}/{search}", l.url())).await;
    b.until(
        "the same search after a reload",
        &format!("{ids} === '{refund}'"),
        &ids,
    )
    .await;
    assert_eq!(
        b.js("return document.querySelector('#f-topic').value")
            .await,
        "orders.*"
    );
    assert_eq!(
        b.js("return document.querySelector('#f-redelivered').checked")
            .await,
        true
    );
    // Lookback presets and the max duration.
    b.click("#search button[type=reset]").await;
    b.js("const s = document.querySelector('#f-lookback'); s.value = '5m'; s.dispatchEvent(new Event('change')); return 1").await;
    b.until(
        "the last 5 minutes: all",
        &format!("{ROWS}.length === 4"),
        &ids,
    )
    .await;
    assert!(b
        .js("return location.search")
        .await
        .as_str()
        .unwrap()
        .contains("lookback=5m"));
    let durations: Vec<u64> = api.iter().map(summary_duration).collect();
    let cap = (*durations.iter().max().unwrap() as f64 / 1e6) * 0.999;
    let under = durations
        .iter()
        .filter(|d| (**d as f64) <= cap * 1e6)
        .count();
    assert!(under < 4);
    b.type_into("#f-max", &format!("{cap}")).await;
    b.click("#search button[type=submit]").await;
    b.until(
        &format!("max {cap} ms: {under} rows"),
        &format!("{ROWS}.length === {under}"),
        &ids,
    )
    .await;
    // From/To in the page's 24-hour format with their zone; a time that is not one says so.
    b.click("#search button[type=reset]").await;
    b.type_into("#f-to", "2020-01-01 00:00:00").await;
    b.click("#search button[type=submit]").await;
    b.until("none before 2020", &format!("{ROWS}.length === 0"), &ids)
        .await;
    b.type_into("#f-to", "yesterday").await;
    b.click("#search button[type=submit]").await;
    b.until(
        "an input error",
        "document.querySelector('#serr').innerText.includes('2026-12-02 05:00:00') && document.querySelector('#f-to').getAttribute('aria-invalid') === 'true'",
        "document.querySelector('#serr').innerText",
    )
    .await;
    b.click("#search button[type=reset]").await;
    let from = b
        .js("const d = new Date(Date.now() - 3600e3); return d.toISOString().slice(0, 19).replace('T', ' ')")
        .await;
    let from = from.as_str().unwrap().to_owned();
    b.type_into("#f-from", &from).await;
    b.click("#search button[type=submit]").await;
    b.until(
        "all since an hour ago",
        &format!("{ids} === '{}'", {
            let mut all = [
                refund.clone(),
                food.clone(),
                others[0].clone(),
                others[1].clone(),
            ];
            all.sort();
            all.join(",")
        }),
        &ids,
    )
    .await;
    assert!(b.text("#search").await.contains("From UTC"));
    let url_before = b.js("return location.search").await;
    // "Times in" local (UTC+05:30 here): the field shows the same instant in that zone.
    b.js("const s = document.querySelector('#tz'); s.value = 'local'; s.dispatchEvent(new Event('change')); return 1").await;
    let local = b.js("return document.querySelector('#f-from').value").await;
    let want_local = b
        .js(&format!("const d = new Date(Date.parse('{}Z') + 5.5 * 3600e3); return d.toISOString().slice(0, 19).replace('T', ' ')", from.replace(' ', "T")))
        .await;
    assert_eq!(local, want_local, "the same instant in UTC+05:30");
    assert!(b.text("#search").await.contains("From UTC+05:30"));
    assert_eq!(
        b.js("return location.search").await,
        url_before,
        "the address keeps the instant"
    );
    b.until("still all", &format!("{ROWS}.length === 4"), &ids)
        .await;
    b.close().await;
}

/// The axis: (from, to, tick labels) in nanoseconds from the first record.
async fn axis(b: &Browser) -> (f64, f64, Vec<String>) {
    let v = b
        .js("const a = document.querySelector('table.wf .axis'); return [+a.dataset.from, +a.dataset.to, [...a.querySelectorAll('span')].map(s => s.innerText)]")
        .await;
    serde_json::from_value(v).unwrap()
}

/// The exact waterfall, at 1440 and 800 px.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exact_waterfall() {
    let sys = TestSystem::start().await;
    let l = sys
        .start_listener(|c| {
            c.trace_ui = msgtrail_otel::TraceUi::from_lookup(|k| {
                (k == "MSGTRAIL_TRACE_UI_URL")
                    .then(|| "http://jaeger:16686/trace/{trace_id}".to_owned())
            });
        })
        .await;
    let (refund, _food, _others) = {
        // refund: billing fails once, then consumes; audit consumes.
        let producer = sys.producer("shop").await;
        let billing = sys.consumer("billing-1").await;
        let audit = sys.consumer("audit-1").await;
        let refund = producer
            .send_message(Outgoing::new("orders.eu", "{\"order\": 42}"))
            .await
            .unwrap()
            .message_id
            .to_string();
        pull(&billing, "billing", "orders.*", Some("card declined")).await;
        pull(&billing, "billing", "orders.*", None).await;
        pull(&audit, "audit", "orders.*", None).await;
        l.trajectory_when(&refund, |t| consumed_by(t, 2)).await;
        (refund, (), ())
    };
    let dead = dead_letter(&sys, &l).await;
    pull(&sys.consumer("audit-1").await, "audit", "orders.*", None).await; // audit's copy of it
                                                                           // One more: billing consumes it, audit has it and does not settle it yet.
    let producer = sys.producer("shop").await;
    let pending = producer
        .send("orders.eu", "x")
        .await
        .unwrap()
        .message_id
        .to_string();
    let billing = sys.consumer("billing-1").await;
    pull(&billing, "billing", "orders.*", None).await;
    let audit = sys.consumer("audit-1").await;
    let held = audit
        .fetch(&sub("audit", "orders.*"), 1, Duration::from_secs(3))
        .await
        .unwrap();
    assert_eq!(held.len(), 1);
    l.trajectory_when(&pending, |t| t.groups.len() == 2).await;

    let config = get_json(&l, "/api/config");
    assert_eq!(
        config["trace_ui_template"],
        "http://jaeger:16686/trace/{trace_id}"
    );
    let api: Trajectory = l.client.trajectory(&refund, None).await.unwrap();
    let spans = get_json(&l, &format!("/api/messages/{refund}/spans"));
    let b = Browser::start(WIDTHS[0]).await;
    for w in WIDTHS {
        width(&b, w).await;
        b.open(&format!("{}/#{refund}", l.url())).await;
        b.until(
            "the waterfall",
            "document.querySelector('tr.hop[data-key=\"deliver/audit/audit-1/1\"]')",
            "document.querySelector('#traceBody').innerText",
        )
        .await;
        // One reference point: every offset counts from the first record, zoomed or not.
        let offsets = "Object.fromEntries([...document.querySelectorAll('table.wf tr.hop')].map(r => [r.dataset.key, r.cells[1].innerText]))";
        let want: serde_json::Map<String, Value> = api
            .hops
            .iter()
            .map(|h| {
                (
                    h.key.clone(),
                    Value::from(format!("+{}", page_dur((h.start - api.first_at) as f64))),
                )
            })
            .collect();
        assert_eq!(
            b.js(&format!("return {offsets}")).await,
            Value::Object(want.clone())
        );
        let (from0, to0, _) = axis(&b).await;
        assert_eq!(from0, 0.0);
        // Twelve presses of "+": the ticks still tell their times apart, in nice steps.
        for _ in 0..12 {
            b.click("#zoomIn").await;
        }
        assert_eq!(
            b.js(&format!("return {offsets}")).await,
            Value::Object(want.clone()),
            "zoomed: the same offsets"
        );
        let (zf, zt, ticks) = axis(&b).await;
        assert!(
            ((zt - zf) - to0 / 4096.0).abs() <= 1e3,
            "{zf}..{zt} of {to0}"
        );
        assert!((2..=11).contains(&ticks.len()), "{ticks:?}");
        let apart = b
            .js("const t = [...document.querySelectorAll('table.wf .axis span')].map(s => s.getBoundingClientRect()); return t.every((r, i) => i === 0 || r.left >= t[i - 1].right)")
            .await;
        assert_eq!(apart, true, "tick labels apart at {w} px: {ticks:?}");
        let mut distinct = ticks.clone();
        distinct.dedup();
        assert_eq!(distinct.len(), ticks.len(), "ticks apart: {ticks:?}");
        assert!(
            ticks
                .iter()
                .all(|t| t.starts_with('+') && !t.contains('-') && !t.contains('−')),
            "{ticks:?}"
        );
        let text = b.text("#traceBody").await;
        assert!(!text.contains("+-") && !text.contains("+−"), "{text}");
        b.click("#zoomReset").await;
        // Ctrl+wheel over the bars zooms at the cursor: the time under it stays there.
        b.js(r#"const t = document.querySelector('table.wf tr.hop .track'), r = t.getBoundingClientRect();
            t.dispatchEvent(new WheelEvent('wheel', { bubbles: true, cancelable: true, ctrlKey: true, deltaY: -100, clientX: r.left + 0.2 * r.width, clientY: r.top + 5 })); return 1;"#)
            .await;
        let (wf, wt, _) = axis(&b).await;
        assert!(((wt - wf) - to0 / 2.0).abs() <= 1e3, "half: {wf}..{wt}");
        assert!(
            ((wf + 0.2 * (wt - wf)) - 0.2 * to0).abs() <= 1e3 + to0 * 0.001,
            "the cursor's time stays: {wf}..{wt}"
        );
        b.click("#zoomReset").await;
        // Towards the open hop: "+" keeps the hop in the middle of what is shown.
        let hop = api
            .hops
            .iter()
            .find(|h| h.key == "process/audit/audit-1/1")
            .unwrap();
        let mid = ((hop.start + hop.end.unwrap()) / 2 - api.first_at) as f64;
        b.click("tr.hop[data-key=\"process/audit/audit-1/1\"]")
            .await;
        for _ in 0..3 {
            b.click("#zoomIn").await;
        }
        let (hf, ht, _) = axis(&b).await;
        assert!(
            hf <= mid && mid <= ht,
            "the hop in sight: {hf}..{ht} ∌ {mid}"
        );
        assert!(((ht - hf) - to0 / 8.0).abs() <= 1e3, "{hf}..{ht}");
        // The hop's detail: the exported span's attributes as the exporter maps them.
        b.until(
            "the exported attributes",
            "document.querySelector('tr.detail table.attrs')",
            "document.querySelector('tr.detail').innerText",
        )
        .await;
        let shown = b
            .js("return [...document.querySelectorAll('tr.detail table.attrs tbody tr')].map(r => [r.cells[0].innerText, r.cells[1].innerText])")
            .await;
        let exported = spans["spans"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["hop"] == "process/audit/audit-1/1")
            .unwrap();
        assert_eq!(shown, exported["attributes"], "{shown}");
        assert!(shown
            .as_array()
            .unwrap()
            .iter()
            .any(|kv| kv[0] == "messaging.system"));
        assert!(shown
            .as_array()
            .unwrap()
            .iter()
            .any(|kv| kv[0].as_str().unwrap().starts_with("msgtrail.")));
        // Copy buttons and the links into the tracing UI.
        let span_id = hop.span_id.clone().unwrap();
        b.click(&format!("tr.detail button.copy[data-copy=\"{span_id}\"]"))
            .await;
        b.until("copied", &format!("document.querySelector('tr.detail button.copy[data-copy=\"{span_id}\"]').innerText === 'copied'"), "document.querySelector('tr.detail button.copy').innerText").await;
        let trace_id = api.trace_id.clone().unwrap();
        assert_eq!(
            b.js("return document.querySelector('#traceLink').href")
                .await,
            format!("http://jaeger:16686/trace/{trace_id}")
        );
        assert_eq!(
            b.js("return document.querySelector('tr.detail a.span-link').href")
                .await,
            format!("http://jaeger:16686/trace/{trace_id}")
        );
        // The JSON download is the trajectory.
        let got = b
            .client
            .execute_async(
                "const done = arguments[0]; const a = document.querySelector('#download'); fetch(a.href).then(r => r.json()).then(j => done([a.download, j.message_id, j.hops.length]));",
                vec![],
            )
            .await
            .unwrap();
        assert_eq!(
            got,
            serde_json::json!([format!("msgtrail-{refund}.json"), refund, api.hops.len()])
        );
        // The minimap: dragging across 50 %–90 % of it shows that part of the whole.
        b.click("#zoomReset").await;
        b.js(r#"const m = document.querySelector('#minimap'), r = m.getBoundingClientRect();
            const at = f => ({ bubbles: true, button: 0, clientX: r.left + f * r.width, clientY: r.top + 2 });
            m.dispatchEvent(new MouseEvent('mousedown', at(0.5))); window.dispatchEvent(new MouseEvent('mouseup', at(0.9))); return 1;"#)
            .await;
        let (mf, mt, _) = axis(&b).await;
        assert!(
            (mf - 0.5 * to0).abs() <= to0 * 0.01 + 1e3
                && (mt - 0.9 * to0).abs() <= to0 * 0.01 + 1e3,
            "{mf}..{mt} of {to0}"
        );
        let brush = b
            .js("const m = document.querySelector('#minimap').getBoundingClientRect(), r = document.querySelector('#mmBrush').getBoundingClientRect(); return [(r.left - m.left) / m.width, r.width / m.width]")
            .await;
        let brush: (f64, f64) = serde_json::from_value(brush).unwrap();
        assert!(
            (brush.0 - 0.5).abs() < 0.02 && (brush.1 - 0.4).abs() < 0.02,
            "{brush:?}"
        );
        // A redelivery is marked with why.
        let again = b
            .text("tr.hop[data-key=\"deliver/billing/billing-1/1\"] .mark")
            .await;
        assert!(
            again.contains("delivered again (attempt 2)") && again.contains("card declined"),
            "{again}"
        );
        nothing_cut_off(&b, w).await;

        // The dead letter: marked on its bar with the broker's reason.
        b.open(&format!("{}/#{dead}", l.url())).await;
        b.until(
            "the dead letter",
            "document.querySelector('table.wf .mark.dead')",
            "document.querySelector('#traceBody').innerText",
        )
        .await;
        let t: Trajectory = l.client.trajectory(&dead, None).await.unwrap();
        let r1 = t
            .hops
            .iter()
            .find_map(|h| {
                h.events
                    .iter()
                    .find(|r| {
                        r.stage == msgtrail_core::Stage::Redelivery
                            && r.outcome.as_deref() == Some("dead_letter")
                    })
                    .map(|r| (h.key.clone(), r.clone()))
            })
            .expect("an R1 record");
        let mark = b
            .text(&format!("tr.hop[data-key=\"{}\"] .mark.dead", r1.0))
            .await;
        assert!(mark.starts_with("✝ dead-lettered"), "{mark}");
        if let Some(why) = r1.1.detail.as_deref().filter(|d| !d.is_empty()) {
            assert!(mark.contains(why), "{mark} / {why}");
        } else {
            assert!(mark.contains("no stock"), "{mark}");
        }
        // Consumed by billing, audit's delivery still open: audit shows as still waiting.
        b.open(&format!("{}/#{pending}", l.url())).await;
        b.until(
            "the group still waiting",
            "document.querySelector('#groupsWaiting')",
            "document.querySelector('#traceBody').innerText",
        )
        .await;
        let waiting = b.text("#groupsWaiting").await;
        assert!(
            waiting.contains("audit") && !waiting.contains("billing"),
            "{waiting}"
        );
    }
    drop(held); // audit never settles it: redelivered after the ack wait, not our concern
    b.close().await;
}

/// The live list holds still while it is read: scrolled down, new messages wait behind
/// "N new" and the row under the reader stays; back at the top (or a click), they come in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stable_live_list() {
    let sys = TestSystem::start().await;
    let l = sys.start_listener(|_| {}).await;
    let producer = sys.producer("shop").await;
    let mut last = String::new();
    for i in 0..40 {
        last = producer
            .send(&format!("orders.n{i}"), "x")
            .await
            .unwrap()
            .message_id
            .to_string();
    }
    l.trajectory_when(&last, |t| t.hops.len() >= 2).await;
    let b = Browser::start(WIDTHS[0]).await;
    b.open(&l.url()).await;
    let mut total = 40;
    b.until(
        "forty rows",
        &format!("{ROWS}.length === 40"),
        &format!("{ROWS}.length"),
    )
    .await;
    for w in WIDTHS {
        width(&b, w).await;
        b.js("const w = document.querySelector('#listwrap'); w.scrollTop = 300; return 1")
            .await;
        let under = r#"(() => { const w = document.querySelector('#listwrap').getBoundingClientRect();
            const e = document.elementFromPoint(w.left + 40, w.top + 60); const tr = e && e.closest('tr.msg');
            return tr ? [tr.dataset.key, Math.round(tr.getBoundingClientRect().top)] : null; })()"#;
        let before = b
            .js(&format!("window.readRow = {under}; return window.readRow"))
            .await;
        assert!(before.is_array(), "a row under the reader: {before}");
        for i in 0..2 {
            last = producer
                .send(&format!("orders.late{w}x{i}"), "x")
                .await
                .unwrap()
                .message_id
                .to_string();
        }
        total += 2;
        l.trajectory_when(&last, |t| t.hops.len() >= 2).await;
        b.until(
            "2 new, said",
            "!document.querySelector('#newRows').hidden && document.querySelector('#newRows').innerText.startsWith('2 new')",
            "document.querySelector('#newRows').outerHTML",
        )
        .await;
        tokio::time::sleep(Duration::from_millis(5500)).await; // another refresh
        assert_eq!(
            b.js(&format!("return {under}")).await,
            before,
            "the row under the reader stayed"
        );
        assert_eq!(b.js(&format!("return {ROWS}.length")).await, total - 2);
        assert_eq!(
            b.text("#status").await,
            "2 new messages; the list holds still while you read it"
        );
        b.click("#newRows").await;
        b.until(
            "the new rows in",
            &format!("{ROWS}.length === {total}"),
            &format!("{ROWS}.length"),
        )
        .await;
        assert_eq!(
            b.js("return document.querySelector('#listwrap').scrollTop")
                .await,
            0
        );
        assert!(b
            .js("return document.querySelector('#newRows').hidden")
            .await
            .as_bool()
            .unwrap());
        assert_eq!(
            b.js(&format!(
                "return {ROWS}[0].innerText.includes('orders.late{w}x1')"
            ))
            .await,
            true
        );
    }
    // Only the status line is live (the trajectory redraws every 2 s: it is not).
    let live = b
        .js("return [...document.querySelectorAll('[aria-live]')].map(e => e.id)")
        .await;
    assert_eq!(live, serde_json::json!(["status"]));
    b.close().await;
}

/// The rest: errors in words, "List its messages" runs and shows the search, a consumer's
/// view lists its group's messages and shows its clock offset, the favicon, named buttons
/// and visible focus.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_views_and_accessibility() {
    let sys = TestSystem::start().await;
    let l = sys.start_listener(|_| {}).await;
    let producer = sys.producer("shop").await;
    let billing = sys.consumer("billing-1").await;
    let mut ids = vec![];
    for topic in ["orders.eu", "orders.us"] {
        ids.push(
            producer
                .send(topic, "x")
                .await
                .unwrap()
                .message_id
                .to_string(),
        );
        pull(&billing, "billing", "orders.*", None).await;
    }
    let other = producer
        .send("payments.eu", "x")
        .await
        .unwrap()
        .message_id
        .to_string();
    for id in &ids {
        l.trajectory_when(id, |t| consumed_by(t, 1)).await;
    }
    l.trajectory_when(&other, |t| t.hops.len() >= 2).await;
    let (status, ctype, body) = http_get(&l, "/favicon.ico");
    assert_eq!((status, ctype.as_str()), (200, "image/svg+xml"), "{body}");
    assert!(body.starts_with("<svg"));
    let clocks = get_json(&l, "/api/clients/billing-1");
    let b = Browser::start(WIDTHS[0]).await;
    for w in WIDTHS {
        width(&b, w).await;
        b.open(&l.url()).await;
        b.until("three rows", &format!("{ROWS}.length === 3"), "1")
            .await;
        assert_eq!(
            b.js("return document.querySelector('link[rel=icon]').getAttribute('href')")
                .await,
            "favicon.ico"
        );
        // Errors in words.
        b.type_into("#f-attr", "customer").await;
        b.click("#search button[type=submit]").await;
        b.until(
            "the attribute error",
            "document.querySelector('#list').innerText.includes('key=value')",
            "document.querySelector('#list').innerText",
        )
        .await;
        let err = b.text("#list").await;
        assert!(
            err.contains(
                "an attribute is searched as key=value (such as category=refund), not \"customer\""
            ),
            "{err}"
        );
        assert!(!err.contains("Some("), "{err}");
        b.open(&format!("{}/#/groups/nogroup", l.url())).await;
        b.until(
            "the group's 404",
            "document.querySelector('#viewBody').innerText.includes('Not found')",
            "document.querySelector('#viewBody').innerText",
        )
        .await;
        let nf = b.text("#viewBody").await;
        assert!(!nf.to_lowercase().contains("not found: not found"), "{nf}");
        assert!(nf.contains("\"nogroup\""), "{nf}");
        // "List its messages" runs the search and shows it.
        b.open(&format!("{}/#/groups/billing", l.url())).await;
        b.until(
            "billing's view",
            "document.querySelector('a[data-list-group]')",
            "document.querySelector('#viewBody').innerText",
        )
        .await;
        b.js("window.scrollTo(0, document.body.scrollHeight); return 1")
            .await;
        b.click("a[data-list-group]").await;
        let listed = format!("{ROWS}.map(r => r.dataset.id).sort().join(',')");
        let mut want = ids.clone();
        want.sort();
        b.until(
            "billing's messages listed",
            &format!("{listed} === '{}'", want.join(",")),
            &listed,
        )
        .await;
        assert_eq!(
            b.js("return document.querySelector('#f-group').value")
                .await,
            "billing"
        );
        assert!(b
            .js("return location.search")
            .await
            .as_str()
            .unwrap()
            .contains("group=billing"));
        assert_eq!(b.js("const r = document.querySelector('#results').getBoundingClientRect(); return r.top < window.innerHeight && r.bottom > 0").await, true);
        // A consumer's view: its group's messages (not a producer search), its clock offset.
        b.open(&format!("{}/#/clients/billing-1", l.url())).await;
        b.until(
            "billing-1's view",
            "document.querySelector('#clientClocks')",
            "document.querySelector('#viewBody').innerText",
        )
        .await;
        let first = &clocks["clocks"][0];
        if first.is_object() {
            let shown = b.text("#clientClocks").await;
            let offset = first["offset_nanos"].as_i64().unwrap();
            let want = format!("± {:.3} ms", first["bound_nanos"].as_f64().unwrap() / 1e6);
            assert!(
                shown.contains(if offset >= 0 { "+" } else { "−" })
                    && (shown.contains(&want)
                        || first["bound_nanos"].as_u64().unwrap() >= 1_000_000),
                "{shown} / {first}"
            );
        }
        assert!(
            b.js("return !document.querySelector('a[data-list-producer]')")
                .await
                .as_bool()
                .unwrap(),
            "a consumer produced nothing"
        );
        b.click("a[data-list-group=\"billing\"]").await;
        b.until(
            "its group's messages",
            &format!("{listed} === '{}'", want.join(",")),
            &listed,
        )
        .await;
        // Named buttons; visible focus on a hop row; nothing cut off.
        b.open(&format!("{}/#{}", l.url(), ids[0])).await;
        b.until(
            "the waterfall",
            "document.querySelector('table.wf tr.hop')",
            "1",
        )
        .await;
        let names = b
            .js("return [...document.querySelectorAll('button')].filter(x => x.offsetParent).map(x => x.getAttribute('aria-label') || x.innerText.trim()).filter(n => n.length < 2 || /^[+−▾▸]$/.test(n))")
            .await;
        assert_eq!(names, serde_json::json!([]), "buttons without a name");
        let focus = b
            .js("const r = document.querySelector('table.wf tr.hop'); r.focus(); const s = getComputedStyle(r); return [s.outlineStyle, s.outlineWidth]")
            .await;
        assert_eq!(focus, serde_json::json!(["solid", "2px"]));
        nothing_cut_off(&b, w).await;
    }
    b.close().await;
}

/// With a token: the page says how to give one and takes it; a token given in the address
/// is used and leaves the address bar.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token() {
    let sys = TestSystem::start().await;
    let l = sys
        .start_listener(|c| c.token = Some("s3cret-token".to_owned().into()))
        .await;
    for w in WIDTHS {
        let b = Browser::start(w).await;
        b.open(&l.url()).await;
        b.until(
            "the token box",
            "!document.querySelector('#tokenBox').hidden",
            "document.body.innerText",
        )
        .await;
        assert!(b.text("#tokenBox").await.contains("--token"));
        b.type_into("#tokenIn", "s3cret-token").await;
        b.click("#tokenBox button").await;
        b.until("the data with the token", "/funnel/.test(document.querySelector('#statsBody').innerText) && document.querySelector('#tokenBox').hidden", "document.body.innerText").await;
        b.close().await;
        let b = Browser::start(w).await;
        b.open(&format!("{}/?token=s3cret-token#/groups", l.url()))
            .await;
        b.until(
            "the data with the URL's token",
            "/funnel/.test(document.querySelector('#statsBody').innerText)",
            "document.body.innerText",
        )
        .await;
        assert_eq!(b.js("return location.search").await, "");
        assert_eq!(b.js("return location.hash").await, "#/groups");
        assert!(b
            .js("return document.querySelector('#tokenBox').hidden")
            .await
            .as_bool()
            .unwrap());
        b.close().await;
    }
}
