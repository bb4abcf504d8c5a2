//! How `main` prints the error a command ended with: one line, `msgtrail: ` and the error's
//! chain, each cause once ([`msgtrail_core::ErrorChain`]). msgtrail's error variants display
//! their own level only and return their cause from `source()`; this is the one place the
//! levels are joined.

/// The line `main` prints for `e`.
pub(crate) fn render(e: &anyhow::Error) -> String {
    format!("msgtrail: {}", msgtrail_core::ErrorChain(e.as_ref()))
}

#[cfg(test)]
mod tests {
    use super::render;
    use msgtrail_client::{Cause, ClientError};
    use std::error::Error;

    /// Every level of `e`'s chain says only its own part (not its cause's text), and the
    /// printed line holds each level's text exactly once.
    fn assert_each_cause_once(e: anyhow::Error) -> String {
        let line = render(&e);
        let mut level: Option<&(dyn Error + 'static)> = Some(e.as_ref());
        let mut levels = 0;
        while let Some(l) = level {
            let own = l.to_string();
            if let Some(cause) = l.source() {
                let cause = cause.to_string();
                assert!(
                    !own.contains(&cause),
                    "level {own:?} repeats its cause {cause:?}"
                );
            }
            assert_eq!(line.matches(&own).count(), 1, "{own:?} in {line:?}");
            levels += 1;
            level = l.source();
        }
        assert!(levels >= 2, "{line}: not an error with a cause");
        line
    }

    #[test]
    fn a_client_error_with_a_cause_renders_each_cause_once() {
        let e = ClientError::Nats(Cause::with_context(
            "publishing the upload",
            std::io::Error::other("broken pipe"),
        ));
        let line = assert_each_cause_once(anyhow::Error::new(e).context("sending to orders.eu"));
        assert_eq!(
            line,
            "msgtrail: sending to orders.eu: nats: publishing the upload: broken pipe"
        );
        let decode = serde_json::from_str::<u32>("x").unwrap_err();
        let e = ClientError::Decode(Cause::new(decode));
        let line = assert_each_cause_once(anyhow::Error::new(e));
        assert!(
            line.starts_with("msgtrail: invalid reply from broker: "),
            "{line}"
        );
    }

    #[test]
    fn a_refused_clients_file_renders_each_cause_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("clients.json");
        let entry = r#"{"id": "shop", "role": "producer", "public_key": "not-a-key"}"#;
        std::fs::write(&path, format!(r#"{{"clients": [{entry}]}}"#)).unwrap();
        let e = msgtrail_broker::ClientRegistry::load(&path).unwrap_err();
        let line = assert_each_cause_once(anyhow::Error::new(e));
        assert!(
            line.contains(": client shop: invalid nkey public key: "),
            "{line}"
        );
        std::fs::write(&path, "{").unwrap();
        let e = msgtrail_broker::ClientRegistry::load(&path).unwrap_err();
        assert_each_cause_once(anyhow::Error::new(e));
    }

    #[tokio::test]
    async fn an_unreachable_listener_renders_each_cause_once() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let c = msgtrail_listener_client::ListenerClient::new(
            &format!("http://127.0.0.1:{port}"),
            None,
        )
        .unwrap();
        let e = c.stats(None).await.unwrap_err();
        let line = assert_each_cause_once(anyhow::Error::new(e).context("query failed"));
        assert!(
            line.starts_with(&format!(
                "msgtrail: query failed: cannot reach the listener at 127.0.0.1:{port}: "
            )),
            "{line}"
        );
        assert_eq!(line.to_lowercase().matches("refused").count(), 1, "{line}");
    }
}
