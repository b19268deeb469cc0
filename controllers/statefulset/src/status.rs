//! The status a set should have after a sync (ST-40..ST-42, SB-3), computed purely from its pods
//! as cached. Upstream: `computeReplicaStatus`, `completeUpdate`, `inconsistentStatus`.

use crate::plan::{PodView, Progressing, RECREATE_COMPLETED, SetView, Strategy};
use k8s_openapi::api::apps::v1::{StatefulSetCondition, StatefulSetStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// What the status is computed from beside the pods.
pub struct Inputs<'a> {
    pub set: &'a SetView,
    /// `metadata.generation` read at the start of the sync.
    pub generation: Option<i64>,
    pub old: &'a StatefulSetStatus,
    pub collision_count: i32,
    pub now: Timestamp,
    /// ST-R: the `Progressing` condition the plan set.
    pub progressing: Option<Progressing>,
}

/// Upstream `setStatefulSetCondition`: a condition of a new type is added; one whose status,
/// reason and message are unchanged is left alone; otherwise it takes the new ones, and a new
/// transition time only when its status changes.
fn set_condition(conditions: &mut Vec<StatefulSetCondition>, c: Progressing, now: Timestamp) {
    let found = conditions
        .iter_mut()
        .find(|x| x.type_.as_deref() == Some("Progressing"));
    let Some(x) = found else {
        conditions.push(StatefulSetCondition {
            type_: Some("Progressing".into()),
            status: Some(c.status.into()),
            reason: Some(c.reason.into()),
            message: Some(c.message.into()),
            last_transition_time: Some(Time(now)),
        });
        return;
    };
    if x.status.as_deref() == Some(c.status)
        && x.reason.as_deref() == Some(c.reason)
        && x.message.as_deref() == Some(c.message)
    {
        return;
    }
    if x.status.as_deref() != Some(c.status) {
        x.last_transition_time = Some(Time(now));
    }
    x.status = Some(c.status.into());
    x.reason = Some(c.reason.into());
    x.message = Some(c.message.into());
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
        // Kept as they are, but for the Progressing condition of a Recreate set (ST-R).
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
    if let Some(c) = i.progressing {
        set_condition(s.conditions.get_or_insert_with(Vec::new), c, i.now);
    }
    let want = set.replicas;
    if updated == want && ready == want && replicas == want && available == want {
        s.current_replicas = Some(updated);
        s.current_revision = s.update_revision.clone();
        // ST-R (upstream `completeUpdate`): a Recreate set that has a Progressing condition is
        // done.
        let progressing = s
            .conditions
            .as_ref()
            .is_some_and(|cs| cs.iter().any(|c| c.type_.as_deref() == Some("Progressing")));
        if set.strategy == Strategy::Recreate && progressing {
            set_condition(
                s.conditions.get_or_insert_with(Vec::new),
                RECREATE_COMPLETED,
                i.now,
            );
        }
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
