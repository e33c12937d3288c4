//! Job errors: typed where they arise, classified once (permanent vs transient) and mapped to
//! the documented error codes in one place ([`JobError::code`], [`JobError::is_transient`]).

use crate::contract::ErrorCode;
use crate::media::MediaError;
use crate::scan::ScanError;
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
    /// The scan stage found a signature: nothing of the source is decoded or written.
    #[error("malware detected: {0}")]
    Malware(String),
    #[error(transparent)]
    Scan(#[from] ScanError),
    #[error("internal error: {0}")]
    Internal(String),
    /// The scratch file system was at or near full when the job failed, the job within its
    /// budget: whatever the library said, the cause was this pod's (`scratch::Verdict::Full`).
    #[error("scratch space exhausted ({free} bytes free; the job needs about {needed}): {cause}")]
    ScratchFull {
        free: u64,
        needed: u64,
        cause: String,
    },
    /// The source alone is larger than this pod's whole scratch: no pod like it could hold it.
    #[error(
        "the source ({source_bytes} bytes) is larger than this worker's scratch file system ({total} bytes of scratch)"
    )]
    ScratchTooSmall { source_bytes: u64, total: u64 },
    /// The job wrote past its scratch budget (what the volume can give one job, less the
    /// reserve and the source: `scratch::Space::budget`) and was not done: no retry and no wait
    /// can give it more (`scratch::Verdict::Overrun`).
    #[error(
        "the job's outputs need more than this worker's scratch can give one job: it wrote {written} bytes, past its budget of {budget} bytes ({total} bytes of scratch), and was not done ({cause})"
    )]
    OutputsTooLarge {
        written: u64,
        budget: u64,
        total: u64,
        cause: String,
    },
    /// A long video's source was replaced while its units were encoded: the planned version is
    /// gone, and no stream is made of two versions.
    #[error(
        "the source was replaced while the video was encoded in units (ETag {now}, planned {planned}): nothing of either version was published"
    )]
    SourceChanged { planned: String, now: String },
    /// A part of a long video (a unit, the audio) failed for good: the whole request's answer
    /// (its message says which part and where).
    #[error("{message}")]
    UnitFailed {
        /// None: the audio.
        index: Option<u32>,
        at_secs: f64,
        code: ErrorCode,
        message: String,
    },
}

impl JobError {
    /// The one mapping from error to documented code.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::InvalidRequest(_) => ErrorCode::InvalidRequest,
            Self::Storage(e) => match e {
                StorageError::NotFound { .. } | StorageError::Changed { .. } => {
                    ErrorCode::SourceNotFound
                }
                StorageError::AccessDenied { .. } => ErrorCode::SourceAccessDenied,
                StorageError::TooLarge { .. } => ErrorCode::InputTooLarge,
                StorageError::Unavailable(_) => ErrorCode::StorageUnavailable,
                StorageError::Scratch(_) => ErrorCode::Internal,
            },
            Self::Media(e) => match e {
                MediaError::Unsupported(_) => ErrorCode::UnsupportedMedia,
                MediaError::Corrupt(_) => ErrorCode::CorruptInput,
                MediaError::LimitsExceeded(_) | MediaError::MemoryLimit(_) => {
                    ErrorCode::LimitsExceeded
                }
                MediaError::Transform(_) => ErrorCode::TransformFailed,
                // Crashed twice, each time in a fresh process: the input triggers a decoder bug.
                MediaError::Crashed(_) => ErrorCode::MediaCrashed,
                MediaError::Io(_) | MediaError::NotStarted(_) | MediaError::Cancelled => {
                    ErrorCode::Internal
                }
                // Native work over its limit: as slow on every attempt, so permanent (network
                // timeouts are `StorageError::Unavailable`, and transient).
                MediaError::Timeout(_) => ErrorCode::Timeout,
            },
            Self::Malware(_) => ErrorCode::MalwareDetected,
            Self::Scan(e) => match e {
                // clamd down, or unable to scan (a database reload, its stream limit below
                // MAX_INPUT_BYTES): the dependency's fault.
                ScanError::Unavailable(_) | ScanError::Refused(_) => ErrorCode::ScanUnavailable,
                ScanError::TooLarge { .. } => ErrorCode::InputTooLarge,
                ScanError::Input(_) | ScanError::NotConfigured => ErrorCode::Internal,
            },
            Self::Internal(_) | Self::ScratchFull { .. } => ErrorCode::Internal,
            Self::ScratchTooSmall { .. } | Self::OutputsTooLarge { .. } => {
                ErrorCode::LimitsExceeded
            }
            Self::SourceChanged { .. } => ErrorCode::SourceNotFound,
            Self::UnitFailed { code, .. } => *code,
        }
    }

    /// Transient failures are worth another attempt: the same input may succeed later. They
    /// are the faults of this pod or of a dependency: the store unavailable, and the local
    /// faults ([`JobError::is_local`]). Permanent ones (bad input, missing or forbidden source,
    /// a decoder that crashed twice, the memory cap) fail at once.
    pub fn is_transient(&self) -> bool {
        matches!(
            self.code(),
            ErrorCode::StorageUnavailable | ErrorCode::ScanUnavailable
        ) || self.is_local()
    }

    /// Whether a full scratch file system could be what made this fail: not a verdict on the
    /// request (its shape, malware, a size no scratch here can hold), not a dependency's
    /// outage, not already known to be the scratch (see `JobRunner::by_pod_state`).
    pub fn could_be_scratch(&self) -> bool {
        let verdict = matches!(
            self,
            Self::InvalidRequest(_)
                | Self::Malware(_)
                | Self::ScratchTooSmall { .. }
                | Self::OutputsTooLarge { .. }
                | Self::ScratchFull { .. }
                | Self::SourceChanged { .. }
                | Self::UnitFailed { .. }
        );
        let dependency = self.is_transient() && !self.is_local();
        !verdict && !dependency
    }

    /// Faults of this pod: scratch space or files (ENOSPC, EMFILE, EIO), a rejected output
    /// write. Answered `internal` (retryable) only when the pod looks well; while it is sick
    /// the job is held instead (see `job::runner`).
    pub fn is_local(&self) -> bool {
        match self {
            Self::Media(e) => e.is_local(),
            _ => matches!(
                self,
                Self::Storage(StorageError::Scratch(_))
                    | Self::Scan(ScanError::Input(_) | ScanError::NotConfigured)
                    | Self::Internal(_)
                    | Self::ScratchFull { .. }
            ),
        }
    }
}

