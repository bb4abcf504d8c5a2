//! A headless Chromium driven over WebDriver (chromedriver) for the page's browser tests
//! (tests/page.rs, tests/page_views.rs), and the helpers they share.
//!
//! Needs Debian's `chromium` and `chromium-driver` (`scripts/install-chromium.sh` installs
//! them; `CHROMEDRIVER` and `CHROME_BIN` point elsewhere). Without them every test fails
//! saying so: none skips itself.

use crate::TestListener;
use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use msgtrail_client::{Consumer, Received};
use msgtrail_core::wire::Subscription;
use msgtrail_core::GroupId;
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How long a condition on the page may take to hold.
pub const PATIENCE: Duration = Duration::from_secs(15);

/// The first of the candidate paths that is a file.
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
pub struct Browser {
    /// The WebDriver session.
    pub client: Client,
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
    pub async fn start(width: u32) -> Browser {
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
            // A fixed zone with a half-hour offset, so "local time" is told from UTC.
            .env("TZ", "Asia/Kolkata")
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

    /// Opens `url`.
    pub async fn open(&self, url: &str) {
        self.client.goto(url).await.unwrap();
    }

    /// Runs `js` (a function body: `return …`) in the page.
    pub async fn js(&self, js: &str) -> Value {
        self.client
            .execute(js, vec![])
            .await
            .unwrap_or_else(|e| panic!("script failed: {e}\n{js}"))
    }

    /// Waits until the expression `cond` is true in the page; panics naming `what` and
    /// showing `show` (an expression) otherwise.
    pub async fn until(&self, what: &str, cond: &str, show: &str) {
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
    pub async fn text(&self, css: &str) -> String {
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

    /// Clears the input matching `css` and types `text` into it.
    pub async fn type_into(&self, css: &str, text: &str) {
        for attempt in 1.. {
            let e = self.client.find(Locator::Css(css)).await.unwrap();
            let done = match e.clear().await {
                Ok(()) => e.send_keys(text).await,
                Err(err) => Err(err),
            };
            match done {
                Ok(()) => return,
                Err(err) => retry_if_stale(attempt, css, err).await,
            }
        }
    }

    /// Types `keys` into the focused element.
    pub async fn keys(&self, keys: &str) {
        for attempt in 1.. {
            let e = self.client.active_element().await.unwrap();
            match e.send_keys(keys).await {
                Ok(()) => return,
                Err(err) => retry_if_stale(attempt, "the focused element", err).await,
            }
        }
    }

    /// Clicks the first element matching `css`.
    pub async fn click(&self, css: &str) {
        for attempt in 1.. {
            let e = self
                .client
                .find(Locator::Css(css))
                .await
                .unwrap_or_else(|e| panic!("no {css}: {e}"));
            match e.click().await {
                Ok(()) => return,
                Err(err) => retry_if_stale(attempt, css, err).await,
            }
        }
    }

    /// Ends the session and its chromedriver.
    pub async fn close(mut self) {
        let c = self.client.clone();
        c.close().await.unwrap();
        let _ = self.driver.kill();
    }
}

/// A subscription of `group` to `topic`, without attribute filter.
pub fn sub(group: &str, topic: &str) -> Subscription {
    Subscription {
        group: GroupId::new(group).unwrap(),
        topic: topic.into(),
        filter: BTreeMap::new(),
        message_id: None,
    }
}

/// Fetches one waiting message of `topic` for `group` and handles it (failing with `fail`).
pub async fn pull(
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

/// Plain HTTP/1.0 GET on the listener: (status, content type, body).
pub fn http_get(l: &TestListener, path_and_query: &str) -> (u16, String, String) {
    let addr = l.handle.http_addr();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "GET {path_and_query} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let ctype = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-type:")
                .map(|v| v.trim().to_owned())
        })
        .unwrap_or_default();
    (status, ctype, body.to_owned())
}

/// The page redraws what it shows (the list every few seconds, a trajectory when it
/// changes): an element found just before a redraw is gone by the time it is used. Such a
/// step is taken again, on the element as it is now, a few times; any other error fails.
async fn retry_if_stale(attempt: u32, what: &str, err: fantoccini::error::CmdError) {
    let stale = err.to_string().to_lowercase().contains("stale");
    assert!(stale && attempt < 5, "{what}: {err} (attempt {attempt})");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// Sends a message to `orders.us` that group `billing` fails on every attempt, until it is
/// dead-lettered. Returns its ID.
pub async fn dead_letter(sys: &crate::TestSystem, l: &TestListener) -> String {
    let producer = sys.producer("shop").await;
    let billing = sys.consumer("billing-1").await;
    let dead = producer
        .send_message(msgtrail_client::Outgoing::new("orders.us", "x").attr("category", "sale"))
        .await
        .unwrap()
        .message_id
        .to_string();
    for _ in 0..crate::MAX_DELIVER {
        pull(&billing, "billing", "orders.*", Some("no stock")).await;
    }
    l.trajectory_when(&dead, |t| {
        t.state == msgtrail_core::trajectory::MessageState::DeadLettered
    })
    .await;
    dead
}
