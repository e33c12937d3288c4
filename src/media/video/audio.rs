//! A long video's audio, apart from its units (see `units` and `crate::units`):
//!
//! - [`audio_part`] (`Part::Audio`): the whole program's, its loudness measured and normalised
//!   over the whole program, encoded once (no priming gap at a unit edge): what the stitch
//!   and the finished stream use.
//! - [`opening_part`] (`Part::Opening`): the first seconds ([`opening_secs`]), cut from the
//!   source without decoding, then measured, normalised and encoded on their own. The early
//!   stream's audio until the whole program's lands: a few seconds of work where the whole
//!   program's takes a minute or more for 20 minutes of AAC, so a long video plays once its
//!   first unit is done.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::child::{self, ChildError};
use super::encode::{Loudness, WORK, analysis, encode, loudness_of};
use super::ffprobe::{self, VideoProbe};
use super::{stream, transcode};
use crate::contract::{Stage, Warning};
use crate::media::control::{Control, Event};
use crate::media::error::{MediaError, MediaFailure, at};
use crate::media::output::{MediaOutput, ProducedFile, Track, TrackId, names};
use crate::media::settings::MediaJob;

/// The opening is a tenth of the program (the whole program's audio lands in less: measured
/// at 62 s for 20 minutes, the opening at 2 minutes), at least two segments and at most
/// [`MAX_OPENING_SECS`], in whole segments.
const OPENING_SHARE: f64 = 0.1;
/// Past this, the early stream waits for the whole program's audio (an hour's lands in about
/// four minutes); the opening's own work grows with it, and it runs before the whole
/// program's on the same member.
const MAX_OPENING_SECS: u32 = 120;

/// The opening's length for a program of `duration`, in seconds (whole segments of
/// `segment_secs`); none when it would be most of the program (the whole program's audio is
/// then as quick).
pub fn opening_secs(duration: Duration, segment_secs: u32) -> Option<u32> {
    let segment = segment_secs.max(1);
    let share = (duration.as_secs_f64() * OPENING_SHARE) as u32 / segment * segment;
    let secs = share.clamp(2 * segment, MAX_OPENING_SECS / segment * segment);
    (f64::from(secs) * 2.0 <= duration.as_secs_f64()).then_some(secs)
}

/// The audio over the whole video, its loudness measured and normalised first: its stream
/// track (segments from 0) and files. `None` without audio.
pub fn audio(
    job: &MediaJob,
    probe: &VideoProbe,
    input: &Path,
    out_dir: &Path,
    audio_filter: Option<&str>,
    ctl: &mut Control,
) -> Result<Option<(Track, Vec<ProducedFile>)>, MediaFailure> {
    if probe.audio_codec.is_none() {
        return Ok(None);
    }
    let rungs = [];
    let outputs = transcode::Outputs {
        rungs: &rungs,
        progressive: false,
        stream: Some(transcode::Streaming::new(job.profile.segment_secs, probe)),
        storyboard: None,
        audio_filter,
        frames: &[],
        frame_dir: Path::new(WORK),
        span: None,
        first_candidate: 0,
    };
    let limit = transcode::time_limit(&job.video, probe, job.limits.max_video_seconds);
    encode(job, probe, input, &outputs, limit, out_dir, ctl, &mut || {})?;
    let (track, files) = stream::read_pieces(out_dir, TrackId::Audio, (0, 0), None, 0)
        .map_err(at(Stage::Transform))?;
    Ok(Some((track, files)))
}

/// A planned video's audio (`Part::Audio`), once for the whole program: its loudness
/// measured, then the audio encoded and normalised. The output's `tracks` hold the audio's
/// track (none without audio) and its `analysis` the loudness.
pub fn audio_part(
    job: &MediaJob,
    probe: &VideoProbe,
    input: &Path,
    out_dir: &Path,
    ctl: &mut Control,
) -> Result<MediaOutput, MediaFailure> {
    // A measurement and an encode of the audio, each bounded as a one-run rung.
    let per_rung = transcode::time_limit(&job.video, probe, job.limits.max_video_seconds);
    ctl.emit(Event::TimeLimit(per_rung * 2));
    let encoded = measured_and_encoded(job, probe, input, out_dir, ctl)?;
    Ok(MediaOutput {
        analysis: Some(analysis(probe, None, encoded.loudness)),
        warnings: encoded.warnings,
        ..made(encoded.tracks, encoded.files)
    })
}

