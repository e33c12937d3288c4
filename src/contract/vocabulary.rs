//! The words of the contract, at the bottom of the crate: every value that the response, the
//! metrics and the logs spell the same way (stages, error and warning codes, statuses, media
//! types, output formats). This module imports nothing of the crate, so anything may use it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The stages of a job, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    Validate,
    Download,
    /// The malware scan of the downloaded source (profiles with `scan = true`).
    Scan,
    Probe,
    Analyze,
    Transform,
    Upload,
    Publish,
}

impl Stage {
    pub const ALL: [Stage; 8] = [
        Stage::Validate,
        Stage::Download,
        Stage::Scan,
        Stage::Probe,
        Stage::Analyze,
        Stage::Transform,
        Stage::Upload,
        Stage::Publish,
    ];

    /// The trace span of an async stage.
    pub fn span_name(self) -> String {
        format!("media.{}", self.as_str())
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Validate => "validate",
            Stage::Download => "download",
            Stage::Scan => "scan",
            Stage::Probe => "probe",
            Stage::Analyze => "analyze",
            Stage::Transform => "transform",
            Stage::Upload => "upload",
            Stage::Publish => "publish",
        }
    }
}

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
    MediaCrashed,
    MalwareDetected,
    ScanUnavailable,
    Internal,
}

impl ErrorCode {
    pub const ALL: [ErrorCode; 14] = [
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
        Self::MediaCrashed,
        Self::MalwareDetected,
        Self::ScanUnavailable,
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
            Self::MediaCrashed => "media_crashed",
            Self::MalwareDetected => "malware_detected",
            Self::ScanUnavailable => "scan_unavailable",
            Self::Internal => "internal",
        }
    }
}

/// The warning codes of the contract: a non-fatal problem, the response `degraded`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WarningCode {
    /// No `vision` block.
    AnalysisFailed,
    /// No poster outputs.
    PosterFailed,
    /// An animated GIF without its MP4 renditions.
    AnimationMp4Failed,
    /// A variant made narrower to fit its format.
    VariantRefitted,
    /// A variant covered by a narrower one of the same format.
    VariantSkipped,
    /// No storyboard (its sprite and WebVTT) for a stream.
    StoryboardFailed,
    /// No `loudness` block, and the audio left as it was (silent or unreadable audio).
    LoudnessFailed,
}

impl WarningCode {
    pub const ALL: [WarningCode; 7] = [
        Self::AnalysisFailed,
        Self::PosterFailed,
        Self::AnimationMp4Failed,
        Self::VariantRefitted,
        Self::VariantSkipped,
        Self::StoryboardFailed,
        Self::LoudnessFailed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::AnalysisFailed => "analysis_failed",
            Self::PosterFailed => "poster_failed",
            Self::AnimationMp4Failed => "animation_mp4_failed",
            Self::VariantRefitted => "variant_refitted",
            Self::VariantSkipped => "variant_skipped",
            Self::StoryboardFailed => "storyboard_failed",
            Self::LoudnessFailed => "loudness_failed",
        }
    }
}

/// A progress event's status: only `progressing` (the response says when a job is done).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ProgressStatus {
    Progressing,
}

impl ProgressStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Progressing => "progressing",
        }
    }
}

/// `completed` (all outputs), `degraded` (outputs, with warnings) or `failed` (see `error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Completed,
    Degraded,
    Failed,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::Degraded => "degraded",
            Self::Failed => "failed",
        }
    }
}

/// `image` or `video`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MediaType {
    Image,
    Video,
}

impl MediaType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Image => "image",
            Self::Video => "video",
        }
    }
}

/// An output image format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputFormat {
    Webp,
    Jpeg,
    Avif,
}

impl OutputFormat {
    pub fn ext(self) -> &'static str {
        match self {
            Self::Webp => "webp",
            Self::Jpeg => "jpg",
            Self::Avif => "avif",
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Self::Webp => "webp",
            Self::Jpeg => "jpeg",
            Self::Avif => "avif",
        }
    }
    pub fn content_type(self) -> &'static str {
        match self {
            Self::Webp => "image/webp",
            Self::Jpeg => "image/jpeg",
            Self::Avif => "image/avif",
        }
    }
    /// The longest side an output of this format may have: WebP's 14-bit dimensions, libjpeg's
    /// `JPEG_MAX_DIMENSION`, and for AVIF libheif's default decoding limit (its encoder writes
    /// larger files, which libheif-based readers then refuse).
    pub fn max_side(self) -> u32 {
        match self {
            Self::Webp => 16_383,
            Self::Jpeg => 65_500,
            Self::Avif => 16_384,
        }
    }
    /// The format's usual name, for messages.
    pub fn label(self) -> &'static str {
        match self {
            Self::Webp => "WebP",
            Self::Jpeg => "JPEG",
            Self::Avif => "AVIF",
        }
    }
}

/// A failure and the stage of the job it happened in (`Failure<MediaError>` from the media
/// code, `Failure<JobError>` once classified).
#[derive(Debug, Serialize, Deserialize)]
pub struct Failure<E> {
    pub stage: Stage,
    pub error: E,
}

impl<E> Failure<E> {
    /// `map_err(Failure::at(Stage::Download))`
    pub fn at<F: Into<E>>(stage: Stage) -> impl FnOnce(F) -> Failure<E> {
        move |e| Failure {
            stage,
            error: e.into(),
        }
    }

    /// The same failure with its error converted (e.g. a media error into a job error).
    pub fn into<F: From<E>>(self) -> Failure<F> {
        Failure {
            stage: self.stage,
            error: self.error.into(),
        }
    }
}
