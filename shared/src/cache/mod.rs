//! What the process knows of the cluster: one informer per resource type, the compact pod and
//! the projections that keep only declared fields, and the record of our own writes that the
//! caches must catch up with ([`written`]).

pub mod decoded;
pub mod informers;
pub mod pod;
pub mod projection;
pub mod written;

use kube::Client;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// The process's informer registry with the cache layer's transforms installed (the pod
/// projection).
pub fn registry(client: Client, stop: CancellationToken) -> Arc<informers::Informers> {
    let informers = informers::Informers::new(client, stop);
    projection::install(&informers);
    informers
}

/// A registry whose client points nowhere, for tests that drive informers by hand (it needs a
/// tokio runtime entered).
#[cfg(test)]
pub(crate) fn offline_registry() -> Arc<informers::Informers> {
    let config = kube::Config::new("http://127.0.0.1:9".parse().expect("a URL"));
    registry(
        Client::try_from(config).expect("a client"),
        CancellationToken::new(),
    )
}
