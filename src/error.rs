//! Job errors: typed where they arise, classified once (permanent vs transient) and mapped to
//! the documented error codes in one place ([`JobError::code`], [`JobError::is_transient`]).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::media::MediaError;
use crate::storage::StorageError;

/// The stable error codes of the response contract (docs/events.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    InvalidRequest,
    SourceNotFound,
    SourceAccessDenied,
    InputTooLarge,
    UnsupportedMedia,
    CorruptInput,
    LimitsExceeded,
    TransformFailed,
    StorageUnavailable,
    Timeout,
    Internal,
}

impl ErrorCode {
    pub const ALL: [ErrorCode; 11] = [
        Self::InvalidRequest,
        Self::SourceNotFound,
        Self::SourceAccessDenied,
        Self::InputTooLarge,
        Self::UnsupportedMedia,
        Self::CorruptInput,
        Self::LimitsExceeded,
        Self::TransformFailed,
        Self::StorageUnavailable,
        Self::Timeout,
        Self::Internal,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidRequest => "invalid_request",
            Self::SourceNotFound => "source_not_found",
            Self::SourceAccessDenied => "source_access_denied",
            Self::InputTooLarge => "input_too_large",
            Self::UnsupportedMedia => "unsupported_media",
            Self::CorruptInput => "corrupt_input",
            Self::LimitsExceeded => "limits_exceeded",
            Self::TransformFailed => "transform_failed",
            Self::StorageUnavailable => "storage_unavailable",
            Self::Timeout => "timeout",
            Self::Internal => "internal",
        }
    }
}

/// Everything that can make a job fail.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error(transparent)]
    Media(#[from] MediaError),
    /// Native media work over its time limit. Such an input is as slow on every attempt, so
    /// this is permanent (network timeouts are `StorageError::Unavailable`, and transient).
    #[error("media processing exceeded its {0:?} limit")]
    Timeout(Duration),
    #[error("internal error: {0}")]
    Internal(String),
}

impl JobError {
    /// The one mapping from error to documented code.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::InvalidRequest(_) => ErrorCode::InvalidRequest,
            Self::Storage(e) => match e {
                StorageError::NotFound { .. } => ErrorCode::SourceNotFound,
                StorageError::AccessDenied { .. } => ErrorCode::SourceAccessDenied,
                StorageError::TooLarge { .. } => ErrorCode::InputTooLarge,
                StorageError::Unavailable(_) => ErrorCode::StorageUnavailable,
                StorageError::Scratch(_) => ErrorCode::Internal,
            },
            Self::Media(e) => match e {
                MediaError::Unsupported(_) => ErrorCode::UnsupportedMedia,
                MediaError::Corrupt(_) => ErrorCode::CorruptInput,
                MediaError::LimitsExceeded(_) => ErrorCode::LimitsExceeded,
                MediaError::Transform(_) => ErrorCode::TransformFailed,
                MediaError::Io(_) | MediaError::Crashed(_) => ErrorCode::Internal,
                MediaError::Timeout(_) => ErrorCode::Timeout,
            },
            Self::Timeout(_) => ErrorCode::Timeout,
            Self::Internal(_) => ErrorCode::Internal,
        }
    }

    /// Transient failures are worth another attempt: the same input may succeed later.
    /// Permanent ones (bad input, missing or forbidden source) fail at once.
    pub fn is_transient(&self) -> bool {
        self.code() == ErrorCode::StorageUnavailable
    }
}

impl From<std::io::Error> for JobError {
    fn from(e: std::io::Error) -> Self {
        JobError::Internal(e.to_string())
    }
}
