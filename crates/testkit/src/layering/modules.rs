//! The server crate's modules as a graph: which module names which through `crate::` and
//! `super::` paths, in non-test code. The test below fails naming any cycle.
//!
//! A module and its own descendants are one unit: a child naming its parent's items (or a
//! parent its child's) is how a module is split into files, not a dependency between parts.
//! Every other reference is lifted to the two siblings under the modules' lowest common
//! ancestor that contain them (`rpc::lease` naming `etcd_server::loops` is `rpc -> etcd_server`
//! at the top level), so at every level the siblings must form a DAG.
//!
//! Edges that still close a cycle and are known are listed in [`ALLOWED`]; the test fails when
//! one of them is gone too (so the list only shrinks) and when a new one closes a cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Known edges inside a cycle (from, to, as module paths below `crate`), each to be broken:
/// the list only shrinks (a listed edge that is gone fails the test), and it is empty once
/// the modules form a DAG at every level.
const ALLOWED: &[(&str, &str)] = &[];

/// A module path below the crate root: `["etcd_server", "applier"]`; the root is empty.
type ModPath = Vec<String>;

/// One reference from a module to another, with where it was seen.
#[derive(Clone, Debug)]
struct Edge {
    from: ModPath,
    to: ModPath,
    at: String,
}

/// The server's sources read into modules: each module's non-test code, and which names the
/// crate root re-exports from which module.
#[derive(Debug, Default)]
struct Crate {
    /// Each module's code (test modules and `#[cfg(test)]` child modules left out).
    code: BTreeMap<ModPath, (PathBuf, String)>,
    /// `pub use module::Name` at the root: `Name` -> `module`.
    root_exports: BTreeMap<String, ModPath>,
}

/// The module path of `file` under `src` (`lib.rs` is the root, `a/mod.rs` and `a.rs` are
/// `a`).
fn module_of(src: &Path, file: &Path) -> ModPath {
    let rel = file.strip_prefix(src).expect("a file under src");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("a file name");
    let stem = last.trim_end_matches(".rs");
    if stem != "lib" && stem != "mod" {
        parts.push(stem.to_owned());
    }
    parts
}

/// `text` without its `#[cfg(test)]` items (the attribute and the item after it, a block
/// counted by braces or a one-line declaration), and without comments.
fn strip_tests(text: &str) -> (String, BTreeSet<String>) {
    let mut out = String::new();
    let mut test_children = BTreeSet::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line.trim() == "#[cfg(test)]" {
            // Skip further attributes, then the item.
            let mut depth: i64 = 0;
            let mut started = false;
            while let Some(item) = lines.next() {
                let t = item.trim();
                if t.starts_with("#[") && !started {
                    continue;
                }
                if !started
                    && let Some(name) = t
                        .strip_prefix("mod ")
                        .or_else(|| t.strip_prefix("pub mod "))
                        .or_else(|| t.strip_prefix("pub(crate) mod "))
                        .and_then(|rest| rest.strip_suffix(';'))
                {
                    test_children.insert(name.to_owned());
                    break;
                }
                started = true;
                depth += item.matches('{').count() as i64 - item.matches('}').count() as i64;
                if depth <= 0 && (t.ends_with('}') || t.ends_with(';')) {
                    break;
                }
                if depth <= 0 && lines.peek().is_none() {
                    break;
                }
            }
            continue;
        }
        let code = match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        };
        out.push_str(code);
        out.push('\n');
    }
    (out, test_children)
}

/// The Rust files under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a source directory") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

impl Crate {
    fn read(src: &Path) -> Crate {
        let mut files = Vec::new();
        rust_files(src, &mut files);
        let mut krate = Crate::default();
        let mut test_only: BTreeSet<ModPath> = BTreeSet::new();
        let mut modules: BTreeMap<ModPath, (PathBuf, String)> = BTreeMap::new();
        for file in files {
            let text = std::fs::read_to_string(&file).expect("a source file");
            let module = module_of(src, &file);
            let (code, test_children) = strip_tests(&text);
            for child in test_children {
                let mut path = module.clone();
                path.push(child);
                test_only.insert(path);
            }
            modules.insert(module, (file, code));
        }
        for (module, entry) in modules {
            let is_test = test_only
                .iter()
                .any(|t| module.len() >= t.len() && module[..t.len()] == t[..]);
            if !is_test {
                krate.code.insert(module, entry);
            }
        }
        let root = krate.code.get(&Vec::new()).map(|(_, c)| c.clone());
        for stmt in root.iter().flat_map(|c| use_statements(c)) {
            if !stmt.starts_with("pub use ") {
                continue;
            }
            for path in expand(stmt.trim_start_matches("pub use ")) {
                let parts: Vec<&str> = path.split("::").collect();
                let first = parts[0].to_owned();
                if parts.len() >= 2 && krate.code.contains_key(&vec![first.clone()]) {
                    let name = parts.last().expect("a path").to_owned();
                    krate.root_exports.insert(name.to_owned(), vec![first]);
                }
            }
        }
        krate
    }

