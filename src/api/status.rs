//! The HTTP status of a job's response (`POST /transcode`), from its error code: 200 for
//! `completed`/`degraded`; 4xx for the request's or the input's own faults; 503 (with
//! `Retry-After`) for every retryable failure; 504 for `timeout`; 500 for our own permanent
//! faults. docs/events.md has the table.

use axum::http::StatusCode;

use crate::contract::{ErrorCode, OptimizeResponse};

pub fn of_response(r: &OptimizeResponse) -> StatusCode {
    match &r.error {
        None => StatusCode::OK,
        Some(e) => of_error(e.code, e.retryable),
    }
}

pub fn of_error(code: ErrorCode, retryable: bool) -> StatusCode {
    use ErrorCode::*;
    match code {
        Timeout => StatusCode::GATEWAY_TIMEOUT,
        _ if retryable => StatusCode::SERVICE_UNAVAILABLE,
        InvalidRequest => StatusCode::BAD_REQUEST,
        SourceNotFound => StatusCode::NOT_FOUND,
        SourceAccessDenied => StatusCode::FORBIDDEN,
        InputTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        UnsupportedMedia => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        CorruptInput | LimitsExceeded | MediaCrashed | MalwareDetected => {
            StatusCode::UNPROCESSABLE_ENTITY
        }
        TransformFailed | StorageUnavailable | ScanUnavailable | Internal => {
            StatusCode::INTERNAL_SERVER_ERROR
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::JobError;

    #[test]
    fn every_code_has_a_status_that_fits_its_class() {
        for code in ErrorCode::ALL {
            for retryable in [false, true] {
                let s = of_error(code, retryable);
                if code == ErrorCode::Timeout {
                    assert_eq!(s, StatusCode::GATEWAY_TIMEOUT);
                } else if retryable {
                    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{code:?}");
                } else {
                    assert!(s.is_client_error() || s.is_server_error(), "{code:?}");
                }
            }
        }
        // The input's faults are the client's (4xx); as classified by JobError.
        let input = JobError::Malware("Eicar".into());
        assert_eq!(
            of_error(input.code(), input.is_transient()),
            StatusCode::UNPROCESSABLE_ENTITY
        );
        let clamd = JobError::Scan(crate::scan::ScanError::Unavailable("refused".into()));
        assert_eq!(
            of_error(clamd.code(), clamd.is_transient()),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            of_error(ErrorCode::InvalidRequest, false),
            StatusCode::BAD_REQUEST
        );
    }
}
