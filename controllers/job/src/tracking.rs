//! The finalizer protocol's writes (JR-26 steps 5–8): status PUTs checked first (JB-2, JR-54),
//! finalizer removals, the terminal condition with its event and metrics (JR-51), and failed
//! removals named and counted (JB-4).

use crate::metrics::{ActionLabel, FinishedLabels, IndexesLabels, PodsFinishedLabels, ReasonLabel};
use crate::plan::{self, Evaluation, Observed};
use crate::sync::{JobController, job_ref, uid_of};
use crate::{Error, act, api, indexes, pods, validation};
use futures::future::join_all;
use k8s_openapi::api::batch::v1::{Job, JobStatus};
use shared::cache::pod::Pod;
use shared::meta::keys::object_key;

impl JobController {
    /// JB-2 then JR-54: checks the status and PUTs it over `current`.
    async fn write_status(&self, current: &Job, status: &JobStatus) -> Result<Job, Error> {
        let key = object_key(current);
        let violations = validation::violations(current, status);
        if !violations.is_empty() {
            self.metrics.status_writes_refused.inc();
            tracing::error!(job = %key, ?violations, "refusing an invalid status write (controller bug)");
            return Err(Error::InvalidStatus {
                key,
                violations: violations.join("; "),
            });
        }
        let written = act::replace_status(&self.writer, current, status.clone())
            .await
            .map_err(api(format!("writing status of job {key}")))?;
        self.written.wrote(
            &uid_of(current),
            &self.jobs,
            written.metadata.resource_version.as_deref(),
        );
        Ok(written)
    }
    fn record_pods_finished(&self, job: &Job, old: &JobStatus, new: &JobStatus) {
        let mode = plan::completion_mode(job);
        let completions = job.spec.as_ref().and_then(|s| s.completions).unwrap_or(0);
        let count = |s: &Option<String>| {
            indexes::Intervals::parse(s.as_deref().unwrap_or_default(), completions).total()
        };
        let succeeded = if plan::is_indexed(job) {
            let per_index = job
                .spec
                .as_ref()
                .is_some_and(|s| s.backoff_limit_per_index.is_some());
            let label = if per_index { "perIndex" } else { "global" };
            let diff = count(&new.completed_indexes) - count(&old.completed_indexes);
            if diff > 0 {
                self.metrics
                    .finished_indexes
                    .get_or_create(&IndexesLabels {
                        status: "succeeded".into(),
                        backoffLimit: label.into(),
                    })
                    .inc_by(diff as u64);
            }
            let fdiff = count(&new.failed_indexes) - count(&old.failed_indexes);
            if per_index && fdiff > 0 {
                self.metrics
                    .finished_indexes
                    .get_or_create(&IndexesLabels {
                        status: "failed".into(),
                        backoffLimit: label.into(),
                    })
                    .inc_by(fdiff as u64);
            }
            diff
        } else {
            new.succeeded.unwrap_or(0) - old.succeeded.unwrap_or(0)
        };
        let failed = new.failed.unwrap_or(0) - old.failed.unwrap_or(0);
        for (result, n) in [("succeeded", succeeded), ("failed", failed)] {
            if n > 0 {
                self.metrics
                    .pods_finished
                    .get_or_create(&PodsFinishedLabels {
                        completion_mode: mode.into(),
                        result: result.into(),
                    })
                    .inc_by(n as u64);
            }
        }
    }

