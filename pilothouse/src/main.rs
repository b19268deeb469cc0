//! `pilothouse`: one binary replacing kube-controller-manager's workload and node controllers.

use clap::{CommandFactory, FromArgMatches, Parser};
use shared::process::flags::{ManagerOptions, SetFlags};
use shared::process::manager::{self, Exit};
use shared::runtime::controller::Registration;
use std::process::ExitCode;

mod cli;
mod crds;
mod flags_doc;

#[derive(Parser, Debug)]
#[command(
    name = "pilothouse",
    version,
    // As kube-controller-manager's pflag: a repeated flag takes its last value (a chart's
    // extraArgs overriding a default); list flags (--controllers) still add up.
    args_override_self = true,
    about = "Replaces kube-controller-manager's job, cronjob, statefulset, endpointslice and node controllers"
)]
struct Cli {
    #[command(flatten)]
    manager: ManagerOptions,
    #[command(flatten)]
    node_lifecycle: node_lifecycle::NodeLifecycleOptions,
    #[command(flatten)]
    job: job::JobOptions,
    #[command(flatten)]
    cronjob: cronjob::CronJobOptions,
    #[command(flatten)]
    statefulset: statefulset::StatefulSetOptions,
    #[command(flatten)]
    endpointslice: endpointslice::EndpointSliceOptions,
    #[command(flatten)]
    endpointslice_mirroring: endpointslice_mirroring::EndpointSliceMirroringOptions,
    #[command(flatten)]
    node_maintenance: node_maintenance::Options,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(clap::Subcommand, Debug)]
enum Command {
    /// Checks a CronJob schedule and prints its next run times, on the controller's own code.
    Schedule(cli::schedule::ScheduleArgs),
    /// Starts, follows and ends node maintenances (NodeMaintenance objects): cordon and drain a
    /// node with progress and named blockers.
    Maintenance(cli::maintenance::MaintenanceArgs),
    /// Prints the CustomResourceDefinitions this binary serves (generated from its types), or
    /// writes one file per CRD with --output-dir (how crds/ is made).
    Crd(crds::CrdArgs),
    /// Prints the reference of this binary's flags as Markdown (how docs/flags.md is made).
    Flags,
}

/// `--version`: the crate version and the bundled IANA time zone release (CR-12).
fn version_text() -> String {
    format!(
        "{} (tzdata {})",
        env!("CARGO_PKG_VERSION"),
        cronjob::zone::tzdata_version()
    )
}

/// Every controller Pilothouse hosts, with kube-controller-manager's names and aliases.
fn catalogue(cli: &Cli) -> Vec<Registration> {
    vec![
        job::registration(cli.job.clone()),
        cronjob::registration(cli.cronjob.clone()),
        statefulset::registration(cli.statefulset.clone()),
        endpointslice::registration(cli.endpointslice.clone()),
        endpointslice_mirroring::registration(cli.endpointslice_mirroring.clone()),
        node_lifecycle::registration(cli.node_lifecycle.clone()),
        taint_eviction::registration(),
        node_maintenance::registration(cli.node_maintenance.clone()),
    ]
}

