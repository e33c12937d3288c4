//! What can go wrong in media work, and where ([`MediaFailure`]). Classified into response
//! codes by `error::JobError`.

use std::time::Duration;

use crate::contract::{Failure, Stage};

/// A media failure. `Timeout` is the one time-limit error of a job: native work (or an ffmpeg
/// run) over its limit, permanent because such an input is as slow on every attempt.
#[derive(Debug, Clone, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum MediaError {
    #[error("unsupported media: {0}")]
    Unsupported(String),
    #[error("corrupt input: {0}")]
    Corrupt(String),
    #[error("limits exceeded: {0}")]
    LimitsExceeded(String),
    #[error("transform failed: {0}")]
    Transform(String),
    #[error("scratch i/o: {0}")]
    Io(String),
    /// No process for the work could be started (fork, exec or a pipe failed: EAGAIN, EMFILE,
    /// a missing executable): this pod's fault, whatever the input.
    #[error("the media work could not start: {0}")]
    NotStarted(String),
    /// The process doing the work died (a signal) or panicked: a decoder bug the input
    /// triggers. Reported after a second try in a fresh process (see `sandbox`).
    #[error("media processing crashed: {0}")]
    Crashed(String),
    /// The work needed more memory than a job may use (`MEDIA_MEMORY_LIMIT_BYTES`).
    #[error("memory limit: the input needs more than the {} MiB a job may use", .0 >> 20)]
    MemoryLimit(u64),
    /// Stopped because the worker gave the job up (shutdown past its deadline).
    #[error("media processing cancelled")]
    Cancelled,
    #[error("media processing exceeded its {0:?} limit")]
    Timeout(Duration),
}

impl MediaError {
    /// A fault of this pod (its scratch space, its processes) or a cancellation, not of the
    /// input.
    pub fn is_local(&self) -> bool {
        matches!(self, Self::Io(_) | Self::NotStarted(_) | Self::Cancelled)
    }
}

impl From<std::io::Error> for MediaError {
    fn from(e: std::io::Error) -> Self {
        MediaError::Io(e.to_string())
    }
}

/// A media error and the stage it happened in.
pub type MediaFailure = Failure<MediaError>;

/// `map_err(at(Stage::Probe))`
pub(crate) fn at(stage: Stage) -> impl FnOnce(MediaError) -> MediaFailure {
    Failure::at(stage)
}

/// A panic in native code as an error message (for work whose failure degrades the job).
pub(crate) fn unwind<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|_| Err("panicked".to_owned()))
}
