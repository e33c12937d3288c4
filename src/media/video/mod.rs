//! The video pipeline with Debian's ffmpeg as child processes: probe (ffprobe) → analyze (a
//! poster frame) → transform (the rendition ladder, then the poster's image outputs).
//!
//! One video job holds one pool permit, like an image job, while ffmpeg runs `-threads N`
//! with N = cores / pool size by default: pool x threads ≈ cores, so a worker full of video
//! jobs neither idles nor oversubscribes its CPU quota.

pub mod audio;
mod child;
pub mod components;
mod encode;
pub mod ffprobe;
pub mod loudness;
pub mod plan;
pub mod poster;
pub mod reads;
pub mod stitch;
pub mod storyboard;
pub mod stream;
pub mod transcode;
pub mod units;
#[cfg(test)]
mod uses;

use std::path::Path;
use std::time::Duration;

pub use child::{exits_within, kill_all};

use super::control::{Control, Event};
use super::error::{MediaError, MediaFailure, at};
use super::output::{FileFormat, MediaOutput, ProducedFile, Role, Track, TrackId, names};
use super::part::Part;
use super::settings::{MediaJob, Rendition};
use super::sniff::Container;
use crate::contract::{MediaType, Stage, Warning, WarningCode};
use encode::{WORK, analysis, encode, loudness_of};
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

/// `Part::Index`: the bytes a long MP4/MOV's plan reads (`reads::for_plan`), from the source's
/// header, index and first packets (the rest of the file zeros). Anything else, or any doubt
/// (a short video, a probe or packet list that fails on the partial file), reads it whole:
/// the request's own run then decides on the whole file, as it would have.
pub fn index(
    job: &MediaJob,
    input: &Path,
    container: Container,
    out_dir: &Path,
    ctl: &mut Control,
) -> MediaOutput {
    let whole = || MediaOutput::reads(Vec::new());
    let work = out_dir.join(WORK);
    if std::fs::create_dir_all(&work).is_err() {
        return whole();
    }
    let log = work.join("ffprobe.log");
    let Ok(probe) = ffprobe::run(&job.video, input, container, &log, &ctl.cancel) else {
        return whole();
    };
    let long = ffprobe::check(&probe, &job.limits).is_ok() && units::plan(job, &probe).is_some();
    let Ok(size) = std::fs::metadata(input).map(|m| m.len()) else {
        return whole();
    };
    if !long || !reads::ranged(probe.demuxer, input) {
        return whole();
    }
    let limit = transcode::time_limit(&job.video, &probe, job.limits.max_video_seconds);
    let log = work.join("packets.log");
    let reads = reads::packets(&job.video, &probe, input, &log, limit, &ctl.cancel)
        .map(|p| reads::for_plan(&p, size))
        .unwrap_or_default();
    let _ = std::fs::remove_dir_all(&work);
    MediaOutput::reads(reads)
}

/// The longest a video job's native work can be allowed: what `run` announces
/// (`Event::TimeLimit`) for the longest video the limits accept and every rung of the profile.
/// The worker clamps an announced limit to it.
pub fn time_ceiling(job: &MediaJob) -> Duration {
    let seconds = job.limits.max_video_seconds as f64;
    let per_rung = Duration::from_secs(job.video.timeout_base_secs)
        + Duration::from_secs_f64(seconds * job.video.timeout_per_second.max(0.0));
    let loudness = job.profile.loudness.is_some() as u32;
    per_rung * ((job.profile.renditions.len() as u32).max(1) + 1 + loudness)
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
    let p = &mut job.profile;
    (p.poster, p.progressive, p.storyboard, p.loudness) = (false, true, None, None);
    p.streaming.clear();
    let out = process(&job, input, Container::Gif, out_dir, ctl)?;
    Ok((out.files, out.warnings))
}

