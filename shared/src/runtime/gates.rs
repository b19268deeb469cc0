//! The feature gates the controllers read. Parsing `--feature-gates` belongs to the flags
//! (`process::flags`); a controller sees only the resolved values in its `Setup`.

/// Feature gates Pilothouse reads, with kube-controller-manager 1.37's defaults (all off).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FeatureGates {
    /// Alpha in 1.37 (default off): `Lt`/`Gt` toleration operators.
    pub taint_toleration_comparison_operators: bool,
}
