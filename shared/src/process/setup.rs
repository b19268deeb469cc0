//! Building each controller's [`Setup`]: its own clients (one budget, the fence, its
//! credentials) and event recorder, from what the process shares.

use crate::api::client::{self, ClientSpec, WriteFence};
use crate::api::writer::Writer;
use crate::cache::informers::Informers;
use crate::metrics::Metrics;
use crate::runtime::controller::{Declaration, InitError, Setup};
use crate::runtime::events::EventRecorder;
use crate::runtime::gates::FeatureGates;
use kube::Config;
use std::sync::Arc;

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
    /// `--use-service-account-credentials`: each controller's token, by controller name.
    pub credentials:
        std::collections::HashMap<&'static str, Arc<crate::api::credentials::BearerToken>>,
}

impl SetupFactory {
    pub fn setup(&self, declaration: &Declaration) -> Result<Setup, InitError> {
        let name = declaration.name;
        // One budget per controller, as its flags say: its events come out of the same bucket
        // (as upstream's share the controller's client), but only from tokens its object
        // writes leave free; what cannot wait is dropped and counted by the recorder.
        let bucket = Arc::new(crate::api::ratelimit::TokenBucket::new(
            f64::from(self.qps),
            self.burst,
        ));
        let bearer = self.credentials.get(name).cloned();
        let spec = |low_priority: bool| ClientSpec {
            controller: name.to_string(),
            qps: self.qps,
            burst: self.burst,
            fence: self.fence.clone(),
            bucket: Some(Arc::clone(&bucket)),
            low_priority,
            bearer: bearer.clone(),
        };
        // Under its own ServiceAccount a controller sends only that token: none of this
        // process's credentials (client certificate, token, exec plugin) are kept.
        let config = match bearer {
            Some(_) => {
                let mut c = self.config.clone();
                c.auth_info = kube::config::AuthInfo::default();
                c
            }
            None => self.config.clone(),
        };
        let client = client::build(&config, spec(false), &self.metrics)?;
        let events_client = client::build(&config, spec(true), &self.metrics)?;
        Ok(Setup {
            name,
            writer: Writer::from_client(client),
            events: EventRecorder::new(
                Writer::from_client(events_client),
                declaration.event_source,
                &self.identity,
            )
            .with_drops(self.metrics.events_dropped(name)),
            informers: Arc::clone(&self.informers),
            metrics: Arc::clone(&self.metrics),
            gates: self.gates,
            clock: crate::meta::clock::system(),
        })
    }
}
