//! Tidy checks: dependency directions and module docs (ARCHITECTURE.md).

use std::path::{Path, PathBuf};

use belay_tests::repo_root;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn dependencies(manifest: &str) -> String {
    let text = std::fs::read_to_string(repo_root().join(manifest)).unwrap_or_default();
    // Only the [dependencies] table matters for runtime direction.
    text.split("\n[")
        .filter(|section| section.starts_with("dependencies]"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn engine_never_depends_on_worker_or_sdk() {
    let deps = dependencies("engine/Cargo.toml");
    assert!(!deps.is_empty(), "engine/Cargo.toml has no [dependencies]");
    for forbidden in ["belay-worker", "belay-sdk", "belay-example"] {
        assert!(!deps.contains(forbidden), "engine depends on {forbidden}");
    }
}

#[test]
fn worker_and_sdk_never_depend_on_the_engine() {
    for manifest in ["worker/Cargo.toml", "sdk/Cargo.toml"] {
        let deps = dependencies(manifest);
        assert!(
            !deps.contains("belay-engine"),
            "{manifest} depends on belay-engine"
        );
    }
}

#[test]
fn machine_and_definitions_do_no_io() {
    let root = repo_root();
    let mut files = Vec::new();
    rust_files(&root.join("engine/src/machine"), &mut files);
    rust_files(&root.join("engine/src/definitions"), &mut files);
    assert!(
        files.len() >= 6,
        "expected the machine and definitions sources, found {files:?}"
    );
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for forbidden in [
            "sqlx",
            "tonic",
            "reqwest",
            "tokio",
            "std::fs",
            "std::net",
            "SystemTime",
            "Instant::now",
            "rand::",
        ] {
            assert!(
                !text.contains(forbidden),
                "{} mentions `{forbidden}`",
                file.display()
            );
        }
    }
}

#[test]
fn every_module_says_what_it_is_for() {
    let root = repo_root();
    let mut files = Vec::new();
    for dir in [
        "proto/src",
        "engine/src",
        "worker/src",
        "sdk/src",
        "tests/src",
        "tests/tests",
        "examples/onboarding/src",
    ] {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(!files.is_empty());
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        assert!(
            text.trim_start().starts_with("//!"),
            "{} has no `//!` module doc",
            file.display()
        );
    }
}
