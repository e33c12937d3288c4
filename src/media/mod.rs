//! Native media work behind one narrow function, [`process`]: a job spec and scratch paths in,
//! produced files (and analysis) out. It never sees Kafka or S3, so a later step can run it in a
//! child process and a crashing decoder fails one job, not the worker.
//!
//! `image` and `video` are the two pipelines; `settings`, `control`, `output` and `error` are
//! the types they share (the submodules import those, never this file).

pub mod analyze;
pub mod animation;
pub mod control;
pub mod error;
mod gif;
pub mod image;
mod jpegli;
pub mod output;
pub mod part;
pub mod probe;
pub mod quality;
pub mod rights;
pub mod settings;
pub mod sniff;
pub mod track;
pub mod transform;
pub mod video;
pub mod vips;
pub mod vision;
mod webpmux;

use std::path::Path;

use crate::contract::{MediaType, Stage, Warning, WarningCode};
use error::at;
use sniff::Sniffed;

pub use control::{Control, Event};
pub use error::{MediaError, MediaFailure};
pub use output::{FileFormat, MediaOutput, ProducedFile, Role};
pub use probe::Probe;
pub use settings::MediaJob;

/// Starts the native libraries once per process: libvips with `vips_threads` threads per
/// pipeline, and OpenCV's own settings.
pub fn init(vips_threads: usize) {
    vips::init(vips_threads);
    vision::init();
}

/// probe → analyze → transform for one input file, image or video (told apart by content).
pub fn process(
    job: &MediaJob,
    input: &Path,
    out_dir: &Path,
    ctl: &mut Control,
) -> Result<MediaOutput, MediaFailure> {
    if let part::Part::Stitch(stitch) = &job.part {
        // Made of the units' pieces: there is no source to read.
        ctl.emit(Event::Detected(MediaType::Video));
        return video::stitch::stitch_part(job, stitch, out_dir, ctl);
    }
    ctl.emit(Event::Stage(Stage::Probe));
    if job.part == part::Part::Index {
        return Ok(match sniff::sniff_file(input) {
            Ok(Sniffed::Video(container)) => video::index(job, input, container, out_dir, ctl),
            _ => MediaOutput::reads(Vec::new()),
        });
    }
    let unsupported = |m: &str| Err(at(Stage::Probe)(MediaError::Unsupported(m.into())));
    match sniff::sniff_file(input).map_err(|e| at(Stage::Probe)(e.into()))? {
        Sniffed::Image(format) => {
            ctl.emit(Event::Detected(MediaType::Image));
            let mut out = image::run(job, input, format, out_dir, ctl)?;
            // The image pipeline read the header already: it opens again.
            let animated = || vips::Image::open_header(input).is_ok_and(|i| i.pages() > 1);
            if format == sniff::ImageFormat::Gif && job.profile.animation_mp4 && animated() {
                // The MP4 is an extra: when the GIF cannot be one, the image outputs still ship.
                match video::animation_renditions(job, input, out_dir, ctl) {
                    Ok((files, warnings)) => {
                        out.files.extend(files);
                        out.warnings.extend(warnings);
                    }
                    Err(f) if f.error.is_local() => return Err(f),
                    Err(f) => out.warnings.push(Warning {
                        code: WarningCode::AnimationMp4Failed,
                        message: f.error.to_string(),
                    }),
                }
            }
            Ok(out)
        }
        Sniffed::Video(container) => {
            ctl.emit(Event::Detected(MediaType::Video));
            tracing::info_span!("media.process_video")
                .in_scope(|| video::process(job, input, container, out_dir, ctl))
        }
        Sniffed::Svg => unsupported("SVG (vector) input is not accepted"),
        Sniffed::Empty => Err(at(Stage::Probe)(MediaError::Corrupt(
            "the file is empty".into(),
        ))),
        Sniffed::Unknown => unsupported("not a supported image or video format"),
    }
}