fn run(
    job: &MediaJob,
    input: &Path,
    container: Container,
    out_dir: &Path,
    work: &Path,
    ctl: &mut Control,
) -> Result<MediaOutput, MediaFailure> {
    let profile = &job.profile;
    let log = work.join("ffprobe.log");
    let probe = ffprobe::run(&job.video, input, container, &log, &ctl.cancel)
        .and_then(|p| ffprobe::check(&p, &job.limits).map(|_| p))
        .map_err(at(Stage::Probe))?;
    // A long video: its units here one after another, or the part of it this job is.
    let planned = units::plan(job, &probe);
    match (&job.part, planned) {
        (Part::Unit(unit), _) => return units::unit_part(job, &probe, input, out_dir, unit, ctl),
        (Part::Plan, Some(plan)) => {
            return units::plan_part(job, &probe, input, out_dir, plan, ctl);
        }
        (Part::Audio, _) => return audio::audio_part(job, &probe, input, out_dir, ctl),
        (Part::Opening(secs), _) => {
            return audio::opening_part(job, &probe, input, out_dir, *secs, ctl);
        }
        (_, Some(plan)) => return units::run(job, &probe, input, out_dir, &plan, ctl),
        (_, None) => {}
    }
    // The rungs an earlier attempt uploaded are not made again (the caller adds their outputs).
    let rungs: Vec<Rendition> = transcode::plan(&profile.renditions, &probe)
        .into_iter()
        .filter(|r| !job.resume.contains(&r.height))
        .collect();
    let frames = if profile.poster {
        poster::candidate_times(probe.duration, job.video.poster_candidates)
    } else {
        Vec::new()
    };
    let stream = (!profile.streaming.is_empty())
        .then(|| transcode::Streaming::new(profile.segment_secs, &probe));
    let mut warnings = Vec::new();
    let warn = |code, message: String| Warning { code, message };
    let mut board = profile
        .storyboard
        .as_ref()
        .and_then(|s| storyboard::plan(s, &probe));
    if profile.storyboard.is_some() && board.is_none() {
        let why = "the video's duration is unknown".to_owned();
        warnings.push(warn(WarningCode::StoryboardFailed, why));
    }
    // One run, as long as one run per rung took, plus as much again for the poster (and for
    // the loudness measurement).
    let per_rung = transcode::time_limit(&job.video, &probe, job.limits.max_video_seconds);
    let run_limit = per_rung * (rungs.len() as u32).max(1);
    let measuring = profile.loudness.is_some() && probe.audio_codec.is_some();
    ctl.emit(Event::TimeLimit(
        run_limit + per_rung * (1 + measuring as u32),
    ));

    // Loudness first, on the audio alone: the run's audio filter follows from it.
    let loudness = loudness_of(job, &probe, input, work, per_rung, ctl, &mut warnings)?;
    let audio_filter = loudness
        .as_ref()
        .and_then(|(m, spec)| loudness::normalise(m, spec));

    ctl.emit(Event::Stage(Stage::Transform));
    let mut files = Vec::new();
    let mut tracks = Vec::new();
    let mut chooser = poster::Chooser::new(job, &frames, work);
    // A poster is made from the run's candidates (none when the profile has no poster).
    let mut make_poster = !frames.is_empty();
    // Names relative to `out_dir`, where ffmpeg runs (no path in its `tee` syntax).
    let outputs = transcode::Outputs {
        rungs: &rungs,
        progressive: profile.progressive,
        stream,
        storyboard: board.as_ref(),
        audio_filter: audio_filter.as_deref(),
        frames: &frames,
        frame_dir: Path::new(WORK),
        span: None,
        first_candidate: 0,
    };
    let stream_audio = outputs.stream_audio(&probe);
    if !rungs.is_empty() || stream_audio || !frames.is_empty() || board.is_some() {
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
                complete(&probe, written).map_err(at(Stage::Transform))?;
                for r in &rungs {
                    let path = out_dir.join(names::rendition(r.height));
                    if profile.progressive {
                        files.push(rendition(&probe, r.height, &path, written)?);
                    }
                    if let Some(s) = stream {
                        let size = transcode::output_size(&probe, r.height);
                        let id = TrackId::Video(r.height);
                        let (track, pieces) = stream::read_track(
                            out_dir,
                            id,
                            size,
                            Some(s.frame_rate),
                            &profile.streaming,
                        )
                        .map_err(at(Stage::Transform))?;
                        tracks.push(track);
                        files.extend(pieces);
                    }
                }
                if let Some(plan) = board.take() {
                    match plan.files(out_dir) {
                        Ok(sprite) => files.extend(sprite),
                        Err(e) => warnings.push(warn(WarningCode::StoryboardFailed, e.to_string())),
                    }
                }
            }
            // Without renditions to make, a failure costs the poster and storyboard only.
            Err(e) if rungs.is_empty() && !stream_audio => {
                if make_poster {
                    warnings.push(warn(WarningCode::PosterFailed, e.error.to_string()));
                }
                if board.take().is_some() {
                    warnings.push(warn(WarningCode::StoryboardFailed, e.error.to_string()));
                }
                make_poster = false;
            }
            Err(e) => return Err(e),
        }
    }
    if let Some(s) = stream {
        let pieces = finish_stream(job, out_dir, s, stream_audio, &tracks);
        files.extend(pieces.map_err(at(Stage::Transform))?);
    }

    let poster_time = if make_poster {
        encode::poster(job, chooser, out_dir, ctl, &mut files, &mut warnings)
    } else {
        None
    };
    Ok(MediaOutput {
        media_type: MediaType::Video,
        files,
        analysis: Some(analysis(&probe, poster_time, loudness)),
        warnings,
        tracks,
        plan: None,
        reads: Vec::new(),
        opening: None,
    })
}

