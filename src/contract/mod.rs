//! Event contract v1: the request and response bodies exchanged over Kafka (docs/events.md).
//! JSON Schemas under `schemas/` are generated from these types (`media-worker schemas`), and a
//! test fails when the two drift.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub mod vocabulary;

pub use vocabulary::{
    ErrorCode, Failure, MediaType, OutputFormat, ProgressStatus, Stage, Status, WarningCode,
};

pub const SCHEMA_VERSION: u32 = 1;

/// Where the published schemas live (each schema's `$id` is this and its file name).
pub const SCHEMA_BASE: &str = "https://git.example.com/media/media-worker/-/raw/main/schemas/";

/// Producer data echoed verbatim in the response (like MediaConvert's `userMetadata`): at
/// most [`MAX_METADATA_ENTRIES`] keys of 1-64 characters of `[A-Za-z0-9_.-]`, string values of
/// at most [`MAX_METADATA_VALUE`] characters.
pub type Metadata = BTreeMap<String, String>;
pub const MAX_METADATA_ENTRIES: usize = 16;
pub const MAX_METADATA_KEY: usize = 64;
pub const MAX_METADATA_VALUE: usize = 256;

/// Where the uploaded original lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SourceRef {
    /// An S3 bucket name.
    #[schemars(extend("pattern" = "^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$"))]
    pub bucket: String,
    /// 1-1024 bytes.
    #[schemars(extend("minLength" = 1, "maxLength" = 1024))]
    pub key: String,
}

/// An optimize request, published on `media.optimize.request` keyed by `media_id`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct OptimizeRequest {
    /// Always 1 for this contract.
    #[schemars(extend("const" = 1))]
    pub schema_version: u32,
    /// The producer's id for this request, echoed in the response; dedupe responses on it.
    #[schemars(extend("minLength" = 1, "maxLength" = 256))]
    pub request_id: String,
    /// 1-128 characters of `[A-Za-z0-9_-]`; part of every output key.
    #[schemars(extend("pattern" = "^[A-Za-z0-9_-]{1,128}$"))]
    pub media_id: String,
    /// 1-128 characters of `[A-Za-z0-9_-]`; the first part of every output key.
    #[schemars(extend("pattern" = "^[A-Za-z0-9_-]{1,128}$"))]
    pub user_id: String,
    pub source: SourceRef,
    /// A hint only: the type is always detected from the bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<MediaType>,
    /// A profile name from the configuration; `default` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// Process again even when a stored result for the same source version and profile exists.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub force: bool,
    /// Echoed verbatim in the response (at most 16 keys of 1-64 `[A-Za-z0-9_.-]`, string
    /// values of at most 256 characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend(
        "maxProperties" = 16,
        "propertyNames" = { "pattern": "^[A-Za-z0-9_.-]{1,64}$" },
        "additionalProperties" = { "type": "string", "maxLength": 256 }
    ))]
    pub metadata: Option<Metadata>,
}

impl OptimizeRequest {
    /// A v1 request with the default profile and no type hint.
    pub fn new(
        request_id: String,
        media_id: String,
        user_id: &str,
        bucket: &str,
        key: String,
    ) -> Self {
        OptimizeRequest {
            schema_version: SCHEMA_VERSION,
            request_id,
            media_id,
            user_id: user_id.to_owned(),
            source: SourceRef {
                bucket: bucket.to_owned(),
                key,
            },
            media_type: None,
            profile: None,
            force: false,
            metadata: None,
        }
    }

    pub fn with_profile(mut self, profile: &str) -> Self {
        self.profile = Some(profile.to_owned());
        self
    }
}

/// The source as the worker found it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SourceInfo {
    pub bucket: String,
    pub key: String,
    pub size_bytes: Option<u64>,
    pub etag: Option<String>,
}

