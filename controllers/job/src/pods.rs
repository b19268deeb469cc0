//! What the Job controller reads off a pod: phase, activity, readiness, completion index, index
//! failure counts, finish time, and upstream's deletion preference order.

use k8s_openapi::api::core::v1::ContainerStatus;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use shared::cache::pod::Pod;
use std::cmp::Ordering;

pub const TRACKING_FINALIZER: &str = "batch.kubernetes.io/job-tracking";
pub const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";
pub const INDEX_FAILURE_COUNT: &str = "batch.kubernetes.io/job-index-failure-count";
pub const INDEX_IGNORED_FAILURE_COUNT: &str = "batch.kubernetes.io/job-index-ignored-failure-count";

pub fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

pub fn succeeded(pod: &Pod) -> bool {
    phase(pod) == "Succeeded"
}

pub fn failed_phase(pod: &Pod) -> bool {
    phase(pod) == "Failed"
}

pub fn terminal(pod: &Pod) -> bool {
    succeeded(pod) || failed_phase(pod)
}

pub fn deleting(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

/// Non-terminal and not being deleted (upstream `IsPodActive`).
pub fn active(pod: &Pod) -> bool {
    !terminal(pod) && !deleting(pod)
}

/// Being deleted but not terminal yet (upstream `IsPodTerminating`).
pub fn terminating(pod: &Pod) -> bool {
    !terminal(pod) && deleting(pod)
}

pub fn has_tracking_finalizer(pod: &Pod) -> bool {
    pod.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == TRACKING_FINALIZER)
}

pub fn ready(pod: &Pod) -> bool {
    pod.is_ready()
}

pub fn uid(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or_default()
}

pub fn name(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or_default()
}

/// The completion index annotation, if it is a non-negative integer.
pub fn completion_index(pod: &Pod) -> Option<i32> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(COMPLETION_INDEX)?
        .parse::<i32>()
        .ok()
        .filter(|i| *i >= 0)
}

/// An index annotation parsed as upstream's `parseInt32`: 0 when missing, malformed or out of range.
fn annotation_count(pod: &Pod, key: &str) -> i32 {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .and_then(|v| v.parse::<i64>().ok())
        .filter(|v| (0..=i64::from(i32::MAX)).contains(v))
        .map_or(0, |v| v as i32)
}

pub fn index_failure_count(pod: &Pod) -> i32 {
    annotation_count(pod, INDEX_FAILURE_COUNT)
}

pub fn index_ignored_failure_count(pod: &Pod) -> i32 {
    annotation_count(pod, INDEX_IGNORED_FAILURE_COUNT)
}

/// Counted plus ignored failures of the pod's index before this pod.
pub fn index_absolute_failure_count(pod: &Pod) -> i32 {
    index_failure_count(pod).saturating_add(index_ignored_failure_count(pod))
}

fn container_statuses(pod: &Pod) -> &[ContainerStatus] {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_deref())
        .unwrap_or_default()
}

fn init_container_statuses(pod: &Pod) -> &[ContainerStatus] {
    pod.status
        .as_ref()
        .and_then(|s| s.init_container_statuses.as_deref())
        .unwrap_or_default()
}

/// Names of restartable (sidecar) init containers.
fn sidecars(pod: &Pod) -> Vec<&str> {
    pod.spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten())
        .filter(|c| c.restart_policy.as_deref() == Some("Always"))
        .map(|c| c.name.as_str())
        .collect()
}

/// JR-35: when the pod finished. Latest container `finishedAt` (sidecars included) when every
/// such container has one; else the last `Ready=False` transition; else the deletion time minus
/// the grace period; else the creation time.
pub fn finished_time(pod: &Pod) -> Timestamp {
    let side = sidecars(pod);
    let statuses = container_statuses(pod).iter().chain(
        init_container_statuses(pod)
            .iter()
            .filter(|s| side.contains(&s.name.as_str())),
    );
    let mut latest: Option<Timestamp> = None;
    let mut complete = true;
    for s in statuses {
        match s
            .state
            .as_ref()
            .and_then(|st| st.terminated.as_ref())
            .and_then(|t| t.finished_at.as_ref())
        {
            Some(t) => latest = Some(latest.map_or(t.0, |l| l.max(t.0))),
            None => {
                complete = false;
                break;
            }
        }
    }
    if complete && let Some(t) = latest {
        return t;
    }
    let ready_false = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .filter(|c| c.status == "False")
        .and_then(|c| c.last_transition_time.as_ref());
    if let Some(t) = ready_false {
        return t.0;
    }
    if let Some(d) = &pod.metadata.deletion_timestamp {
        // The grace period is any int64 the API accepted: an out-of-range difference falls
        // back to the deletion time itself rather than panicking.
        let grace = pod.metadata.deletion_grace_period_seconds.unwrap_or(0);
        return d
            .0
            .checked_sub(SignedDuration::from_secs(grace))
            .unwrap_or(d.0);
    }
    pod.metadata
        .creation_timestamp
        .as_ref()
        .map_or(Timestamp::UNIX_EPOCH, |t| t.0)
}

