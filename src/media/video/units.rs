//! A long video as units: the same outputs as one run of the ladder, made in parts that can be
//! encoded apart (on one worker one after another, or across the fleet: see `crate::units`).
//!
//! - [`plan`]: past the profile's `units_after_secs`, a streaming profile's video is cut into
//!   units of `unit_segments` whole segments on the constant-rate timeline the rungs are
//!   encoded at (the frame in slot `n` shown at `n / rate`), with [`super::plan`]: consecutive
//!   units tile the frames exactly, and unit `i`'s segments keep the numbers a one-run encode
//!   gives them.
//! - [`encode`]: a unit decodes its range only (in an MP4 with one index, from the keyframe at
//!   or before its first frame, checked; otherwise from a second before: see `exact_seek`)
//!   and encodes every rung with a keyframe and a closed GOP on its first frame and on each
//!   of its segments' first frames, exactly its frames, cut into CMAF segments whose
//!   timestamps are the video's own; it also writes its storyboard tiles and the poster
//!   candidates in its range. A rung's init segment is the same from every unit (the same
//!   encoder settings).
//! - the audio (`super::audio`): loudness measured and normalised over the whole program,
//!   encoded once (no priming gap at a unit edge); its opening apart, for the early stream.
//! - the stitch (`super::stitch`): every output made of the units once they have all landed
//!   (playlists, MPD, progressive MP4s, storyboard, poster), nothing encoded again.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::encode::{WORK, analysis, encode};
use super::ffprobe::VideoProbe;
use super::plan::{self, TimeBase};
use super::transcode::{self, Span, Streaming};
use super::{poster, reads, storyboard, stream};
use crate::contract::Failure;
use crate::contract::Stage;
use crate::media::control::{Control, Event};
use crate::media::error::{MediaError, MediaFailure, at};
use crate::media::output::{
    FileFormat, MediaOutput, Piece, ProducedFile, Role, Track, TrackId, names,
};
use crate::media::part::{Opening, StitchInput, Unit};
use crate::media::settings::MediaJob;

/// The units of this video, or `None` when it is encoded in one run: a profile without
/// streaming (segments are what units are made of), a video not longer than
/// `units_after_secs`, or one whose duration is unknown.
pub fn plan(job: &MediaJob, probe: &VideoProbe) -> Option<Vec<Unit>> {
    let p = &job.profile;
    if p.streaming.is_empty() || p.unit_segments == 0 {
        return None;
    }
    let seconds = probe.duration?.as_secs_f64();
    if seconds <= p.units_after_secs as f64 {
        return None;
    }
    let (num, den) = rate(job, probe);
    // The slots the video fills, short by a frame so that no unit starts past the end (the
    // last unit takes whatever remains).
    let slots = ((seconds * num as f64 / den as f64).floor() as i64 - 1).max(1);
    let slots: Vec<i64> = (0..slots).collect();
    let tb = TimeBase { num: den, den: num };
    let units = plan::plan(&slots, tb, p.segment_secs, p.unit_segments).ok()?;
    let count = units.len();
    Some(
        units
            .into_iter()
            .enumerate()
            .map(|(i, u)| Unit {
                index: u.index,
                first_slot: u.first_pts,
                end_slot: (i + 1 < count).then(|| u.first_pts + u.frames as i64),
                first_segment: u.first_segment,
                segments: u.segments,
                reads: Vec::new(),
            })
            .collect(),
    )
}

/// The stream's frame rate as a fraction (see `stream::rational`).
fn rate(job: &MediaJob, probe: &VideoProbe) -> (u32, u32) {
    stream::rational(Streaming::new(job.profile.segment_secs, probe).frame_rate)
}

/// Seconds before a unit's span that its run seeks to when its container's seek is not the
/// one [`exact_seek`] relies on (Matroska, MPEG-TS, a fragmented MP4, whose seek lands by
/// decode time: a keyframe's reordering late), or did not hold: a margin for a seek that lands
/// late.
const PREROLL_SECS: f64 = 1.0;

