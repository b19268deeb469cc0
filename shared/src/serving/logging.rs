//! Logging setup: text or JSON by `--logging-format`, verbosity by `-v` as klog levels map.

use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

/// `--logging-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LoggingFormat {
    Text,
    Json,
}

/// `RUST_LOG`, when set, overrides the `-v` mapping.
pub fn init(format: LoggingFormat, verbosity: u8) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(directives(verbosity)));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let _ = match format {
        LoggingFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init(),
        LoggingFormat::Text => builder.try_init(),
    };
}

/// Log targets are crate (library) names: the runtime, the binary and each controller crate's
/// `[lib] name` (a test keeps this list complete).
const OUR_TARGETS: &[&str] = &[
    "shared",
    "pilothouse",
    "job",
    "cronjob",
    "statefulset",
    "endpointslice",
    "endpointslice_mirroring",
    "node_lifecycle",
    "taint_eviction",
    "node_maintenance",
];

/// klog levels mapped onto our crates: 0-1 info, 2-3 debug (per-sync lines with the object
/// key), 4+ trace (and the kube client's debug lines).
fn directives(verbosity: u8) -> String {
    let level = match verbosity {
        0 | 1 => return "info".to_string(),
        2 | 3 => "debug",
        _ => "trace",
    };
    let mut d = String::from("info");
    for t in OUR_TARGETS {
        d.push_str(&format!(",{t}={level}"));
    }
    if verbosity >= 4 {
        d.push_str(",kube=debug");
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every controller crate's library name is a target `-v` raises (a new crate must be added).
    #[test]
    fn verbosity_covers_every_controller_crate() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../controllers");
        for entry in std::fs::read_dir(dir).expect("controllers/") {
            let manifest = entry.expect("entry").path().join("Cargo.toml");
            let Ok(text) = std::fs::read_to_string(&manifest) else {
                continue;
            };
            let lib = text
                .split("[lib]")
                .nth(1)
                .and_then(|s| s.lines().find_map(|l| l.trim().strip_prefix("name = ")))
                .map(|n| n.trim_matches('"').to_string())
                .unwrap_or_else(|| panic!("{} has no [lib] name", manifest.display()));
            assert!(
                OUR_TARGETS.contains(&lib.as_str()),
                "{lib} missing from OUR_TARGETS"
            );
            assert!(directives(2).contains(&format!(",{lib}=debug")));
        }
        assert_eq!(directives(0), "info");
        assert!(directives(5).ends_with(",kube=debug"));
    }
}
