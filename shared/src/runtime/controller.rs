//! The seam between the runtime and a controller.
//!
//! A controller declares itself ([`Declaration`]: name, aliases, event source, default) and, at
//! start-up, its `init` receives a [`Setup`]. From it the controller takes the shared caches it
//! reads and the [`Writer`] it writes through, and builds its [`Wiring`]: queues with their
//! workers and sync function, change handlers that map an informer's changes to keys, what to
//! enqueue when this replica starts leading, and periodic tasks. The runtime owns the rest: the
//! leader gate (handlers, starters and periodic tasks act only while leading), workers, per-sync
//! metrics and panic containment, and draining on shutdown.

use crate::api::apierr::Classify;
use crate::api::ratelimit::BackoffConfig;
use crate::api::writer::Writer;
use crate::cache::informers::{Change, Informer, Informers, Watched};
use crate::meta::clock::Clock;
use crate::metrics::{
    ControllerLabel, GroupResourceLabels, Metrics, StaleSkipLabels, SyncLabels, SyncResultLabels,
};
use crate::runtime::events::EventRecorder;
use crate::runtime::gates::FeatureGates;
use crate::runtime::queue::{Next, Queue, QueueKey};
use futures::FutureExt;
use futures::future::{BoxFuture, join_all};
use prometheus_client::metrics::{counter::Counter, family::Family};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

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

/// What a controller says about itself, before anything runs.
#[derive(Clone, Copy, Debug)]
pub struct Declaration {
    /// Canonical kube-controller-manager name (`--controllers`, user agent, metric label).
    pub name: &'static str,
    /// kube-controller-manager's aliases for `--controllers`.
    pub aliases: &'static [&'static str],
    /// The events' source component, upstream's name for it (usually `name`).
    pub event_source: &'static str,
    pub on_by_default: bool,
}

/// A controller Pilothouse hosts or plans to host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ControllerInfo {
    /// Canonical kube-controller-manager name, e.g. `job-controller`.
    pub name: &'static str,
    /// kube-controller-manager's aliases, e.g. `job`.
    pub aliases: &'static [&'static str],
    pub built: bool,
    pub on_by_default: bool,
}

/// Everything a controller may use while it sets up.
pub struct Setup {
    /// The controller's canonical name (user agent, event reporter, metric label).
    pub name: &'static str,
    /// The controller's own rate-limited, leadership-fenced writer.
    pub writer: Writer,
    pub informers: Arc<Informers>,
    pub metrics: Arc<Metrics>,
    /// Events reported under the declared event source.
    pub events: EventRecorder,
    pub gates: FeatureGates,
    /// Wall-clock time (the test kit's follows tokio's paused time).
    pub clock: Arc<dyn Clock>,
}

impl Setup {
    /// The controller's wiring, to be filled and returned by `init`.
    pub fn wiring(&self) -> Wiring {
        Wiring::new(self.name, Arc::clone(&self.metrics))
    }

    /// What the controller's syncs use besides their caches and queues, with the controller's
    /// own metrics (registered on `self.metrics` by the crate).
    pub fn ctx<M>(&self, metrics: M) -> Ctx<M> {
        Ctx {
            writer: self.writer.clone(),
            events: self.events.clone(),
            clock: Arc::clone(&self.clock),
            gates: self.gates,
            metrics,
        }
    }
}

/// The one context every controller is built from (`Setup::ctx`): its writer, its events, its
/// clock, the feature gates and its metrics. A controller's constructor takes its caches, its
/// queues, its options and this, never these one by one.
pub struct Ctx<M> {
    pub writer: Writer,
    pub events: EventRecorder,
    pub clock: Arc<dyn Clock>,
    pub gates: FeatureGates,
    pub metrics: M,
}

pub type InitFn = Box<dyn FnOnce(Setup) -> Result<Box<dyn Controller>, InitError> + Send>;

/// A controller in the catalogue: built ones carry their `init`.
pub struct Registration {
    pub declaration: Declaration,
    pub info: ControllerInfo,
    pub init: Option<InitFn>,
}

impl Registration {
    pub fn built(declaration: Declaration, init: InitFn) -> Self {
        Registration {
            declaration,
            info: info(&declaration, true),
            init: Some(init),
        }
    }
}

fn info(d: &Declaration, built: bool) -> ControllerInfo {
    ControllerInfo {
        name: d.name,
        aliases: d.aliases,
        built,
        on_by_default: d.on_by_default,
    }
}

/// Contains panics of a controller's handlers and periodic tasks the way `serve` contains a
/// sync's: logged, counted in `pilothouse_reconcile_panics_total`, and the watch or the timer
/// goes on (a panicking handler must not stop the shared cache that calls it).
struct Containment {
    controller: &'static str,
    what: &'static str,
    panics: Arc<crate::metrics::ReconcileMetrics>,
}