impl Unit {
    /// Its span, its run seeking [`PREROLL_SECS`] before it (see [`exact_seek`]).
    fn span(&self, rate: (u32, u32)) -> Span {
        let secs = |slot: i64| (slot as f64 - 0.5) * rate.1 as f64 / rate.0 as f64;
        let start_secs = secs(self.first_slot).max(0.0);
        Span {
            first_slot: self.first_slot,
            end_slot: self.end_slot,
            start_secs,
            end_secs: self.end_slot.map(secs),
            first_segment: self.first_segment,
            // The last unit may hold a frame past the planned end: one more segment start.
            segments: self.segments + self.end_slot.is_none() as u32,
            seek_secs: (start_secs - PREROLL_SECS).max(0.0),
        }
    }

    /// Its time on the video's timeline, in seconds.
    pub fn start_secs(&self, rate: (u32, u32)) -> f64 {
        self.first_slot as f64 * rate.1 as f64 / rate.0 as f64
    }
}

/// Where a unit writes its storyboard tiles and poster candidates (relative to the output
/// directory): pieces kept for the stitch, not outputs.
const PIECES: &str = names::PIECES;

/// What a unit made: each rung's segments (numbered from the unit's first) and the files.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UnitOutput {
    pub tracks: Vec<Track>,
    pub files: Vec<ProducedFile>,
}

/// Encodes one unit into `out_dir` (segments under `hls/`, tiles and poster candidates under
/// the work folder).
pub fn encode_unit(
    job: &MediaJob,
    probe: &VideoProbe,
    input: &Path,
    out_dir: &Path,
    unit: &Unit,
    ctl: &mut Control,
) -> Result<UnitOutput, MediaFailure> {
    encode_range(job, probe, input, out_dir, unit, ctl).map_err(|f| Failure {
        stage: f.stage,
        error: where_in_video(f.error, unit, rate(job, probe)),
    })
}

/// An input's failure in a unit, saying where in the video it is.
fn where_in_video(e: MediaError, unit: &Unit, rate: (u32, u32)) -> MediaError {
    let at = |m: String| {
        format!(
            "unit {} (from {:.1} s): {m}",
            unit.index,
            unit.start_secs(rate)
        )
    };
    match e {
        MediaError::Corrupt(m) => MediaError::Corrupt(at(m)),
        MediaError::Unsupported(m) => MediaError::Unsupported(at(m)),
        MediaError::LimitsExceeded(m) => MediaError::LimitsExceeded(at(m)),
        MediaError::Transform(m) => MediaError::Transform(at(m)),
        MediaError::Crashed(m) => MediaError::Crashed(at(m)),
        e => e,
    }
}

fn encode_range(
    job: &MediaJob,
    probe: &VideoProbe,
    input: &Path,
    out_dir: &Path,
    unit: &Unit,
    ctl: &mut Control,
) -> Result<UnitOutput, MediaFailure> {
    let profile = &job.profile;
    let rate = rate(job, probe);
    let span = unit.span(rate);
    let rungs = transcode::plan(&profile.renditions, probe);
    let board = profile
        .storyboard
        .as_ref()
        .and_then(|s| storyboard::plan(s, probe));
    let (frames, first_candidate) = candidates(job, probe, &span);
    let mut outputs = transcode::Outputs {
        rungs: &rungs,
        progressive: false,
        stream: Some(Streaming::new(profile.segment_secs, probe)),
        storyboard: board.as_ref(),
        audio_filter: None,
        frames: &frames,
        frame_dir: Path::new(PIECES),
        span: Some(span),
        first_candidate,
    };
    if let Some(seek_secs) = exact_seek(unit, rate, &outputs, probe, input) {
        outputs.span = Some(Span { seek_secs, ..span });
        let why = match encode_span(job, probe, input, out_dir, unit, &outputs, ctl) {
            Ok(out) => match landed_late(out_dir, seek_secs) {
                None if has_its_frames(&out, unit, rate) => return Ok(out),
                None => "its frames short".to_owned(),
                Some(why) => why,
            },
            // Decoding from that keyframe may fail where from an earlier one it would not
            // (a sync sample that is not one).
            Err(f) if is_input(&f.error) && !ctl.cancel.is_cancelled() => f.error.to_string(),
            Err(f) => return Err(f),
        };
        tracing::warn!(
            unit = unit.index,
            seek_secs,
            why,
            "the unit's exact seek did not hold: made again from its pre-roll"
        );
        // The second run writes every file the first did (no more segments, and frames
        // from earlier), under the same names; the folder may hold other units' files.
        outputs.span = Some(span);
    }
    encode_span(job, probe, input, out_dir, unit, &outputs, ctl)
}

