//! A work queue with client-go's guarantees: a key is queued at most once (dirty set), is never
//! handed to two workers at once (processing set; a key re-added while processing is queued again
//! when `done` is called), retries back off per key, delayed adds keep the earliest time, and the
//! `workqueue_*` metrics are kept under the queue's upstream name.

use crate::api::ratelimit::{BackoffConfig, ItemBackoff};
use crate::metrics::{Metrics, NameLabel, WorkqueueMetrics};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::meta::clock::far_or;

pub trait QueueKey: Clone + Eq + Hash + Ord + Debug + Send + Sync + 'static {}
impl<T: Clone + Eq + Hash + Ord + Debug + Send + Sync + 'static> QueueKey for T {}

pub struct Queue<K> {
    name: String,
    state: Mutex<State<K>>,
    /// Wakes workers waiting in `get`.
    ready: Notify,
    /// Wakes the delay task when an earlier deadline arrives, and everything on shutdown.
    timer: Notify,
    metrics: Arc<WorkqueueMetrics>,
    label: NameLabel,
}

struct State<K> {
    queue: VecDeque<K>,
    dirty: HashSet<K>,
    /// Keys being processed, with the time processing started.
    processing: HashMap<K, Instant>,
    /// When each queued key was added (for queue_duration).
    added_at: HashMap<K, Instant>,
    /// Earliest pending time per delayed key; the heap may hold stale entries.
    waiting: HashMap<K, Instant>,
    heap: BinaryHeap<Reverse<(Instant, K)>>,
    backoff: ItemBackoff<K>,
    shutting_down: bool,
}

