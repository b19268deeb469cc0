//! kube-controller-manager-compatible options: the same names and defaults wherever upstream has a
//! counterpart, Go-style durations (`15s`, `1m30s`), `--flag=false` for booleans, and a record of
//! which options were set explicitly so that no config default overrides a flag.

use clap::parser::ValueSource;
use clap::{ArgMatches, Args};
use std::collections::BTreeSet;
use std::time::Duration;

use crate::runtime::controller::ControllerInfo;
use crate::runtime::gates::FeatureGates;
use crate::serving::logging::LoggingFormat;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FlagError {
    #[error("invalid duration {0:?}: want a Go duration such as 300ms, 15s, 1m30s or 2h")]
    Duration(String),
    #[error("{name:?} is not in the list of known controllers; valid names: {valid}")]
    UnknownController { name: String, valid: String },
    #[error("{name:?} is planned but not built yet in this Pilothouse; built controllers: {built}")]
    PlannedController { name: String, built: String },
    #[error("--leader-elect-resource-lock={0:?} is not supported: Pilothouse only uses \"leases\"")]
    ResourceLock(String),
    #[error("--feature-gates: {0}")]
    FeatureGate(String),
}

/// How Pilothouse treats a gate that a controller it replaces reads (at kcm 1.37's default
/// unless the operator sets it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateSupport {
    /// Both values behave as kube-controller-manager's.
    Honoured,
    /// Pilothouse has only the behaviour with the gate on: off is refused, with the reason.
    OnOnly(&'static str),
    /// Pilothouse has only the behaviour with the gate off: on is refused, with the reason (or,
    /// where on is kcm's default, accepted with a warning that names the divergence).
    OffOnly(&'static str),
}

/// Every gate that kube-controller-manager 1.37's code of the replaced controllers reads (the
/// `reads` column of `kcm-vocabulary.txt`; a test keeps the two equal), and what Pilothouse does
/// with it.
pub const GATE_SUPPORT: &[(&str, GateSupport)] = &[
    (
        "JobManagedBy",
        GateSupport::OnOnly(
            "Pilothouse always leaves a Job whose spec.managedBy names another controller alone",
        ),
    ),
    (
        "MaxUnavailableStatefulSet",
        GateSupport::OnOnly(
            "Pilothouse always honours a StatefulSet's rollingUpdate.maxUnavailable",
        ),
    ),
    (
        "MutableSchedulingDirectivesForSuspendedJobs",
        GateSupport::Honoured,
    ),
    ("NodeControllerLeaseCircuitBreaker", GateSupport::Honoured),
    (
        "PreferSameTrafficDistribution",
        GateSupport::OnOnly(
            "Pilothouse always gives hints for trafficDistribution PreferSameZone and PreferSameNode",
        ),
    ),
    (
        "SeparateTaintEvictionController",
        GateSupport::OnOnly("taint eviction is always its own controller in Pilothouse"),
    ),
    (
        "StaleControllerConsistencyJob",
        GateSupport::OnOnly(
            "Pilothouse's Job controller always waits for its caches to show its own writes",
        ),
    ),
    (
        "StaleControllerConsistencyStatefulSet",
        GateSupport::OnOnly(
            "Pilothouse's StatefulSet controller always waits for its caches to show its own writes",
        ),
    ),
    ("StatefulSetRecreateStrategy", GateSupport::Honoured),
    (
        "StatefulSetSemanticRevisionComparison",
        GateSupport::OnOnly("Pilothouse always compares revisions by their content"),
    ),
    ("TaintTolerationComparisonOperators", GateSupport::Honoured),
    (
        "WorkloadWithJob",
        GateSupport::OffOnly("not built: Pilothouse creates no Workload or PodGroup for a Job"),
    ),
];

impl GateSupport {
    fn of(name: &str) -> Option<GateSupport> {
        GATE_SUPPORT
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, s)| *s)
    }
}

/// One row of the gate reference (`docs/flags.md`, `--help`).
pub struct GateRow {
    pub name: &'static str,
    pub stage: &'static str,
    pub default: bool,
    pub locked: bool,
    /// The replaced controllers that read it.
    pub readers: Vec<&'static str>,
    pub support: GateSupport,
}

/// The gates the replaced controllers read, with kcm 1.37's stage and default and Pilothouse's
/// support, by name.
pub fn gate_rows() -> Vec<GateRow> {
    kcm::gates()
        .filter(|g| !g.readers.is_empty())
        .map(|g| GateRow {
            name: g.name,
            stage: g.stage,
            default: g.default,
            locked: g.locked,
            readers: g.readers.clone(),
            support: GateSupport::of(g.name)
                .unwrap_or(GateSupport::OffOnly("unknown to Pilothouse")),
        })
        .collect()
}