/// Why a unit's run landed past the time it sought (see [`exact_seek`]), or `None`.
fn landed_late(out_dir: &Path, seek_secs: f64) -> Option<String> {
    let printed = std::fs::read_to_string(out_dir.join(transcode::landed_file(Path::new(PIECES))));
    let Some(landed) = printed.ok().as_deref().and_then(transcode::landed_micros) else {
        return Some("where its seek landed is unknown".to_owned());
    };
    // As ffmpeg reads `-ss`: whole microseconds.
    let sought = (seek_secs * 1e6).round() as i64;
    (landed > sought).then(|| format!("landed at {landed} µs, after {sought} µs"))
}

/// A failure of the source's bytes, which an earlier start may avoid.
fn is_input(e: &MediaError) -> bool {
    matches!(e, MediaError::Corrupt(_) | MediaError::Transform(_))
}

/// Where a unit's run seeks in an MP4 with one index (`reads::ranged`), or `None` (from
/// [`PREROLL_SECS`] before it). ffmpeg decodes from the keyframe its seek lands on and gives
/// the filters every frame from there (`-noaccurate_seek`), so a unit needs that keyframe to be
/// at or before:
/// - the frame its first slot shows: the `fps` filter shows there the last frame before the
///   slot's window ends (half a frame after the slot's time); the seek asks for a quarter frame
///   after it, so that a keyframe on the slot (a camera's every second, a one-run encode's
///   segment) is the one;
/// - a storyboard tile's or poster candidate's time in the first slot's window: a tile takes
///   the last frame at or before its time, a candidate the first at or after.
///
/// The mov demuxer seeks in its decode-time index shifted by the first frame's offset, so it
/// lands on the keyframe at or before the time asked when every keyframe's offset is the first
/// frame's (as encoders write them), and may land later otherwise. The run writes where it
/// landed (`transcode::landed_file`), checked against the time asked, and a unit before the last
/// is checked to have its frames ([`has_its_frames`]): a seek that lands late costs a second
/// run from the pre-roll, never a wrong answer.
fn exact_seek(
    unit: &Unit,
    rate: (u32, u32),
    outputs: &transcode::Outputs,
    probe: &VideoProbe,
    input: &Path,
) -> Option<f64> {
    let span = outputs.span?;
    if !reads::ranged(probe.demuxer, input) {
        return None;
    }
    let on_slot = (unit.first_slot as f64 + 0.25) * rate.1 as f64 / rate.0 as f64;
    let tiles = outputs.storyboard.into_iter().flat_map(|b| {
        b.tiles_in(span.start_secs, Some(on_slot))
            .map(|k| (b.interval * k).as_secs_f64())
    });
    let candidates = outputs.frames.iter().map(|t| t.as_secs_f64());
    Some(tiles.chain(candidates).fold(on_slot, f64::min))
}

/// Whether a unit before the last came out with its planned frames: each rung's segments last
/// its slots, to half a frame.
fn has_its_frames(out: &UnitOutput, unit: &Unit, rate: (u32, u32)) -> bool {
    let Some(end) = unit.end_slot else {
        return true;
    };
    let frame = rate.1 as f64 / rate.0 as f64;
    let planned = (end - unit.first_slot) as f64 * frame;
    out.tracks
        .iter()
        .all(|t| (t.seconds() - planned).abs() < frame / 2.0)
}