/// The opening of a planned video's audio (`Part::Opening`): its first `secs` copied out of
/// the source (no decode: the demuxer stops there, so only the opening's packets are read),
/// then measured and encoded as [`audio_part`] does the whole. The output's `tracks` hold its
/// track, cut to its whole segments (the encoder's last frame past `secs` would make a sliver
/// of a segment that the whole program's replaces with a full one).
pub fn opening_part(
    job: &MediaJob,
    probe: &VideoProbe,
    input: &Path,
    out_dir: &Path,
    secs: u32,
    ctl: &mut Control,
) -> Result<MediaOutput, MediaFailure> {
    let opening = VideoProbe {
        duration: Some(Duration::from_secs(secs.into())),
        demuxer: "mov",
        streams: 1,
        ..probe.clone()
    };
    let per_rung = transcode::time_limit(&job.video, &opening, job.limits.max_video_seconds);
    ctl.emit(Event::TimeLimit(per_rung * 3));
    if probe.audio_codec.is_none() {
        return Ok(made(Vec::new(), Vec::new()));
    }
    let work = out_dir.join(WORK);
    std::fs::create_dir_all(&work).map_err(|e| at(Stage::Transform)(e.into()))?;
    let cut = work.join("opening.mp4");
    let mut cmd = Command::new(&job.video.ffmpeg);
    cmd.args(["-hide_banner", "-nostdin", "-nostats", "-v", "error"])
        .args(["-t", &secs.to_string()])
        .args(ffprobe::input_args(probe.demuxer, input))
        .args(["-map", "0:a:0", "-c", "copy", "-f", "mp4"])
        .arg(&cut)
        .current_dir(&work);
    let log = work.join("opening.log");
    child::run(cmd, &log, per_rung, &ctl.cancel, &mut |_| {}).map_err(|e| {
        at(Stage::Transform)(match e {
            ChildError::TimedOut(d) => MediaError::Timeout(d),
            ChildError::Failed { stderr, .. } => {
                MediaError::Corrupt(format!("the audio's opening cannot be read: {stderr}"))
            }
            other => MediaError::Transform(other.to_string()),
        })
    })?;
    let encoded = measured_and_encoded(job, &opening, &cut, out_dir, ctl)?;
    let whole = (secs / job.profile.segment_secs.max(1)) as usize;
    let mut tracks = encoded.tracks;
    // The init and the segments the track keeps, named as the whole program's are.
    let mut kept = Vec::new();
    for t in &mut tracks {
        t.segments.truncate(whole);
        kept.push(names::in_stream(&names::init_segment(t.id)));
        kept.extend((0..whole as u32).map(|n| names::in_stream(&names::segment(t.id, n))));
    }
    let files = encoded
        .files
        .into_iter()
        .filter(|f| kept.contains(&f.name))
        .collect();
    Ok(MediaOutput {
        warnings: encoded.warnings,
        ..made(tracks, files)
    })
}

/// What [`measured_and_encoded`] made.
struct Encoded<'a> {
    tracks: Vec<Track>,
    files: Vec<ProducedFile>,
    loudness: Loudness<'a>,
    warnings: Vec<Warning>,
}

/// The audio's loudness measured, then the audio encoded and normalised.
fn measured_and_encoded<'a>(
    job: &'a MediaJob,
    probe: &VideoProbe,
    input: &Path,
    out_dir: &Path,
    ctl: &mut Control,
) -> Result<Encoded<'a>, MediaFailure> {
    let per_rung = transcode::time_limit(&job.video, probe, job.limits.max_video_seconds);
    let mut warnings = Vec::new();
    let work = out_dir.join(WORK);
    let loudness = loudness_of(job, probe, input, &work, per_rung, ctl, &mut warnings)?;
    let filter = loudness
        .as_ref()
        .and_then(|(m, spec)| super::loudness::normalise(m, spec));
    ctl.emit(Event::Stage(Stage::Transform));
    let (tracks, files) = match audio(job, probe, input, out_dir, filter.as_deref(), ctl)? {
        Some((track, files)) => (vec![track], files),
        None => (Vec::new(), Vec::new()),
    };
    Ok(Encoded {
        tracks,
        files,
        loudness,
        warnings,
    })
}

/// A part's output: its tracks and files, nothing else.
fn made(tracks: Vec<Track>, files: Vec<ProducedFile>) -> MediaOutput {
    MediaOutput {
        media_type: crate::contract::MediaType::Video,
        files,
        analysis: None,
        warnings: Vec::new(),
        tracks,
        plan: None,
        reads: Vec::new(),
        opening: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_opening_is_a_tenth_of_the_program_in_whole_segments_within_its_bounds() {
        let of = |secs: u64| opening_secs(Duration::from_secs(secs), 4);
        assert_eq!(of(40), Some(8), "two segments at least");
        assert_eq!(of(15), None, "most of the program: the whole is as quick");
        assert_eq!(of(240), Some(24));
        assert_eq!(of(1200), Some(120));
        assert_eq!(of(3 * 3600), Some(120));
        assert_eq!(opening_secs(Duration::from_secs(600), 6), Some(60));
    }
}
