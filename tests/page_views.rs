//! The page's views beyond one message, in a real headless Chromium against a real
//! nats-server, broker and listener (helpers in tests/common/browser.rs): a consumer group's
//! numbers after real traffic, the dead letters and the trajectory each opens, the
//! waterfall's zoom and collapse, clock bounds, a client's events.

use msgtrail_client::Outgoing;
use msgtrail_core::trajectory::{MessageState, Trajectory};
use msgtrail_e2e::browser::{http_get, pull, sub, Browser};
use msgtrail_e2e::{TestListener, TestSystem};
use serde_json::Value;
use std::time::Duration;

fn consumed(t: &Trajectory, groups: usize) -> bool {
    t.state == MessageState::Consumed
        && t.groups.len() == groups
        && t.hops.iter().all(|h| h.end.is_some())
}

fn get_json(l: &TestListener, path: &str) -> Value {
    let (status, _, body) = http_get(l, path);
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap()
}

async fn send(sys: &TestSystem, topic: &str) -> String {
    sys.producer("shop")
        .await
        .send_message(Outgoing::new(topic, "{\"order\": 1}"))
        .await
        .unwrap()
        .message_id
        .to_string()
}

/// The group view counts what billing did: one message consumed after a failed first
/// attempt (a redelivery), one consumed at once, one stored and not fetched yet (backlog);
/// its member and per-segment latencies; reached from the nav and from a trajectory. The
/// list marks the message that failed once although it ended consumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_group_view_after_real_traffic() {
    let sys = TestSystem::start().await;
    let l = sys.start_listener(|_| {}).await;
    let billing = sys.consumer("billing-1").await;
    let retried = send(&sys, "orders.eu").await;
    pull(&billing, "billing", "orders.*", Some("card declined")).await;
    assert_eq!(
        pull(&billing, "billing", "orders.*", None)
            .await
            .delivery_attempt,
        2
    );
    let once = send(&sys, "orders.eu").await;
    pull(&billing, "billing", "orders.*", None).await;
    let waiting = send(&sys, "orders.eu").await;
    for id in [&retried, &once] {
        l.trajectory_when(id, |t| consumed(t, 1)).await;
    }
    l.trajectory_when(&waiting, |t| t.state == MessageState::Enqueued)
        .await;

    let api = get_json(&l, "/api/groups/billing");
    let c = &api["counts"];
    assert_eq!(
        (
            &c["messages"],
            &c["consumed"],
            &c["not_delivered"],
            &c["backlog"]
        ),
        (
            &Value::from(2),
            &Value::from(2),
            &Value::from(1),
            &Value::from(1)
        ),
        "{api}"
    );
    assert_eq!(api["redeliveries"], 1, "{api}");
    assert_eq!(api["members"][0]["consumer"], "billing-1", "{api}");
    assert_eq!(api["members"][0]["deliveries"], 3, "{api}");
    let deliver = api["segments"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["segment"] == "deliver")
        .unwrap_or_else(|| panic!("a deliver segment: {api}"));
    assert_eq!(deliver["count"], 3, "{api}");

    let b = Browser::start(1280).await;
    b.open(&l.url()).await;
    // The list marks the retried message: consumed, and it had a failure and a redelivery.
    let row = format!("#list tr.msg[data-id=\"{retried}\"]");
    b.until(
        "the retried message listed",
        &format!("document.querySelector('{row}')"),
        "document.querySelector('#list').innerText",
    )
    .await;
    let marked = b.text(&row).await;
    assert!(
        marked.contains("consumed")
            && marked.contains("had a failure")
            && marked.contains("redelivered"),
        "{marked}"
    );
    assert!(!b
        .text(&format!("#list tr.msg[data-id=\"{once}\"]"))
        .await
        .contains("had a failure"));

    // From the nav: every group, then billing's numbers.
    b.click("#nav-groups").await;
    b.until(
        "the groups table",
        "document.querySelector('#groups tr.group[data-group=\"billing\"]')",
        "document.querySelector('#viewBody').innerText",
    )
    .await;
    let line = b.text("#groups tr.group[data-group=\"billing\"]").await;
    assert!(
        line.starts_with("billing\t2\t0\t1\t2"),
        "messages, in flight, backlog, consumed: {line}"
    );
    b.click("#groups a.group-link").await;
    b.until(
        "billing's view",
        "document.querySelector('[data-n=\"redeliveries\"]')",
        "document.querySelector('#viewBody').innerText",
    )
    .await;
    assert_eq!(b.text("#viewTitle").await, "Consumer group billing");
    for (n, want) in [
        ("consumed", "2"),
        ("backlog", "1"),
        ("not_delivered", "1"),
        ("redeliveries", "1"),
        ("dead_letters", "0"),
    ] {
        assert_eq!(b.text(&format!("[data-n=\"{n}\"] b")).await, want, "{n}");
    }
    assert!(b.text("#members").await.contains("billing-1"));
    let segs = b.text("#segments").await;
    assert!(
        segs.contains("queue wait") && segs.contains("deliver") && segs.contains("process"),
        "{segs}"
    );

    // From a trajectory: the group's name links to its view.
    b.open(&format!("{}/#{once}", l.url())).await;
    b.until(
        "the trajectory",
        "document.querySelector('table.wf')",
        "document.querySelector('#traceBody').innerText",
    )
    .await;
    assert!(b
        .js("return document.querySelector('#view').hidden")
        .await
        .as_bool()
        .unwrap());
    b.click("#traceBody table:not(.wf) a.group-link").await;
    b.until("billing's view from the trajectory", "document.querySelector('#viewTitle').innerText === 'Consumer group billing' && !document.querySelector('#view').hidden && document.querySelector('#trace').hidden", "document.querySelector('#viewTitle').innerText")
        .await;
    // Back: the trajectory again.
    b.client.back().await.unwrap();
    b.until(
        "the trajectory after going back",
        "!document.querySelector('#trace').hidden && document.querySelector('table.wf')",
        "document.querySelector('main').innerText",
    )
    .await;
    let (status, _, body) = http_get(&l, "/api/groups/nobody");
    assert_eq!(status, 404, "{body}");
    b.close().await;
}

