//! The graph of a workflow as an SVG drawn on the server: nodes in columns
//! by their distance from the start (left to right), edges labelled with
//! what takes them (`on_error`, a branch's case, a wait's signal or
//! timer), the nodes a run visited marked, and the node it is at
//! highlighted. Text is escaped here; the SVG goes into pages as is.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;

use crate::definitions::model::{NodeDef, NodeKind, WaitFor, WorkflowDef};

const NODE_W: i64 = 136;
const NODE_H: i64 = 44;
const COL_GAP: i64 = 56;
const ROW_GAP: i64 = 30;
const MARGIN: i64 = 16;

/// What of a run the graph shows.
#[derive(Debug, Clone, Default)]
pub(crate) struct RunMarks {
    /// Visits of each node so far.
    pub(crate) visits: BTreeMap<String, u32>,
    /// The node the run is at, if any.
    pub(crate) current: Option<String>,
}

/// Escape text for SVG/HTML.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `ms` as `3d`, `2h`, `90s`, `250ms`.
fn duration(ms: u64) -> String {
    match ms {
        ms if ms % 86_400_000 == 0 => format!("{}d", ms / 86_400_000),
        ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        ms if ms % 1000 == 0 => format!("{}s", ms / 1000),
        ms => format!("{ms}ms"),
    }
}

/// The node's outgoing edges: `(label, target)`; an empty label is plain `next`.
fn edges(node: &NodeDef) -> Vec<(String, String)> {
    match &node.kind {
        NodeKind::Branch { cases, default } => {
            let mut out: Vec<(String, String)> = cases
                .iter()
                .enumerate()
                .map(|(i, c)| (format!("case {}", i + 1), c.next.clone()))
                .collect();
            if let Some(d) = default.as_ref().or(node.next.as_ref()) {
                out.push(("default".into(), d.clone()));
            }
            out
        }
        NodeKind::Wait(w) => {
            let mut out = Vec::new();
            for f in &w.any {
                let (label, next) = match f {
                    WaitFor::Signal { name, next, .. } => (format!("signal {name}"), next),
                    WaitFor::Duration { ms, next } => (format!("after {}", duration(*ms)), next),
                    WaitFor::Until { next, .. } => ("until".to_owned(), next),
                };
                if let Some(n) = next.as_ref().or(node.next.as_ref()) {
                    out.push((label, n.clone()));
                }
            }
            if let Some(n) = &w.on_timeout {
                out.push(("on_timeout".into(), n.clone()));
            }
            out
        }
        _ => node
            .successors()
            .into_iter()
            .map(|(key, to)| {
                let label = if key == "next" { "" } else { key };
                (label.to_owned(), to.to_owned())
            })
            .collect(),
    }
}

/// The node's type as shown under its id (`agent intake_agent`, `tool kyc_check`, …).
fn kind_text(node: &NodeDef) -> String {
    match &node.kind {
        NodeKind::Agent { agent, .. } => format!("agent {agent}"),
        NodeKind::Tool { tool, .. } => format!("tool {tool}"),
        NodeKind::Wait(_) => "wait".into(),
        NodeKind::Approval(_) => "approval".into(),
        NodeKind::Workflow { workflow, .. } => format!("workflow {workflow}"),
        NodeKind::Branch { .. } => "branch".into(),
        NodeKind::Set { .. } => "set".into(),
        NodeKind::Fail { .. } => "fail".into(),
        NodeKind::Succeed { .. } => "succeed".into(),
    }
}

/// Column of each node: its distance from the start; nodes the start
/// does not reach go in a column after the last.
fn columns(wf: &WorkflowDef) -> BTreeMap<String, usize> {
    let mut col: BTreeMap<String, usize> = BTreeMap::new();
    let start = if wf.start.is_empty() {
        wf.nodes.first().map(|n| n.id.clone()).unwrap_or_default()
    } else {
        wf.start.clone()
    };
    let mut queue = VecDeque::from([(start, 0usize)]);
    while let Some((id, c)) = queue.pop_front() {
        if col.contains_key(&id) {
            continue;
        }
        let Some(node) = wf.nodes.iter().find(|n| n.id == id) else {
            continue;
        };
        col.insert(id, c);
        for (_, to) in edges(node) {
            queue.push_back((to, c + 1));
        }
    }
    let last = col.values().max().map(|c| c + 1).unwrap_or(0);
    for n in &wf.nodes {
        col.entry(n.id.clone()).or_insert(last);
    }
    col
}

