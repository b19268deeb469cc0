//! Pure maps from a watched change to the NodeMaintenance keys it concerns. The controller
//! watches NodeMaintenances, Nodes, Pods (by `spec.nodeName`), PodDisruptionBudgets (mapped to
//! the objects whose targets they block, NM-16) and DaemonSets (NM-9).

use crate::types::NodeMaintenance;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use shared::cache::informers::Change;
use shared::cache::pod::Pod;

/// Index: the node a NodeMaintenance names.
pub const INDEX_NM_NODE: &str = "nodemaintenance-node";

pub fn nm_by_node(nm: &NodeMaintenance) -> Vec<String> {
    vec![nm.spec.node_name.clone()]
}

/// A NodeMaintenance's change concerns itself and, for the reference-counted cordon and the
/// pod condition's message, every object of its node: returns the nodes to look up.
pub fn nm_nodes(change: &Change<NodeMaintenance>) -> Vec<String> {
    let mut nodes = vec![change.object().spec.node_name.clone()];
    if let Change::Updated { old, .. } = change
        && !nodes.contains(&old.spec.node_name)
    {
        nodes.push(old.spec.node_name.clone());
    }
    nodes
}

/// A node matters when it appears, goes, or its cordon, taints, annotations or UID change (not
/// on status heartbeats).
pub fn node_relevant(change: &Change<Node>) -> bool {
    match change {
        Change::Added(_) | Change::Deleted(_) => true,
        Change::Updated { old, new } => {
            old.spec != new.spec
                || old.metadata.annotations != new.metadata.annotations
                || old.metadata.uid != new.metadata.uid
        }
    }
}

/// The nodes a pod change concerns (a pod is bound once, but a re-list may show either).
pub fn pod_nodes(change: &Change<Pod>) -> Vec<String> {
    let node = |p: &Pod| {
        p.spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty())
    };
    let mut out: Vec<String> = node(change.object()).into_iter().collect();
    if let Change::Updated { old, .. } = change
        && let Some(n) = node(old)
        && !out.contains(&n)
    {
        out.push(n);
    }
    out
}

/// NM-16: a budget change that may let a blocked eviction through: added, deleted, allowing
/// disruptions, or observed at a newer generation (also a spec change).
pub fn pdb_may_unblock(change: &Change<PodDisruptionBudget>) -> bool {
    let allowed = |p: &PodDisruptionBudget| {
        p.status
            .as_ref()
            .and_then(|s| s.disruptions_allowed)
            .unwrap_or(0)
    };
    let observed = |p: &PodDisruptionBudget| p.status.as_ref().and_then(|s| s.observed_generation);
    match change {
        Change::Added(_) | Change::Deleted(_) => true,
        Change::Updated { old, new } => {
            allowed(new) > 0
                || observed(new) > observed(old)
                || old.spec != new.spec
                || old.metadata.labels != new.metadata.labels
        }
    }
}

/// A DaemonSet's appearance or disappearance changes NM-9's classification of its pods.
pub fn daemonset_relevant(change: &Change<DaemonSet>) -> bool {
    matches!(change, Change::Added(_) | Change::Deleted(_))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus};
    use k8s_openapi::api::policy::v1::PodDisruptionBudgetStatus;
    use std::sync::Arc;

    #[test]
    fn nodes_matter_only_for_spec_annotations_and_identity() {
        let n = Node::default();
        let mut heartbeat = n.clone();
        heartbeat.status = Some(NodeStatus::default());
        assert!(!node_relevant(&Change::Updated {
            old: Arc::new(n.clone()),
            new: Arc::new(heartbeat)
        }));
        let mut uncordoned = n.clone();
        uncordoned.spec = Some(NodeSpec {
            unschedulable: Some(false),
            ..Default::default()
        });
        assert!(node_relevant(&Change::Updated {
            old: Arc::new(n.clone()),
            new: Arc::new(uncordoned)
        }));
        assert!(node_relevant(&Change::Deleted(Arc::new(n))));
    }

    #[test]
    fn nm_16_budget_changes_that_may_unblock() {
        let pdb = |allowed: i32, observed: i64| {
            Arc::new(PodDisruptionBudget {
                status: Some(PodDisruptionBudgetStatus {
                    disruptions_allowed: Some(allowed),
                    observed_generation: Some(observed),
                    ..Default::default()
                }),
                ..Default::default()
            })
        };
        let up = |old, new| pdb_may_unblock(&Change::Updated { old, new });
        assert!(up(pdb(0, 1), pdb(1, 1)), "disruptionsAllowed > 0");
        assert!(up(pdb(0, 1), pdb(0, 2)), "newer observedGeneration");
        assert!(
            !up(pdb(0, 1), pdb(0, 1)),
            "status churn that allows nothing"
        );
        assert!(
            pdb_may_unblock(&Change::Deleted(pdb(0, 1))),
            "a deleted budget unblocks (M4)"
        );
    }

    #[test]
    fn pods_map_to_their_nodes() {
        let pod = |node: Option<&str>| {
            Arc::new(Pod {
                metadata: Default::default(),
                spec: Some(shared::cache::pod::PodSpec {
                    node_name: node.map(Into::into),
                    ..Default::default()
                }),
                status: None,
            })
        };
        assert_eq!(pod_nodes(&Change::Added(pod(Some("w1")))), ["w1"]);
        assert!(pod_nodes(&Change::Added(pod(None))).is_empty());
        assert_eq!(
            pod_nodes(&Change::Updated {
                old: pod(None),
                new: pod(Some("w2"))
            }),
            ["w2"]
        );
    }
}