/// `--feature-gates`' long help: the gates the replaced controllers read.
pub fn feature_gates_help() -> String {
    let mut help = "A set of key=value pairs for alpha/beta features, as kube-controller-manager's: every gate of kube-controller-manager 1.37 is accepted (a locked one at its default only), AllAlpha and AllBeta included, and unknown names are refused. Gates the replaced controllers read:".to_string();
    for r in gate_rows() {
        let what = match r.support {
            GateSupport::Honoured => "honoured".to_string(),
            GateSupport::OnOnly(_) => "only true".to_string(),
            GateSupport::OffOnly(_) if r.default => {
                "only false (kcm's default differs)".to_string()
            }
            GateSupport::OffOnly(_) => "only false".to_string(),
        };
        help.push_str(&format!(
            " {}={} ({} - default={}): {what};",
            r.name,
            if r.locked {
                r.default.to_string()
            } else {
                "true|false".to_string()
            },
            r.stage,
            r.default
        ));
    }
    help.pop();
    help.push_str(". The reasons are in the Feature gates table of docs/flags.md.");
    help
}

impl FeatureGates {
    /// Parses `Name=bool,...` as kube-controller-manager's `--feature-gates` does: an unknown
    /// name, a non-boolean value or a locked gate set off its default is an error with kcm's
    /// words. A gate a replaced controller reads is honoured, or refused at the value whose
    /// behaviour Pilothouse does not have ([`GATE_SUPPORT`]); any other gate is accepted and
    /// changes nothing here.
    pub fn parse(items: &[String]) -> Result<FeatureGates, FlagError> {
        // Set explicitly, in order (a later value of a gate wins, as in kcm's map).
        let mut explicit: Vec<(&'static str, bool)> = Vec::new();
        for item in items.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
            let (name, value) = item
                .split_once('=')
                .ok_or_else(|| FlagError::FeatureGate(format!("missing bool value for {item}")))?;
            let value = go_parse_bool(value.trim()).ok_or_else(|| {
                FlagError::FeatureGate(format!(
                    "invalid value of {name}={value}, err: strconv.ParseBool: parsing {:?}: invalid syntax",
                    value.trim()
                ))
            })?;
            // kcm 1.37 also takes `component:Name`; `kube` is the only component it has.
            let name = name.trim();
            let name = name.strip_prefix("kube:").unwrap_or(name);
            let Some(gate) = kcm::gate(name) else {
                return Err(FlagError::FeatureGate(format!(
                    "unrecognized feature gate: {name}"
                )));
            };
            if gate.locked && value != gate.default {
                return Err(FlagError::FeatureGate(format!(
                    "cannot set feature gate {name} to {value}, feature is locked to {}",
                    gate.default
                )));
            }
            explicit.retain(|(n, _)| *n != gate.name);
            explicit.push((gate.name, value));
        }
        // AllAlpha and AllBeta set every alpha or beta gate not set by name (component-base's
        // special gates): expanded over the gates Pilothouse reads.
        let all = |special: &str| explicit.iter().find(|(n, _)| *n == special).map(|e| e.1);
        let (all_alpha, all_beta) = (all("AllAlpha"), all("AllBeta"));
        let mut settings: Vec<(&'static str, bool, &'static str)> =
            explicit.iter().map(|(n, v)| (*n, *v, "")).collect();
        for (name, _) in GATE_SUPPORT {
            let Some(gate) = kcm::gate(name) else {
                continue;
            };
            if gate.locked || explicit.iter().any(|(n, _)| n == name) {
                continue;
            }
            match (gate.stage, all_alpha, all_beta) {
                ("ALPHA", Some(v), _) => settings.push((gate.name, v, " (from AllAlpha)")),
                ("BETA", _, Some(v)) => settings.push((gate.name, v, " (from AllBeta)")),
                _ => {}
            }
        }
        let mut gates = FeatureGates::default();
        for (name, value, from) in settings {
            let default = kcm::gate(name).is_some_and(|g| g.default);
            match GateSupport::of(name) {
                Some(GateSupport::Honoured) => match name {
                    "TaintTolerationComparisonOperators" => {
                        gates.taint_toleration_comparison_operators = value
                    }
                    "NodeControllerLeaseCircuitBreaker" => {
                        gates.node_controller_lease_circuit_breaker = value
                    }
                    "StatefulSetRecreateStrategy" => gates.stateful_set_recreate_strategy = value,
                    "MutableSchedulingDirectivesForSuspendedJobs" => {
                        gates.mutable_scheduling_directives_for_suspended_jobs = value
                    }
                    other => unreachable!("honoured gate {other} has no field"),
                },
                Some(GateSupport::OnOnly(why)) if !value => {
                    return Err(FlagError::FeatureGate(format!(
                        "{name}=false{from} is not supported: {why}; run this controller in kube-controller-manager to turn it off"
                    )));
                }
                Some(GateSupport::OffOnly(why)) if value && default => {
                    tracing::warn!(gate = name, "feature gate accepted but not honoured: {why}");
                }
                Some(GateSupport::OffOnly(why)) if value => {
                    return Err(FlagError::FeatureGate(format!(
                        "{name}=true{from} is not supported: {why}; run this controller in kube-controller-manager to use it"
                    )));
                }
                Some(_) => {}
                None => tracing::info!(
                    gate = name,
                    value,
                    "feature gate of kube-controller-manager 1.37 accepted: no controller Pilothouse runs reads it"
                ),
            }
        }
        Ok(gates)
    }
}

