//! The deployment's binary leaves the development tools out: built as the Dockerfile builds
//! it (`--no-default-features`), `msgtrail` links neither msgtrail-devkit (a nats-server child
//! process and a test OTLP receiver) nor msgtrail-bench; the default build (the README's
//! commands, `msgtrail dev` and `msgtrail bench`) links both. The listener API's client
//! (msgtrail-listener-client, behind `trace`, `stats` and `audit`) links none of the listener.

use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The packages `msgtrail-cli` links (normal dependencies), one name a line.
fn linked(features: &[&str]) -> String {
    linked_by("msgtrail-cli", features)
}

/// The packages `package` links (normal dependencies), one name a line.
fn linked_by(package: &str, features: &[&str]) -> String {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(root())
        .args([
            "tree",
            "--offline",
            "--locked",
            "-p",
            package,
            "-e",
            "normal",
        ])
        .args(["--prefix", "none", "--format", "{p}"])
        .args(features)
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn links(tree: &str, package: &str) -> bool {
    tree.lines()
        .any(|l| l.split_whitespace().next() == Some(package))
}

#[test]
fn the_deployed_binary_links_no_development_tools() {
    let lean = linked(&["--no-default-features"]);
    for dev_only in ["msgtrail-devkit", "msgtrail-bench"] {
        assert!(
            !links(&lean, dev_only),
            "{dev_only} in the lean build:\n{lean}"
        );
    }
    assert!(links(&lean, "msgtrail-broker") && links(&lean, "msgtrail-listener"));

    let full = linked(&[]);
    for dev_only in ["msgtrail-devkit", "msgtrail-bench"] {
        assert!(
            links(&full, dev_only),
            "{dev_only} missing from the default build"
        );
    }

    let dockerfile = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    assert!(
        dockerfile
            .lines()
            .any(|l| l.contains("cargo build")
                && l.contains("-p msgtrail-cli --no-default-features")),
        "the Dockerfile builds the lean binary"
    );
}

#[test]
fn the_listener_client_links_none_of_the_listener() {
    let client = linked_by("msgtrail-listener-client", &[]);
    assert!(links(&client, "hyper") && links(&client, "msgtrail-core"));
    for heavy in [
        "msgtrail-listener",
        "fjall",
        "redb",
        "axum",
        "async-nats",
        "prometheus-client",
        "hdrhistogram",
        "msgtrail-otel",
    ] {
        assert!(
            !links(&client, heavy),
            "{heavy} linked by the listener client:\n{client}"
        );
    }
}
