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
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

pub use child::{exits_within, kill_all};

use super::control::{Control, Event};
use super::error::{MediaError, MediaFailure, at};
use super::output::{FileFormat, MediaOutput, ProducedFile, Role, names};
use super::settings::{MediaJob, Rendition};
use super::sniff::Container;
use crate::contract::{Analysis, MediaType, Stage, VideoAnalysis, Warning, WarningCode};
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
    let work = out_dir.join(WORK);
    std::fs::create_dir_all(&work).map_err(|e| at(Stage::Probe)(e.into()))?;
    let result = run(job, input, container, out_dir, &work, ctl);
    let _ = std::fs::remove_dir_all(&work);
    result
}

/// The longest a video job's native work can be allowed: what `run` announces
/// (`Event::TimeLimit`) for the longest video the limits accept and every rung of the profile.
/// The worker clamps an announced limit to it.
pub fn time_ceiling(job: &MediaJob) -> Duration {
    let seconds = job.limits.max_video_seconds as f64;
    let per_rung = Duration::from_secs(job.video.timeout_base_secs)
        + Duration::from_secs_f64(seconds * job.video.timeout_per_second.max(0.0));
    per_rung * (job.profile.renditions.len() as u32).max(1) + per_rung
}

/// The video renditions of an animated GIF (`Profile::animation_mp4`): the ladder as for a
/// video (rungs not taller than the GIF, one at its own size when it is smaller than all),
/// without a poster (the GIF's image outputs have its first frame).
pub fn animation_renditions(
    job: &MediaJob,
    input: &Path,
    out_dir: &Path,
    ctl: &mut Control,
) -> Result<(Vec<ProducedFile>, Vec<Warning>), MediaFailure> {
    let mut job = job.clone();
    job.profile.poster = false;
    let out = process(&job, input, Container::Gif, out_dir, ctl)?;
    Ok((out.files, out.warnings))
}

