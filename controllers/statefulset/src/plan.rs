//! The pure decisions of one sync (ST-18..ST-31, SB-1, SB-4..SB-6): from the set and
//! its pods as observed, the writes to make, in phases. Upstream: `stateful_set_control.go`
//! (`updateStatefulSet`, `processReplica`, `processCondemned`,
//! `updateStatefulSetAfterInvariantEstablished`).
//!
//! A phase's actions run in order (OrderedReady) or concurrently in slow-start batches
//! (Parallel, ST-21); an error stops the phases after it. An OrderedReady pass that blocks
//! simply has no later phases.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use std::collections::BTreeMap;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Management {
    OrderedReady,
    Parallel,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Strategy {
    /// `rollingUpdate` as given (the API server defaults it, with partition 0).
    RollingUpdate {
        partition: i32,
        max_unavailable: Option<IntOrString>,
    },
    /// RollingUpdate without a `rollingUpdate` stanza (only from a hand-built object).
    RollingUpdateBare,
    OnDelete,
    /// ST-R (KEP-3541, behind StatefulSetRecreateStrategy): every old-revision pod is deleted,
    /// and new pods are created only once all of them are gone.
    Recreate,
}

/// The `Progressing` condition a sync sets (upstream `setProgressingCondition`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progressing {
    pub status: &'static str,
    pub reason: &'static str,
    pub message: &'static str,
}

/// ST-R: old-revision pods are being deleted or are still terminating.
pub const RECREATE_DELETING: Progressing = Progressing {
    status: "True",
    reason: "RecreateInProgress",
    message: "Deleting old revision pods",
};
/// ST-R: every old-revision pod is gone; the new revision's are being created.
pub const RECREATE_CREATING: Progressing = Progressing {
    status: "True",
    reason: "RecreateInProgress",
    message: "Waiting for new-revision pods to be created",
};
/// ST-R: every pod is of the update revision and ready (set by the status, upstream
/// `completeUpdate`).
pub const RECREATE_COMPLETED: Progressing = Progressing {
    status: "False",
    reason: "RecreateCompleted",
    message: "All pods recreated successfully",
};

#[derive(Clone, Debug)]
pub struct SetView {
    pub replicas: i32,
    pub start: i32,
    pub management: Management,
    pub strategy: Strategy,
    pub min_ready_seconds: i32,
    pub deleting: bool,
    pub current_revision: String,
    pub update_revision: String,
    /// `status.currentReplicas` (ST-9 without a `rollingUpdate` stanza).
    pub status_current_replicas: i32,
    /// Ordinals whose claims are still owned by an earlier pod (ST-36).
    pub stale_claims: Vec<i32>,
    /// SB-6 opt-in ([`REPLACE_UNAVAILABLE_AFTER`]): during an OrderedReady rollout, an old pod
    /// unavailable for this long is replaced instead of blocking. `None`: upstream's behaviour.
    pub replace_unavailable_after: Option<Duration>,
}

/// SB-6: the set annotation (a Go duration, e.g. `10m`) opting into replacing an old pod that
/// stays unavailable during an OrderedReady rollout (upstream waits forever, #67250).
pub const REPLACE_UNAVAILABLE_AFTER: &str = "pilothouse.io/replace-unavailable-after";

