//! /healthz, /livez, /readyz and /metrics: one router, served over HTTPS behind delegated
//! authorization (`serving.rs`) and, only when asked for, over plain HTTP.

use crate::cache::informers::Informers;
use crate::election::LeaderElector;
use crate::metrics::Metrics;
use crate::runtime::conflicts::Conflicts;
use axum::Router;
use axum::extract::State;
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

/// Ready once every shared cache has listed, leader or not, so standbys stay Ready; not ready
/// while kube-controller-manager is seen running one of our controllers (10 minutes after its
/// last such write), so the conflict shows wherever readiness is watched, nor while a part of a
/// controller is failing (a starter retrying after a panic, a task waiting to restart).
async fn readyz(State(h): State<Health>) -> impl IntoResponse {
    let unsynced = h.informers.unsynced();
    if let Some(c) = h.conflicts.recent(crate::meta::clock::unix_now()) {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            // Which object is in the log and the Warning event: /readyz is open to anyone, and
            // a tenant's object names are not theirs to read here.
            format!(
                "conflicting controller manager: {} wrote {} at {} (Unix seconds) while {} runs here; turn it off in kube-controller-manager (the object is named in the log and its Warning event)\n",
                c.manager, c.resource, c.at, c.controller
            ),
        );
    }
    let troubles = h.metrics.troubles().list();
    if unsynced.is_empty() && !troubles.is_empty() {
        // A starter or task of a leading controller that keeps panicking: the process holds the
        // Lease while that part does nothing, which readiness must not hide.
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not healthy: {}\n", troubles.join("; ")),
        );
    }
    if unsynced.is_empty() {
        // Skipped objects do not make the process unready (the rest is served); the keys are in
        // the log and the count in pilothouse_undecodable_objects_total, not here for anyone.
        let mut body = "ok\n".to_string();
        for (resource, skipped) in h.informers.panics() {
            body.push_str(&format!(
                "warning: {resource}: {skipped} watch event(s) skipped because taking them into the cache panicked (see the log)\n"
            ));
        }
        for (resource, now, total) in h.informers.undecodable() {
            body.push_str(&format!(
                "warning: {resource}: {now} object(s) skipped now because they do not decode ({total} skips since start; the keys are in the log)\n"
            ));
        }
        (StatusCode::OK, body)
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("caches not synced: {}\n", unsynced.join(", ")),
        )
    }
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
