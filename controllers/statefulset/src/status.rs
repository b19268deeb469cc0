//! The status a set should have after a sync (ST-40..ST-42, SB-3), computed purely from its pods
//! as cached. Upstream: `computeReplicaStatus`, `completeUpdate`, `inconsistentStatus`.

use crate::plan::{PodView, SetView};
use k8s_openapi::api::apps::v1::StatefulSetStatus;
use k8s_openapi::jiff::Timestamp;

/// What the status is computed from beside the pods.
pub struct Inputs<'a> {
    pub set: &'a SetView,
    /// `metadata.generation` read at the start of the sync.
    pub generation: Option<i64>,
    pub old: &'a StatefulSetStatus,
    pub collision_count: i32,
    pub now: Timestamp,
}

/// ST-40, ST-30 with SB-3.
pub fn compute(i: &Inputs<'_>, pods: &[PodView]) -> StatefulSetStatus {
    let set = i.set;
    let mut s = StatefulSetStatus {
        // Never decreasing (a stale cache must not undo a newer observation).
        observed_generation: Some(
            i.generation
                .unwrap_or(0)
                .max(i.old.observed_generation.unwrap_or(0)),
        ),
        current_revision: Some(set.current_revision.clone()),
        update_revision: Some(set.update_revision.clone()),
        collision_count: Some(i.collision_count),
        // Conditions are not this controller's (upstream keeps them as they are).
        conditions: i.old.conditions.clone(),
        ..Default::default()
    };
    let (mut replicas, mut ready, mut available, mut current, mut updated) = (0, 0, 0, 0, 0);
    for p in pods.iter().filter(|p| p.ordinal >= 0) {
        let created = p.created();
        if created {
            replicas += 1;
        }
        if p.phase.as_deref() == Some("Running") && p.ready {
            ready += 1;
            if p.available(set.min_ready_seconds, i.now) {
                available += 1;
            }
        }
        if created && !p.terminating {
            if p.revision == set.current_revision {
                current += 1;
            }
            if p.revision == set.update_revision {
                updated += 1;
            }
        }
    }
    s.replicas = replicas;
    s.ready_replicas = Some(ready);
    s.available_replicas = Some(available);
    s.current_replicas = Some(current);
    s.updated_replicas = Some(updated);
    // ST-30 (upstream `completeUpdate`), and SB-3: the rollout is complete only when every pod
    // is also Available.
    let want = set.replicas;
    if updated == want && ready == want && replicas == want && available == want {
        s.current_replicas = Some(updated);
        s.current_revision = s.update_revision.clone();
    }
    s
}

/// ST-42 (upstream `inconsistentStatus`): whether the status must be written.
pub fn needs_write(old: &StatefulSetStatus, new: &StatefulSetStatus) -> bool {
    new.observed_generation.unwrap_or(0) > old.observed_generation.unwrap_or(0)
        || new.replicas != old.replicas
        || new.current_replicas.unwrap_or(0) != old.current_replicas.unwrap_or(0)
        || new.ready_replicas.unwrap_or(0) != old.ready_replicas.unwrap_or(0)
        || new.updated_replicas.unwrap_or(0) != old.updated_replicas.unwrap_or(0)
        || new.current_revision.as_deref().unwrap_or_default() != old.current_revision.as_deref().unwrap_or_default()
        || new.available_replicas.unwrap_or(0) != old.available_replicas.unwrap_or(0)
        || new.update_revision.as_deref().unwrap_or_default() != old.update_revision.as_deref().unwrap_or_default()
        || new.conditions != old.conditions
        // Pilothouse writes collisionCount as soon as it changes (upstream only with another
        // change): a name collision must not be retried from a stale count.
        || new.collision_count.unwrap_or(0) != old.collision_count.unwrap_or(0)
}
