//! The runtime every Pilothouse controller uses, in layers that import only downwards (checked
//! by `layering_test` below):
//!
//! | layer | what | may use |
//! |---|---|---|
//! | [`meta`] | keys, references, selectors, Go compatibility, time | nothing of ours |
//! | [`metrics`] | the registry and the families every layer reports into | `meta` |
//! | [`api`] | API errors, rate limit, clients, credentials, the writer, retries | the above |
//! | [`cache`] | informers, the compact pod, projections, read-your-writes records | the above |
//! | [`runtime`] | the controller seam, queue, events, claims, the kcm double-run guard | the above |
//! | [`election`] | Lease leader election | the above |
//! | [`serving`] | health, `/metrics` and the secure port, logging | the above |
//! | [`process`] | flags and the manager that assembles one process | the above |
//! | `testkit` | the sync-test kit | everything |

// Tests may do plain arithmetic on the times they choose; the runtime itself may not (clippy.toml).
#![cfg_attr(
    test,
    allow(
        clippy::arithmetic_side_effects,
        clippy::unchecked_time_subtraction,
        clippy::too_many_lines
    )
)]

pub mod meta;

pub mod metrics;

pub mod api;

pub mod cache;

pub mod runtime;

pub mod election;

pub mod serving;

pub mod process;

#[cfg(any(test, feature = "testkit"))]
pub mod testkit;

#[cfg(test)]
mod layering_test;

/// Locks `m`, taking the data even if a panicking holder poisoned it: every lock in Pilothouse
/// guards memory a sync can rebuild, and a contained panic must not wedge the other keys.
pub fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Reads `l`, taking the data even if a panicking writer poisoned it (see [`lock`]).
pub fn read<T>(l: &std::sync::RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|p| p.into_inner())
}

/// Writes `l`, taking the data even if a panicking holder poisoned it (see [`lock`]).
pub fn write<T>(l: &std::sync::RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|p| p.into_inner())
}
