//! One process: kube-controller-manager-compatible flags and the manager that builds clients,
//! caches, election and serving, and runs the enabled controllers.

pub mod flags;
pub mod manager;
pub mod setup;
