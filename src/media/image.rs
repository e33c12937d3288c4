//! The image pipeline: probe the header, decode once, analyze (optional), then transform. An
//! animation's frames are decoded again, one at a time, for its animated variants.

use std::path::Path;

use super::analyze;
use super::animation::Animation;
use super::control::{Control, Event};
use super::error::{MediaError, MediaFailure, at, unwind};
use super::output::MediaOutput;
use super::probe::{self, Probe};
use super::rights::Rights;
use super::settings::{AnalysisSettings, KeptMetadata, MediaJob, Profile};
use super::sniff;
use super::transform;
use super::vips;
use crate::contract::{Analysis, MediaType, OutputFormat, Point, Stage, Warning, WarningCode};

/// The image pipeline. The input is decoded once, at the start of analyze (or of transform,
/// without analysis).
pub(crate) fn run(
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
            code: WarningCode::AnalysisFailed,
            message,
        });
        analyze::basic(&probe)
    });
    let focal = analysis
        .as_ref()
        .and_then(|a| a.vision.as_ref())
        .map(|v| v.focal_point);

    ctl.emit(Event::Stage(Stage::Transform));
    // Only WebP variants are animated.
    let animated = probe.frames > 1
        && job
            .profile
            .formats
            .iter()
            .any(|f| f.format == OutputFormat::Webp);
    let animation = if animated {
        Some(Animation::open(input, &probe).map_err(at(Stage::Transform))?)
    } else {
        None
    };
    let transformed = tracing::info_span!("image.compress")
        .in_scope(|| {
            let animation = animation.as_ref();
            let keep = job.profile.keep_metadata.contains(&KeptMetadata::Copyright);
            let rights = keep.then(|| Rights::of_file(input));
            let source = transform::Source {
                probe: &probe,
                focal,
                rights: rights.as_ref(),
            };
            transform::run(&decoded, shared, animation, &source, &job.profile, out_dir)
        })
        .map_err(at(Stage::Transform))?;
    warnings.extend(transformed.warnings);
    Ok(MediaOutput {
        media_type: MediaType::Image,
        files: transformed.files,
        analysis: analysis.map(Analysis::Image),
        warnings,
        tracks: Vec::new(),
        plan: None,
        reads: Vec::new(),
        opening: None,
    })
}

/// The outputs of a frame its caller has analysed already (a video's poster, whose focal
/// point, as fractions of its size, came with its score): no analysis here.
pub(crate) fn outputs(
    job: &MediaJob,
    input: &Path,
    format: sniff::ImageFormat,
    out_dir: &Path,
    focal: Option<(f64, f64)>,
) -> Result<MediaOutput, MediaFailure> {
    let probe = probe::run(input, format, &job.limits).map_err(at(Stage::Probe))?;
    let (decoded, shared) = decode_image(input, &probe, &job.profile, None)?;
    let focal = focal.map(|(fx, fy)| Point {
        x: (fx * probe.width as f64) as u32,
        y: (fy * probe.height as f64) as u32,
    });
    let source = transform::Source {
        probe: &probe,
        focal,
        rights: None,
    };
    let transformed = transform::run(&decoded, shared, None, &source, &job.profile, out_dir)
        .map_err(at(Stage::Transform))?;
    Ok(MediaOutput {
        media_type: MediaType::Image,
        files: transformed.files,
        analysis: None,
        warnings: transformed.warnings,
        tracks: Vec::new(),
        plan: None,
        reads: Vec::new(),
        opening: None,
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
    let decoded = transform::decode(input, probe.format, width, probe.colour).map_err(at(first))?;
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

/// The pixels each still variant of the image `input` is encoded from, widest first, as the
/// transform stage makes them (for tools that score outputs against them).
pub fn variant_pixels(
    job: &MediaJob,
    input: &Path,
    mut visit: impl FnMut(u32, &vips::Image),
) -> Result<(), MediaFailure> {
    let probe_err = |e: MediaError| at(Stage::Probe)(e);
    let format = match sniff::sniff_file(input).map_err(|e| probe_err(e.into()))? {
        sniff::Sniffed::Image(f) => f,
        _ => return Err(probe_err(MediaError::Unsupported("not an image".into()))),
    };
    let probe = probe::run(input, format, &job.limits).map_err(at(Stage::Probe))?;
    let (decoded, _) = decode_image(input, &probe, &job.profile, None)?;
    let size = (decoded.width(), decoded.height());
    let widths = transform::plan_widths(&job.profile.widths, probe.width);
    let (plan, _) = transform::plan_variants(&widths, size, &job.profile.formats);
    let stills =
        transform::Stills::make(&decoded, None, &plan, None).map_err(at(Stage::Transform))?;
    for (w, image) in stills.iter() {
        visit(w, image);
    }
    Ok(())
}

/// The pixels each frame of each animated variant of the image `input` is encoded from, as
/// the transform stage makes them: `visit(width, frame, pixels)` for every planned WebP width
/// and frame (for tools that score animated outputs against them).
pub fn animated_pixels(
    job: &MediaJob,
    input: &Path,
    mut visit: impl FnMut(u32, usize, &vips::Image),
) -> Result<(), MediaFailure> {
    let format = match sniff::sniff_file(input).map_err(|e| at(Stage::Probe)(e.into()))? {
        sniff::Sniffed::Image(f) => f,
        _ => {
            return Err(at(Stage::Probe)(MediaError::Unsupported(
                "not an image".into(),
            )));
        }
    };
    let probe = probe::run(input, format, &job.limits).map_err(at(Stage::Probe))?;
    let (decoded, _) = decode_image(input, &probe, &job.profile, None)?;
    let size = (decoded.width(), decoded.height());
    let widths = transform::plan_widths(&job.profile.widths, probe.width);
    let (plan, _) = transform::plan_variants(&widths, size, &job.profile.formats);
    let animation = Animation::open(input, &probe).map_err(at(Stage::Transform))?;
    for (&w, formats) in &plan {
        if formats.iter().any(|f| f.format == OutputFormat::Webp) {
            animation
                .frames_at(w, |i, image| visit(w, i, image))
                .map_err(|e| at(Stage::Transform)(MediaError::Transform(e.0)))?;
        }
    }
    Ok(())
}