/// Go's `strconv.ParseBool`, which kcm's `--feature-gates` uses.
fn go_parse_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Parses a duration flag as Go's `time.ParseDuration` does (the one parser, in
/// [`crate::meta::gocompat`]); negative durations make no sense for any of our options.
pub fn parse_go_duration(s: &str) -> Result<Duration, FlagError> {
    let nanos =
        crate::meta::gocompat::parse_duration(s).map_err(|_| FlagError::Duration(s.to_string()))?;
    u64::try_from(nanos)
        .map(Duration::from_nanos)
        .map_err(|_| FlagError::Duration(s.to_string()))
}

/// clap value parser for Go-style durations.
pub fn duration_arg(s: &str) -> Result<Duration, String> {
    parse_go_duration(s).map_err(|e| e.to_string())
}

/// The manager's own options (controllers add theirs beside these).
#[derive(Clone, Debug, Args)]
pub struct ManagerOptions {
    /// Path to a kubeconfig file. Empty: in-cluster configuration, then the default kubeconfig.
    #[arg(long, default_value = "")]
    pub kubeconfig: String,

    /// The address of the Kubernetes API server (overrides any value in kubeconfig).
    #[arg(long, default_value = "")]
    pub master: String,

    /// A list of controllers to enable. '*' enables all on-by-default controllers, 'foo' enables
    /// the controller named 'foo', '-foo' disables the controller named 'foo'. The first explicit
    /// mention of a controller wins. kube-controller-manager's aliases (e.g. 'job') are accepted.
    #[arg(long, value_delimiter = ',', default_value = "*")]
    pub controllers: Vec<String>,

    /// Start a leader election client and gain leadership before running controllers.
    #[arg(long, default_value_t = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub leader_elect: bool,

    /// How long a standby waits after observing the last renewal before it may take the lease.
    #[arg(long, default_value = "15s", value_parser = duration_arg)]
    pub leader_elect_lease_duration: Duration,

    /// How long the leader keeps retrying a renewal before it stops leading (and exits).
    #[arg(long, default_value = "10s", value_parser = duration_arg)]
    pub leader_elect_renew_deadline: Duration,

    /// How long clients wait between attempts to acquire and renew leadership.
    #[arg(long, default_value = "2s", value_parser = duration_arg)]
    pub leader_elect_retry_period: Duration,

    /// The resource lock type; only 'leases' is supported.
    #[arg(long, default_value = "leases")]
    pub leader_elect_resource_lock: String,

    /// The name of the Lease object used for leader election.
    #[arg(long, default_value = "pilothouse")]
    pub leader_elect_resource_name: String,

    /// The namespace of the Lease object used for leader election.
    #[arg(long, default_value = "kube-system")]
    pub leader_elect_resource_namespace: String,

    /// Each controller talks to the API server as its own ServiceAccount in kube-system
    /// (upstream's names, e.g. `job-controller`, `node-controller`), with TokenRequest tokens;
    /// the shared caches and leader election keep this process's identity.
    #[arg(long, default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub use_service_account_credentials: bool,

    /// QPS of each controller's own client to the API server.
    #[arg(long, default_value_t = 20.0)]
    pub kube_api_qps: f32,

    /// Burst of each controller's own client to the API server.
    #[arg(long, default_value_t = 30)]
    pub kube_api_burst: u32,

    /// The IP address on which to listen for the --secure-port port (as kube-controller-manager).
    #[arg(long, default_value = "0.0.0.0")]
    pub bind_address: String,

    /// The port on which to serve HTTPS with authentication and authorization (delegated to the
    /// API server) for /metrics; /healthz, /readyz and /livez are always allowed. 0 disables it.
    #[arg(long, default_value_t = 10257)]
    pub secure_port: u16,

    /// File containing the default x509 certificate for HTTPS (CA cert, if any, concatenated
    /// after the server cert). Without it a self-signed certificate is generated at start.
    #[arg(long, default_value = "")]
    pub tls_cert_file: String,

    /// File containing the default x509 private key matching --tls-cert-file.
    #[arg(long, default_value = "")]
    pub tls_private_key_file: String,

