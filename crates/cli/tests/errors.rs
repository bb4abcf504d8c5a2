//! The CLI prints an error with each of its causes once, on one line: `msgtrail: what
//! failed: why: root cause` (msgtrail's errors display only their own message and return
//! their cause; causes that other crates' errors already write into their own message are
//! not repeated).

use std::process::Command;

fn stderr_of(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_msgtrail"))
        .args(args)
        .env_remove("NATS_URL")
        .output()
        .expect("msgtrail runs");
    assert!(!out.status.success(), "{args:?} succeeded");
    String::from_utf8(out.stderr).unwrap()
}

#[test]
fn each_cause_is_printed_once() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.json");
    let err = stderr_of(&["broker", "--clients", missing.to_str().unwrap()]);
    assert!(
        err.starts_with("msgtrail: cannot read clients file"),
        "{err}"
    );
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");

    let clients = dir.path().join("clients.json");
    std::fs::write(&clients, r#"{"clients": []}"#).unwrap();
    let err = stderr_of(&[
        "--nats-url",
        "nats://[not a url",
        "broker",
        "--clients",
        clients.to_str().unwrap(),
    ]);
    assert!(err.contains("invalid NATS URL"), "{err}");
    let last = err.trim_end().rsplit(": ").next().unwrap().to_owned();
    assert_eq!(err.matches(&last).count(), 1, "the root cause once: {err}");
}

/// `--observe-only` holds no stage partitions, so it cannot join a listener group: the
/// listener refuses the pair at start-up, naming both flags, before it connects to NATS.
#[test]
fn an_observe_only_listener_refuses_a_group_before_connecting() {
    let dir = tempfile::tempdir().unwrap();
    let err = stderr_of(&[
        "--nats-url",
        "nats://127.0.0.1:1",
        "listener",
        "--observe",
        "ORDERS",
        "--observe-only",
        "--group",
        "g",
        "--data-dir",
        dir.path().to_str().unwrap(),
    ]);
    assert!(
        err.starts_with(
            "msgtrail: invalid listener configuration: group cannot be set with observe-only"
        ),
        "{err}"
    );
    assert!(err.contains("drop --group or --observe-only"), "{err}");
    assert!(!err.contains("connect"), "refused before connecting: {err}");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "nothing written to the data directory"
    );
}
