//! The broker's own spans (README.md, "Following the broker with RUST_LOG"): every
//! request runs in a `request` span naming its endpoint, channel and size, and the handlers
//! of channel open, upload, fetch and settle add theirs (client ID, message count, group,
//! …) — never a payload. A capturing layer records the spans a real exchange opens.

use msgtrail_client::Outgoing;
use msgtrail_core::wire::Subscription;
use msgtrail_core::RequestId;
use msgtrail_e2e::TestSystem;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

/// One captured span: its name and its fields as displayed.
#[derive(Debug, Clone)]
struct Captured {
    name: &'static str,
    target: String,
    fields: BTreeMap<String, String>,
}

/// Records every span the broker opens, and the fields recorded on it later.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<BTreeMap<u64, Captured>>>);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: tracing::Subscriber> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        let meta = attrs.metadata();
        self.0.lock().unwrap().insert(
            id.into_u64(),
            Captured {
                name: meta.name(),
                target: meta.target().to_owned(),
                fields,
            },
        );
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        if let Some(c) = self.0.lock().unwrap().get_mut(&id.into_u64()) {
            values.record(&mut Fields(&mut c.fields));
        }
    }
}

impl Capture {
    /// The broker's spans named `name`.
    fn named(&self, name: &str) -> Vec<Captured> {
        self.0
            .lock()
            .unwrap()
            .values()
            .filter(|c| c.name == name && c.target.starts_with("msgtrail_broker"))
            .cloned()
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_run_in_spans_naming_channel_client_and_counts_never_the_payload() {
    let capture = Capture::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(capture.clone()))
        .expect("the only subscriber of this test binary");

    let sys = TestSystem::start().await;
    let producer = sys.producer("shop").await;
    let consumer = sys.consumer("billing-1").await;
    let payload = "payload-never-in-a-span-7f3a";
    let reply = producer
        .send_message(
            Outgoing::new("orders.eu", payload).request_id(RequestId::new("order-span").unwrap()),
        )
        .await
        .unwrap();
    let sub = Subscription {
        group: msgtrail_core::GroupId::new("billing").unwrap(),
        topic: "orders.*".into(),
        filter: BTreeMap::new(),
        message_id: None,
    };
    let got = consumer
        .fetch(&sub, 10, Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].message_id, reply.message_id);
    got[0].ack().await.unwrap();

    // Channel opens: one per client, naming it.
    let opens = capture.named("channel.open");
    for client in ["shop", "billing-1"] {
        assert!(
            opens
                .iter()
                .any(|s| s.fields.get("client_id").map(String::as_str) == Some(client)),
            "no channel.open span for {client}: {opens:#?}"
        );
    }
    // Every request has its span with the endpoint; uploads and fetches their channel.
    let requests = capture.named("request");
    let kinds: Vec<&str> = requests
        .iter()
        .filter_map(|s| s.fields.get("kind").map(String::as_str))
        .collect();
    for kind in ["channel-challenge", "channel-open", "fetch"] {
        assert!(kinds.contains(&kind), "no {kind} request span: {kinds:?}");
    }
    let upload_request = requests
        .iter()
        .find(|s| {
            matches!(
                s.fields.get("kind").map(String::as_str),
                Some("upload" | "upload-batch")
            )
        })
        .unwrap_or_else(|| panic!("no upload request span: {kinds:?}"));
    assert!(
        upload_request.fields.contains_key("channel"),
        "{upload_request:?}"
    );
    assert!(
        kinds.iter().any(|k| *k == "settle" || *k == "ack"),
        "no settle request span: {kinds:?}"
    );
    // The handlers' spans: the upload's message count, the fetch's channel, group and max.
    let uploads = capture.named("upload");
    assert!(
        uploads
            .iter()
            .any(|s| s.fields.get("messages").map(String::as_str) == Some("1")),
        "{uploads:#?}"
    );
    let fetches = capture.named("fetch");
    assert!(
        fetches.iter().any(|s| {
            s.fields.get("group").map(String::as_str) == Some("billing")
                && s.fields.get("max").map(String::as_str) == Some("10")
                && s.fields.contains_key("channel")
        }),
        "{fetches:#?}"
    );
    assert!(
        !capture.named("settle").is_empty() || !capture.named("ack").is_empty(),
        "no settle or ack handler span"
    );
    // No span carries a payload.
    let all = capture.0.lock().unwrap();
    for s in all.values() {
        for v in s.fields.values() {
            assert!(!v.contains(payload), "payload in span {s:?}");
        }
    }
}
