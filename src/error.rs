//! Job errors: typed where they arise, classified once (permanent vs transient) and mapped to
//! the documented error codes in one place ([`JobError::code`], [`JobError::is_transient`]).

use crate::contract::ErrorCode;
use crate::media::MediaError;
use crate::storage::StorageError;

/// Everything that can make a job fail.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error(transparent)]
    Media(#[from] MediaError),
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
                // Native work over its limit: as slow on every attempt, so permanent (network
                // timeouts are `StorageError::Unavailable`, and transient).
                MediaError::Timeout(_) => ErrorCode::Timeout,
            },
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