impl<K: QueueKey> Queue<K> {
    pub fn new(name: &str, backoff: BackoffConfig, metrics: &Metrics) -> Arc<Self> {
        let q = Arc::new(Queue {
            name: name.to_string(),
            state: Mutex::new(State {
                queue: VecDeque::new(),
                dirty: HashSet::new(),
                processing: HashMap::new(),
                added_at: HashMap::new(),
                waiting: HashMap::new(),
                heap: BinaryHeap::new(),
                backoff: ItemBackoff::new(backoff),
                shutting_down: false,
            }),
            ready: Notify::new(),
            timer: Notify::new(),
            metrics: metrics.workqueue(),
            label: NameLabel {
                name: name.to_string(),
            },
        });
        // Make the series exist from the start, as client-go does.
        q.metrics.depth.get_or_create(&q.label).set(0);
        q.metrics.adds.get_or_create(&q.label).inc_by(0);
        q.metrics.retries.get_or_create(&q.label).inc_by(0);
        tokio::spawn(Arc::clone(&q).delay_loop());
        tokio::spawn(Arc::clone(&q).gauge_loop());
        q
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<K>> {
        crate::lock(&self.state)
    }

    /// Queues `key` now unless it is queued already.
    pub fn add(&self, key: K) {
        let mut s = self.lock();
        self.add_locked(&mut s, key);
    }

    fn add_locked(&self, s: &mut State<K>, key: K) {
        if s.shutting_down || s.dirty.contains(&key) {
            return;
        }
        self.metrics.adds.get_or_create(&self.label).inc();
        s.dirty.insert(key.clone());
        if s.processing.contains_key(&key) {
            // Picked up again by `done`.
            return;
        }
        s.added_at.insert(key.clone(), Instant::now());
        s.queue.push_back(key);
        self.metrics
            .depth
            .get_or_create(&self.label)
            .set(s.queue.len() as i64);
        self.ready.notify_one();
    }

    /// Queues `key` after `delay`; of several pending delays the earliest wins. A delay past
    /// what an `Instant` can hold (a user's int64 seconds) is capped at [`crate::meta::clock::FAR_FUTURE`].
    pub fn add_after(&self, key: K, delay: Duration) {
        if delay.is_zero() {
            return self.add(key);
        }
        let at = far_or(Instant::now(), delay);
        let mut s = self.lock();
        if s.shutting_down {
            return;
        }
        match s.waiting.get(&key) {
            Some(existing) if *existing <= at => return,
            _ => {}
        }
        s.waiting.insert(key.clone(), at);
        let earliest = s.heap.peek().map(|Reverse((t, _))| *t);
        s.heap.push(Reverse((at, key)));
        if earliest.is_none_or(|e| at < e) {
            self.timer.notify_one();
        }
    }

    /// Queues `key` after its per-key backoff (one more failure counted).
    pub fn add_rate_limited(&self, key: K) {
        let delay = {
            let mut s = self.lock();
            s.backoff.when(&key)
        };
        self.metrics.retries.get_or_create(&self.label).inc();
        self.add_after(key, delay);
    }

    /// Resets `key`'s failure count (call after a successful sync).
    pub fn forget(&self, key: &K) {
        self.lock().backoff.forget(key);
    }

    pub fn num_requeues(&self, key: &K) -> u32 {
        self.lock().backoff.retries(key)
    }

    pub fn len(&self) -> usize {
        self.lock().queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The next key to process, or `None` once the queue shuts down. Every key returned must be
    /// handed back with [`Queue::done`].
    pub async fn get(&self) -> Option<K> {
        loop {
            let notified = self.ready.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut s = self.lock();
                if s.shutting_down {
                    // Stop intake at once: queued keys are left for the next leader.
                    self.ready.notify_one();
                    return None;
                }
                if let Some(key) = s.queue.pop_front() {
                    let now = Instant::now();
                    self.metrics
                        .depth
                        .get_or_create(&self.label)
                        .set(s.queue.len() as i64);
                    if let Some(t) = s.added_at.remove(&key) {
                        self.metrics
                            .queue_duration
                            .get_or_create(&self.label)
                            .observe(now.duration_since(t).as_secs_f64());
                    }
                    s.dirty.remove(&key);
                    s.processing.insert(key.clone(), now);
                    if !s.queue.is_empty() {
                        self.ready.notify_one();
                    }
                    return Some(key);
                }
            }
            notified.await;
        }
    }

    /// Marks `key` processed; if it was added meanwhile it is queued again.
    pub fn done(&self, key: &K) {
        let mut s = self.lock();
        if let Some(start) = s.processing.remove(key) {
            self.metrics
                .work_duration
                .get_or_create(&self.label)
                .observe(start.elapsed().as_secs_f64());
        }
        if s.dirty.contains(key) && !s.shutting_down {
            s.added_at.insert(key.clone(), Instant::now());
            s.queue.push_back(key.clone());
            self.metrics
                .depth
                .get_or_create(&self.label)
                .set(s.queue.len() as i64);
            self.ready.notify_one();
        }
    }

    /// Stops handing out keys; workers finish the key they hold and see `None` next.
    pub fn shut_down(&self) {
        self.lock().shutting_down = true;
        self.ready.notify_waiters();
        self.ready.notify_one();
        self.timer.notify_one();
    }

    pub fn is_shutting_down(&self) -> bool {
        self.lock().shutting_down
    }

    async fn delay_loop(self: Arc<Self>) {
        loop {
            let notified = self.timer.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let next = {
                let mut s = self.lock();
                if s.shutting_down {
                    return;
                }
                let now = Instant::now();
                while let Some(Reverse((t, _))) = s.heap.peek() {
                    if *t > now {
                        break;
                    }
                    let Reverse((t, key)) = s.heap.pop().expect("peeked");
                    // Stale heap entries (superseded by an earlier time) are skipped.
                    if s.waiting.get(&key) == Some(&t) {
                        s.waiting.remove(&key);
                        self.add_locked(&mut s, key);
                    }
                }
                s.heap.peek().map(|Reverse((t, _))| *t)
            };
            match next {
                Some(t) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(t) => {}
                        _ = &mut notified => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Keeps the two "work in progress" gauges current, every 500 ms as client-go does.
    async fn gauge_loop(self: Arc<Self>) {
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        loop {
            tick.tick().await;
            let (total, longest, done) = {
                let s = self.lock();
                let now = Instant::now();
                let ages = s
                    .processing
                    .values()
                    .map(|t| now.duration_since(*t).as_secs_f64());
                let (total, longest) =
                    ages.fold((0.0, 0.0f64), |(sum, max), a| (sum + a, max.max(a)));
                (total, longest, s.shutting_down && s.processing.is_empty())
            };
            self.metrics
                .unfinished_work
                .get_or_create(&self.label)
                .set(total);
            self.metrics
                .longest_running
                .get_or_create(&self.label)
                .set(longest);
            if done {
                return;
            }
        }
    }
}

use crate::cache::written::Behind;

/// What a sync asks the queue to do with its key next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Nothing until an event queues the key again.
    Done,
    /// Sync again after this long (success: the failure count is reset).
    After(Duration),
    /// The sync did nothing: a cache does not yet show this replica's own writes for the key
    /// (JR-8, ST-44, ES-15, MR-7; [`crate::cache::written`]). The runtime counts it in
    /// `pilothouse_stale_cache_skips_total{controller,resource}` (and the controller's
    /// upstream-named counter, if it has one) and runs the key again when the confirming watch
    /// event queues it, or after [`STALE_RECHECK`] at the latest; no backoff, as nothing failed.
    Stale(Behind),
}

/// The longest a sync that found its caches behind its own writes waits before it looks again
/// (the watch event that confirms the write usually queues it sooner).
pub const STALE_RECHECK: Duration = Duration::from_millis(100);

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(name: &str) -> Arc<Queue<String>> {
        Queue::new(
            name,
            BackoffConfig::exponential(Duration::from_millis(10), Duration::from_millis(80)),
            &Metrics::default(),
        )
    }

    #[tokio::test]
    async fn dedups_queued_keys() {
        let q = queue("t");
        q.add("a".into());
        q.add("a".into());
        q.add("b".into());
        assert_eq!(q.len(), 2);
        assert_eq!(q.get().await.as_deref(), Some("a"));
        assert_eq!(q.get().await.as_deref(), Some("b"));
    }

    #[tokio::test]
    async fn key_added_while_processing_waits_for_done() {
        let q = queue("t");
        q.add("a".into());
        let k = q.get().await.unwrap();
        q.add("a".into());
        // Not handed out twice concurrently.
        assert_eq!(q.len(), 0);
        let second = tokio::time::timeout(Duration::from_millis(50), q.get()).await;
        assert!(
            second.is_err(),
            "key handed to a second worker while still processing"
        );
        q.done(&k);
        assert_eq!(q.get().await.as_deref(), Some("a"));
    }

    #[tokio::test(start_paused = true)]
    async fn add_after_keeps_earliest_and_fires() {
        let q = queue("t");
        q.add_after("a".into(), Duration::from_secs(10));
        q.add_after("a".into(), Duration::from_secs(2));
        q.add_after("a".into(), Duration::from_secs(5));
        let t0 = Instant::now();
        assert_eq!(q.get().await.as_deref(), Some("a"));
        let waited = t0.elapsed();
        assert!(
            waited >= Duration::from_secs(2) && waited < Duration::from_secs(3),
            "{waited:?}"
        );
        q.done(&"a".to_string());
        // The superseded 5 s and 10 s entries do not fire again.
        let again = tokio::time::timeout(Duration::from_secs(20), q.get()).await;
        assert!(again.is_err(), "stale delayed entry fired");
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limited_backoff_grows_then_forget_resets() {
        let q = queue("t");
        let mut waits = vec![];
        for _ in 0..5 {
            let t0 = Instant::now();
            q.add_rate_limited("a".into());
            let k = q.get().await.unwrap();
            waits.push(t0.elapsed().as_millis());
            q.done(&k);
        }
        assert_eq!(waits, vec![10, 20, 40, 80, 80]);
        q.forget(&"a".to_string());
        let t0 = Instant::now();
        q.add_rate_limited("a".into());
        q.get().await.unwrap();
        assert_eq!(t0.elapsed().as_millis(), 10);
    }

    #[tokio::test]
    async fn shutdown_releases_waiting_workers() {
        let q = queue("t");
        let q2 = Arc::clone(&q);
        let h = tokio::spawn(async move { q2.get().await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        q.shut_down();
        assert_eq!(h.await.unwrap(), None);
        q.add("x".into());
        assert!(q.is_empty(), "adds after shutdown are dropped");
    }

    #[tokio::test]
    async fn metrics_track_adds_depth_and_retries() {
        let m = Metrics::default();
        let q: Arc<Queue<String>> = Queue::new("job", BackoffConfig::default(), &m);
        q.add("a".into());
        q.add("a".into());
        q.add("b".into());
        q.add_rate_limited("c".into());
        let text = m.encode();
        assert!(
            text.contains("workqueue_adds_total{name=\"job\"} 2"),
            "{text}"
        );
        assert!(text.contains("workqueue_depth{name=\"job\"} 2"), "{text}");
        assert!(
            text.contains("workqueue_retries_total{name=\"job\"} 1"),
            "{text}"
        );
    }
}
