//! The listener page driven in a real headless Chromium over WebDriver (chromedriver), against
//! a real nats-server, broker and listener: what a person sees and does on the page.
//!
//! Needs Debian's `chromium` and `chromium-driver` (`scripts/install-chromium.sh` installs
//! them; `CHROMEDRIVER` and `CHROME_BIN` point elsewhere). Without them every test here fails
//! saying so: none skips itself.

use fantoccini::key::Key;
use fantoccini::Locator;
use msgtrail_client::Outgoing;
use msgtrail_core::trajectory::{MessageState, Trajectory};
use msgtrail_e2e::browser::{dead_letter, http_get, pull, Browser};
use msgtrail_e2e::{TestListener, TestSystem};
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;

fn consumed_by(t: &Trajectory, groups: usize) -> bool {
    t.state == MessageState::Consumed
        && t.groups.len() == groups
        && t.hops.iter().all(|h| h.end.is_some())
}

/// The page lists what the listener stored, its statistics count group completions apart
/// from acked messages (bug 2), and a trajectory opens from the list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_lists_messages_and_opens_a_trajectory() {
    let sys = TestSystem::start().await;
    let l = sys.start_listener(|_| {}).await;
    let producer = sys.producer("shop").await;
    let billing = sys.consumer("billing-1").await;
    let audit = sys.consumer("audit-1").await;
    let reply = producer
        .send_message(Outgoing::new("orders.eu", "hello").attr("category", "refund"))
        .await
        .unwrap();
    pull(&billing, "billing", "orders.*", None).await;
    pull(&audit, "audit", "orders.*", None).await;
    let id = reply.message_id.to_string();
    l.trajectory_when(&id, |t| consumed_by(t, 2)).await;

    let b = Browser::start(1280).await;
    b.open(&l.url()).await;
    b.until(
        "the message in the list",
        &format!("document.querySelector('#list [data-id=\"{id}\"]')"),
        "document.querySelector('#list').innerText",
    )
    .await;
    // Bug 2: one message consumed by two groups is 2 group completions and 1 acked message.
    b.until(
        "the end-to-end line counts group completions",
        "/2 group completions/.test(document.querySelector('#statsBody').innerText)",
        "document.querySelector('#statsBody').innerText",
    )
    .await;
    let stats = b.text("#statsBody").await;
    assert!(stats.contains("acked 1 (100%)"), "{stats}");
    assert!(!stats.contains("2 msgs"), "{stats}");
    b.client
        .find(Locator::Css(&format!("#list [data-id=\"{id}\"]")))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    b.until(
        "the trajectory opens",
        &format!("document.querySelector('#traceBody').innerText.includes('{id}')"),
        "document.querySelector('#traceBody').innerText",
    )
    .await;
    let trace = b.text("#traceBody").await;
    assert!(trace.contains("consumed"), "{trace}");
    assert!(trace.contains("category=refund"), "{trace}");
    // Bug 4: the open message's row is highlighted.
    let selected = b
        .js("return [...document.querySelectorAll('#list tr[aria-selected=\"true\"]')].map(r => r.dataset.id)")
        .await;
    assert_eq!(selected, serde_json::json!([id]));
    // Bug 3: 246 of 247 never reads 100 %.
    assert_eq!(b.js("return pct(246, 247)").await, " (99.5%)");
    assert_eq!(b.js("return pct(1, 100000)").await, " (<0.1%)");
    assert_eq!(b.js("return pct(247, 247)").await, " (100%)");
    b.close().await;
}

/// Sends `orders.eu` "refund" (billing fails its first attempt, the redelivery succeeds) and
/// `payments.eu` "food" (no consumer: it waits in the queue until its deadline): (the first
/// message ID, the second).
async fn redelivered_and_stuck(sys: &TestSystem, l: &TestListener) -> (String, String) {
    let producer = sys.producer("shop").await;
    let billing = sys.consumer("billing-1").await;
    let refund = producer
        .send_message(Outgoing::new("orders.eu", "{\"order\": 42}").attr("category", "refund"))
        .await
        .unwrap()
        .message_id
        .to_string();
    pull(&billing, "billing", "orders.*", Some("card declined")).await;
    let again = pull(&billing, "billing", "orders.*", None).await;
    assert_eq!(again.delivery_attempt, 2);
    let food = producer
        .send_message(Outgoing::new("payments.eu", "food").attr("category", "food"))
        .await
        .unwrap()
        .message_id
        .to_string();
    l.trajectory_when(&refund, |t| consumed_by(t, 1)).await;
    l.trajectory_when(&food, |t| t.state == MessageState::Stuck)
        .await;
    (refund, food)
}

