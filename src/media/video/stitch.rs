//! A long video's stitch (`Part::Stitch`): everything made of its units once they have all
//! landed (the units themselves: `super::units`). Every rung's playlist from its units'
//! measured segments (bandwidths over the whole video), the master and the MPD; the
//! progressive MP4s assembled from the segments without encoding anything again; the
//! storyboard sprite from the tiles; the poster chosen among every unit's candidates. Entry
//! points last, as in a one-run encode.

use std::path::Path;

use super::encode::{WORK, ffmpeg_error};
use super::ffprobe::VideoProbe;
use super::{poster, storyboard, stream, transcode};
use crate::contract::{Stage, Warning, WarningCode};
use crate::media::control::{Control, Event};
use crate::media::error::{MediaError, MediaFailure, at};
use crate::media::output::{FileFormat, MediaOutput, ProducedFile, Role, Track, TrackId, names};
use crate::media::part::StitchInput;
use crate::media::settings::MediaJob;

/// Where the units left their storyboard tiles and poster candidates (relative to the output
/// directory).
const PIECES: &str = names::PIECES;

/// What the stitch made.
pub struct Stitched {
    pub files: Vec<ProducedFile>,
    pub tracks: Vec<Track>,
    pub warnings: Vec<Warning>,
    pub poster_time: Option<std::time::Duration>,
}

/// Everything made of the units, in `out_dir` where they landed: `units[i]` is unit `i`'s
/// tracks (tallest first), `audio` the whole video's.
pub fn stitch(
    job: &MediaJob,
    probe: &VideoProbe,
    out_dir: &Path,
    units: &[Vec<Track>],
    audio: Option<&Track>,
    ctl: &mut Control,
) -> Result<Stitched, MediaFailure> {
    let fail = |e| at(Stage::Transform)(e);
    let profile = &job.profile;
    let mut warnings = Vec::new();
    let mut files = Vec::new();
    // Each rung's track over the whole video, its segments in order.
    let mut video: Vec<Track> = Vec::new();
    for (i, tracks) in units.iter().enumerate() {
        for t in tracks {
            match video.iter_mut().find(|v| v.id == t.id) {
                Some(v) => v.segments.extend_from_slice(&t.segments),
                None if i == 0 => video.push(t.clone()),
                None => {
                    return Err(fail(MediaError::Transform(format!(
                        "unit {i} has a {} track the first unit has not",
                        t.id
                    ))));
                }
            }
        }
    }
    video.sort_by_key(|t| std::cmp::Reverse(t.id));
    let formats = &profile.streaming;
    if formats.contains(&crate::media::settings::StreamingFormat::Hls) {
        for t in video.iter().chain(audio) {
            files.push(stream::write_media_playlist(out_dir, t).map_err(fail)?);
        }
    }
    if profile.progressive {
        for t in &video {
            ctl.emit(Event::Stage(Stage::Transform));
            files.push(assemble(job, out_dir, t, audio, ctl).map_err(fail)?);
        }
    }
    if let Some(plan) = profile
        .storyboard
        .as_ref()
        .and_then(|s| storyboard::plan(s, probe))
    {
        match sprite(job, out_dir, &plan, ctl) {
            Ok(sprite) => files.extend(sprite),
            Err(e) => warnings.push(Warning {
                code: WarningCode::StoryboardFailed,
                message: e.to_string(),
            }),
        }
    }
    let poster_time = if profile.poster {
        let frames = poster::candidate_times(probe.duration, job.video.poster_candidates);
        let pieces = out_dir.join(PIECES);
        let chooser = poster::Chooser::new(job, &frames, &pieces);
        super::encode::poster(job, chooser, out_dir, ctl, &mut files, &mut warnings)
    } else {
        None
    };
    let seconds = profile.segment_secs;
    files.extend(stream::entry_points(out_dir, formats, &video, audio, seconds).map_err(fail)?);
    Ok(Stitched {
        files,
        tracks: video,
        warnings,
        poster_time,
    })
}

/// A rung's progressive MP4 from its segments and the audio's: the fragments concatenated as
/// they are (one init segment, the media segments in order: a fragmented MP4 of the whole
/// track) and remuxed, nothing encoded.
fn assemble(
    job: &MediaJob,
    out_dir: &Path,
    video: &Track,
    audio: Option<&Track>,
    ctl: &Control,
) -> Result<ProducedFile, MediaError> {
    let work = out_dir.join(WORK);
    let whole = |t: &Track| -> Result<std::path::PathBuf, MediaError> {
        let path = work.join(format!("{}.mp4", t.id));
        let mut f = std::fs::File::create(&path)?;
        let stream_dir = out_dir.join(names::STREAM_DIR);
        let pieces = std::iter::once(names::init_segment(t.id))
            .chain((0..t.segments.len() as u32).map(|n| names::segment(t.id, n)));
        for p in pieces {
            std::io::copy(&mut std::fs::File::open(stream_dir.join(p))?, &mut f)?;
        }
        Ok(path)
    };
    let v = whole(video)?;
    let a = audio.map(whole).transpose()?;
    let TrackId::Video(height) = video.id else {
        return Err(MediaError::Transform("an audio track is no rung".into()));
    };
    let name = names::rendition(height);
    let path = out_dir.join(&name);
    std::fs::create_dir_all(path.parent().expect("in a folder"))?;
    let mut cmd = std::process::Command::new(&job.video.ffmpeg);
    cmd.args([
        "-hide_banner",
        "-nostdin",
        "-v",
        "error",
        "-xerror",
        "-y",
        "-i",
    ])
    .arg(&v);
    if let Some(a) = &a {
        cmd.arg("-i").arg(a).args(["-map", "0:v", "-map", "1:a"]);
    }
    cmd.args(["-c", "copy", "-map_metadata", "-1", "-map_chapters", "-1"])
        .args([
            "-movflags",
            "+faststart",
            "-fflags",
            "+bitexact",
            "-f",
            "mp4",
        ])
        .arg(&path);
    let log = work.join("assemble.log");
    let limit = std::time::Duration::from_secs(job.video.timeout_base_secs);
    super::child::run(cmd, &log, limit, &ctl.cancel, &mut |_| {}).map_err(ffmpeg_error)?;
    let _ = std::fs::remove_file(&v);
    if let Some(a) = a {
        let _ = std::fs::remove_file(a);
    }
    let (width, height) = (video.width, video.height);
    Ok(ProducedFile {
        name,
        size_bytes: std::fs::metadata(&path)?.len(),
        path,
        role: crate::media::output::Role::Rendition,
        format: crate::media::output::FileFormat::Mp4,
        width,
        height,
        duration_ms: Some((video.seconds() * 1000.0).round() as u64),
        frames: None,
        crop: None,
        quality: None,
    })
}