/// How long a panicked starter or task waits before its next try: 1 s, doubling, at most 60 s.
fn after_panics(panics: u32) -> Duration {
    Duration::from_secs(1u64 << panics.saturating_sub(1).min(6)).min(Duration::from_secs(60))
}

impl Containment {
    /// Runs `f`; `false` if it panicked (logged and counted).
    fn call(&self, f: impl FnOnce()) -> bool {
        match std::panic::catch_unwind(AssertUnwindSafe(f)) {
            Ok(()) => true,
            Err(panic) => {
                self.panicked(&*panic);
                false
            }
        }
    }

    fn panicked(&self, panic: &(dyn std::any::Any + Send)) {
        tracing::error!(
            controller = self.controller,
            panic = %panic_message(panic),
            "{} panicked", self.what
        );
        self.panics
            .panics
            .get_or_create(&ControllerLabel {
                controller: self.controller.to_string(),
            })
            .inc();
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

type Starter = Arc<dyn Fn() + Send + Sync>;
type Serve = Box<dyn FnOnce(CancellationToken) -> BoxFuture<'static, ()> + Send>;

/// The leader gate: handlers, starters and periodic tasks act only while it is open.
#[derive(Clone, Debug, Default)]
pub struct Gate(Arc<AtomicBool>);

impl Gate {
    pub fn is_open(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    fn set(&self, open: bool) {
        self.0.store(open, Ordering::Release);
    }

    /// An open gate, for tests that drive handlers directly.
    pub fn open() -> Gate {
        let g = Gate::default();
        g.set(true);
        g
    }
}

/// What a controller hands the runtime: its queues and workers, handlers, starters and periodic
/// tasks. Built in `init`, run by [`Controller::run`] once this replica leads.
pub struct Wiring {
    name: &'static str,
    metrics: Arc<Metrics>,
    gate: Gate,
    starters: Vec<Starter>,
    serves: Vec<Serve>,
    spawned: Spawner,
    upstream_stale: UpstreamStale,
    /// Tasks registered so far (each is named by its number on `/readyz`).
    tasks: usize,
}

/// A controller's upstream-named stale-skip counter, if it has one (see
/// [`Wiring::count_stale_skips_in`]).
type UpstreamStale = Arc<std::sync::OnceLock<Family<GroupResourceLabels, Counter>>>;

/// Fire-and-track work of a controller (e.g. one write per node, so that none waits behind
/// another's retries): each task's panic is contained and counted as a handler's is, and the
/// controller's stop waits for every task still running, as it waits for its workers.
#[derive(Clone)]
pub struct Spawner {
    live: Arc<std::sync::atomic::AtomicUsize>,
    idle: Arc<tokio::sync::Notify>,
    contain: Arc<Containment>,
}

impl Spawner {
    pub fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        self.live.fetch_add(1, Ordering::AcqRel);
        let this = self.clone();
        tokio::spawn(async move {
            if let Err(panic) = AssertUnwindSafe(task).catch_unwind().await {
                this.contain.panicked(&*panic);
            }
            if this.live.fetch_sub(1, Ordering::AcqRel) == 1 {
                this.idle.notify_waiters();
            }
        });
    }

    /// Returns once no spawned task is running.
    async fn drained(&self) {
        loop {
            let idle = self.idle.notified();
            if self.live.load(Ordering::Acquire) == 0 {
                return;
            }
            idle.await;
        }
    }
}

impl Wiring {
    pub fn new(name: &'static str, metrics: Arc<Metrics>) -> Wiring {
        // The panics series exists at 0 from the start, so that an alert on its increase sees
        // the first panic (a series born at 1 has no increase) and a scrape lists it.
        let _ = metrics
            .reconcile()
            .panics
            .get_or_create(&crate::metrics::ControllerLabel {
                controller: name.to_string(),
            });
        let spawned = Spawner {
            live: Arc::default(),
            idle: Arc::default(),
            contain: Arc::new(Containment {
                controller: name,
                what: "spawned task",
                panics: metrics.reconcile(),
            }),
        };
        Wiring {
            name,
            metrics,
            gate: Gate::default(),
            starters: Vec::new(),
            serves: Vec::new(),
            spawned,
            upstream_stale: UpstreamStale::default(),
            tasks: 0,
        }
    }

    /// Counts each `Next::Stale` of this controller's workers also in `family`, upstream's
    /// per-controller counter (e.g. `job_controller_stale_sync_skips{group,resource}`), next to
    /// `pilothouse_stale_cache_skips_total`. Set once; a second family is ignored.
    pub fn count_stale_skips_in(&mut self, family: Family<GroupResourceLabels, Counter>) {
        let _ = self.upstream_stale.set(family);
    }

    /// The gate, for a controller's own timers that must act only while leading.
    pub fn gate(&self) -> Gate {
        self.gate.clone()
    }

    /// A work queue (its upstream name labels the `workqueue_*` metrics).
    pub fn queue<K: QueueKey>(&self, name: &str, backoff: BackoffConfig) -> Arc<Queue<K>> {
        Queue::new(name, backoff, &self.metrics)
    }

    /// Calls `handler` for each change of `informer`, only while leading. Handlers must not
    /// block: they map a change to keys (and may note what it tells, such as an observed
    /// creation), nothing more.
    pub fn on_change<K: Watched>(
        &mut self,
        informer: &Informer<K>,
        handler: impl Fn(&Change<K>) + Send + Sync + 'static,
    ) {
        let gate = self.gate.clone();
        let contain = self.containment("event handler");
        informer.on_change(move |change| {
            if gate.is_open() {
                contain.call(|| handler(change));
            }
        });
    }

    /// Calls `handler` for each change of `informer` on every replica, leading or not. Only for
    /// what upstream does in its event handlers regardless of leadership, such as counting a
    /// metric; such handlers must only count, never queue or write.
    pub fn on_change_every_replica<K: Watched>(
        &mut self,
        informer: &Informer<K>,
        handler: impl Fn(&Change<K>) + Send + Sync + 'static,
    ) {
        let contain = self.containment("event handler");
        informer.on_change(move |change| {
            contain.call(|| handler(change));
        });
    }

    fn containment(&self, what: &'static str) -> Containment {
        Containment {
            controller: self.name,
            what,
            panics: self.metrics.reconcile(),
        }
    }

    /// Queues the keys `keys` maps each change to (a pure function of the change), while
    /// leading.
    pub fn map<K: Watched, Q: QueueKey>(
        &mut self,
        informer: &Informer<K>,
        queue: &Arc<Queue<Q>>,
        keys: impl Fn(&Change<K>) -> Vec<Q> + Send + Sync + 'static,
    ) {
        let queue = Arc::clone(queue);
        self.on_change(informer, move |change| {
            for key in keys(change) {
                queue.add(key);
            }
        });
    }

    /// [`Self::map`] for a `keys` that needs the controller (an index lookup): the wiring holds
    /// it weakly, so a change arriving after the controller is gone maps to nothing.
    pub fn map_with<C, K, Q>(
        &mut self,
        informer: &Informer<K>,
        queue: &Arc<Queue<Q>>,
        ctl: &Arc<C>,
        keys: impl Fn(&C, &Change<K>) -> Vec<Q> + Send + Sync + 'static,
    ) where
        C: Send + Sync + 'static,
        K: Watched,
        Q: QueueKey,
    {
        let weak = Arc::downgrade(ctl);
        self.map(informer, queue, move |change| match weak.upgrade() {
            Some(c) => keys(&c, change),
            None => Vec::new(),
        });
    }

    /// [`Self::on_change`] for a handler that needs the controller, held weakly.
    pub fn on_change_with<C, K>(
        &mut self,
        informer: &Informer<K>,
        ctl: &Arc<C>,
        handler: impl Fn(&C, &Change<K>) + Send + Sync + 'static,
    ) where
        C: Send + Sync + 'static,
        K: Watched,
    {
        let weak = Arc::downgrade(ctl);
        self.on_change(informer, move |change| {
            if let Some(c) = weak.upgrade() {
                handler(&c, change);
            }
        });
    }

    /// The controller's handle for fire-and-track tasks (see [`Spawner`]).
    pub fn spawner(&self) -> Spawner {
        self.spawned.clone()
    }

    /// Runs once each time this replica starts leading, after the caches have synced and before
    /// workers start: typically the initial enqueue of every object.
    ///
    /// A starter that panics is counted, reported on `/readyz`, and tried again with backoff
    /// (1 s doubling to 60 s) until it completes, while the workers serve what is queued: it
    /// must therefore be safe to run twice (enqueueing is).
    pub fn on_start(&mut self, starter: impl Fn() + Send + Sync + 'static) {
        self.starters.push(Arc::new(starter));
    }

    /// `workers` workers serve `queue` with `sync` until shutdown; the runtime keeps per-sync
    /// metrics, retries errors with the queue's per-key backoff and contains panics.
    pub fn workers<K, F, Fut, E>(&mut self, queue: &Arc<Queue<K>>, workers: usize, sync: F)
    where
        K: QueueKey,
        F: Fn(K) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Next, E>> + Send + 'static,
        E: std::fmt::Display + Classify + Send + 'static,
    {
        let queue = Arc::clone(queue);
        let name = self.name;
        let metrics = Arc::clone(&self.metrics);
        let upstream_stale = Arc::clone(&self.upstream_stale);
        self.serves.push(Box::new(move |stop: CancellationToken| {
            async move {
                let q = Arc::clone(&queue);
                tokio::spawn(async move {
                    stop.cancelled().await;
                    q.shut_down();
                });
                serve(queue, workers, name, &metrics, upstream_stale, sync).await;
            }
            .boxed()
        }));
    }

    /// Runs `task` every `period` while leading (the first run one period after the start).
    pub fn every<F, Fut>(&mut self, period: Duration, task: F)
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        // A zero period (a flag set to 0) would make tokio's interval panic.
        let period = period.max(Duration::from_millis(1));
        let contain = self.containment("periodic task");
        self.serves.push(Box::new(move |stop: CancellationToken| {
            async move {
                let mut tick = tokio::time::interval_at(
                    crate::meta::clock::far_or(Instant::now(), period),
                    period,
                );
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        // A panicking run is counted and the next tick runs again.
                        _ = tick.tick() => {
                            let run = AssertUnwindSafe(async { task().await }).catch_unwind().await;
                            if let Err(panic) = run {
                                contain.panicked(&*panic);
                            }
                        }
                    }
                }
            }
            .boxed()
        }));
    }

    /// A long-running task of the controller's own (e.g. a timer loop) that ends at `stop`.
    /// One that panics is counted, reported on `/readyz` while it waits, and started again
    /// with backoff (1 s doubling to 60 s).
    pub fn task<F, Fut>(&mut self, task: F)
    where
        F: Fn(CancellationToken) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let contain = self.containment("task");
        let metrics = Arc::clone(&self.metrics);
        let part = format!("task {}", self.tasks);
        self.tasks = self.tasks.saturating_add(1);
        self.serves.push(Box::new(move |stop: CancellationToken| {
            async move {
                for panics in 1u32.. {
                    let run = AssertUnwindSafe(async { task(stop.clone()).await })
                        .catch_unwind()
                        .await;
                    let Err(panic) = run else { break };
                    contain.panicked(&*panic);
                    let wait = after_panics(panics);
                    metrics.troubles().set(
                        contain.controller,
                        &part,
                        format!("panicked ({panics} so far); restarting in {wait:?}"),
                    );
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = tokio::time::sleep(wait) => {}
                    }
                    metrics.troubles().clear(contain.controller, &part);
                }
                // Stopped while waiting: a standby reports nothing of this.
                metrics.troubles().clear(contain.controller, &part);
            }
            .boxed()
        }));
    }

    /// [`Self::workers`] with the controller passed to each sync: `sync(ctl, key)`.
    pub fn workers_with<C, K, F, Fut, E>(
        &mut self,
        queue: &Arc<Queue<K>>,
        workers: usize,
        ctl: &Arc<C>,
        sync: F,
    ) where
        C: Send + Sync + 'static,
        K: QueueKey,
        F: Fn(Arc<C>, K) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Next, E>> + Send + 'static,
        E: std::fmt::Display + Classify + Send + 'static,
    {
        let ctl = Arc::clone(ctl);
        self.workers(queue, workers, move |key| sync(Arc::clone(&ctl), key));
    }

    pub fn build(self) -> Box<dyn Controller> {
        Box::new(self)
    }
}