    /// The module a path (already made absolute, below `crate`) names: its longest prefix
    /// that is a module, or what the root re-exports under its first name.
    fn target(&self, parts: &[String]) -> Option<ModPath> {
        for n in (1..=parts.len()).rev() {
            if self.code.contains_key(&parts[..n]) {
                return Some(parts[..n].to_vec());
            }
        }
        let first = parts.first()?;
        self.root_exports.get(first).cloned()
    }

    /// Every reference between two modules of which neither contains the other, lifted to
    /// the siblings under their lowest common ancestor.
    fn edges(&self) -> Vec<Edge> {
        let mut edges = Vec::new();
        for (module, (file, code)) in &self.code {
            let mut paths: Vec<String> = Vec::new();
            for stmt in use_statements(code) {
                let body = stmt
                    .trim_start_matches("pub(crate) ")
                    .trim_start_matches("pub(super) ")
                    .trim_start_matches("pub ")
                    .trim_start_matches("use ");
                paths.extend(expand(body));
            }
            paths.extend(inline_paths(code));
            for path in paths {
                let Some(absolute) = absolute(module, &path) else {
                    continue;
                };
                let Some(to) = self.target(&absolute) else {
                    continue;
                };
                let common = module.iter().zip(&to).take_while(|(a, b)| a == b).count();
                if common == module.len() || common == to.len() {
                    continue;
                }
                edges.push(Edge {
                    from: module[..=common].to_vec(),
                    to: to[..=common].to_vec(),
                    at: format!("{} ({path})", file.display()),
                });
            }
        }
        edges
    }
}

/// The `use` statements of `code` (whole, across lines, without the trailing `;`).
fn use_statements(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in code.lines() {
        let t = line.trim();
        if current.is_none()
            && (t.starts_with("use ")
                || t.starts_with("pub use ")
                || t.starts_with("pub(crate) use ")
                || t.starts_with("pub(super) use "))
        {
            current = Some(String::new());
        }
        if let Some(stmt) = current.as_mut() {
            stmt.push_str(t);
            stmt.push(' ');
            if t.ends_with(';') {
                let done = current.take().expect("a statement");
                out.push(done.trim().trim_end_matches(';').to_owned());
            }
        }
    }
    out
}

/// The paths a `use` tree names: `a::{b, c::{d, e}}` is `a::b`, `a::c::d`, `a::c::e`
/// (renames and globs dropped to their path).
fn expand(tree: &str) -> Vec<String> {
    let tree: String = tree.split_whitespace().collect::<Vec<_>>().join(" ");
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        let path = tree.split(" as ").next().unwrap_or(tree).trim();
        let path = path.trim_end_matches("::*");
        return vec![path.to_owned()];
    };
    let prefix = &tree[..open];
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let mut parts = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    let mut out = Vec::new();
    for part in parts {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        for sub in expand(part) {
            if sub == "self" {
                out.push(prefix.trim_end_matches("::").to_owned());
            } else {
                out.push(format!("{prefix}{sub}"));
            }
        }
    }
    out
}

/// `crate::…` and `super::…` paths written in code outside `use` statements.
fn inline_paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in code.lines() {
        let t = line.trim_start();
        if t.starts_with("use ") || t.starts_with("pub use ") || t.starts_with("pub(crate) use ") {
            continue;
        }
        for anchor in ["crate::", "super::"] {
            let mut from = 0;
            while let Some(i) = line[from..].find(anchor) {
                let start = from + i;
                let before = line[..start].chars().next_back();
                from = start + anchor.len();
                if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                    continue;
                }
                let end = line[start..]
                    .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                    .map_or(line.len(), |e| start + e);
                out.push(line[start..end].trim_end_matches(':').to_owned());
            }
        }
    }
    out
}

/// `path` as a module path below the root, seen from `module`; `None` for paths outside the
/// crate.
fn absolute(module: &ModPath, path: &str) -> Option<ModPath> {
    let mut parts = path.split("::").filter(|p| !p.is_empty());
    let mut base: ModPath = match parts.next()? {
        "crate" => Vec::new(),
        "super" => {
            let mut up = module.clone();
            up.pop()?;
            up
        }
        "self" => module.clone(),
        _ => return None,
    };
    for part in parts {
        if part == "super" {
            base.pop()?;
        } else {
            base.push(part.to_owned());
        }
    }
    Some(base)
}

