//! Every controller crate follows one template (docs/adding-a-controller.md), checked on the
//! source so that a new crate, or a change to an old one, cannot drift from it unnoticed:
//!
//! - the files: `lib.rs` (wiring only), `sync.rs` (the `<Kind>Controller` and its sync),
//!   `plan.rs` (pure decisions), `act.rs` (the API requests), `metrics.rs`, `sync_tests.rs` (the
//!   real `init` against the test kit) and `plan_props.rs` (property tests of the plan);
//! - the controller is built from its caches, queues, options and one `Ctx`, never from a long
//!   list of positional arguments;
//! - `plan.rs`, `status.rs` and `lib.rs` do no I/O (no `async fn`);
//! - no controller talks to `kube::Api`, spawns raw tokio tasks (the wiring's `Spawner` contains
//!   and drains them), or compares owner-reference kinds as strings (`shared::meta::refs` has the
//!   typed checks).
//!
//! Test code (`*_tests.rs`, `plan_props.rs`, a trailing `#[cfg(test)] mod`) and comments are not
//! read: a test may reach for anything.

use std::path::{Path, PathBuf};

const FILES: &[&str] = &[
    "lib.rs",
    "sync.rs",
    "plan.rs",
    "act.rs",
    "metrics.rs",
    "sync_tests.rs",
    "plan_props.rs",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn crates() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(root().join("controllers"))
        .expect("controllers/ is readable")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.join("Cargo.toml").exists())
        .collect();
    out.sort();
    assert!(out.len() >= 8, "the eight controller crates: {out:?}");
    out
}

fn is_test_file(name: &str) -> bool {
    name.ends_with("_tests.rs") || name == "plan_props.rs"
}

/// A file's code: no comments, no trailing test module.
fn code(text: &str) -> String {
    let body = text.find("#[cfg(test)]\nmod ").map_or(text, |i| &text[..i]);
    body.lines()
        .map(|l| l.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every non-test source file of a crate with its code.
fn sources(krate: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(krate.join("src")).expect("src/ is readable") {
        let p = e.expect("a directory entry").path();
        let name = p.file_name().unwrap().to_string_lossy().to_string();
        if p.extension().is_some_and(|x| x == "rs") && !is_test_file(&name) {
            let text = std::fs::read_to_string(&p).expect("a readable source file");
            out.push((name, code(&text)));
        }
    }
    out.sort();
    out
}

fn crate_name(krate: &Path) -> String {
    krate.file_name().unwrap().to_string_lossy().to_string()
}

#[test]
fn every_controller_crate_has_the_template_files() {
    let mut missing = Vec::new();
    for krate in crates() {
        for f in FILES {
            if !krate.join("src").join(f).exists() {
                missing.push(format!("{}/src/{f}", crate_name(&krate)));
            }
        }
    }
    assert!(missing.is_empty(), "missing template files: {missing:?}");
}

#[test]
fn each_crate_has_one_kind_controller_built_from_a_ctx() {
    let mut wrong = Vec::new();
    for krate in crates() {
        let sync = code(&std::fs::read_to_string(krate.join("src/sync.rs")).unwrap());
        let name = sync
            .lines()
            .filter_map(|l| l.trim().strip_prefix("pub struct "))
            .map(|rest| {
                rest.split(|c: char| !c.is_alphanumeric() && c != '_')
                    .next()
                    .unwrap_or_default()
            })
            .find(|n| n.ends_with("Controller"));
        let Some(name) = name else {
            wrong.push(format!(
                "{}: no pub struct <Kind>Controller in sync.rs",
                crate_name(&krate)
            ));
            continue;
        };
        let all: String = sources(&krate).into_iter().map(|(_, c)| c).collect();
        let Some(at) = all.find(&format!("impl {name} {{")) else {
            wrong.push(format!("{}: no impl {name}", crate_name(&krate)));
            continue;
        };
        let impl_body = &all[at..];
        let new = impl_body
            .find("pub fn new(")
            .map(|i| &impl_body[i..])
            .and_then(|s| s.find(") ->").map(|j| &s[..j]));
        match new {
            Some(params) if params.contains("Ctx<") => {}
            _ => wrong.push(format!(
                "{}: {name}::new does not take a Ctx",
                crate_name(&krate)
            )),
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[test]
fn no_controller_reaches_around_the_runtime() {
    let forbidden: &[(&str, &str)] = &[
        (
            "allow(clippy::too_many_arguments)",
            "a constructor takes a Ctx",
        ),
        (
            "tokio::spawn(",
            "the wiring's Spawner contains and drains tasks",
        ),
        ("kube::Api", "requests go through the writer"),
        ("Api::<", "requests go through the writer"),
        (".kind == \"", "shared::meta::refs checks kinds by type"),
        (".kind != \"", "shared::meta::refs checks kinds by type"),
        (
            ".api_version == \"",
            "shared::meta::refs checks versions by type",
        ),
    ];
    let mut found = Vec::new();
    for krate in crates() {
        for (file, code) in sources(&krate) {
            for (needle, why) in forbidden {
                if code.contains(needle) {
                    found.push(format!(
                        "{}/src/{file}: `{needle}` ({why})",
                        crate_name(&krate)
                    ));
                }
            }
        }
    }
    assert!(found.is_empty(), "{found:#?}");
}

#[test]
fn plan_status_and_lib_do_no_io() {
    let mut found = Vec::new();
    for krate in crates() {
        for (file, code) in sources(&krate) {
            if matches!(file.as_str(), "plan.rs" | "status.rs" | "lib.rs")
                && code.contains("async fn")
            {
                found.push(format!("{}/src/{file}", crate_name(&krate)));
            }
        }
    }
    assert!(
        found.is_empty(),
        "async fn in a pure or wiring file: {found:?}"
    );
}

/// The checks above must be able to fail: each one's needle is found in a file that breaks it.
#[test]
fn the_checks_see_what_they_look_for() {
    let bad = "use kube::Api;\nfn f(r: &R) -> bool { r.kind == \"Job\" } // kube::Api in a comment\n#[cfg(test)]\nmod tests { fn g() { tokio::spawn(async {}); } }\n";
    let c = code(bad);
    assert!(c.contains("kube::Api") && c.contains(".kind == \""));
    assert!(
        !c.contains("tokio::spawn("),
        "a trailing test module is not read"
    );
    assert!(!c.contains("in a comment"), "comments are not read");
}
