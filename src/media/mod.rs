//! Native media work behind one narrow function, [`process`]: a job spec and scratch paths in,
//! produced files (and analysis) out. It never sees Kafka or S3, so a later step can run it in a
//! child process and a crashing decoder fails one job, not the worker.

pub mod analyze;
pub mod probe;
pub mod sniff;
pub mod transform;
pub mod vips;
pub mod vision;

use std::path::{Path, PathBuf};

use crate::config::{AnalysisSettings, Limits, OutputFormat, Profile};
use crate::contract::{Analysis, MediaType, Warning};
use crate::job::Stage;

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
    /// The producer's hint; the type is always detected from the bytes.
    pub hint: Option<MediaType>,
}

/// One file written to the scratch output directory.
#[derive(Debug, Clone)]
pub struct ProducedFile {
    /// File name, which is also the last part of its object key (e.g. `640w.webp`).
    pub name: String,
    pub path: PathBuf,
    pub role: &'static str,
    pub format: OutputFormat,
    pub width: u32,
    pub height: u32,
    pub size_bytes: u64,
    /// Thumbnails: the region of the upright source shown.
    pub crop: Option<crate::contract::Rect>,
}

#[derive(Debug)]
pub struct MediaOutput {
    pub media_type: MediaType,
    pub files: Vec<ProducedFile>,
    pub analysis: Option<Analysis>,
    pub warnings: Vec<Warning>,
}

/// probe → analyze → transform for one input file. `on_stage` is told when each stage starts.
/// The input is decoded once, at the start of analyze (or of transform, without analysis).
pub fn process(
    job: &MediaJob,
    input: &Path,
    out_dir: &Path,
    on_stage: &mut dyn FnMut(Stage),
) -> Result<MediaOutput, MediaFailure> {
    on_stage(Stage::Probe);
    let probe = probe::run(input, &job.limits).map_err(at(Stage::Probe))?;

    let analyse = job.profile.analysis;
    let first = if analyse {
        Stage::Analyze
    } else {
        Stage::Transform
    };
    on_stage(first);
    let width = transform::decode_width(
        &probe,
        &job.profile,
        analyse.then_some(job.analysis.max_side),
    );
    let decoded = transform::decode(input, width).map_err(at(first))?;

    let mut warnings = Vec::new();
    let analysis = analyse.then(|| {
        // Analysis never fails the job: on error (or a panic in native code) the variants still
        // ship, with a warning.
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            analyze::run(&probe, &decoded, &job.analysis)
        }));
        let message = match run {
            Ok(Ok(a)) => return a,
            Ok(Err(e)) => e,
            Err(_) => "analysis panicked".to_owned(),
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

    on_stage(Stage::Transform);
    let files = transform::run(&decoded, &probe, &job.profile, focal, out_dir)
        .map_err(at(Stage::Transform))?;
    Ok(MediaOutput {
        media_type: MediaType::Image,
        files,
        analysis,
        warnings,
    })
}
