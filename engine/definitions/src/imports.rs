//! `file:` imports (seed: `seeds/abl-tools.md`, "Import syntax"): a tools
//! file's `TOOLS:` section, or an agent's `tools:` list, names another
//! `.tools.abl` file of the bundle, by a path relative to the importing
//! file, and takes all of its tools or the ones listed.
//!
//! An import adds no definition: every tools file of a bundle is registered
//! anyway, and tool names are unique across it. It adds *names*: an agent
//! importing a file may call that file's tools, and a tools file that
//! imports another passes the imported tools on to whoever imports it.
//! Paths are resolved against the bundle's own paths only (this module
//! reads no file system), so an import can never reach a file outside the
//! bundle; `..` above the importing file's path and absolute paths are
//! refused all the same, since they would mean another layout than the
//! bundle's.

use std::collections::{BTreeMap, BTreeSet};

use super::{DefinitionError, NameAt, check_name};

/// One `file:` import, as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct FileImport {
    /// The path as written (quotes removed).
    pub path: String,
    /// 1-based line of the path.
    pub line: u32,
    /// 1-based column of the path.
    pub column: u32,
    /// `[a, b]`: only these tools; `None`: every tool of the file.
    pub names: Option<Vec<NameAt>>,
}

/// Parse the value of a `file:` line of a tools file: `"path"` (or a bare
/// path without spaces), then optionally `[tool, tool]`. `column` is the
/// value's first column; an error is `(column, message)`.
pub(super) fn parse_import_value(
    value: &str,
    line: u32,
    column: u32,
) -> Result<FileImport, (u32, String)> {
    let chars: Vec<char> = value.chars().collect();
    let col = |i: usize| column.saturating_add(u32::try_from(i).unwrap_or(u32::MAX));
    let (path, mut i) = match chars.first() {
        None => {
            return Err((
                column,
                "`file:` needs a path, such as `file: \"./crm.tools.abl\" [get_customer]`"
                    .to_string(),
            ));
        }
        Some('"' | '\'') => {
            super::signature::lex_string(&chars, 0).map_err(|(at, m)| (col(at), m))?
        }
        Some(_) => {
            let end = chars
                .iter()
                .position(|c| c.is_whitespace() || *c == '[')
                .unwrap_or(chars.len());
            (chars[..end].iter().collect(), end)
        }
    };
    while chars.get(i).is_some_and(|c| c.is_whitespace()) {
        i += 1;
    }
    let names = match chars.get(i) {
        None => None,
        Some('[') => Some(parse_name_list(&chars, i, line, &col)?),
        Some(_) => {
            return Err((
                col(i),
                "expected `[tool, ...]` or the end of the line after the path".to_string(),
            ));
        }
    };
    Ok(FileImport {
        path,
        line,
        column,
        names,
    })
}

/// `[a, b]` starting at `chars[open]`, through the end of the value.
fn parse_name_list(
    chars: &[char],
    open: usize,
    line: u32,
    col: &dyn Fn(usize) -> u32,
) -> Result<Vec<NameAt>, (u32, String)> {
    let Some(close) = chars.iter().position(|c| *c == ']') else {
        return Err((col(open), "`[` without a closing `]`".to_string()));
    };
    if let Some(extra) = (close + 1..chars.len()).find(|&j| !chars[j].is_whitespace()) {
        return Err((col(extra), "unexpected text after `]`".to_string()));
    }
    let mut names: Vec<NameAt> = Vec::new();
    let mut start = open + 1;
    for end in (open + 1..=close).filter(|&j| chars[j] == ',' || j == close) {
        let raw: String = chars[start..end].iter().collect();
        let lead = raw.chars().take_while(|c| c.is_whitespace()).count();
        let name = raw.trim().to_string();
        let at = col(start + lead);
        start = end + 1;
        if name.is_empty() {
            // `[a, b,]`: a trailing comma, as in signatures.
            if end == close && !names.is_empty() {
                continue;
            }
            return Err((at, "expected a tool name in the list".to_string()));
        }
        if let Some(message) = check_name("tool", &name) {
            return Err((at, message));
        }
        if let Some(first) = names.iter().find(|n| n.name == name) {
            return Err((
                at,
                format!(
                    "`{name}` is listed twice (first at column {})",
                    first.column
                ),
            ));
        }
        names.push(NameAt {
            name,
            line,
            column: at,
        });
    }
    Ok(names)
}

/// A bundle path in one spelling: `.` and empty segments dropped, `..`
/// applied. `None` when `..` climbs above the path's first segment.
fn normalize(path: &str) -> Option<String> {
    let absolute = path.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for segment in path.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            s => parts.push(s),
        }
    }
    let joined = parts.join("/");
    Some(if absolute {
        format!("/{joined}")
    } else {
        joined
    })
}

