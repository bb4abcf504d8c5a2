//! The deployment's binary leaves the development tools out: built as the Dockerfile builds
//! it (`--no-default-features`), `msgtrail` links neither msgtrail-devkit (a nats-server child
//! process and a test OTLP receiver) nor msgtrail-bench; the default build (the README's
//! commands, `msgtrail dev` and `msgtrail bench`) links both.

use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The packages `msgtrail-cli` links (normal dependencies), one name a line.
fn linked(features: &[&str]) -> String {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(root())
        .args([
            "tree",
            "--offline",
            "--locked",
            "-p",
            "msgtrail-cli",
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
