//! The repository stands alone: a clone in an empty folder has everything the README's
//! commands need. No tracked file names a path beside the repository (the development
//! machines' sibling folder of shared tools), except the CI entry point in `.ci/`, which may
//! use those tools where the CI machine has them.

use std::path::Path;
use std::process::Command;

/// The sibling folder's relative path, written in two pieces so that this file does not
/// name it.
fn outside_path() -> String {
    format!("{}/{}", "..", "shared")
}

fn tracked_files(root: &Path) -> Vec<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["ls-files", "-z"])
        .output()
        .expect("git runs (the test reads the tracked files with `git ls-files`)");
    assert!(
        out.status.success(),
        "git ls-files failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("tracked paths are UTF-8")
        .split('\0')
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .collect()
}

#[test]
fn no_tracked_file_names_a_path_outside_the_repository() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let files = tracked_files(&root);
    assert!(
        files.iter().any(|f| f == "README.md"),
        "git ls-files listed no README.md: {} files",
        files.len()
    );
    let needle = outside_path();
    let mut found = Vec::new();
    for f in files.iter().filter(|f| !f.starts_with(".ci/")) {
        // A tracked file deleted in the work tree is not read.
        let Ok(bytes) = std::fs::read(root.join(f)) else {
            continue;
        };
        let text = String::from_utf8_lossy(&bytes);
        for (n, line) in text.lines().enumerate() {
            if line.contains(&needle) {
                found.push(format!("{f}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "tracked files name {needle} (outside the repository; only .ci/ may):\n{}",
        found.join("\n")
    );
}