/// The bundle path `written` names, relative to the folder of `from`.
fn resolve(from: &str, written: &str) -> Result<String, String> {
    if written.is_empty() {
        return Err("`file:` needs a path".to_string());
    }
    let drive = written.len() >= 2
        && written.as_bytes()[0].is_ascii_alphabetic()
        && written.as_bytes()[1] == b':';
    if written.starts_with('/') || written.starts_with('\\') || drive || written.contains("://") {
        return Err(format!(
            "`{written}` is an absolute path; an import names a file of the bundle relative to the importing file (`./tools/crm.tools.abl`)"
        ));
    }
    if written.contains('\\') {
        return Err(format!("`{written}`: separate folders with `/`, not `\\`"));
    }
    let folder = from.rsplit_once('/').map_or("", |(dir, _)| dir);
    let joined = if folder.is_empty() {
        written.to_string()
    } else {
        format!("{folder}/{written}")
    };
    // `..` may not climb above the importing file's own path: the bundle's
    // layout is all there is.
    let base_depth =
        normalize(folder).map_or(0, |f| f.split('/').filter(|s| !s.is_empty()).count());
    let mut depth = base_depth;
    for segment in written.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                depth = depth.checked_sub(1).ok_or_else(|| {
                    format!("`{written}` leaves the bundle: `..` climbs above `{from}`'s folders")
                })?;
            }
            _ => depth += 1,
        }
    }
    normalize(&joined).ok_or_else(|| format!("`{written}` leaves the bundle"))
}

/// The tools files of a bundle, by normalized path: what each declares and imports.
pub(super) struct ToolsFiles<'a> {
    files: BTreeMap<String, (&'a str, &'a [NameAt], &'a [FileImport])>,
    /// Paths of the bundle's other files (YAML), to say what they are.
    others: BTreeSet<String>,
}

impl<'a> ToolsFiles<'a> {
    /// `tools`: (path, declared tool names, imports) of every tools file;
    /// `others`: every other file path of the bundle.
    pub(super) fn new(
        tools: impl IntoIterator<Item = (&'a str, &'a [NameAt], &'a [FileImport])>,
        others: impl IntoIterator<Item = &'a str>,
    ) -> Self {
        ToolsFiles {
            files: tools
                .into_iter()
                .map(|(p, d, i)| (normalize(p).unwrap_or_else(|| p.to_string()), (p, d, i)))
                .collect(),
            others: others
                .into_iter()
                .map(|p| normalize(p).unwrap_or_else(|| p.to_string()))
                .collect(),
        }
    }
}

/// Resolves every import of a bundle: each tools file's tools (its own and
/// those it imports, transitively), and the names each agent imports.
pub(super) struct Resolver<'a, 'e> {
    files: &'a ToolsFiles<'a>,
    /// Tools a file offers, once known.
    offered: BTreeMap<String, Vec<String>>,
    /// Files being resolved (the current chain of imports), for cycles.
    chain: Vec<String>,
    errors: &'e mut Vec<DefinitionError>,
}

impl<'a, 'e> Resolver<'a, 'e> {
    /// A resolver writing its errors to `errors`.
    pub(super) fn new(files: &'a ToolsFiles<'a>, errors: &'e mut Vec<DefinitionError>) -> Self {
        Resolver {
            files,
            offered: BTreeMap::new(),
            chain: Vec::new(),
            errors,
        }
    }

    /// Resolve the imports of every tools file (so each error is reported
    /// once, in the file that writes it).
    pub(super) fn check_tools_files(&mut self) {
        let keys: Vec<String> = self.files.files.keys().cloned().collect();
        for key in keys {
            self.offered_by(&key);
        }
    }

    /// The tool names `imports` of `file` bring, in order, without repeats.
    pub(super) fn names(&mut self, file: &str, imports: &[FileImport]) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for import in imports {
            for name in self.import(file, import) {
                if !out.contains(&name) {
                    out.push(name);
                }
            }
        }
        out
    }

    fn error(&mut self, file: &str, line: u32, column: u32, message: String) {
        self.errors
            .push(DefinitionError::new(file, line, column, message));
    }

    /// The names one import brings (none when it is wrong, with the error).
    fn import(&mut self, file: &str, import: &FileImport) -> Vec<String> {
        let target = match resolve(file, &import.path) {
            Ok(t) => t,
            Err(message) => {
                self.error(file, import.line, import.column, message);
                return Vec::new();
            }
        };
        if !self.files.files.contains_key(&target) {
            let message = if self.files.others.contains(&target) {
                format!(
                    "`{}` (`{target}`) is not a tools file: only `*.tools.abl` files can be imported",
                    import.path
                )
            } else {
                format!(
                    "imported file `{}` (`{target}`) is not in the bundle; register it together with `{file}`",
                    import.path
                )
            };
            self.error(file, import.line, import.column, message);
            return Vec::new();
        }
        if let Some(at) = self.chain.iter().position(|f| *f == target) {
            let mut cycle: Vec<&str> = self.chain[at..].iter().map(String::as_str).collect();
            cycle.push(&target);
            let message = format!("import cycle: {}", cycle.join(" -> "));
            self.error(file, import.line, import.column, message);
            return Vec::new();
        }
        let offered = self.offered_by(&target);
        match &import.names {
            None => offered,
            Some(names) => {
                let mut out = Vec::new();
                for n in names {
                    if offered.contains(&n.name) {
                        out.push(n.name.clone());
                    } else {
                        let message = format!(
                            "`{}` is not a tool of `{}` (it has: {})",
                            n.name,
                            import.path,
                            if offered.is_empty() {
                                "none".to_string()
                            } else {
                                offered.join(", ")
                            }
                        );
                        self.error(file, n.line, n.column, message);
                    }
                }
                out
            }
        }
    }