    /// HTTP paths served without authorization (`/p/*` matches a prefix).
    #[arg(long, value_delimiter = ',', default_value = "/healthz,/readyz,/livez")]
    pub authorization_always_allow_paths: Vec<String>,

    /// Plain-HTTP address (host:port) for /healthz, /readyz, /livez and /metrics, without
    /// authentication: off unless given. Pilothouse's own flag (kube-controller-manager has none).
    #[arg(long, default_value = "")]
    pub metrics_bind_address: String,

    /// How long in-flight syncs may run after SIGTERM before the lease is released anyway.
    #[arg(long, default_value = "2s", value_parser = duration_arg)]
    pub shutdown_drain_timeout: Duration,

    /// Start even when the API server's version is outside the supported range (1.37 and 1.38:
    /// kube-controller-manager 1.37's skew policy). Pilothouse's own flag.
    #[arg(long, default_value_t = false, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub allow_unsupported_api_server_version: bool,

    /// A set of key=value pairs for alpha/beta features, as kube-controller-manager's.
    #[arg(long, value_delimiter = ',', default_value = "", long_help = feature_gates_help())]
    pub feature_gates: Vec<String>,

    /// Log format: `json` writes kube-controller-manager's JSON lines (ts, caller, msg, v, then
    /// key/value pairs).
    #[arg(long, value_enum, default_value = "text")]
    pub logging_format: LoggingFormat,

    /// Log verbosity, as klog's -v: 0-2 info (2 is the usual production level), 3-4 debug (a line
    /// per sync, with the object key), 5+ trace.
    #[arg(short = 'v', long = "v", default_value_t = 0)]
    pub verbosity: u8,
}

impl ManagerOptions {
    /// Checks the options and returns the parsed feature gates.
    pub fn validate(&self) -> Result<FeatureGates, FlagError> {
        if self.leader_elect_resource_lock != "leases" {
            return Err(FlagError::ResourceLock(
                self.leader_elect_resource_lock.clone(),
            ));
        }
        FeatureGates::parse(&self.feature_gates)
    }
}

/// Which options were given explicitly on the command line (by long name).
#[derive(Clone, Debug, Default)]
pub struct SetFlags(BTreeSet<String>);

impl SetFlags {
    /// `command` is the parser `m` came from (its arguments, not its groups, are options).
    pub fn from_matches(command: &clap::Command, m: &ArgMatches) -> SetFlags {
        let set = command
            .get_arguments()
            .map(|a| a.get_id())
            .filter(|id| m.value_source(id.as_str()) == Some(ValueSource::CommandLine))
            .map(|id| id.as_str().replace('_', "-"))
            .collect();
        SetFlags(set)
    }

    /// Whether `--name` was given explicitly.
    pub fn is_set(&self, name: &str) -> bool {
        self.0.contains(&name.replace('_', "-"))
    }
}

