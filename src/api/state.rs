//! What the handlers share ([`Api`]): the job runner and its admission, error answers, the
//! bounded body reader, and the middleware that counts every answer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;

use crate::contract::{API_ERROR_CODES, ApiError, ApiErrorBody};
use crate::job::{JobRunner, Services};
use crate::shutdown::Shutdown;

/// What the handlers share.
#[derive(Clone)]
pub(super) struct Api {
    pub svc: Services,
    pub runner: JobRunner,
    /// One per job the API may run at once; `try_acquire` or 503.
    pub admit: Arc<Semaphore>,
    /// The jobs' tasks (they outlive a client that went away until their work is stopped).
    pub jobs: TaskTracker,
    pub shutdown: Shutdown,
    pub retry_after: HeaderValue,
}

impl Api {
    /// An error answer; 503s carry `Retry-After`.
    pub(super) fn error(
        &self,
        status: StatusCode,
        code: &'static str,
        message: String,
    ) -> Response {
        debug_assert!(API_ERROR_CODES.contains(&code));
        let body = axum::Json(ApiError {
            error: ApiErrorBody {
                code: code.to_owned(),
                message,
            },
        });
        self.with_retry_after(status, body.into_response())
    }

    pub(super) fn with_retry_after(&self, status: StatusCode, mut r: Response) -> Response {
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
pub(super) async fn observe(
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
pub(super) enum BodyError {
    TooLarge,
    TimedOut,
    Failed(String),
}

/// Reads a body of at most `max` bytes (stopping as soon as it is over) within `limit`
/// (`API_BODY_TIMEOUT_SECS`): a slow client cannot hold a job slot or a connection for long.
pub(super) async fn read_body(
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
    pub(super) fn body_refusal(
        &self,
        e: BodyError,
        max: usize,
    ) -> (StatusCode, &'static str, String) {
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
    pub(super) fn body_timeout(&self) -> Duration {
        Duration::from_secs(self.svc.settings.api.body_timeout_secs)
    }

    /// A job slot, if one is free (else answer [`Api::busy`]: never queued).
    pub(super) fn admit(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.admit.clone().try_acquire_owned().ok()
    }

    /// The 503 that says every job slot is busy.
    pub(super) fn busy(&self) -> Response {
        let message = format!(
            "all {} API job slots are busy",
            self.svc.settings.api_concurrency()
        );
        self.error(StatusCode::SERVICE_UNAVAILABLE, "busy", message)
    }

    /// 403 unless `grant` may act for `user_id` (when given) with a source in `bucket`.
    pub(super) fn forbidden(
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
