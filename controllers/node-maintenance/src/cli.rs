//! `pilothouse maintenance`: the operator's command for NodeMaintenance.
//!
//! `start NODE --reason TEXT` creates a NodeMaintenance named after the node (`--name` to
//! override) and, with `--wait`, follows it by watching the object: a progress bar of
//! evicted/targeted on a terminal, plain lines otherwise, each blocked pod named with its PDB.
//! `status [NODE]` prints the objects as `kubectl get pnm` does, with their blockers. `end NODE`
//! sets stage `Complete` and waits until the node is released. Kubeconfig as kubectl:
//! `--kubeconfig`, else `$KUBECONFIG` or `~/.kube/config`, else in-cluster; `--context` picks a
//! context. The decisions (arguments, rendering, exit codes) are pure functions, tested below.

use crate::types::{
    CONDITION_CORDONED, CONDITION_DEADLINE_EXCEEDED, CONDITION_DRAINED, CONDITION_EVICTION_BLOCKED,
    DrainSpec, NodeMaintenance, NodeMaintenanceSpec, Phase, Stage, TAINT_MAINTENANCE, TargetState,
    TimeoutPolicy,
};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Config};
use std::collections::BTreeSet;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Exit codes (README): 0 drained / released; 1 an error (API, arguments, not found);
/// 3 the drain cannot progress without the operator (PDB deadlock, consent, missing node, node
/// held by another maintenance); 4 a deadline passed; 5 the maintenance was ended or deleted
/// while `start --wait` followed it.
pub const EXIT_ERROR: u8 = 1;
pub const EXIT_BLOCKED: u8 = 3;
pub const EXIT_DEADLINE: u8 = 4;
pub const EXIT_CANCELLED: u8 = 5;

// `pilothouse maintenance`'s arguments (no doc comment: clap would make it the about text).
#[derive(clap::Args, Debug)]
pub struct MaintenanceArgs {
    /// Path to a kubeconfig file; else $KUBECONFIG, ~/.kube/config, then in-cluster (as kubectl).
    // Own ids: clap shares a global argument's value with the parent's argument of the same id,
    // and the binary's top-level --kubeconfig is a String.
    #[arg(
        long = "kubeconfig",
        id = "maintenance_kubeconfig",
        value_name = "KUBECONFIG",
        global = true
    )]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use; its current context by default.
    #[arg(
        long = "context",
        id = "maintenance_context",
        value_name = "CONTEXT",
        global = true
    )]
    pub context: Option<String>,
    #[command(subcommand)]
    pub command: MaintenanceCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum MaintenanceCommand {
    /// Creates a NodeMaintenance that cordons and drains NODE; with --wait, follows it until the
    /// node is drained.
    Start(StartArgs),
    /// Prints the NodeMaintenances (all, or those of NODE) and what blocks them.
    Status(StatusArgs),
    /// Ends a maintenance (stage Complete) and waits until its node is released.
    End(EndArgs),
}

#[derive(clap::Args, Debug)]
pub struct StartArgs {
    /// The node to take out of service.
    pub node: String,
    /// Why (at most 1024 characters); copied into events and the pods' condition.
    #[arg(long)]
    pub reason: String,
    /// The object's name; the node's name by default.
    #[arg(long)]
    pub name: Option<String>,
    /// Follow the drain until the node is drained; exits non-zero on a PDB deadlock or a passed
    /// deadline.
    #[arg(long)]
    pub wait: bool,
    /// Drain deadline, a Go duration (e.g. 90s, 10m); rounded up to whole seconds.
    #[arg(long, value_parser = timeout_seconds)]
    pub timeout: Option<i64>,
    /// At the deadline: Wait (keep retrying evictions) or Delete (delete the remaining pods,
    /// bypassing their PodDisruptionBudgets). Delete needs --timeout.
    #[arg(long, value_parser = timeout_policy)]
    pub timeout_policy: Option<TimeoutPolicy>,
}

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// Only the maintenances of this node.
    pub node: Option<String>,
}

#[derive(clap::Args, Debug)]
pub struct EndArgs {
    /// The node whose maintenance ends.
    pub node: String,
    /// The object's name; the node's name by default (as `start` names it).
    #[arg(long)]
    pub name: Option<String>,
    /// How long to wait for the node's release, a Go duration.
    #[arg(long, default_value = "5m", value_parser = timeout_seconds)]
    pub timeout: i64,
}

/// `--timeout`: a Go duration, positive, rounded up to whole seconds.
pub fn timeout_seconds(s: &str) -> Result<i64, String> {
    let nanos = shared::meta::gocompat::parse_duration(s)?;
    if nanos <= 0 {
        return Err(format!("{s}: the timeout must be positive"));
    }
    // No overflow: the quotient of a positive i64 by 1e9 is far below i64::MAX.
    Ok(nanos / 1_000_000_000 + i64::from(nanos % 1_000_000_000 != 0))
}

/// `--timeout-policy`: the API's spelling, any case.
pub fn timeout_policy(s: &str) -> Result<TimeoutPolicy, String> {
    match s.to_ascii_lowercase().as_str() {
        "wait" => Ok(TimeoutPolicy::Wait),
        "delete" => Ok(TimeoutPolicy::Delete),
        _ => Err(format!("{s}: must be Wait or Delete")),
    }
}

