//! Pod management's API requests with their events, expectations and metrics: DELETEs of the
//! active pods when a finishing condition is pending (JR-48), finalizer-first removals (JR-16,
//! JR-44) and creates in batches (JR-18).

use crate::metrics::CreationLabels;
use crate::plan::{self, Evaluation, Outcome, PodAction};
use crate::sync::{JobController, job_ref, uid_of};
use crate::{Error, act, api, pods};
use futures::future::join_all;
use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;
use shared::cache::pod::Pod;
use shared::meta::keys::object_key;

impl JobController {
    /// Performs the pod action; returns what happened and the first error.
    pub(crate) async fn perform(
        &self,
        job: &Job,
        eval: &Evaluation,
        action_label: &mut &'static str,
    ) -> (Outcome, Option<Error>) {
        let uid = uid_of(job);
        let ns = job.namespace().unwrap_or_default();
        let mut out = Outcome::default();
        match &eval.action {
            PodAction::Skip | PodAction::Track => {
                if matches!(eval.action, PodAction::Track) {
                    *action_label = "tracking";
                }
                (out, None)
            }
            PodAction::WaitBackoff(_) => {
                *action_label = "pods_created";
                (out, None)
            }
            PodAction::DeleteActive(list) => {
                // JR-48: finalizers stay; tracking counts these pods when they terminate.
                let results = join_all(
                    list.iter()
                        .map(|p| act::delete_pod(&self.writer, &ns, pods::name(p))),
                )
                .await;
                let mut err = None;
                for (p, r) in list.iter().zip(results) {
                    match r {
                        Ok(()) => {
                            out.deleted += 1;
                            self.deleted_event(job, p);
                        }
                        Err(e) => {
                            out.delete_failed = true;
                            self.delete_failed_event(job, &e);
                            err.get_or_insert(api(format!("deleting pod {ns}/{}", pods::name(p)))(
                                e,
                            ));
                        }
                    }
                    if pods::ready(p) {
                        out.deleted_ready += 1;
                    }
                }
                (out, err)
            }
            PodAction::Remove(list) => {
                *action_label = "pods_deleted";
                self.written.expect(&uid, 0, list.len() as i64);
                let ns = ns.as_str();
                let results = join_all(list.iter().map(|p| async move {
                    act::remove_tracking_finalizer(&self.writer, p).await?;
                    act::delete_pod(&self.writer, ns, pods::name(p)).await
                }))
                .await;
                let mut err = None;
                for (p, r) in list.iter().zip(results) {
                    match r {
                        Ok(()) => {
                            out.deleted += 1;
                            if pods::ready(p) {
                                out.deleted_ready += 1;
                            }
                            self.deleted_event(job, p);
                        }
                        Err(e) => {
                            // The informer will not observe this deletion.
                            self.written.deletion_observed(&uid);
                            self.delete_failed_event(job, &e);
                            err.get_or_insert(api(format!("deleting pod {ns}/{}", pods::name(p)))(
                                e,
                            ));
                        }
                    }
                }
                (out, err)
            }
            PodAction::Create(list) => {
                *action_label = "pods_created";
                self.create_pods(job, list, eval.creation_reason).await
            }
        }
    }

    /// JR-18: creates in batches of 1, 2, 4, …; the rest are skipped after a failing batch.
    async fn create_pods(
        &self,
        job: &Job,
        list: &[plan::NewPod],
        reason: &'static str,
    ) -> (Outcome, Option<Error>) {
        let uid = uid_of(job);
        let mut out = Outcome::default();
        self.written.expect(&uid, list.len() as i64, 0);
        let (mut ok, mut failed) = (0u64, 0u64);
        let mut first_err = None;
        let mut start = 0;
        let mut batch = 1usize;
        while start < list.len() {
            let end = (start + batch).min(list.len());
            let results = join_all(
                list[start..end]
                    .iter()
                    .map(|n| act::create_pod(&self.writer, job, n)),
            )
            .await;
            let mut batch_failed = false;
            for r in results {
                match r {
                    Ok(p) => {
                        ok += 1;
                        self.events.normal(
                            &job_ref(job),
                            "SuccessfulCreate",
                            "CreatePod",
                            format!("Created pod: {}", pods::name(&p)),
                        );
                    }
                    // The namespace is going away: nothing more will be created, nothing to say.
                    Err(e) if shared::api::apierr::is_namespace_terminating(&e) => {}
                    Err(e) => {
                        failed += 1;
                        batch_failed = true;
                        out.not_created += 1;
                        self.written.creation_observed(&uid);
                        self.events.warning(
                            &job_ref(job),
                            "FailedCreate",
                            "CreatePod",
                            format!("Error creating: {}", shared::api::apierr::message(&e)),
                        );
                        first_err.get_or_insert(api(format!(
                            "creating a pod for job {}",
                            object_key(job)
                        ))(e));
                    }
                }
            }
            start = end;
            if batch_failed && start < list.len() {
                let skipped = (list.len() - start) as i64;
                out.not_created += skipped as i32;
                self.written.lower(&uid, skipped, 0);
                break;
            }
            batch *= 2;
        }
        // JB-6: each attempt counted once.
        for (status, n) in [("succeeded", ok), ("failed", failed)] {
            if n > 0 {
                self.metrics
                    .pods_creation
                    .get_or_create(&CreationLabels {
                        reason: reason.into(),
                        status: status.into(),
                    })
                    .inc_by(n);
            }
        }
        (out, first_err)
    }

    /// The event of a deleted pod (upstream's `SuccessfulDelete`).
    fn deleted_event(&self, job: &Job, p: &Pod) {
        self.events.normal(
            &job_ref(job),
            "SuccessfulDelete",
            "DeletePod",
            format!("Deleted pod: {}", pods::name(p)),
        );
    }

    /// The event of a failed pod deletion (upstream's `FailedDelete`).
    fn delete_failed_event(&self, job: &Job, e: &kube::Error) {
        self.events.warning(
            &job_ref(job),
            "FailedDelete",
            "DeletePod",
            format!("Error deleting: {}", shared::api::apierr::message(e)),
        );
    }
}