/// One object written by the job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Output {
    /// `variant` (a resized copy), `thumbnail` (a crop around the focal point), `rendition`
    /// (a progressive video transcode), `poster` (an image output of a video's poster frame),
    /// `stream` (an adaptive-streaming entry point: the HLS master playlist or the DASH MPD,
    /// over CMAF segments uploaded beside it) or `storyboard` (the trick-play sprite and the
    /// WebVTT file whose cues point into it).
    #[schemars(extend("enum" = ["variant", "thumbnail", "rendition", "poster", "stream", "storyboard"]))]
    pub role: String,
    pub bucket: String,
    pub key: String,
    /// `webp`, `jpeg`, `avif`, `mp4`, `hls` (an m3u8 master playlist), `dash` (an MPD) or
    /// `vtt` (WebVTT).
    #[schemars(extend("enum" = ["webp", "jpeg", "avif", "mp4", "hls", "dash", "vtt"]))]
    pub format: String,
    pub content_type: String,
    pub width: u32,
    pub height: u32,
    pub size_bytes: u64,
    /// For a thumbnail: the part of the upright source it shows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crop: Option<Rect>,
    /// For a rendition: its duration; for an animated variant: one play's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// For an animated variant (an animated GIF or WebP input's WebP variants): its frames.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frames: Option<u32>,
    /// For an image output: the encoder quality it was written with, and with
    /// `quality = "auto"` what the search aimed at and reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quality: Option<QualityUsed>,
}

/// One format's variants as a `<picture>`'s `<source type srcset>` (or its `<img srcset>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Srcset {
    #[schemars(extend("enum" = ["avif", "webp", "jpeg"]))]
    pub format: String,
    /// The `<source>`'s `type`.
    pub content_type: String,
    /// `"{key} {width}w, ..."`, narrowest first.
    pub srcset: String,
}

impl Srcset {
    /// The `srcset`s of `outputs`' image variants, in `<picture>` order.
    pub fn of(outputs: &[Output]) -> Vec<Srcset> {
        [OutputFormat::Avif, OutputFormat::Webp, OutputFormat::Jpeg]
            .into_iter()
            .filter_map(|f| {
                let mut variants: Vec<&Output> = outputs
                    .iter()
                    .filter(|o| o.role == "variant" && o.format == f.name())
                    .collect();
                variants.sort_by_key(|o| o.width);
                (!variants.is_empty()).then(|| Srcset {
                    format: f.name().to_owned(),
                    content_type: f.content_type().to_owned(),
                    srcset: variants
                        .iter()
                        .map(|o| format!("{} {}w", o.key, o.width))
                        .collect::<Vec<_>>()
                        .join(", "),
                })
            })
            .collect()
    }
}

/// How an image output was encoded.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct QualityUsed {
    /// The encoder's quality setting (1-100).
    pub value: u8,
    /// With `quality = "auto"`: the SSIMULACRA2 score aimed at (100 = identical, 90 visually
    /// lossless, 70 high, 50 medium).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<f64>,
    /// SSIMULACRA2 of this output against the pixels it was encoded from: on every output of an
    /// auto quality (an animated WebP: the worst of up to 8 frames sampled over one play).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
}

/// What the worker learnt about the input: an image (null for the `variants` profile) or a
/// video.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Analysis {
    Image(ImageAnalysis),
    Video(VideoAnalysis),
    /// Only the scan verdict: a scanning profile without analysis, or a source refused as
    /// malware before anything decoded it.
    Scan(ScanOnly),
}

/// The `analysis` of a job that has nothing but its scan verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ScanOnly {
    pub scan: ScanVerdict,
}

/// ClamAV's verdict on a file: `analysis.scan` of a scanning profile's response, and the body
/// of `POST /scan`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ScanVerdict {
    pub clean: bool,
    /// The signature found (`Win.Test.EICAR_HDB-1`), null when clean.
    pub signature: Option<String>,
    /// clamd's `VERSION`: engine, signature database version and date.
    pub engine: String,
    pub scanned_bytes: u64,
    pub duration_ms: u64,
}

