//! The operations listener: `/health/live`, `/health/ready`, `/metrics` and `/jobs`.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

use super::{Limits, serve_router};
use crate::health::Health;
use crate::registry::Registry;
use crate::telemetry::Metrics;

#[derive(Clone)]
pub struct HttpState {
    pub metrics: Arc<Metrics>,
    pub registry: Registry,
    pub health: Arc<Health>,
    pub scratch_dir: std::path::PathBuf,
    /// The job API's tokens: with them, `/jobs` names requests to their holders only.
    pub tokens: Option<Arc<crate::access::Tokens>>,
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
    s.metrics
        .responses_held
        .set(i64::from(s.health.held_publishes()));
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

/// The jobs in progress. When the job API has tokens, a caller without one sees no request
/// or media ids (which may name a tenant's objects), only how the jobs are doing.
async fn jobs(State(s): State<HttpState>, headers: axum::http::HeaderMap) -> impl IntoResponse {
    let mut jobs = serde_json::to_value(s.registry.snapshot()).unwrap_or_default();
    let presented = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
    let anonymous = s
        .tokens
        .as_ref()
        .is_some_and(|t| !presented.is_some_and(|p| t.accepts(p)));
    if anonymous {
        for job in jobs.as_array_mut().into_iter().flatten() {
            if let Some(fields) = job.as_object_mut() {
                fields.remove("request_id");
                fields.remove("media_id");
            }
        }
    }
    axum::Json(serde_json::json!({ "jobs": jobs }))
}

/// Binds `addr` and serves until `stop` is cancelled. Returns the bound address.
pub async fn serve(
    addr: SocketAddr,
    state: HttpState,
    limits: Limits,
    stop: CancellationToken,
) -> std::io::Result<SocketAddr> {
    let app = Router::new()
        .route("/health/live", get(live))
        .route("/health/ready", get(ready))
        .route("/metrics", get(metrics))
        .route("/jobs", get(jobs))
        .layer(DefaultBodyLimit::max(limits.max_body_bytes))
        .with_state(state);
    serve_router(addr, app, limits, stop).await
}
