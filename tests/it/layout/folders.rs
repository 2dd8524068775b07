//! The folder rule of the layout test (see its doc, in `layout.rs`): the
//! paths each file of `src/` names, resolved from the crate root, and the
//! graph among the direct children of each folder.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::{find_cycle, rust_files, src};

/// A path one file names, resolved from the crate root.
struct Reference {
    /// The module path it resolves to, from the crate root (`*` for a glob).
    path: Vec<String>,
    /// The name a `use` of it brings into scope: its alias or last segment.
    name: String,
    /// The module the path is written in (the file's, or an inline one's).
    from: Vec<String>,
    /// Its line in the file.
    line: usize,
    /// In a `use` declaration (of any visibility).
    is_use: bool,
}

/// One `.rs` file of `src/` as the folder rule sees it.
struct SourceFile {
    /// Its path from the repository root, for messages.
    shown: String,
    /// Its module path from the crate root (`http/users.rs` is
    /// `["http", "users"]`, `http/devices/mod.rs` is `["http", "devices"]`).
    module: Vec<String>,
    /// A folder's `mod.rs`.
    is_mod: bool,
    /// The paths it names into the crate.
    refs: Vec<Reference>,
    /// The names its items are declared with (`struct X`, `fn f`, ...).
    defines: BTreeSet<String>,
}