impl Analysis {
    pub fn image(&self) -> Option<&ImageAnalysis> {
        match self {
            Self::Image(a) => Some(a),
            _ => None,
        }
    }
    pub fn video(&self) -> Option<&VideoAnalysis> {
        match self {
            Self::Video(v) => Some(v),
            _ => None,
        }
    }
    pub fn scan(&self) -> Option<&ScanVerdict> {
        match self {
            Self::Image(a) => a.scan.as_deref(),
            Self::Video(v) => v.scan.as_deref(),
            Self::Scan(s) => Some(&s.scan),
        }
    }

    /// `analysis` with the scan verdict added (a scan-only analysis when there was none).
    pub fn with_scan(analysis: Option<Analysis>, verdict: ScanVerdict) -> Analysis {
        match analysis {
            Some(Self::Image(a)) => Self::Image(ImageAnalysis {
                scan: Some(Box::new(verdict)),
                ..a
            }),
            Some(Self::Video(v)) => Self::Video(VideoAnalysis {
                scan: Some(Box::new(verdict)),
                ..v
            }),
            Some(Self::Scan(_)) | None => Self::Scan(ScanOnly { scan: verdict }),
        }
    }
}

/// What ffprobe says about a video.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct VideoAnalysis {
    /// Absent when neither the stream nor the container says (some WebM).
    pub duration_ms: Option<u64>,
    /// As displayed (rotation applied).
    pub width: u32,
    pub height: u32,
    pub fps: Option<f64>,
    /// ffprobe codec names (`h264`, `hevc`, `vp9`, ...).
    pub video_codec: String,
    pub audio_codec: Option<String>,
    pub has_audio: bool,
    /// Bits per second of the whole file.
    pub bitrate: Option<u64>,
    /// Display rotation of the source in degrees, applied to every output.
    pub rotation: i32,
    /// HDR transfer (PQ or HLG): outputs are tone-mapped to SDR.
    pub hdr: bool,
    /// Where the poster frame was taken; absent without a poster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poster_time_ms: Option<u64>,
    /// The source's loudness (EBU R128), for a profile with `loudness` and a source with
    /// audible audio.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loudness: Option<Box<Loudness>>,
    /// The malware scan, for a profile with `scan = true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scan: Option<Box<ScanVerdict>>,
}

/// A source's loudness as EBU R128 measures it (ffmpeg's `ebur128` meter).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Loudness {
    /// Integrated loudness, LUFS.
    pub integrated_lufs: f64,
    /// True peak, dBTP.
    pub true_peak_dbtp: f64,
    /// Loudness range, LU.
    pub range_lu: f64,
    /// The integrated loudness the outputs' audio was normalised to, when the profile asks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub normalized_to_lufs: Option<f64>,
}

/// What the worker learnt about an image.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ImageAnalysis {
    /// Upright width in pixels.
    pub width: u32,
    /// Upright height in pixels.
    pub height: u32,
    /// Detected container format (`jpeg`, `png`, `webp`, `gif`, `tiff`, `heif`, `avif`).
    pub format: String,
    pub has_alpha: bool,
    pub animated: bool,
    pub frames: u32,
    /// EXIF orientation of the source (1-8), already applied to every output.
    pub orientation: u8,
    /// OpenCV results; absent when analysis failed (status `degraded`, warning
    /// `analysis_failed`).
    #[serde(flatten)]
    pub vision: Option<Vision>,
    /// The malware scan, for a profile with `scan = true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scan: Option<Box<ScanVerdict>>,
}

/// A rectangle in upright source pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Rect {
    pub x: u32,
    pub y: u32,
    pub width: u32,
    pub height: u32,
}

/// A point in upright source pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Point {
    pub x: u32,
    pub y: u32,
}

