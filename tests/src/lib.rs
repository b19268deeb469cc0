//! End-to-end fixtures for Pilothouse: the local control plane, `pilothouse` child processes, a
//! TCP proxy that can cut a process off from the API server, waits with timeouts, and the API
//! server's audit log.
//!
//! Failures print the relevant objects and the Pilothouse log tail (see [`Pilothouse::log_tail`]).

pub mod audit;
pub mod bench;
pub mod cluster;
pub mod harness;
pub mod heartbeat;
pub mod jobs;
pub mod k8s;
pub mod maintenance;
pub mod pilothouse;
pub mod provisioner;
pub mod proxy;
pub mod wait;
pub mod watch_delay;
pub mod webhook;

pub use cluster::Cluster;
pub use pilothouse::Pilothouse;

/// The repository root (tests/ is one level down).
pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// A fresh, unique name for a namespace, lease or temp dir.
pub fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}
