//! The NodeMaintenance API, `pilothouse.dev/v1alpha1`, that NM-1..NM-23 act on. The CRD in
//! `crds/` is generated from these types (`pilothouse crd`); a test fails when the committed file
//! is stale.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The finalizer that holds the object until its node is released (added by NM-5, removed by
/// NM-1).
pub const FINALIZER: &str = "pilothouse.dev/maintenance-completion";
/// Node annotation: `spec.unschedulable` before the first active maintenance cordoned it.
pub const ANNOTATION_PRE_MAINTENANCE_UNSCHEDULABLE: &str =
    "pilothouse.dev/pre-maintenance-unschedulable";
/// Node taint (NoSchedule) marking a node held by an active maintenance.
pub const TAINT_MAINTENANCE: &str = "pilothouse.dev/maintenance";
/// Pod condition set before a target's first eviction attempt (NM-12).
pub const POD_CONDITION_TARGETED: &str = "TargetedByNodeMaintenance";

/// Condition types of the object, True respectively when its node is cordoned and tainted, when
/// no target is left to drain, when a target's last eviction attempt failed, and when the drain
/// deadline passed before the node was drained.
pub const CONDITION_CORDONED: &str = "Cordoned";
pub const CONDITION_DRAINED: &str = "Drained";
pub const CONDITION_EVICTION_BLOCKED: &str = "EvictionBlocked";
pub const CONDITION_DEADLINE_EXCEEDED: &str = "DeadlineExceeded";

/// A request to take one node out of service: cordon it, and in stage `Drain` evict its pods
/// through the Eviction API, honouring PodDisruptionBudgets, with progress and named blockers.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "pilothouse.dev",
    version = "v1alpha1",
    kind = "NodeMaintenance",
    plural = "nodemaintenances",
    shortname = "pnm",
    status = "NodeMaintenanceStatus",
    derive = "PartialEq",
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".spec.nodeName"}"#,
    printcolumn = r#"{"name":"Stage","type":"string","jsonPath":".spec.stage"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Targeted","type":"integer","jsonPath":".status.progress.targeted"}"#,
    printcolumn = r#"{"name":"Evicted","type":"integer","jsonPath":".status.progress.evicted"}"#,
    printcolumn = r#"{"name":"Pending","type":"integer","jsonPath":".status.progress.pending"}"#,
    printcolumn = r#"{"name":"Blocked","type":"integer","jsonPath":".status.progress.blocked"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","priority":1,"jsonPath":".spec.reason"}"#,
    printcolumn = r#"{"name":"Blocking","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"EvictionBlocked\")].message"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "self.stage == oldSelf.stage || oldSelf.stage == 'Idle' || \
     (oldSelf.stage == 'Cordon' && self.stage in ['Drain', 'Complete']) || \
     (oldSelf.stage == 'Drain' && self.stage == 'Complete')"
).message("stage may only advance: Idle -> Cordon -> Drain -> Complete"))]
#[x_kube(validation = Rule::new(
    "oldSelf.stage == 'Idle' || (has(self.drain.podSelector) == has(oldSelf.drain.podSelector) && \
     (!has(self.drain.podSelector) || self.drain.podSelector == oldSelf.drain.podSelector))"
).message("drain.podSelector is immutable once the maintenance has left Idle"))]
pub struct NodeMaintenanceSpec {
    /// The node to take out of service. Immutable.
    #[x_kube(validation = Rule::new("self == oldSelf").message("nodeName is immutable"))]
    #[schemars(length(min = 1, max = 253))]
    #[schemars(regex(
        pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
    ))]
    pub node_name: String,
    /// KEP-4212 stage; only advances. `Drain` by default, so that creating the object drains.
    #[serde(default)]
    pub stage: Stage,
    /// Why; copied into events and the pod condition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub reason: Option<String>,
    /// How the node is drained.
    #[serde(default)]
    pub drain: DrainSpec,
}

/// KEP-4212's stages.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Stage {
    Idle,
    Cordon,
    #[default]
    Drain,
    Complete,
}

impl Stage {
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Idle => "Idle",
            Stage::Cordon => "Cordon",
            Stage::Drain => "Drain",
            Stage::Complete => "Complete",
        }
    }
}

/// The drain's options; kubectl drain's flags where it has one.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.timeoutPolicy != 'Delete' || has(self.timeoutSeconds)")
    .message("timeoutPolicy Delete requires timeoutSeconds"))]