impl SourceFile {
    /// `children` are the names a folder's `mod.rs` may name bare
    /// (`users::f`, `pub use users::X`); empty for any other file.
    fn new(
        shown: &str,
        module: &[String],
        is_mod: bool,
        text: &str,
        children: &BTreeSet<String>,
    ) -> Self {
        SourceFile {
            shown: shown.to_string(),
            module: module.to_vec(),
            is_mod,
            refs: references(text, module, children),
            defines: defined_names(text),
        }
    }
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// The end of the identifier that starts at `i`.
fn ident_end(s: &[u8], i: usize) -> usize {
    i + s[i..].iter().take_while(|b| is_ident(**b)).count()
}

/// Skips white space and `//` comments (inside a `use` group).
fn skip_blank(s: &[u8], i: &mut usize) {
    while *i < s.len() {
        if s[*i].is_ascii_whitespace() {
            *i += 1;
        } else if s[*i..].starts_with(b"//") {
            *i += s[*i..].iter().take_while(|b| **b != b'\n').count();
        } else {
            break;
        }
    }
}

/// The paths of the use tree (or plain path) at `i`, which follows
/// `prefix::`, each with the name it brings into scope; `i` ends after it.
fn use_tree(s: &[u8], i: &mut usize, prefix: &[String], out: &mut Vec<(Vec<String>, String)>) {
    let last = || prefix.last().cloned().unwrap_or_default();
    skip_blank(s, i);
    if *i >= s.len() {
        out.push((prefix.to_vec(), last()));
    } else if s[*i] == b'{' {
        *i += 1;
        loop {
            skip_blank(s, i);
            if *i >= s.len() || s[*i] == b'}' {
                *i += 1;
                return;
            }
            let before = *i;
            use_tree(s, i, prefix, out);
            skip_blank(s, i);
            match s.get(*i) {
                Some(b',') => *i += 1,
                _ if *i == before => return,
                _ => {}
            }
        }
    } else if s[*i] == b'*' {
        *i += 1;
        out.push(([prefix, &["*".to_string()]].concat(), "*".to_string()));
    } else if is_ident(s[*i]) {
        let end = ident_end(s, *i);
        let word = String::from_utf8_lossy(&s[*i..end]).to_string();
        *i = end;
        let path = if word == "self" {
            prefix.to_vec()
        } else {
            [prefix, &[word]].concat()
        };
        if s[*i..].starts_with(b"::") {
            *i += 2;
            return use_tree(s, i, &path, out);
        }
        let mut name = path.last().cloned().unwrap_or_default();
        let mut j = *i;
        skip_blank(s, &mut j);
        if s[j..].starts_with(b"as ") {
            j += 3;
            skip_blank(s, &mut j);
            name = String::from_utf8_lossy(&s[j..ident_end(s, j)]).to_string();
            *i = ident_end(s, j);
        }
        out.push((path, name));
    } else {
        out.push((prefix.to_vec(), last()));
    }
}

/// For each line of `text`, the inline modules (`mod tests {`) it is in.
/// The source is rustfmt's, so a module closes with a `}` alone at the
/// indentation it opened at.
fn inline_modules(text: &str) -> Vec<Vec<String>> {
    let mut open: Vec<(String, String)> = Vec::new();
    let mut out = Vec::new();
    for line in text.lines() {
        if open.last().is_some_and(|(close, _)| line == close) {
            open.pop();
        }
        out.push(open.iter().map(|(_, name)| name.clone()).collect());
        let trimmed = line.trim_start();
        let words: Vec<&str> = trimmed
            .split_whitespace()
            .skip_while(|w| w.starts_with("pub"))
            .collect();
        if let ["mod", name, "{"] = words[..] {
            let indent = &line[..line.len() - trimmed.len()];
            open.push((format!("{indent}}}"), name.to_string()));
        }
    }
    out
}

/// The paths into the crate that `text`, the file of `module`, names:
/// every `crate::`, `super::` and `self::` path, and in a folder's
/// `mod.rs` a bare path that starts with one of its `children`.
fn references(text: &str, module: &[String], children: &BTreeSet<String>) -> Vec<Reference> {
    let s = text.as_bytes();
    let lines: Vec<&str> = text.lines().collect();
    let inline = inline_modules(text);
    let newlines: Vec<usize> = (0..s.len()).filter(|i| s[*i] == b'\n').collect();
    let line_of = |i: usize| newlines.partition_point(|n| *n < i);
    let mut out = Vec::new();
    let mut i = 0;
    while i < s.len() {
        if !is_ident(s[i]) || (i > 0 && (is_ident(s[i - 1]) || s[i - 1] == b':')) {
            i += 1;
            continue;
        }
        let end = ident_end(s, i);
        let word = &text[i..end];
        let line = line_of(i);
        let inner = inline.get(line).cloned().unwrap_or_default();
        let from = [module, &inner].concat();
        if !s[end..].starts_with(b"::") {
            i = end;
            continue;
        }
        let mut base = match word {
            "crate" => Vec::new(),
            "self" => from.clone(),
            "super" => from[..from.len().saturating_sub(1)].to_vec(),
            _ if inner.is_empty() && children.contains(word) => from.clone(),
            _ => {
                i = end;
                continue;
            }
        };
        i = if matches!(word, "crate" | "self" | "super") {
            end + 2
        } else {
            i
        };
        while s[i..].starts_with(b"super::") {
            base.pop();
            i += "super::".len();
        }
        let mut paths = Vec::new();
        use_tree(s, &mut i, &base, &mut paths);
        let words: Vec<&str> = lines.get(line).unwrap_or(&"").split_whitespace().collect();
        let visibility = words.iter().take_while(|w| w.starts_with("pub")).count();
        let is_use = words.get(visibility) == Some(&"use");
        out.extend(paths.into_iter().map(|(path, name)| Reference {
            path,
            name,
            from: from.clone(),
            line: line + 1,
            is_use,
        }));
    }
    out
}

/// The names `text` declares items with, at any depth.
fn defined_names(text: &str) -> BTreeSet<String> {
    let s = text.as_bytes();
    let mut out = BTreeSet::new();
    for keyword in [
        "struct",
        "enum",
        "fn",
        "const",
        "static",
        "type",
        "trait",
        "union",
        "mod",
        "macro_rules!",
    ] {
        for (i, _) in text.match_indices(keyword) {
            let at = i + keyword.len();
            if (i > 0 && is_ident(s[i - 1])) || s.get(at) != Some(&b' ') {
                continue;
            }
            let start = at + 1;
            let name = &text[start..ident_end(s, start)];
            if !name.is_empty() {
                out.insert(name.to_string());
            }
        }
    }
    out
}

/// The node of the folder `dir`'s graph that `file` (under `dir`) is.
fn node_of(dir: &[String], file: &SourceFile) -> String {
    match file.module.get(dir.len()) {
        Some(child) => child.clone(),
        None => "mod.rs".to_string(),
    }
}

/// Where `path` (a path under the folder `dir`) leads in the folder's
/// graph: the child it names, or the child a name of `mod.rs` comes from,
/// or `mod.rs`; `None` for a name `mod.rs` imports from outside the folder.
fn target_of(dir: &[String], path: &[String], files: &[&SourceFile]) -> Option<String> {
    let mod_rs = || Some("mod.rs".to_string());
    let children: BTreeSet<&String> = files
        .iter()
        .filter_map(|f| f.module.get(dir.len()))
        .collect();
    // The folder itself (`use super::{self}`) is its `mod.rs`.
    let Some(name) = path.get(dir.len()) else {
        return mod_rs();
    };
    if children.contains(name) {
        return Some(name.clone());
    }
    let Some(root) = files.iter().find(|f| f.module == dir && f.is_mod) else {
        return mod_rs();
    };
    if name == "*" || root.defines.contains(name) {
        return mod_rs();
    }
    let uses = root.refs.iter().filter(|r| r.is_use && r.from == dir);
    if let Some(used) = uses.clone().find(|r| r.name == *name) {
        if !used.path.starts_with(dir) {
            return None;
        }
        return target_of(dir, &used.path, files);
    }
    // A glob re-export of a child that declares the name.
    for glob in uses.filter(|r| r.name == "*" && r.path.len() == dir.len() + 2) {
        let child = &glob.path[dir.len()];
        let declares = files
            .iter()
            .any(|f| f.module.get(dir.len()) == Some(child) && f.defines.contains(name));
        if declares {
            return Some(child.clone());
        }
    }
    mod_rs()
}

/// The import graph among the direct children of the folder `dir` (a
/// module path), from the files under it: each edge with the first
/// `file:line` that makes it.
fn folder_graph(
    dir: &[String],
    files: &[SourceFile],
) -> BTreeMap<String, BTreeMap<String, String>> {
    let inside: Vec<&SourceFile> = files.iter().filter(|f| f.module.starts_with(dir)).collect();
    let mut graph: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for file in &inside {
        let node = node_of(dir, file);
        graph.entry(node.clone()).or_default();
        if node == "mod.rs" {
            continue;
        }
        for reference in &file.refs {
            if !reference.path.starts_with(dir) {
                continue;
            }
            let Some(target) = target_of(dir, &reference.path, &inside) else {
                continue;
            };
            if target != node {
                let place = format!("{}:{}", file.shown, reference.line);
                graph
                    .entry(node.clone())
                    .or_default()
                    .entry(target)
                    .or_insert(place);
            }
        }
    }
    graph
}

/// Every `.rs` file of `src/`, read.
fn source_files() -> Vec<SourceFile> {
    let mut paths = Vec::new();
    rust_files(&src(), &mut paths);
    let module_of = |path: &Path| -> (Vec<String>, bool) {
        let rel = path.strip_prefix(src()).unwrap().with_extension("");
        let mut module: Vec<String> = rel
            .iter()
            .map(|c| c.to_str().unwrap().to_string())
            .collect();
        let is_mod = module.last().unwrap() == "mod";
        if is_mod {
            module.pop();
        }
        (module, is_mod)
    };
    let modules: Vec<Vec<String>> = paths.iter().map(|p| module_of(p).0).collect();
    paths
        .iter()
        .map(|path| {
            let (module, is_mod) = module_of(path);
            let children: BTreeSet<String> = match is_mod {
                true => modules
                    .iter()
                    .filter(|m| m.len() > module.len() && m.starts_with(&module))
                    .map(|m| m[module.len()].clone())
                    .collect(),
                false => BTreeSet::new(),
            };
            let text = std::fs::read_to_string(path).unwrap();
            let shown = path.strip_prefix(src().parent().unwrap()).unwrap();
            SourceFile::new(
                &shown.display().to_string(),
                &module,
                is_mod,
                &text,
                &children,
            )
        })
        .collect()
}

/// The cycle of `graph`, if any, with the place of each of its edges.
fn describe_cycle(graph: &BTreeMap<String, BTreeMap<String, String>>) -> Option<String> {
    let plain = graph
        .iter()
        .map(|(node, edges)| (node.clone(), edges.keys().cloned().collect()))
        .collect();
    let cycle = find_cycle(&plain)?;
    let places: Vec<String> = cycle
        .windows(2)
        .map(|w| format!("    {} -> {}: {}", w[0], w[1], graph[&w[0]][&w[1]]))
        .collect();
    Some(format!("{}\n{}", cycle.join(" -> "), places.join("\n")))
}

#[test]
fn no_import_cycle_inside_a_folder() {
    let files = source_files();
    let folders: BTreeSet<Vec<String>> = files
        .iter()
        .filter(|f| f.is_mod && !f.module.is_empty())
        .map(|f| f.module.clone())
        .collect();
    assert!(folders.len() > 10, "found only {} folders", folders.len());
    let cycles: Vec<String> = folders
        .iter()
        .filter_map(|dir| {
            let cycle = describe_cycle(&folder_graph(dir, &files))?;
            Some(format!("src/{}/: {cycle}", dir.join("/")))
        })
        .collect();
    assert!(
        cycles.is_empty(),
        "import cycles between the children of a folder of src/:\n{}",
        cycles.join("\n")
    );
}

/// The folder check follows paths, groups, inline modules and re-exports
/// as the rule says, and leaves `mod.rs`'s own paths out.
#[test]
fn the_folder_check_follows_paths_and_re_exports() {
    let m = |s: &str| s.split('/').map(String::from).collect::<Vec<_>>();
    let none = BTreeSet::new();
    let children: BTreeSet<String> = ["a", "b", "c", "sub"].map(String::from).into();
    let root = "mod a;\npub use a::Shared;\npub(crate) use c::*;\nuse crate::other::Outside;\n\
                pub struct Own;\nfn wire() {\n    b::run();\n}\n";
    let mut files = vec![
        SourceFile::new("f/mod.rs", &m("f"), true, root, &children),
        SourceFile::new(
            "f/a.rs",
            &m("f/a"),
            false,
            "use super::{Own, Outside};\nuse super::*;\n",
            &none,
        ),
        SourceFile::new(
            "f/b.rs",
            &m("f/b"),
            false,
            "use super::{self, Shared};\n/// [`crate::f::c::X`]\n",
            &none,
        ),
        SourceFile::new(
            "f/c.rs",
            &m("f/c"),
            false,
            "pub struct Globbed;\nmod tests {\n    use super::super::b::{x::{Y, Z as W}};\n}\n",
            &none,
        ),
        SourceFile::new(
            "f/sub/mod.rs",
            &m("f/sub"),
            true,
            "use super::Globbed;\n",
            &none,
        ),
    ];
    let edges = |files: &[SourceFile]| -> Vec<(String, String)> {
        let graph = folder_graph(&m("f"), files);
        graph
            .into_iter()
            .flat_map(|(from, to)| to.into_keys().map(move |t| (from.clone(), t)))
            .collect()
    };
    let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
    assert_eq!(
        edges(&files),
        [
            pair("a", "mod.rs"),
            pair("b", "a"),
            pair("b", "c"),
            pair("b", "mod.rs"),
            pair("c", "b"),
            pair("sub", "c")
        ]
    );
    let cycle = describe_cycle(&folder_graph(&m("f"), &files)).unwrap();
    assert!(cycle.starts_with("b -> c -> b\n"), "{cycle}");
    assert!(cycle.contains("c -> b: f/c.rs:3"), "{cycle}");
    files[3] = SourceFile::new("f/c.rs", &m("f/c"), false, "pub struct Globbed;\n", &none);
    assert!(describe_cycle(&folder_graph(&m("f"), &files)).is_none());
}
