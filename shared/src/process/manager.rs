//! The process lifecycle: flags → clients → shared caches (warm on every replica) → leader
//! election → controllers (only while leading) → graceful or forced stop.
//!
//! - SIGTERM/SIGINT: stop renewing, stop intake, let in-flight syncs finish (bounded by
//!   `--shutdown-drain-timeout`), release the Lease, exit 0.
//! - Lost lease (no renewal within the renew deadline): the write fence is already closed; stop
//!   the controllers (bounded) and exit 1 so the pod restarts, as kube-controller-manager does.

use crate::api::client::{self, ClientSpec, WriteFence};
use crate::api::credentials::{self, BearerToken, ServiceAccountTokens};
use crate::cache::informers::Informers;
use crate::election::{self, ElectionConfig, Ended, LeaderElector};
use crate::metrics::Metrics;
use crate::process::flags::{self, FlagError, ManagerOptions, SetFlags};
use crate::process::setup::SetupFactory;
use crate::runtime::conflicts::Conflicts;
use crate::runtime::controller::{Controller, Registration};
use crate::serving::health::{self, Health};
use crate::serving::http::{self, Delegated, SecureServing};
use futures::future::join_all;
use kube::Config;
use kube::config::{KubeConfigOptions, Kubeconfig};
use std::collections::HashMap;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    #[error(transparent)]
    Flags(#[from] FlagError),
    #[error("loading kubeconfig: {0}")]
    Kubeconfig(String),
    #[error("{0}")]
    UnsupportedApiServer(String),
    #[error("building a client: {0}")]
    Client(#[from] kube::Error),
    #[error(transparent)]
    Election(#[from] election::ElectionError),
    #[error("initialising {name}: {source}")]
    Init {
        name: &'static str,
        source: crate::runtime::controller::InitError,
    },
    #[error("serving health and metrics on {addr}: {source}")]
    Health {
        addr: String,
        source: std::io::Error,
    },
    #[error("secure serving on {addr}: {source}")]
    Serving {
        addr: String,
        source: crate::serving::http::ServingError,
    },
    #[error("service account credentials: {0}")]
    Credentials(#[from] crate::api::credentials::CredentialsError),
    #[error("installing signal handlers: {0}")]
    Signals(std::io::Error),
}

/// How the process should exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// Graceful stop after a signal.
    Stopped,
    /// Leadership lost: exit non-zero so the pod restarts.
    LeaseLost,
}

async fn load_config(opts: &ManagerOptions) -> Result<Config, ManagerError> {
    let mut config = if opts.kubeconfig.is_empty() {
        Config::infer()
            .await
            .map_err(|e| ManagerError::Kubeconfig(e.to_string()))?
    } else {
        let kc = Kubeconfig::read_from(&opts.kubeconfig)
            .map_err(|e| ManagerError::Kubeconfig(format!("{}: {e}", opts.kubeconfig)))?;
        Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .map_err(|e| ManagerError::Kubeconfig(format!("{}: {e}", opts.kubeconfig)))?
    };
    if !opts.master.is_empty() {
        config.cluster_url = opts
            .master
            .parse()
            .map_err(|e| ManagerError::Kubeconfig(format!("--master: {e}")))?;
    }
    Ok(config)
}

/// Fence for `--leader-elect=false`: always allowed to write.
#[derive(Debug)]
struct NoElection;
impl WriteFence for NoElection {
    fn may_write(&self) -> bool {
        true
    }
}

pub async fn run(
    opts: ManagerOptions,
    set: SetFlags,
    catalogue: Vec<Registration>,
) -> Result<Exit, ManagerError> {
    let gates = opts.validate()?;
    let infos: Vec<_> = catalogue.iter().map(|r| r.info).collect();
    let enabled = flags::resolve_controllers(&opts.controllers, &infos)?;
    tracing::info!(
        enabled = ?enabled,
        explicit_flags = ?set,
        "starting pilothouse v{}",
        env!("CARGO_PKG_VERSION")
    );

    let config = load_config(&opts).await?;
    let metrics = Metrics::new();
    let identity = election::default_identity();

    // Caches live for the whole process: standbys keep them warm.
    let process_stop = CancellationToken::new();
    let informer_client = client::build(
        &config,
        ClientSpec::new("shared-informers", opts.kube_api_qps, opts.kube_api_burst),
        &metrics,
    )?;
    check_api_server_version(&informer_client, opts.allow_unsupported_api_server_version).await?;
    let informers = crate::cache::registry(informer_client, process_stop.clone());
    // Sees managedFields before the caches drop them: kcm still writing what we own.
    let conflicts = Arc::new(crate::runtime::conflicts::Conflicts::default());
    informers.observe(Arc::clone(&conflicts) as Arc<dyn crate::cache::informers::MetaObserver>);

    let elector = build_elector(&opts, &config, &metrics, &identity)?;
    let fence: Arc<dyn WriteFence> = match &elector {
        Some(e) => Arc::clone(e) as Arc<dyn WriteFence>,
        None => Arc::new(NoElection),
    };

    let credentials =
        acquire_credentials(&opts, &config, &metrics, &enabled, &process_stop).await?;
    let factory = SetupFactory {
        config: config.clone(),
        qps: opts.kube_api_qps,
        burst: opts.kube_api_burst,
        fence: Some(fence),
        informers: Arc::clone(&informers),
        metrics: Arc::clone(&metrics),
        identity: identity.clone(),
        gates,
        credentials,
    };
    let controllers = build_controllers(catalogue, &enabled, &factory, &conflicts)?;
    metrics.register(
        "pilothouse_conflicting_writes",
        "Writes by kube-controller-manager to objects a running Pilothouse controller owns (it still runs that controller)",
        conflicts.counter.clone(),
    );
    metrics.register(
        "pilothouse_undecodable_objects",
        "Objects a watch delivered that could not be decoded, even with out-of-range times saturated; each was skipped (its key is logged), the rest of the stream went on",
        informers.counters().undecodable,
    );
    metrics.register(
        "pilothouse_informer_panics",
        "Watch events skipped because taking them into the cache panicked (a transform, an observer or an index function); the watch went on",
        informers.counters().panics,
    );
    informers.start();
    tracing::info!(resources = ?informers.resources(), "shared caches started");

    let health = Health {
        metrics: Arc::clone(&metrics),
        informers: Arc::clone(&informers),
        conflicts: Arc::clone(&conflicts),
        elector: elector.clone(),
    };
    start_serving(&opts, &config, &metrics, health, &process_stop).await?;

    let exit = lead_and_run(
        &opts,
        elector,
        &informers,
        &conflicts,
        controllers,
        &metrics,
        &identity,
    )
    .await?;
    process_stop.cancel();
    Ok(exit)
}

/// Leads (or not), then runs the controllers until a signal or a lost Lease; stops them within
/// `--shutdown-drain-timeout` and releases the Lease on a graceful stop.
async fn lead_and_run(
    opts: &ManagerOptions,
    elector: Option<Arc<LeaderElector>>,
    informers: &Informers,
    conflicts: &Conflicts,
    controllers: Vec<Built>,
    metrics: &Arc<Metrics>,
    identity: &str,
) -> Result<Exit, ManagerError> {
    let shutdown = CancellationToken::new();
    spawn_signal_watch(shutdown.clone())?;

    // Lead (or not), then run the controllers until a signal or the lease is lost.
    let election_stop = shutdown.child_token();
    let election_task = elector.as_ref().map(|e| {
        let e = Arc::clone(e);
        let stop = election_stop.clone();
        tokio::spawn(e.run(stop))
    });
    let mut leading = elector.as_ref().map(|e| e.subscribe());
    if let Some(rx) = leading.as_mut() {
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = rx.wait_for(|l| *l) => {}
        }
    }
    let controllers_stop = CancellationToken::new();
    let mut exit = Exit::Stopped;
    if !shutdown.is_cancelled() {
        tracing::info!(identity = %identity, "leading; waiting for caches to sync");
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = wait_synced(informers) => {}
        }
        conflicts.arm(Some(crate::meta::clock::unix_now()));
        let handles: Vec<_> = controllers
            .into_iter()
            .map(|(name, c)| {
                tracing::info!(controller = name, "starting controller");
                let stop = controllers_stop.clone();
                let metrics = Arc::clone(metrics);
                tokio::spawn(async move {
                    metrics.set_controller_running(name, true);
                    c.run(stop).await;
                    metrics.set_controller_running(name, false);
                })
            })
            .collect();
        let ended = match election_task {
            Some(task) => {
                tokio::select! {
                    _ = shutdown.cancelled() => Ended::Stopped,
                    r = task => r.unwrap_or(Ended::Lost),
                }
            }
            None => {
                shutdown.cancelled().await;
                Ended::Stopped
            }
        };
        if ended == Ended::Lost {
            exit = Exit::LeaseLost;
        }
        election_stop.cancel();
        controllers_stop.cancel();
        conflicts.arm(None);
        let drained = tokio::time::timeout(opts.shutdown_drain_timeout, join_all(handles)).await;
        if drained.is_err() {
            tracing::warn!(timeout = ?opts.shutdown_drain_timeout, "controllers did not drain in time; stopping anyway");
        }
    }
    election_stop.cancel();
    if let Some(e) = elector.as_ref().filter(|_| exit == Exit::Stopped) {
        e.release().await;
    }
    Ok(exit)
}