impl Controller for Wiring {
    fn run(self: Box<Self>, stop: CancellationToken) -> BoxFuture<'static, ()> {
        async move {
            let contain = Arc::new(self.containment("starter"));
            let Wiring {
                gate,
                starters,
                serves,
                spawned,
                metrics,
                ..
            } = *self;
            gate.set(true);
            let mut running = Vec::new();
            for (n, start) in starters.into_iter().enumerate() {
                if !contain.call(|| start()) {
                    let part = format!("starter {n}");
                    let retry = retry_starter(
                        start,
                        part,
                        Arc::clone(&contain),
                        metrics.clone(),
                        stop.clone(),
                    );
                    running.push(tokio::spawn(retry));
                }
            }
            running.extend(
                serves
                    .into_iter()
                    .map(|serve| tokio::spawn(serve(stop.clone()))),
            );
            join_all(running).await;
            spawned.drained().await;
            gate.set(false);
        }
        .boxed()
    }
}

/// Tries a panicked starter again with backoff until it completes or the controller stops; it
/// is reported on `/readyz` meanwhile.
async fn retry_starter(
    start: Starter,
    part: String,
    contain: Arc<Containment>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    for panics in 1u32.. {
        let wait = after_panics(panics);
        metrics.troubles().set(
            contain.controller,
            &part,
            format!("panicked ({panics} so far); trying again in {wait:?}"),
        );
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(wait) => {}
        }
        if contain.call(|| start()) {
            break;
        }
    }
    metrics.troubles().clear(contain.controller, &part);
}

