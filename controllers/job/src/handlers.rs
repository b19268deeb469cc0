//! Cache changes to queue keys (JR-2, JR-3, JR-64) and what they tell the controller's memory
//! (JR-21 expectations, JR-22 finalizer removals, JR-4 deletion). The runtime calls these only
//! while leading; [`Jobs::count_job`] and [`Jobs::count_pod`] count on every replica.

use crate::metrics::{ControllerNameLabel, EventLabel};
use crate::sync::{JobController, external_manager, pod_controller, uid_of};
use crate::{OrphanKey, plan, pods};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use shared::cache::informers::{Change, INDEX_NAMESPACE};
use shared::cache::pod::Pod;
use shared::meta::keys::object_key;
use std::sync::Arc;
use std::time::Duration;

/// JR-2: pod events and status-only updates are batched.
pub const BATCH_PERIOD: Duration = Duration::from_secs(1);
/// Index of pods carrying the tracking finalizer (the sweep's input).
pub const INDEX_TRACKING: &str = "job-tracking-finalizer";

pub fn tracking(p: &Pod) -> Vec<String> {
    if pods::has_tracking_finalizer(p) {
        vec![String::new()]
    } else {
        Vec::new()
    }
}

fn terminal_with_finalizer(pod: &Pod) -> bool {
    pods::terminal(pod) && pods::has_tracking_finalizer(pod)
}

/// JR-3: how long until `job`'s active deadline runs out, when it has one and has started.
pub fn deadline_left(job: &Job, now: k8s_openapi::jiff::Timestamp) -> Option<Duration> {
    let start = job.status.as_ref()?.start_time.as_ref()?;
    let ads = job.spec.as_ref()?.active_deadline_seconds?;
    let elapsed = now.duration_since(start.0);
    let left = k8s_openapi::jiff::SignedDuration::from_secs(ads)
        .checked_sub(elapsed)
        .unwrap_or(k8s_openapi::jiff::SignedDuration::MAX);
    Some(Duration::try_from(left).unwrap_or(Duration::ZERO))
}

impl JobController {
    /// The cached Job a controller reference points to, if it exists with that UID.
    pub(crate) fn resolve(&self, namespace: &str, r: &OwnerReference) -> Option<Arc<Job>> {
        if !shared::meta::refs::names_kind::<Job>(r) {
            return None;
        }
        self.jobs
            .get(&format!("{namespace}/{}", r.name))
            .filter(|j| j.metadata.uid.as_deref() == Some(r.uid.as_str()))
    }

    /// Jobs in the pod's namespace whose selector matches it (for orphans).
    fn matching_jobs(&self, pod: &Pod) -> Vec<Arc<Job>> {
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        self.jobs
            .by_index(INDEX_NAMESPACE, ns)
            .into_iter()
            .filter(|j| {
                shared::meta::selector::matches(
                    j.spec.as_ref().and_then(|s| s.selector.as_ref()),
                    pod.metadata.labels.as_ref(),
                )
                .unwrap_or(false)
            })
            .collect()
    }

    fn enqueue_batched(&self, job: &Job) {
        self.queue.add_after(object_key(job), BATCH_PERIOD);
    }

    /// JR-46: Jobs of an external controller, counted on every replica.
    pub fn count_job(&self, change: &Change<Job>) {
        if let Change::Added(j) = change
            && let Some(m) = external_manager(j)
        {
            self.metrics
                .external
                .get_or_create(&ControllerNameLabel {
                    controller_name: m.to_string(),
                })
                .inc();
        }
    }

    /// JR-31: changes of "terminal pod with the finalizer", counted on every replica.
    pub fn count_pod(&self, change: &Change<Pod>) {
        let (was, is) = match change {
            Change::Added(p) => (false, terminal_with_finalizer(p)),
            Change::Updated { old, new } => {
                (terminal_with_finalizer(old), terminal_with_finalizer(new))
            }
            Change::Deleted(p) => (terminal_with_finalizer(p), false),
        };
        if was != is {
            let event = if is { "add" } else { "delete" };
            self.metrics
                .terminated_with_finalizer
                .get_or_create(&EventLabel {
                    event: event.into(),
                })
                .inc();
        }
    }

