//! `pilothouse maintenance`'s arguments, and the object `start` creates from them (refused, with
//! the CRD's own limits, before any request).

use kube::api::ObjectMeta;
use node_maintenance::types::{
    DrainSpec, NodeMaintenance, NodeMaintenanceSpec, Stage, TimeoutPolicy,
};
use std::path::PathBuf;

// `pilothouse maintenance`'s arguments (no doc comment: clap would make it the about text).
#[derive(clap::Args, Debug)]
pub struct MaintenanceArgs {
    /// Path to a kubeconfig file; else $KUBECONFIG, ~/.kube/config, then in-cluster (as kubectl).
    // Own ids: clap shares a global argument's value with the parent's argument of the same id,
    // and the binary's top-level --kubeconfig is a String.
    #[arg(
        long = "kubeconfig",
        id = "maintenance_kubeconfig",
        value_name = "KUBECONFIG",
        global = true
    )]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use; its current context by default.
    #[arg(
        long = "context",
        id = "maintenance_context",
        value_name = "CONTEXT",
        global = true
    )]
    pub context: Option<String>,
    #[command(subcommand)]
    pub command: MaintenanceCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum MaintenanceCommand {
    /// Creates a NodeMaintenance that cordons and drains NODE; with --wait, follows it until the
    /// node is drained.
    Start(StartArgs),
    /// Prints the NodeMaintenances (all, or those of NODE) and what blocks them.
    Status(StatusArgs),
    /// Ends a maintenance (stage Complete) and waits until its node is released.
    End(EndArgs),
}

#[derive(clap::Args, Debug)]
pub struct StartArgs {
    /// The node to take out of service.
    pub node: String,
    /// Why (at most 1024 characters); copied into events and the pods' condition.
    #[arg(long)]
    pub reason: String,
    /// The object's name; the node's name by default.
    #[arg(long)]
    pub name: Option<String>,
    /// Follow the drain until the node is drained; exits non-zero on a PDB deadlock or a passed
    /// deadline.
    #[arg(long)]
    pub wait: bool,
    /// Drain deadline, a Go duration (e.g. 90s, 10m); rounded up to whole seconds.
    #[arg(long, value_parser = timeout_seconds)]
    pub timeout: Option<i64>,
    /// At the deadline: Wait (keep retrying evictions) or Delete (delete the remaining pods,
    /// bypassing their PodDisruptionBudgets). Delete needs --timeout.
    #[arg(long, value_parser = timeout_policy)]
    pub timeout_policy: Option<TimeoutPolicy>,
}

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// Only the maintenances of this node.
    pub node: Option<String>,
}

#[derive(clap::Args, Debug)]
pub struct EndArgs {
    /// The node whose maintenance ends.
    pub node: String,
    /// The object's name; the node's name by default (as `start` names it).
    #[arg(long)]
    pub name: Option<String>,
    /// How long to wait for the node's release, a Go duration.
    #[arg(long, default_value = "5m", value_parser = timeout_seconds)]
    pub timeout: i64,
}

/// `--timeout`: a Go duration, positive, rounded up to whole seconds.
pub fn timeout_seconds(s: &str) -> Result<i64, String> {
    let nanos = shared::meta::gocompat::parse_duration(s)?;
    if nanos <= 0 {
        return Err(format!("{s}: the timeout must be positive"));
    }
    // No overflow: the quotient of a positive i64 by 1e9 is far below i64::MAX.
    Ok(nanos / 1_000_000_000 + i64::from(nanos % 1_000_000_000 != 0))
}

/// `--timeout-policy`: the API's spelling, any case.
pub fn timeout_policy(s: &str) -> Result<TimeoutPolicy, String> {
    match s.to_ascii_lowercase().as_str() {
        "wait" => Ok(TimeoutPolicy::Wait),
        "delete" => Ok(TimeoutPolicy::Delete),
        _ => Err(format!("{s}: must be Wait or Delete")),
    }
}

/// The object `start` creates, or why the arguments are refused (before any request, with the
/// same limits the CRD's validation enforces).
pub fn new_object(a: &StartArgs) -> Result<NodeMaintenance, String> {
    if a.node.is_empty() {
        return Err("NODE must not be empty".into());
    }
    if a.reason.chars().count() > 1024 {
        return Err("--reason is limited to 1024 characters".into());
    }
    let policy = a.timeout_policy.unwrap_or_default();
    if policy == TimeoutPolicy::Delete && a.timeout.is_none() {
        return Err("--timeout-policy Delete needs --timeout (the deadline it acts at)".into());
    }
    let name = a.name.clone().unwrap_or_else(|| a.node.clone());
    Ok(NodeMaintenance {
        metadata: ObjectMeta {
            name: Some(name),
            ..Default::default()
        },
        spec: NodeMaintenanceSpec {
            node_name: a.node.clone(),
            stage: Stage::Drain,
            reason: Some(a.reason.clone()),
            drain: DrainSpec {
                timeout_seconds: a.timeout,
                timeout_policy: policy,
                ..Default::default()
            },
        },
        status: None,
    })
}