/// What OpenCV saw in the image.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Vision {
    pub faces: Vec<Rect>,
    pub face_count: u32,
    /// Centre of the faces weighted by area; without faces, the centroid of the strongest edges.
    pub focal_point: Point,
    /// Variance of the Laplacian of the grey image fitted to 512 px (8-bit scale); higher is
    /// sharper.
    pub blur_score: f64,
    pub is_blurry: bool,
    /// OpenCV img_hash PHash, 64 bits as 16 hex digits; compare by Hamming distance.
    pub phash: String,
    /// `#rrggbb`: the most common colour (12-bit quantised histogram, averaged within its bin).
    pub dominant_color: String,
    /// A short placeholder (https://blurha.sh), 4x3 components.
    pub blurhash: String,
}

/// A non-fatal problem (status `degraded`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Warning {
    pub code: WarningCode,
    pub message: String,
}

/// Why a job failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ErrorBody {
    pub code: ErrorCode,
    pub message: String,
    pub stage: Stage,
    /// True when the same request may succeed if sent again later.
    pub retryable: bool,
}

/// Which worker answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct WorkerInfo {
    pub id: String,
    pub version: String,
}

/// The response to every request, published on `media.optimize.response` keyed by `media_id`
/// (or `{topic}-{partition}-{offset}` when the request carried none).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct OptimizeResponse {
    #[schemars(extend("const" = 1))]
    pub schema_version: u32,
    /// Echoed from the request; null only when an invalid request carried none.
    pub request_id: Option<String>,
    pub media_id: Option<String>,
    pub user_id: Option<String>,
    pub success: bool,
    pub status: Status,
    pub media_type: Option<MediaType>,
    pub source: Option<SourceInfo>,
    pub outputs: Vec<Output>,
    /// The image variants as a front end's `<picture>` takes them, in its order (AVIF, WebP,
    /// then JPEG for the `<img>`): per format, `"{key} {width}w"` narrowest first. Keys are
    /// relative to the output bucket's public base URL. Absent when there are no variants.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub srcset: Vec<Srcset>,
    pub analysis: Option<Analysis>,
    pub warnings: Vec<Warning>,
    pub error: Option<ErrorBody>,
    /// Processing attempts made (0 when the request was invalid).
    pub attempts: u32,
    pub duration_ms: u64,
    pub worker: WorkerInfo,
    /// RFC 3339, UTC.
    pub completed_at: String,
    /// True when answered from the stored manifest of an earlier processing of the same
    /// source version with the same profile (nothing was downloaded or transformed).
    #[serde(default)]
    pub replayed: bool,
    /// True when replayed although the source object no longer exists (deleted once its
    /// outputs existed): the outputs are those the manifest recorded for this profile, and
    /// could not be made again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub source_missing: bool,
    /// The request's `metadata`, verbatim (absent when it had none, or was invalid).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
}

/// A long job's progress, published on `KAFKA_PROGRESS_TOPIC` (when set) keyed like its
/// response, at a bounded rate, before the response. Informational: the response is the
/// answer, and a consumer may miss progress events (they are sent once, never retried).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ProgressEvent {
    #[schemars(extend("const" = 1))]
    pub schema_version: u32,
    pub request_id: String,
    pub media_id: String,
    pub user_id: String,
    /// Always `progressing`: the job is not finished.
    pub status: ProgressStatus,
    /// Estimated fraction of the job done, in [0, 1); never decreases within a job.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub progress: f32,
    /// The stage running now.
    pub stage: Stage,
    /// The processing attempt (1 unless a transient failure was retried).
    pub attempt: u32,
    /// Since the job started.
    pub elapsed_ms: u64,
    pub worker: WorkerInfo,
    /// RFC 3339, UTC.
    pub at: String,
    /// A long video playable before it is done (its profile's `early_playback`): the key of
    /// its early HLS master playlist (beside its plan, in the output bucket), in the event of
    /// the unit that made it playable. Its lowest rung grows as units land and is closed once
    /// the response is published.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub playable: Option<String>,
}

/// The body of a job API answer that is not a job's response: a refused request (401, 503
/// busy) and every `POST /scan` failure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ApiError {
    pub error: ApiErrorBody,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ApiErrorBody {
    #[schemars(extend("enum" = API_ERROR_CODES))]
    pub code: String,
    pub message: String,
}

