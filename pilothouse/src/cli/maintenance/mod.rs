//! `pilothouse maintenance`: the operator's command for NodeMaintenance.
//!
//! `start NODE --reason TEXT` creates a NodeMaintenance named after the node (`--name` to
//! override) and, with `--wait`, follows it by watching the object: a progress bar of
//! evicted/targeted on a terminal, plain lines otherwise, each blocked pod named with its PDB.
//! `status [NODE]` prints the objects as `kubectl get pnm` does, with their blockers. `end NODE`
//! sets stage `Complete` and waits until the node is released. Kubeconfig as kubectl:
//! `--kubeconfig`, else `$KUBECONFIG` or `~/.kube/config`, else in-cluster; `--context` picks a
//! context.
//!
//! The decisions are pure functions, tested in `tests.rs`: [`args`] (the arguments and the
//! object they make), [`verdict`] (exit decisions), [`render`] (what is printed). [`cluster`] is
//! how the commands reach the API server (shared::api's client, writer and error
//! classification); [`start`], [`status`] and [`end`] are the commands.

mod args;
mod cluster;
mod end;
mod render;
mod start;
mod status;
#[cfg(test)]
mod tests;
mod verdict;

pub use args::{EndArgs, MaintenanceArgs, MaintenanceCommand, StatusArgs};

use cluster::Cluster;
use shared::process::flags::ManagerOptions;
use std::process::ExitCode;

/// Exit codes (README): 0 drained / released; 1 an error (API, arguments, not found);
/// 3 the drain cannot progress without the operator (PDB deadlock, consent, missing node, node
/// held by another maintenance); 4 a deadline passed; 5 the maintenance was ended or deleted
/// while `start --wait` followed it.
pub const EXIT_ERROR: u8 = 1;
pub const EXIT_BLOCKED: u8 = 3;
pub const EXIT_DEADLINE: u8 = 4;
pub const EXIT_CANCELLED: u8 = 5;

/// Runs `pilothouse maintenance`. `manager` holds the binary's top-level flags: its
/// `--kubeconfig` (empty when unset) is used when the subcommand's own is not given, and its
/// `--kube-api-qps`/`--kube-api-burst` are the client's budget, as for every controller's.
pub fn run(args: &MaintenanceArgs, manager: &ManagerOptions) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return exit(EXIT_ERROR, &format!("starting the async runtime: {e}")),
    };
    match runtime.block_on(dispatch(args, manager)) {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, message)) => exit(code, &message),
    }
}

fn exit(code: u8, message: &str) -> ExitCode {
    eprintln!("pilothouse maintenance: {message}");
    ExitCode::from(code)
}

/// Why a command failed: its exit code and the message printed on stderr.
type Failure = (u8, String);

type Outcome = Result<(), Failure>;

fn error(e: impl std::fmt::Display) -> Failure {
    (EXIT_ERROR, e.to_string())
}

async fn dispatch(args: &MaintenanceArgs, manager: &ManagerOptions) -> Outcome {
    match &args.command {
        MaintenanceCommand::Start(a) => {
            // Refuse bad arguments before touching the cluster.
            let object = args::new_object(a).map_err(error)?;
            start::start(&Cluster::connect(args, manager).await?, object, a.wait).await
        }
        MaintenanceCommand::Status(a) => {
            status::status(&Cluster::connect(args, manager).await?, a).await
        }
        MaintenanceCommand::End(a) => end::end(&Cluster::connect(args, manager).await?, a).await,
    }
}
