//! The job API, on a listener of its own (`API_ADDR`), so that probes and scrapes never queue
//! behind uploads:
//! - `POST /transcode` ([`transcode`]): an optimize request, answered synchronously with the
//!   response Kafka would carry, its HTTP status mapped from it ([`status`]);
//! - `POST /scan` ([`scan`]): a file (the body, streamed) or an object, through clamd.
//!
//! Both require a bearer token when `API_TOKENS_FILE` is set ([`auth`]).
//!
//! Sharing the cores: API jobs run on a [`JobRunner`] with permits and sandbox children of
//! their own (`API_MAX_CONCURRENT`, default 1 beside Kafka intake); a request beyond them is
//! answered 503 at once, never queued, and never takes a Kafka permit. Beside intake the Kafka
//! pool defaults to the remaining cores (`Settings::pool_size`): one job per core, whoever
//! asked. The API's children run at `nice` 19 (`API_NICE`), so that where an operator gives
//! Kafka every core anyway, the API gets what Kafka leaves (docs/operations.md has the
//! figures of both).

mod auth;
mod scan;
mod state;
pub mod status;
mod transcode;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::HeaderValue;
use axum::routing::post;
use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;

use crate::http::{self, Limits};
use crate::job::{self, JobRunner, Services};
use crate::sandbox::Executor;
use crate::shutdown::Shutdown;
use state::{Api, observe};

/// A running API: its address and its jobs, which the worker waits for when it stops.
pub struct Running {
    pub addr: SocketAddr,
    pub jobs: TaskTracker,
    /// The API's sandbox children (killed and closed with the worker's).
    pub media: Executor,
}

/// Starts the API on `api.addr` (which must be set). It stops taking requests when the worker
/// drains; requests in progress are answered (or abandoned with the other jobs).
pub async fn serve(svc: Services, shutdown: Shutdown) -> anyhow::Result<Running> {
    let settings = svc.settings.clone();
    let addr = settings
        .api
        .addr
        .ok_or_else(|| anyhow::anyhow!("api.addr is not set"))?;
    let permits = settings.api_concurrency();
    let tokens = svc.tokens.clone();
    // Children of its own, at a lower CPU priority: when the cores are contended (the pod's
    // transfers, TLS, JSON besides the jobs), the Kafka pool's children get them first.
    let media = job::executor(&settings, &svc.metrics, permits, settings.api.nice)?;
    let api = Api {
        runner: JobRunner::for_api(svc.clone(), shutdown.clone(), permits, media.clone()),
        admit: Arc::new(Semaphore::new(permits)),
        jobs: TaskTracker::new(),
        shutdown: shutdown.clone(),
        retry_after: HeaderValue::from(settings.api.retry_after_secs),
        svc,
    };
    let jobs = api.jobs.clone();
    let app = Router::new()
        .route("/transcode", post(transcode::handle))
        .route("/scan", post(scan::handle))
        // Each route bounds its own body: /transcode at MAX_REQUEST_BYTES, /scan streams up to
        // MAX_INPUT_BYTES.
        .layer(axum::extract::DefaultBodyLimit::disable())
        .route_layer(axum::middleware::from_fn_with_state(
            tokens,
            auth::require_token,
        ))
        // Outermost: every answer of a route is counted, refusals included.
        .route_layer(axum::middleware::from_fn_with_state(api.clone(), observe))
        .with_state(api);
    let limits = Limits {
        max_connections: settings.api.max_connections,
        header_timeout: Duration::from_millis(settings.http.header_timeout_ms),
        max_body_bytes: settings.requests.max_request_bytes,
    };
    let addr = http::serve_router(addr, app, limits, shutdown.drained()).await?;
    tracing::info!(%addr, permits, "job API listening");
    Ok(Running { addr, jobs, media })
}