fn short_deadlines(c: &mut msgtrail_listener::ListenerConfig) {
    c.deadlines.delivered_ms = 300;
}

/// The waterfall of a redelivered message: bars proportional to time on one axis, the queue
/// wait as its own segment, a hop's detail on click with its events in words, the payload
/// head and upload counts, times with their zone; the trajectory keeps refreshing after
/// "consumed" while another group receives it (bug 1); a stuck message shows how long it
/// has waited so far, and where.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waterfall_of_a_redelivered_and_a_stuck_message() {
    let sys = TestSystem::start().await;
    let l = sys.start_listener(short_deadlines).await;
    let (refund, food) = redelivered_and_stuck(&sys, &l).await;
    let api = l.client.trajectory(&refund, None).await.unwrap();

    let b = Browser::start(1280).await;
    b.open(&format!("{}/#{refund}", l.url())).await;
    b.until(
        "the deep-linked trajectory",
        "document.querySelector('table.wf') && document.querySelector('#traceBody').innerText.includes('consumed')",
        "document.querySelector('#traceBody').innerText",
    )
    .await;
    // Every bar's width is its duration over the shared axis; queue waits are segments of
    // their own.
    let bars = b
        .js(r#"const span = +document.querySelector('table.wf').dataset.span;
            return [...document.querySelectorAll('table.wf .track span')].map(s => {
              const w = s.getBoundingClientRect().width, track = s.parentElement.getBoundingClientRect().width;
              return { want: +(s.dataset.dur || s.dataset.wait) / span, got: w / track, wait: !!s.dataset.wait, px: track,
                       hop: s.closest('tr').dataset.key };
            });"#)
        .await;
    let bars = bars.as_array().unwrap();
    assert_eq!(
        bars.iter()
            .filter(|b| !b["wait"].as_bool().unwrap())
            .count(),
        api.hops.len(),
        "one bar per hop: {bars:?}"
    );
    for bar in bars {
        let (want, got) = (bar["want"].as_f64().unwrap(), bar["got"].as_f64().unwrap());
        let px = bar["px"].as_f64().unwrap();
        assert!(px > 250.0, "the axis uses the room it has: {bar}");
        assert!(
            (got - want).abs() <= 1.5 / px,
            "bar proportional to its time: {bar}"
        );
    }
    let waits: Vec<&str> = bars
        .iter()
        .filter(|b| b["wait"].as_bool().unwrap())
        .map(|b| b["hop"].as_str().unwrap())
        .collect();
    assert!(
        waits.contains(&"deliver/billing/billing-1/1"),
        "a queue-wait segment before the first delivery: {bars:?}"
    );
    let trace = b.text("#traceBody").await;
    assert!(trace.contains("queue wait"), "{trace}");
    assert!(trace.contains("redelivery wait"), "{trace}");
    // Upload counts and the payload head the API returns.
    let upload = b.text("#upload").await;
    assert!(
        upload.contains(&format!("{} upload attempt(s)", api.upload_attempts)),
        "{upload}"
    );
    assert!(
        upload.contains(&format!("{} duplicate(s)", api.duplicates)),
        "{upload}"
    );
    // The payload head, base64 in the API, reads as the text it is.
    assert!(api.payload_head.is_some());
    assert_eq!(b.text("pre.payload").await, "{\"order\": 42}");
    // A hop's detail: span ID, and its events in words.
    let failed = "deliver/billing/billing-1/1";
    b.click(&format!("tr.hop[data-key=\"{failed}\"]")).await;
    b.until(
        "the hop's detail",
        "document.querySelector('tr.detail')",
        "document.querySelector('#traceBody').innerText",
    )
    .await;
    let detail = b.text("tr.detail").await;
    let span_id = api.hop(failed).unwrap().span_id.clone().expect("a span ID");
    assert!(detail.contains(&span_id), "{detail}");
    assert!(detail.contains("C5 fetched by the consumer"), "{detail}");
    assert!(detail.contains("broker got the settle"), "{detail}");
    // Times carry a date and their zone; the local zone is the browser's (UTC+05:30 here).
    assert!(detail.contains(" UTC"), "{detail}");
    b.click("#tz").await;
    b.js("const s = document.querySelector('#tz'); s.value = 'local'; s.dispatchEvent(new Event('change')); return 1")
        .await;
    b.until(
        "local times",
        "document.querySelector('tr.detail').innerText.includes('UTC+05:30')",
        "document.querySelector('tr.detail').innerText",
    )
    .await;
    assert!(b.text("#list thead").await.contains("UTC+05:30"));

    // Bug 1: consumed by billing, then audit receives it: the open trajectory shows it.
    let audit = sys.consumer("audit-1").await;
    pull(&audit, "audit", "orders.*", None).await;
    b.until(
        "the audit group's delivery on the open trajectory",
        "document.querySelector('tr.hop[data-key=\"deliver/audit/audit-1/1\"]')",
        "document.querySelector('#traceBody').innerText",
    )
    .await;

    // The stuck message waits in the queue: how long so far, and where.
    b.type_into("#q", &food).await;
    b.keys(&Key::Enter.to_string()).await;
    b.until(
        "the stuck message's wait",
        "document.querySelector('#waiting')",
        "document.querySelector('#traceBody').innerText",
    )
    .await;
    let waiting = b.text("#waiting").await;
    assert!(waiting.starts_with("stuck: waiting"), "{waiting}");
    assert!(waiting.contains("in the queue"), "{waiting}");
    assert!(b.text("#traceBody").await.contains("so far"));
    let first = b
        .js("return document.querySelector('#waiting').innerText")
        .await;
    b.until(
        "the wait grows while the page looks",
        &format!("document.querySelector('#waiting').innerText !== {first}"),
        "document.querySelector('#waiting').innerText",
    )
    .await;
    b.close().await;
}