/// Resolves `--controllers` to the canonical names of the controllers to run, as
/// kube-controller-manager's `IsControllerEnabled` does: for each controller the first explicit
/// `name`/`-name` in the list decides, else `*` enables it if it is on by default.
pub fn resolve_controllers(
    requested: &[String],
    catalogue: &[ControllerInfo],
) -> Result<Vec<&'static str>, FlagError> {
    let canonical = |raw: &str| -> Result<&ControllerInfo, FlagError> {
        catalogue
            .iter()
            .find(|c| c.name == raw || c.aliases.contains(&raw))
            .ok_or_else(|| FlagError::UnknownController {
                name: raw.to_string(),
                valid: catalogue
                    .iter()
                    .map(|c| c.name)
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    };
    // (controller, enabled) in list order; '*' marks that on-by-default ones are enabled.
    let mut choices: Vec<(&'static str, bool)> = Vec::new();
    let mut star = false;
    for raw in requested.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        if raw == "*" {
            star = true;
            continue;
        }
        let (name, enable) = match raw.strip_prefix('-') {
            Some(n) => (n, false),
            None => (raw, true),
        };
        let info = match canonical(name) {
            Ok(info) => info,
            Err(e) => match kcm::controller(name) {
                Some(upstream) => {
                    tracing::warn!(
                        controller = upstream,
                        requested = raw,
                        "--controllers names a kube-controller-manager controller Pilothouse does not host: ignored"
                    );
                    continue;
                }
                None => return Err(e),
            },
        };
        if enable && !info.built {
            return Err(FlagError::PlannedController {
                name: name.to_string(),
                built: built_list(catalogue),
            });
        }
        choices.push((info.name, enable));
    }
    Ok(catalogue
        .iter()
        .filter(|c| {
            let explicit = choices.iter().find(|(n, _)| *n == c.name).map(|(_, e)| *e);
            explicit.unwrap_or(star && c.on_by_default) && c.built
        })
        .map(|c| c.name)
        .collect())
}

fn built_list(catalogue: &[ControllerInfo]) -> String {
    let built: Vec<&str> = catalogue
        .iter()
        .filter(|c| c.built)
        .map(|c| c.name)
        .collect();
    if built.is_empty() {
        "(none yet)".to_string()
    } else {
        built.join(", ")
    }
}

/// kube-controller-manager 1.37's vocabulary (flags, controller names and aliases, feature gates),
/// generated into `kcm-vocabulary.txt` by `tests/tools/kcm-vocabulary` from the pinned binary and
/// source; a test fails when it is stale.
mod kcm {
    const VOCABULARY: &str = include_str!("kcm-vocabulary.txt");

    fn entries(kind: &'static str) -> impl Iterator<Item = Vec<&'static str>> {
        VOCABULARY
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .filter(move |w| w.first() == Some(&kind))
    }

    /// Whether kcm has `--name`, and if so whether it takes a value (pflag: any non-bool flag
    /// consumes the next argument when no `=` is given).
    pub fn flag_takes_value(name: &str) -> Option<bool> {
        entries("flag")
            .find(|w| w.get(1) == Some(&name))
            .map(|w| w.get(2) == Some(&"value"))
    }

    /// kcm's canonical name for a controller name or alias.
    pub fn controller(name: &str) -> Option<&'static str> {
        entries("controller")
            .find(|w| w.get(1) == Some(&name) || w.iter().skip(3).any(|a| *a == name))
            .and_then(|w| w.get(1).copied())
    }

    /// A feature gate as kcm 1.37 declares it, and which replaced controllers read it.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct Gate {
        pub name: &'static str,
        /// `ALPHA`, `BETA`, `GA` or `DEPRECATED`.
        pub stage: &'static str,
        pub default: bool,
        /// Settable only to its default.
        pub locked: bool,
        pub readers: Vec<&'static str>,
    }

    pub fn gates() -> impl Iterator<Item = Gate> {
        entries("gate").filter_map(|w| {
            let (name, stage, default) = (*w.get(1)?, *w.get(2)?, *w.get(3)? == "true");
            let locked = w.get(4) == Some(&"locked");
            let readers = w.iter().skip(if locked { 5 } else { 4 }).copied().collect();
            Some(Gate {
                name,
                stage,
                default,
                locked,
                readers,
            })
        })
    }

    pub fn gate(name: &str) -> Option<Gate> {
        gates().find(|g| g.name == name)
    }

    #[cfg(test)]
    pub fn is_gate(name: &str) -> bool {
        gate(name).is_some()
    }
}

