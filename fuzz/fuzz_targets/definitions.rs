//! Fuzz target: the definition parsers (`.tools.abl` files with their
//! signature lines, YAML agents and workflows, `file:` imports between
//! them) answer every input with a bundle or with errors, and never panic.
//!
//! Each input is parsed as one bundle of four files: the input as a tools
//! file twice (`d/a.tools.abl`, `d/b.tools.abl`, so `file:` imports between
//! them and of themselves resolve), as a YAML file (`d/a.yaml`), and its
//! first line as the signature of a tool (`d/s.tools.abl`), so the
//! signature parser sees raw bytes too. The errors must name a file of the
//! bundle and a line and column from 1.

#![no_main]

use belay_definitions::{RegisteredNames, SourceFile, parse_bundle};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data).into_owned();
    let first_line = text.lines().next().unwrap_or_default();
    let signature = format!("TOOLS:\n  {first_line}\n    permission: p\n");
    let files = [
        ("d/a.tools.abl", text.clone()),
        ("d/b.tools.abl", text.clone()),
        ("d/a.yaml", text),
        ("d/s.tools.abl", signature),
    ]
    .map(|(path, content)| SourceFile {
        path: path.to_string(),
        content,
    });
    if let Err(errors) = parse_bundle(&files, &RegisteredNames::default()) {
        for e in errors {
            assert!(
                files.iter().any(|f| f.path == e.file) && e.line >= 1 && e.column >= 1,
                "error without a place in the bundle: {e:?}"
            );
        }
    }
});
