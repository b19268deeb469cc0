//! Reads the API server's audit log (JSON lines, written by tests/cluster/up's audit policy).

use anyhow::Result;
use serde::Deserialize;
use std::path::Path;

#[derive(Debug, Deserialize, Clone)]
#[serde(rename_all = "camelCase")]
pub struct AuditEvent {
    pub stage: String,
    pub verb: String,
    #[serde(default)]
    pub user_agent: String,
    #[serde(default, rename = "requestURI")]
    pub request_uri: String,
    #[serde(default)]
    pub object_ref: Option<ObjectRef>,
    /// RFC 3339 with microseconds.
    #[serde(default)]
    pub request_received_timestamp: String,
    #[serde(default)]
    pub user: UserInfo,
    /// The answer's status (absent at the RequestReceived stage).
    #[serde(default)]
    pub response_status: Option<ResponseStatus>,
}

#[derive(Debug, Deserialize, Clone, Default)]
pub struct ResponseStatus {
    #[serde(default)]
    pub code: Option<u16>,
}

#[derive(Debug, Deserialize, Clone, Default)]
pub struct UserInfo {
    #[serde(default)]
    pub username: String,
}

impl AuditEvent {
    /// When the API server received the request.
    pub fn received(&self) -> Option<k8s_openapi::jiff::Timestamp> {
        self.request_received_timestamp.parse().ok()
    }
}

#[derive(Debug, Deserialize, Clone, Default)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    #[serde(default)]
    pub resource: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub api_group: String,
    #[serde(default)]
    pub subresource: String,
}

/// Every event in the log (and its one rotated backup), oldest first.
pub fn read(path: &Path) -> Result<Vec<AuditEvent>> {
    let mut out = Vec::new();
    let dir = path.parent().unwrap_or(Path::new("."));
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("audit");
    let mut files: Vec<_> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p != path
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{stem}-")))
        })
        .collect();
    files.sort();
    files.push(path.to_path_buf());
    for f in files {
        let Ok(text) = std::fs::read_to_string(&f) else {
            continue;
        };
        out.extend(
            text.lines()
                .filter_map(|l| serde_json::from_str::<AuditEvent>(l).ok()),
        );
    }
    Ok(out)
}

/// Resources (plural names) whose watches were started by clients whose user agent contains
/// `agent` (a watch is logged again when it ends; only its start counts here).
pub fn watched_resources(events: &[AuditEvent], agent: &str) -> std::collections::BTreeSet<String> {
    events
        .iter()
        .filter(|e| {
            e.verb == "watch" && e.stage == "ResponseStarted" && e.user_agent.contains(agent)
        })
        .filter_map(|e| e.object_ref.as_ref().map(|o| o.resource.clone()))
        .collect()
}
