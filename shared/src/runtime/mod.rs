//! What every controller runs on: the `Setup` → `Wiring` seam, the work queue, events, claims
//! (adoption and release), and the guard against kube-controller-manager running a controller
//! we run.

pub mod claim;
pub mod conflicts;
pub mod controller;
pub mod events;
pub mod gates;
pub mod queue;