/// ffmpeg's logs and the poster candidates, in the output directory; not uploaded.
const WORK: &str = ".work";

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
    // The rungs an earlier attempt uploaded are not made again (the caller adds their outputs).
    let rungs: Vec<(Rendition, PathBuf)> = transcode::plan(&job.profile.renditions, &probe)
        .into_iter()
        .filter(|r| !job.resume.contains(&r.height))
        .map(|r| (r, PathBuf::from(names::rendition(r.height))))
        .collect();
    let frames = if job.profile.poster {
        poster::candidate_times(probe.duration, job.video.poster_candidates)
    } else {
        Vec::new()
    };
    // One run, as long as one run per rung took, plus as much again for the poster.
    let per_rung = transcode::time_limit(&job.video, &probe, job.limits.max_video_seconds);
    let run_limit = per_rung * (rungs.len() as u32).max(1);
    ctl.emit(Event::TimeLimit(run_limit + per_rung));

    ctl.emit(Event::Stage(Stage::Transform));
    let mut files = Vec::new();
    let mut warnings = Vec::new();
    let poster_failed = |message: String| Warning {
        code: WarningCode::PosterFailed,
        message,
    };
    let mut chooser = poster::Chooser::new(job, &frames, work);
    // A poster is made from the run's candidates (none when the profile has no poster).
    let mut make_poster = !frames.is_empty();
    if !rungs.is_empty() || !frames.is_empty() {
        // Names relative to `out_dir`, where ffmpeg runs (no path in its `tee` syntax).
        let outputs = transcode::Outputs {
            rungs: &rungs,
            frames: &frames,
            frame_dir: Path::new(WORK),
        };
        // The candidates are scored as they come, while ffmpeg encodes.
        let mut scoring = || chooser.poll();
        let run = encode(
            job,
            &probe,
            input,
            &outputs,
            run_limit,
            out_dir,
            ctl,
            &mut scoring,
        );
        match run {
            Ok(written) => {
                for (r, path) in &rungs {
                    files.push(rendition(&probe, r.height, &out_dir.join(path), written)?);
                }
            }
            // Without renditions to make, a failure costs the poster only.
            Err(e) if rungs.is_empty() => {
                warnings.push(poster_failed(e.error.to_string()));
                make_poster = false;
            }
            Err(e) => return Err(e),
        }
    }

    let mut poster_time = None;
    if make_poster {
        ctl.emit(Event::Stage(Stage::Analyze));
        let chosen = chooser.finish();
        ctl.emit(Event::Stage(Stage::Transform));
        match chosen.and_then(|p| Ok((p.time, poster_outputs(job, &p, out_dir)?))) {
            Ok((time, (outputs, mut more))) => {
                poster_time = Some(time);
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

/// The one ffmpeg run writing `outputs`, with progress reports; `between` runs after each
/// report, while ffmpeg goes on. It runs in `out_dir` (the outputs' names are relative to it). How
/// much media time the run wrote.
#[allow(clippy::too_many_arguments)]
fn encode(
    job: &MediaJob,
    probe: &VideoProbe,
    input: &Path,
    outputs: &transcode::Outputs,
    limit: Duration,
    out_dir: &Path,
    ctl: &mut Control,
    between: &mut dyn FnMut(),
) -> Result<Duration, MediaFailure> {
    for (_, out) in outputs.rungs {
        std::fs::create_dir_all(out_dir.join(out).parent().expect("has a parent"))
            .map_err(|e| at(Stage::Transform)(e.into()))?;
    }
    let args = transcode::args(&job.video, job.ffmpeg_threads, probe, input, outputs);
    let mut cmd = Command::new(&job.video.ffmpeg);
    cmd.args(args).current_dir(out_dir);
    let log = out_dir.join(WORK).join("ffmpeg.log");
    // Media time per rendition: a run writing two rungs encodes twice the media time.
    let renditions = outputs.rungs.len() as u32;
    let mut written = Duration::ZERO;
    let cancel = ctl.cancel.clone();
    child::run(cmd, &log, limit, &cancel, &mut |line| {
        let Some(t) = transcode::progress_time(line) else {
            return;
        };
        if t > written {
            if renditions > 0 {
                ctl.emit(Event::Encoded((t - written) * renditions));
            }
            written = t;
        }
        if let Some(d) = probe.duration {
            let part = (t.as_secs_f64() / d.as_secs_f64()).min(1.0);
            ctl.emit(Event::Progress(part as f32));
        }
        between();
    })
    .map_err(|e| at(Stage::Transform)(ffmpeg_error(e)))?;
    Ok(written)
}

/// A finished rendition. Its size follows from the scale filter and its duration from
/// ffmpeg's last progress report (no second ffprobe run). A rendition much shorter than the
/// input means the input ended early: a truncated upload whose header promised more.
fn rendition(
    source: &VideoProbe,
    short_side: u32,
    path: &Path,
    written: Duration,
) -> Result<ProducedFile, MediaFailure> {
    let fail = at(Stage::Transform);
    if let Some(want) = source.duration
        && written.as_secs_f64() < want.as_secs_f64() * 0.9 - 0.5
    {
        return Err(fail(MediaError::Corrupt(format!(
            "the video ends after {:.1} s of the {:.1} s its header announces",
            written.as_secs_f64(),
            want.as_secs_f64()
        ))));
    }
    let size_bytes = std::fs::metadata(path).map_err(|e| fail(e.into()))?.len();
    let (width, height) = transcode::output_size(source, short_side);
    Ok(ProducedFile {
        name: names::rendition(short_side),
        path: path.to_owned(),
        role: Role::Rendition,
        format: FileFormat::Mp4,
        width,
        height,
        size_bytes,
        duration_ms: Some(written.as_millis() as u64),
        frames: None,
        crop: None,
    })
}

/// The poster frame through the image outputs, under `poster/`. Scoring analysed it already
/// (its faces give the thumbnail's focal point): it is not analysed again.
fn poster_outputs(
    job: &MediaJob,
    poster: &poster::Poster,
    out_dir: &Path,
) -> Result<(Vec<ProducedFile>, Vec<Warning>), String> {
    let dir = out_dir.join("poster");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let format = super::sniff::ImageFormat::Png;
    let out = super::image::outputs(job, &poster.path, format, &dir, poster.score.focal)
        .map_err(|f| f.error.to_string())?;
    let files = out
        .files
        .into_iter()
        .map(|f| ProducedFile {
            name: names::poster(&f.name),
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
