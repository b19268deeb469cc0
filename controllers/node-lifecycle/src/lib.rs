//! `node-lifecycle-controller` (spec §2). In progress: the pure decisions in [`plan`] are
//! written and unit-tested; the controller wiring is not, so the binary still lists this
//! controller as planned and refuses to enable it.

pub mod plan;
