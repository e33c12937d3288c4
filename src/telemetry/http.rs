//! `/health/live`, `/health/ready`, `/metrics` and `/jobs`, on an accept loop of our own that
//! bounds connections and header time ([`Limits`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::registry::Registry;
use super::{Health, Metrics};

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

/// Limits that keep slow or many clients from exhausting the pod (file handles, tasks).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections served at once; more are closed as they arrive.
    pub max_connections: usize,
    /// A connection whose request headers take longer (a slow client, or an idle keep-alive
    /// connection) is closed.
    pub header_timeout: Duration,
    /// Request bodies over this are refused (413) by `serve`'s routes, which take none.
    pub max_body_bytes: usize,
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

/// Binds `addr` and serves `app` on the bounded accept loop until `stop` is cancelled (also
/// the job API's listener, see `api`). Returns the bound address.
pub async fn serve_router(
    addr: SocketAddr,
    app: Router,
    limits: Limits,
    stop: CancellationToken,
) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(accept(listener, app, limits, stop));
    Ok(bound)
}

/// The accept loop: one task per connection, at most `max_connections`, each closed when its
/// headers are late; at `stop` no new connection is taken and open ones finish their request.
async fn accept(listener: TcpListener, app: Router, limits: Limits, stop: CancellationToken) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    loop {
        let stream = tokio::select! {
            _ = stop.cancelled() => return,
            r = listener.accept() => match r {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // EMFILE and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "http accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::debug!("http connection refused: at the connection cap");
            continue; // dropping the stream closes it
        };
        let conn =
            http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let stop = stop.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = stop.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
    }
}
