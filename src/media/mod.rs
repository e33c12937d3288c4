//! Native media work behind one narrow function, [`process`]: a job spec and scratch paths in,
//! produced files (and analysis) out. It never sees Kafka or S3, so a later step can run it in a
//! child process and a crashing decoder fails one job, not the worker.

pub mod analyze;
pub mod probe;
pub mod sniff;
pub mod transform;
pub mod video;
pub mod vips;
pub mod vision;
mod webpmux;

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::{AnalysisSettings, Limits, OutputFormat, Profile, Settings, VideoSettings};
use crate::contract::{Analysis, MediaType, Warning};
use crate::job::Stage;
use sniff::Sniffed;

pub use probe::Probe;

#[derive(Debug, Clone, thiserror::Error)]
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
    #[error("media processing crashed: {0}")]
    Crashed(String),
    #[error("media processing exceeded its {0:?} limit")]
    Timeout(Duration),
}

impl From<std::io::Error> for MediaError {
    fn from(e: std::io::Error) -> Self {
        MediaError::Io(e.to_string())
    }
}

/// A media error and the stage it happened in.
#[derive(Debug)]
pub struct MediaFailure {
    pub stage: Stage,
    pub error: MediaError,
}

fn at(stage: Stage) -> impl FnOnce(MediaError) -> MediaFailure {
    move |error| MediaFailure { stage, error }
}

/// What to do with one input.
#[derive(Debug, Clone)]
pub struct MediaJob {
    pub profile: Profile,
    pub limits: Limits,
    pub analysis: AnalysisSettings,
    pub video: VideoSettings,
    /// ffmpeg `-threads` (see `Settings::ffmpeg_threads`).
    pub ffmpeg_threads: usize,
    /// The producer's hint; the type is always detected from the bytes.
    pub hint: Option<MediaType>,
}

impl MediaJob {
    /// The job for `profile` (which must exist: requests are validated against the profiles).
    pub fn new(settings: &Settings, profile: &str, hint: Option<MediaType>) -> MediaJob {
        MediaJob {
            profile: settings.profiles[profile].clone(),
            limits: settings.limits.clone(),
            analysis: settings.analysis.clone(),
            video: settings.video.clone(),
            ffmpeg_threads: settings.ffmpeg_threads(),
            hint,
        }
    }
}

/// One file written to the scratch output directory.
#[derive(Debug, Clone)]
pub struct ProducedFile {
    /// File name, which is also the last part of its object key (e.g. `640w.webp`).
    pub name: String,
    pub path: PathBuf,
    pub role: &'static str,
    pub format: FileFormat,
    pub width: u32,
    pub height: u32,
    pub size_bytes: u64,
    /// Video renditions.
    pub duration_ms: Option<u64>,
    /// Thumbnails: the region of the upright source shown.
    pub crop: Option<crate::contract::Rect>,
}

/// What a produced file is encoded as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileFormat {
    Image(OutputFormat),
    /// H.264 + AAC in MP4.
    Mp4,
}

impl FileFormat {
    pub fn name(self) -> &'static str {
        match self {
            Self::Image(f) => f.name(),
            Self::Mp4 => "mp4",
        }
    }
    pub fn content_type(self) -> &'static str {
        match self {
            Self::Image(f) => f.content_type(),
            Self::Mp4 => "video/mp4",
        }
    }
}

/// What the caller hears while media work runs, and how it stops it.
pub struct Control<'a> {
    /// Cancelled when the job's time is up or the worker gives up on it: a running ffmpeg is
    /// killed at once (libvips calls cannot be interrupted and run to their end).
    pub cancel: CancellationToken,
    pub on_event: &'a mut dyn FnMut(Event),
}

