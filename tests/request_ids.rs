//! Issue 14, bug 3, end to end: a producer uploads a request ID, repeats it inside the
//! broker's dedup window (suppressed: one message), then again after the window — which the
//! broker stores anew, under a second message ID. The listener must say so on both
//! trajectories, in its statistics, and on the request-ID lookup (the API and `msgtrail
//! trace`).

use msgtrail_client::Outgoing;
use msgtrail_core::trajectory::Trajectory;
use msgtrail_core::RequestId;
use msgtrail_e2e::{TestListener, TestSystem};
use std::time::Duration;

const WINDOW: Duration = Duration::from_secs(1);

/// Polls the listener until `done` holds for `id`'s trajectory.
async fn when(l: &TestListener, id: &str, done: impl Fn(&Trajectory) -> bool) -> Trajectory {
    l.trajectory_when(id, done).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_id_stored_again_after_the_dedup_window_is_flagged() {
    let sys = TestSystem::start_with(|c| c.dedup_window = WINDOW).await;
    let l = sys.start_listener(|_| {}).await;
    let producer = sys.producer("shop").await;
    let req = RequestId::new("order-e2e-1").unwrap();
    let send = |body: &'static str| {
        producer.send_message(Outgoing::new("orders.eu", body).request_id(req.clone()))
    };
    let first = send("first").await.unwrap();
    // Inside the window: suppressed, the same message.
    let dup = send("first").await.unwrap();
    assert!(dup.duplicate && dup.message_id == first.message_id);
    // After it: stored again.
    tokio::time::sleep(WINDOW * 3).await;
    let second = send("first again").await.unwrap();
    assert!(!second.duplicate);
    assert_ne!(
        second.message_id, first.message_id,
        "the broker stored it again"
    );
    let (a, b) = (first.message_id, second.message_id);

    // Both trajectories name each other, each with its own upload attempts.
    let t1 = when(&l, &a.to_string(), |t| {
        t.same_request == [b] && t.duplicates == 1 && t.upload_attempts == 2
    })
    .await;
    assert!(
        t1.diagnosis.contains(&format!(
            "duplicate after the dedup window: request id order-e2e-1 was stored again as message {b}: 2 messages"
        )),
        "{}",
        t1.diagnosis
    );
    let t2 = when(&l, &b.to_string(), |t| {
        t.same_request == [a] && t.hop("store").is_some_and(|h| h.end.is_some())
    })
    .await;
    assert_eq!((t2.duplicates, t2.upload_attempts), (0, 1), "{t2:#?}");
    assert!(
        t2.diagnosis.contains(&format!(
            "duplicate after the dedup window: request id order-e2e-1 was stored before as message {a}, and again as this one: 2 messages"
        )),
        "{}",
        t2.diagnosis
    );
    // The request ID answers with the latest, naming the first.
    let t = when(&l, req.as_str(), |t| t.message_id == Some(b)).await;
    assert_eq!(t.same_request, [a]);

    // Counted once, apart from the duplicate suppressed inside the window.
    let s = l.client.stats(None).await.unwrap();
    assert_eq!(s.events.duplicates_after_window, 1, "{:?}", s.events);
    assert_eq!(s.events.duplicates, 1, "{:?}", s.events);
    let s = l.client.stats(Some("orders.eu")).await.unwrap();
    assert_eq!(s.events.duplicates_after_window, 1, "{:?}", s.events);
    let (_, body) = l.client.get_raw("/metrics").await.unwrap();
    let metrics = String::from_utf8(body).unwrap();
    assert!(
        metrics.contains("msgtrail_events_total{event=\"duplicate_after_window\"} 1\n"),
        "{metrics}"
    );

    // `msgtrail trace <request-id>` prints both message IDs and says which one it shows.
    let bin = msgtrail_test_support::msgtrail_binary().unwrap();
    let out = std::process::Command::new(bin)
        .args(["trace", req.as_str(), "--color", "never", "--listener-url"])
        .arg(l.url())
        .env_remove("MSGTRAIL_LISTENER_TOKEN")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!(
            "request id order-e2e-1 names 2 messages (uploaded again after the dedup window); showing the latest, {b}; the other(s): {a}"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "request order-e2e-1 stored as 2 messages (uploaded again after the dedup window): {a}, {b} (this one)"
        )),
        "{stdout}"
    );
}