impl JobError {
    /// This failure as the scratch explains it ([`crate::scratch::Meter::verdict`]): past the
    /// job's budget the request's (`OutputsTooLarge`), within it on a full volume the pod's
    /// (`ScratchFull`), else itself.
    pub fn in_scratch(self, verdict: crate::scratch::Verdict) -> JobError {
        use crate::scratch::Verdict;
        match verdict {
            Verdict::Overrun(o) => JobError::OutputsTooLarge {
                written: o.written,
                budget: o.budget,
                total: o.total,
                cause: if o.stopped {
                    "stopped as it passed it".into()
                } else {
                    self.to_string()
                },
            },
            Verdict::Full { free, needed } => JobError::ScratchFull {
                free,
                needed,
                cause: self.to_string(),
            },
            Verdict::Room => self,
        }
    }
}

impl From<std::io::Error> for JobError {
    fn from(e: std::io::Error) -> Self {
        JobError::Internal(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_of_the_pod_are_transient_and_the_inputs_are_not() {
        let local = [
            JobError::Storage(StorageError::Scratch("No space left on device".into())),
            JobError::Media(MediaError::Io("Too many open files".into())),
            JobError::Internal("Input/output error".into()),
        ];
        for e in &local {
            assert!(e.is_local() && e.is_transient(), "{e}");
            assert_eq!(e.code(), ErrorCode::Internal);
        }
        let unavailable = JobError::Storage(StorageError::Unavailable("503".into()));
        assert!(unavailable.is_transient() && !unavailable.is_local());
        let clamd = JobError::Scan(ScanError::Unavailable("connection refused".into()));
        assert!(clamd.is_transient() && !clamd.is_local());
        assert_eq!(clamd.code(), ErrorCode::ScanUnavailable);
        let malware = JobError::Malware("Test.EICAR.UNOFFICIAL".into());
        assert!(!malware.is_transient());
        assert_eq!(malware.code(), ErrorCode::MalwareDetected);
        assert!(malware.to_string().contains("Test.EICAR.UNOFFICIAL"));
        let permanent = [
            JobError::Media(MediaError::Corrupt("truncated".into())),
            JobError::Media(MediaError::Crashed("killed by SIGSEGV".into())),
            JobError::Media(MediaError::MemoryLimit(1 << 30)),
            JobError::InvalidRequest("bad id".into()),
        ];
        for e in &permanent {
            assert!(!e.is_transient(), "{e}");
        }
    }
}