/// The strongly connected components of more than one node (Tarjan's algorithm).
fn cycles(edges: &BTreeMap<(ModPath, ModPath), String>) -> Vec<Vec<ModPath>> {
    let mut adjacency: BTreeMap<&ModPath, Vec<&ModPath>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        adjacency.entry(from).or_default().push(to);
        adjacency.entry(to).or_default();
    }
    struct State<'a> {
        index: BTreeMap<&'a ModPath, usize>,
        low: BTreeMap<&'a ModPath, usize>,
        stack: Vec<&'a ModPath>,
        on_stack: BTreeSet<&'a ModPath>,
        next: usize,
        found: Vec<Vec<ModPath>>,
    }
    fn visit<'a>(
        node: &'a ModPath,
        adjacency: &BTreeMap<&'a ModPath, Vec<&'a ModPath>>,
        state: &mut State<'a>,
    ) {
        state.index.insert(node, state.next);
        state.low.insert(node, state.next);
        state.next += 1;
        state.stack.push(node);
        state.on_stack.insert(node);
        for &next in &adjacency[node] {
            if !state.index.contains_key(next) {
                visit(next, adjacency, state);
                let low = state.low[node].min(state.low[next]);
                state.low.insert(node, low);
            } else if state.on_stack.contains(next) {
                let low = state.low[node].min(state.index[next]);
                state.low.insert(node, low);
            }
        }
        if state.low[node] == state.index[node] {
            let mut component = Vec::new();
            loop {
                let top = state.stack.pop().expect("the node is on the stack");
                state.on_stack.remove(top);
                component.push(top.clone());
                if top == node {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                state.found.push(component);
            }
        }
    }
    let mut state = State {
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        found: Vec::new(),
    };
    for &node in adjacency.keys() {
        if !state.index.contains_key(node) {
            visit(node, &adjacency, &mut state);
        }
    }
    state.found
}

/// The edges of `krate`, one witness each, without those in `allowed`; and the allowed edges
/// that no longer exist.
fn check(krate: &Crate, allowed: &[(&str, &str)]) -> (Vec<String>, Vec<String>) {
    let name = |m: &ModPath| m.join("::");
    let mut edges: BTreeMap<(ModPath, ModPath), String> = BTreeMap::new();
    for edge in krate.edges() {
        edges.entry((edge.from, edge.to)).or_insert(edge.at);
    }
    let mut stale = Vec::new();
    for (from, to) in allowed {
        let key = (
            from.split("::").map(str::to_owned).collect::<ModPath>(),
            to.split("::").map(str::to_owned).collect::<ModPath>(),
        );
        if edges.remove(&key).is_none() {
            stale.push(format!("{from} -> {to}"));
        }
    }
    let mut found = Vec::new();
    for component in cycles(&edges) {
        let members: BTreeSet<&ModPath> = component.iter().collect();
        let mut lines = vec![format!(
            "cycle: {}",
            component.iter().map(name).collect::<Vec<_>>().join(", ")
        )];
        for ((from, to), at) in &edges {
            if members.contains(from) && members.contains(to) {
                lines.push(format!("  {} -> {}: {at}", name(from), name(to)));
            }
        }
        found.push(lines.join("\n"));
    }
    (found, stale)
}

/// The server crate's sources.
fn server_src() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../server/src")).to_path_buf()
}

#[test]
fn the_servers_modules_have_no_import_cycle() {
    let krate = Crate::read(&server_src());
    // The graph is real: the HTTP code reaches the core, and the core the one-off peer calls.
    let edges = krate.edges();
    assert!(
        edges
            .iter()
            .any(|e| e.from == ["http"] && e.to == ["etcd_server"])
            && edges
                .iter()
                .any(|e| e.from == ["etcd_server"] && e.to == ["peer"]),
        "{edges:#?}"
    );
    let (found, stale) = check(&krate, ALLOWED);
    assert!(
        stale.is_empty(),
        "allowed edges that no longer exist (remove them from ALLOWED):\n{}",
        stale.join("\n")
    );
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn a_cycle_is_named_with_its_edges() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let write = |path: &str, text: &str| {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("dirs");
        std::fs::write(path, text).expect("a file");
    };
    write(
        "lib.rs",
        "mod core;\nmod rpc;\nmod metrics;\n#[cfg(test)]\nmod fuzz;\npub use core::Server;\n",
    );
    write(
        "core.rs",
        "use crate::metrics::COUNT;\nmod inner;\npub struct Server;\n",
    );
    write(
        "core/inner.rs",
        "use super::Server;\nfn f() { crate::rpc::lease::grant(); }\n",
    );
    write("rpc.rs", "pub mod lease;\n");
    write(
        "rpc/lease.rs",
        "use crate::{metrics, Server};\npub fn grant() {}\n#[cfg(test)]\nmod tests {\n    use crate::fuzz::X;\n}\n",
    );
    write("metrics.rs", "pub static COUNT: u64 = 0;\n");
    write("fuzz.rs", "use crate::rpc::lease;\npub struct X;\n");
    let krate = Crate::read(dir.path());
    let (found, stale) = check(&krate, &[]);
    assert!(stale.is_empty());
    assert_eq!(
        found.len(),
        1,
        "one cycle, core <-> rpc (metrics is a leaf, fuzz is a test module): {found:?}"
    );
    assert!(found[0].starts_with("cycle: core, rpc\n"), "{}", found[0]);
    assert!(found[0].contains("  core -> rpc: "), "{}", found[0]);
    assert!(
        found[0].contains("  rpc -> core: ") && found[0].contains("(crate::Server)"),
        "{}",
        found[0]
    );

    // Allowing one of the edges breaks the cycle; allowing one that is not there is stale.
    let (found, stale) = check(&krate, &[("rpc", "core"), ("metrics", "rpc")]);
    assert!(found.is_empty(), "{found:?}");
    assert_eq!(stale, ["metrics -> rpc"]);
}