    pub fn job_changed(&self, change: &Change<Job>) {
        match change {
            Change::Added(j) => self.queue.add(object_key(j.as_ref())),
            Change::Updated { old, new } => {
                if plan::finished(new) {
                    self.orphans.add(OrphanKey::Owner(uid_of(new)));
                    return;
                }
                if old.metadata.generation == new.metadata.generation {
                    self.enqueue_batched(new);
                } else {
                    self.queue.add(object_key(new.as_ref()));
                }
                // JR-3: a changed deadline is checked again when it runs out.
                let ads = |j: &Job| j.spec.as_ref().and_then(|s| s.active_deadline_seconds);
                if ads(old) != ads(new)
                    && let Some(left) = deadline_left(new, self.clock.now())
                {
                    self.queue.add_after(object_key(new.as_ref()), left);
                }
            }
            Change::Deleted(j) => {
                self.forget(&uid_of(j));
                self.queue.add(object_key(j.as_ref()));
                self.orphans.add(OrphanKey::Owner(uid_of(j)));
            }
        }
    }

    pub fn pod_changed(&self, change: &Change<Pod>) {
        match change {
            Change::Added(p) => {
                if pods::deleting(p) {
                    return self.pod_deleted(p, true, false);
                }
                let ns = p.metadata.namespace.as_deref().unwrap_or_default();
                if let Some(r) = pod_controller(p) {
                    if let Some(job) = self.resolve(ns, r) {
                        self.written.creation_observed(&uid_of(&job));
                        self.enqueue_batched(&job);
                    }
                    return;
                }
                if pods::has_tracking_finalizer(p) {
                    self.orphans.add(OrphanKey::Pod(object_key(p.as_ref())));
                }
                for job in self.matching_jobs(p) {
                    self.enqueue_batched(&job);
                }
            }
            Change::Updated { old, new } => {
                if old.metadata.resource_version == new.metadata.resource_version {
                    return;
                }
                if pods::deleting(new) {
                    // JR-21: a deletion is observed once, when deletionTimestamp first appears.
                    return self.pod_deleted(new, !pods::deleting(old), false);
                }
                let ns = new.metadata.namespace.as_deref().unwrap_or_default();
                let finalizer_gone = !pods::has_tracking_finalizer(new);
                let (cur, prev) = (pod_controller(new), pod_controller(old));
                let ref_changed = cur != prev;
                if ref_changed
                    && let Some(r) = prev
                    && let Some(job) = self.resolve(ns, r)
                {
                    if finalizer_gone {
                        self.finalizer_removal_observed(&uid_of(&job), pods::uid(new));
                    }
                    self.enqueue_batched(&job);
                }
                if let Some(r) = cur {
                    if let Some(job) = self.resolve(ns, r) {
                        if finalizer_gone {
                            self.finalizer_removal_observed(&uid_of(&job), pods::uid(new));
                        }
                        self.enqueue_batched(&job);
                    }
                    return;
                }
                if pods::has_tracking_finalizer(new) {
                    self.orphans.add(OrphanKey::Pod(object_key(new.as_ref())));
                }
                if ref_changed || old.metadata.labels != new.metadata.labels {
                    for job in self.matching_jobs(new) {
                        self.enqueue_batched(&job);
                    }
                }
            }
            Change::Deleted(p) => self.pod_deleted(p, !pods::deleting(p), true),
        }
    }

    /// Upstream `deletePod`: `first_sighting` is whether this is the first time the deletion is
    /// seen (so expectations are lowered once per pod); `gone` whether the object is gone.
    fn pod_deleted(&self, pod: &Pod, first_sighting: bool, gone: bool) {
        let has_finalizer = pods::has_tracking_finalizer(pod);
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        let Some(r) = pod_controller(pod) else {
            if has_finalizer {
                self.orphans.add(OrphanKey::Pod(object_key(pod)));
            }
            return;
        };
        let job = match self.resolve(ns, r) {
            Some(j) if !plan::finished(&j) => j,
            _ => {
                if has_finalizer {
                    self.orphans.add(OrphanKey::Pod(object_key(pod)));
                }
                return;
            }
        };
        let uid = uid_of(&job);
        if first_sighting {
            self.written.deletion_observed(&uid);
        }
        if gone || !has_finalizer {
            self.finalizer_removal_observed(&uid, pods::uid(pod));
        }
        self.enqueue_batched(&job);
    }
}
