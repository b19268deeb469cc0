//! What the commands print, pure: blocker and progress lines, kubectl's ages, the `status` table.

use super::verdict::condition;
use k8s_openapi::jiff::Timestamp;
use node_maintenance::types::{
    CONDITION_CORDONED, CONDITION_DEADLINE_EXCEEDED, CONDITION_DRAINED, CONDITION_EVICTION_BLOCKED,
    NodeMaintenance, Phase, TargetState,
};

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

pub(super) fn phase_text(nm: &NodeMaintenance) -> &'static str {
    nm.status
        .as_ref()
        .and_then(|s| s.phase)
        .map_or("-", Phase::as_str)
}

/// The counts (targeted, evicted, terminating, pending, blocked).
pub(super) fn counts(nm: &NodeMaintenance) -> (i64, i64, i64, i64, i64) {
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
        let notes = notes(nm);
        if !notes.is_empty() {
            let name = nm.metadata.name.clone().unwrap_or_default();
            out.push('\n');
            out.push_str(&format!("{name}:\n"));
            for n in notes {
                out.push_str(&format!("  {n}\n"));
            }
        }
    }
    out
}

/// What `status` prints under an object's name: its reason, the conditions that need the
/// operator (the unremarkable states are in the table already), its blockers, its last error.
fn notes(nm: &NodeMaintenance) -> Vec<String> {
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
    notes
}