/// Encodes a unit's `outputs` (its span) and reads back what it made.
fn encode_span(
    job: &MediaJob,
    probe: &VideoProbe,
    input: &Path,
    out_dir: &Path,
    unit: &Unit,
    outputs: &transcode::Outputs,
    ctl: &mut Control,
) -> Result<UnitOutput, MediaFailure> {
    let (rungs, stream) = (outputs.rungs, outputs.stream.expect("a unit streams"));
    std::fs::create_dir_all(out_dir.join(PIECES)).map_err(|e| at(Stage::Transform)(e.into()))?;
    let seconds = unit.segments as f64 * job.profile.segment_secs as f64;
    let limit = unit_time_limit(job, seconds, rungs.len());
    // ffmpeg's progress times are not the unit's with `-copyts` (they count from the first
    // timestamp of any output): the media time encoded is told once the unit is done.
    let reported = encode(job, probe, input, outputs, limit, out_dir, ctl, &mut || {})?;
    let mut out = UnitOutput {
        tracks: Vec::new(),
        files: Vec::new(),
    };
    for r in rungs {
        let size = transcode::output_size(probe, r.height);
        let id = TrackId::Video(r.height);
        let first = unit.first_segment;
        let fps = Some(stream.frame_rate);
        let (track, files) = stream::read_pieces(out_dir, id, size, fps, first)
            .map_err(|e| nothing_from(e, out_dir, id, unit))
            .map_err(at(Stage::Transform))?;
        // A unit before the last has all its segments, or its source stopped short (a
        // truncated file, or bytes a ranged read missed: see `reads`).
        if unit.end_slot.is_some() && track.segments.len() < unit.segments as usize {
            return Err(at(Stage::Transform)(MediaError::Corrupt(format!(
                "{id}: {} of its {} segments: the video ends before its header says",
                track.segments.len(),
                unit.segments
            ))));
        }
        out.tracks.push(track);
        out.files.extend(files);
    }
    out.files
        .extend(pieces(out_dir).map_err(|e| at(Stage::Transform)(e.into()))?);
    let rungs = rungs.len() as u32;
    let encoded = out.tracks.first().map_or(0.0, Track::seconds) * rungs as f64;
    let encoded = std::time::Duration::from_secs_f64(encoded);
    ctl.emit(Event::Encoded(encoded.saturating_sub(reported * rungs)));
    Ok(out)
}

/// A unit that wrote no segment where frames were planned: the source ends before its header
/// says.
fn nothing_from(e: MediaError, out_dir: &Path, id: TrackId, unit: &Unit) -> MediaError {
    let first = names::segment(id, unit.first_segment);
    match e {
        MediaError::Transform(_) if !out_dir.join(names::STREAM_DIR).join(first).exists() => {
            MediaError::Corrupt("no frame here: the video ends before its header says".into())
        }
        e => e,
    }
}

