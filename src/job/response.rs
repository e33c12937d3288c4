//! Building the response for every way a job can end, in one place.

use std::time::Instant;

use crate::contract::{
    Analysis, ErrorBody, OptimizeRequest, OptimizeResponse, SCHEMA_VERSION, ScanVerdict,
    SourceInfo, Srcset, Status, WorkerInfo,
};
use crate::stages::manifest::Produced;
use crate::stages::validate::Invalid;

use crate::contract::Stage;
use crate::error::JobError;

/// A failed attempt: the classified error and the stage it happened in.
pub type Failure = crate::contract::Failure<JobError>;

/// What a successful attempt produced.
#[derive(Debug)]
pub struct Done {
    pub produced: Produced,
    /// Answered from a stored manifest (see `stages::manifest`).
    pub replayed: bool,
    /// Replayed with the source gone (see `manifest::lookup_without_source`).
    pub source_missing: bool,
    /// Not answered here: a long video's plan handed on to its units, or a unit recorded
    /// (see `crate::units`).
    pub handed_off: bool,
}

/// What a failed attempt had learnt before it failed.
#[derive(Debug, Default)]
pub struct Partial {
    /// The source as downloaded.
    pub source: Option<SourceInfo>,
    /// The scan verdict (the signature, when that is why it failed).
    pub scan: Option<ScanVerdict>,
}

/// How a job ended.
pub enum Ending {
    Done(Done),
    Failed { failure: Failure, partial: Partial },
}

fn now_rfc3339() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

fn base(worker: &WorkerInfo, started: Instant) -> OptimizeResponse {
    OptimizeResponse {
        schema_version: SCHEMA_VERSION,
        request_id: None,
        media_id: None,
        user_id: None,
        success: false,
        status: Status::Failed,
        media_type: None,
        source: None,
        outputs: Vec::new(),
        srcset: Vec::new(),
        analysis: None,
        warnings: Vec::new(),
        error: None,
        attempts: 0,
        duration_ms: started.elapsed().as_millis() as u64,
        worker: worker.clone(),
        completed_at: now_rfc3339(),
        replayed: false,
        source_missing: false,
        metadata: None,
    }
}

/// The response to a valid request.
pub fn for_request(
    worker: &WorkerInfo,
    req: &OptimizeRequest,
    ending: Ending,
    attempts: u32,
    started: Instant,
) -> OptimizeResponse {
    let mut r = base(worker, started);
    r.request_id = Some(req.request_id.clone());
    r.media_id = Some(req.media_id.clone());
    r.user_id = Some(req.user_id.clone());
    r.media_type = req.media_type;
    r.metadata = req.metadata.clone();
    r.attempts = attempts;
    match ending {
        Ending::Done(Done {
            produced,
            replayed,
            source_missing,
            ..
        }) => {
            r.success = true;
            r.status = if produced.warnings.is_empty() {
                Status::Completed
            } else {
                Status::Degraded
            };
            r.media_type = Some(produced.media_type);
            r.source = Some(produced.source);
            r.srcset = Srcset::of(&produced.outputs);
            r.outputs = produced.outputs;
            r.analysis = produced.analysis;
            r.warnings = produced.warnings;
            r.replayed = replayed;
            r.source_missing = source_missing;
        }
        Ending::Failed { failure, partial } => {
            r.analysis = partial.scan.map(|v| Analysis::with_scan(None, v));
            r.source = partial.source.or_else(|| {
                Some(SourceInfo {
                    bucket: req.source.bucket.clone(),
                    key: req.source.key.clone(),
                    size_bytes: None,
                    etag: None,
                })
            });
            r.error = Some(ErrorBody {
                code: failure.error.code(),
                message: failure.error.to_string(),
                stage: failure.stage,
                retryable: failure.error.is_transient(),
            });
        }
    }
    r
}

/// The response to a payload that is not a valid request.
pub fn for_invalid(worker: &WorkerInfo, invalid: &Invalid, started: Instant) -> OptimizeResponse {
    let mut r = base(worker, started);
    r.request_id = invalid.request_id.clone();
    r.media_id = invalid.media_id.clone();
    r.user_id = invalid.user_id.clone();
    r.error = Some(ErrorBody {
        code: crate::contract::ErrorCode::InvalidRequest,
        message: invalid.reason.clone(),
        stage: Stage::Validate,
        retryable: false,
    });
    r
}
