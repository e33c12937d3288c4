//! The job API's bearer tokens ([`crate::access`]): a request without an accepted one is
//! refused (401); an accepted one's [`Grant`] goes with the request to its handler.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::access::{Grant, Tokens};

/// Refuses a request without an accepted `Authorization: Bearer <token>` (401), when tokens
/// are configured.
pub async fn require_token(
    State(tokens): State<Option<Arc<Tokens>>>,
    mut request: Request,
    next: Next,
) -> Response {
    let Some(tokens) = tokens else {
        request.extensions_mut().insert(Grant::any());
        return next.run(request).await;
    };
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
    if let Some(grant) = presented.and_then(|p| tokens.grant(p)) {
        request.extensions_mut().insert(grant);
        return next.run(request).await;
    }
    let message = if presented.is_some() {
        "the bearer token is not accepted"
    } else {
        "an Authorization: Bearer token is required"
    };
    let body = axum::Json(crate::contract::ApiError {
        error: crate::contract::ApiErrorBody {
            code: "unauthorized".into(),
            message: message.into(),
        },
    });
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        body,
    )
        .into_response()
}