#[derive(Clone, Debug)]
pub struct PodView {
    pub name: String,
    pub ordinal: i32,
    pub revision: String,
    pub phase: Option<String>,
    pub ready: bool,
    /// The Ready condition's lastTransitionTime.
    pub ready_since: Option<Timestamp>,
    pub terminating: bool,
    /// ST-10: identity and claim volumes as the set wants them.
    pub identity_ok: bool,
    /// ST-34: claim owner references as the policy wants them.
    pub claim_refs_ok: bool,
    /// Since when the pod is not Ready (the Ready condition's lastTransitionTime when False,
    /// else its creation): SB-6.
    pub unready_since: Option<Timestamp>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Which {
    Current,
    Update,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// ST-19 (b): claims, the pod at `which` revision, then the claims' references.
    CreatePod {
        ordinal: i32,
        which: Which,
    },
    /// ST-19 (c): a Pending pod's missing claims.
    CreateMissingClaims {
        ordinal: i32,
    },
    /// ST-19 (e), ST-10.
    Repair {
        name: String,
    },
    /// ST-34 for a condemned pod, before it goes.
    FixClaimRefs {
        name: String,
    },
    DeletePod {
        name: String,
        why: Why,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// ST-19 (a), ST-38.
    Terminal,
    /// ST-22.
    Condemned,
    /// ST-27/ST-28.
    Update,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Phase {
    pub actions: Vec<Action>,
    pub concurrent: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub phases: Vec<Phase>,
    /// `M` and `U` of ST-25, for upstream's max-unavailable and unavailable-replicas gauges.
    pub max_unavailable: i32,
    pub unavailable: i32,
    /// When a pod turns Available (minReadySeconds), to look again.
    pub requeue_after: Option<Duration>,
    /// Why an OrderedReady pass stopped, for logs.
    pub blocked: Option<String>,
    /// An invalid maxUnavailable (the update step is skipped, as upstream fails it).
    pub invalid: Option<String>,
    /// Replicas whose ordinal would pass the largest int32 (`spec.ordinals.start` +
    /// `spec.replicas`): they get no pod, and a Warning says so. (Upstream names such a pod
    /// `<set>-2147483648`, then fails to parse its ordinal and never counts it.)
    pub beyond_ordinals: Option<String>,
    /// ST-R: the `Progressing` condition this sync sets, if any.
    pub progressing: Option<Progressing>,
}

impl PodView {
    /// Upstream `isCreated`: the pod has a phase.
    pub fn created(&self) -> bool {
        self.phase.as_deref().is_some_and(|p| !p.is_empty())
    }

    fn terminal(&self) -> bool {
        matches!(self.phase.as_deref(), Some("Failed" | "Succeeded"))
    }

    fn running_and_ready(&self) -> bool {
        self.phase.as_deref() == Some("Running") && self.ready
    }

    /// Upstream `IsPodAvailable`: Ready for at least minReadySeconds.
    pub fn available(&self, min_ready_seconds: i32, now: Timestamp) -> bool {
        if !self.ready {
            return false;
        }
        if min_ready_seconds <= 0 {
            return true;
        }
        self.ready_since.is_some_and(|t| {
            t.checked_add(SignedDuration::from_secs(i64::from(min_ready_seconds)))
                .is_ok_and(|at| at <= now)
        })
    }

    fn unavailable(&self, min_ready_seconds: i32, now: Timestamp) -> bool {
        !self.available(min_ready_seconds, now) || self.terminating
    }
}

/// ST-25 (upstream `getStatefulSetMaxUnavailable`): absent → 1; an integer as given; a
/// percentage of `spec.replicas` rounded down; at least 1.
pub fn max_unavailable(m: Option<&IntOrString>, replicas: i32) -> Result<i32, String> {
    let n = match m {
        None => 1,
        Some(IntOrString::Int(i)) => *i,
        Some(IntOrString::String(s)) => {
            let pct = s
                .strip_suffix('%')
                .and_then(|p| p.parse::<i64>().ok())
                .ok_or_else(|| {
                    format!("spec.updateStrategy.rollingUpdate.maxUnavailable: invalid value {s:?}")
                })?;
            let scaled = pct.saturating_mul(i64::from(replicas)) / 100;
            i32::try_from(scaled).unwrap_or(if scaled < 0 { i32::MIN } else { i32::MAX })
        }
    };
    Ok(n.max(1))
}

/// One slot of the ordinal range: a pod, or none yet (to create at `which`).
enum Slot<'a> {
    Pod(&'a PodView),
    Missing { ordinal: i32, which: Which },
}

impl Slot<'_> {
    fn unavailable(&self, min_ready: i32, now: Timestamp) -> bool {
        match self {
            Slot::Pod(p) => p.unavailable(min_ready, now),
            Slot::Missing { .. } => true,
        }
    }
}

/// ST-9 (upstream `newVersionedStatefulSetPod`): the revision a new pod of `ordinal` gets.
pub fn which_revision(set: &SetView, ordinal: i32) -> Which {
    let below = |n: i32| i64::from(ordinal) < i64::from(set.start) + i64::from(n);
    match &set.strategy {
        Strategy::RollingUpdate { partition, .. } if below(*partition) => Which::Current,
        Strategy::RollingUpdateBare if below(set.status_current_replicas) => Which::Current,
        _ => Which::Update,
    }
}

/// Missing pods planned per sync (upstream plans them all; see [`plan`]).
pub const MAX_MISSING: usize = 10_000;

/// The plan of one sync.
pub fn plan(set: &SetView, pods: &[PodView], now: Timestamp) -> Plan {
    let min_ready = set.min_ready_seconds;
    let start = set.start;
    let end = i64::from(start) + i64::from(set.replicas.max(0)) - 1;
    let (by_ordinal, condemned) = sort_pods(pods, start, end);
    let (slots, beyond) = slots(set, &by_ordinal, end);
    let first_unavailable = first_unavailable(&slots, &condemned, min_ready, now);
    let mut out = Plan {
        requeue_after: [requeue(pods, min_ready, now), overdue_at(set, pods, now)]
            .into_iter()
            .flatten()
            .min(),
        ..Plan::default()
    };
    let m = match &set.strategy {
        Strategy::RollingUpdate {
            max_unavailable: mu,
            ..
        } => max_unavailable(mu.as_ref(), set.replicas),
        _ => Ok(1),
    };
    out.max_unavailable = *m.as_ref().unwrap_or(&1);
    let past = end.saturating_sub(i64::from(i32::MAX));
    if past > 0 {
        out.beyond_ordinals = Some(format!(
            "spec.ordinals.start ({start}) + spec.replicas ({}) passes the largest ordinal (2147483647): {past} replica(s) cannot have a pod",
            set.replicas
        ));
    }
    out.unavailable = slots
        .iter()
        .filter(|s| s.unavailable(min_ready, now))
        .count()
        .try_into()
        .unwrap_or(i32::MAX)
        .saturating_add(i32::try_from(beyond).unwrap_or(i32::MAX));
    // ST-5: a deleting set gets status only.
    if set.deleting {
        return out;
    }
    if set.strategy == Strategy::Recreate && recreate_step(set, &slots, &condemned, &mut out) {
        return out;
    }
    let monotonic = set.management == Management::OrderedReady;
    let (replica_phase, blocked) = replica_phase(set, &slots, monotonic, now);
    if monotonic && blocked.is_some() {
        out.phases.push(replica_phase);
        out.phases.retain(|p| !p.actions.is_empty());
        out.blocked = blocked;
        return out;
    }
    let claim_phase = claim_phase(&condemned, monotonic);
    let (condemned_phase, blocked) =
        condemned_phase(&condemned, first_unavailable, monotonic, min_ready, now);
    if monotonic {
        out.phases = vec![replica_phase, claim_phase, condemned_phase];
    } else {
        // SB-4: Parallel scales down before it creates, so a quota-limited set gets room.
        out.phases = vec![claim_phase, condemned_phase, replica_phase];
    }
    out.phases.retain(|p| !p.actions.is_empty());
    // ST-24: the update step only after a pass that did not stop; OnDelete never (ST-31), nor
    // Recreate, whose deletions came first (ST-R).
    if blocked.is_some() || matches!(set.strategy, Strategy::OnDelete | Strategy::Recreate) {
        out.blocked = blocked;
        return out;
    }
    match m {
        Err(e) => out.invalid = Some(e),
        Ok(m) => {
            let deletes = update_step(set, &slots, beyond, m, now);
            if !deletes.is_empty() {
                out.phases.push(Phase {
                    actions: deletes,
                    concurrent: !monotonic,
                });
            }
        }
    }
    out
}

/// ST-R (upstream `recreateDeleteAndWait`): while any created pod, in range or condemned, is of
/// an old revision, the only actions are deleting those not yet terminating, all at once
/// whatever the management policy, and nothing is created until every one of them is gone.
/// Returns whether the sync stops here.
fn recreate_step(
    set: &SetView,
    slots: &[Slot<'_>],
    condemned: &[&PodView],
    out: &mut Plan,
) -> bool {
    let old: Vec<&PodView> = slots
        .iter()
        .filter_map(|s| match s {
            Slot::Pod(p) => Some(*p),
            Slot::Missing { .. } => None,
        })
        .chain(condemned.iter().copied())
        .filter(|p| p.created() && p.revision != set.update_revision)
        .collect();
    if old.is_empty() {
        if set.current_revision != set.update_revision {
            out.progressing = Some(RECREATE_CREATING);
        }
        return false;
    }
    let deletes: Vec<Action> = old
        .iter()
        .filter(|p| !p.terminating)
        .map(|p| Action::DeletePod {
            name: p.name.clone(),
            why: Why::Update,
        })
        .collect();
    if !deletes.is_empty() {
        out.phases.push(Phase {
            actions: deletes,
            concurrent: true,
        });
    }
    out.progressing = Some(RECREATE_DELETING);
    true
}

/// ST-6: the pods of the ordinal range `start..=end` by ordinal, and the condemned ones (valid
/// ordinals outside it) in descending ordinal (ST-22).
fn sort_pods(pods: &[PodView], start: i32, end: i64) -> (BTreeMap<i32, &PodView>, Vec<&PodView>) {
    let mut by_ordinal: BTreeMap<i32, &PodView> = BTreeMap::new();
    let mut condemned: Vec<&PodView> = Vec::new();
    for p in pods.iter().filter(|p| p.ordinal >= 0) {
        if i64::from(p.ordinal) >= i64::from(start) && i64::from(p.ordinal) <= end {
            by_ordinal.insert(p.ordinal, p);
        } else {
            condemned.push(p);
        }
    }
    condemned.sort_by_key(|p| std::cmp::Reverse(p.ordinal));
    (by_ordinal, condemned)
}

/// The slots up to ordinal `end` in ordinal order, and how many missing ones were left out.
/// Missing ones beyond [`MAX_MISSING`] are not materialised (a set of two billion replicas must
/// not allocate them): they are created by later syncs, and count as unavailable.
fn slots<'a>(
    set: &SetView,
    by_ordinal: &BTreeMap<i32, &'a PodView>,
    end: i64,
) -> (Vec<Slot<'a>>, i64) {
    let mut slots: Vec<Slot<'a>> = Vec::new();
    let mut missing = 0usize;
    let mut beyond = 0i64;
    // Ordinals that fit in an i32 (a start near i32::MAX leaves fewer than `replicas`).
    let last = end.min(i64::from(i32::MAX));
    let mut ord = i64::from(set.start);
    while ord <= last {
        let o = ord as i32; // start ≤ ord ≤ i32::MAX
        match by_ordinal.get(&o) {
            Some(p) => slots.push(Slot::Pod(p)),
            None if missing < MAX_MISSING => {
                missing += 1;
                slots.push(Slot::Missing {
                    ordinal: o,
                    which: which_revision(set, o),
                });
            }
            None => {
                // The budget is spent: count the gap up to the next pod (or the end) at once
                // rather than step through up to two billion ordinals.
                let next = by_ordinal
                    .range(o..)
                    .next()
                    .map_or(last + 1, |(n, _)| i64::from(*n));
                beyond += next - ord;
                ord = next;
                continue;
            }
        }
        ord += 1;
    }
    (slots, beyond)
}

/// ST-18: the first unavailable slot (`""` for a missing one), else the lowest-ordinal
/// unavailable condemned pod.
fn first_unavailable<'a>(
    slots: &[Slot<'a>],
    condemned: &[&'a PodView],
    min_ready: i32,
    now: Timestamp,
) -> Option<&'a str> {
    slots
        .iter()
        .find(|s| s.unavailable(min_ready, now))
        .map(|s| match s {
            Slot::Pod(p) => p.name.as_str(),
            Slot::Missing { .. } => "",
        })
        .or_else(|| {
            condemned
                .iter()
                .rev()
                .find(|p| p.unavailable(min_ready, now))
                .map(|p| p.name.as_str())
        })
}

/// ST-19 for every slot in ordinal order, and why an OrderedReady pass stopped (where it stops,
/// the slots after it get nothing).
fn replica_phase(
    set: &SetView,
    slots: &[Slot<'_>],
    monotonic: bool,
    now: Timestamp,
) -> (Phase, Option<String>) {
    let mut phase = Phase {
        actions: Vec::new(),
        concurrent: !monotonic,
    };
    for slot in slots {
        let (actions, stop) = process_replica(set, slot, monotonic, now);
        phase.actions.extend(actions);
        if stop && monotonic {
            let blocked = match slot {
                Slot::Pod(p) => format!("waiting for pod {}", p.name),
                Slot::Missing { ordinal, .. } => format!("creating ordinal {ordinal}"),
            };
            return (phase, Some(blocked));
        }
    }
    (phase, None)
}

/// ST-34: condemned pods' claims get their references before the pods go.
fn claim_phase(condemned: &[&PodView], monotonic: bool) -> Phase {
    Phase {
        actions: condemned
            .iter()
            .filter(|p| !p.claim_refs_ok)
            .map(|p| Action::FixClaimRefs {
                name: p.name.clone(),
            })
            .collect(),
        concurrent: !monotonic,
    }
}

/// ST-22 (upstream `processCondemned`), highest ordinal first: the deletes, and why an
/// OrderedReady pass stopped (it deletes one pod at a time, after every other is available).
fn condemned_phase(
    condemned: &[&PodView],
    first_unavailable: Option<&str>,
    monotonic: bool,
    min_ready: i32,
    now: Timestamp,
) -> (Phase, Option<String>) {
    let mut phase = Phase {
        actions: Vec::new(),
        concurrent: !monotonic,
    };
    for p in condemned {
        if p.terminating {
            if monotonic {
                let blocked = format!("waiting for condemned pod {} to go", p.name);
                return (phase, Some(blocked));
            }
            continue;
        }
        let first = first_unavailable == Some(p.name.as_str());
        if monotonic && !first && (!p.running_and_ready() || !p.available(min_ready, now)) {
            let blocked = format!(
                "waiting for {} before scaling down",
                first_unavailable.unwrap_or_default()
            );
            return (phase, Some(blocked));
        }
        phase.actions.push(Action::DeletePod {
            name: p.name.clone(),
            why: Why::Condemned,
        });
        if monotonic {
            let blocked = format!("scaling down: {} goes first", p.name);
            return (phase, Some(blocked));
        }
    }
    (phase, None)
}

/// ST-19 (upstream `processReplica`): the actions for one slot and whether an OrderedReady
/// pass stops there.
fn process_replica(
    set: &SetView,
    slot: &Slot<'_>,
    monotonic: bool,
    now: Timestamp,
) -> (Vec<Action>, bool) {
    let p = match slot {
        Slot::Missing { ordinal, which } => {
            // ST-36: a claim still being collected for an earlier pod: wait.
            if set.stale_claims.contains(ordinal) {
                return (vec![], true);
            }
            return (
                vec![Action::CreatePod {
                    ordinal: *ordinal,
                    which: *which,
                }],
                monotonic,
            );
        }
        Slot::Pod(p) => p,
    };
    // (a) ST-38: a terminal pod is deleted (it returns under the same name once gone).
    if p.terminal() {
        let actions = if p.terminating {
            vec![]
        } else {
            vec![Action::DeletePod {
                name: p.name.clone(),
                why: Why::Terminal,
            }]
        };
        return (actions, true);
    }
    let mut actions = Vec::new();
    // (c) a Pending pod gets its missing claims.
    if p.phase.as_deref() == Some("Pending") {
        actions.push(Action::CreateMissingClaims { ordinal: p.ordinal });
    }
    // (d) OrderedReady waits for each pod to be running, ready and available.
    if monotonic
        && (p.terminating || !p.running_and_ready() || !p.available(set.min_ready_seconds, now))
    {
        // SB-6 (opt-in): an old pod that has stayed unready past the set's limit is replaced
        // (it returns at the update revision) instead of holding the rollout forever.
        if !p.terminating && !p.ready && p.revision != set.update_revision && overdue(set, p, now) {
            actions.push(Action::DeletePod {
                name: p.name.clone(),
                why: Why::Update,
            });
        }
        return (actions, true);
    }
    // (e) ST-10, ST-34.
    if !p.identity_ok || !p.claim_refs_ok {
        actions.push(Action::Repair {
            name: p.name.clone(),
        });
    }
    (actions, false)
}

/// SB-6 replaces only what a rolling update may replace: nothing under OnDelete (ST-31), nothing
/// below the partition (ST-26; such a pod would return at the current revision, still old, and
/// be replaced again every period).
fn b6_may_replace(set: &SetView, p: &PodView) -> bool {
    let index = i64::from(p.ordinal) - i64::from(set.start);
    match &set.strategy {
        Strategy::RollingUpdate { partition, .. } => index >= i64::from((*partition).max(0)),
        Strategy::RollingUpdateBare => true,
        Strategy::OnDelete | Strategy::Recreate => false,
    }
}

/// SB-6: whether `p` has been unready longer than the set's opt-in limit.
fn overdue(set: &SetView, p: &PodView, now: Timestamp) -> bool {
    if !b6_may_replace(set, p) {
        return false;
    }
    let (Some(limit), Some(since)) = (set.replace_unavailable_after, p.unready_since) else {
        return false;
    };
    let Ok(limit) = SignedDuration::try_from(limit) else {
        return false;
    };
    since.checked_add(limit).is_ok_and(|at| at <= now)
}

/// ST-25..ST-29 (upstream `updateStatefulSetAfterInvariantEstablished`, 1.37 with #137666),
/// for every set (SB-1): the pods deleted for the update, highest index first.
fn update_step(
    set: &SetView,
    slots: &[Slot<'_>],
    beyond: i64,
    m: i32,
    now: Timestamp,
) -> Vec<Action> {
    let min_ready = set.min_ready_seconds;
    let partition = match &set.strategy {
        Strategy::RollingUpdate { partition, .. } => (*partition).max(0),
        _ => 0,
    };
    let is_old = |s: &Slot<'_>| match s {
        Slot::Pod(p) => p.revision != set.update_revision,
        Slot::Missing { which, .. } => {
            *which == Which::Current && set.current_revision != set.update_revision
        }
    };
    fn pod<'a>(s: &Slot<'a>) -> Option<&'a PodView> {
        match s {
            Slot::Pod(p) => Some(p),
            Slot::Missing { .. } => None,
        }
    }
    let unavailable = slots
        .iter()
        .filter(|s| s.unavailable(min_ready, now))
        .count() as i64
        + beyond;
    let parallel = set.management == Management::Parallel;
    let needing_update = slots
        .iter()
        .filter(|s| {
            parallel
                && s.unavailable(min_ready, now)
                && is_old(s)
                && pod(s).is_some_and(|p| !p.terminating)
        })
        .count();
    let m = i64::from(m);
    if unavailable >= m && needing_update == 0 {
        return vec![];
    }
    // Indices from the top down to the partition (nothing below it is deleted, ST-26).
    // A slot's index is its ordinal's distance from the start (slots may skip missing ones).
    let index = |s: &Slot<'_>| {
        let ordinal = match s {
            Slot::Pod(p) => p.ordinal,
            Slot::Missing { ordinal, .. } => *ordinal,
        };
        i64::from(ordinal) - i64::from(set.start)
    };
    let targets = || {
        slots
            .iter()
            .rev()
            .take_while(move |s| index(s) >= i64::from(partition))
            .filter_map(|s| pod(s).map(|p| (s, p)))
    };
    let mut out = Vec::new();
    let delete = |p: &PodView| Action::DeletePod {
        name: p.name.clone(),
        why: Why::Update,
    };
    if parallel {
        // Phase 1: old pods that are not available (and not going) are replaced at once.
        for (s, p) in targets() {
            if is_old(s) && !p.available(min_ready, now) && !p.terminating {
                out.push(delete(p));
            }
        }
        // Phase 2: available old pods within what is left of the budget.
        let mut budget = m - unavailable;
        for (s, p) in targets() {
            if budget <= 0 {
                break;
            }
            if is_old(s) && !p.unavailable(min_ready, now) {
                out.push(delete(p));
                budget -= 1;
            }
        }
        return out;
    }
    let mut budget = m - unavailable;
    for (s, p) in targets() {
        if budget <= 0 {
            break;
        }
        if is_old(s) && !p.terminating {
            out.push(delete(p));
            budget -= 1;
        }
    }
    out
}