/// Search by topic pattern, attribute, producer, group, failure, redelivery, dead letter,
/// minimum end to end and time; and the API's errors are JSON (bug 9).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_and_the_api_errors() {
    let sys = TestSystem::start().await;
    let l = sys.start_listener(short_deadlines).await;
    let (refund, food) = redelivered_and_stuck(&sys, &l).await;

    // Bug 9, over plain HTTP.
    let (status, ctype, body) = http_get(&l, "/api/messages?from=abc");
    assert_eq!(
        (status, ctype.as_str()),
        (400, "application/json"),
        "{body}"
    );
    let err: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(err["kind"], "bad_request", "{body}");
    let (status, ctype, body) = http_get(&l, "/api/nothing/here");
    assert_eq!(
        (status, ctype.as_str()),
        (404, "application/json"),
        "{body}"
    );
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["kind"],
        "not_found"
    );
    let (status, _, body) = http_get(&l, "/api/messages?topic=orders.*");
    assert_eq!(status, 200);
    let found: Vec<Value> = serde_json::from_str(&body).unwrap();
    assert_eq!(found.len(), 1, "{body}");
    assert_eq!(found[0]["message_id"], refund.as_str());

    // A third message that billing fails on every attempt: dead-lettered.
    let dead = dead_letter(&sys, &l).await;
    let set = |of: &[&String]| {
        let mut v: Vec<&str> = of.iter().map(|s| s.as_str()).collect();
        v.sort();
        v.join(",")
    };

    let b = Browser::start(1280).await;
    b.open(&l.url()).await;
    let ids =
        "[...document.querySelectorAll('#list tr.msg')].map(r => r.dataset.id).sort().join(',')";
    b.until(
        "the three messages listed",
        &format!("{ids}.split(',').length === 3"),
        ids,
    )
    .await;
    // The stuck one lists as stuck, marked; "had a failure" below also finds the recovered one.
    let row = b.text(&format!("#list tr[data-id=\"{food}\"]")).await;
    assert!(row.contains("stuck"), "{row}");
    let (all, eu, orders) = (
        set(&[&refund, &food, &dead]),
        set(&[&refund, &food]),
        set(&[&refund, &dead]),
    );
    for (field, value, want) in [
        ("#f-topic", "orders.*", orders.as_str()),
        ("#f-topic", "*.eu", eu.as_str()),
        ("#f-attr", "category=refund", refund.as_str()),
        ("#f-producer", "shop", all.as_str()),
        ("#f-producer", "shop-2", ""),
        ("#f-group", "billing", orders.as_str()),
        ("#f-min", "600000", ""),
    ] {
        b.click("#search button[type=reset]").await;
        b.type_into(field, value).await;
        b.click("#search button[type=submit]").await;
        b.until(
            &format!("{field} {value} finds {want:?}"),
            &format!("{ids} === {}", serde_json::to_string(want).unwrap()),
            ids,
        )
        .await;
    }
    for (check, want) in [
        ("#f-failed", all.as_str()),
        ("#f-redelivered", orders.as_str()),
        ("#f-dead", dead.as_str()),
    ] {
        b.click("#search button[type=reset]").await;
        b.click(check).await;
        b.click("#search button[type=submit]").await;
        b.until(
            &format!("{check} finds {want:?}"),
            &format!("{ids} === '{want}'"),
            ids,
        )
        .await;
    }
    // Time ranges (read in UTC, the page's default zone): the last hour finds all, one
    // that ends in 2020 none.
    for (range, want) in [
        (
            "f.from.value = new Date(Date.now() - 3600e3).toISOString().slice(0, 19)",
            all.as_str(),
        ),
        ("f.to.value = '2020-01-01T00:00:00'", ""),
    ] {
        b.click("#search button[type=reset]").await;
        b.js(&format!("const f = document.querySelector('#search').elements; {range}; document.querySelector('#search button[type=submit]').click(); return 1"))
            .await;
        b.until(
            &format!("{range} finds {want:?}"),
            &format!("{ids} === '{want}'"),
            ids,
        )
        .await;
    }
    b.close().await;
}

