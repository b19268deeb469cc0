//! `statefulset-controller` (ST-1..ST-44, SB-1..SB-9): pods with stable
//! identities and claims, ControllerRevisions byte-equal to upstream's, OrderedReady and Parallel
//! scaling, RollingUpdate with partition and maxUnavailable always on.
//!
//! Wiring only: one queue (`statefulset`, keyed `namespace/name`) fed by set changes and by the
//! changes of their pods (ST-2); claims and revisions are read from the caches (ST-1). [`sync`] is
//! one set's sync; [`revision`] (ST-11..ST-17), [`identity`] (ST-6..ST-10, ST-32..ST-36),
//! [`plan`] (ST-18..ST-31) and [`status`] (ST-40..ST-42) are its pure decisions;
//! [`pod_control`] makes the plan's writes to pods and claims with their events (ST-43), through
//! [`act`]'s requests.

// Time arithmetic must not panic (PX-2; clippy::arithmetic_side_effects is denied in the
// workspace lints). Tests may use plain operators on the instants they build, and a table
// test may be longer than a function should be.
#![cfg_attr(
    test,
    allow(
        clippy::arithmetic_side_effects,
        clippy::unchecked_time_subtraction,
        clippy::too_many_lines
    )
)]

pub mod act;
pub mod handlers;
pub mod identity;
pub mod metrics;
pub mod model;
pub mod plan;
pub mod pod_control;
pub mod revision;
pub mod status;
pub mod sync;
#[cfg(test)]
mod sync_tests;

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use model::StatefulSet;
use shared::api::apierr::{Classify, ErrorKind};
use shared::api::ratelimit::BackoffConfig;
use shared::cache::informers::{
    INDEX_CONTROLLER_UID, INDEX_NAMESPACE, INDEX_ORPHAN_NAMESPACE, by_controller_uid, by_namespace,
    orphan_by_namespace,
};
use shared::cache::pod::Pod;
use shared::cache::projection::PodFields;
use shared::meta::keys::object_key;
use shared::runtime::controller::{Controller, Declaration, InitError, Registration, Setup};
use std::sync::Arc;

pub const DECLARATION: Declaration = Declaration {
    name: "statefulset-controller",
    aliases: &["statefulset"],
    event_source: "statefulset-controller",
    on_by_default: true,
};
pub const NAME: &str = DECLARATION.name;
/// ST-3's queue, under upstream's name (label `name` of `workqueue_*`).
pub const QUEUE: &str = "statefulset";

#[derive(clap::Args, Clone, Debug)]
pub struct StatefulSetOptions {
    /// The number of statefulset objects that are allowed to sync concurrently. Larger number = more responsive statefulsets, but more CPU (and network) load
    #[arg(long, default_value_t = 5)]
    pub concurrent_statefulset_syncs: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Api(#[from] shared::api::apierr::Failed),
    /// Adoption refused: the set read live is another one, or being deleted (ST-4).
    #[error("{0}")]
    Claim(String),
    /// Ten hash collisions in one sync (ST-14 d).
    #[error("{0}")]
    Revision(String),
    /// ST-R: `updateStrategy.type: Recreate` with StatefulSetRecreateStrategy off.
    #[error("{0}")]
    UnknownStrategy(String),
    /// Several writes failed; the first is the sync's error.
    #[error("{first} (and {more} more)")]
    Many { first: Box<Error>, more: usize },
}

impl Classify for Error {
    fn kind(&self) -> ErrorKind {
        match self {
            Error::Api(e) => e.kind(),
            Error::Claim(_) | Error::Revision(_) | Error::UnknownStrategy(_) => ErrorKind::Other,
            Error::Many { first, .. } => first.kind(),
        }
    }
}

/// An API error with what the sync was doing (`shared::api::apierr::doing` for this crate's error).
pub(crate) fn api(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    shared::api::apierr::doing(what)
}

pub fn registration(opts: StatefulSetOptions) -> Registration {
    Registration::built(DECLARATION, Box::new(move |setup| init(opts, setup)))
}

/// Wires the controller to the shared caches and the runtime.
pub fn init(opts: StatefulSetOptions, setup: Setup) -> Result<Box<dyn Controller>, InitError> {
    // ST-10: claim volumes are part of a pod's identity.
    setup.informers.read_pod_fields(PodFields::VOLUMES);
    let sets = setup.informers.get::<StatefulSet>();
    sets.add_index(INDEX_NAMESPACE, by_namespace);
    let pods = setup.informers.get::<Pod>();
    pods.add_index(INDEX_CONTROLLER_UID, by_controller_uid);
    pods.add_index(INDEX_ORPHAN_NAMESPACE, orphan_by_namespace);
    let claims = setup.informers.get::<PersistentVolumeClaim>();
    let revisions = setup.informers.get::<ControllerRevision>();
    revisions.add_index(INDEX_CONTROLLER_UID, by_controller_uid);
    revisions.add_index(INDEX_ORPHAN_NAMESPACE, orphan_by_namespace);
    let mut wiring = setup.wiring();
    // ST-3: client-go's default controller rate limiter.
    let queue = wiring.queue(QUEUE, BackoffConfig::default());
    let ctl = Arc::new(sync::StatefulSetController::new(
        sync::Caches {
            sets: Arc::clone(&sets),
            pods: Arc::clone(&pods),
            claims,
            revisions,
        },
        Arc::clone(&queue),
        setup.ctx(metrics::Metrics::register(&setup.metrics)),
    ));
    // ST-44: upstream's counter, fed by the runtime next to pilothouse_stale_cache_skips.
    wiring.count_stale_skips_in(ctl.metrics.stale_skips.clone());
    // ST-2.
    wiring.map(&sets, &queue, handlers::set_keys);
    let (s, q) = (Arc::clone(&sets), Arc::clone(&queue));
    wiring.on_change(&pods, move |change| {
        for e in handlers::pod_keys(&s, change) {
            match e.after {
                None => q.add(e.key),
                Some(d) => q.add_after(e.key, d),
            }
        }
    });
    // On taking over, every set is synced.
    let (s, q) = (Arc::clone(&sets), Arc::clone(&queue));
    wiring.on_start(move || {
        for set in s.list() {
            q.add(object_key(set.as_ref()));
        }
    });
    wiring.workers(
        &queue,
        opts.concurrent_statefulset_syncs.max(1),
        move |key: String| {
            let ctl = Arc::clone(&ctl);
            async move { ctl.sync(&key).await }
        },
    );
    Ok(wiring.build())
}