/// The object `start` creates, or why the arguments are refused (before any request, with the
/// same limits the CRD's validation enforces).
pub fn new_object(a: &StartArgs) -> Result<NodeMaintenance, String> {
    if a.node.is_empty() {
        return Err("NODE must not be empty".into());
    }
    if a.reason.chars().count() > 1024 {
        return Err("--reason is limited to 1024 characters".into());
    }
    let policy = a.timeout_policy.unwrap_or_default();
    if policy == TimeoutPolicy::Delete && a.timeout.is_none() {
        return Err("--timeout-policy Delete needs --timeout (the deadline it acts at)".into());
    }
    let name = a.name.clone().unwrap_or_else(|| a.node.clone());
    Ok(NodeMaintenance {
        metadata: ObjectMeta {
            name: Some(name),
            ..Default::default()
        },
        spec: NodeMaintenanceSpec {
            node_name: a.node.clone(),
            stage: Stage::Drain,
            reason: Some(a.reason.clone()),
            drain: DrainSpec {
                timeout_seconds: a.timeout,
                timeout_policy: policy,
                ..Default::default()
            },
        },
        status: None,
    })
}

fn condition<'a>(nm: &'a NodeMaintenance, type_: &str) -> Option<&'a Condition> {
    nm.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
}

fn is_true(c: Option<&Condition>) -> bool {
    c.is_some_and(|c| c.status == "True")
}

/// Whether the status describes the current spec (a status written for an older generation,
/// e.g. before an edit, decides nothing). Without any observed generation it is taken as is.
fn observed(nm: &NodeMaintenance) -> bool {
    let Some(generation) = nm.metadata.generation else {
        return true;
    };
    match nm.status.as_ref().and_then(|s| s.observed_generation) {
        Some(g) => g >= generation,
        None => nm.status.is_some(),
    }
}

/// What `start --wait` does after seeing the object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Waiting,
    Drained,
    Fail { code: u8, message: String },
}

fn fail(code: u8, message: String) -> Verdict {
    Verdict::Fail { code, message }
}

/// The exit decision of `start --wait` from the object as it is now.
pub fn verdict(nm: &NodeMaintenance) -> Verdict {
    let node = &nm.spec.node_name;
    if nm.metadata.deletion_timestamp.is_some() {
        return fail(
            EXIT_CANCELLED,
            format!("the maintenance of {node} is being deleted: the drain stopped"),
        );
    }
    if !observed(nm) {
        return Verdict::Waiting;
    }
    let drained = condition(nm, CONDITION_DRAINED);
    if is_true(drained) {
        return Verdict::Drained;
    }
    let text = |c: Option<&Condition>| {
        c.map(|c| format!("{}: {}", c.reason, c.message))
            .unwrap_or_default()
    };
    match nm.spec.stage {
        Stage::Complete => {
            return fail(
                EXIT_CANCELLED,
                format!("the maintenance of {node} was ended (stage Complete) before it drained"),
            );
        }
        Stage::Idle | Stage::Cordon => {
            return fail(
                EXIT_BLOCKED,
                format!(
                    "stage is {}: nothing is drained until the stage is Drain",
                    nm.spec.stage.as_str()
                ),
            );
        }
        Stage::Drain => {}
    }
    if let Some(c) = drained.filter(|c| c.status == "False")
        && (c.reason == "PodsRequireConsent" || c.reason == "NodeNotFound")
    {
        return fail(
            EXIT_BLOCKED,
            format!("{node} cannot be drained: {}", text(Some(c))),
        );
    }
    let cordoned = condition(nm, CONDITION_CORDONED);
    if let Some(c) = cordoned.filter(|c| c.reason == "NodeReplaced") {
        return fail(EXIT_BLOCKED, format!("{node}: {}", text(Some(c))));
    }
    let blocked = condition(nm, CONDITION_EVICTION_BLOCKED).filter(|c| c.status == "True");
    let deadline = condition(nm, CONDITION_DEADLINE_EXCEEDED).filter(|c| c.status == "True");
    if let Some(d) = deadline
        && d.reason != "DeletingPastDeadline"
    {
        let mut message = format!(
            "the drain deadline of {node} passed ({}); the node stays cordoned and evictions are \
             retried",
            text(Some(d))
        );
        if let Some(b) = blocked {
            message.push_str(&format!("; blocked: {}", text(Some(b))));
        }
        return fail(EXIT_DEADLINE, message);
    }
    if let Some(b) = blocked.filter(|b| b.reason == "PodDisruptionBudgetDeadlock") {
        let drain = &nm.spec.drain;
        // With Delete at a deadline the controller resolves the deadlock itself: keep following.
        if drain.timeout_policy == TimeoutPolicy::Delete && drain.timeout_seconds.is_some() {
            return Verdict::Waiting;
        }
        return fail(
            EXIT_BLOCKED,
            format!(
                "the drain of {node} is deadlocked ({}). No eviction can succeed until the \
                 workload scales or the PodDisruptionBudget changes; the node stays cordoned and \
                 retries go on. End it with `pilothouse maintenance end {node}`, or start with \
                 --timeout D --timeout-policy Delete to delete such pods at a deadline",
                text(Some(b))
            ),
        );
    }
    Verdict::Waiting
}

