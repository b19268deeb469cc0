//! Stage Complete and the end of a maintenance (NM-19, NM-20): stop evicting, withdraw the pods'
//! `TargetedByNodeMaintenance` conditions, and release the node (uncordon, untaint, clear its
//! maintenance conditions) unless another active object still holds it.

use crate::classify::{self, Class};
use crate::metrics::ObjectLabel;
use crate::status;
use crate::sync::{NodeMaintenanceController, node_ref, owner, pod_uid};
use crate::types::*;
use crate::{Error, act, plan};
use k8s_openapi::api::core::v1::{Node, PodCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use shared::api::apierr::doing;
use shared::runtime::queue::Next;
use std::sync::Arc;

pub const REASON_MAINTENANCE_ENDED: &str = "MaintenanceEnded";

impl NodeMaintenanceController {
    /// NM-19: stage Complete: stop, end the pod conditions, release; phase Completed.
    pub(crate) async fn complete(
        &self,
        nm: &Arc<NodeMaintenance>,
        node: &Arc<Node>,
        mut st: NodeMaintenanceStatus,
        now: Timestamp,
    ) -> Result<Next, Error> {
        let generation = nm.metadata.generation;
        if !status::is_true(&st.conditions, CONDITION_DRAINED) {
            let cancelled = st.drain.as_ref().is_some_and(|d| d.start_time.is_some());
            let newly = status::condition(&st.conditions, CONDITION_DRAINED)
                .is_none_or(|c| c.reason != "Cancelled");
            let reason = if cancelled {
                "Cancelled"
            } else {
                "NotRequested"
            };
            status::set_condition(
                &mut st.conditions,
                CONDITION_DRAINED,
                false,
                reason,
                "",
                now,
                generation,
            );
            if cancelled && newly {
                self.observe_drain_end(nm, "cancelled", now);
            }
        }
        status::set_condition(
            &mut st.conditions,
            CONDITION_EVICTION_BLOCKED,
            false,
            "NotBlocked",
            "",
            now,
            generation,
        );
        if status::condition(&st.conditions, CONDITION_DEADLINE_EXCEEDED).is_none() {
            status::set_condition(
                &mut st.conditions,
                CONDITION_DEADLINE_EXCEEDED,
                false,
                "NoDeadline",
                "",
                now,
                generation,
            );
        }
        self.end_targeting(nm).await;
        let held = match self.release(nm, node).await {
            Ok(held) => held,
            Err(e) => {
                // Cleanup is still running: say so, and retry.
                st.phase = Some(Phase::Completing);
                let _ = self.write_status(nm, st, false).await;
                return Err(e);
            }
        };
        release_condition(nm, held, &mut st, now);
        status::note_stage(&mut st.stage_statuses, Stage::Complete, now);
        self.metrics.blocked_pods.remove(&ObjectLabel {
            nodemaintenance: nm.metadata.name.clone().unwrap_or_default(),
        });
        st.phase = Some(Phase::Completed);
        self.write_status(nm, st, false).await?;
        Ok(Next::Done)
    }

    /// NM-20: releases the node unless another active object holds it; returns the names of
    /// those that do.
    pub(crate) async fn release(
        &self,
        nm: &NodeMaintenance,
        node: &Arc<Node>,
    ) -> Result<Option<String>, Error> {
        let me = nm.metadata.uid.clone();
        let mut others: Vec<Arc<NodeMaintenance>> = self
            .on_node(&nm.spec.node_name)
            .into_iter()
            .filter(|o| o.metadata.uid != me && plan::is_active(o))
            .collect();
        if !others.is_empty() {
            others.sort_by(|a, b| plan::oldest_first(a, b));
            let names: Vec<&str> = others
                .iter()
                .filter_map(|o| o.metadata.name.as_deref())
                .collect();
            return Ok(Some(names.join(", ")));
        }
        let name = &nm.spec.node_name;
        let mut current = Arc::clone(node);
        if let Some((patch, schedulable)) = plan::release_patch(node) {
            let after = act::patch_node(&self.writer, name, patch)
                .await
                .map_err(doing::<Error>(format!("releasing node {name}")))?;
            self.written.replaced(owner(nm), &**node, after.clone());
            current = Arc::new(after);
            if schedulable {
                self.events.normal(
                    &node_ref(node),
                    "UncordonNode",
                    "Release",
                    format!("Node {name} is schedulable again"),
                );
            }
        }
        if self.node_conditions
            && let Some(p) = plan::lifecycle_patch(
                &current,
                &plan::lifecycle_conditions(false, false, false),
                self.clock.now(),
            )
        {
            act::patch_node_status(&self.writer, name, p)
                .await
                .map_err(doing::<Error>("clearing the node's maintenance conditions"))?;
        }
        Ok(None)
    }

    /// NM-12/NM-19: present pods this object targeted, no longer targeted by any other Drain
    /// object, get `TargetedByNodeMaintenance=False/MaintenanceEnded`.
    pub(crate) async fn end_targeting(&self, nm: &NodeMaintenance) {
        let name = nm.metadata.name.clone().unwrap_or_default();
        self.restore(
            &name,
            &nm.spec.node_name,
            nm.status
                .as_ref()
                .unwrap_or(&NodeMaintenanceStatus::default()),
        );
        let me = nm.metadata.uid.clone();
        let others: Vec<Arc<NodeMaintenance>> = self
            .on_node(&nm.spec.node_name)
            .into_iter()
            .filter(|o| o.metadata.uid != me && plan::is_draining(o))
            .collect();
        let targets = self.targets_of(&name);
        let now = self.clock.now();
        for (uid, t) in targets {
            let Some(pod) = self.pods.get(&format!("{}/{}", t.namespace, t.name)) else {
                continue;
            };
            let targeted = pod
                .condition(POD_CONDITION_TARGETED)
                .is_some_and(|c| c.status == "True");
            if pod_uid(&pod) != uid || !targeted {
                continue;
            }
            let still = others.iter().any(|o| {
                matches!(
                    classify::classify(
                        &pod,
                        &o.spec.drain,
                        |ns, n| self.daemonsets.get(&format!("{ns}/{n}")).is_some(),
                        now
                    ),
                    Class::Target { .. }
                )
            });
            if still {
                continue;
            }
            let cond = PodCondition {
                type_: POD_CONDITION_TARGETED.into(),
                status: "False".into(),
                reason: Some(REASON_MAINTENANCE_ENDED.into()),
                message: Some(format!(
                    "NodeMaintenance {name} on node {} ended",
                    nm.spec.node_name
                )),
                last_transition_time: Some(Time(now)),
                observed_generation: pod.metadata.generation,
                last_probe_time: None,
            };
            if let Err(e) =
                act::set_pod_condition(&self.writer, &t.namespace, &t.name, &uid, &cond).await
            {
                tracing::warn!(pod = %pod.key(), error = %e, "ending the TargetedByNodeMaintenance condition failed");
            }
            self.tracker.update(&uid, |r| r.condition_message = None);
        }
    }
}

/// NM-20: `Cordoned` after a release: held by the other active objects named, else uncordoned
/// (or never requested, when no stage ever cordoned).
fn release_condition(
    nm: &NodeMaintenance,
    held: Option<String>,
    st: &mut NodeMaintenanceStatus,
    now: Timestamp,
) {
    let generation = nm.metadata.generation;
    match held {
        Some(others) => status::set_condition(
            &mut st.conditions,
            CONDITION_CORDONED,
            false,
            "HeldByOtherMaintenance",
            format!(
                "node {} stays cordoned for NodeMaintenance {others}",
                nm.spec.node_name
            ),
            now,
            generation,
        ),
        None => {
            let cordoned_before = nm.status.as_ref().is_some_and(|s| {
                s.stage_statuses
                    .iter()
                    .any(|s| matches!(s.name, Stage::Cordon | Stage::Drain))
            });
            let reason = if cordoned_before {
                "Uncordoned"
            } else {
                "NotRequested"
            };
            status::set_condition(
                &mut st.conditions,
                CONDITION_CORDONED,
                false,
                reason,
                "",
                now,
                generation,
            );
        }
    }
}
