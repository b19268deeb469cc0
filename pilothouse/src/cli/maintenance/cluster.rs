//! How the commands reach the API server: kubectl's kubeconfig rules, then the client the
//! process gives every controller (`shared::api::client`) and the writer seam over it
//! (`shared::api::writer`); API errors classified by `shared::api::apierr` and put in words an
//! operator can act on.

use super::{Failure, MaintenanceArgs, error};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Config, Resource};
use node_maintenance::types::NodeMaintenance;
use serde::de::DeserializeOwned;
use shared::api::apierr::{self, ErrorKind};
use shared::api::client::{self, ClientSpec};
use shared::api::writer::Writer;
use shared::metrics::Metrics;
use shared::process::flags::ManagerOptions;
use std::path::PathBuf;

/// The client's name: its user agent ends `pilothouse/maintenance-cli`, so the API server's
/// audit log tells the operator's command from the controllers.
pub const CLIENT_NAME: &str = "maintenance-cli";

/// The API server as the commands use it.
pub(super) struct Cluster {
    /// Gets, the create and the patch: the seam every request of the controllers goes through.
    pub writer: Writer,
    /// Lists and the watch `start --wait` follows. The writer seam has neither (controllers list
    /// and watch through the shared caches, which a one-shot command does not start: they are
    /// the process's, one informer per resource kept warm for its life), so these two go through
    /// `kube::Api` on the same client.
    pub maintenances: Api<NodeMaintenance>,
}

impl Cluster {
    pub async fn connect(
        args: &MaintenanceArgs,
        manager: &ManagerOptions,
    ) -> Result<Cluster, Failure> {
        let config = config(args, &manager.kubeconfig).await?;
        // Built as the process builds each controller's client: a token bucket of its own
        // (--kube-api-qps, --kube-api-burst), a user agent naming it, and client-go's re-send of
        // an answer with Retry-After instead of kube's own retries (up to 15, for minutes; a
        // person at a terminal is better told). No write fence: an operator's command leads
        // nothing. Its request metrics go to a registry nobody serves: a one-shot command has
        // no /metrics.
        let spec = ClientSpec::new(CLIENT_NAME, manager.kube_api_qps, manager.kube_api_burst);
        let client = client::build(&config, spec, &Metrics::new()).map_err(error)?;
        Ok(Cluster {
            writer: Writer::from_client(client.clone()),
            maintenances: Api::all(client),
        })
    }

    /// The cluster-scoped object `name`, or `None` when there is none.
    pub async fn get_opt<K>(&self, name: &str) -> Result<Option<K>, kube::Error>
    where
        K: Resource<DynamicType = ()> + DeserializeOwned,
    {
        match self.writer.get::<K>("", name).await {
            Ok(o) => Ok(Some(o)),
            Err(e) if apierr::is_not_found(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// kubectl's rules: `--kubeconfig` (the subcommand's, else the binary's top-level `fallback`,
/// empty when unset), else `$KUBECONFIG` or `~/.kube/config`, else in-cluster; `--context` picks
/// a context. The process's own loader (`shared::process::manager`) takes no context, so these
/// rules stay the command's.
async fn config(args: &MaintenanceArgs, fallback: &str) -> Result<Config, Failure> {
    let options = KubeConfigOptions {
        context: args.context.clone(),
        ..Default::default()
    };
    let path = args
        .kubeconfig
        .clone()
        .or_else(|| (!fallback.is_empty()).then(|| PathBuf::from(fallback)));
    let config = match path {
        Some(p) => {
            let kc =
                Kubeconfig::read_from(&p).map_err(|e| error(format!("{}: {e}", p.display())))?;
            Config::from_custom_kubeconfig(kc, &options)
                .await
                .map_err(|e| error(format!("{}: {e}", p.display())))?
        }
        None if args.context.is_some() => Config::from_kubeconfig(&options)
            .await
            .map_err(|e| error(format!("kubeconfig: {e}")))?,
        None => Config::infer()
            .await
            .map_err(|e| error(format!("no cluster configuration: {e}")))?,
    };
    Ok(config)
}

/// API errors in words an operator can act on.
pub(super) fn api_error(e: kube::Error) -> Failure {
    match &e {
        // A 404 that names no object: the resource itself is not served.
        kube::Error::Api(s)
            if apierr::classify(&e) == ErrorKind::NotFound && s.details.is_none() =>
        {
            error(
                "the NodeMaintenance API is not served: install its CRD with \
                 `kubectl apply -f crds/nodemaintenances.pilothouse.dev.yaml` (or `pilothouse crd | kubectl apply -f -`)",
            )
        }
        kube::Error::Api(s) => error(format!("{} ({})", s.message, s.reason)),
        _ => error(e),
    }
}
