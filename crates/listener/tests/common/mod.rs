//! Helpers the listener's integration tests share: time, a replayable shuffle, a JetStream
//! context, waiting for a condition, an API client.
#![allow(dead_code)]

use msgtrail_listener::ListenerClient;
use msgtrail_listener::ListenerHandle;
use msgtrail_test_support::NatsServer;
use std::future::Future;
use std::time::Duration;

/// Now, Unix nanoseconds.
pub(crate) fn now() -> u64 {
    msgtrail_core::time::now_nanos()
}

/// Deterministic xorshift, so a failing shuffle can be replayed.
pub(crate) struct TestRng(pub u64);

impl TestRng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub(crate) fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = (self.next() % (i as u64 + 1)) as usize;
            v.swap(i, j);
        }
    }
}

/// A JetStream context on `server`.
pub(crate) async fn nats(server: &NatsServer) -> async_nats::jetstream::Context {
    let client = async_nats::connect(server.url()).await.unwrap();
    async_nats::jetstream::new(client)
}

/// Polls `f` every 25 ms until it gives a value; fails the test after 20 s naming `what`.
pub(crate) async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A client of the listener's HTTP API.
pub(crate) fn client(h: &ListenerHandle) -> ListenerClient {
    ListenerClient::new(&format!("http://{}", h.http_addr()), None).unwrap()
}
