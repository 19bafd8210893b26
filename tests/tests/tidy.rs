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

/// Every dependency table of a manifest (normal, dev and build).
fn all_dependencies(manifest: &str) -> String {
    let text = std::fs::read_to_string(repo_root().join(manifest)).unwrap_or_default();
    text.split("\n[")
        .filter(|section| {
            ["dependencies]", "dev-dependencies]", "build-dependencies]"]
                .iter()
                .any(|table| section.starts_with(table))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_cli_depends_only_on_proto_sdk_engine_and_worker() {
    let deps = dependencies("cli/Cargo.toml");
    assert!(!deps.is_empty(), "cli/Cargo.toml has no [dependencies]");
    for line in deps.lines().map(str::trim) {
        let name = line
            .split(|c: char| c == '.' || c == '=' || c.is_whitespace())
            .next()
            .unwrap_or_default();
        if name.starts_with("belay") {
            assert!(
                ["belay-proto", "belay-sdk", "belay-engine", "belay-worker"].contains(&name),
                "cli depends on {name}"
            );
        }
    }
}

#[test]
fn nothing_but_the_tests_depends_on_the_cli() {
    for manifest in [
        "proto/Cargo.toml",
        "engine/Cargo.toml",
        "worker/Cargo.toml",
        "sdk/Cargo.toml",
        "examples/onboarding/Cargo.toml",
        "bench/Cargo.toml",
    ] {
        assert!(
            repo_root().join(manifest).exists(),
            "{manifest} is gone: update this list"
        );
        assert!(
            !all_dependencies(manifest).contains("belay-cli"),
            "{manifest} depends on belay-cli"
        );
    }
}

#[test]
fn machine_and_definitions_do_no_io() {
    let root = repo_root();
    let mut files = Vec::new();
    rust_files(&root.join("engine/machine/src"), &mut files);
    rust_files(&root.join("engine/definitions/src"), &mut files);
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
        "engine/definitions/src",
        "engine/machine/src",
        "engine/store/src",
        "engine/src",
        "worker/src",
        "sdk/src",
        "cli/src",
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