fn main() -> ExitCode {
    let command = Cli::command().version(version_text());
    // A command line copied from kube-controller-manager: its flags that do not apply here are
    // dropped and named once below; flags neither knows stay errors.
    let (args, ignored) =
        shared::process::flags::drop_foreign_kcm_flags(std::env::args_os().collect(), &command);
    let matches = command.clone().get_matches_from(args);
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    match &cli.command {
        Some(Command::Schedule(args)) => return cli::schedule::run(&cli.cronjob, args),
        Some(Command::Crd(args)) => return crds::run(args),
        Some(Command::Flags) => {
            print!("{}", flags_doc::render(&Cli::command()));
            return ExitCode::SUCCESS;
        }
        Some(Command::Maintenance(args)) => {
            return cli::maintenance::run(args, &cli.manager);
        }
        None => {}
    }
    let set = SetFlags::from_matches(&command, &matches);
    shared::serving::logging::init(cli.manager.logging_format, cli.manager.verbosity);
    if !ignored.is_empty() {
        tracing::warn!(
            flags = %ignored.join(", "),
            "kube-controller-manager flags that do not apply to Pilothouse were ignored"
        );
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("pilothouse: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let catalogue = catalogue(&cli);
    match runtime.block_on(manager::run(cli.manager, set, catalogue)) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn cli() -> Cli {
        Cli::parse_from(["pilothouse"])
    }

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    /// As kube-controller-manager's pflag: a repeated scalar flag takes its last value, a list
    /// flag adds up, and every boolean takes `=true|false`.
    #[test]
    fn a_copied_command_line_parses_as_kube_controller_manager_reads_it() {
        let cli = Cli::try_parse_from([
            "pilothouse",
            "--kube-api-qps=5",
            "--kube-api-qps=6",
            "--controllers=job-controller",
            "--controllers=cronjob-controller",
            "--endpointslice-delete-on-selector-removal=false",
            "--nodemaintenance-node-lifecycle-conditions=true",
            "--leader-elect=false",
        ])
        .expect("parses");
        assert_eq!(cli.manager.kube_api_qps, 6.0);
        assert_eq!(
            cli.manager.controllers,
            ["job-controller", "cronjob-controller"]
        );
        assert!(!cli.endpointslice.endpointslice_delete_on_selector_removal);
        assert!(
            cli.node_maintenance
                .nodemaintenance_node_lifecycle_conditions
        );
        assert!(!cli.manager.leader_elect);
        let bare =
            Cli::try_parse_from(["pilothouse", "--endpointslice-delete-on-selector-removal"])
                .expect("a bare boolean is true");
        assert!(bare.endpointslice.endpointslice_delete_on_selector_removal);
    }

    #[test]
    fn maintenance_takes_kubeconfig_and_context_on_either_side() {
        let cli = Cli::parse_from([
            "pilothouse",
            "maintenance",
            "start",
            "w1",
            "--reason",
            "kernel",
            "--context",
            "prod",
            "--kubeconfig",
            "/k",
            "--timeout",
            "90s",
        ]);
        let Some(Command::Maintenance(m)) = cli.command else {
            panic!("not maintenance")
        };
        assert_eq!(m.context.as_deref(), Some("prod"));
        assert_eq!(m.kubeconfig.as_deref(), Some(std::path::Path::new("/k")));
        // The top-level --kubeconfig (as the test fixtures pass it) reaches the subcommand too.
        let cli = Cli::parse_from(["pilothouse", "--kubeconfig=/t", "maintenance", "status"]);
        assert_eq!(cli.manager.kubeconfig, "/t");
        assert!(matches!(cli.command, Some(Command::Maintenance(_))));
    }

    #[test]
    fn node_maintenance_is_built_and_off_by_default() {
        let cat = catalogue(&cli());
        let r = cat
            .iter()
            .find(|r| r.info.name == "node-maintenance-controller")
            .expect("registered");
        assert!(r.info.built);
        assert!(!r.declaration.on_by_default);
    }

    #[test]
    fn job_flags_have_kcm_defaults() {
        assert_eq!(cli().job.concurrent_job_syncs, 5);
    }

    #[test]
    fn node_lifecycle_flags_have_kcm_defaults() {
        let o = cli().node_lifecycle;
        assert_eq!(o.node_monitor_period, std::time::Duration::from_secs(5));
        assert_eq!(
            o.node_monitor_grace_period,
            std::time::Duration::from_secs(50)
        );
        assert_eq!(
            o.node_startup_grace_period,
            std::time::Duration::from_secs(60)
        );
        assert_eq!(o.node_eviction_rate, 0.1);
        assert_eq!(o.secondary_node_eviction_rate, 0.01);
        assert_eq!(o.large_cluster_size_threshold, 50);
        assert_eq!(o.unhealthy_zone_threshold, 0.55);
    }

    /// `tests/cluster/up` turns off in kube-controller-manager exactly the controllers listed in
    /// tests/cluster/replaced-controllers: that list must be the set this binary can run.
    #[test]
    fn replaced_controllers_list_matches_built_controllers() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/cluster/replaced-controllers"
        );
        let text = std::fs::read_to_string(path).expect("tests/cluster/replaced-controllers");
        let mut listed: Vec<&str> = text
            .lines()
            .map(|l| l.split('#').next().unwrap_or_default().trim())
            .filter(|l| !l.is_empty())
            .collect();
        listed.sort_unstable();
        let mut built: Vec<&str> = catalogue(&cli())
            .iter()
            .filter(|r| r.info.built)
            .map(|r| r.info.name)
            .collect();
        built.sort_unstable();
        // node-maintenance-controller is ours alone: kube-controller-manager has nothing to turn off.
        built.retain(|n| *n != "node-maintenance-controller");
        assert_eq!(listed, built);
    }

    #[test]
    fn catalogue_has_every_kcm_name_and_alias_once() {
        let cat = catalogue(&cli());
        let mut names: Vec<&str> = cat
            .iter()
            .flat_map(|r| std::iter::once(r.info.name).chain(r.info.aliases.iter().copied()))
            .collect();
        let total = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), total, "duplicate controller name or alias");
        for (name, alias) in [
            ("job-controller", "job"),
            ("cronjob-controller", "cronjob"),
            ("statefulset-controller", "statefulset"),
            ("endpointslice-controller", "endpointslice"),
            (
                "endpointslice-mirroring-controller",
                "endpointslicemirroring",
            ),
            ("node-lifecycle-controller", "nodelifecycle"),
        ] {
            let r = cat.iter().find(|r| r.info.name == name).expect(name);
            assert!(
                r.info.aliases.contains(&alias),
                "{name} lacks alias {alias}"
            );
        }
        assert!(
            cat.iter()
                .any(|r| r.info.name == "taint-eviction-controller")
        );
        assert!(
            cat.iter()
                .any(|r| r.info.name == "node-maintenance-controller")
        );
    }
}