/// One blocked target, as printed.
pub fn blocker_lines(nm: &NodeMaintenance) -> Vec<String> {
    let Some(status) = &nm.status else {
        return Vec::new();
    };
    status
        .targeted_pods
        .iter()
        .filter(|t| t.state == TargetState::Blocked)
        .map(|t| {
            let mut line = format!("blocked: {}/{}", t.namespace, t.name);
            let message = t.message.as_deref().filter(|m| !m.is_empty());
            if let Some(pdb) = &t.pod_disruption_budget {
                // The controller's message usually names the PDB already: then it says it.
                let by = format!("PodDisruptionBudget {pdb}");
                match message.and_then(|m| m.strip_prefix("blocked by ")) {
                    Some(rest) if rest.starts_with(&by) => {
                        line.push_str(&format!(" by {rest}"));
                        if let Some(reason) = &t.blocked_reason {
                            line.push_str(&format!(" [{reason}]"));
                        }
                        return line;
                    }
                    _ => line.push_str(&format!(" by {by}")),
                }
            }
            if let Some(reason) = &t.blocked_reason {
                line.push_str(&format!(" ({reason})"));
            }
            if let Some(message) = message {
                line.push_str(&format!(": {message}"));
            }
            line
        })
        .collect()
}

fn phase_text(nm: &NodeMaintenance) -> &'static str {
    nm.status
        .as_ref()
        .and_then(|s| s.phase)
        .map_or("-", Phase::as_str)
}

/// The counts (targeted, evicted, terminating, pending, blocked).
fn counts(nm: &NodeMaintenance) -> (i64, i64, i64, i64, i64) {
    nm.status
        .as_ref()
        .and_then(|s| s.progress.as_ref())
        .map_or((0, 0, 0, 0, 0), |p| {
            (p.targeted, p.evicted, p.terminating, p.pending, p.blocked)
        })
}

/// The plain progress line (also the progress bar's message, minus the bar's own numbers).
pub fn progress_line(nm: &NodeMaintenance) -> String {
    let (targeted, evicted, terminating, pending, blocked) = counts(nm);
    format!(
        "{}: {} {evicted}/{targeted} evicted, {terminating} terminating, {pending} pending, \
         {blocked} blocked",
        nm.spec.node_name,
        phase_text(nm)
    )
}

/// Age as kubectl prints it, roughly: 45s, 3m12s, 17m, 5h4m, 30h, 3d4h, 12d, 3y.
pub fn human_age(secs: i64) -> String {
    let s = secs.max(0);
    let (m, h, d) = (s / 60, s / 3600, s / 86400);
    match s {
        0..120 => format!("{s}s"),
        120..600 if s % 60 != 0 => format!("{m}m{}s", s % 60),
        120..10_800 => format!("{m}m"),
        10_800..28_800 if m % 60 != 0 => format!("{h}h{}m", m % 60),
        10_800..172_800 => format!("{h}h"),
        172_800..691_200 if h % 24 != 0 => format!("{d}d{}h", h % 24),
        172_800..63_072_000 => format!("{d}d"),
        _ => format!("{}y", d / 365),
    }
}

/// `status`: a table like `kubectl get pnm` (its printer columns, name first), then each
/// object's blockers and problems.
pub fn status_text(items: &[NodeMaintenance], now: Timestamp) -> String {
    if items.is_empty() {
        return "No NodeMaintenance found.\n".to_string();
    }
    let mut rows: Vec<Vec<String>> = vec![
        [
            "NAME", "NODE", "STAGE", "PHASE", "TARGETED", "EVICTED", "PENDING", "BLOCKED", "AGE",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
    ];
    for nm in items {
        let (targeted, evicted, _, pending, blocked) = counts(nm);
        let age = nm.metadata.creation_timestamp.as_ref().map_or_else(
            || "-".to_string(),
            |t| human_age(now.duration_since(t.0).as_secs()),
        );
        rows.push(vec![
            nm.metadata.name.clone().unwrap_or_default(),
            nm.spec.node_name.clone(),
            nm.spec.stage.as_str().to_string(),
            phase_text(nm).to_string(),
            targeted.to_string(),
            evicted.to_string(),
            pending.to_string(),
            blocked.to_string(),
            age,
        ]);
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in &rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(cells.join("   ").trim_end());
        out.push('\n');
    }
    for nm in items {
        let name = nm.metadata.name.clone().unwrap_or_default();
        let mut notes = Vec::new();
        if let Some(r) = nm.spec.reason.as_deref().filter(|r| !r.is_empty()) {
            notes.push(format!("reason: {r}"));
        }
        for type_ in [
            CONDITION_EVICTION_BLOCKED,
            CONDITION_DEADLINE_EXCEEDED,
            CONDITION_DRAINED,
            CONDITION_CORDONED,
        ] {
            let Some(c) = condition(nm, type_) else {
                continue;
            };
            // The unremarkable states are in the table already.
            let notable = match type_ {
                CONDITION_EVICTION_BLOCKED | CONDITION_DEADLINE_EXCEEDED => c.status == "True",
                CONDITION_DRAINED => {
                    ["PodsRequireConsent", "NodeNotFound", "Cancelled"].contains(&c.reason.as_str())
                }
                _ => ["NodeReplaced", "HeldByOtherMaintenance", "NodeNotFound"]
                    .contains(&c.reason.as_str()),
            };
            if notable {
                notes.push(format!("{type_}={} {}: {}", c.status, c.reason, c.message));
            }
        }
        notes.extend(blocker_lines(nm));
        if let Some(e) = nm.status.as_ref().and_then(|s| s.last_error.as_deref()) {
            notes.push(format!("last error: {e}"));
        }
        if !notes.is_empty() {
            out.push('\n');
            out.push_str(&format!("{name}:\n"));
            for n in notes {
                out.push_str(&format!("  {n}\n"));
            }
        }
    }
    out
}

/// What `end` waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Release {
    Waiting,
    /// Released; whether the node is schedulable now (it stays unschedulable if it was cordoned
    /// before the maintenance).
    Released {
        schedulable: bool,
    },
    NodeGone,
    /// Our object completed, but another active maintenance still holds the node.
    Held(String),
}