/// A message the consumer terminates is dead-lettered: the dead-letter view lists it with
/// its group, consumer and the broker's reason, and its link opens the trajectory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dead_letter_view_opens_the_trajectory() {
    let sys = TestSystem::start().await;
    let l = sys.start_listener(|_| {}).await;
    let billing = sys.consumer("billing-1").await;
    let dead = send(&sys, "orders.us").await;
    let got = billing
        .fetch(&sub("billing", "orders.*"), 1, Duration::from_secs(3))
        .await
        .unwrap();
    got[0].term("unreadable order").await.unwrap();
    l.trajectory_when(&dead, |t| t.state == MessageState::DeadLettered)
        .await;
    let api = get_json(&l, "/api/dead-letters");
    assert_eq!(api.as_array().unwrap().len(), 1, "{api}");
    assert_eq!(
        (&api[0]["message_id"], &api[0]["group"]),
        (&Value::from(dead.as_str()), &Value::from("billing"))
    );
    let reason = api[0]["reason"].as_str().unwrap().to_owned();
    assert!(reason.contains("unreadable order"), "{reason}");

    let b = Browser::start(1280).await;
    b.open(&l.url()).await;
    b.click("#nav-dead").await;
    b.until(
        "the dead letter listed",
        &format!("document.querySelector('#dead tr.dl[data-id=\"{dead}\"]')"),
        "document.querySelector('#viewBody').innerText",
    )
    .await;
    let row = b.text(&format!("#dead tr.dl[data-id=\"{dead}\"]")).await;
    for want in ["orders.us", "billing", "billing-1 #1", reason.as_str()] {
        assert!(row.contains(want), "{want} in {row}");
    }
    b.click(&format!("#dead tr.dl[data-id=\"{dead}\"] a.open"))
        .await;
    b.until("its trajectory", &format!("!document.querySelector('#trace').hidden && document.querySelector('#traceBody').innerText.includes('{dead}') && document.querySelector('table.wf')"), "document.querySelector('main').innerText")
        .await;
    assert!(b.text("#traceBody").await.contains("dead_lettered"));
    b.close().await;
}