    /// The tools `key` (a normalized path of a tools file) offers: its own,
    /// then what it imports.
    fn offered_by(&mut self, key: &str) -> Vec<String> {
        if let Some(known) = self.offered.get(key) {
            return known.clone();
        }
        let Some(&(path, declared, imports)) = self.files.files.get(key) else {
            return Vec::new();
        };
        self.chain.push(key.to_string());
        let mut out: Vec<String> = declared.iter().map(|n| n.name.clone()).collect();
        for name in self.names(path, imports) {
            if !out.contains(&name) {
                out.push(name);
            }
        }
        self.chain.pop();
        self.offered.insert(key.to_string(), out.clone());
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn import_values() {
        let i = parse_import_value("\"./tools/a.tools.abl\" [x, y_2,]", 3, 9).unwrap();
        assert_eq!(i.path, "./tools/a.tools.abl");
        assert_eq!((i.line, i.column), (3, 9));
        let names = i.names.unwrap();
        assert_eq!(
            names
                .iter()
                .map(|n| (n.name.as_str(), n.column))
                .collect::<Vec<_>>(),
            vec![("x", 32), ("y_2", 35)]
        );
        let i = parse_import_value("a.tools.abl", 1, 1).unwrap();
        assert_eq!((i.path.as_str(), i.names), ("a.tools.abl", None));
        let i = parse_import_value("'a b.tools.abl'[z]", 1, 1).unwrap();
        assert_eq!(i.path, "a b.tools.abl");
        assert_eq!(i.names.unwrap()[0].column, 17);
        let e = |v: &str| parse_import_value(v, 1, 7).unwrap_err();
        assert_eq!(e("").0, 7);
        assert_eq!(e("\"a.tools.abl").1, "unterminated string");
        assert_eq!(
            e("a.tools.abl x"),
            (
                19,
                "expected `[tool, ...]` or the end of the line after the path".into()
            )
        );
        assert_eq!(
            e("a.tools.abl [x"),
            (19, "`[` without a closing `]`".into())
        );
        assert_eq!(
            e("a.tools.abl [x] y"),
            (23, "unexpected text after `]`".into())
        );
        assert_eq!(
            e("a.tools.abl []"),
            (20, "expected a tool name in the list".into())
        );
        assert_eq!(
            e("a.tools.abl [x,,y]"),
            (22, "expected a tool name in the list".into())
        );
        assert_eq!(
            e("a.tools.abl [x, x]"),
            (23, "`x` is listed twice (first at column 20)".into())
        );
        assert!(e("a.tools.abl [Bad]").1.contains("Bad"));
    }

    #[test]
    fn paths_resolve_inside_the_bundle() {
        assert_eq!(
            resolve("a.tools.abl", "b.tools.abl").unwrap(),
            "b.tools.abl"
        );
        assert_eq!(
            resolve("defs/agents/a.yaml", "../tools/./b.tools.abl").unwrap(),
            "defs/tools/b.tools.abl"
        );
        assert_eq!(
            resolve("./defs/a.tools.abl", "./b.tools.abl").unwrap(),
            "defs/b.tools.abl"
        );
        assert_eq!(
            resolve("/srv/defs/a.tools.abl", "b.tools.abl").unwrap(),
            "/srv/defs/b.tools.abl"
        );
        assert!(
            resolve("defs/a.tools.abl", "../../x.tools.abl")
                .unwrap_err()
                .contains("leaves the bundle")
        );
        assert!(
            resolve("a.tools.abl", "../a.tools.abl")
                .unwrap_err()
                .contains("leaves the bundle")
        );
        // Down and up again is fine; up first is not, even if it comes back.
        assert_eq!(
            resolve("a.tools.abl", "x/../b.tools.abl").unwrap(),
            "b.tools.abl"
        );
        assert!(resolve("d/a.tools.abl", "../../d/b.tools.abl").is_err());
        for absolute in [
            "/etc/x.tools.abl",
            "\\\\server\\x",
            "C:/x.tools.abl",
            "file:///x",
        ] {
            assert!(
                resolve("a.tools.abl", absolute)
                    .unwrap_err()
                    .contains("absolute path"),
                "{absolute}"
            );
        }
        assert!(resolve("a.tools.abl", "t\\x.tools.abl").is_err());
    }
}