/// Runs `workers` workers over `queue` until it shuts down, each calling `sync` for a key.
/// An error re-queues the key with its per-key backoff; success forgets the failures; a panic is
/// logged with the key, counted, and retried like an error. Returns once every worker has
/// finished its current key.
pub async fn serve<K, F, Fut, E>(
    queue: Arc<Queue<K>>,
    workers: usize,
    controller: &'static str,
    metrics: &Metrics,
    upstream_stale: UpstreamStale,
    sync: F,
) where
    K: QueueKey,
    F: Fn(K) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Next, E>> + Send + 'static,
    E: std::fmt::Display + Classify + Send + 'static,
{
    let sync = Arc::new(sync);
    let reconcile = metrics.reconcile();
    let stale_skips = metrics.stale_skips();
    let upstream_stale = upstream_stale.get().cloned();
    let labels = SyncLabels {
        controller: controller.to_string(),
        queue: queue.name().to_string(),
    };
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..workers.max(1) {
        let queue = Arc::clone(&queue);
        let sync = Arc::clone(&sync);
        let reconcile = Arc::clone(&reconcile);
        let labels = labels.clone();
        let stale_skips = stale_skips.clone();
        let upstream_stale = upstream_stale.clone();
        set.spawn(async move {
            while let Some(key) = queue.get().await {
                let span = tracing::info_span!("sync", controller, queue = queue.name(), key = ?key);
                let started = Instant::now();
                // The call itself inside the guard: a sync that panics before its first await
                // must not end the worker with the key still marked processing.
                let result = AssertUnwindSafe(async { sync(key.clone()).await }.instrument(span.clone()))
                    .catch_unwind()
                    .await;
                reconcile
                    .duration
                    .get_or_create(&labels)
                    .observe(started.elapsed().as_secs_f64());
                let outcome = match result {
                    Ok(Ok(Next::Done)) => {
                        queue.forget(&key);
                        "success"
                    }
                    Ok(Ok(Next::After(d))) => {
                        queue.forget(&key);
                        queue.add_after(key.clone(), d);
                        "requeue"
                    }
                    Ok(Ok(Next::Stale(behind))) => {
                        tracing::debug!(
                            parent: &span,
                            resource = behind.resource,
                            wrote = behind.wrote,
                            seen = behind.seen,
                            "cache behind this replica's writes; looking again soon"
                        );
                        stale_skips
                            .get_or_create(&StaleSkipLabels {
                                controller: controller.to_string(),
                                resource: behind.resource.to_string(),
                            })
                            .inc();
                        if let Some(family) = &upstream_stale {
                            family
                                .get_or_create(&GroupResourceLabels {
                                    group: behind.group.to_string(),
                                    resource: behind.resource.to_string(),
                                })
                                .inc();
                        }
                        queue.add_after(key.clone(), crate::runtime::queue::STALE_RECHECK);
                        "stale"
                    }
                    Ok(Err(e)) => {
                        let _g = span.enter();
                        let retries = queue.num_requeues(&key);
                        tracing::warn!(retries, error = %e, "sync failed; retrying with backoff");
                        queue.add_rate_limited(key.clone());
                        e.kind().label()
                    }
                    Err(panic) => {
                        let _g = span.enter();
                        let what = panic_message(&*panic);
                        tracing::error!(panic = %what, "sync panicked; retrying with backoff");
                        reconcile
                            .panics
                            .get_or_create(&ControllerLabel {
                                controller: controller.to_string(),
                            })
                            .inc();
                        queue.add_rate_limited(key.clone());
                        "panic"
                    }
                };
                let elapsed = started.elapsed();
                tracing::debug!(parent: &span, result = outcome, elapsed_ms = elapsed.as_millis() as u64, "synced");
                reconcile
                    .results
                    .get_or_create(&SyncResultLabels {
                        controller: labels.controller.clone(),
                        queue: labels.queue.clone(),
                        result: outcome.to_string(),
                    })
                    .inc();
                queue.done(&key);
            }
        });
    }
    while set.join_next().await.is_some() {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::apierr::ErrorKind;
    use crate::cache::written::Behind;
    use std::sync::atomic::AtomicUsize;

    #[derive(Debug)]
    struct Boom;
    impl std::fmt::Display for Boom {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("boom")
        }
    }
    impl Classify for Boom {
        fn kind(&self) -> ErrorKind {
            ErrorKind::Conflict
        }
    }

    /// A sync that finds its caches behind its own writes returns `Next::Stale`: the runtime
    /// counts it by resource and looks again after `STALE_RECHECK`, with no backoff (a stale
    /// cache is no failure: the key's requeue count stays 0).
    #[tokio::test(start_paused = true)]
    async fn a_stale_sync_is_counted_and_looked_at_again_without_backoff() {
        let metrics = Metrics::new();
        let mut wiring = Wiring::new("test-controller", Arc::clone(&metrics));
        let queue: Arc<Queue<String>> = wiring.queue(
            "t",
            BackoffConfig::exponential(Duration::from_secs(10), Duration::from_secs(100)),
        );
        let calls = Arc::new(AtomicUsize::new(0));
        let c = Arc::clone(&calls);
        wiring.workers(&queue, 1, move |_key: String| {
            let c = Arc::clone(&c);
            async move {
                if c.fetch_add(1, Ordering::SeqCst) < 2 {
                    return Ok::<Next, Boom>(Next::Stale(Behind {
                        group: "",
                        resource: "pods",
                        wrote: 2,
                        seen: 1,
                    }));
                }
                Ok(Next::Done)
            }
        });
        let stop = CancellationToken::new();
        let run = tokio::spawn(wiring.build().run(stop.clone()));
        queue.add("j".into());
        let started = Instant::now();
        while calls.load(Ordering::SeqCst) < 3 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(1),
            "two rechecks, no 10 s backoff: {took:?}"
        );
        assert!(took >= 2 * crate::runtime::queue::STALE_RECHECK, "{took:?}");
        assert_eq!(queue.num_requeues(&"j".to_string()), 0);
        stop.cancel();
        run.await.unwrap();
        let text = metrics.encode();
        assert!(
            text.contains(
                "pilothouse_stale_cache_skips_total{controller=\"test-controller\",resource=\"pods\"} 2"
            ),
            "{text}"
        );
        assert!(text.contains("result=\"stale\""), "{text}");
    }

    /// Spawned work is contained (a panic is counted, the controller goes on) and the
    /// controller's stop waits for what is still running.
    #[tokio::test(start_paused = true)]
    async fn spawned_tasks_are_contained_and_drained_at_stop() {
        let metrics = Metrics::new();
        let wiring = Wiring::new("test-controller", Arc::clone(&metrics));
        let spawner = wiring.spawner();
        let stop = CancellationToken::new();
        let run = tokio::spawn(wiring.build().run(stop.clone()));
        let finished = Arc::new(AtomicBool::new(false));
        let f = Arc::clone(&finished);
        spawner.spawn(async { panic!("one node's write") });
        spawner.spawn(async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            f.store(true, Ordering::SeqCst);
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        stop.cancel();
        run.await.unwrap();
        assert!(
            finished.load(Ordering::SeqCst),
            "stop waited for the running task"
        );
        let text = metrics.encode();
        assert!(
            text.contains("pilothouse_reconcile_panics_total{controller=\"test-controller\"} 1"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_panicking_key_is_counted_retried_and_stalls_no_other() {
        let metrics = Metrics::new();
        let mut wiring = Wiring::new("test-controller", Arc::clone(&metrics));
        // The series is there at 0 before any panic (alerts on its increase need the 0).
        let text = metrics.encode();
        assert!(
            text.contains("pilothouse_reconcile_panics_total{controller=\"test-controller\"} 0"),
            "{text}"
        );
        let queue: Arc<Queue<String>> = wiring.queue(
            "t",
            BackoffConfig::exponential(Duration::from_millis(1), Duration::from_millis(4)),
        );
        let calls = Arc::new(AtomicUsize::new(0));
        let good = Arc::new(AtomicUsize::new(0));
        let (c, g) = (Arc::clone(&calls), Arc::clone(&good));
        wiring.workers(&queue, 1, move |key: String| {
            let (c, g) = (Arc::clone(&c), Arc::clone(&g));
            async move {
                if key == "bad" {
                    let n = c.fetch_add(1, Ordering::SeqCst);
                    if n < 2 {
                        panic!("bad input");
                    }
                    return Err::<Next, Boom>(Boom);
                }
                g.fetch_add(1, Ordering::SeqCst);
                Ok(Next::Done)
            }
        });
        let stop = CancellationToken::new();
        let run = tokio::spawn(wiring.build().run(stop.clone()));
        queue.add("bad".into());
        queue.add("good".into());
        for _ in 0..200 {
            if calls.load(Ordering::SeqCst) >= 3 && good.load(Ordering::SeqCst) == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stop.cancel();
        run.await.unwrap();
        assert_eq!(good.load(Ordering::SeqCst), 1);
        assert!(calls.load(Ordering::SeqCst) >= 3);
        let text = metrics.encode();
        assert!(
            text.contains("pilothouse_reconcile_panics_total{controller=\"test-controller\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("result=\"conflict\""),
            "errors are labelled by kind: {text}"
        );
        assert!(text.contains("result=\"success\""), "{text}");
    }

    /// A sync that panics before its first await, a starter and a task each
    /// panic twice; each is counted, the key is served again, the starter is tried again and
    /// the task restarted with backoff, `/readyz`'s troubles say so meanwhile and clear after.
    #[tokio::test(start_paused = true)]
    async fn panics_of_starters_tasks_and_sync_calls_are_contained_and_retried() {
        let metrics = Metrics::new();
        let mut wiring = Wiring::new("test-controller", Arc::clone(&metrics));
        let queue: Arc<Queue<String>> = wiring.queue(
            "t",
            BackoffConfig::exponential(Duration::from_millis(1), Duration::from_millis(4)),
        );
        let (syncs, starts, tasks) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
        );
        let c = Arc::clone(&syncs);
        wiring.workers(&queue, 1, move |_key: String| {
            // Before any future exists: the worker itself would die here.
            assert!(c.fetch_add(1, Ordering::SeqCst) >= 2, "sync call panics");
            async { Ok::<Next, Boom>(Next::Done) }
        });
        let (c, q) = (Arc::clone(&starts), Arc::clone(&queue));
        wiring.on_start(move || {
            assert!(c.fetch_add(1, Ordering::SeqCst) >= 2, "starter panics");
            q.add("k".into());
        });
        let c = Arc::clone(&tasks);
        wiring.task(move |stop| {
            let c = Arc::clone(&c);
            async move {
                assert!(c.fetch_add(1, Ordering::SeqCst) >= 2, "task panics");
                stop.cancelled().await;
            }
        });
        let stop = CancellationToken::new();
        let run = tokio::spawn(wiring.build().run(stop.clone()));
        tokio::time::sleep(Duration::from_millis(500)).await;
        let troubles = metrics.troubles().list();
        assert!(
            troubles
                .iter()
                .any(|t| t.starts_with("test-controller: starter 0 panicked (1 so far)"))
                && troubles
                    .iter()
                    .any(|t| t.starts_with("test-controller: task 0 panicked (1 so far)")),
            "{troubles:?}"
        );
        // 1 s then 2 s of backoff: both succeed on their third try.
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert_eq!(starts.load(Ordering::SeqCst), 3);
        assert_eq!(tasks.load(Ordering::SeqCst), 3);
        assert_eq!(
            syncs.load(Ordering::SeqCst),
            3,
            "the key was served until it synced"
        );
        assert!(
            metrics.troubles().list().is_empty(),
            "{:?}",
            metrics.troubles().list()
        );
        stop.cancel();
        run.await.unwrap();
        let text = metrics.encode();
        assert!(
            text.contains("pilothouse_reconcile_panics_total{controller=\"test-controller\"} 6"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn workers_never_overlap_on_one_key_and_retry_errors() {
        let metrics = Metrics::new();
        let q: Arc<Queue<String>> = Queue::new(
            "overlap",
            BackoffConfig::exponential(Duration::from_millis(1), Duration::from_millis(4)),
            &metrics,
        );
        let running = Arc::new(AtomicUsize::new(0));
        let calls = Arc::new(AtomicUsize::new(0));
        // Recorded, not asserted inside the sync: `serve` contains a sync's panics.
        let overlapped = Arc::new(AtomicBool::new(false));
        let (r, c, o) = (
            Arc::clone(&running),
            Arc::clone(&calls),
            Arc::clone(&overlapped),
        );
        let q2 = Arc::clone(&q);
        let workers = serve(
            Arc::clone(&q),
            4,
            "c",
            &metrics,
            UpstreamStale::default(),
            move |_k: String| {
                let (r, c, o, q2) = (
                    Arc::clone(&r),
                    Arc::clone(&c),
                    Arc::clone(&o),
                    Arc::clone(&q2),
                );
                async move {
                    if r.fetch_add(1, Ordering::SeqCst) != 0 {
                        o.store(true, Ordering::SeqCst);
                    }
                    // Re-adding while processing must not start a concurrent sync.
                    q2.add("k".into());
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    r.fetch_sub(1, Ordering::SeqCst);
                    let n = c.fetch_add(1, Ordering::SeqCst);
                    if n < 3 { Err(Boom) } else { Ok(Next::Done) }
                }
            },
        );
        let (q3, c) = (Arc::clone(&q), Arc::clone(&calls));
        let driver = async move {
            q3.add("k".into());
            for _ in 0..200 {
                if c.load(Ordering::SeqCst) >= 6 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            q3.shut_down();
        };
        tokio::join!(workers, driver);
        assert!(calls.load(Ordering::SeqCst) >= 6);
        assert!(!overlapped.load(Ordering::SeqCst), "two workers on one key");
        assert!(
            !metrics.encode().contains("result=\"panic\""),
            "{}",
            metrics.encode()
        );
    }

    fn config_map(name: &str) -> k8s_openapi::api::core::v1::ConfigMap {
        k8s_openapi::api::core::v1::ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn informers() -> Arc<Informers> {
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        Informers::new(
            kube::Client::try_from(config).unwrap(),
            CancellationToken::new(),
        )
    }

    #[tokio::test]
    async fn handlers_starters_and_tasks_act_only_while_leading() {
        use k8s_openapi::api::core::v1::ConfigMap;
        let informers = informers();
        let cms = informers.get::<ConfigMap>();
        let mut wiring = Wiring::new("c", Metrics::new());
        let gate = wiring.gate();
        assert!(!gate.is_open());
        let seen = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let s = Arc::clone(&seen);
        wiring.on_change(&cms, move |change| {
            s.lock()
                .unwrap()
                .push(change.object().metadata.name.clone().unwrap());
        });
        let everywhere = Arc::new(AtomicUsize::new(0));
        let e = Arc::clone(&everywhere);
        wiring.on_change_every_replica(&cms, move |_| {
            e.fetch_add(1, Ordering::SeqCst);
        });
        let started = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&started);
        wiring.on_start(move || s.store(true, Ordering::SeqCst));
        let task_saw_open = Arc::new(AtomicBool::new(false));
        let (g2, t) = (gate.clone(), Arc::clone(&task_saw_open));
        wiring.task(move |stop| {
            let (g2, t) = (g2.clone(), Arc::clone(&t));
            async move {
                t.store(g2.is_open(), Ordering::SeqCst);
                stop.cancelled().await;
            }
        });
        // Not leading yet: only the every-replica handler sees the change.
        cms.testkit_apply(config_map("before"));
        assert!(seen.lock().unwrap().is_empty());
        assert_eq!(everywhere.load(Ordering::SeqCst), 1);
        assert!(!started.load(Ordering::SeqCst));

        let stop = CancellationToken::new();
        let run = tokio::spawn(wiring.build().run(stop.clone()));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(started.load(Ordering::SeqCst));
        assert!(
            task_saw_open.load(Ordering::SeqCst),
            "tasks run only while leading"
        );
        assert!(gate.is_open());
        cms.testkit_apply(config_map("while-leading"));
        assert_eq!(*seen.lock().unwrap(), ["while-leading"]);

        stop.cancel();
        run.await.unwrap();
        assert!(!gate.is_open(), "the gate closes when the controller stops");
        cms.testkit_apply(config_map("after"));
        assert_eq!(*seen.lock().unwrap(), ["while-leading"]);
        assert_eq!(everywhere.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_panicking_handler_or_periodic_task_is_contained_and_counted() {
        use k8s_openapi::api::core::v1::ConfigMap;
        let informers = informers();
        let cms = informers.get::<ConfigMap>();
        let metrics = Metrics::new();
        let mut wiring = Wiring::new("test-controller", Arc::clone(&metrics));
        let later = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        wiring.on_change(&cms, |change| {
            if change.object().metadata.name.as_deref() == Some("bad") {
                panic!("bad input");
            }
        });
        let l = Arc::clone(&later);
        wiring.on_change(&cms, move |change| {
            l.lock()
                .unwrap()
                .push(change.object().metadata.name.clone().unwrap());
        });
        let ticks = Arc::new(AtomicUsize::new(0));
        let t = Arc::clone(&ticks);
        wiring.every(Duration::from_millis(5), move || {
            // The first run panics before its future exists, the second inside it.
            let n = t.fetch_add(1, Ordering::SeqCst);
            assert!(n != 0, "first tick");
            async move { assert!(n != 1, "second tick") }
        });
        let stop = CancellationToken::new();
        let run = tokio::spawn(wiring.build().run(stop.clone()));
        tokio::time::sleep(Duration::from_millis(1)).await;
        cms.testkit_apply(config_map("bad"));
        cms.testkit_apply(config_map("good"));
        for _ in 0..200 {
            if ticks.load(Ordering::SeqCst) >= 4 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stop.cancel();
        run.await.unwrap();
        assert_eq!(*later.lock().unwrap(), ["bad", "good"]);
        assert!(ticks.load(Ordering::SeqCst) >= 4, "the timer goes on");
        let text = metrics.encode();
        assert!(
            text.contains("pilothouse_reconcile_panics_total{controller=\"test-controller\"} 3"),
            "{text}"
        );
    }
}