/// `end`'s decision: released when the object is `Completed` (or gone) and the node no longer
/// carries the maintenance taint.
pub fn release(nm: Option<&NodeMaintenance>, node: Option<&Node>) -> Release {
    let completed = nm.is_none_or(|nm| {
        nm.status.as_ref().and_then(|s| s.phase) == Some(Phase::Completed) && observed(nm)
    });
    if !completed {
        return Release::Waiting;
    }
    let Some(node) = node else {
        return Release::NodeGone;
    };
    let spec = node.spec.as_ref();
    let tainted = spec
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == TAINT_MAINTENANCE));
    if !tainted {
        return Release::Released {
            schedulable: !spec.and_then(|s| s.unschedulable).unwrap_or(false),
        };
    }
    match nm.and_then(|nm| condition(nm, CONDITION_CORDONED)) {
        Some(c) if c.reason == "HeldByOtherMaintenance" => Release::Held(c.message.clone()),
        _ => Release::Waiting,
    }
}

/// Runs `pilothouse maintenance`. `kubeconfig` is the binary's top-level `--kubeconfig` (empty
/// when unset), used when the subcommand's own is not given.
pub fn run(args: &MaintenanceArgs, kubeconfig: &str) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return exit(EXIT_ERROR, &format!("starting the async runtime: {e}")),
    };
    match runtime.block_on(dispatch(args, kubeconfig)) {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, message)) => exit(code, &message),
    }
}

fn exit(code: u8, message: &str) -> ExitCode {
    eprintln!("pilothouse maintenance: {message}");
    ExitCode::from(code)
}

type Outcome = Result<(), (u8, String)>;

fn error(e: impl std::fmt::Display) -> (u8, String) {
    (EXIT_ERROR, e.to_string())
}

/// API errors in words an operator can act on.
fn api_error(e: kube::Error) -> (u8, String) {
    match &e {
        kube::Error::Api(s) if s.code == 404 && s.details.is_none() => error(
            "the NodeMaintenance API is not served: install its CRD with \
             `kubectl apply -f crds/nodemaintenances.pilothouse.dev.yaml` (or `pilothouse crd | kubectl apply -f -`)",
        ),
        kube::Error::Api(s) => error(format!("{} ({})", s.message, s.reason)),
        _ => error(e),
    }
}

async fn client(args: &MaintenanceArgs, fallback: &str) -> Result<Client, (u8, String)> {
    let options = KubeConfigOptions {
        context: args.context.clone(),
        ..Default::default()
    };
    let path = args
        .kubeconfig
        .clone()
        .or_else(|| (!fallback.is_empty()).then(|| PathBuf::from(fallback)));
    let config = match path {
        Some(p) => {
            let kc =
                Kubeconfig::read_from(&p).map_err(|e| error(format!("{}: {e}", p.display())))?;
            Config::from_custom_kubeconfig(kc, &options)
                .await
                .map_err(|e| error(format!("{}: {e}", p.display())))?
        }
        None if args.context.is_some() => Config::from_kubeconfig(&options)
            .await
            .map_err(|e| error(format!("kubeconfig: {e}")))?,
        None => Config::infer()
            .await
            .map_err(|e| error(format!("no cluster configuration: {e}")))?,
    };
    Client::try_from(config).map_err(error)
}

async fn dispatch(args: &MaintenanceArgs, kubeconfig: &str) -> Outcome {
    match &args.command {
        MaintenanceCommand::Start(a) => {
            // Refuse bad arguments before touching the cluster.
            let object = new_object(a).map_err(error)?;
            start(client(args, kubeconfig).await?, object, a.wait).await
        }
        MaintenanceCommand::Status(a) => status(client(args, kubeconfig).await?, a).await,
        MaintenanceCommand::End(a) => end(client(args, kubeconfig).await?, a).await,
    }
}

async fn start(client: Client, object: NodeMaintenance, wait: bool) -> Outcome {
    let api: Api<NodeMaintenance> = Api::all(client);
    let name = object.metadata.name.clone().unwrap_or_default();
    let node = object.spec.node_name.clone();
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => println!("nodemaintenance/{name} created: cordoning and draining {node}"),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let existing = api.get(&name).await.map_err(api_error)?;
            let active = existing.spec.node_name == node
                && existing.spec.stage != Stage::Complete
                && existing.metadata.deletion_timestamp.is_none();
            if !(active && wait) {
                return Err(error(format!(
                    "nodemaintenance/{name} already exists (node {}, stage {}); follow it with \
                     `pilothouse maintenance status {}` or choose another --name",
                    existing.spec.node_name,
                    existing.spec.stage.as_str(),
                    existing.spec.node_name
                )));
            }
            println!("nodemaintenance/{name} already exists for {node}; following it as it is");
        }
        Err(e) => return Err(api_error(e)),
    }
    if !wait {
        return Ok(());
    }
    follow(api, &name).await
}

