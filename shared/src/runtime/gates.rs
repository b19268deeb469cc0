//! The feature gates the controllers read. Parsing `--feature-gates` belongs to the flags
//! (`process::flags`); a controller sees only the resolved values in its `Setup`.

/// Feature gates Pilothouse reads, with kube-controller-manager 1.37's defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FeatureGates {
    /// Alpha in 1.37 (default off): `Lt`/`Gt` toleration operators.
    pub taint_toleration_comparison_operators: bool,
    /// Beta in 1.37 (default on): node lifecycle reads a node's live Lease before it marks the
    /// node unreachable from the cached one, and judges no node while the cache is behind it.
    pub node_controller_lease_circuit_breaker: bool,
    /// Alpha in 1.37 (default off): StatefulSet `updateStrategy.type: Recreate` (KEP-3541).
    pub stateful_set_recreate_strategy: bool,
    /// Beta in 1.37 (default on): suspending a Job clears its `status.startTime`.
    pub mutable_scheduling_directives_for_suspended_jobs: bool,
}

impl Default for FeatureGates {
    fn default() -> Self {
        FeatureGates {
            taint_toleration_comparison_operators: false,
            node_controller_lease_circuit_breaker: true,
            stateful_set_recreate_strategy: false,
            mutable_scheduling_directives_for_suspended_jobs: true,
        }
    }
}