/// A bound as the page writes it: three decimals below a millisecond.
fn page_ms(nanos: u64) -> String {
    let v = nanos as f64 / 1e6;
    match v {
        v if v < 1.0 => format!("{v:.3} ms"),
        v if v >= 1000.0 => format!("{:.2} s", v / 1000.0),
        v if v >= 10.0 => format!("{v:.0} ms"),
        v => format!("{v:.1} ms"),
    }
}

/// The bars' geometry: (axis from, axis to, tick texts, visible hop keys).
async fn axis(b: &Browser) -> Value {
    b.js(r#"const a = document.querySelector('table.wf .axis');
        return [+a.dataset.from, +a.dataset.to, a.innerText,
                [...document.querySelectorAll('table.wf tr.hop')].map(r => r.dataset.key)];"#)
        .await
}

/// Zoom halves the axis around its middle and reset restores it; a drag zooms into the
/// range dragged over; collapsing a group hides its hops behind one bar.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zoom_and_collapse_the_waterfall() {
    let sys = TestSystem::start().await;
    let l = sys.start_listener(|_| {}).await;
    let id = send(&sys, "orders.eu").await;
    pull(
        &sys.consumer("billing-1").await,
        "billing",
        "orders.*",
        None,
    )
    .await;
    pull(&sys.consumer("audit-1").await, "audit", "orders.*", None).await;
    l.trajectory_when(&id, |t| consumed(t, 2)).await;

    let b = Browser::start(1280).await;
    b.open(&format!("{}/#{id}", l.url())).await;
    b.until(
        "the waterfall",
        "document.querySelector('table.wf tr.hop[data-key^=\"process/audit\"]')",
        "document.querySelector('#traceBody').innerText",
    )
    .await;
    let full = axis(&b).await;
    let (from, to) = (full[0].as_f64().unwrap(), full[1].as_f64().unwrap());
    assert_eq!(from, 0.0, "{full}");
    b.click("#zoomIn").await;
    let zoomed = axis(&b).await;
    let (zf, zt) = (zoomed[0].as_f64().unwrap(), zoomed[1].as_f64().unwrap());
    // Within a microsecond: Unix nanoseconds are beyond a double's exact integers.
    assert!(
        ((zt - zf) - (to - from) / 2.0).abs() <= 1e3,
        "half the range: {full} → {zoomed}"
    );
    assert!(
        ((zf + zt) / 2.0 - (from + to) / 2.0).abs() <= 1e3,
        "around the middle: {zoomed}"
    );
    assert_ne!(zoomed[2], full[2], "the ticks say the new range");
    assert!(b.text("#zoomRange").await.starts_with("showing +"));
    b.click("#zoomReset").await;
    assert_eq!(axis(&b).await, full, "reset restores the axis");
    // A drag over the middle half of a track.
    b.js(r#"const t = document.querySelector('table.wf tr.hop .track'), r = t.getBoundingClientRect();
        const at = f => ({ bubbles: true, button: 0, clientX: r.left + f * r.width, clientY: r.top + 5 });
        t.dispatchEvent(new MouseEvent('mousedown', at(0.25)));
        window.dispatchEvent(new MouseEvent('mouseup', at(0.75))); return 1;"#)
        .await;
    let dragged = axis(&b).await;
    let (df, dt) = (dragged[0].as_f64().unwrap(), dragged[1].as_f64().unwrap());
    assert!(
        (df - to * 0.25).abs() <= to * 0.02 + 1e3 && (dt - to * 0.75).abs() <= to * 0.02 + 1e3,
        "{full} → {dragged}"
    );
    b.click("#zoomReset").await;

    // Collapse billing: its hops go, one bar stands for them; audit's stay.
    let keys = |v: &Value| -> Vec<String> {
        v[3].as_array()
            .unwrap()
            .iter()
            .map(|k| k.as_str().unwrap().to_owned())
            .collect()
    };
    assert!(keys(&full)
        .iter()
        .any(|k| k.starts_with("deliver/billing/")));
    b.click("button.collapse[data-group=\"billing\"]").await;
    let folded = keys(&axis(&b).await);
    assert!(
        !folded.iter().any(|k| k.contains("/billing/")),
        "{folded:?}"
    );
    assert!(
        folded.iter().any(|k| k.starts_with("deliver/audit/")),
        "{folded:?}"
    );
    assert_eq!(folded.len() + 2, keys(&full).len(), "{folded:?}");
    let bar = b
        .js("return document.querySelectorAll('tr.grp[data-group=\"billing\"] .seg-group').length")
        .await;
    assert_eq!(bar, 1);
    b.click("button.collapse[data-group=\"billing\"]").await;
    assert_eq!(keys(&axis(&b).await), keys(&full), "expanded again");
    b.close().await;
}

/// A hop across two clocks shows its arrival with the bound ("± …"), the trajectory its
/// clock estimates; a consumer's ID opens its channel events and no-match notices.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clock_bounds_and_a_client_s_events() {
    let sys = TestSystem::start().await;
    let l = sys.start_listener(|_| {}).await;
    let billing = sys.consumer("billing-1").await;
    // Nothing to fetch yet: a no-match notice (N1) for billing-1.
    let none = billing
        .fetch(
            &sub("billing", "nothing.here"),
            1,
            Duration::from_millis(200),
        )
        .await
        .unwrap();
    assert!(none.is_empty());
    let id = send(&sys, "orders.eu").await;
    pull(&billing, "billing", "orders.*", None).await;
    let t = l
        .trajectory_when(&id, |t| {
            consumed(t, 1) && t.hops.iter().any(|h| h.arrival_bound_nanos.is_some())
        })
        .await;
    let events = get_json(&l, "/api/clients/billing-1/events");
    let n = events["events"].as_array().unwrap().len();
    assert!(n >= 2, "a channel event and a no-match notice: {events}");

    let b = Browser::start(1280).await;
    b.open(&format!("{}/#{id}", l.url())).await;
    b.until(
        "the waterfall",
        "document.querySelector('table.wf')",
        "document.querySelector('#traceBody').innerText",
    )
    .await;
    for h in t.hops.iter().filter(|h| h.arrival_bound_nanos.is_some()) {
        let row = format!("tr.hop[data-key=\"{}\"]", h.key);
        let took = b.text(&format!("{row} td:nth-child(3)")).await;
        let bound = page_ms(h.arrival_bound_nanos.unwrap());
        assert!(took.ends_with(&format!("± {bound}")), "{}: {took}", h.key);
        let words = b.text(&format!("{row} .clockline")).await;
        assert!(
            words.starts_with("arrived after ") && words.contains(&format!(" ± {bound}")),
            "{}: {words}",
            h.key
        );
    }
    assert!(
        !t.clocks.is_empty(),
        "an arrival comes from a clock estimate"
    );
    assert!(b.text("#clocks").await.contains("billing-1"));
    assert!(b.text("#clocks").await.contains("±"));
    // Each estimate names the broker instance it was measured against.
    let instance = t.clocks[0]
        .broker
        .as_ref()
        .expect("the broker stamps its records");
    assert!(
        b.text("#clocks")
            .await
            .contains(&format!("vs broker {instance}")),
        "{}",
        b.text("#clocks").await
    );
    // The consumer's ID in a hop's detail opens its events.
    let process = t
        .hops
        .iter()
        .find(|h| h.key.starts_with("process/"))
        .unwrap();
    b.click(&format!("tr.hop[data-key=\"{}\"]", process.key))
        .await;
    b.until(
        "the hop's detail",
        "document.querySelector('tr.detail a.client-link')",
        "document.querySelector('#traceBody').innerText",
    )
    .await;
    b.click("tr.detail a.client-link").await;
    b.until(
        "billing-1's events",
        &format!("document.querySelectorAll('#events tr.ev').length === {n}"),
        "document.querySelector('#viewBody').innerText",
    )
    .await;
    assert_eq!(b.text("#viewTitle").await, "Client billing-1");
    let listed = b.text("#events").await;
    assert!(
        listed.contains("A1 channel") && listed.contains("N1 no matching message"),
        "{listed}"
    );
    b.close().await;
}