/// The rest of a stream once the run wrote its pieces: the audio track's files, and the entry
/// points over every rung (those an earlier attempt uploaded too, tallest first).
fn finish_stream(
    job: &MediaJob,
    out_dir: &Path,
    s: transcode::Streaming,
    audio: bool,
    made: &[Track],
) -> Result<Vec<ProducedFile>, MediaError> {
    let formats = &job.profile.streaming;
    let mut files = Vec::new();
    let audio = if audio {
        let (track, pieces) = stream::read_track(out_dir, TrackId::Audio, (0, 0), None, formats)?;
        files.extend(pieces);
        Some(track)
    } else {
        None
    };
    let mut video: Vec<Track> = job
        .resumed_tracks
        .iter()
        .filter(|t| !made.iter().any(|n| n.id == t.id))
        .chain(made)
        .cloned()
        .collect();
    video.sort_by_key(|t| std::cmp::Reverse(t.id));
    files.extend(stream::entry_points(
        out_dir,
        formats,
        &video,
        audio.as_ref(),
        s.segment_secs,
    )?);
    Ok(files)
}

/// Whether a run that wrote `written` of media time wrote the whole input: one much shorter
/// means the input ended early, a truncated upload whose header promised more. (A run without
/// rungs writes no media time: nothing to say.)
fn complete(source: &VideoProbe, written: Duration) -> Result<(), MediaError> {
    match source.duration {
        Some(want)
            if !written.is_zero() && written.as_secs_f64() < want.as_secs_f64() * 0.9 - 0.5 =>
        {
            Err(MediaError::Corrupt(format!(
                "the video ends after {:.1} s of the {:.1} s its header announces",
                written.as_secs_f64(),
                want.as_secs_f64()
            )))
        }
        _ => Ok(()),
    }
}

/// A finished rendition. Its size follows from the scale filter and its duration from
/// ffmpeg's last progress report (no second ffprobe run).
fn rendition(
    source: &VideoProbe,
    short_side: u32,
    path: &Path,
    written: Duration,
) -> Result<ProducedFile, MediaFailure> {
    let fail = at(Stage::Transform);
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
        quality: None,
    })
}
