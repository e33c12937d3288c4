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
pub mod status;
mod transcode;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;

use crate::contract::{API_ERROR_CODES, ApiError, ApiErrorBody};
use crate::job::{self, JobRunner, Services};
use crate::sandbox::Executor;
use crate::shutdown::Shutdown;
use crate::telemetry::http::{self, Limits};

/// What the handlers share.
#[derive(Clone)]
struct Api {
    svc: Services,
    runner: JobRunner,
    /// One per job the API may run at once; `try_acquire` or 503.
    admit: Arc<Semaphore>,
    /// The jobs' tasks (they outlive a client that went away until their work is stopped).
    jobs: TaskTracker,
    shutdown: Shutdown,
    retry_after: HeaderValue,
}

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

impl Api {
    /// An error answer; 503s carry `Retry-After`.
    fn error(&self, status: StatusCode, code: &'static str, message: String) -> Response {
        debug_assert!(API_ERROR_CODES.contains(&code));
        let body = axum::Json(ApiError {
            error: ApiErrorBody {
                code: code.to_owned(),
                message,
            },
        });
        self.with_retry_after(status, body.into_response())
    }

    fn with_retry_after(&self, status: StatusCode, mut r: Response) -> Response {
        *r.status_mut() = status;
        if status == StatusCode::SERVICE_UNAVAILABLE {
            r.headers_mut()
                .insert(header::RETRY_AFTER, self.retry_after.clone());
        }
        r
    }
}

/// Counts every answer of a route by status, and `api_in_flight` while it is made (a request
/// whose client went away is counted by its job, as 499).
async fn observe(
    State(api): State<Api>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let started = Instant::now();
    let route = request.uri().path().to_owned();
    let m = &api.svc.metrics;
    m.api_in_flight.inc();
    let _done = InFlight(m.api_in_flight.clone());
    let r = next.run(request).await;
    m.api_requests
        .with_label_values(&[&route, r.status().as_str()])
        .inc();
    m.api_duration
        .with_label_values(&[&route])
        .observe(started.elapsed().as_secs_f64());
    r
}

/// Decrements `api_in_flight` however the request ends.
struct InFlight(prometheus::IntGauge);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Why a body could not be read whole.
enum BodyError {
    TooLarge,
    TimedOut,
    Failed(String),
}

/// Reads a body of at most `max` bytes (stopping as soon as it is over) within `limit`
/// (`API_BODY_TIMEOUT_SECS`): a slow client cannot hold a job slot or a connection for long.
async fn read_body(
    body: axum::body::Body,
    max: usize,
    limit: Duration,
) -> Result<bytes::Bytes, BodyError> {
    use futures_util::StreamExt;
    let mut stream = body.into_data_stream();
    let mut buf = bytes::BytesMut::new();
    let read = async {
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| BodyError::Failed(e.to_string()))?;
            if buf.len() + chunk.len() > max {
                return Err(BodyError::TooLarge);
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(())
    };
    match tokio::time::timeout(limit, read).await {
        Ok(r) => r.map(|_| buf.freeze()),
        Err(_) => Err(BodyError::TimedOut),
    }
}

impl Api {
    /// The refusal of a body that could not be read whole.
    fn body_refusal(&self, e: BodyError, max: usize) -> (StatusCode, &'static str, String) {
        match e {
            BodyError::TooLarge => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!("the body is over {max} bytes"),
            ),
            BodyError::TimedOut => (
                StatusCode::REQUEST_TIMEOUT,
                "timeout",
                format!("the body took longer than {:?}", self.body_timeout()),
            ),
            BodyError::Failed(e) => (
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("reading the body: {e}"),
            ),
        }
    }

    /// `API_BODY_TIMEOUT_SECS`.
    fn body_timeout(&self) -> Duration {
        Duration::from_secs(self.svc.settings.api.body_timeout_secs)
    }

    /// A job slot, if one is free (else answer [`Api::busy`]: never queued).
    fn admit(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.admit.clone().try_acquire_owned().ok()
    }

    /// The 503 that says every job slot is busy.
    fn busy(&self) -> Response {
        let message = format!(
            "all {} API job slots are busy",
            self.svc.settings.api_concurrency()
        );
        self.error(StatusCode::SERVICE_UNAVAILABLE, "busy", message)
    }

    /// 403 unless `grant` may act for `user_id` (when given) with a source in `bucket`.
    fn forbidden(
        grant: &crate::access::Grant,
        user_id: Option<&str>,
        bucket: &str,
    ) -> Option<String> {
        if let Some(user) = user_id.filter(|u| !grant.allows_user(u)) {
            return Some(format!("this token may not act for user_id {user:?}"));
        }
        (!grant.allows_bucket(bucket)).then(|| format!("this token may not read bucket {bucket:?}"))
    }
}
