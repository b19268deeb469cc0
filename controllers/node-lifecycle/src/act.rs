//! The controller's API requests, all through the writer seam: the Unknown conditions (NL-4),
//! taint writes (NL-8, NL-9, NL-11) and pods' `Ready=False` (NL-6, NL-7). Each node write is
//! noted in the own-writes store, so a write that follows it before the watch catches up starts
//! from what it returned.

use crate::{Error, NODE_LEASE_NAMESPACE, plan};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use plan::TaintChange;
use serde_json::json;
use shared::api::apierr::is_not_found;
use shared::api::retry::on_conflict_with;
use shared::api::writer::{PatchKind, Writer};
use shared::cache::pod::Pod;
use shared::cache::written::Written;
use shared::meta::clock::Clock;
use shared::meta::keys::{object_key, split_key};
use std::sync::Arc;
use std::time::Duration;

/// Attempts of a node status or taint write that keeps conflicting.
pub const STATUS_RETRIES: usize = 5;
/// NL-4: status retries 20 ms apart.
const STATUS_RETRY_STEP: Duration = Duration::from_millis(20);
/// NL-11: taint retries from 100 ms, doubling.
const TAINT_RETRY_FIRST: Duration = Duration::from_millis(100);

/// The owner key of a node's own-writes record: its UID (a recreated node is another node).
fn uid(node: &Node) -> &str {
    node.metadata.uid.as_deref().unwrap_or_default()
}

pub struct Act {
    pub writer: Writer,
    /// Our own writes to nodes that the cache may not show yet, by node UID.
    pub own: Written,
    pub clock: Arc<dyn Clock>,
}

impl Act {
    pub fn new(writer: Writer, clock: Arc<dyn Clock>) -> Act {
        Act {
            writer,
            own: Written::new(),
            clock,
        }
    }

    /// NL-LB: the node's Lease as the API server has it now (`None`: there is none).
    pub async fn live_lease(&self, name: &str) -> Result<Option<Lease>, Error> {
        match self.writer.get::<Lease>(NODE_LEASE_NAMESPACE, name).await {
            Ok(lease) => Ok(Some(lease)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(source) => Err(Error::Lease {
                node: name.to_string(),
                source,
            }),
        }
    }

    /// NL-4: sets the conditions to Unknown under a resourceVersion precondition; on conflict
    /// re-reads and retries (5 tries, 20 ms apart). `None` when nothing had to change (or the
    /// node is gone).
    pub async fn stale_conditions(&self, node: &Node) -> Result<Option<Node>, Error> {
        let name = node.name_any();
        let (writer, own, clock, n) = (&self.writer, &self.own, &*self.clock, name.as_str());
        on_conflict_with(
            STATUS_RETRIES,
            |_| STATUS_RETRY_STEP,
            |attempt| async move {
                let current = match attempt {
                    0 => node.clone(),
                    _ => writer.get::<Node>("", n).await?,
                };
                let Some(conditions) = plan::stale_conditions(&current, clock.now()) else {
                    return Ok(None);
                };
                let patch = json!({
                    "metadata": {"resourceVersion": current.metadata.resource_version},
                    "status": {"conditions": conditions}
                });
                match writer
                    .patch_status::<Node>("", n, PatchKind::Strategic, patch)
                    .await
                {
                    Ok(written) => {
                        own.replaced(uid(&current), &current, written.clone());
                        Ok(Some(written))
                    }
                    Err(e) if is_not_found(&e) => Ok(None),
                    Err(e) => Err(e),
                }
            },
        )
        .await
        .map_err(|source| Error::Status { node: name, source })
    }

    /// Replaces `spec.taints` with `change(node)` applied, guarded by resourceVersion; on 409
    /// re-reads and recomputes (5 steps from 100 ms, doubling). Returns the node as written (or
    /// as last read, when nothing had to change).
    pub async fn taints(
        &self,
        node: &Node,
        change: impl Fn(&Node) -> TaintChange,
    ) -> Result<Node, Error> {
        let name = node.name_any();
        let (writer, own, clock, n) = (&self.writer, &self.own, &*self.clock, name.as_str());
        let change = &change;
        on_conflict_with(
            STATUS_RETRIES,
            |attempt| {
                let doublings = u32::try_from(attempt.saturating_sub(1)).unwrap_or(u32::MAX);
                TAINT_RETRY_FIRST.saturating_mul(2u32.saturating_pow(doublings))
            },
            |attempt| async move {
                let current = match attempt {
                    0 => node.clone(),
                    _ => writer.get::<Node>("", n).await?,
                };
                let c = change(&current);
                if c.is_empty() {
                    return Ok(current);
                }
                let taints: Vec<Taint> = c.apply(&plan::taints(&current), clock.now());
                let patch = json!({
                    "metadata": {"resourceVersion": current.metadata.resource_version},
                    "spec": {"taints": taints}
                });
                let written = writer.patch::<Node>("", n, PatchKind::Merge, patch).await?;
                own.replaced(uid(&current), &current, written.clone());
                Ok(written)
            },
        )
        .await
        .map_err(|source| Error::Taints { node: name, source })
    }

    /// NL-6/NL-7: `Ready=False` on a pod that has a Ready condition not already False. Only the
    /// status and transition time change; reason and message stay (merged by type). `true`
    /// when written (a pod that is gone is not an error).
    pub async fn pod_not_ready(&self, pod: &Pod) -> Result<bool, Error> {
        if !plan::pod_needs_not_ready(pod) {
            return Ok(false);
        }
        let key = object_key(pod);
        let (ns, name) = split_key(&key);
        let patch = json!({"status": {"conditions": [{
            "type": "Ready",
            "status": "False",
            "lastTransitionTime": Time(self.clock.now())
        }]}});
        match self
            .writer
            .patch_status::<Pod>(ns, name, PatchKind::Strategic, patch)
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if is_not_found(&e) => Ok(false),
            Err(source) => Err(Error::Pod { pod: key, source }),
        }
    }
}