/// The pictures a unit wrote for the stitch: tiles and candidates, by their numbers.
fn pieces(out_dir: &Path) -> std::io::Result<Vec<ProducedFile>> {
    let dir = out_dir.join(PIECES);
    let mut files = Vec::new();
    for e in std::fs::read_dir(&dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        let number = |prefix: &str| {
            name.strip_prefix(prefix)?
                .strip_suffix(".png")?
                .parse::<u32>()
                .ok()
        };
        let piece = match (number("tile-"), number("frame-")) {
            (Some(k), _) => Piece::Tile(k),
            (_, Some(i)) => Piece::Candidate(i),
            _ => continue,
        };
        files.push(ProducedFile {
            name: names::piece(piece),
            path: e.path(),
            role: Role::Segment,
            format: FileFormat::Piece(piece),
            width: 0,
            height: 0,
            size_bytes: e.metadata()?.len(),
            duration_ms: None,
            frames: None,
            crop: None,
            quality: None,
        });
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(files)
}

/// How long a unit's run may take: as one run per rung over its seconds would.
fn unit_time_limit(job: &MediaJob, seconds: f64, rungs: usize) -> std::time::Duration {
    let per_rung = std::time::Duration::from_secs(job.video.timeout_base_secs)
        + std::time::Duration::from_secs_f64(seconds * job.video.timeout_per_second.max(0.0));
    per_rung * (rungs as u32).max(1)
}

/// The poster candidates in a unit's span and the number of its first.
fn candidates(
    job: &MediaJob,
    probe: &VideoProbe,
    span: &Span,
) -> (Vec<std::time::Duration>, usize) {
    if !job.profile.poster {
        return (Vec::new(), 0);
    }
    let all = poster::candidate_times(probe.duration, job.video.poster_candidates);
    let inside = |t: &std::time::Duration| {
        let t = t.as_secs_f64();
        t >= span.start_secs && span.end_secs.is_none_or(|e| t < e)
    };
    let first = all.iter().position(inside).unwrap_or(all.len());
    let frames: Vec<_> = all.iter().copied().filter(inside).collect();
    (frames, first)
}

/// A planned video on this worker: the plan, the audio, each unit in turn, then the stitch.
pub fn run(
    job: &MediaJob,
    probe: &VideoProbe,
    input: &Path,
    out_dir: &Path,
    units: &[Unit],
    ctl: &mut Control,
) -> Result<MediaOutput, MediaFailure> {
    let planned = plan_part(job, probe, input, out_dir, units.to_vec(), ctl)?;
    let audio = super::audio::audio_part(job, probe, input, out_dir, ctl)?;
    // The parts announced their own limits: the whole run's is a one-run encode's, and a
    // unit's base time each.
    let rungs = transcode::plan(&job.profile.renditions, probe).len() as u32;
    let per_rung = transcode::time_limit(&job.video, probe, job.limits.max_video_seconds);
    let base = std::time::Duration::from_secs(job.video.timeout_base_secs);
    ctl.emit(Event::TimeLimit(
        per_rung * (rungs + 2) + base * (units.len() as u32 + 2),
    ));
    let mut tracks = Vec::new();
    for unit in units {
        tracks.push(encode_unit(job, probe, input, out_dir, unit, ctl)?.tracks);
    }
    let Some(crate::contract::Analysis::Video(analysis)) = audio.analysis else {
        unreachable!("the audio's part analyses its video");
    };
    let input = StitchInput {
        analysis,
        units: tracks,
        audio: audio.tracks.into_iter().next(),
    };
    let mut out = super::stitch::stitch_part(job, &input, out_dir, ctl);
    // The pieces were the stitch's: not outputs.
    let _ = std::fs::remove_dir_all(out_dir.join(PIECES));
    if let Ok(out) = &mut out {
        out.warnings.splice(0..0, planned.warnings);
        out.warnings.splice(0..0, audio.warnings);
    }
    out
}

/// The plan's part (`Part::Plan`): the units to encode (the output's `plan`), each with the
/// bytes of the source it reads, and the bytes the audio reads (the output's `reads`; empty:
/// the whole file). Quick (an index read): the units go to the fleet at once, and the audio
/// (`Part::Audio`) is made while they are encoded.
pub fn plan_part(
    job: &MediaJob,
    probe: &VideoProbe,
    input: &Path,
    out_dir: &Path,
    units: Vec<Unit>,
    ctl: &mut Control,
) -> Result<MediaOutput, MediaFailure> {
    let limit = transcode::time_limit(&job.video, probe, job.limits.max_video_seconds);
    ctl.emit(Event::TimeLimit(limit));
    let work = out_dir.join(WORK);
    let opening = probe
        .duration
        .filter(|_| probe.audio_codec.is_some())
        .and_then(|d| super::audio::opening_secs(d, job.profile.segment_secs));
    let (units, reads, opening) = with_reads(job, probe, input, &work, limit, units, opening, ctl);
    Ok(MediaOutput {
        media_type: crate::contract::MediaType::Video,
        files: Vec::new(),
        analysis: Some(analysis(probe, None, None)),
        warnings: Vec::new(),
        tracks: Vec::new(),
        plan: Some(units),
        reads,
        opening,
    })
}

/// The units with the bytes each reads (see [`reads`]), the bytes the audio reads and the
/// audio's opening (of `opening` seconds) with the bytes it reads: left empty (the whole file)
/// for a container not read in ranges or when the packets cannot be listed.
#[allow(clippy::too_many_arguments)]
fn with_reads(
    job: &MediaJob,
    probe: &VideoProbe,
    input: &Path,
    work: &Path,
    limit: std::time::Duration,
    mut units: Vec<Unit>,
    opening: Option<u32>,
    ctl: &Control,
) -> (Vec<Unit>, Vec<[u64; 2]>, Option<Opening>) {
    let whole = |secs| Opening {
        secs,
        reads: Vec::new(),
    };
    if !reads::ranged(probe.demuxer, input) || std::fs::create_dir_all(work).is_err() {
        return (units, Vec::new(), opening.map(whole));
    }
    let (Ok(size), Some(packets)) = (
        std::fs::metadata(input).map(|m| m.len()),
        reads::packets(
            &job.video,
            probe,
            input,
            &work.join("packets.log"),
            limit,
            &ctl.cancel,
        ),
    ) else {
        return (units, Vec::new(), opening.map(whole));
    };
    let rate = rate(job, probe);
    let windows: Vec<reads::Window> = units
        .iter()
        .map(|u| {
            let span = u.span(rate);
            reads::Window {
                seek_secs: span.seek_secs,
                end_secs: span.end_secs,
            }
        })
        .collect();
    for (u, r) in units
        .iter_mut()
        .zip(reads::ranges(&packets, size, &windows))
    {
        u.reads = r;
    }
    let opening = opening.map(|secs| Opening {
        secs,
        reads: reads::for_opening(&packets, size, secs),
    });
    (units, reads::for_audio(&packets, size), opening)
}

/// The early stream's audio this time (see [`early_stream`]): the whole program's, or its
/// opening's until that lands.
pub struct EarlyAudio<'a> {
    pub track: &'a Track,
    pub whole: bool,
}