/// Sum of restart counts over init and regular containers (JR-33).
pub fn restart_count(pod: &Pod) -> i64 {
    container_statuses(pod)
        .iter()
        .chain(init_container_statuses(pod))
        .map(|s| i64::from(s.restart_count))
        .sum()
}

fn phase_ordinal(pod: &Pod) -> u8 {
    match phase(pod) {
        "Unknown" => 1,
        "Running" => 2,
        _ => 0,
    }
}

fn ready_time(pod: &Pod) -> Option<Timestamp> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "True")?
        .last_transition_time
        .as_ref()
        .map(|t| t.0)
}

fn max_restarts(pod: &Pod) -> (i32, i32) {
    let regular = container_statuses(pod)
        .iter()
        .map(|s| s.restart_count)
        .max()
        .unwrap_or(0);
    let side = sidecars(pod);
    let sidecar = init_container_statuses(pod)
        .iter()
        .filter(|s| side.contains(&s.name.as_str()))
        .map(|s| s.restart_count)
        .max()
        .unwrap_or(0);
    (regular, sidecar)
}

/// `afterOrZero`: a zero (missing) time sorts first, then later before earlier.
fn after_or_zero(a: Option<Timestamp>, b: Option<Timestamp>) -> Ordering {
    match (a, b) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
        (Some(a), Some(b)) => b.cmp(&a),
    }
}

/// Upstream's `ActivePods` order: the pods to delete first come first (unassigned, pending,
/// not ready, ready for less time, more restarts, newer).
pub fn deletion_order(a: &Pod, b: &Pod) -> Ordering {
    let node = |p: &Pod| {
        p.spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default()
    };
    let (na, nb) = (node(a), node(b));
    if na != nb && (na.is_empty() || nb.is_empty()) {
        return if na.is_empty() {
            Ordering::Less
        } else {
            Ordering::Greater
        };
    }
    phase_ordinal(a)
        .cmp(&phase_ordinal(b))
        .then_with(|| ready(a).cmp(&ready(b)))
        .then_with(|| {
            if ready(a) && ready(b) {
                after_or_zero(ready_time(a), ready_time(b))
            } else {
                Ordering::Equal
            }
        })
        .then_with(|| {
            // Higher restart counts first: sidecars compared only when regular counts tie.
            let ((ra, sa), (rb, sb)) = (max_restarts(a), max_restarts(b));
            rb.cmp(&ra).then(sb.cmp(&sa))
        })
        .then_with(|| {
            after_or_zero(
                a.metadata.creation_timestamp.as_ref().map(|t| t.0),
                b.metadata.creation_timestamp.as_ref().map(|t| t.0),
            )
        })
}