/// Bugs 4–7: the list keeps its selection and can be paused; deep links and hash changes;
/// a malformed ID is an input error; keyboard navigation; labels; contrast; 820 px wide.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_links_keyboard_selection_and_layout() {
    let sys = TestSystem::start().await;
    let l = sys.start_listener(|_| {}).await;
    let producer = sys.producer("shop").await;
    let mut ids = vec![];
    for topic in ["orders.eu", "orders.us", "orders.apac"] {
        let r = producer.send(topic, "x").await.unwrap();
        ids.push(r.message_id.to_string());
    }
    for id in &ids {
        l.trajectory_when(id, |t| t.hops.len() >= 2).await;
    }
    let b = Browser::start(1280).await;
    // A deep link opens the message and fills the search box.
    b.open(&format!("{}/#{}", l.url(), ids[0])).await;
    b.until(
        "the deep link's trajectory",
        &format!(
            "document.querySelector('#traceBody').innerText.includes('{}')",
            ids[0]
        ),
        "document.querySelector('#traceBody').innerText",
    )
    .await;
    assert_eq!(
        b.js("return document.querySelector('#q').value").await,
        ids[0].as_str()
    );
    // Changing the hash opens that message.
    b.js(&format!("location.hash = '{}'; return 1", ids[1]))
        .await;
    b.until(
        "the hash change's trajectory",
        &format!("document.querySelector('#traceBody').innerText.includes('{}') && document.querySelector('#q').value === '{}'", ids[1], ids[1]),
        "document.querySelector('#traceBody').innerText",
    )
    .await;
    // A search that finds nothing: the address says what was searched.
    b.type_into("#q", "no-such-request").await;
    b.click("#go").await;
    b.until(
        "not found",
        "document.querySelector('#traceBody').innerText.includes('Not found')",
        "document.querySelector('#traceBody').innerText",
    )
    .await;
    assert_eq!(b.js("return location.hash").await, "#no-such-request");
    // A malformed ID is an input error, not a failed query.
    b.type_into("#q", "not an id!").await;
    b.keys(&Key::Enter.to_string()).await;
    b.until(
        "an input error",
        "document.querySelector('#qerr').innerText.includes('Not a message ID')",
        "document.querySelector('#qerr').innerText + ' | ' + document.querySelector('#traceBody').innerText",
    )
    .await;
    assert_eq!(
        b.js("return document.querySelector('#q').getAttribute('aria-invalid')")
            .await,
        "true"
    );
    assert!(!b.text("#traceBody").await.contains("Query failed"));

    // Labels.
    for id in ["q", "state", "tz", "f-topic", "f-attr", "f-failed"] {
        let n = b
            .js(&format!(
                "return document.getElementById('{id}').labels.length"
            ))
            .await;
        assert_eq!(n, 1, "#{id} has a label");
    }
    // Keyboard: Tab from the last search control reaches the list; arrows move; Enter opens.
    let rows = "[...document.querySelectorAll('#list tr.msg')].map(r => r.dataset.id)";
    b.until("three rows", &format!("{rows}.length === 3"), rows)
        .await;
    let order: Vec<String> = serde_json::from_value(b.js(&format!("return {rows}")).await).unwrap();
    b.js("document.querySelector('#search button[type=reset]').focus(); return 1")
        .await;
    b.keys(&Key::Tab.to_string()).await;
    let focused =
        "document.activeElement.dataset.id || document.activeElement.outerHTML.slice(0, 80)";
    b.until(
        "Tab reaches a list row",
        "document.activeElement.matches('#list tr.msg')",
        focused,
    )
    .await;
    b.js(&format!(
        "document.querySelector('#list tr[data-id=\"{}\"]').focus(); return 1",
        order[0]
    ))
    .await;
    b.keys(&Key::Down.to_string()).await;
    b.keys(&Key::Enter.to_string()).await;
    b.until(
        "Enter opens the row below",
        &format!(
            "document.querySelector('#traceBody').innerText.includes('{}')",
            order[1]
        ),
        focused,
    )
    .await;
    let selected = format!("document.querySelector('#list tr[data-id=\"{}\"]').getAttribute('aria-selected') === 'true'", order[1]);
    b.until("the open row is highlighted", &selected, rows)
        .await;
    // Bug 4: paused, the list stays as it is under the cursor; resumed, it updates and keeps
    // the selection.
    b.click("#pause").await;
    b.js(&format!(
        "window.keptRow = document.querySelector('#list tr[data-id=\"{}\"]'); return 1",
        order[1]
    ))
    .await;
    let late = producer
        .send("orders.late", "x")
        .await
        .unwrap()
        .message_id
        .to_string();
    l.trajectory_when(&late, |t| t.hops.len() >= 2).await;
    tokio::time::sleep(Duration::from_millis(5500)).await;
    assert_eq!(
        b.js(&format!("return {rows}.length")).await,
        3,
        "paused: no update"
    );
    assert_eq!(
        b.js("return window.keptRow.isConnected").await,
        true,
        "the row was not redrawn"
    );
    b.click("#pause").await;
    b.until(
        "resumed: the new message",
        &format!("{rows}.length === 4"),
        rows,
    )
    .await;
    b.until("the selection kept", &selected, rows).await;

    // Contrast of the small grey text (events, hints) against its background: ≥ 4.5:1.
    b.click("tr.hop[data-key=\"store\"]").await;
    b.until(
        "a hop's events",
        "document.querySelector('ol.events li')",
        "1",
    )
    .await;
    let ratios = b
        .js(r#"const lum = c => { const [r, g, b] = c.match(/[\d.]+/g).map(Number).slice(0, 3).map(v => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; }); return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
            const bg = e => { for (; e; e = e.parentElement) { const c = getComputedStyle(e).backgroundColor; if (!/rgba\(.*, 0\)|transparent/.test(c)) return c; } return 'rgb(255, 255, 255)'; };
            return [...document.querySelectorAll('ol.events li, .dim, th')].filter(e => e.innerText.trim()).map(e => {
              const a = lum(getComputedStyle(e).color), b = lum(bg(e));
              return [(Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05), e.className || e.tagName];
            });"#)
        .await;
    for r in ratios.as_array().unwrap() {
        assert!(r[0].as_f64().unwrap() >= 4.5, "contrast below 4.5:1: {r}");
    }
    // Bug 6: at 820 px nothing is cut off.
    b.client.set_window_size(820, 900).await.unwrap();
    b.until(
        "the layout at 820 px",
        "window.innerWidth <= 820",
        "window.innerWidth",
    )
    .await;
    let overflow = b
        .js("return [document.documentElement, ...document.querySelectorAll('section')].filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.id || e.tagName)")
        .await;
    assert_eq!(overflow, serde_json::json!([]), "cut off at 820 px");
    b.close().await;
}

