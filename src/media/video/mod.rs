//! The video pipeline with Debian's ffmpeg as child processes: probe (ffprobe) → analyze (a
//! poster frame) → transform (the rendition ladder, then the poster's image outputs).
//!
//! One video job holds one pool permit, like an image job, while ffmpeg runs `-threads N`
//! with N = cores / pool size by default: pool x threads ≈ cores, so a worker full of video
//! jobs neither idles nor oversubscribes its CPU quota.

mod child;
pub mod ffprobe;
pub mod poster;
pub mod transcode;

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

pub use child::{exits_within, kill_all};

use super::control::{Control, Event};
use super::error::{MediaError, MediaFailure, at, unwind};
use super::output::{FileFormat, MediaOutput, ProducedFile, Role};
use super::settings::{MediaJob, Rendition};
use super::sniff::Container;
use crate::contract::{Analysis, MediaType, Stage, VideoAnalysis, Warning};
use child::ChildError;
use ffprobe::VideoProbe;

pub fn process(
    job: &MediaJob,
    input: &Path,
    container: Container,
    out_dir: &Path,
    ctl: &mut Control,
) -> Result<MediaOutput, MediaFailure> {
    // ffmpeg's logs and the poster candidates; not uploaded.
    let work = out_dir.join(".work");
    std::fs::create_dir_all(&work).map_err(|e| at(Stage::Probe)(e.into()))?;
    let result = run(job, input, container, out_dir, &work, ctl);
    let _ = std::fs::remove_dir_all(&work);
    result
}

fn run(
    job: &MediaJob,
    input: &Path,
    container: Container,
    out_dir: &Path,
    work: &Path,
    ctl: &mut Control,
) -> Result<MediaOutput, MediaFailure> {
    let log = work.join("ffprobe.log");
    let probe = ffprobe::run(&job.video, input, container, &log, &ctl.cancel)
        .and_then(|p| ffprobe::check(&p, &job.limits).map(|_| p))
        .map_err(at(Stage::Probe))?;
    let rungs = transcode::plan(&job.profile.renditions, &probe);
    let per_run = transcode::time_limit(&job.video, &probe, job.limits.max_video_seconds);
    // Every rung, plus the same again for the poster's frames and image outputs.
    ctl.emit(Event::TimeLimit(per_run * (rungs.len() as u32 + 1)));

    let mut warnings = Vec::new();
    let poster_failed = |message: String| Warning {
        code: "poster_failed".into(),
        message,
    };
    let mut chosen = None;
    if job.profile.poster {
        ctl.emit(Event::Stage(Stage::Analyze));
        match unwind(|| poster::choose(job, &probe, input, work, &ctl.cancel)) {
            Ok(p) => chosen = Some(p),
            Err(e) => warnings.push(poster_failed(e)),
        }
    }

    ctl.emit(Event::Stage(Stage::Transform));
    let mut files = Vec::new();
    for (i, rung) in rungs.iter().enumerate() {
        let share = (i as f64 / rungs.len() as f64, 1.0 / rungs.len() as f64);
        let rung = Rung {
            rendition: *rung,
            time_limit: per_run,
            progress_share: share,
        };
        files.push(transcode_rung(
            job, &probe, &rung, input, out_dir, work, ctl,
        )?);
    }

    let poster_time = chosen.as_ref().map(|p| p.time);
    if let Some(p) = chosen {
        match poster_outputs(job, &p.path, out_dir, ctl) {
            Ok((outputs, mut more)) => {
                files.extend(outputs);
                warnings.append(&mut more);
            }
            Err(e) => warnings.push(poster_failed(e)),
        }
    }
    Ok(MediaOutput {
        media_type: MediaType::Video,
        files,
        analysis: Some(Analysis::Video(VideoAnalysis {
            duration_ms: probe.duration.map(|d| d.as_millis() as u64),
            width: probe.width,
            height: probe.height,
            fps: probe.fps,
            video_codec: probe.video_codec.clone(),
            audio_codec: probe.audio_codec.clone(),
            has_audio: probe.audio_codec.is_some(),
            bitrate: probe.bitrate,
            rotation: probe.rotation,
            hdr: probe.hdr,
            poster_time_ms: poster_time.map(|t| t.as_millis() as u64),
            scan: None,
        })),
        warnings,
    })
}

/// One rung to run.
pub struct Rung {
    pub rendition: Rendition,
    pub time_limit: Duration,
    /// (start, width) of this rung in the job's progress, as fractions.
    pub progress_share: (f64, f64),
}