impl<'a> Control<'a> {
    pub fn new(on_event: &'a mut dyn FnMut(Event)) -> Self {
        Control {
            cancel: CancellationToken::new(),
            on_event,
        }
    }
    fn emit(&mut self, e: Event) {
        (self.on_event)(e)
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Event {
    /// A stage starts.
    Stage(Stage),
    /// Fraction of the current stage done (video transcodes).
    Progress(f32),
    /// Media time encoded since the last report.
    Encoded(Duration),
    /// The native work may take this long in all (known for a video once it is probed).
    TimeLimit(Duration),
}

#[derive(Debug)]
pub struct MediaOutput {
    pub media_type: MediaType,
    pub files: Vec<ProducedFile>,
    pub analysis: Option<Analysis>,
    pub warnings: Vec<Warning>,
}

/// probe → analyze → transform for one input file, image or video (told apart by content).
pub fn process(
    job: &MediaJob,
    input: &Path,
    out_dir: &Path,
    ctl: &mut Control,
) -> Result<MediaOutput, MediaFailure> {
    ctl.emit(Event::Stage(Stage::Probe));
    let unsupported = |m: &str| Err(at(Stage::Probe)(MediaError::Unsupported(m.into())));
    match sniff::sniff_file(input).map_err(|e| at(Stage::Probe)(e.into()))? {
        Sniffed::Image(format) => image(job, input, format, out_dir, ctl),
        Sniffed::Video => tracing::info_span!("media.process_video")
            .in_scope(|| video::process(job, input, out_dir, ctl)),
        Sniffed::Svg => unsupported("SVG (vector) input is not accepted"),
        Sniffed::Empty => Err(at(Stage::Probe)(MediaError::Corrupt(
            "the file is empty".into(),
        ))),
        Sniffed::Unknown => unsupported("not a supported image or video format"),
    }
}

/// The image pipeline. The input is decoded once, at the start of analyze (or of transform,
/// without analysis).
fn image(
    job: &MediaJob,
    input: &Path,
    format: sniff::ImageFormat,
    out_dir: &Path,
    ctl: &mut Control,
) -> Result<MediaOutput, MediaFailure> {
    let probe = probe::run(input, format, &job.limits).map_err(at(Stage::Probe))?;

    let analyse = job.profile.analysis;
    ctl.emit(Event::Stage(decode_stage(analyse)));
    let (decoded, shared) = decode_image(
        input,
        &probe,
        &job.profile,
        analyse.then_some(&job.analysis),
    )?;

    let mut warnings = Vec::new();
    let analysis = analyse.then(|| {
        // Analysis never fails the job: on error (or a panic in native code) the variants still
        // ship, with a warning.
        let _span = tracing::info_span!("image.analyze").entered();
        let image = shared.as_ref().map_or(&decoded, |v| &v.image);
        let message = match unwind(|| analyze::run(&probe, image, &job.analysis)) {
            Ok(a) => return a,
            Err(e) => e,
        };
        warnings.push(Warning {
            code: "analysis_failed".into(),
            message,
        });
        analyze::basic(&probe)
    });
    let focal = analysis
        .as_ref()
        .and_then(|a| a.vision.as_ref())
        .map(|v| v.focal_point);

    ctl.emit(Event::Stage(Stage::Transform));
    let transformed = tracing::info_span!("image.compress")
        .in_scope(|| transform::run(&decoded, shared, &probe, &job.profile, focal, out_dir))
        .map_err(at(Stage::Transform))?;
    warnings.extend(transformed.warnings);
    Ok(MediaOutput {
        media_type: MediaType::Image,
        files: transformed.files,
        analysis: analysis.map(Analysis::Image),
        warnings,
    })
}

/// Decodes once, at the width every output (and the analysis, when `analysis` is given) needs.
/// With analysis, also makes first the variant the analysis reads, when one fits
/// ([`transform::variant_for`]); the transform stage then uses it as that variant.
pub fn decode_image(
    input: &Path,
    probe: &Probe,
    profile: &Profile,
    analysis: Option<&AnalysisSettings>,
) -> Result<(vips::Image, Option<transform::Variant>), MediaFailure> {
    let first = decode_stage(analysis.is_some());
    let side = analysis.map(|a| analyze::working_side(probe.width, probe.height, a));
    let width = transform::decode_width(probe, profile, side);
    let decoded = transform::decode(input, width, probe.colour).map_err(at(first))?;
    let shared = match side {
        Some(side) => {
            transform::variant_for(&decoded, probe, profile, side).map_err(at(Stage::Transform))?
        }
        None => None,
    };
    Ok((decoded, shared))
}

/// The stage the input is decoded in: the first one that reads pixels.
fn decode_stage(analysis: bool) -> Stage {
    if analysis {
        Stage::Analyze
    } else {
        Stage::Transform
    }
}

/// A panic in native code as an error message (for work whose failure degrades the job).
fn unwind<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|_| Err("panicked".to_owned()))
}
