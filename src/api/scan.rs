//! `POST /scan`: a file through clamd. The body is the file itself (any content type but
//! JSON), streamed to clamd as it arrives and bounded by `MAX_INPUT_BYTES`, or, with
//! `Content-Type: application/json`, `{"bucket","key"}` of an object, downloaded to scratch
//! (under the same bucket rules as requests) and streamed from there. 200 with the verdict,
//! infected or not; 503 when clamd is unreachable.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;

use crate::contract::{ScanVerdict, SourceRef, Stage};
use crate::registry::JobHandle;
use crate::scan::{ScanError, Scanner};
use crate::scratch::ScratchDir;
use crate::stages::validate;
use crate::storage::StorageError;

use super::state::{Api, read_body};
use crate::access::Grant;
use axum::Extension;

const ROUTE: &str = "/scan";
/// The largest `{"bucket","key"}` body.
const MAX_REF_BYTES: usize = 4096;

pub(super) async fn handle(
    State(api): State<Api>,
    Extension(grant): Extension<Grant>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    // A scan takes a job slot as a transcode does: a tenant cannot scan past the API's share.
    let _permit = match api.admit() {
        Some(p) => p,
        None => return api.busy(),
    };
    // A job like a transcode: listed in `/jobs`, and the worker's stop waits for it.
    let _tracked = api.jobs.token();
    let job = api.svc.registry.start("scan", "scan");
    match answer(&api, &grant, &headers, body, &job).await {
        Ok(v) => {
            tracing::info!(
                route = ROUTE,
                clean = v.clean,
                signature = v.signature.as_deref().unwrap_or(""),
                scanned_bytes = v.scanned_bytes,
                duration_ms = v.duration_ms,
                "scanned"
            );
            axum::Json(v).into_response()
        }
        Err((status, code, message)) => {
            tracing::info!(
                route = ROUTE,
                http_status = status.as_u16(),
                code,
                message,
                "scan failed"
            );
            api.error(status, code, message)
        }
    }
}

type Refusal = (StatusCode, &'static str, String);

async fn answer(
    api: &Api,
    grant: &Grant,
    headers: &HeaderMap,
    body: Body,
    job: &JobHandle,
) -> Result<ScanVerdict, Refusal> {
    let Some(scanner) = &api.svc.scanner else {
        return Err(scan_refusal(ScanError::NotConfigured));
    };
    let max = api.svc.settings.limits.max_input_bytes;
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("application/json"));
    if is_json {
        return scan_object(api, grant, scanner, body, job).await;
    }
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max) {
        return Err(scan_refusal(ScanError::TooLarge { limit: max }));
    }
    // Each part of the body within the API's body timeout: a client that stops sending is let
    // go.
    let limit = api.body_timeout();
    let input = futures_util::stream::unfold(body.into_data_stream(), move |mut s| async move {
        let next = match tokio::time::timeout(limit, s.next()).await {
            Ok(Some(chunk)) => chunk.map_err(std::io::Error::other),
            Ok(None) => return None,
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no part of the body for {limit:?}"),
            )),
        };
        Some((next, s))
    });
    job.stage(Stage::Scan);
    scanner
        .scan(Box::pin(input), max)
        .await
        .map_err(scan_refusal)
}

/// `{"bucket","key"}`: the object downloaded to scratch, then scanned.
async fn scan_object(
    api: &Api,
    grant: &Grant,
    scanner: &Scanner,
    body: Body,
    job: &JobHandle,
) -> Result<ScanVerdict, Refusal> {
    let svc = &api.svc;
    let bad = |m: String| (StatusCode::BAD_REQUEST, "bad_request", m);
    let bytes = read_body(body, MAX_REF_BYTES, api.body_timeout())
        .await
        .map_err(|e| api.body_refusal(e, MAX_REF_BYTES))?;
    let src: SourceRef = serde_json::from_slice(&bytes)
        .map_err(|e| bad(format!("expected {{\"bucket\", \"key\"}}: {e}")))?;
    validate::check_source(&src, &svc.settings.requests).map_err(bad)?;
    if let Some(why) = Api::forbidden(grant, None, &src.bucket) {
        return Err((StatusCode::FORBIDDEN, "forbidden", why));
    }
    let scratch = ScratchDir::create(&svc.settings.worker.tmp_dir, job.id())
        .map_err(|e| storage_refusal(StorageError::Scratch(e.to_string())))?;
    let (path, max) = (scratch.source(), svc.settings.limits.max_input_bytes);
    job.stage(Stage::Download);
    svc.storage
        .download(&src, &path, max)
        .await
        .map_err(storage_refusal)?;
    job.stage(Stage::Scan);
    scanner.scan_file(&path).await.map_err(scan_refusal)
}

fn scan_refusal(e: ScanError) -> Refusal {
    let (status, code) = match &e {
        ScanError::Unavailable(_) | ScanError::Refused(_) => {
            (StatusCode::SERVICE_UNAVAILABLE, "scan_unavailable")
        }
        ScanError::TooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "too_large"),
        ScanError::Input(_) => (StatusCode::BAD_REQUEST, "bad_request"),
        ScanError::NotConfigured => (StatusCode::NOT_IMPLEMENTED, "not_configured"),
    };
    (status, code, e.to_string())
}

fn storage_refusal(e: StorageError) -> Refusal {
    let (status, code) = match &e {
        StorageError::NotFound { .. } | StorageError::Changed { .. } => {
            (StatusCode::NOT_FOUND, "not_found")
        }
        StorageError::AccessDenied { .. } => (StatusCode::FORBIDDEN, "access_denied"),
        StorageError::TooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "too_large"),
        StorageError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "storage_unavailable"),
        StorageError::Scratch(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
    };
    (status, code, e.to_string())
}