/// An enabled controller, built, with its name.
type Built = (&'static str, Box<dyn Controller>);

/// The API server minors Pilothouse supports: those kube-controller-manager 1.37 may run
/// against (the same minor, or an API server one minor newer).
const SUPPORTED_MINORS: std::ops::RangeInclusive<u32> = 37..=38;

/// Whether an API server reporting `major`.`minor` (as `/version` has them; a managed
/// service may add a `+`) is supported, and if not, why.
fn api_server_supported(major: &str, minor: &str) -> Result<(), String> {
    let number = |s: &str| {
        s.trim_end_matches(|c: char| !c.is_ascii_digit())
            .parse::<u32>()
            .ok()
    };
    match (number(major), number(minor)) {
        (Some(1), Some(m)) if SUPPORTED_MINORS.contains(&m) => Ok(()),
        _ => Err(format!(
            "the API server is version {major}.{minor}; Pilothouse {} stands in for kube-controller-manager 1.{}, which runs against API servers 1.{} to 1.{} (its version skew policy). Use a supported API server, or start anyway with --allow-unsupported-api-server-version",
            env!("CARGO_PKG_VERSION"),
            SUPPORTED_MINORS.start(),
            SUPPORTED_MINORS.start(),
            SUPPORTED_MINORS.end()
        )),
    }
}

/// Reads `/version` once at start. An unsupported version is refused unless allowed. A version
/// that cannot be read is logged and not checked (the API server may still be starting; the
/// caches wait for it anyway).
async fn check_api_server_version(client: &kube::Client, allow: bool) -> Result<(), ManagerError> {
    let info = match client.apiserver_version().await {
        Ok(info) => info,
        Err(e) => {
            tracing::warn!(error = %e, "could not read the API server's version; not checked");
            return Ok(());
        }
    };
    match api_server_supported(&info.major, &info.minor) {
        Ok(()) => {
            tracing::info!(version = %info.git_version, "API server version supported");
            Ok(())
        }
        Err(why) if allow => {
            tracing::warn!(version = %info.git_version, "{why}; starting because --allow-unsupported-api-server-version is set");
            Ok(())
        }
        Err(why) => Err(ManagerError::UnsupportedApiServer(why)),
    }
}

/// The Lease elector `--leader-elect` asks for, on a client of its own.
fn build_elector(
    opts: &ManagerOptions,
    config: &Config,
    metrics: &Arc<Metrics>,
    identity: &str,
) -> Result<Option<Arc<LeaderElector>>, ManagerError> {
    if !opts.leader_elect {
        return Ok(None);
    }
    let election_client = client::build(
        config,
        ClientSpec::new("leader-election", opts.kube_api_qps, opts.kube_api_burst),
        metrics,
    )?;
    Ok(Some(LeaderElector::new(
        election_client,
        ElectionConfig {
            namespace: opts.leader_elect_resource_namespace.clone(),
            name: opts.leader_elect_resource_name.clone(),
            identity: identity.to_string(),
            lease_duration: opts.leader_elect_lease_duration,
            renew_deadline: opts.leader_elect_renew_deadline,
            retry_period: opts.leader_elect_retry_period,
        },
        metrics,
    )?))
}

/// `--use-service-account-credentials`: one token per ServiceAccount (the node-lifecycle and
/// taint-eviction controllers share upstream's `node-controller`), requested before any
/// controller is built, so a missing permission stops the start with its name.
async fn acquire_credentials(
    opts: &ManagerOptions,
    config: &Config,
    metrics: &Arc<Metrics>,
    enabled: &[&'static str],
    process_stop: &CancellationToken,
) -> Result<HashMap<&'static str, Arc<BearerToken>>, ManagerError> {
    let mut credentials = HashMap::new();
    if !opts.use_service_account_credentials {
        return Ok(credentials);
    }
    let tokens = ServiceAccountTokens::new(
        client::build(
            config,
            ClientSpec::new(
                "service-account-credentials",
                opts.kube_api_qps,
                opts.kube_api_burst,
            ),
            metrics,
        )?,
        process_stop.clone(),
    );
    let mut by_account = HashMap::new();
    for name in enabled {
        let account = credentials::service_account(name).to_string();
        let token = match by_account.get(&account) {
            Some(t) => Arc::clone(t),
            None => {
                let t = tokens.acquire(&account).await?;
                by_account.insert(account.clone(), Arc::clone(&t));
                t
            }
        };
        tracing::info!(controller = name, service_account = %account, "controller uses its service account's credentials");
        credentials.insert(*name, token);
    }
    Ok(credentials)
}

/// The enabled controllers, each built by its `init` on its own [`Setup`]
/// (`crate::runtime::controller::Setup`), and guarded against kcm running it too.
fn build_controllers(
    catalogue: Vec<Registration>,
    enabled: &[&'static str],
    factory: &SetupFactory,
    conflicts: &Conflicts,
) -> Result<Vec<Built>, ManagerError> {
    let mut controllers = Vec::new();
    for reg in catalogue {
        if !enabled.contains(&reg.info.name) {
            continue;
        }
        let Some(init) = reg.init else { continue };
        let name = reg.info.name;
        let setup = factory
            .setup(&reg.declaration)
            .map_err(|source| ManagerError::Init { name, source })?;
        // A conflict is reported as a Warning on the object, from the budget of the controller
        // that owns it.
        conflicts.guard(name, Some(setup.events.clone()));
        controllers.push((
            name,
            init(setup).map_err(|source| ManagerError::Init { name, source })?,
        ));
    }
    Ok(controllers)
}

/// The secure port and, when asked for, the plain-HTTP one; both end with the process.
async fn start_serving(
    opts: &ManagerOptions,
    config: &Config,
    metrics: &Arc<Metrics>,
    health: Health,
    process_stop: &CancellationToken,
) -> Result<(), ManagerError> {
    if opts.secure_port != 0 {
        let secure = SecureServing {
            bind_address: opts.bind_address.clone(),
            port: opts.secure_port,
            cert_file: opts.tls_cert_file.clone(),
            key_file: opts.tls_private_key_file.clone(),
            always_allow_paths: opts.authorization_always_allow_paths.clone(),
        };
        // Reviews come from a client of their own: scrapes never spend a controller's budget.
        // Its budget is upstream's delegated authn/authz clients' (200/400, set high because it
        // bounds how fast the port answers); unknown credentials are bounded in `http.rs`.
        let auth = Delegated::new(client::build(
            config,
            ClientSpec::new("delegated-auth", 200.0, 400),
            metrics,
        )?);
        let addr = format!("{}:{}", opts.bind_address, opts.secure_port);
        let bound = http::serve(&secure, health.clone(), auth, process_stop.clone())
            .await
            .map_err(|source| ManagerError::Serving { addr, source })?;
        tracing::info!(address = %bound, "serving securely on HTTPS: /metrics behind delegated authorization, /healthz /readyz /livez open");
    }
    if !opts.metrics_bind_address.is_empty() {
        let bound = health::serve(&opts.metrics_bind_address, health, process_stop.clone())
            .await
            .map_err(|source| ManagerError::Health {
                addr: opts.metrics_bind_address.clone(),
                source,
            })?;
        tracing::info!(address = %bound, "serving /healthz /readyz /metrics on plain HTTP");
    }
    Ok(())
}

async fn wait_synced(informers: &Informers) {
    while !informers.all_synced() {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

fn spawn_signal_watch(shutdown: CancellationToken) -> Result<(), ManagerError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(ManagerError::Signals)?;
    let mut int = signal(SignalKind::interrupt()).map_err(ManagerError::Signals)?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
        }
        shutdown.cancel();
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::api_server_supported;

    /// 1.37 and 1.38 are supported (a managed service's `37+` too); older, newer and other
    /// majors are refused, naming the flag that overrides.
    #[test]
    fn the_api_server_version_is_checked_against_kcms_skew_policy() {
        assert!(api_server_supported("1", "37").is_ok());
        assert!(api_server_supported("1", "38").is_ok());
        assert!(api_server_supported("1", "37+").is_ok());
        for (major, minor) in [("1", "36"), ("1", "39"), ("2", "37"), ("", ""), ("1", "x")] {
            let why = api_server_supported(major, minor).expect_err("refused");
            assert!(
                why.contains("--allow-unsupported-api-server-version"),
                "{why}"
            );
        }
    }
}
