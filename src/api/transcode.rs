//! `POST /transcode`: an optimize request (docs/events.md), run now, answered with the response
//! Kafka would carry. Same validation, profiles, outputs, manifest and replay as the Kafka path;
//! the HTTP status follows the response ([`super::status`]). A client that goes away cancels
//! its job: the native work is killed and reaped and the scratch removed.

use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use tracing::Instrument;

use crate::contract::OptimizeResponse;
use crate::job::response;
use crate::stages::validate::{self, Invalid};
use crate::telemetry::{self, Origin, traces};

use super::state::{Api, BodyError, read_body};
use super::status;
use crate::access::Grant;
use axum::Extension;

const ROUTE: &str = "/transcode";
/// Counted for a job whose client went away (nginx's "client closed request").
const CLIENT_CLOSED: u16 = 499;

/// The request in a server span that continues the caller's W3C `traceparent`, like a Kafka
/// message's `media.process_event`.
pub(super) async fn handle(
    State(api): State<Api>,
    Extension(grant): Extension<Grant>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let span = tracing::info_span!(
        "POST /transcode",
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        http.request.method = "POST",
        http.route = ROUTE,
        http.response.status_code = tracing::field::Empty,
        error.type = tracing::field::Empty,
    );
    let traceparent = headers.get("traceparent").and_then(|v| v.to_str().ok());
    traces::continue_trace(&span, traceparent);
    let r = answer(&api, &grant, body, Instant::now())
        .instrument(span.clone())
        .await;
    span.record("http.response.status_code", i64::from(r.status().as_u16()));
    if r.status().is_server_error() || r.status().is_client_error() {
        span.record("error.type", r.status().as_str());
        span.record("otel.status_code", "ERROR");
    }
    r
}

async fn answer(api: &Api, grant: &Grant, body: Body, started: Instant) -> Response {
    let svc = &api.svc;
    let max = svc.settings.requests.max_request_bytes;
    let invalid = |status: StatusCode, reason: String| {
        let invalid = Invalid {
            request_id: None,
            media_id: None,
            user_id: None,
            reason,
        };
        json(
            api,
            status,
            &response::for_invalid(&svc.worker, &invalid, started),
        )
    };
    let payload = match read_body(body, max, api.body_timeout()).await {
        Ok(b) => b,
        Err(BodyError::TooLarge) => {
            let reason = format!("the request is over the {max}-byte limit");
            return invalid(StatusCode::PAYLOAD_TOO_LARGE, reason);
        }
        Err(e) => {
            let (status, _, reason) = api.body_refusal(e, max);
            return invalid(status, reason);
        }
    };
    let req = match validate::parse(Some(&payload), &svc.settings) {
        Ok(req) => req,
        Err(invalid) => {
            tracing::info!(route = ROUTE, reason = %invalid.reason, "invalid request");
            let r = response::for_invalid(&svc.worker, &invalid, started);
            return json(api, StatusCode::BAD_REQUEST, &r);
        }
    };
    if let Some(why) = Api::forbidden(grant, Some(&req.user_id), &req.source.bucket) {
        tracing::info!(route = ROUTE, reason = %why, "forbidden");
        return api.error(StatusCode::FORBIDDEN, "forbidden", why);
    }
    let permit = match api.admit() {
        Some(p) => p,
        None => return api.busy(),
    };
    // The job runs in a task of its own, so that a client going away (this future dropped)
    // cancels it through `cancel` and it still stops cleanly: children reaped, scratch removed,
    // the slot given back.
    let cancel = api.runner.cancel_token();
    let guard = cancel.clone().drop_guard();
    let (runner, registry, metrics, shutdown) = (
        api.runner.clone(),
        svc.registry.clone(),
        svc.metrics.clone(),
        api.shutdown.clone(),
    );
    // The job continues the request's span, whatever becomes of the request.
    let span = tracing::Span::current();
    let task = api.jobs.spawn(
        async move {
            let _permit = permit;
            let job = registry.start(&req.request_id, &req.media_id);
            let r = runner.run_until(&req, &job, cancel.clone()).await;
            // Cancelled, and not by the shutdown's abandon: the client went away.
            if cancel.is_cancelled() && !shutdown.is_abandoned() {
                tracing::info!(route = ROUTE, "client went away: job cancelled");
                metrics
                    .api_requests
                    .with_label_values(&[ROUTE, &CLIENT_CLOSED.to_string()])
                    .inc();
            }
            r
        }
        .instrument(span),
    );
    let r = match task.await {
        Ok(r) => r,
        Err(e) => {
            return api.error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                format!("job task failed: {e}"),
            );
        }
    };
    guard.disarm();
    let status = status::of_response(&r);
    let http_status = status.as_u16();
    telemetry::job_finished(&r, Origin::Api { http_status });
    json(api, status, &r)
}

fn json(api: &Api, status: StatusCode, r: &OptimizeResponse) -> Response {
    api.with_retry_after(status, axum::Json(r).into_response())
}