/// Shows progress as the object changes, until `verdict` decides.
struct View {
    bar: Option<indicatif::ProgressBar>,
    last_line: String,
    blockers: BTreeSet<String>,
}

impl View {
    fn new(terminal: bool) -> View {
        let bar = terminal.then(|| {
            // On stdout, the stream checked for a terminal (indicatif's default is stderr, where
            // the blocked-pod lines printed through the bar would vanish if it were redirected).
            let bar = indicatif::ProgressBar::with_draw_target(
                Some(0),
                indicatif::ProgressDrawTarget::stdout(),
            );
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{prefix} [{bar:30}] {pos}/{len} evicted  {msg}",
            ) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        View {
            bar,
            last_line: String::new(),
            blockers: BTreeSet::new(),
        }
    }

    fn println(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None => println!("{line}"),
        }
    }

    fn update(&mut self, nm: &NodeMaintenance) {
        // Each blocker once, when it appears or its reason or message changes.
        for line in blocker_lines(nm) {
            if self.blockers.insert(line.clone()) {
                self.println(&line);
            }
        }
        let line = progress_line(nm);
        match &self.bar {
            Some(bar) => {
                let (targeted, evicted, terminating, pending, blocked) = counts(nm);
                bar.set_prefix(format!("{} {}", nm.spec.node_name, phase_text(nm)));
                bar.set_length(u64::try_from(targeted).unwrap_or(0));
                bar.set_position(u64::try_from(evicted).unwrap_or(0));
                bar.set_message(format!(
                    "{terminating} terminating, {pending} pending, {blocked} blocked"
                ));
            }
            None if line != self.last_line => println!("{line}"),
            None => {}
        }
        self.last_line = line;
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.abandon();
        }
    }
}

async fn follow(api: Api<NodeMaintenance>, name: &str) -> Outcome {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher(api, config).default_backoff().boxed();
    let mut view = View::new(std::io::stdout().is_terminal());
    let started = tokio::time::Instant::now();
    let mut seen = false;
    let mut acted_on = false;
    let mut warned = false;
    let result = loop {
        let next = match tokio::time::timeout(Duration::from_secs(5), events.next()).await {
            Ok(n) => n,
            Err(_) => {
                // Nothing has written a status yet: the controller is probably not running.
                if !acted_on && !warned && started.elapsed() >= Duration::from_secs(15) {
                    warned = true;
                    view.println(
                        "warning: no status after 15s: is node-maintenance-controller enabled \
                         (pilothouse --controllers=...,node-maintenance-controller)?",
                    );
                }
                continue;
            }
        };
        let event = match next {
            None => break Err(error("the watch ended")),
            Some(Err(e)) => {
                view.println(&format!("warning: watch: {e}; retrying"));
                continue;
            }
            Some(Ok(e)) => e,
        };
        let nm = match event {
            watcher::Event::Apply(nm) | watcher::Event::InitApply(nm) => nm,
            watcher::Event::Delete(_) => {
                break Err((
                    EXIT_CANCELLED,
                    format!("nodemaintenance/{name} was deleted before the node drained"),
                ));
            }
            watcher::Event::InitDone if !seen => {
                break Err(error(format!("nodemaintenance/{name} not found")));
            }
            watcher::Event::Init | watcher::Event::InitDone => continue,
        };
        seen = true;
        acted_on |= nm.status.is_some();
        view.update(&nm);
        match verdict(&nm) {
            Verdict::Waiting => {}
            Verdict::Drained => {
                let (targeted, evicted, ..) = counts(&nm);
                break Ok((targeted, evicted, nm.spec.node_name.clone()));
            }
            Verdict::Fail { code, message } => break Err((code, message)),
        }
    };
    view.finish();
    let (targeted, evicted, node) = result?;
    println!("{node} drained: {evicted} of {targeted} targeted pods evicted");
    Ok(())
}

async fn status(client: Client, a: &StatusArgs) -> Outcome {
    let api: Api<NodeMaintenance> = Api::all(client);
    let mut items = api
        .list(&Default::default())
        .await
        .map_err(api_error)?
        .items;
    if let Some(node) = &a.node {
        items.retain(|nm| &nm.spec.node_name == node);
    }
    items.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    print!("{}", status_text(&items, Timestamp::now()));
    Ok(())
}

