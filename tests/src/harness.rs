//! The runner shared by the end-to-end suites: one local control plane per suite (optionally one
//! Pilothouse leading it), tests run side by side as libtest trials, everything stopped at the
//! end (logs kept when something failed).

use crate::cluster::{Cluster, ClusterOptions};
use crate::pilothouse::Pilothouse;
use anyhow::Result;
use libtest_mimic::{Arguments, Failed, Trial};
use std::future::Future;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

static CLUSTER: OnceLock<Cluster> = OnceLock::new();
static PILOTHOUSE: OnceLock<Pilothouse> = OnceLock::new();

/// The suite's control plane.
pub fn cluster() -> &'static Cluster {
    CLUSTER
        .get()
        .expect("the suite's cluster is started before any test runs")
}

/// The suite's Pilothouse, if the suite started one.
pub fn pilothouse() -> &'static Pilothouse {
    PILOTHOUSE.get().expect("this suite started a Pilothouse")
}

/// Where Pilothouse logs of this suite go.
pub fn log_dir() -> PathBuf {
    let d = cluster().dir.join("pilothouse-logs");
    std::fs::create_dir_all(&d).expect("log dir");
    d
}

/// A test: an async function run on its own runtime; on failure the suite Pilothouse's log tail
/// is appended.
pub fn trial<F, Fut>(name: &'static str, f: F) -> Trial
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = Result<()>>,
{
    Trial::test(name, move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| Failed::from(e.to_string()))?;
        rt.block_on(f()).map_err(|e| {
            let tail = PILOTHOUSE.get().map(|p| {
                format!(
                    "\n--- pilothouse log tail ({}):\n{}",
                    p.log.display(),
                    p.log_tail(30)
                )
            });
            Failed::from(format!("{e:#}{}", tail.unwrap_or_default()))
        })
    })
}

/// The Pilothouse a suite runs for all its tests.
pub struct SuitePilothouse {
    pub args: Vec<String>,
    /// Run as the `kube-system/pilothouse` ServiceAccount with manifests/rbac.yaml and
    /// rbac-controllers.yaml applied (and
    /// the default Lease name, which that RBAC names), rather than as cluster admin.
    pub as_service_account: bool,
}

/// Runs a suite: starts its control plane (and a leading Pilothouse, if given), runs the trials
/// concurrently, stops everything, exits with the result.
pub fn main(
    suite: &str,
    opts: ClusterOptions,
    suite_pilothouse: Option<SuitePilothouse>,
    trials: Vec<Trial>,
) -> ! {
    main_with_setup(suite, opts, |_| Ok(()), suite_pilothouse, trials)
}

/// [`main`], with `setup` run on the control plane before Pilothouse starts (e.g. installing a
/// CRD whose objects Pilothouse's caches list at start).
pub fn main_with_setup(
    suite: &str,
    opts: ClusterOptions,
    setup: impl FnOnce(&Cluster) -> Result<()>,
    suite_pilothouse: Option<SuitePilothouse>,
    trials: Vec<Trial>,
) -> ! {
    let mut args = Arguments::from_args();
    // Real-clock tests mostly wait: run them side by side.
    args.test_threads.get_or_insert(16);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    if !args.list {
        // Claims (StatefulSet volumeClaimTemplates) bind through an in-process provisioner.
        let up = Cluster::up(&format!("{suite}-{}", std::process::id()), opts)
            .and_then(|c| crate::provisioner::start_for_suite(&rt, &c).map(|()| c));
        match up {
            Ok(c) => {
                let _ = CLUSTER.set(c);
                if let Err(e) = setup(cluster()) {
                    eprintln!("suite setup failed: {e:#}");
                    stop(true);
                    std::process::exit(1);
                }
            }
            Err(e) => {
                eprintln!("could not start the local control plane: {e:#}");
                std::process::exit(1);
            }
        }
        if let Some(sp) = suite_pilothouse {
            let started = rt.block_on(async {
                let (kubeconfig, mut a) = if sp.as_service_account {
                    (cluster().pilothouse_service_account_kubeconfig()?, vec![])
                } else {
                    let lease = crate::unique(suite);
                    (
                        cluster().kubeconfig.clone(),
                        vec![format!("--leader-elect-resource-name={lease}")],
                    )
                };
                a.extend(sp.args);
                let p =
                    Pilothouse::spawn(&format!("{suite}-pilothouse"), &kubeconfig, &log_dir(), &a)?;
                p.wait_log("starting controller", Duration::from_secs(60))
                    .await?;
                Ok::<_, anyhow::Error>(p)
            });
            match started {
                Ok(p) => {
                    let _ = PILOTHOUSE.set(p);
                }
                Err(e) => {
                    eprintln!("could not start pilothouse: {e:#}");
                    stop(true);
                    std::process::exit(1);
                }
            }
        }
    }
    let conclusion = libtest_mimic::run(&args, trials);
    stop(conclusion.has_failed());
    drop(rt);
    conclusion.exit()
}

fn stop(failed: bool) {
    if let Some(p) = PILOTHOUSE.get() {
        let _ = p.sigkill();
    }
    // Statics never drop: stop the control plane explicitly, keeping logs of a failed run.
    if let Some(c) = CLUSTER.get() {
        let script = crate::repo_root().join("tests/cluster/down");
        let mut down = std::process::Command::new(script);
        down.arg("--dir").arg(&c.dir);
        if failed {
            down.arg("--keep-dir");
            eprintln!(
                "control plane and pilothouse logs kept in {}",
                c.dir.display()
            );
        }
        let _ = down.status();
    }
}