pub struct DrainSpec {
    /// Only pods matching this selector are drained (kubectl `--pod-selector`); all by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
    /// Consent for pods without a controller, or whose DaemonSet is gone (kubectl `--force`).
    #[serde(default = "yes")]
    pub force: bool,
    /// Consent for pods with `emptyDir` volumes (kubectl `--delete-emptydir-data`).
    #[serde(default = "yes")]
    pub delete_empty_dir_data: bool,
    /// Grace period for evictions and deletions; the pod's own when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub grace_period_seconds: Option<i64>,
    /// A target terminating longer than this counts as gone (kubectl).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub skip_wait_for_delete_timeout_seconds: Option<i64>,
    /// `Parallel`, or `PriorityWaves` (by priority class value, each wave after the previous).
    #[serde(default)]
    pub ordering: DrainOrdering,
    /// Deadline for the drain, from `status.drain.startTime`; none when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub timeout_seconds: Option<i64>,
    /// What happens at the deadline: `Wait` (default) or `Delete` (bypasses PDBs).
    #[serde(default)]
    pub timeout_policy: TimeoutPolicy,
}

fn yes() -> bool {
    true
}

impl Default for DrainSpec {
    fn default() -> Self {
        DrainSpec {
            pod_selector: None,
            force: true,
            delete_empty_dir_data: true,
            grace_period_seconds: None,
            skip_wait_for_delete_timeout_seconds: None,
            ordering: DrainOrdering::default(),
            timeout_seconds: None,
            timeout_policy: TimeoutPolicy::default(),
        }
    }
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DrainOrdering {
    #[default]
    Parallel,
    PriorityWaves,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TimeoutPolicy {
    #[default]
    Wait,
    Delete,
}

/// Observed state, written only by the controller.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeMaintenanceStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// One entry per stage acted on, when first acted on (KEP-4212).
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    #[schemars(length(max = 4))]
    pub stage_statuses: Vec<StageStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<DrainStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,
    /// The targets, blocked first then oldest; at most 512 (`progress.truncated` says so), each
    /// message at most 256 bytes: the status stays well under etcd's object size limit.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["namespace", "name"]))]
    #[schemars(length(max = 512))]
    pub targeted_pods: Vec<TargetedPod>,
    /// The last error that was not a PodDisruptionBudget refusal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// The phase, derived from the rest: `Pending` (not acted on; node missing or replaced), `Idle`,
/// `Cordoned` (cordon done), `Draining` (also past the deadline), `Drained`, `Completing`
/// (Complete or deleting, cleanup running), `Completed`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    Pending,
    Idle,
    Cordoned,
    Draining,
    Drained,
    Completing,
    Completed,
}

impl Phase {
    pub const ALL: [Phase; 7] = [
        Phase::Pending,
        Phase::Idle,
        Phase::Cordoned,
        Phase::Draining,
        Phase::Drained,
        Phase::Completing,
        Phase::Completed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Idle => "Idle",
            Phase::Cordoned => "Cordoned",
            Phase::Draining => "Draining",
            Phase::Drained => "Drained",
            Phase::Completing => "Completing",
            Phase::Completed => "Completed",
        }
    }
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StageStatus {
    pub name: Stage,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DrainStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<Time>,
    /// Pods on the node when the drain started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_pods: Option<i64>,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Progress {
    /// Pods ever selected as targets.
    #[serde(default)]
    pub targeted: i64,
    /// Targets gone after their eviction (or deletion) was accepted.
    #[serde(default)]
    pub evicted: i64,
    /// Targets accepted for eviction and still present.
    #[serde(default)]
    pub terminating: i64,
    /// Targets present and not terminating.
    #[serde(default)]
    pub pending: i64,
    /// Pending targets whose last attempt failed.
    #[serde(default)]
    pub blocked: i64,
    #[serde(default)]
    pub skipped: Skipped,
    /// evicted * 100 / targeted (100 when nothing is targeted).
    #[serde(default)]
    #[schemars(range(min = 0, max = 100))]
    pub percent: i32,
    /// `targetedPods` holds only the first 512 targets.
    #[serde(default)]
    pub truncated: bool,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Skipped {
    #[serde(default)]
    pub daemon_set: i64,
    #[serde(default)]
    pub mirror: i64,
    #[serde(default)]
    pub not_selected: i64,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TargetedPod {
    pub namespace: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    pub state: TargetState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<EvictionMethod>,
    /// `PodDisruptionBudget`, `PodDisruptionBudgetDeadlock`, `MultiplePodDisruptionBudgets`,
    /// `EvictionDenied` or `EvictionError`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_disruption_budget: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default)]
    pub attempts: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_attempt_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_attempt_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_time: Option<Time>,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TargetState {
    Pending,
    Blocked,
    Terminating,
    Gone,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EvictionMethod {
    Eviction,
    Delete,
}