    /// JR-26 steps 5–8.
    pub(crate) async fn flush(
        &self,
        obs: &Observed<'_>,
        eval: &Evaluation,
        t: plan::Tracking,
    ) -> Result<(), FlushError> {
        let job = obs.job;
        let uid = uid_of(job);
        let mut current = job.clone();
        let mut status = t.status;
        let mut needs_flush = t.needs_flush;
        let mut counters = job.status.clone().unwrap_or_default();
        if needs_flush {
            current = self.write_status(&current, &status).await?;
            // Only after the write is durable is the backoff record moved on (JR-26 step 5).
            self.remember(&uid, |m| m.backoff = eval.new_backoff);
            self.record_pods_finished(job, &counters, &status);
            counters = status.clone();
            needs_flush = false;
        }
        for (action, n) in &t.policy_actions {
            self.metrics
                .policy_actions
                .get_or_create(&ActionLabel {
                    action: (*action).into(),
                })
                .inc_by(*n);
        }
        let mut with_finalizer = t.uids_with_finalizer;
        let mut rm_err = None;
        if !t.remove_finalizers.is_empty() {
            self.remember(&uid, |m| {
                let uids = t.remove_finalizers.iter().map(|p| pods::uid(p).to_string());
                m.rm_finalizers.extend(uids);
            });
            let results = join_all(
                t.remove_finalizers
                    .iter()
                    .map(|p| act::remove_tracking_finalizer(&self.writer, p)),
            )
            .await;
            let mut failures = Vec::new();
            for (p, r) in t.remove_finalizers.iter().zip(results) {
                match r {
                    Ok(()) => {
                        with_finalizer.remove(pods::uid(p));
                    }
                    Err(e) => {
                        self.finalizer_removal_observed(&uid, pods::uid(p));
                        failures.push((p.as_ref(), e));
                    }
                }
            }
            if !failures.is_empty() {
                self.finalizer_failure(Some(job), &failures);
                // The first failure is the sync's error, moved (not re-made, which would lose
                // its kind, such as NotLeading).
                let (p, e) = failures.swap_remove(0);
                rm_err = Some(api(format!(
                    "removing the tracking finalizer of pod {}",
                    pods::name(p)
                ))(e));
            }
        }
        if plan::clean_uncounted(&mut status, &with_finalizer) {
            needs_flush = true;
        }
        if let Some(e) = rm_err {
            if needs_flush {
                self.write_status(&current, &status).await?;
                self.record_pods_finished(job, &counters, &status);
            }
            return Err(FlushError::Finalizers(e));
        }
        let now = self.clock.now();
        let finished = !t.reached_max_uncounted
            && plan::enact_finished(&mut status, t.final_condition.as_ref(), now);
        if finished {
            needs_flush = true;
        }
        if needs_flush {
            self.write_status(&current, &status).await?;
            self.record_pods_finished(job, &counters, &status);
            if finished && let Some(c) = &t.final_condition {
                self.remember(&uid, |m| m.finished = true);
                self.record_finished(job, &status, c);
            }
        }
        Ok(())
    }

    /// JR-51.
    fn record_finished(
        &self,
        job: &Job,
        status: &JobStatus,
        c: &k8s_openapi::api::batch::v1::JobCondition,
    ) {
        let reason = c.reason.clone().unwrap_or_default();
        let mode = plan::completion_mode(job);
        let result = if c.type_ == plan::COMPLETE {
            let completions = job.spec.as_ref().and_then(|s| s.completions);
            if completions.is_some_and(|n| status.succeeded.unwrap_or(0) > n) {
                self.events.warning(
                    &job_ref(job),
                    "TooManySucceededPods",
                    "Sync",
                    "Too many succeeded pods running after completion count reached",
                );
            }
            self.events
                .normal(&job_ref(job), "Completed", "Sync", "Job completed");
            "succeeded"
        } else {
            self.events.warning(
                &job_ref(job),
                &reason,
                "Sync",
                c.message.clone().unwrap_or_default(),
            );
            "failed"
        };
        self.metrics
            .jobs_finished
            .get_or_create(&FinishedLabels {
                completion_mode: mode.into(),
                result: result.into(),
                reason,
            })
            .inc();
    }

    /// JB-4: a failed finalizer removal is counted, and named in a Warning event (on the Job, or
    /// on the pod when the Job is gone).
    pub(crate) fn finalizer_failure(&self, job: Option<&Job>, failures: &[(&Pod, kube::Error)]) {
        for (_, e) in failures {
            self.metrics
                .finalizer_removal_failures
                .get_or_create(&ReasonLabel {
                    reason: shared::api::apierr::error_reason(e),
                })
                .inc();
        }
        let Some((pod, e)) = failures.first() else {
            return;
        };
        let note = format!(
            "Removing finalizer {} from pod {} failed ({} pod(s) this sync), will retry: {e}",
            pods::TRACKING_FINALIZER,
            pods::name(pod),
            failures.len()
        );
        let regarding = match job {
            Some(j) => job_ref(j),
            None => shared::runtime::events::core_ref("Pod", &object_key(*pod)),
        };
        self.events.warning(
            &regarding,
            "TrackingFinalizerRemovalFailed",
            "RemoveFinalizer",
            note,
        );
    }
}

/// Finalizer removals that failed are retried on their own cadence (JB-4).
pub(crate) enum FlushError {
    Finalizers(Error),
    Other(Error),
}

impl From<Error> for FlushError {
    fn from(e: Error) -> Self {
        FlushError::Other(e)
    }
}
