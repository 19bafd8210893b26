//! Tidy checks: the architecture of ARCHITECTURE.md as tests. Dependency
//! directions between the crates, which crates may name sqlx, rmcp and
//! tonic, module docs, and the size of files and functions (with today's
//! exceptions listed by name, so they can only shrink).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use belay_tests::repo_root;
use belay_tests::source_scan::{blank_non_code, functions};

/// The longest a non-test source file may be, in lines.
const MAX_FILE_LINES: usize = 2_000;
/// The longest a function outside tests may be, in lines.
const MAX_FN_LINES: usize = 200;

/// Source files over [`MAX_FILE_LINES`] today, with their length as a
/// ceiling: one may shrink (then lower its figure, or drop it once it is
/// under the limit), never grow, and no file may join the list.
const LONG_FILES: &[(&str, usize)] = &[];

/// Functions outside tests over [`MAX_FN_LINES`] today (`path::name`),
/// with their length as a ceiling, as [`LONG_FILES`].
const LONG_FUNCTIONS: &[(&str, usize)] = &[
    ("cli/src/main.rs::run", 299),
    ("engine/definitions/src/abl/tool.rs::parse_tool", 531),
    ("engine/definitions/src/abl/read_props.rs::read_props", 496),
    (
        "engine/definitions/src/abl/parameters.rs::finish_source",
        270,
    ),
    ("engine/definitions/src/lib.rs::parse_bundle", 255),
    ("engine/definitions/src/yaml.rs::parse_node", 248),
    ("engine/machine/src/state.rs::fold_event", 536),
    ("engine/machine/src/decide.rs::decide", 383),
    (
        "engine/machine/src/step/proposal.rs::check_and_schedule",
        287,
    ),
    ("engine/machine/src/step/failure.rs::on_failure", 278),
    ("engine/src/admin/openapi.rs::schemas", 284),
    (
        "engine/store/src/postgres/write_decision.rs::write_decision",
        388,
    ),
    (
        "engine/store/src/sqlite/write_decision.rs::write_decision",
        444,
    ),
    ("sdk/src/lib.rs::timeline_line", 267),
];