/// The storyboard sprite laid out from the units' tiles, and its WebVTT.
fn sprite(
    job: &MediaJob,
    out_dir: &Path,
    plan: &storyboard::Plan,
    ctl: &Control,
) -> Result<Vec<ProducedFile>, MediaError> {
    let work = out_dir.join(WORK);
    let pieces = out_dir.join(PIECES);
    let missing: Vec<u32> = (0..plan.count)
        .filter(|k| !storyboard::tile_file(&pieces, format!("{k:05}")).exists())
        .collect();
    if !missing.is_empty() {
        return Err(MediaError::Transform(format!(
            "no frame for storyboard tiles {missing:?}"
        )));
    }
    let mut cmd = std::process::Command::new(&job.video.ffmpeg);
    cmd.args(["-hide_banner", "-nostdin", "-v", "error", "-y"])
        .args(plan.sprite_args(&pieces))
        .current_dir(out_dir);
    let log = work.join("sprite.log");
    let limit = std::time::Duration::from_secs(job.video.timeout_base_secs);
    super::child::run(cmd, &log, limit, &ctl.cancel, &mut |_| {}).map_err(ffmpeg_error)?;
    Ok(plan.files(out_dir)?)
}

/// The stitch's part (`Part::Stitch`), over the pieces in `out_dir`: every output of the video,
/// the segments included (they go to their keys from here).
pub fn stitch_part(
    job: &MediaJob,
    input: &StitchInput,
    out_dir: &Path,
    ctl: &mut Control,
) -> Result<MediaOutput, MediaFailure> {
    let probe = probe_of(&input.analysis);
    let work = out_dir.join(WORK);
    std::fs::create_dir_all(&work).map_err(|e| at(Stage::Transform)(e.into()))?;
    // Copying every segment twice over, as long as a run over the video may take.
    let limit = transcode::time_limit(&job.video, &probe, job.limits.max_video_seconds);
    ctl.emit(Event::TimeLimit(limit));
    ctl.emit(Event::Stage(Stage::Transform));
    let stitched = stitch(
        job,
        &probe,
        out_dir,
        &input.units,
        input.audio.as_ref(),
        ctl,
    );
    let _ = std::fs::remove_dir_all(&work);
    let stitched = stitched?;
    let mut files = segment_files(out_dir, &stitched.tracks, input.audio.as_ref())
        .map_err(|e| at(Stage::Transform)(e.into()))?;
    files.extend(stitched.files);
    let mut analysis = input.analysis.clone();
    analysis.poster_time_ms = stitched.poster_time.map(|t| t.as_millis() as u64);
    Ok(MediaOutput {
        media_type: crate::contract::MediaType::Video,
        files,
        analysis: Some(crate::contract::Analysis::Video(analysis)),
        warnings: stitched.warnings,
        tracks: stitched.tracks,
        plan: None,
        reads: Vec::new(),
        opening: None,
    })
}

/// Every init and media segment of `tracks` and `audio`, as files to upload.
fn segment_files(
    out_dir: &Path,
    tracks: &[Track],
    audio: Option<&Track>,
) -> std::io::Result<Vec<ProducedFile>> {
    let stream_dir = out_dir.join(names::STREAM_DIR);
    let mut files = Vec::new();
    for t in tracks.iter().chain(audio) {
        let pieces = std::iter::once((names::init_segment(t.id), None))
            .chain((0..t.segments.len() as u32).map(|n| (names::segment(t.id, n), Some(n))));
        for (name, n) in pieces {
            let path = stream_dir.join(&name);
            files.push(ProducedFile {
                name: names::in_stream(&name),
                size_bytes: std::fs::metadata(&path)?.len(),
                path,
                role: Role::Segment,
                format: FileFormat::Cmaf(t.id, n),
                width: t.width,
                height: t.height,
                duration_ms: None,
                frames: None,
                crop: None,
                quality: None,
            });
        }
    }
    Ok(files)
}

/// The facts of the source the stitch needs, from the plan's analysis (it has no source).
fn probe_of(a: &crate::contract::VideoAnalysis) -> VideoProbe {
    VideoProbe {
        duration: a.duration_ms.map(std::time::Duration::from_millis),
        width: a.width,
        height: a.height,
        rotation: a.rotation,
        fps: a.fps,
        video_codec: a.video_codec.clone(),
        pix_fmt: String::new(),
        audio_codec: a.audio_codec.clone(),
        bitrate: a.bitrate,
        hdr: a.hdr,
        frames: None,
        streams: 0,
        demuxer: "mov",
    }
}
