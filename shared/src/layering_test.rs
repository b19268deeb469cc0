//! The layer order of this crate (see the table in `lib.rs`), checked on the source: a module
//! may name only modules of its own or a lower layer, and no two modules may name each other
//! through any chain. Tests (`#[cfg(test)]` modules at the end of a file) and comments are not
//! read: a test may reach for anything, and a doc link is no import.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Lowest first. `lock`, `read` and `write` live in `lib.rs`, under every layer.
const LAYERS: &[&str] = &[
    "meta", "metrics", "api", "cache", "runtime", "election", "serving", "process", "testkit",
];

fn layer(top: &str) -> Option<usize> {
    LAYERS.iter().position(|l| *l == top)
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("shared/src is readable") {
        let p = e.expect("a directory entry").path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The module path of a source file, e.g. `cache/informers.rs` → `cache::informers`.
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("under src");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|l| l == "mod") {
        parts.pop();
    }
    parts.join("::")
}

/// The code of a file without comments and without its trailing test module.
fn code(text: &str) -> String {
    let body = text.find("#[cfg(test)]\nmod ").map_or(text, |i| &text[..i]);
    body.lines()
        .map(|l| l.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every `crate::a::b` this code names, as the module it names (`a::b` when `a::b` is a
/// module, else `a`).
fn named(code: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        let path: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
            .collect();
        let segs: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
        // The longest prefix that is a module (a grouped `use crate::{a, b}` names the root).
        let found = (1..=segs.len())
            .rev()
            .map(|n| segs[..n].join("::"))
            .find(|p| modules.contains(p));
        if let Some(m) = found {
            out.insert(m);
        }
        if rest.starts_with('{') {
            let group: String = rest.chars().take_while(|c| *c != '}').collect();
            for item in group.trim_start_matches('{').split(',') {
                let item = item.trim().split("::").next().unwrap_or_default();
                if modules.contains(item) {
                    out.insert(item.to_string());
                }
            }
        }
    }
    out
}

fn top(module: &str) -> &str {
    module.split("::").next().unwrap_or(module)
}

#[test]
fn imports_run_only_downwards_and_never_in_a_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let modules: BTreeSet<String> = files
        .iter()
        .map(|f| module_of(&src, f))
        .filter(|m| m != "lib" && m != "layering_test")
        .collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut wrong = Vec::new();
    for f in &files {
        let m = module_of(&src, f);
        if m == "lib" || m == "layering_test" {
            continue;
        }
        let Some(own) = layer(top(&m)) else {
            wrong.push(format!(
                "{m}: in no layer (add it to LAYERS and lib.rs's table)"
            ));
            continue;
        };
        let text = std::fs::read_to_string(f).expect("readable source");
        let deps: BTreeSet<String> = named(&code(&text), &modules)
            .into_iter()
            .filter(|d| d != &m && !m.starts_with(&format!("{d}::")))
            .collect();
        for d in &deps {
            if layer(top(d)).is_some_and(|l| l > own) {
                wrong.push(format!(
                    "{m} (layer {}) imports {d} (layer {}, above it)",
                    top(&m),
                    top(d)
                ));
            }
        }
        graph.insert(m, deps);
    }
    // A cycle among modules, whatever their layers.
    fn visit(
        m: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
        cycles: &mut Vec<String>,
    ) {
        if let Some(i) = stack.iter().position(|s| s == m) {
            let mut c = stack[i..].to_vec();
            c.push(m.to_string());
            cycles.push(c.join(" → "));
            return;
        }
        if !done.insert(m.to_string()) {
            return;
        }
        stack.push(m.to_string());
        for d in graph.get(m).into_iter().flatten() {
            visit(d, graph, stack, done, cycles);
        }
        stack.pop();
    }
    let mut done = BTreeSet::new();
    let mut cycles = Vec::new();
    for m in graph.keys() {
        visit(m, &graph, &mut Vec::new(), &mut done, &mut cycles);
    }
    wrong.extend(cycles.into_iter().map(|c| format!("import cycle: {c}")));
    assert!(wrong.is_empty(), "layering broken:\n{}", wrong.join("\n"));
}

#[test]
fn the_checker_sees_an_upward_import_and_a_cycle() {
    let modules: BTreeSet<String> = ["meta::keys", "cache::informers", "cache", "meta"]
        .into_iter()
        .map(String::from)
        .collect();
    let code = code("use crate::cache::informers::Informer; // crate::meta::keys\n");
    assert_eq!(
        named(&code, &modules),
        BTreeSet::from(["cache::informers".to_string()])
    );
    let grouped = named("use crate::{meta, cache::informers};", &modules);
    assert!(grouped.contains("meta"));
}