/// The codes of [`ApiErrorBody`].
pub const API_ERROR_CODES: [&str; 12] = [
    "unauthorized",
    "forbidden",
    "timeout",
    "busy",
    "too_large",
    "bad_request",
    "not_found",
    "access_denied",
    "scan_unavailable",
    "storage_unavailable",
    "not_configured",
    "internal",
];

/// A record of the dead-letter topic: a request whose response the broker rejected for good
/// (too large, invalid, not authorised), with that response and the broker's error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DeadLetter {
    #[schemars(extend("const" = 1))]
    pub schema_version: u32,
    /// Where the request was read.
    pub source: RecordOrigin,
    /// The request as received (text; lossy UTF-8), null when the message had no payload.
    pub request: Option<String>,
    /// Where the response should have gone.
    pub response_topic: String,
    /// The response that could not be published, as it was (null if it was not JSON).
    #[schemars(with = "Option<OptimizeResponse>")]
    pub response: Option<serde_json::Value>,
    /// The broker's error.
    pub error: String,
}

/// A Kafka record's coordinates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RecordOrigin {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

/// The JSON Schemas of the contract, as (file name, pretty JSON). Each root has its `$id`;
/// embedded types (a response inside a dead letter) have none, so their `$ref`s resolve
/// against the root.
pub fn schemas() -> Vec<(&'static str, String)> {
    let pretty = |name: &str, mut s: schemars::Schema| {
        s.insert("$id".into(), format!("{SCHEMA_BASE}{name}").into());
        serde_json::to_string_pretty(&s).expect("schema is JSON") + "\n"
    };
    let request = "optimize-request.v1.json";
    let response = "optimize-response.v1.json";
    let dead_letter = "dead-letter.v1.json";
    let scan_request = "scan-request.v1.json";
    let scan_response = "scan-response.v1.json";
    let api_error = "api-error.v1.json";
    let progress = "progress-event.v1.json";
    vec![
        (
            request,
            pretty(request, schemars::schema_for!(OptimizeRequest)),
        ),
        (
            response,
            pretty(response, schemars::schema_for!(OptimizeResponse)),
        ),
        (
            dead_letter,
            pretty(dead_letter, schemars::schema_for!(DeadLetter)),
        ),
        (
            scan_request,
            pretty(scan_request, schemars::schema_for!(SourceRef)),
        ),
        (
            scan_response,
            pretty(scan_response, schemars::schema_for!(ScanVerdict)),
        ),
        (
            api_error,
            pretty(api_error, schemars::schema_for!(ApiError)),
        ),
        (
            progress,
            pretty(progress, schemars::schema_for!(ProgressEvent)),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_srcset_per_format_in_picture_order_narrowest_first() {
        let out = |role: &str, format: OutputFormat, width: u32| Output {
            role: role.into(),
            bucket: "b".into(),
            key: format!("u/images/m/{width}w.{}", format.ext()),
            format: format.name().into(),
            content_type: format.content_type().into(),
            width,
            height: width,
            size_bytes: 1,
            crop: None,
            duration_ms: None,
            frames: None,
            quality: None,
        };
        let outputs = [
            out("variant", OutputFormat::Jpeg, 640),
            out("variant", OutputFormat::Jpeg, 320),
            out("variant", OutputFormat::Avif, 320),
            out("thumbnail", OutputFormat::Webp, 256),
        ];
        let sets = Srcset::of(&outputs);
        assert_eq!(sets.len(), 2);
        assert_eq!(sets[0].format, "avif");
        assert_eq!(sets[0].srcset, "u/images/m/320w.avif 320w");
        assert_eq!(sets[1].content_type, "image/jpeg");
        assert_eq!(
            sets[1].srcset,
            "u/images/m/320w.jpg 320w, u/images/m/640w.jpg 640w"
        );
    }
}
