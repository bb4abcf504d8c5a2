//! The listener page driven in a real headless Chromium over WebDriver (chromedriver), against
//! a real nats-server, broker and listener: what a person sees and does on the page.
//!
//! Needs Debian's `chromium` and `chromium-driver` (`scripts/install-chromium.sh` installs
//! them; `CHROMEDRIVER` and `CHROME_BIN` point elsewhere). Without them every test here fails
//! saying so: none skips itself.

use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use msgtrail_client::{Consumer, Outgoing, Received};
use msgtrail_core::trajectory::{MessageState, Trajectory};
use msgtrail_core::wire::Subscription;
use msgtrail_core::ClientId;
use msgtrail_e2e::TestSystem;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How long a condition on the page may take to hold.
const PATIENCE: Duration = Duration::from_secs(15);

fn which(candidates: &[Option<String>]) -> Option<PathBuf> {
    candidates
        .iter()
        .flatten()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

fn on_path(name: &str) -> Option<String> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
            .map(|p| p.display().to_string())
    })
}

/// A headless Chromium driven through its own chromedriver, ended when dropped.
struct Browser {
    client: Client,
    driver: Child,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Browser {
    /// Starts chromedriver on a free loopback port and a headless Chromium session of
    /// `width` × 900 pixels.
    async fn start(width: u32) -> Browser {
        let driver_bin = which(&[
            std::env::var("CHROMEDRIVER").ok(),
            on_path("chromedriver"),
            Some("/usr/bin/chromedriver".into()),
        ])
        .unwrap_or_else(|| {
            panic!(
                "no chromedriver found: run scripts/install-chromium.sh (or `apt-get install \
                 chromium chromium-driver`), or set CHROMEDRIVER and CHROME_BIN"
            )
        });
        let browser_bin = which(&[
            std::env::var("CHROME_BIN").ok(),
            on_path("chromium"),
            Some("/usr/bin/chromium".into()),
            on_path("chromium-browser"),
            on_path("google-chrome"),
        ])
        .unwrap_or_else(|| {
            panic!(
                "no Chromium found: run scripts/install-chromium.sh (or `apt-get install \
                 chromium chromium-driver`), or set CHROME_BIN"
            )
        });
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let driver = Command::new(&driver_bin)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{} does not start: {e}", driver_bin.display()));
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({
                "binary": browser_bin,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--hide-scrollbars",
                         format!("--window-size={width},900")],
            }),
        );
        let url = format!("http://127.0.0.1:{port}");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let mut browser = None;
        let mut driver = Some(driver);
        while browser.is_none() {
            match ClientBuilder::new(HttpConnector::new())
                .capabilities(caps.clone())
                .connect(&url)
                .await
            {
                Ok(client) => {
                    browser = Some(Browser {
                        client,
                        driver: driver.take().unwrap(),
                    })
                }
                Err(e) => {
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "no WebDriver session from {}: {e}",
                        driver_bin.display()
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        browser.unwrap()
    }

    async fn open(&self, url: &str) {
        self.client.goto(url).await.unwrap();
    }

    /// Runs `js` (a function body: `return …`) in the page.
    async fn js(&self, js: &str) -> Value {
        self.client
            .execute(js, vec![])
            .await
            .unwrap_or_else(|e| panic!("script failed: {e}\n{js}"))
    }

    /// Waits until the expression `cond` is true in the page; panics naming `what` and
    /// showing `show` (an expression) otherwise.
    async fn until(&self, what: &str, cond: &str, show: &str) {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            if self.js(&format!("return !!({cond});")).await == Value::Bool(true) {
                return;
            }
            if tokio::time::Instant::now() > deadline {
                let seen = self.js(&format!("return String({show});")).await;
                panic!("never: {what}; the page shows: {seen}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The visible text of the first element matching `css`.
    async fn text(&self, css: &str) -> String {
        let v = self
            .js(&format!(
                "const e = document.querySelector({}); return e ? e.innerText : null;",
                serde_json::to_string(css).unwrap()
            ))
            .await;
        v.as_str()
            .unwrap_or_else(|| panic!("nothing matches {css}"))
            .to_owned()
    }

    async fn close(mut self) {
        let c = self.client.clone();
        c.close().await.unwrap();
        let _ = self.driver.kill();
    }
}

fn sub(group: &str, topic: &str) -> Subscription {
    Subscription {
        group: ClientId::new(group).unwrap(),
        topic: topic.into(),
        filter: BTreeMap::new(),
        message_id: None,
    }
}

/// Fetches one waiting message of `topic` for `group` and handles it (failing with `fail`).
async fn pull(
    consumer: &Consumer,
    group: &str,
    topic: &str,
    fail: Option<&'static str>,
) -> Received {
    let got = consumer
        .fetch(&sub(group, topic), 1, Duration::from_secs(3))
        .await
        .unwrap();
    assert_eq!(got.len(), 1, "{group} fetches one message of {topic}");
    let m = got[0].clone();
    consumer
        .process(m.clone(), move |_| async move { fail.map_or(Ok(()), Err) })
        .await
        .unwrap()
        .ok();
    m
}

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
    b.close().await;
}