async fn end(client: Client, a: &EndArgs) -> Outcome {
    let api: Api<NodeMaintenance> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client);
    let name = a.name.clone().unwrap_or_else(|| a.node.clone());
    let Some(nm) = api.get_opt(&name).await.map_err(api_error)? else {
        let on_node: Vec<String> = api
            .list(&Default::default())
            .await
            .map_err(api_error)?
            .items
            .into_iter()
            .filter(|nm| nm.spec.node_name == a.node)
            .filter_map(|nm| nm.metadata.name)
            .collect();
        return Err(error(if on_node.is_empty() {
            format!(
                "no NodeMaintenance named {name}, and none for node {}",
                a.node
            )
        } else {
            format!(
                "no NodeMaintenance named {name}; node {}'s: {} (use --name)",
                a.node,
                on_node.join(", ")
            )
        }));
    };
    if nm.spec.node_name != a.node {
        return Err(error(format!(
            "nodemaintenance/{name} is for node {}, not {}",
            nm.spec.node_name, a.node
        )));
    }
    if nm.spec.stage != Stage::Complete {
        let patch = serde_json::json!({"spec": {"stage": Stage::Complete.as_str()}});
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(api_error)?;
    }
    println!(
        "nodemaintenance/{name}: stage Complete; waiting for {} to be released",
        a.node
    );
    let deadline = tokio::time::Instant::now()
        .checked_add(Duration::from_secs(a.timeout.unsigned_abs()))
        .unwrap_or_else(far_future);
    loop {
        let nm = api.get_opt(&name).await.map_err(api_error)?;
        let node = nodes.get_opt(&a.node).await.map_err(api_error)?;
        match release(nm.as_ref(), node.as_ref()) {
            Release::Released { schedulable } => {
                println!(
                    "{} released{}",
                    a.node,
                    if schedulable {
                        ": schedulable"
                    } else {
                        ": still unschedulable, as it was before the maintenance"
                    }
                );
                return Ok(());
            }
            Release::NodeGone => {
                println!("{} is gone; nothing to release", a.node);
                return Ok(());
            }
            Release::Held(message) => {
                return Err((
                    EXIT_BLOCKED,
                    format!(
                        "nodemaintenance/{name} completed, but {} stays cordoned: {message}",
                        a.node
                    ),
                ));
            }
            Release::Waiting => {}
        }
        if tokio::time::Instant::now() >= deadline {
            return Err((
                EXIT_DEADLINE,
                format!(
                    "{} not released within {}s (phase {}); is node-maintenance-controller running?",
                    a.node,
                    a.timeout,
                    nm.as_ref().map_or("gone", phase_text)
                ),
            ));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// A deadline that never comes (about 30 years), for a timeout too large to add.
fn far_future() -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(Duration::from_secs(86_400 * 365 * 30))
        .unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{NodeMaintenanceStatus, Progress, TargetedPod};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn args(extra: &[&str]) -> StartArgs {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct P {
            #[command(flatten)]
            a: StartArgs,
        }
        let mut v = vec!["x", "w1", "--reason", "kernel"];
        v.extend(extra);
        P::try_parse_from(v).map(|p| p.a).unwrap()
    }

    fn parse_err(extra: &[&str]) -> String {
        use clap::Parser;
        #[derive(clap::Parser, Debug)]
        struct P {
            #[command(flatten)]
            a: StartArgs,
        }
        let mut v = vec!["x", "w1", "--reason", "kernel"];
        v.extend(extra);
        P::try_parse_from(v).unwrap_err().to_string()
    }

    fn cond(type_: &str, status: &str, reason: &str, message: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
            observed_generation: Some(1),
        }
    }

    fn nm(conditions: Vec<Condition>) -> NodeMaintenance {
        let mut o = new_object(&args(&[])).unwrap();
        o.metadata.generation = Some(1);
        o.status = Some(NodeMaintenanceStatus {
            observed_generation: Some(1),
            phase: Some(Phase::Draining),
            conditions,
            ..Default::default()
        });
        o
    }

    fn blocked_pod(pdb: Option<&str>, reason: &str) -> TargetedPod {
        TargetedPod {
            namespace: "shop".into(),
            name: "db-0".into(),
            uid: None,
            state: TargetState::Blocked,
            method: None,
            blocked_reason: Some(reason.into()),
            pod_disruption_budget: pdb.map(String::from),
            message: Some("needs 1 healthy, has 1".into()),
            attempts: 3,
            first_attempt_time: None,
            last_attempt_time: None,
            next_attempt_time: None,
        }
    }

    #[test]
    fn object_is_named_after_the_node_and_drains() {
        let o = new_object(&args(&[])).unwrap();
        assert_eq!(o.metadata.name.as_deref(), Some("w1"));
        assert_eq!(o.spec.node_name, "w1");
        assert_eq!(o.spec.stage, Stage::Drain);
        assert_eq!(o.spec.reason.as_deref(), Some("kernel"));
        assert!(o.spec.drain.force && o.spec.drain.delete_empty_dir_data);
        assert_eq!(o.spec.drain.timeout_seconds, None);
        let o = new_object(&args(&["--name", "w1-kernel"])).unwrap();
        assert_eq!(o.metadata.name.as_deref(), Some("w1-kernel"));
        assert_eq!(o.spec.node_name, "w1");
    }

    #[test]
    fn timeout_is_a_go_duration_rounded_up_to_seconds() {
        assert_eq!(timeout_seconds("5s"), Ok(5));
        assert_eq!(timeout_seconds("1m30s"), Ok(90));
        assert_eq!(timeout_seconds("1500ms"), Ok(2));
        assert_eq!(timeout_seconds("1ns"), Ok(1));
        assert_eq!(timeout_seconds("2562047h"), Ok(2562047 * 3600));
        assert!(timeout_seconds("0s").unwrap_err().contains("positive"));
        assert!(timeout_seconds("-5s").is_err());
        // Go's own error text for a bad duration.
        assert_eq!(
            timeout_seconds("5").unwrap_err(),
            "time: missing unit in duration \"5\""
        );
        let o = new_object(&args(&["--timeout", "10m", "--timeout-policy", "Delete"])).unwrap();
        assert_eq!(o.spec.drain.timeout_seconds, Some(600));
        assert_eq!(o.spec.drain.timeout_policy, TimeoutPolicy::Delete);
    }

    #[test]
    fn bad_arguments_are_refused_before_any_request() {
        assert!(
            new_object(&args(&["--timeout-policy", "delete"]))
                .unwrap_err()
                .contains("needs --timeout")
        );
        assert!(parse_err(&["--timeout-policy", "Evict"]).contains("must be Wait or Delete"));
        assert!(parse_err(&["--timeout", "soon"]).contains("invalid duration"));
        let long = "x".repeat(1025);
        let mut a = args(&[]);
        a.reason = long;
        assert!(new_object(&a).unwrap_err().contains("1024"));
        a.reason = "é".repeat(1024); // characters, not bytes, as the CRD's maxLength
        assert!(new_object(&a).is_ok());
    }

    #[test]
    fn verdict_drained_is_success() {
        let o = nm(vec![cond(CONDITION_DRAINED, "True", "DrainComplete", "")]);
        assert_eq!(verdict(&o), Verdict::Drained);
    }

    #[test]
    fn verdict_waits_while_draining_or_on_an_unobserved_generation() {
        let o = nm(vec![
            cond(CONDITION_DRAINED, "False", "Draining", ""),
            cond(
                CONDITION_EVICTION_BLOCKED,
                "True",
                "PodDisruptionBudget",
                "web",
            ),
        ]);
        assert_eq!(verdict(&o), Verdict::Waiting);
        let mut o = nm(vec![cond(CONDITION_DRAINED, "True", "DrainComplete", "")]);
        o.metadata.generation = Some(2);
        assert_eq!(verdict(&o), Verdict::Waiting, "status of generation 1");
        let mut o = new_object(&args(&[])).unwrap();
        o.metadata.generation = Some(1);
        assert_eq!(verdict(&o), Verdict::Waiting, "no status yet");
    }

    #[test]
    fn verdict_deadlock_fails_naming_pod_and_pdb() {
        let msg = "shop/db-0 blocked by PodDisruptionBudget db-pdb (needs 1 healthy, has 1)";
        let o = nm(vec![cond(
            CONDITION_EVICTION_BLOCKED,
            "True",
            "PodDisruptionBudgetDeadlock",
            msg,
        )]);
        let Verdict::Fail { code, message } = verdict(&o) else {
            panic!("{:?}", verdict(&o))
        };
        assert_eq!(code, EXIT_BLOCKED);
        assert!(
            message.contains(msg) && message.contains("deadlocked"),
            "{message}"
        );
        // With Delete at a deadline the controller will resolve it: keep following.
        let mut o = o;
        o.spec.drain.timeout_seconds = Some(30);
        o.spec.drain.timeout_policy = TimeoutPolicy::Delete;
        assert_eq!(verdict(&o), Verdict::Waiting);
    }

    #[test]
    fn verdict_passed_deadline_fails_unless_deleting() {
        let o = nm(vec![
            cond(
                CONDITION_DEADLINE_EXCEEDED,
                "True",
                "WaitingPastDeadline",
                "at 12:00",
            ),
            cond(
                CONDITION_EVICTION_BLOCKED,
                "True",
                "PodDisruptionBudget",
                "shop/db-0 web-pdb",
            ),
        ]);
        let Verdict::Fail { code, message } = verdict(&o) else {
            panic!()
        };
        assert_eq!(code, EXIT_DEADLINE);
        assert!(message.contains("WaitingPastDeadline") && message.contains("web-pdb"));
        let o = nm(vec![cond(
            CONDITION_DEADLINE_EXCEEDED,
            "True",
            "DeletingPastDeadline",
            "",
        )]);
        assert_eq!(verdict(&o), Verdict::Waiting);
        let o = nm(vec![cond(
            CONDITION_DEADLINE_EXCEEDED,
            "False",
            "WithinDeadline",
            "",
        )]);
        assert_eq!(verdict(&o), Verdict::Waiting);
    }

    #[test]
    fn verdict_consent_missing_node_cancel_and_delete() {
        let o = nm(vec![cond(
            CONDITION_DRAINED,
            "False",
            "PodsRequireConsent",
            "Pods that declare no controller (use --force to override): shop/legacy",
        )]);
        assert!(
            matches!(verdict(&o), Verdict::Fail { code: EXIT_BLOCKED, message } if message.contains("shop/legacy"))
        );
        let o = nm(vec![cond(CONDITION_DRAINED, "False", "NodeNotFound", "")]);
        assert!(matches!(
            verdict(&o),
            Verdict::Fail {
                code: EXIT_BLOCKED,
                ..
            }
        ));
        let mut o = nm(vec![]);
        o.spec.stage = Stage::Complete;
        assert!(matches!(
            verdict(&o),
            Verdict::Fail {
                code: EXIT_CANCELLED,
                ..
            }
        ));
        let mut o = nm(vec![]);
        o.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        assert!(matches!(
            verdict(&o),
            Verdict::Fail {
                code: EXIT_CANCELLED,
                ..
            }
        ));
    }

    #[test]
    fn blockers_name_pod_pdb_and_reason() {
        let mut o = nm(vec![]);
        let status = o.status.as_mut().unwrap();
        status.targeted_pods = vec![
            blocked_pod(Some("db-pdb"), "PodDisruptionBudgetDeadlock"),
            TargetedPod {
                name: "web-1".into(),
                state: TargetState::Terminating,
                ..blocked_pod(None, "x")
            },
            TargetedPod {
                name: "hooked".into(),
                message: None,
                ..blocked_pod(None, "EvictionDenied")
            },
            TargetedPod {
                name: "db-1".into(),
                message: Some(
                    "blocked by PodDisruptionBudget db-pdb (needs 1 healthy, has 1)".into(),
                ),
                ..blocked_pod(Some("db-pdb"), "PodDisruptionBudgetDeadlock")
            },
        ];
        assert_eq!(
            blocker_lines(&o),
            vec![
                "blocked: shop/db-0 by PodDisruptionBudget db-pdb (PodDisruptionBudgetDeadlock): needs 1 healthy, has 1",
                "blocked: shop/hooked (EvictionDenied)",
                "blocked: shop/db-1 by PodDisruptionBudget db-pdb (needs 1 healthy, has 1) [PodDisruptionBudgetDeadlock]",
            ]
        );
    }

    #[test]
    fn progress_line_counts() {
        let mut o = nm(vec![]);
        o.status.as_mut().unwrap().progress = Some(Progress {
            targeted: 5,
            evicted: 2,
            terminating: 1,
            pending: 2,
            blocked: 1,
            ..Default::default()
        });
        assert_eq!(
            progress_line(&o),
            "w1: Draining 2/5 evicted, 1 terminating, 2 pending, 1 blocked"
        );
        let mut o = new_object(&args(&[])).unwrap();
        o.status = None;
        assert_eq!(
            progress_line(&o),
            "w1: - 0/0 evicted, 0 terminating, 0 pending, 0 blocked"
        );
    }

    #[test]
    fn ages_like_kubectl() {
        for (s, want) in [
            (-3, "0s"),
            (45, "45s"),
            (192, "3m12s"),
            (180, "3m"),
            (1020, "17m"),
            (5 * 3600 + 240, "5h4m"),
            (30 * 3600, "30h"),
            (3 * 86400 + 4 * 3600, "3d4h"),
            (12 * 86400, "12d"),
            (3 * 365 * 86400, "3y"),
            (i64::MAX, "292471208677y"),
        ] {
            assert_eq!(human_age(s), want, "{s}");
        }
    }

    #[test]
    fn status_table_and_notes() {
        let now: Timestamp = "2026-01-01T00:10:00Z".parse().unwrap();
        let mut a = nm(vec![cond(
            CONDITION_EVICTION_BLOCKED,
            "True",
            "PodDisruptionBudgetDeadlock",
            "shop/db-0 blocked by PodDisruptionBudget db-pdb",
        )]);
        a.metadata.creation_timestamp = Some(Time("2026-01-01T00:09:15Z".parse().unwrap()));
        let status = a.status.as_mut().unwrap();
        status.progress = Some(Progress {
            targeted: 2,
            evicted: 1,
            pending: 1,
            blocked: 1,
            ..Default::default()
        });
        status.targeted_pods = vec![blocked_pod(Some("db-pdb"), "PodDisruptionBudgetDeadlock")];
        let mut b = new_object(&args(&["--name", "w2-long-name"])).unwrap();
        b.spec.node_name = "w2".into();
        b.spec.reason = None;
        let text = status_text(&[a, b], now);
        let want = "\
NAME           NODE   STAGE   PHASE      TARGETED   EVICTED   PENDING   BLOCKED   AGE
w1             w1     Drain   Draining   2          1         1         1         45s
w2-long-name   w2     Drain   -          0          0         0         0         -

w1:
  reason: kernel
  EvictionBlocked=True PodDisruptionBudgetDeadlock: shop/db-0 blocked by PodDisruptionBudget db-pdb
  blocked: shop/db-0 by PodDisruptionBudget db-pdb (PodDisruptionBudgetDeadlock): needs 1 healthy, has 1
";
        assert_eq!(text, want);
        assert_eq!(status_text(&[], now), "No NodeMaintenance found.\n");
    }

    fn node(unschedulable: bool, taints: &[&str]) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "w1"},
            "spec": {
                "unschedulable": unschedulable,
                "taints": taints.iter().map(|k| serde_json::json!({"key": k, "effect": "NoSchedule"})).collect::<Vec<_>>(),
            }
        }))
        .unwrap()
    }

    #[test]
    fn release_waits_for_completed_and_the_taint_gone() {
        let mut o = nm(vec![]);
        let tainted = node(
            true,
            &[TAINT_MAINTENANCE, "node.kubernetes.io/unschedulable"],
        );
        let free = node(false, &[]);
        assert_eq!(
            release(Some(&o), Some(&free)),
            Release::Waiting,
            "not Completed"
        );
        o.status.as_mut().unwrap().phase = Some(Phase::Completed);
        assert_eq!(release(Some(&o), Some(&tainted)), Release::Waiting);
        assert_eq!(
            release(Some(&o), Some(&free)),
            Release::Released { schedulable: true }
        );
        assert_eq!(
            release(Some(&o), Some(&node(true, &[]))),
            Release::Released { schedulable: false },
            "cordoned before the maintenance: restored, not uncordoned"
        );
        assert_eq!(
            release(None, Some(&free)),
            Release::Released { schedulable: true }
        );
        assert_eq!(release(Some(&o), None), Release::NodeGone);
        o.status.as_mut().unwrap().conditions = vec![cond(
            CONDITION_CORDONED,
            "False",
            "HeldByOtherMaintenance",
            "held by a",
        )];
        assert_eq!(
            release(Some(&o), Some(&tainted)),
            Release::Held("held by a".into())
        );
    }
}
