//! /healthz, /livez, /readyz and /metrics: one router, served over HTTPS behind delegated
//! authorization (`serving.rs`) and, only when asked for, over plain HTTP.

use crate::cache::informers::Informers;
use crate::election::LeaderElector;
use crate::metrics::Metrics;
use crate::runtime::conflicts::Conflicts;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

#[derive(Clone)]
pub struct Health {
    pub metrics: Arc<Metrics>,
    pub informers: Arc<Informers>,
    /// The kcm double-run guard, which fails readiness while it sees kcm at work.
    pub conflicts: Arc<Conflicts>,
    pub elector: Option<Arc<LeaderElector>>,
}

async fn healthz(State(h): State<Health>) -> impl IntoResponse {
    match &h.elector {
        Some(e) if !e.healthy() => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "leaderElection: lease not renewed within lease duration + 20s\n",
        ),
        _ => (StatusCode::OK, "ok\n"),
    }
}

/// One readiness check: its reasons, and whether they fail it.
struct Check {
    name: &'static str,
    /// Why it fails, with the status it fails with; `None`: it passes.
    failed: Option<(StatusCode, String)>,
    /// What is worth knowing although it passes.
    warnings: Vec<String>,
}

/// The checks, in the order they are listed:
/// - `caches`: every shared cache has listed once (leader or not, so standbys stay ready) and no
///   watch has been failing for a minute or is being started again; skipped objects and events
///   are warnings (the rest is served).
/// - `controllers`: no part of a leading controller is failing (a starter retrying after a
///   panic, a task waiting to restart), which the process would otherwise hide behind its Lease.
/// - `conflicts`: kube-controller-manager is not seen running one of our controllers (10
///   minutes after its last such write), so the conflict shows wherever readiness is watched.
fn checks(h: &Health) -> Vec<Check> {
    let mut caches = Check {
        name: "caches",
        failed: None,
        warnings: Vec::new(),
    };
    let unsynced = h.informers.unsynced();
    let mut failing = Vec::new();
    for w in h.informers.watch_troubles() {
        let line = format!("{}: {}", w.resource, w.message);
        if w.unready {
            failing.push(line);
        } else {
            caches.warnings.push(line);
        }
    }
    if !unsynced.is_empty() {
        failing.insert(0, format!("not synced: {}", unsynced.join(", ")));
    }
    if !failing.is_empty() {
        caches.failed = Some((StatusCode::SERVICE_UNAVAILABLE, failing.join("; ")));
    }
    for (resource, skipped) in h.informers.panics() {
        caches.warnings.push(format!(
            "{resource}: {skipped} watch event(s) skipped because taking them into the cache panicked (see the log)"
        ));
    }
    for (resource, now, total) in h.informers.undecodable() {
        caches.warnings.push(format!(
            "{resource}: {now} object(s) skipped now because they do not decode ({total} skips since start; the keys are in the log)"
        ));
    }
    let troubles = h.metrics.troubles().list();
    let controllers = Check {
        name: "controllers",
        failed: (!troubles.is_empty())
            .then(|| (StatusCode::SERVICE_UNAVAILABLE, troubles.join("; "))),
        warnings: Vec::new(),
    };
    let conflicts = Check {
        name: "conflicts",
        // The object is named in the log and its Warning event: a tenant's object names are not
        // for every reader of this endpoint.
        failed: h.conflicts.recent(crate::meta::clock::unix_now()).map(|c| {
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!(
                    "conflicting controller manager: {} wrote {} at {} (Unix seconds) while {} runs here; turn it off in kube-controller-manager (the object is named in the log and its Warning event)",
                    c.manager, c.resource, c.at, c.controller
                ),
            )
        }),
        warnings: Vec::new(),
    };
    vec![caches, controllers, conflicts]
}

/// `/readyz`, open to anyone (an always-allowed path, for the kubelet's probe): the status and,
/// when not ready or asked with `?verbose`, each check passed or failed with its reason
/// withheld, as kube-apiserver words it. The reasons are at `/readyz/<check>`, which the secure
/// port authorizes as any other path (kube's `system:monitoring` role grants `/readyz/*`).
async fn readyz(State(h): State<Health>, uri: axum::http::Uri) -> impl IntoResponse {
    let verbose = uri.query().is_some_and(|q| {
        q.split('&')
            .any(|p| p == "verbose" || p.starts_with("verbose="))
    });
    let checks = checks(&h);
    // A conflict is a 500 (kcm at work), anything else a 503 (not yet, or not now).
    let code = checks
        .iter()
        .filter_map(|c| c.failed.as_ref().map(|(code, _)| *code))
        .max_by_key(|c| c.as_u16() == 500)
        .unwrap_or(StatusCode::OK);
    if code == StatusCode::OK && !verbose {
        return (code, "ok\n".to_string());
    }
    let mut body = String::new();
    for c in &checks {
        match c.failed {
            None => body.push_str(&format!("[+]{} ok\n", c.name)),
            Some(_) => body.push_str(&format!(
                "[-]{} failed: reason withheld (GET /readyz/{} with authorization tells it)\n",
                c.name, c.name
            )),
        }
    }
    body.push_str(if code == StatusCode::OK {
        "readyz check passed\n"
    } else {
        "readyz check failed\n"
    });
    (code, body)
}