/// The crates of the workspace, by folder.
const CRATES: &[&str] = &[
    "proto",
    "engine/definitions",
    "engine/machine",
    "engine/store",
    "engine",
    "worker",
    "sdk",
    "cli",
    "tests",
    "examples/onboarding",
    "bench",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            // A crate folder inside another (engine/machine in engine) is
            // its own crate.
            if !path.join("Cargo.toml").exists() && !path.ends_with("target") {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every `.rs` file of the crate in `folder` (relative to the root).
fn crate_files(folder: &str) -> Vec<PathBuf> {
    let mut files = Vec::new();
    rust_files(&repo_root().join(folder), &mut files);
    files
}

/// `path` relative to the repository root, with `/`.
fn relative(path: &Path) -> String {
    path.strip_prefix(repo_root())
        .unwrap_or(path)
        .to_string_lossy()
        .replace('\\', "/")
}

/// Whether `path` is test code: an integration test, a benchmark or a
/// unit test file of its own (`tests.rs`, `*_tests.rs`, `tests/…`).
fn is_test_file(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    path.split('/')
        .any(|part| part == "tests" || part == "benches")
        || name == "tests.rs"
        || name.ends_with("_tests.rs")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The names of the `belay-*` crates a manifest's tables list
/// (`tables`: e.g. `["dependencies]"]`).
fn belay_dependencies(manifest: &str, tables: &[&str]) -> Vec<String> {
    dependency_names(manifest, tables)
        .into_iter()
        .filter(|n| n.starts_with("belay-"))
        .collect()
}

/// Every dependency name of the given tables of `manifest`.
fn dependency_names(manifest: &str, tables: &[&str]) -> Vec<String> {
    let text = read(&repo_root().join(manifest));
    assert!(!text.is_empty(), "{manifest} is missing: update this test");
    text.split("\n[")
        .filter(|section| tables.iter().any(|t| section.starts_with(t)))
        .flat_map(|section| section.lines().skip(1))
        .map(str::trim)
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            l.split(|c: char| c == '.' || c == '=' || c.is_whitespace())
                .next()
        })
        .map(str::to_owned)
        .collect()
}

const NORMAL: &[&str] = &["dependencies]"];
const ALL_TABLES: &[&str] = &["dependencies]", "dev-dependencies]", "build-dependencies]"];

/// The layers of the engine, lowest first: each may depend only on the
/// ones before it.
const LAYERS: &[(&str, &str)] = &[
    ("belay-proto", "proto/Cargo.toml"),
    ("belay-definitions", "engine/definitions/Cargo.toml"),
    ("belay-machine", "engine/machine/Cargo.toml"),
    ("belay-store", "engine/store/Cargo.toml"),
    ("belay-engine", "engine/Cargo.toml"),
];

#[test]
fn the_engine_layers_depend_only_downwards() {
    for (i, (name, manifest)) in LAYERS.iter().enumerate() {
        let below: Vec<&str> = LAYERS[..i].iter().map(|(n, _)| *n).collect();
        for dep in belay_dependencies(manifest, ALL_TABLES) {
            assert!(
                below.contains(&dep.as_str()),
                "{name} depends on {dep}: the layers run proto <- definitions <- machine <- store <- engine"
            );
        }
    }
}

#[test]
fn machine_and_definitions_depend_on_no_io_crate() {
    for manifest in ["engine/definitions/Cargo.toml", "engine/machine/Cargo.toml"] {
        for dep in dependency_names(manifest, ALL_TABLES) {
            for io in [
                "sqlx", "tokio", "tonic", "axum", "reqwest", "hyper", "rmcp", "tracing",
            ] {
                assert!(
                    !dep.starts_with(io),
                    "{manifest} depends on {dep}: the machine and the definitions do no I/O"
                );
            }
        }
    }
}

#[test]
fn machine_and_definitions_do_no_io() {
    let mut files = crate_files("engine/machine/src");
    files.extend(crate_files("engine/definitions/src"));
    assert!(
        files.len() >= 20,
        "expected the machine and definitions sources, found {files:?}"
    );
    for file in files {
        let text = read(&file);
        for forbidden in [
            "std::fs",
            "std::net",
            "std::process",
            "SystemTime",
            "Instant::now",
            "Utc::now",
            "rand::",
        ] {
            assert!(
                !text.contains(forbidden),
                "{} mentions `{forbidden}`",
                relative(&file)
            );
        }
    }
}

#[test]
fn engine_never_depends_on_worker_or_sdk() {
    for dep in belay_dependencies("engine/Cargo.toml", NORMAL) {
        assert!(
            !["belay-worker", "belay-sdk", "belay-cli"].contains(&dep.as_str())
                && !dep.starts_with("belay-example"),
            "engine depends on {dep}"
        );
    }
}

#[test]
fn worker_and_sdk_never_depend_on_the_engine() {
    for manifest in ["worker/Cargo.toml", "sdk/Cargo.toml"] {
        for dep in belay_dependencies(manifest, NORMAL) {
            assert_eq!(dep, "belay-proto", "{manifest} depends on {dep}");
        }
    }
}

#[test]
fn the_cli_depends_only_on_proto_sdk_engine_and_worker() {
    for dep in belay_dependencies("cli/Cargo.toml", NORMAL) {
        assert!(
            ["belay-proto", "belay-sdk", "belay-engine", "belay-worker"].contains(&dep.as_str()),
            "cli depends on {dep}"
        );
    }
}

#[test]
fn nothing_but_the_tests_depends_on_the_cli() {
    for folder in CRATES.iter().filter(|c| **c != "tests" && **c != "cli") {
        let manifest = format!("{folder}/Cargo.toml");
        assert!(
            !belay_dependencies(&manifest, ALL_TABLES).contains(&"belay-cli".to_owned()),
            "{manifest} depends on belay-cli"
        );
    }
}

/// Crates that may name `dep` in their sources beyond its home: the tests
/// and the benchmark inspect the database and talk gRPC themselves.
const OBSERVERS: &[&str] = &["tests", "bench"];

/// The files of every crate but `home` and the observers that name
/// `pattern` (a `path::` prefix such as `sqlx::`), as `path:line`.
fn named_outside(pattern: &str, allowed: &dyn Fn(&str) -> bool) -> Vec<String> {
    let mut found = Vec::new();
    for folder in CRATES.iter().filter(|c| !OBSERVERS.contains(c)) {
        for file in crate_files(&format!("{folder}/src")) {
            let path = relative(&file);
            if allowed(&path) {
                continue;
            }
            // Comments and strings (a log filter `rmcp::service=error`)
            // name no code.
            for (n, code) in blank_non_code(&read(&file)).lines().enumerate() {
                if code.contains(pattern) {
                    found.push(format!("{path}:{}", n + 1));
                }
            }
        }
    }
    found
}

#[test]
fn sqlx_is_named_only_in_the_store() {
    let found = named_outside("sqlx::", &|p| p.starts_with("engine/store/"));
    assert!(
        found.is_empty(),
        "SQL lives in belay-store only; sqlx named at {found:?}"
    );
    for folder in CRATES
        .iter()
        .filter(|c| !OBSERVERS.contains(c) && **c != "engine/store")
    {
        let manifest = format!("{folder}/Cargo.toml");
        assert!(
            !dependency_names(&manifest, NORMAL).contains(&"sqlx".to_owned()),
            "{manifest} depends on sqlx: only belay-store may"
        );
    }
}

#[test]
fn rmcp_is_named_only_in_the_mcp_client_and_server() {
    let found = named_outside("rmcp::", &|p| {
        p.starts_with("worker/src/mcp/rmcp_client") || p == "engine/src/mcp_server.rs"
    });
    assert!(
        found.is_empty(),
        "rmcp (pinned, fast-moving) stays behind worker/src/mcp/rmcp_client.rs and engine/src/mcp_server.rs; named at {found:?}"
    );
}

#[test]
fn a_tonic_status_is_built_only_in_the_api_layer() {
    // In the engine's crates, tonic is named only by the gRPC API and by
    // the one map from errors to codes (which names `tonic::Code`).
    let error_map = "engine/src/error_code.rs";
    let found = named_outside("tonic::", &|p| {
        !p.starts_with("engine/")
            || p == "engine/src/api.rs"
            || p.starts_with("engine/src/api/")
            || p == error_map
    });
    assert!(
        found.is_empty(),
        "gRPC statuses are made in engine/src/api only (from {error_map}); tonic named at {found:?}"
    );
    let map = read(&repo_root().join(error_map));
    assert!(
        !map.contains("tonic::Status") && !map.contains("Status::new"),
        "{error_map} maps errors to codes; the API layer builds the statuses"
    );
}

#[test]
fn every_module_says_what_it_is_for() {
    let mut files = Vec::new();
    for folder in CRATES {
        files.extend(crate_files(&format!("{folder}/src")));
        files.extend(crate_files(&format!("{folder}/tests")));
    }
    assert!(files.len() > 100, "found only {} files", files.len());
    for file in files {
        assert!(
            read(&file).trim_start().starts_with("//!"),
            "{} has no `//!` module doc",
            relative(&file)
        );
    }
}

/// Every non-test source file of the workspace, by relative path.
fn source_files() -> BTreeMap<String, String> {
    CRATES
        .iter()
        .flat_map(|c| crate_files(&format!("{c}/src")))
        .map(|f| (relative(&f), read(&f)))
        .filter(|(path, _)| !is_test_file(path))
        .collect()
}

/// Figures over `limit` that the `exceptions` do not allow, and exceptions
/// that are stale (gone, or now under their ceiling).
fn over_limit(
    measured: &BTreeMap<String, usize>,
    limit: usize,
    exceptions: &[(&str, usize)],
) -> Vec<String> {
    let mut problems = Vec::new();
    for (what, &n) in measured.iter().filter(|(_, n)| **n > limit) {
        match exceptions.iter().find(|(name, _)| name == what) {
            None => problems.push(format!("{what}: {n} lines (limit {limit})")),
            Some((_, ceiling)) if n > *ceiling => {
                problems.push(format!("{what}: {n} lines, grew past its listed {ceiling}"))
            }
            Some(_) => {}
        }
    }
    for (name, ceiling) in exceptions {
        match measured.get(*name) {
            Some(&n) if n == *ceiling => {}
            Some(&n) if n <= limit => problems.push(format!(
                "{name}: {n} lines, under the limit now: remove it from the exceptions"
            )),
            Some(&n) if n < *ceiling => problems.push(format!(
                "{name}: {n} lines, shrank: lower its listed ceiling {ceiling} to {n}"
            )),
            Some(_) => {}
            None => problems.push(format!("{name}: listed but not found: remove it")),
        }
    }
    problems
}

#[test]
fn no_source_file_is_over_2000_lines() {
    let lines: BTreeMap<String, usize> = source_files()
        .into_iter()
        .map(|(path, text)| (path, text.lines().count()))
        .collect();
    let problems = over_limit(&lines, MAX_FILE_LINES, LONG_FILES);
    assert!(
        problems.is_empty(),
        "split these by concern (one concern per file):\n{}",
        problems.join("\n")
    );
}

#[test]
fn no_function_outside_tests_is_over_200_lines() {
    let mut lengths = BTreeMap::new();
    for (path, text) in source_files() {
        for f in functions(&text).into_iter().filter(|f| !f.in_test) {
            let key = format!("{path}::{}", f.name);
            let longest = lengths.entry(key).or_insert(0);
            *longest = f.lines.max(*longest);
        }
    }
    assert!(
        lengths.len() > 1_000,
        "found only {} functions",
        lengths.len()
    );
    let problems = over_limit(&lengths, MAX_FN_LINES, LONG_FUNCTIONS);
    assert!(
        problems.is_empty(),
        "split these into smaller functions:\n{}",
        problems.join("\n")
    );
}