/// SB-6: when the next old, unready pod becomes overdue.
fn overdue_at(set: &SetView, pods: &[PodView], now: Timestamp) -> Option<Duration> {
    let limit = SignedDuration::try_from(set.replace_unavailable_after?).ok()?;
    pods.iter()
        .filter(|p| !p.ready && !p.terminating && p.revision != set.update_revision)
        .filter(|p| b6_may_replace(set, p))
        .filter_map(|p| p.unready_since?.checked_add(limit).ok())
        .filter(|at| *at > now)
        .map(|at| {
            at.duration_since(now)
                .unsigned_abs()
                .saturating_add(Duration::from_millis(1))
        })
        .min()
}

/// ST-2/ST-30: with minReadySeconds, when the next ready pod becomes available.
fn requeue(pods: &[PodView], min_ready: i32, now: Timestamp) -> Option<Duration> {
    if min_ready <= 0 {
        return None;
    }
    pods.iter()
        .filter(|p| p.ready && !p.available(min_ready, now))
        .filter_map(|p| {
            let at = p
                .ready_since?
                .checked_add(SignedDuration::from_secs(i64::from(min_ready)))
                .ok()?;
            Some(
                at.duration_since(now)
                    .unsigned_abs()
                    .saturating_add(Duration::from_millis(1)),
            )
        })
        .min()
        .or(Some(Duration::from_secs(min_ready.unsigned_abs().into()))
            .filter(|_| pods.iter().any(|p| p.ready && !p.available(min_ready, now))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Timestamp {
        "2026-01-01T00:10:00Z".parse().unwrap()
    }

    fn set(replicas: i32, management: Management, strategy: Strategy) -> SetView {
        SetView {
            replicas,
            start: 0,
            management,
            strategy,
            min_ready_seconds: 0,
            deleting: false,
            current_revision: "old".into(),
            update_revision: "new".into(),
            status_current_replicas: 0,
            stale_claims: vec![],
            replace_unavailable_after: None,
        }
    }

    fn rolling(partition: i32, m: Option<IntOrString>) -> Strategy {
        Strategy::RollingUpdate {
            partition,
            max_unavailable: m,
        }
    }

    /// A running pod: `ready` and at revision `rev`.
    fn pod(ordinal: i32, rev: &str, ready: bool) -> PodView {
        PodView {
            name: format!("web-{ordinal}"),
            ordinal,
            revision: rev.into(),
            phase: Some("Running".into()),
            ready,
            ready_since: ready.then(|| "2026-01-01T00:00:00Z".parse().unwrap()),
            terminating: false,
            identity_ok: true,
            claim_refs_ok: true,
            unready_since: (!ready).then(|| "2026-01-01T00:05:00Z".parse().unwrap()),
        }
    }

    fn actions(p: &Plan) -> Vec<Action> {
        p.phases.iter().flat_map(|ph| ph.actions.clone()).collect()
    }

    fn deleted(p: &Plan) -> Vec<String> {
        actions(p)
            .into_iter()
            .filter_map(|a| match a {
                Action::DeletePod { name, .. } => Some(name),
                _ => None,
            })
            .collect()
    }

    fn created(p: &Plan) -> Vec<i32> {
        actions(p)
            .into_iter()
            .filter_map(|a| match a {
                Action::CreatePod { ordinal, .. } => Some(ordinal),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn st20_ordered_ready_creates_one_pod_after_the_ready_ones() {
        let s = set(3, Management::OrderedReady, rolling(0, None));
        assert_eq!(created(&plan(&s, &[], now())), [0]);
        assert_eq!(created(&plan(&s, &[pod(0, "new", true)], now())), [1]);
        // web-0 not Ready: nothing more.
        let p = plan(&s, &[pod(0, "new", false)], now());
        assert!(actions(&p).is_empty());
        assert!(p.blocked.is_some());
    }

    #[test]
    fn st21_parallel_creates_every_missing_pod() {
        let s = set(3, Management::Parallel, rolling(0, None));
        assert_eq!(created(&plan(&s, &[pod(1, "new", false)], now())), [0, 2]);
    }

    #[test]
    fn st22_ordered_scale_down_one_at_a_time_highest_first() {
        let s = set(1, Management::OrderedReady, rolling(0, None));
        let pods = [
            pod(0, "new", true),
            pod(1, "new", true),
            pod(2, "new", true),
        ];
        assert_eq!(deleted(&plan(&s, &pods, now())), ["web-2"]);
        let mut going = pods.clone();
        going[2].terminating = true;
        assert!(deleted(&plan(&s, &going, now())).is_empty());
    }

    #[test]
    fn b4_parallel_scales_down_before_creating() {
        let s = set(2, Management::Parallel, rolling(0, None));
        let pods = [
            pod(1, "new", false),
            pod(2, "new", true),
            pod(3, "new", true),
        ];
        let p = plan(&s, &pods, now());
        let a = actions(&p);
        let first_create = a
            .iter()
            .position(|a| matches!(a, Action::CreatePod { .. }))
            .unwrap();
        let last_delete = a
            .iter()
            .rposition(|a| matches!(a, Action::DeletePod { .. }))
            .unwrap();
        assert!(last_delete < first_create, "{a:?}");
        assert_eq!(deleted(&p), ["web-3", "web-2"]);
    }

    #[test]
    fn st27_ordered_ready_deletes_up_to_max_unavailable_from_the_top() {
        let pods: Vec<_> = (0..5).map(|i| pod(i, "old", true)).collect();
        let s = set(
            5,
            Management::OrderedReady,
            rolling(0, Some(IntOrString::Int(2))),
        );
        assert_eq!(deleted(&plan(&s, &pods, now())), ["web-4", "web-3"]);
        let s = set(5, Management::OrderedReady, rolling(0, None));
        assert_eq!(deleted(&plan(&s, &pods, now())), ["web-4"]);
        // Partition 4 protects web-0..web-3.
        let s = set(
            5,
            Management::OrderedReady,
            rolling(4, Some(IntOrString::Int(3))),
        );
        assert_eq!(deleted(&plan(&s, &pods, now())), ["web-4"]);
    }

    #[test]
    fn st28_parallel_replaces_broken_old_pods_regardless_of_the_budget() {
        // #137409: old pods that never became available do not block a fixed template.
        let s = set(3, Management::Parallel, rolling(0, None));
        let pods: Vec<_> = (0..3).map(|i| pod(i, "old", false)).collect();
        assert_eq!(
            deleted(&plan(&s, &pods, now())),
            ["web-2", "web-1", "web-0"]
        );
        // Available old pods go only within what the budget leaves.
        let mut mixed: Vec<_> = (0..4).map(|i| pod(i, "old", true)).collect();
        mixed[1].ready = false;
        let s = set(
            4,
            Management::Parallel,
            rolling(0, Some(IntOrString::Int(2))),
        );
        assert_eq!(deleted(&plan(&s, &mixed, now())), ["web-1", "web-3"]);
    }

    #[test]
    fn st29_unavailable_new_pods_consume_the_budget() {
        let s = set(
            5,
            Management::Parallel,
            rolling(0, Some(IntOrString::Int(2))),
        );
        let mut pods: Vec<_> = (0..5).map(|i| pod(i, "old", true)).collect();
        pods[4] = pod(4, "new", false);
        pods[3] = pod(3, "new", false);
        assert!(deleted(&plan(&s, &pods, now())).is_empty());
    }

    #[test]
    fn st25_max_unavailable_values() {
        let p = |s: &str| IntOrString::String(s.into());
        assert_eq!(max_unavailable(None, 10), Ok(1));
        assert_eq!(max_unavailable(Some(&IntOrString::Int(0)), 10), Ok(1));
        assert_eq!(max_unavailable(Some(&IntOrString::Int(7)), 3), Ok(7));
        assert_eq!(max_unavailable(Some(&p("50%")), 6), Ok(3));
        assert_eq!(max_unavailable(Some(&p("50%")), 5), Ok(2));
        assert_eq!(max_unavailable(Some(&p("1%")), 5), Ok(1));
        assert_eq!(max_unavailable(Some(&p("1000%")), i32::MAX), Ok(i32::MAX));
        assert!(max_unavailable(Some(&p("x")), 5).is_err());
    }

    #[test]
    fn st9_new_pods_below_the_partition_get_the_current_revision() {
        let s = set(5, Management::Parallel, rolling(3, None));
        assert_eq!(which_revision(&s, 2), Which::Current);
        assert_eq!(which_revision(&s, 3), Which::Update);
        let s = set(5, Management::Parallel, Strategy::OnDelete);
        assert_eq!(which_revision(&s, 0), Which::Update);
    }

    #[test]
    fn st31_on_delete_never_deletes_for_an_update() {
        let s = set(3, Management::Parallel, Strategy::OnDelete);
        let pods: Vec<_> = (0..3).map(|i| pod(i, "old", true)).collect();
        assert!(deleted(&plan(&s, &pods, now())).is_empty());
    }

    #[test]
    fn st38_terminal_pods_are_deleted_to_return() {
        let s = set(2, Management::OrderedReady, rolling(0, None));
        let mut failed = pod(0, "new", false);
        failed.phase = Some("Failed".into());
        assert_eq!(deleted(&plan(&s, &[failed], now())), ["web-0"]);
    }

    #[test]
    fn st30_min_ready_seconds_gates_availability_and_requeues() {
        let mut s = set(2, Management::OrderedReady, rolling(0, None));
        s.min_ready_seconds = 1200;
        let p = plan(&s, &[pod(0, "new", true)], now());
        // Ready for 600 s of 1200: not available, nothing created, look again in ~600 s.
        assert!(created(&p).is_empty());
        let again = p.requeue_after.unwrap();
        assert!(
            again >= Duration::from_secs(600) && again < Duration::from_secs(601),
            "{again:?}"
        );
    }

    #[test]
    fn b6_an_old_pod_unready_past_the_opt_in_limit_is_replaced() {
        let mut s = set(3, Management::OrderedReady, rolling(0, None));
        let pods = [
            pod(0, "new", true),
            pod(1, "old", false),
            pod(2, "old", true),
        ];
        // Off by default: web-1 blocks the rollout (upstream, #67250).
        let p = plan(&s, &pods, now());
        assert!(deleted(&p).is_empty());
        // Unready since 00:05, now 00:10: a 10 m limit waits 5 m more, a 5 m one replaces it.
        s.replace_unavailable_after = Some(Duration::from_secs(600));
        let p = plan(&s, &pods, now());
        assert!(deleted(&p).is_empty());
        let again = p.requeue_after.unwrap();
        assert!(
            again > Duration::from_secs(299) && again < Duration::from_secs(301),
            "{again:?}"
        );
        s.replace_unavailable_after = Some(Duration::from_secs(300));
        assert_eq!(deleted(&plan(&s, &pods, now())), ["web-1"]);
        // Not below the partition (it would come back old, and go again), not under OnDelete.
        s.strategy = rolling(2, None);
        let p = plan(&s, &pods, now());
        assert!(deleted(&p).is_empty() && p.requeue_after.is_none(), "{p:?}");
        s.strategy = Strategy::OnDelete;
        assert!(deleted(&plan(&s, &pods, now())).is_empty());
        s.strategy = rolling(0, None);
        // A new-revision pod that is unready is never replaced by it.
        let pods = [pod(0, "new", true), pod(1, "new", false)];
        assert!(deleted(&plan(&s, &pods, now())).is_empty());
        // A limit too long for any timestamp never fires.
        s.replace_unavailable_after = Some(Duration::MAX);
        assert!(deleted(&plan(&s, &[pod(0, "old", false)], now())).is_empty());
    }

    #[test]
    fn extremes_do_not_panic() {
        let mut s = set(
            i32::MAX,
            Management::Parallel,
            rolling(i32::MAX, Some(IntOrString::String("100%".into()))),
        );
        s.start = i32::MAX;
        s.min_ready_seconds = i32::MAX;
        // Only ordinals that fit an int32 exist.
        let p = plan(&s, &[pod(i32::MAX, "new", true)], now());
        assert!(created(&p).is_empty());
        // ... and the plan says how many replicas cannot have one, for a Warning.
        assert_eq!(
            p.beyond_ordinals.as_deref(),
            Some(
                "spec.ordinals.start (2147483647) + spec.replicas (2147483647) passes the largest ordinal (2147483647): 2147483646 replica(s) cannot have a pod"
            )
        );
        s.start = 0;
        assert_eq!(
            plan(&s, &[], now()).beyond_ordinals,
            None,
            "0..=i32::MAX-1 fits"
        );
        let mut s = set(-5, Management::OrderedReady, rolling(-3, None));
        s.start = -7;
        let _ = plan(&s, &[pod(0, "old", true)], now());
    }

    /// Two billion replicas and a pod near the top: the missing budget is spent at once and
    /// the gap up to that pod is counted, not walked (this took minutes of CPU a sync).
    #[test]
    fn a_pod_far_beyond_the_missing_budget_is_reached_without_walking_the_gap() {
        let s = set(i32::MAX, Management::Parallel, rolling(0, None));
        let started = std::time::Instant::now();
        let p = plan(&s, &[pod(2_147_483_640, "new", true)], now());
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        assert_eq!(created(&p).len(), MAX_MISSING);
    }
}

#[cfg(test)]
#[path = "plan_props.rs"]
mod props;