/// Accepts a command line copied from kube-controller-manager: drops each of kcm's flags that
/// Pilothouse does not have (with its value), returning the remaining arguments and the dropped
/// flags' names for one warning. Flags neither has are left for the parser to refuse. Nothing
/// from a subcommand's name on is touched (`pilothouse schedule ...` is not a kcm line).
pub fn drop_foreign_kcm_flags(
    args: Vec<std::ffi::OsString>,
    command: &clap::Command,
) -> (Vec<std::ffi::OsString>, Vec<String>) {
    // clap adds --help and --version when the command is built: ask a built copy.
    let mut built = command.clone();
    built.build();
    let ours = |name: &str| built.get_arguments().any(|a| a.get_long() == Some(name));
    let mut kept = Vec::with_capacity(args.len());
    let mut dropped = Vec::new();
    let mut iter = args.into_iter();
    kept.extend(iter.next());
    while let Some(arg) = iter.next() {
        let Some(text) = arg.to_str() else {
            kept.push(arg);
            continue;
        };
        // A subcommand's arguments are its own (`pilothouse maintenance start --help`).
        if text == "--" || built.find_subcommand(text).is_some() {
            kept.push(arg);
            kept.extend(iter);
            break;
        }
        let Some(flag) = text.strip_prefix("--") else {
            kept.push(arg);
            continue;
        };
        let (name, inline_value) = match flag.split_once('=') {
            Some((n, _)) => (n, true),
            None => (flag, false),
        };
        match kcm::flag_takes_value(name) {
            Some(takes_value) if !ours(name) => {
                dropped.push(format!("--{name}"));
                if takes_value && !inline_value {
                    iter.next();
                }
            }
            _ => kept.push(arg),
        }
    }
    (kept, dropped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches, Parser};

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        m: ManagerOptions,
    }

    fn parse(args: &[&str]) -> (ManagerOptions, SetFlags) {
        let matches = Cli::command()
            .try_get_matches_from(std::iter::once("pilothouse").chain(args.iter().copied()))
            .unwrap();
        let cli = Cli::from_arg_matches(&matches).unwrap();
        (cli.m, SetFlags::from_matches(&Cli::command(), &matches))
    }

    #[test]
    fn go_durations() {
        let ok = [
            ("15s", 15_000),
            ("1m30s", 90_000),
            ("300ms", 300),
            ("1.5h", 5_400_000),
            ("0", 0),
            ("2h45m", 9_900_000),
            ("+5s", 5_000),
        ];
        for (s, ms) in ok {
            assert_eq!(
                parse_go_duration(s).unwrap(),
                Duration::from_millis(ms),
                "{s}"
            );
        }
        for bad in ["", "15", "s", "1x", "-5s", "1.2.3s", "5 s"] {
            assert!(parse_go_duration(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(
            parse_go_duration("1500us").unwrap(),
            Duration::from_micros(1500)
        );
    }

    #[test]
    fn defaults_match_kube_controller_manager() {
        let (o, set) = parse(&[]);
        assert_eq!(o.controllers, vec!["*"]);
        assert!(o.leader_elect);
        assert_eq!(o.leader_elect_lease_duration, Duration::from_secs(15));
        assert_eq!(o.leader_elect_renew_deadline, Duration::from_secs(10));
        assert_eq!(o.leader_elect_retry_period, Duration::from_secs(2));
        assert_eq!(o.leader_elect_resource_namespace, "kube-system");
        assert_eq!(o.leader_elect_resource_name, "pilothouse");
        assert_eq!(o.kube_api_qps, 20.0);
        assert_eq!(o.kube_api_burst, 30);
        // Serving as kcm: HTTPS on 0.0.0.0:10257; plain HTTP only when asked for.
        assert_eq!((o.bind_address.as_str(), o.secure_port), ("0.0.0.0", 10257));
        assert_eq!(
            o.authorization_always_allow_paths,
            ["/healthz", "/readyz", "/livez"]
        );
        assert!(o.metrics_bind_address.is_empty());
        assert!(!set.is_set("leader-elect"));
        assert!(!set.is_set("kube-api-qps"));
    }

    #[test]
    fn explicit_flags_are_tracked_and_bools_take_equals() {
        let (o, set) = parse(&[
            "--leader-elect=false",
            "--kube-api-qps=200",
            "--controllers=job,-cronjob",
            "-v=4",
        ]);
        assert!(!o.leader_elect);
        assert_eq!(o.kube_api_qps, 200.0);
        assert_eq!(o.controllers, vec!["job", "-cronjob"]);
        assert_eq!(o.verbosity, 4);
        assert!(set.is_set("leader-elect"));
        assert!(set.is_set("kube_api_qps"));
        assert!(set.is_set("controllers"));
        assert!(!set.is_set("kube-api-burst"));
        assert!(
            !set.is_set("ManagerOptions"),
            "argument groups are not options"
        );
        let (o, _) = parse(&["--leader-elect", "--v=2"]);
        assert!(o.leader_elect);
        assert_eq!(o.verbosity, 2);
    }

    #[test]
    fn feature_gates_parse_like_kcm() {
        assert_eq!(FeatureGates::parse(&[]).unwrap(), FeatureGates::default());
        let g = FeatureGates::parse(&["TaintTolerationComparisonOperators=true".into()]).unwrap();
        assert!(g.taint_toleration_comparison_operators);
        assert!(FeatureGates::parse(&["Bogus=true".into()]).is_err());
        // §0 of the StatefulSet/EndpointSlice spec: 1.37's gates for behaviour we always have
        // are accepted at the value we have; the other value is refused with the reason, as is
        // a gate we have not built turned on. A locked GA gate takes only its default, in kcm's
        // words; gates removed before 1.37 are unknown, as in kcm 1.37.
        assert_eq!(
            FeatureGates::parse(&[
                "MaxUnavailableStatefulSet=true".into(),
                "PreferSameTrafficDistribution=true".into(),
                "JobManagedBy=true".into(),
                "StatefulSetRecreateStrategy=false".into(),
            ])
            .unwrap(),
            FeatureGates::default()
        );
        let g = FeatureGates::parse(&["NodeControllerLeaseCircuitBreaker=false".into()]).unwrap();
        assert!(!g.node_controller_lease_circuit_breaker);
        assert!(FeatureGates::default().node_controller_lease_circuit_breaker);
        let refused = |item: &str| match FeatureGates::parse(&[item.to_string()]) {
            Err(FlagError::FeatureGate(m)) => m,
            other => panic!("{item} accepted: {other:?}"),
        };
        assert!(refused("MaxUnavailableStatefulSet=false").contains(
            "MaxUnavailableStatefulSet=false is not supported: Pilothouse always honours"
        ),);
        let g = FeatureGates::parse(&["StatefulSetRecreateStrategy=true".into()]).unwrap();
        assert!(g.stateful_set_recreate_strategy);
        assert!(refused("WorkloadWithJob=true").contains("no Workload or PodGroup"));
        assert_eq!(
            refused("JobManagedBy=false"),
            "cannot set feature gate JobManagedBy to false, feature is locked to true"
        );
        assert_eq!(
            refused("StatefulSetStartOrdinal=true"),
            "unrecognized feature gate: StatefulSetStartOrdinal"
        );
        assert!(FeatureGates::parse(&["TopologyAwareHints=true".into()]).is_err());
        // Every 1.37 gate is accepted (read or not), with kcm's `kube:` component prefix too.
        assert_eq!(
            FeatureGates::parse(&[
                "APIResponseCompression=false".into(),
                "kube:TaintTolerationComparisonOperators=True".into()
            ])
            .unwrap(),
            FeatureGates {
                taint_toleration_comparison_operators: true,
                ..FeatureGates::default()
            }
        );
        // AllAlpha and AllBeta reach the gates Pilothouse reads that are not set by name: an
        // alpha one Pilothouse lacks is refused, saying where it came from.
        let m = match FeatureGates::parse(&["AllAlpha=true".into()]) {
            Err(FlagError::FeatureGate(m)) => m,
            other => panic!("{other:?}"),
        };
        assert!(
            m.starts_with("WorkloadWithJob=true (from AllAlpha) is not supported"),
            "{m}"
        );
        let g =
            FeatureGates::parse(&["AllAlpha=true".into(), "WorkloadWithJob=false".into()]).unwrap();
        assert!(g.taint_toleration_comparison_operators && g.stateful_set_recreate_strategy);
        assert!(
            FeatureGates::parse(&["AllBeta=false".into()]).is_err(),
            "MaxUnavailableStatefulSet off"
        );
        // Gates of the API server and client-go libraries that kcm registers are known too.
        assert!(
            FeatureGates::parse(&["InformerResourceVersion=true".into(), "KMSv1=false".into()])
                .is_ok()
        );
        assert!(FeatureGates::parse(&["kube:Bogus=true".into()]).is_err());
        assert!(FeatureGates::parse(&["TaintTolerationComparisonOperators=yes".into()]).is_err());
        assert!(
            FeatureGates::parse(&["TaintTolerationComparisonOperators=1".into()])
                .unwrap()
                .taint_toleration_comparison_operators
        );
        assert!(FeatureGates::parse(&["TaintTolerationComparisonOperators".into()]).is_err());
        let (o, _) = parse(&["--feature-gates=TaintTolerationComparisonOperators=true"]);
        assert!(o.validate().unwrap().taint_toleration_comparison_operators);
    }

    const CAT: &[ControllerInfo] = &[
        ControllerInfo {
            name: "job-controller",
            aliases: &["job"],
            built: true,
            on_by_default: true,
        },
        ControllerInfo {
            name: "cronjob-controller",
            aliases: &["cronjob"],
            built: true,
            on_by_default: true,
        },
        ControllerInfo {
            name: "statefulset-controller",
            aliases: &["statefulset"],
            built: false,
            on_by_default: true,
        },
        ControllerInfo {
            name: "extra-controller",
            aliases: &[],
            built: true,
            on_by_default: false,
        },
    ];

    fn resolve(list: &[&str]) -> Result<Vec<&'static str>, FlagError> {
        resolve_controllers(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>(), CAT)
    }

    #[test]
    fn controllers_selection_follows_kcm_rules() {
        // '*' = every built, on-by-default controller; planned ones are not run.
        assert_eq!(
            resolve(&["*"]).unwrap(),
            vec!["job-controller", "cronjob-controller"]
        );
        assert_eq!(
            resolve(&["*", "-job-controller"]).unwrap(),
            vec!["cronjob-controller"]
        );
        // Aliases resolve to canonical names.
        assert_eq!(resolve(&["job"]).unwrap(), vec!["job-controller"]);
        assert_eq!(resolve(&["*", "-job"]).unwrap(), vec!["cronjob-controller"]);
        // Off-by-default controllers need naming.
        assert_eq!(
            resolve(&["*", "extra-controller"]).unwrap(),
            vec!["job-controller", "cronjob-controller", "extra-controller"]
        );
        // The first explicit mention wins, as in kcm.
        assert_eq!(
            resolve(&["-job", "job", "*"]).unwrap(),
            vec!["cronjob-controller"]
        );
        // Nothing without '*' or names.
        assert!(resolve(&[]).unwrap().is_empty());
        // Disabling a planned controller is harmless.
        assert_eq!(
            resolve(&["*", "-statefulset"]).unwrap(),
            vec!["job-controller", "cronjob-controller"]
        );
    }

    #[test]
    fn unknown_and_planned_names_are_errors() {
        let e = resolve(&["*", "jobs"]).unwrap_err();
        assert!(
            e.to_string().contains("job-controller, cronjob-controller"),
            "{e}"
        );
        assert!(matches!(e, FlagError::UnknownController { .. }));
        let e = resolve(&["statefulset"]).unwrap_err();
        assert!(matches!(e, FlagError::PlannedController { .. }), "{e}");
        assert!(matches!(
            resolve(&["-bogus"]).unwrap_err(),
            FlagError::UnknownController { .. }
        ));
    }

    #[test]
    fn kcm_controllers_we_do_not_host_are_accepted() {
        // An operator's kcm list: names and aliases of kcm controllers, enabled or disabled.
        assert_eq!(
            resolve(&[
                "*",
                "-deployment-controller",
                "daemonset",
                "bootstrapsigner",
                "-job"
            ])
            .unwrap(),
            vec!["cronjob-controller"]
        );
        assert!(matches!(
            resolve(&["deployment-controllers"]).unwrap_err(),
            FlagError::UnknownController { .. }
        ));
    }

    fn os(args: &[&str]) -> Vec<std::ffi::OsString> {
        args.iter().map(Into::into).collect()
    }

    #[test]
    fn kcm_flags_we_do_not_have_are_dropped_with_their_values() {
        let command = Cli::command()
            .version("1.0")
            .subcommand(clap::Command::new("schedule"));
        let (kept, dropped) = drop_foreign_kcm_flags(
            os(&[
                "pilothouse",
                "--cluster-cidr",
                "10.0.0.0/16",
                "--kube-api-qps=5",
                "--allocate-node-cidrs",
                "--enable-garbage-collector=true",
                "--concurrent-deployment-syncs",
                "3",
                "--kubeconfig",
                "/k",
                "--bogus",
                "--v=2",
            ]),
            &command,
        );
        assert_eq!(
            kept,
            os(&[
                "pilothouse",
                "--kube-api-qps=5",
                "--kubeconfig",
                "/k",
                "--bogus",
                "--v=2"
            ])
        );
        assert_eq!(
            dropped,
            [
                "--cluster-cidr",
                "--allocate-node-cidrs",
                "--enable-garbage-collector",
                "--concurrent-deployment-syncs"
            ]
        );
        // Unknown to both: the parser refuses it.
        assert!(command.clone().try_get_matches_from(&kept).is_err());
        // kcm has --help and --version too: they are clap's here, never dropped; nothing from a
        // subcommand's name on is touched.
        for line in [
            os(&["pilothouse", "--help"]),
            os(&["pilothouse", "--version"]),
            os(&["pilothouse", "--kubeconfig=/k", "schedule", "--help"]),
        ] {
            assert_eq!(
                drop_foreign_kcm_flags(line.clone(), &command),
                (line, vec![])
            );
        }
        // After `--`, and with a subcommand, nothing is touched.
        let line = os(&["pilothouse", "schedule", "--cluster-cidr", "x"]);
        assert_eq!(
            drop_foreign_kcm_flags(line.clone(), &command),
            (line, vec![])
        );
        let line = os(&["pilothouse", "--", "--cluster-cidr"]);
        assert_eq!(
            drop_foreign_kcm_flags(line.clone(), &command),
            (line, vec![])
        );
    }

    /// The committed vocabulary is what the pinned kube-controller-manager prints and its source
    /// declares (the generator runs tests/cluster/build, which tests/run has run already).
    #[test]
    fn vocabulary_matches_the_pinned_kube_controller_manager() {
        let tool = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/tools/kcm-vocabulary");
        let out = std::process::Command::new(tool)
            .arg("--check")
            .output()
            .expect("run tests/tools/kcm-vocabulary");
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Every gate kcm's code of a replaced controller reads has a line in GATE_SUPPORT, and no
    /// line names a gate no replaced controller reads: a version bump that adds one fails here.
    #[test]
    fn every_gate_the_replaced_controllers_read_is_decided() {
        let read: BTreeSet<&str> = gate_rows().iter().map(|r| r.name).collect();
        let decided: BTreeSet<&str> = GATE_SUPPORT.iter().map(|(n, _)| *n).collect();
        assert_eq!(read, decided);
        let job = kcm::gate("JobManagedBy").unwrap();
        assert_eq!(
            (job.stage, job.default, job.locked, job.readers),
            ("GA", true, true, vec!["job-controller"])
        );
        assert!(feature_gates_help().contains(
            "TaintTolerationComparisonOperators=true|false (ALPHA - default=false): honoured"
        ));
    }

    #[test]
    fn vocabulary_has_kcm_names() {
        assert_eq!(kcm::flag_takes_value("cluster-cidr"), Some(true));
        assert_eq!(kcm::flag_takes_value("allocate-node-cidrs"), Some(false));
        assert_eq!(kcm::flag_takes_value("no-such-flag"), None);
        assert_eq!(
            kcm::controller("nodelifecycle"),
            Some("node-lifecycle-controller")
        );
        assert_eq!(kcm::controller("ttl"), Some("ttl-controller"));
        assert!(kcm::is_gate("AllBeta"));
        assert!(!kcm::is_gate("kube:AllBeta"));
    }
}