/// What a long video publishes before it is done (`job::early`), written under `dir`: the
/// growing playlist of its lowest rung over `lowest` (the rung's segments landed in order);
/// with `audio`, the audio's playlist (EVENT: the opening's open, the whole program's ended);
/// with `master` (once the first unit and the audio have landed) the master over that rung and
/// the audio; `done`: the rung's playlist over every unit, with its end. Named as the finished
/// video's files, the master last.
pub fn early_stream(
    job: &MediaJob,
    lowest: &Track,
    audio: Option<EarlyAudio>,
    master: bool,
    done: bool,
    dir: &Path,
) -> Result<Vec<ProducedFile>, MediaError> {
    // Fixed from the first playlist on: one second over the segments' target.
    let target = u64::from(job.profile.segment_secs) + 1;
    fn playlist(t: &Track, bytes: Vec<u8>) -> (String, Vec<u8>, Option<&Track>) {
        (
            names::in_stream(&names::media_playlist(t.id)),
            bytes,
            Some(t),
        )
    }
    let mut out = vec![playlist(
        lowest,
        stream::event_playlist(lowest, target, done),
    )];
    if let Some(a) = &audio {
        let bytes = stream::event_playlist(a.track, target, a.whole);
        out.push(playlist(a.track, bytes));
    }
    if master {
        let master = stream::master_playlist(std::slice::from_ref(lowest), audio.map(|a| a.track));
        out.push((names::HLS_MASTER.to_owned(), master, None));
    }
    out.into_iter()
        .map(|(name, bytes, track)| {
            let path = dir.join(&name);
            std::fs::create_dir_all(path.parent().expect("in a folder"))?;
            std::fs::write(&path, &bytes)?;
            Ok(ProducedFile {
                name,
                size_bytes: bytes.len() as u64,
                path,
                role: Role::Segment,
                format: FileFormat::Hls(track.map(|t| t.id)),
                width: track.map_or(0, |t| t.width),
                height: track.map_or(0, |t| t.height),
                duration_ms: None,
                frames: None,
                crop: None,
                quality: None,
            })
        })
        .collect()
}

/// A unit's part (`Part::Unit`): its segments, tiles and poster candidates.
pub fn unit_part(
    job: &MediaJob,
    probe: &VideoProbe,
    input: &Path,
    out_dir: &Path,
    unit: &Unit,
    ctl: &mut Control,
) -> Result<MediaOutput, MediaFailure> {
    let rungs = transcode::plan(&job.profile.renditions, probe).len() as u32;
    let seconds = unit.segments as f64 * job.profile.segment_secs as f64;
    ctl.emit(Event::TimeLimit(
        unit_time_limit(job, seconds, rungs as usize) * 2,
    ));
    ctl.emit(Event::Stage(Stage::Transform));
    let out = encode_unit(job, probe, input, out_dir, unit, ctl)?;
    Ok(MediaOutput {
        media_type: crate::contract::MediaType::Video,
        files: out.files,
        analysis: None,
        warnings: Vec::new(),
        tracks: out.tracks,
        plan: None,
        reads: Vec::new(),
        opening: None,
    })
}