/// Bug 8: with the listener down the page keeps the last data, says so in a banner, and
/// retries; the banner goes when the listener is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_down_banner() {
    let sys = TestSystem::start().await;
    let l = sys.start_listener(|_| {}).await;
    let producer = sys.producer("shop").await;
    let id = producer
        .send("orders.eu", "x")
        .await
        .unwrap()
        .message_id
        .to_string();
    l.trajectory_when(&id, |t| t.hops.len() >= 2).await;
    let addr = l.handle.http_addr();
    let b = Browser::start(1280).await;
    b.open(&format!("{}/#{id}", l.url())).await;
    let shown = format!("document.querySelector('#traceBody').innerText.includes('{id}') && document.querySelector('#list tr[data-id=\"{id}\"]') && /funnel/.test(document.querySelector('#statsBody').innerText)");
    b.until("the page with its data", &shown, "document.body.innerText")
        .await;
    let TestListener { handle, .. } = l;
    handle.shutdown().await.unwrap();
    b.until(
        "the banner",
        "!document.querySelector('#banner').hidden",
        "document.body.innerText",
    )
    .await;
    let banner = b.text("#banner").await;
    assert!(
        banner.contains("cannot be reached") && banner.contains("retrying"),
        "{banner}"
    );
    tokio::time::sleep(Duration::from_millis(5500)).await; // a refresh or two while down
    assert_eq!(
        b.js(&format!("return !!({shown})")).await,
        true,
        "the last good data stays: {}",
        b.text("body").await
    );
    assert!(!b.text("body").await.contains("Failed to fetch"));
    // Back: the banner goes by itself.
    let _l2 = sys.start_listener(|c| c.http_addr = addr).await;
    b.until(
        "the banner gone after the listener is back",
        "document.querySelector('#banner').hidden",
        "document.querySelector('#banner').innerText",
    )
    .await;
    b.close().await;
}