/// `/readyz/<check>`: one check with its reasons and warnings, for authorized callers.
async fn readyz_check(State(h): State<Health>, Path(name): Path<String>) -> impl IntoResponse {
    let Some(c) = checks(&h).into_iter().find(|c| c.name == name) else {
        return (
            StatusCode::NOT_FOUND,
            format!("no check {name:?}: caches, controllers or conflicts\n"),
        );
    };
    let (code, mut body) = match c.failed {
        None => (StatusCode::OK, "ok\n".to_string()),
        Some((code, reason)) => (code, format!("failed: {reason}\n")),
    };
    for w in c.warnings {
        body.push_str(&format!("warning: {w}\n"));
    }
    (code, body)
}

async fn metrics(State(h): State<Health>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        h.metrics.encode(),
    )
}

pub fn router(health: Health) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/livez", get(healthz))
        .route("/readyz", get(readyz))
        .route("/readyz/{check}", get(readyz_check))
        .route("/metrics", get(metrics))
        .with_state(health)
}

/// Binds `addr` and serves plain HTTP until `stop`. Returns the bound address (useful with
/// port 0).
pub async fn serve(
    addr: &str,
    health: Health,
    stop: CancellationToken,
) -> std::io::Result<std::net::SocketAddr> {
    let app = router(health);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        let server = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await });
        if let Err(e) = server.await {
            tracing::error!(error = %e, "health server failed");
        }
    });
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::batch::v1::Job;

    async fn get(h: &Health, path: &str) -> (u16, String) {
        let uri: axum::http::Uri = path.parse().unwrap();
        let response = match uri.path().strip_prefix("/readyz/") {
            Some(check) => readyz_check(State(h.clone()), Path(check.to_string()))
                .await
                .into_response(),
            None => readyz(State(h.clone()), uri).await.into_response(),
        };
        let code = response.status().as_u16();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        (code, String::from_utf8(body.to_vec()).unwrap())
    }

    /// Anyone reads the status and the checks' names; the reasons only at `/readyz/<check>`.
    #[tokio::test]
    async fn the_reasons_are_withheld_from_readyz_and_told_per_check() {
        let informers = crate::cache::offline_registry();
        let jobs = informers.get::<Job>();
        let h = Health {
            metrics: Metrics::new(),
            informers: Arc::clone(&informers),
            conflicts: Arc::default(),
            elector: None,
        };
        let (code, body) = get(&h, "/readyz").await;
        assert_eq!(code, 503, "{body}");
        assert!(body.contains("[-]caches failed: reason withheld"), "{body}");
        assert!(body.contains("[+]controllers ok") && body.contains("[+]conflicts ok"));
        assert!(!body.contains("jobs"), "a reason on /readyz: {body}");
        let (code, body) = get(&h, "/readyz/caches").await;
        assert_eq!((code, body.as_str()), (503, "failed: not synced: jobs\n"));

        jobs.testkit_mark_synced();
        h.metrics
            .troubles()
            .set("job-controller", "starter 0", "panicked; retrying".into());
        let (code, body) = get(&h, "/readyz").await;
        assert_eq!(code, 503, "{body}");
        assert!(body.contains("[+]caches ok") && body.contains("[-]controllers failed"));
        let (code, body) = get(&h, "/readyz/controllers").await;
        assert_eq!(code, 503);
        assert!(
            body.contains("job-controller: starter 0 panicked"),
            "{body}"
        );
        h.metrics.troubles().clear("job-controller", "starter 0");

        let (code, body) = get(&h, "/readyz").await;
        assert_eq!((code, body.as_str()), (200, "ok\n"));
        let (code, body) = get(&h, "/readyz?verbose").await;
        assert_eq!(code, 200);
        assert_eq!(
            body,
            "[+]caches ok\n[+]controllers ok\n[+]conflicts ok\nreadyz check passed\n"
        );
        let (code, _) = get(&h, "/readyz/nonsense").await;
        assert_eq!(code, 404);
    }
}
