//! What every video run shares, the one-run ladder's and a long video's parts alike: ffmpeg
//! under its limit with progress reports, its failures classified, the loudness measured over
//! the whole program, the poster's image outputs and the response's analysis.

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::child::{self, ChildError};
use super::ffprobe::VideoProbe;
use super::{loudness, poster, transcode};
use crate::contract::{Analysis, Stage, VideoAnalysis, Warning, WarningCode};
use crate::media::control::{Control, Event};
use crate::media::error::{MediaError, MediaFailure, at};
use crate::media::output::{ProducedFile, Role, names};
use crate::media::settings::MediaJob;

/// ffmpeg's logs and the poster candidates, in the output directory; not uploaded.
pub const WORK: &str = ".work";

pub type Loudness<'a> = Option<(loudness::Measured, &'a crate::media::settings::LoudnessSpec)>;

/// The source's loudness over the whole program, when the profile asks and there is audio
/// (the run's audio filter follows from it); a failure to measure is a warning.
pub fn loudness_of<'a>(
    job: &'a MediaJob,
    probe: &VideoProbe,
    input: &Path,
    work: &Path,
    limit: Duration,
    ctl: &mut Control,
    warnings: &mut Vec<Warning>,
) -> Result<Loudness<'a>, MediaFailure> {
    let Some(spec) = &job.profile.loudness else {
        return Ok(None);
    };
    if probe.audio_codec.is_none() {
        return Ok(None);
    }
    ctl.emit(Event::Stage(Stage::Analyze));
    let log = work.join("loudness.log");
    let warn = |message| Warning {
        code: WarningCode::LoudnessFailed,
        message,
    };
    match loudness::measure(&job.video, probe, input, &log, limit, &ctl.cancel) {
        Ok(Some(m)) => return Ok(Some((m, spec))),
        Ok(None) => warnings.push(warn("the audio is silent".to_owned())),
        Err(MediaError::Timeout(d)) => return Err(at(Stage::Analyze)(MediaError::Timeout(d))),
        Err(e) => warnings.push(warn(e.to_string())),
    }
    Ok(None)
}

/// The response's analysis of a video.
pub fn analysis(probe: &VideoProbe, poster_time: Option<Duration>, loudness: Loudness) -> Analysis {
    Analysis::Video(VideoAnalysis {
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
        loudness: loudness.map(|(m, spec)| Box::new(m.report(spec))),
        scan: None,
    })
}

/// The one ffmpeg run writing `outputs`, with progress reports; `between` runs after each
/// report, while ffmpeg goes on. It runs in `out_dir` (the outputs' names are relative to it). How
/// much media time the run wrote.
#[allow(clippy::too_many_arguments)]
pub fn encode(
    job: &MediaJob,
    probe: &VideoProbe,
    input: &Path,
    outputs: &transcode::Outputs,
    limit: Duration,
    out_dir: &Path,
    ctl: &mut Control,
    between: &mut dyn FnMut(),
) -> Result<Duration, MediaFailure> {
    // The muxers write into folders they do not create.
    let dirs = outputs.dirs(probe).into_iter().map(|d| out_dir.join(d));
    for d in dirs {
        std::fs::create_dir_all(d).map_err(|e| at(Stage::Transform)(e.into()))?;
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

/// The poster frame through the image outputs, under `poster/`. Scoring analysed it already
/// (its faces give the thumbnail's focal point): it is not analysed again.
pub fn poster_outputs(
    job: &MediaJob,
    poster: &poster::Poster,
    out_dir: &Path,
) -> Result<(Vec<ProducedFile>, Vec<Warning>), String> {
    let dir = out_dir.join("poster");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let format = crate::media::sniff::ImageFormat::Png;
    let out = crate::media::image::outputs(job, &poster.path, format, &dir, poster.score.focal)
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
pub fn ffmpeg_error(e: ChildError) -> MediaError {
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

/// The poster chosen among the scored candidates, through the image outputs into `files`
/// (its warnings into `warnings`); when none can be, a `poster_failed` warning. Its time.
pub fn poster(
    job: &MediaJob,
    chooser: poster::Chooser,
    out_dir: &Path,
    ctl: &mut Control,
    files: &mut Vec<ProducedFile>,
    warnings: &mut Vec<Warning>,
) -> Option<Duration> {
    ctl.emit(Event::Stage(Stage::Analyze));
    let chosen = chooser.finish();
    ctl.emit(Event::Stage(Stage::Transform));
    match chosen.and_then(|p| Ok((p.time, poster_outputs(job, &p, out_dir)?))) {
        Ok((time, (outputs, mut more))) => {
            files.extend(outputs);
            warnings.append(&mut more);
            Some(time)
        }
        Err(message) => {
            warnings.push(Warning {
                code: WarningCode::PosterFailed,
                message,
            });
            None
        }
    }
}