/// The SVG of `wf`, with `marks` of a run (or none, for a definition);
/// its element ids start with `id` (several graphs can share a page).
pub(crate) fn svg(wf: &WorkflowDef, marks: &RunMarks, id: &str) -> String {
    let col = columns(wf);
    let mut rows_in: BTreeMap<usize, i64> = BTreeMap::new();
    let mut pos: BTreeMap<&str, (i64, i64)> = BTreeMap::new();
    for n in &wf.nodes {
        let c = col.get(&n.id).copied().unwrap_or(0);
        let row = rows_in.entry(c).or_insert(0);
        let x = MARGIN + c as i64 * (NODE_W + COL_GAP);
        let y = MARGIN + 20 + *row * (NODE_H + ROW_GAP);
        *row += 1;
        pos.insert(n.id.as_str(), (x, y));
    }
    let width = pos.values().map(|p| p.0).max().unwrap_or(0) + NODE_W + 2 * MARGIN;
    let height = pos.values().map(|p| p.1).max().unwrap_or(0) + NODE_H + 2 * MARGIN + 40;
    let current = marks.current.as_deref().unwrap_or("");
    let mut out = String::new();
    let _ = write!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" aria-labelledby="{id}-title {id}-desc"><title id="{id}-title">Graph of workflow {name}</title><desc id="{id}-desc">{desc}</desc><defs><marker id="{id}-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#8b96a3"/></marker></defs>"##,
        name = esc(&wf.name),
        desc = esc(&describe(wf, marks)),
        id = esc(id),
    );
    for n in &wf.nodes {
        let Some(&(x1, y1)) = pos.get(n.id.as_str()) else {
            continue;
        };
        for (label, to) in edges(n) {
            let Some(&(x2, y2)) = pos.get(to.as_str()) else {
                continue;
            };
            edge(&mut out, (x1, y1), (x2, y2), &label, id);
        }
    }
    for n in &wf.nodes {
        let Some(&(x, y)) = pos.get(n.id.as_str()) else {
            continue;
        };
        let visits = marks.visits.get(&n.id).copied().unwrap_or(0);
        let class = if n.id == current {
            "g-node current"
        } else if visits > 0 {
            "g-node visited"
        } else {
            "g-node"
        };
        let badge = if visits > 1 {
            format!(" ×{visits}")
        } else {
            String::new()
        };
        let _ = write!(
            out,
            r#"<g class="{class}" data-node="{id}"><rect x="{x}" y="{y}" width="{NODE_W}" height="{NODE_H}" rx="6"/><text x="{tx}" y="{ty1}" font-weight="600">{id}{badge}</text><text class="kind" x="{tx}" y="{ty2}">{kind}</text></g>"#,
            id = esc(&n.id),
            tx = x + 8,
            ty1 = y + 18,
            ty2 = y + 34,
            kind = esc(&super::page::cut(&kind_text(n), 18)),
        );
    }
    out.push_str("</svg>");
    out
}

/// One edge: a curve to the right for a forward edge, an arc below the
/// nodes for one that goes back (a loop).
fn edge(out: &mut String, (x1, y1): (i64, i64), (x2, y2): (i64, i64), label: &str, id: &str) {
    let (path, lx, ly) = if x2 > x1 {
        let (sx, sy, ex, ey) = (x1 + NODE_W, y1 + NODE_H / 2, x2, y2 + NODE_H / 2);
        let mid = (sx + ex) / 2;
        (
            format!("M{sx},{sy} C{mid},{sy} {mid},{ey} {ex},{ey}"),
            mid - 20,
            (sy + ey) / 2 - 4,
        )
    } else {
        let (sx, sy, ex, ey) = (x1 + NODE_W / 2, y1 + NODE_H, x2 + NODE_W / 2, y2 + NODE_H);
        let dip = sy.max(ey) + 34;
        (
            format!("M{sx},{sy} C{sx},{dip} {ex},{dip} {ex},{ey}"),
            (sx + ex) / 2 - 20,
            dip - 4,
        )
    };
    let _ = write!(
        out,
        r#"<path class="g-edge" d="{path}" marker-end="url(#{}-arrow)"/>"#,
        esc(id)
    );
    if !label.is_empty() {
        let _ = write!(
            out,
            r#"<text class="g-edge-label" x="{lx}" y="{ly}">{}</text>"#,
            esc(&super::page::cut(label, 24))
        );
    }
}

/// A text description of the graph for screen readers.
fn describe(wf: &WorkflowDef, marks: &RunMarks) -> String {
    let mut parts = Vec::new();
    for n in &wf.nodes {
        let to: Vec<String> = edges(n)
            .into_iter()
            .map(|(l, t)| {
                if l.is_empty() {
                    t
                } else {
                    format!("{t} ({l})")
                }
            })
            .collect();
        let mut s = format!("{} ({})", n.id, kind_text(n));
        if marks.current.as_deref() == Some(n.id.as_str()) {
            s.push_str(", current");
        }
        if !to.is_empty() {
            s.push_str(&format!(" goes to {}", to.join(", ")));
        }
        parts.push(s);
    }
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workflow() -> WorkflowDef {
        let yaml = "kind: workflow\nname: w\nstart: a\nnodes:\n  - id: a\n    type: wait\n    for:\n      - signal: go\n        next: b\n      - duration: 3d\n        next: a\n  - id: b\n    type: succeed\n";
        let bundle = crate::definitions::parse_bundle(
            &[crate::definitions::SourceFile {
                path: "w.yaml".into(),
                content: yaml.into(),
            }],
            &crate::definitions::RegisteredNames::default(),
        )
        .expect("bundle");
        bundle.workflows[0].clone()
    }

    #[test]
    fn nodes_edges_and_marks_are_drawn_and_escaped() {
        let wf = workflow();
        let marks = RunMarks {
            visits: BTreeMap::from([("a".into(), 2)]),
            current: Some("a".into()),
        };
        let svg = svg(&wf, &marks, "g");
        assert!(
            svg.contains(r#"class="g-node current" data-node="a""#),
            "{svg}"
        );
        assert!(svg.contains("a ×2"), "{svg}");
        assert!(
            svg.contains("signal go") && svg.contains("after 3d"),
            "{svg}"
        );
        assert_eq!(svg.matches("<path class=\"g-edge\"").count(), 2, "{svg}");
        assert_eq!(esc("<a&\"'>"), "&lt;a&amp;&quot;&#39;&gt;");
    }
}