/// The page stays fast with 10 000 listed messages: the list draws 500 rows at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_listed_messages_draw_fast() {
    let sys = TestSystem::start().await;
    let l = sys.start_listener(|_| {}).await;
    let b = Browser::start(1280).await;
    b.open(&l.url()).await;
    b.until(
        "the page",
        "typeof renderList === 'function'",
        "document.body.innerText",
    )
    .await;
    // 10 000 summaries shaped as GET /api/messages answers them.
    let took = b
        .js(r#"const now = Date.now() * 1e6;
            const list = Array.from({ length: 10000 }, (_, i) => ({ key: 'k' + i,
              message_id: '01a2' + String(i).padStart(4, '0') + '-0000-7000-8000-000000000000',
              request_id: 'r' + i, producer: 'shop', topic: 'orders.eu', state: i % 7 ? 'consumed' : 'stuck',
              groups: { billing: 'consumed' }, first_at: now - i * 1e6, last_at: now, failure: null,
              records: 10, funnel: [true, true, true, true], segments: [] }));
            const t = performance.now();
            renderList(list);
            document.body.getBoundingClientRect();
            return [performance.now() - t, document.querySelectorAll('#list tr.msg').length];"#)
        .await;
    assert_eq!(took[1], 500, "the first 500 drawn: {took}");
    let ms = took[0].as_f64().unwrap();
    assert!(ms < 1_000.0, "10 000 listed rows took {ms} ms to draw");
    assert!(b.text("#count").await.contains("10000 found"));
    // Scrolling to the end draws the next rows.
    b.js("const w = document.querySelector('.listwrap'); w.scrollTop = w.scrollHeight; return 1")
        .await;
    b.until(
        "more rows after scrolling",
        "document.querySelectorAll('#list tr.msg').length === 1000",
        "document.querySelectorAll('#list tr.msg').length",
    )
    .await;
    b.close().await;
}

