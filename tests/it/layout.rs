//! The layout rules of `src/`, kept by a test so that they cannot come
//! undone unnoticed (the last cleanup of import cycles lasted one round):
//! no import cycle between top-level modules, none between the children of
//! any folder, no file over 700 lines and no function over 100 lines.
//!
//! A top-level module is a file `src/<m>.rs` or a folder `src/<m>/`. Module
//! `a` reaches `b` when any of its files names `crate::b`, in code or in a
//! doc comment (a doc link is a dependency too). A cycle inside one folder
//! module is the folder rule's business:
//!
//! Inside every folder under `src/` (recursively), the direct children (its
//! files and its subfolders, a subfolder with everything under it) may not
//! import each other in a circle. A child reaches a sibling when one of its
//! files names it by a path that resolves to it: `super::x`,
//! `super::super::x`, `crate::top::x`, `self::x` (or, in the folder's
//! `mod.rs`, a bare `x::`), groups like `super::{x, y::Z}` included, from
//! inline modules (`mod tests`) too, in code or in doc comments.
//!
//! The folder's `mod.rs` is the folder itself, its root as `lib.rs` is the
//! crate's: it declares and wires its children, so its own paths into
//! them are no edges (as the crate roots are left out of the top-level
//! graph). A child's path to a name of the folder (`super::Thing`) is
//! followed to where the name comes from:
//! - a name `mod.rs` defines (or a glob `super::*`, or a name the test
//!   cannot place) is a dependency on the node `mod.rs`, which has no
//!   edges out and so closes no circle;
//! - a name `mod.rs` imports from a child (`pub use child::Thing`, or a
//!   glob `pub use child::*` of a child that declares it) is a dependency
//!   on that child: a re-export is no way round the rule;
//! - a name `mod.rs` imports from outside the folder is no dependency
//!   inside it.

mod folders;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Most lines of one source file.
const MAX_FILE_LINES: usize = 700;
/// Most lines of one function, from its `fn` line to its closing brace.
const MAX_FN_LINES: usize = 100;

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The top-level module a file of `src/` belongs to; `None` for the crate
/// roots (`lib.rs`, `main.rs`), which name every module.
fn top_module(file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src()).unwrap();
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    let name = first.strip_suffix(".rs").unwrap_or(&first).to_string();
    (name != "lib" && name != "main").then_some(name)
}

/// The top-level modules `text` names after `crate::`, including each
/// name of a `crate::{a, b::c}` group.
fn named_modules(text: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices("crate::") {
        let rest = text[i + "crate::".len()..].trim_start();
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level names of the group: after `{` or a `,` at depth 0.
            let mut depth = 0;
            let mut start = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if start && !c.is_whitespace() => {
                        start = false;
                        let name = ident(&group[j..]);
                        if !name.is_empty() && name != "self" {
                            out.insert(name);
                        }
                    }
                    _ => {}
                }
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

/// The import graph between top-level modules.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let Some(module) = top_module(&file) else {
            continue;
        };
        let text = std::fs::read_to_string(&file).unwrap();
        let edges = graph.entry(module.clone()).or_default();
        edges.extend(named_modules(&text).into_iter().filter(|m| *m != module));
    }
    graph
}

/// A cycle through `graph`, as the path that closes it, if there is one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

/// Functions of `text` longer than [`MAX_FN_LINES`], as `(line, name,
/// lines)`. The source is rustfmt's, so a function that opens at one
/// indentation closes with a `}` alone at the same indentation.
fn long_functions(text: &str) -> Vec<(usize, String, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let Some(at) = trimmed.find("fn ") else {
            continue;
        };
        let head = &trimmed[..at];
        let is_fn = head.split_whitespace().all(|w| {
            [
                "pub",
                "pub(crate)",
                "pub(super)",
                "async",
                "const",
                "unsafe",
            ]
            .contains(&w)
        });
        if !is_fn || trimmed.starts_with("//") {
            continue;
        }
        let indent = &line[..line.len() - trimmed.len()];
        // A declaration without a body (in a trait) or a one-line body.
        let Some(open) = lines[i..].iter().position(|l| {
            let l = l.trim_end();
            l.ends_with('{') || l.ends_with(';') || l.ends_with('}')
        }) else {
            continue;
        };
        if !lines[i + open].trim_end().ends_with('{') {
            continue;
        }
        let close = format!("{indent}}}");
        if let Some(end) = lines[i + open..].iter().position(|l| *l == close) {
            let length = open + end + 1;
            if length > MAX_FN_LINES {
                let name: String = trimmed[at + 3..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                out.push((i + 1, name, length));
            }
        }
    }
    out
}

#[test]
fn no_import_cycle_between_top_level_modules() {
    let graph = graph();
    assert!(graph.len() > 10, "found only {} modules", graph.len());
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "import cycle between top-level modules of src/: {}",
            cycle.join(" -> ")
        );
    }
}

#[test]
fn no_file_over_the_limit_and_no_long_function() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut problems = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let shown = file.strip_prefix(src().parent().unwrap()).unwrap();
        let count = text.lines().count();
        if count > MAX_FILE_LINES {
            problems.push(format!("{}: {count} lines", shown.display()));
        }
        for (line, name, length) in long_functions(&text) {
            problems.push(format!(
                "{}:{line}: fn {name} is {length} lines",
                shown.display()
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "over {MAX_FILE_LINES} lines per file or {MAX_FN_LINES} per function:\n{}",
        problems.join("\n")
    );
}

/// The checks themselves find what they are for.
#[test]
fn the_checks_see_cycles_groups_and_long_functions() {
    let names = named_modules("use crate::{a::X, b, c::{d, e}};\nuse crate::f;");
    assert_eq!(names.into_iter().collect::<Vec<_>>(), ["a", "b", "c", "f"]);
    let mut graph = BTreeMap::new();
    graph.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    graph.insert("b".to_string(), BTreeSet::from(["c".to_string()]));
    graph.insert("c".to_string(), BTreeSet::from(["a".to_string()]));
    assert_eq!(find_cycle(&graph).unwrap(), ["a", "b", "c", "a"]);
    graph.get_mut("c").unwrap().clear();
    assert!(find_cycle(&graph).is_none());
    let body = "    x();\n".repeat(MAX_FN_LINES);
    let long = format!("pub async fn f() {{\n{body}}}\nfn g() {{}}\n");
    assert_eq!(
        long_functions(&long),
        [(1, "f".to_string(), MAX_FN_LINES + 2)]
    );
    let short = format!(
        "    fn h(\n        a: u8,\n    ) -> u8 {{\n{}    }}\n",
        "        a;\n".repeat(10)
    );
    assert!(long_functions(&short).is_empty());
}
