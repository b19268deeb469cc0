//! `pilothouse`: one binary replacing kube-controller-manager's workload and node controllers.

use clap::{CommandFactory, FromArgMatches, Parser};
use shared::controller::Registration;
use shared::flags::{ManagerOptions, SetFlags};
use shared::manager::{self, Exit};
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(name = "pilothouse", version, about = "Replaces kube-controller-manager's job, cronjob, statefulset, endpointslice and node controllers")]
struct Cli {
    #[command(flatten)]
    manager: ManagerOptions,
}

/// Every controller Pilothouse hosts or plans to host, with kube-controller-manager's names and
/// aliases. A planned controller cannot be enabled.
fn catalogue() -> Vec<Registration> {
    vec![
        Registration::planned("job-controller", &["job"]),
        Registration::planned("cronjob-controller", &["cronjob"]),
        Registration::planned("statefulset-controller", &["statefulset"]),
        Registration::planned("endpointslice-controller", &["endpointslice"]),
        Registration::planned("endpointslice-mirroring-controller", &["endpointslicemirroring"]),
        Registration::planned("node-lifecycle-controller", &["nodelifecycle"]),
        Registration::planned("taint-eviction-controller", &[]),
        Registration::planned("node-maintenance-controller", &[]),
    ]
}

fn main() -> ExitCode {
    let command = Cli::command();
    let matches = command.clone().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    let set = SetFlags::from_matches(&command, &matches);
    shared::logging::init(cli.manager.logging_format, cli.manager.verbosity);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("pilothouse: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(manager::run(cli.manager, set, catalogue())) {
        Ok(Exit::Stopped) => ExitCode::SUCCESS,
        Ok(Exit::LeaseLost) => {
            tracing::error!("leaderelection lost");
            ExitCode::from(1)
        }
        Err(e) => {
            tracing::error!(error = %e, "pilothouse failed to start");
            eprintln!("pilothouse: {e}");
            ExitCode::from(2)
        }
    }
}