/// A process hop whose consumer clock says it settled before it received (clocks that
/// disagree): its time shows as "?" with why, in the row and in its detail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_impossible_hop_shows_a_question_mark_and_why() {
    use msgtrail_core::encode_batch;
    use msgtrail_core::subjects::STAGE_SUBJECT;
    use msgtrail_core::{ClientId, MessageId, Stage, StageRecord};
    let sys = TestSystem::start().await;
    let l = sys.start_listener(|_| {}).await;
    let m = MessageId::new();
    let t0 = msgtrail_core::time::now_nanos();
    let ms = 1_000_000;
    let rec = |stage: Stage, at: u64| {
        let mut r = StageRecord::at(stage, at);
        r.message_id = Some(m);
        r.topic = Some("orders.eu".into());
        if !matches!(stage, Stage::UploadReceived | Stage::Stored) {
            r.group = Some(msgtrail_core::GroupId::new("billing").unwrap());
            r.consumer = Some(ClientId::new("billing-1").unwrap());
            r.attempt = Some(1);
        }
        r
    };
    let records = [
        rec(Stage::UploadReceived, t0),
        rec(Stage::Stored, t0 + ms),
        rec(Stage::PullSent, t0 + 2 * ms),
        rec(Stage::PullReceived, t0 + 10 * ms),
        // Settled 5 ms before it was received, by the consumer's clock.
        rec(Stage::PullAckSent, t0 + 5 * ms),
        rec(Stage::PullAckReceived, t0 + 20 * ms)
            .with_outcome(msgtrail_core::outcome::SettleKind::Ack),
    ];
    let js = async_nats::jetstream::new(sys.nats.clone());
    js.publish(STAGE_SUBJECT, encode_batch(&records).into())
        .await
        .unwrap()
        .await
        .unwrap();
    let id = m.to_string();
    let t = l
        .trajectory_when(&id, |t| t.hops.iter().any(|h| h.impossible.is_some()))
        .await;
    let hop = t.hops.iter().find(|h| h.impossible.is_some()).unwrap();
    let why = hop.impossible.clone().unwrap();

    let b = Browser::start(1280).await;
    b.open(&format!("{}/#{id}", l.url())).await;
    let row = format!("tr.hop[data-key=\"{}\"]", hop.key);
    b.until(
        "the waterfall",
        &format!("document.querySelector('{row}')"),
        "document.querySelector('#traceBody').innerText",
    )
    .await;
    let took = b.text(&format!("{row} td:nth-child(3)")).await;
    assert!(took.starts_with('?'), "{took}");
    assert!(b
        .text(&format!("{row} .impossible-why"))
        .await
        .contains(&why));
    b.click(&row).await;
    b.until("the detail", "document.querySelector('tr.detail')", "1")
        .await;
    let detail = b.text("tr.detail").await;
    assert!(detail.contains(&format!("? {why}")), "{detail}");
    b.close().await;
}