/// Where the screenshots go: `MSGTRAIL_SCREENSHOTS` (scripts/screenshots.sh sets docs/), or
/// a temporary directory.
fn shot_dir() -> (PathBuf, Option<tempfile::TempDir>) {
    match std::env::var_os("MSGTRAIL_SCREENSHOTS") {
        Some(d) => (PathBuf::from(d), None),
        None => {
            let t = tempfile::tempdir().unwrap();
            (t.path().to_path_buf(), Some(t))
        }
    }
}

/// Screenshots of the main views (docs/page-*.png through scripts/screenshots.sh): each is
/// a PNG of the page as drawn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn screenshots_of_the_main_views() {
    let (dir, _keep) = shot_dir();
    let sys = TestSystem::start().await;
    let l = sys.start_listener(short_deadlines).await;
    let (refund, food) = redelivered_and_stuck(&sys, &l).await;
    let producer = sys.producer("shop").await;
    let billing = sys.consumer("billing-1").await;
    let audit = sys.consumer("audit-1").await;
    for (topic, body) in [
        ("orders.us", "{\"order\": 43}"),
        ("orders.apac", "{\"order\": 44}"),
    ] {
        producer
            .send_message(Outgoing::new(topic, body).attr("category", "sale"))
            .await
            .unwrap();
        pull(&billing, "billing", "orders.*", None).await;
    }
    for _ in 0..3 {
        pull(&audit, "audit", "orders.*", None).await;
    }
    l.trajectory_when(&refund, |t| consumed_by(t, 2)).await;
    let b = Browser::start(1440).await;
    let shoot = async |name: &str| {
        let png = b.client.screenshot().await.unwrap();
        assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "{name}");
        std::fs::write(dir.join(name), png).unwrap();
    };
    b.open(&format!("{}/#{refund}", l.url())).await;
    b.until(
        "the waterfall",
        "document.querySelector('tr.hop[data-key=\"deliver/audit/audit-1/1\"]') && document.querySelectorAll('#list tr.msg').length === 4",
        "document.body.innerText",
    )
    .await;
    b.click("tr.hop[data-key=\"deliver/billing/billing-1/1\"]")
        .await;
    b.until(
        "the detail with its exported attributes",
        "document.querySelector('tr.detail table.attrs')",
        "1",
    )
    .await;
    shoot("page-waterfall.png").await;
    b.type_into("#q", &food).await;
    b.keys(&Key::Enter.to_string()).await;
    b.until("the stuck one", "document.querySelector('#waiting')", "1")
        .await;
    b.click("#f-failed").await;
    b.click("#search button[type=submit]").await;
    b.until(
        "the failed ones",
        "document.querySelectorAll('#list tr.msg').length === 2",
        "document.querySelector('#list').innerText",
    )
    .await;
    b.client.set_window_size(1440, 1100).await.unwrap();
    shoot("page-stuck-and-search.png").await;
    b.client.set_window_size(800, 1100).await.unwrap();
    b.open(&format!("{}/#{refund}", l.url())).await;
    b.until("the narrow page", "document.querySelector('table.wf')", "1")
        .await;
    shoot("page-narrow.png").await;
    b.client.set_window_size(1440, 900).await.unwrap();
    b.open(&format!("{}/#/groups/billing", l.url())).await;
    b.until(
        "billing's group view",
        "document.querySelector('#segments')",
        "1",
    )
    .await;
    shoot("page-group.png").await;
    b.close().await;
}