#[cfg(test)]
pub(crate) mod testing {
    //! Pod builders for unit tests.
    use super::*;
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStateTerminated, PodCondition};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use shared::cache::pod::{PodSpec, PodStatus};

    pub fn ts(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).unwrap()
    }

    pub struct P(pub Pod);

    pub fn pod(name: &str) -> P {
        P(Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                uid: Some(format!("uid-{name}")),
                finalizers: Some(vec![TRACKING_FINALIZER.into()]),
                creation_timestamp: Some(Time(ts(1000))),
                ..Default::default()
            },
            spec: Some(PodSpec::default()),
            status: Some(PodStatus {
                phase: Some("Pending".into()),
                ..Default::default()
            }),
        })
    }

    impl P {
        pub fn phase(mut self, p: &str) -> Self {
            self.0.status.as_mut().unwrap().phase = Some(p.into());
            self
        }
        pub fn running(self) -> Self {
            self.phase("Running").node("n")
        }
        pub fn node(mut self, n: &str) -> Self {
            self.0.spec.as_mut().unwrap().node_name = Some(n.into());
            self
        }
        pub fn ready(mut self) -> Self {
            self.0
                .status
                .as_mut()
                .unwrap()
                .conditions
                .get_or_insert_with(Vec::new)
                .push(PodCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    last_transition_time: Some(Time(ts(1100))),
                    ..Default::default()
                });
            self
        }
        pub fn condition(mut self, type_: &str, status: &str) -> Self {
            self.0
                .status
                .as_mut()
                .unwrap()
                .conditions
                .get_or_insert_with(Vec::new)
                .push(PodCondition {
                    type_: type_.into(),
                    status: status.into(),
                    ..Default::default()
                });
            self
        }
        /// Failed with one container `c` exiting `code` at `at` seconds.
        pub fn exit(mut self, code: i32, at: i64) -> Self {
            let st = self.0.status.as_mut().unwrap();
            st.phase = Some(if code == 0 { "Succeeded" } else { "Failed" }.into());
            st.container_statuses = Some(vec![ContainerStatus {
                name: "c".into(),
                state: Some(ContainerState {
                    terminated: Some(ContainerStateTerminated {
                        exit_code: code,
                        finished_at: Some(Time(ts(at))),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }]);
            self
        }
        pub fn restarts(mut self, n: i32) -> Self {
            let st = self.0.status.as_mut().unwrap();
            st.container_statuses = Some(vec![ContainerStatus {
                name: "c".into(),
                restart_count: n,
                ..Default::default()
            }]);
            self
        }
        pub fn deleting(mut self, at: i64, grace: i64) -> Self {
            self.0.metadata.deletion_timestamp = Some(Time(ts(at)));
            self.0.metadata.deletion_grace_period_seconds = Some(grace);
            self
        }
        pub fn no_finalizer(mut self) -> Self {
            self.0.metadata.finalizers = None;
            self
        }
        pub fn annotate(mut self, k: &str, v: &str) -> Self {
            self.0
                .metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(k.into(), v.into());
            self
        }
        pub fn index(self, i: i32) -> Self {
            self.annotate(COMPLETION_INDEX, &i.to_string())
        }
        pub fn created(mut self, at: i64) -> Self {
            self.0.metadata.creation_timestamp = Some(Time(ts(at)));
            self
        }
        pub fn build(self) -> Pod {
            self.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    #[test]
    fn classification() {
        let run = pod("a").running().build();
        assert!(active(&run) && !terminating(&run) && !terminal(&run));
        let del = pod("b").running().deleting(2000, 30).build();
        assert!(!active(&del) && terminating(&del));
        let done = pod("c").exit(0, 1500).deleting(2000, 30).build();
        assert!(!active(&done) && !terminating(&done) && terminal(&done));
    }

    #[test]
    fn jr35_finished_time() {
        assert_eq!(finished_time(&pod("a").exit(1, 1500).build()), ts(1500));
        // No terminated container: Ready=False transition.
        let mut p = pod("b").phase("Failed").build();
        p.status.as_mut().unwrap().conditions =
            Some(vec![k8s_openapi::api::core::v1::PodCondition {
                type_: "Ready".into(),
                status: "False".into(),
                last_transition_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    ts(1700),
                )),
                ..Default::default()
            }]);
        assert_eq!(finished_time(&p), ts(1700));
        assert_eq!(
            finished_time(&pod("c").running().deleting(2000, 30).build()),
            ts(1970)
        );
        assert_eq!(finished_time(&pod("d").build()), ts(1000));
        // Extremes the API accepts: no panic, the deletion time stands.
        assert_eq!(
            finished_time(&pod("e").running().deleting(2000, i64::MAX).build()),
            ts(2000)
        );
        assert_eq!(
            finished_time(&pod("f").running().deleting(2000, i64::MIN).build()),
            ts(2000)
        );
    }

    #[test]
    fn index_annotations() {
        assert_eq!(completion_index(&pod("a").index(3).build()), Some(3));
        assert_eq!(
            completion_index(&pod("a").annotate(COMPLETION_INDEX, "-1").build()),
            None
        );
        assert_eq!(
            completion_index(&pod("a").annotate(COMPLETION_INDEX, "x").build()),
            None
        );
        let p = pod("a")
            .annotate(INDEX_FAILURE_COUNT, "2")
            .annotate(INDEX_IGNORED_FAILURE_COUNT, "3")
            .build();
        assert_eq!(index_absolute_failure_count(&p), 5);
        assert_eq!(
            index_failure_count(&pod("a").annotate(INDEX_FAILURE_COUNT, "-4").build()),
            0
        );
    }

    #[test]
    fn deletion_order_prefers_early_stage_pods() {
        let unassigned = pod("unassigned").build();
        let pending = pod("pending").node("n").build();
        let running = pod("running").running().build();
        let ready = pod("ready").running().ready().build();
        let mut v = [&ready, &running, &pending, &unassigned];
        v.sort_by(|a, b| deletion_order(a, b));
        let names: Vec<&str> = v.iter().map(|p| name(p)).collect();
        assert_eq!(names, vec!["unassigned", "pending", "running", "ready"]);
        // Newer before older; more restarts before fewer.
        let old = pod("old").running().created(100).build();
        let new = pod("new").running().created(200).build();
        assert_eq!(deletion_order(&new, &old), Ordering::Less);
        let flappy = pod("flappy").running().restarts(3).created(100).build();
        assert_eq!(deletion_order(&flappy, &new), Ordering::Less);
    }
}
