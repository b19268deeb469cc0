//! The runtime every Pilothouse controller uses: flags, clients, shared caches, work queues,
//! expectations, leader election, events, metrics and health.

// Tests may do plain arithmetic on the times they choose; the runtime itself may not (issue 17).
#![cfg_attr(
    test,
    allow(clippy::arithmetic_side_effects, clippy::unchecked_time_subtraction)
)]

pub mod apierr;
pub mod claim;
pub mod client;
pub mod clock;
pub mod conflicts;
pub mod consistency;
pub mod controller;
pub mod credentials;
pub mod election;
pub mod events;
pub mod expectations;
pub mod flags;
pub mod gocompat;
pub mod health;
pub mod informers;
pub mod logging;
pub mod manager;
pub mod metrics;
pub mod own_writes;
pub mod pod;
pub mod projection;
pub mod queue;
pub mod ratelimit;
pub mod refs;
pub mod retry;
pub mod selector;
pub mod serving;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
pub mod writer;

/// Locks `m`, taking the data even if a panicking holder poisoned it: every lock in Pilothouse
/// guards memory a sync can rebuild, and a contained panic must not wedge the other keys.
pub fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
