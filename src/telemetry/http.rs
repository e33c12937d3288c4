//! `/health/live`, `/health/ready`, `/metrics` and `/jobs`.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

use super::registry::Registry;
use super::{Health, Metrics};

#[derive(Clone)]
pub struct HttpState {
    pub metrics: Arc<Metrics>,
    pub registry: Registry,
    pub health: Arc<Health>,
    pub scratch_dir: std::path::PathBuf,
}

async fn live() -> &'static str {
    "ok"
}

/// 200 when every check passes, else 503; the body says which.
async fn ready(State(s): State<HttpState>) -> impl IntoResponse {
    let r = s.health.readiness(&s.scratch_dir);
    let status = if r.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(r))
}

async fn metrics(State(s): State<HttpState>) -> impl IntoResponse {
    let r = s.health.readiness(&s.scratch_dir);
    if let Some(free) = r.scratch_free_bytes {
        s.metrics.scratch_free_bytes.set(free as i64);
    }
    s.metrics.ready.set(r.ready as i64);
    let jobs = s.registry.snapshot();
    s.metrics.in_flight.set(jobs.len() as i64);
    s.metrics.update_backlog(
        jobs.iter()
            .map(|j| std::time::Duration::from_millis(j.elapsed_ms)),
    );
    (
        [("content-type", "text/plain; version=0.0.4")],
        s.metrics.render(),
    )
}

async fn jobs(State(s): State<HttpState>) -> impl IntoResponse {
    axum::Json(serde_json::json!({ "jobs": s.registry.snapshot() }))
}

/// Binds `addr` and serves until `stop` is cancelled. Returns the bound address.
pub async fn serve(
    addr: SocketAddr,
    state: HttpState,
    stop: CancellationToken,
) -> std::io::Result<SocketAddr> {
    let app = Router::new()
        .route("/health/live", get(live))
        .route("/health/ready", get(ready))
        .route("/metrics", get(metrics))
        .route("/jobs", get(jobs))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        let server = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned());
        if let Err(e) = server.await {
            tracing::error!(error = %e, "http server failed");
        }
    });
    Ok(bound)
}
