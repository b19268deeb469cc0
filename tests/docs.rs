//! The repository's own index of the rule IDs its code cites (`docs/rules.md`): every ID in
//! `controllers/`, `shared/` and `pilothouse/` must be defined there, improvements carry their
//! area (`JB-`, `SB-`, `NB-`; a bare `B-n` is ambiguous across the three contracts), and no
//! comment points at an issue number instead of the rule it produced.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const PREFIXES: &[&str] = &[
    "JR", "CR", "JB", "ST", "ES", "MR", "SB", "NL", "TE", "NM", "NB", "PX", "KEP",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("readable directory") {
        let p = e.expect("a directory entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `ID` when `token` is a rule ID of one of the prefixes, e.g. `JR-8`, `ST-12a`, `KEP-5504`.
fn rule_id(token: &str) -> Option<&str> {
    let (prefix, rest) = token.split_once('-')?;
    let digits = rest.trim_end_matches(|c: char| c.is_ascii_lowercase());
    let ok = PREFIXES.contains(&prefix)
        && !digits.is_empty()
        && digits.chars().all(|c| c.is_ascii_digit())
        && rest.len() - digits.len() <= 1;
    ok.then_some(token)
}

fn tokens(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .map(|t| t.trim_matches('-'))
        .filter(|t| !t.is_empty())
}

/// The IDs `docs/rules.md` defines: its `- **ID**: …` lines.
fn defined(index: &str) -> BTreeSet<String> {
    index
        .lines()
        .filter_map(|l| l.strip_prefix("- **"))
        .filter_map(|l| l.split_once("**"))
        .map(|(id, _)| id.to_string())
        .collect()
}

/// "issue 17", "Issue #3": a reference to the tracker, which a reader of the code cannot follow.
fn cites_an_issue(line: &str) -> bool {
    let lower = line.to_ascii_lowercase();
    lower.match_indices("issue ").any(|(i, m)| {
        let rest = lower[i + m.len()..].trim_start_matches('#');
        rest.starts_with(|c: char| c.is_ascii_digit())
    })
}

#[test]
fn every_rule_id_the_code_cites_is_in_docs_rules_md() {
    let root = root();
    let index = std::fs::read_to_string(root.join("docs/rules.md")).expect("docs/rules.md");
    let known = defined(&index);
    assert!(
        known.len() > 300,
        "docs/rules.md defines only {} IDs",
        known.len()
    );
    let mut files = Vec::new();
    for d in ["controllers", "shared", "pilothouse"] {
        rust_files(&root.join(d), &mut files);
    }
    let mut problems = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("readable source");
        let rel = f.strip_prefix(&root).unwrap_or(f).display().to_string();
        for (n, line) in text.lines().enumerate() {
            for t in tokens(line) {
                if let Some(id) = rule_id(t)
                    && !known.contains(id)
                {
                    problems.push(format!(
                        "{rel}:{}: {id} is not defined in docs/rules.md",
                        n + 1
                    ));
                }
                if t.strip_prefix("B-")
                    .is_some_and(|d| d.chars().all(|c| c.is_ascii_digit()))
                {
                    problems.push(format!(
                        "{rel}:{}: {t} names no area: write JB-, SB- or NB- (docs/rules.md)",
                        n + 1
                    ));
                }
            }
            if cites_an_issue(line) {
                problems.push(format!(
                    "{rel}:{}: cites an issue number; cite the rule it produced instead",
                    n + 1
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_scanner_reads_ids_as_the_code_writes_them() {
    let line = "// JR-8 and ST-12a (see SB-3/SB-4), not B-4, X-1 or JR-; issue #17";
    let ids: Vec<&str> = tokens(line).filter_map(rule_id).collect();
    assert_eq!(ids, ["JR-8", "ST-12a", "SB-3", "SB-4"]);
    assert!(tokens(line).any(|t| t == "B-4"));
    assert!(cites_an_issue(line));
    assert!(!cites_an_issue("// an issued token"));
    assert_eq!(
        defined("- **JR-1**: text\n- **ST-2**: more\nprose"),
        BTreeSet::from(["JR-1".to_string(), "ST-2".to_string()])
    );
}