/// One ffmpeg run: `mp4/{height}p.mp4` in `out_dir`, with progress reports.
pub fn transcode_rung(
    job: &MediaJob,
    probe: &VideoProbe,
    rung: &Rung,
    input: &Path,
    out_dir: &Path,
    work: &Path,
    ctl: &mut Control,
) -> Result<ProducedFile, MediaFailure> {
    let height = rung.rendition.height;
    let name = format!("mp4/{height}p.mp4");
    let out = out_dir.join(&name);
    std::fs::create_dir_all(out.parent().expect("has a parent"))
        .map_err(|e| at(Stage::Transform)(e.into()))?;
    let args = transcode::args(
        &job.video,
        job.ffmpeg_threads,
        probe,
        &rung.rendition,
        input,
        &out,
    );
    let mut cmd = Command::new(&job.video.ffmpeg);
    cmd.args(args).current_dir(work);
    let log = work.join(format!("{height}p.log"));
    let (start, width) = rung.progress_share;
    let mut written = Duration::ZERO;
    let cancel = ctl.cancel.clone();
    child::run(cmd, &log, rung.time_limit, &cancel, &mut |line| {
        let Some(t) = transcode::progress_time(line) else {
            return;
        };
        if t > written {
            ctl.emit(Event::Encoded(t - written));
            written = t;
        }
        if let Some(d) = probe.duration {
            let part = (t.as_secs_f64() / d.as_secs_f64()).min(1.0);
            ctl.emit(Event::Progress((start + part * width) as f32));
        }
    })
    .map_err(|e| at(Stage::Transform)(ffmpeg_error(e)))?;
    rendition(probe, height, &name, &out, written)
}

/// A finished rendition. Its size follows from the scale filter and its duration from
/// ffmpeg's last progress report (no second ffprobe run). A rendition much shorter than the
/// input means the input ended early: a truncated upload whose header promised more.
fn rendition(
    source: &VideoProbe,
    short_side: u32,
    name: &str,
    path: &Path,
    written: Duration,
) -> Result<ProducedFile, MediaFailure> {
    let fail = at(Stage::Transform);
    if let Some(want) = source.duration {
        if written.as_secs_f64() < want.as_secs_f64() * 0.9 - 0.5 {
            return Err(fail(MediaError::Corrupt(format!(
                "the video ends after {:.1} s of the {:.1} s its header announces",
                written.as_secs_f64(),
                want.as_secs_f64()
            ))));
        }
    }
    let size_bytes = std::fs::metadata(path).map_err(|e| fail(e.into()))?.len();
    let (width, height) = transcode::output_size(source, short_side);
    Ok(ProducedFile {
        name: name.to_owned(),
        path: path.to_owned(),
        role: Role::Rendition,
        format: FileFormat::Mp4,
        width,
        height,
        size_bytes,
        duration_ms: Some(written.as_millis() as u64),
        crop: None,
    })
}

/// The poster frame through the image pipeline, under `poster/`.
fn poster_outputs(
    job: &MediaJob,
    frame: &Path,
    out_dir: &Path,
    ctl: &mut Control,
) -> Result<(Vec<ProducedFile>, Vec<Warning>), String> {
    let dir = out_dir.join("poster");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    // Its stages are part of this job's transform stage: not reported again.
    let mut quiet = |_: Event| {};
    let mut inner = Control {
        cancel: ctl.cancel.clone(),
        on_event: &mut quiet,
    };
    let out = super::image::run(job, frame, super::sniff::ImageFormat::Png, &dir, &mut inner)
        .map_err(|f| f.error.to_string())?;
    let files = out
        .files
        .into_iter()
        .map(|f| ProducedFile {
            name: format!("poster/{}", f.name),
            role: Role::Poster,
            ..f
        })
        .collect();
    Ok((files, out.warnings))
}

/// What an ffmpeg failure means for the job.
fn ffmpeg_error(e: ChildError) -> MediaError {
    match e {
        ChildError::TimedOut(d) => MediaError::Timeout(d),
        ChildError::Failed { status, .. } if status.signal().is_some() => {
            // Not our kill (that is a timeout or a cancellation): ffmpeg itself crashed.
            MediaError::Crashed(format!("ffmpeg {status}"))
        }
        ChildError::Failed { stderr, status, .. } if stderr.is_empty() => {
            MediaError::Transform(format!("ffmpeg {status}"))
        }
        ChildError::Failed { stderr, .. } => {
            // ffprobe read the headers, so a decoder or demuxer failing now met broken data
            // (ffmpeg runs with -xerror: it stops at the first error).
            const CORRUPT: [&str; 18] = [
                "Invalid data",
                "partial file",
                "moov atom",
                "corrupt",
                "error while decoding",
                "Error while decoding",
                "Invalid NAL unit",
                "Error splitting the input",
                "missing picture",
                "Header missing",
                "Input buffer exhausted",
                "exceeds limit",
                "Number of bands",
                "outside the valid range",
                "validation failed",
                "invalid as first byte of an EBML number",
                "exceeds containing master element",
                "invalid band type",
            ];
            if CORRUPT.iter().any(|c| stderr.contains(c)) {
                MediaError::Corrupt(format!("ffmpeg: {stderr}"))
            } else {
                MediaError::Transform(format!("ffmpeg: {stderr}"))
            }
        }
        other => MediaError::Transform(other.to_string()),
    }
}
