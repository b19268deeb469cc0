//! The seam between the runtime and a controller.
//!
//! At start-up each enabled controller's `init` receives a [`Setup`]: it asks the shared
//! informer registry for the types it needs (which creates their watches), registers event
//! handlers that map changes to its queue keys, and returns a [`Controller`] whose `run` starts
//! workers once this replica leads and returns once they have drained after `stop`.

use crate::client::{self, ClientSpec, WriteFence};
use crate::events::EventRecorder;
use crate::flags::{ControllerInfo, FeatureGates};
use crate::informers::Informers;
use crate::metrics::Metrics;
use futures::future::BoxFuture;
use kube::{Client, Config};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

pub trait Controller: Send + 'static {
    /// Runs until `stop` is cancelled, then returns once in-flight syncs have finished.
    fn run(self: Box<Self>, stop: CancellationToken) -> BoxFuture<'static, ()>;
}

#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error("building the API client: {0}")]
    Client(#[from] kube::Error),
    #[error("{0}")]
    Invalid(String),
}

/// Everything a controller may use while it sets up.
pub struct Setup {
    /// The controller's canonical name (user agent, event reporter, metric label).
    pub name: &'static str,
    /// The controller's own rate-limited client, fenced by leadership.
    pub client: Client,
    pub informers: Arc<Informers>,
    pub metrics: Arc<Metrics>,
    pub events: EventRecorder,
    pub gates: FeatureGates,
    /// This replica's identity (`<hostname>_<uuid>`), e.g. for a recorder of another source name.
    pub identity: String,
    /// The client behind `events`, for a recorder reporting under another name.
    pub events_client: Client,
}

pub type InitFn = Box<dyn FnOnce(Setup) -> Result<Box<dyn Controller>, InitError> + Send>;

/// A controller in the catalogue: built ones carry their `init`.
pub struct Registration {
    pub info: ControllerInfo,
    pub init: Option<InitFn>,
}

impl Registration {
    pub fn planned(name: &'static str, aliases: &'static [&'static str]) -> Self {
        Registration {
            info: ControllerInfo {
                name,
                aliases,
                built: false,
                on_by_default: true,
            },
            init: None,
        }
    }

    pub fn built(
        name: &'static str,
        aliases: &'static [&'static str],
        on_by_default: bool,
        init: InitFn,
    ) -> Self {
        Registration {
            info: ControllerInfo {
                name,
                aliases,
                built: true,
                on_by_default,
            },
            init: Some(init),
        }
    }
}

/// Shared inputs for building each controller's [`Setup`].
pub struct SetupFactory {
    pub config: Config,
    pub qps: f32,
    pub burst: u32,
    pub fence: Option<Arc<dyn WriteFence>>,
    pub informers: Arc<Informers>,
    pub metrics: Arc<Metrics>,
    pub identity: String,
    pub gates: FeatureGates,
}

impl SetupFactory {
    pub fn setup(&self, name: &'static str) -> Result<Setup, InitError> {
        let spec = |controller: String| ClientSpec {
            controller,
            qps: self.qps,
            burst: self.burst,
            fence: self.fence.clone(),
        };
        let client = client::build(&self.config, spec(name.to_string()), &self.metrics)?;
        // Events get a client (and bucket) of their own: a burst of events never delays the
        // controller's writes.
        let events_client =
            client::build(&self.config, spec(format!("{name}-events")), &self.metrics)?;
        Ok(Setup {
            name,
            events: EventRecorder::new(events_client.clone(), name, &self.identity),
            events_client,
            client,
            informers: Arc::clone(&self.informers),
            metrics: Arc::clone(&self.metrics),
            gates: self.gates,
            identity: self.identity.clone(),
        })
    }
}
