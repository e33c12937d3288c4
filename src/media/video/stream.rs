//! Adaptive streaming from the ladder's run. ffmpeg's HLS muxer cuts each rung's encoded
//! stream (the very stream its MP4 gets, see `transcode::args`) and the audio into CMAF pieces:
//! an init segment and media segments under `hls/<track>/`. This module reads what it wrote
//! into [`Track`]s (segment durations from its playlist, sizes from the files, codecs from the
//! init segment) and writes every playlist from them: each track's media playlist, the HLS
//! master playlist and the DASH MPD, both over the same segments. A rung an earlier attempt
//! uploaded comes back as its recorded `Track`, so the entry points list every rung.
//!
//! Bandwidths are measured, never estimated: `BANDWIDTH` and the MPD's `bandwidth` are the peak
//! segment bitrate (video plus the audio a variant plays with), `AVERAGE-BANDWIDTH` the mean.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use m3u8_rs::{
    AlternativeMedia, AlternativeMediaType, MasterPlaylist, MediaPlaylist, MediaPlaylistType,
    MediaSegment, Resolution, VariantStream,
};

use crate::media::error::MediaError;
use crate::media::output::{FileFormat, ProducedFile, Role, names};
use crate::media::settings::StreamingFormat;
use crate::media::track::{Segment, Track, TrackId};

/// AAC-LC, what ffmpeg's native `aac` encoder writes.
const AAC_LC: &str = "mp4a.40.2";
/// The MPD's time unit: milliseconds (segment boundaries are frame times, rounded once each so
/// the timeline never drifts).
const TIMESCALE: f64 = 1000.0;

/// The HLS muxer's options for one track (tee slave syntax), writing its playlist to
/// `hls/<track>/ffmpeg.m3u8` (read here, not uploaded) and its pieces beside it.
///
/// A video track's first frame is presented at 0 through negative composition offsets, without
/// an edit list (the mov muxer would write the B-frame delay as an empty edit, which players
/// honour or not); the audio keeps its edit list (the AAC encoder's priming). Without negative
/// offsets the video started 66 ms after the audio in Chromium.
pub fn muxer(track: TrackId, segment_secs: u32) -> String {
    let dir = Path::new(names::STREAM_DIR);
    let mov = match track {
        TrackId::Video(_) => "movflags=+negative_cts_offsets:use_editlist=0",
        TrackId::Audio => "movflags=+negative_cts_offsets",
    };
    format!(
        "f=hls:hls_time={segment_secs}:hls_segment_type=fmp4:hls_playlist_type=vod:\
         hls_flags=independent_segments:hls_fmp4_init_filename=init.mp4:\
         hls_segment_options=\\'{mov}\\':hls_segment_filename={}]{}",
        dir.join(names::segment_template(track, "%05d")).display(),
        ffmpeg_playlist(track).display()
    )
}

/// The HLS muxer as an output of its own run (a unit of a long video, or the audio of one),
/// with the same segments as [`muxer`]. A unit's segments are numbered from its first one and
/// keep the run's timestamps: `frag_discont` writes each fragment's decode time as it is (the
/// mov muxer would rebase the first one to 0) and no timestamp is shifted, so the segments of
/// consecutive units follow one another as those of one run do.
pub fn output_args(track: TrackId, segment_secs: u32, unit_first: Option<u32>) -> Vec<OsString> {
    let dir = Path::new(names::STREAM_DIR);
    let (discont, first) = match unit_first {
        Some(n) => ("+frag_discont", n),
        None => ("", 0),
    };
    let editlist = match track {
        TrackId::Video(_) => ":use_editlist=0",
        TrackId::Audio => "",
    };
    let segment = dir.join(names::segment_template(track, "%05d"));
    // A unit cuts at every keyframe (it has only those forced on its segments' first frames):
    // its segments' grid is the video's, not one from its own first frame, which at a
    // fractional rate (29.97 fps) puts the next boundary a frame less than a segment after it.
    let hls_time = match (unit_first, track) {
        (Some(_), TrackId::Video(_)) => "0.1".to_owned(),
        _ => segment_secs.to_string(),
    };
    let mut a: Vec<OsString> = vec!["-avoid_negative_ts".into(), "disabled".into()];
    for (k, v) in [
        ("-f", "hls".to_owned()),
        ("-hls_time", hls_time),
        ("-hls_segment_type", "fmp4".to_owned()),
        ("-hls_playlist_type", "vod".to_owned()),
        ("-hls_flags", "independent_segments".to_owned()),
        ("-hls_fmp4_init_filename", "init.mp4".to_owned()),
        ("-start_number", first.to_string()),
        (
            "-hls_segment_options",
            format!("movflags=+negative_cts_offsets{discont}{editlist}:avoid_negative_ts=disabled"),
        ),
        ("-hls_segment_filename", segment.display().to_string()),
    ] {
        a.push(k.into());
        a.push(v.into());
    }
    a.push(ffmpeg_playlist(track).into());
    a
}

/// Where the HLS muxer writes its playlist of `track`, relative to the output directory.
fn ffmpeg_playlist(track: TrackId) -> PathBuf {
    Path::new(names::STREAM_DIR).join(format!("{track}/ffmpeg.m3u8"))
}

/// A track the run wrote, read back: its facts and its files (init, segments and, for HLS, the
/// media playlist written here).
pub fn read_track(
    out_dir: &Path,
    id: TrackId,
    size: (u32, u32),
    frame_rate: Option<f64>,
    formats: &[StreamingFormat],
) -> Result<(Track, Vec<ProducedFile>), MediaError> {
    let (track, mut files) = read_pieces(out_dir, id, size, frame_rate, 0)?;
    if formats.contains(&StreamingFormat::Hls) {
        files.push(write_media_playlist(out_dir, &track)?);
    }
    Ok((track, files))
}

/// A track's media playlist, written under `out_dir`'s stream folder.
pub fn write_media_playlist(out_dir: &Path, track: &Track) -> Result<ProducedFile, MediaError> {
    let name = names::media_playlist(track.id);
    let path = out_dir.join(names::STREAM_DIR).join(&name);
    let bytes = media_playlist(track);
    std::fs::write(&path, &bytes)?;
    Ok(ProducedFile {
        name: names::in_stream(&name),
        size_bytes: bytes.len() as u64,
        path,
        role: Role::Segment,
        format: FileFormat::Hls(Some(track.id)),
        width: track.width,
        height: track.height,
        duration_ms: None,
        frames: None,
        crop: None,
        quality: None,
    })
}

/// The pieces ffmpeg's HLS muxer wrote for a track whose first segment is number `first` (a
/// unit of a long video starts past 0): the track (its segments from `first` on) and its
/// files, without a playlist of ours.
pub fn read_pieces(
    out_dir: &Path,
    id: TrackId,
    size: (u32, u32),
    frame_rate: Option<f64>,
    first: u32,
) -> Result<(Track, Vec<ProducedFile>), MediaError> {
    let stream_dir = out_dir.join(names::STREAM_DIR);
    let listed = std::fs::read(out_dir.join(ffmpeg_playlist(id)))?;
    let playlist = m3u8_rs::parse_media_playlist_res(&listed)
        .map_err(|e| MediaError::Transform(format!("ffmpeg's {id} playlist: {e}")))?;
    let piece = |name: String, format| -> Result<ProducedFile, MediaError> {
        let path = stream_dir.join(&name);
        Ok(ProducedFile {
            name: names::in_stream(&name),
            size_bytes: std::fs::metadata(&path)?.len(),
            path,
            role: Role::Segment,
            format,
            width: size.0,
            height: size.1,
            duration_ms: None,
            frames: None,
            crop: None,
            quality: None,
        })
    };
    let init = piece(names::init_segment(id), FileFormat::Cmaf(id, None))?;
    let codecs = match id {
        TrackId::Video(_) => avc_codecs(&std::fs::read(&init.path)?)
            .ok_or_else(|| MediaError::Transform(format!("no avcC in the {id} init segment")))?,
        TrackId::Audio => AAC_LC.to_owned(),
    };
    let mut files = vec![init];
    let mut segments = Vec::new();
    for (n, s) in playlist.segments.iter().enumerate() {
        let n = first + n as u32;
        let name = names::segment(id, n);
        // ffmpeg names them itself; its list must be the one we expect.
        if Path::new(&name).file_name() != Some(s.uri.as_ref()) {
            return Err(MediaError::Transform(format!(
                "ffmpeg's {id} playlist lists {} as segment {n}",
                s.uri
            )));
        }
        let f = piece(name, FileFormat::Cmaf(id, Some(n)))?;
        segments.push(Segment {
            seconds: s.duration as f64,
            bytes: f.size_bytes,
        });
        files.push(f);
    }
    if segments.is_empty() {
        return Err(MediaError::Transform(format!(
            "no {id} segment was written"
        )));
    }
    let track = Track {
        id,
        codecs,
        width: size.0,
        height: size.1,
        frame_rate,
        segments,
    };
    Ok((track, files))
}

/// `avc1.PPCCLL` from the `avcC` box of an init segment: profile, constraint flags, level.
fn avc_codecs(init: &[u8]) -> Option<String> {
    let at = init.windows(4).position(|w| w == b"avcC")? + 4;
    let b = init.get(at..at + 4)?;
    // b[0] is the configuration version (1).
    (b[0] == 1).then(|| format!("avc1.{:02x}{:02x}{:02x}", b[1], b[2], b[3]))
}

/// A track's media playlist (names relative to it, in its folder).
pub fn media_playlist(t: &Track) -> Vec<u8> {
    playlist(t, None)
}

/// A long video's growing playlist (`EXT-X-PLAYLIST-TYPE:EVENT`) over the segments that have
/// landed in order, its target duration fixed at `target` seconds from the first (RFC 8216
/// forbids it to change), played from its start; `done`: with its end (`EXT-X-ENDLIST`).
pub fn event_playlist(t: &Track, target: u64, done: bool) -> Vec<u8> {
    playlist(t, Some((target, done)))
}

/// VOD, or EVENT with its target duration and whether it has ended.
fn playlist(t: &Track, event: Option<(u64, bool)>) -> Vec<u8> {
    let file = |name: String| {
        Path::new(&name)
            .file_name()
            .expect("a file name")
            .to_string_lossy()
            .into_owned()
    };
    let segments = t
        .segments
        .iter()
        .enumerate()
        .map(|(n, s)| MediaSegment {
            uri: file(names::segment(t.id, n as u32)),
            duration: s.seconds as f32,
            map: (n == 0).then(|| m3u8_rs::Map {
                uri: file(names::init_segment(t.id)),
                ..Default::default()
            }),
            ..Default::default()
        })
        .collect();
    let target = t
        .segments
        .iter()
        .map(|s| s.seconds.round() as u64)
        .max()
        .unwrap_or(1)
        .max(1);
    let p = MediaPlaylist {
        // EXT-X-MAP with fragmented MP4 needs version 6; 7 as ffmpeg writes.
        version: Some(7),
        target_duration: event.map_or(target, |(t, _)| t.max(target)),
        segments,
        end_list: event.is_none_or(|(_, done)| done),
        playlist_type: Some(match event {
            None => MediaPlaylistType::Vod,
            Some(_) => MediaPlaylistType::Event,
        }),
        start: event.map(|_| m3u8_rs::Start::default()),
        independent_segments: true,
        ..Default::default()
    };
    let mut out = Vec::new();
    p.write_to(&mut out).expect("writes to memory");
    out
}

/// The HLS master playlist: one variant per rung (tallest first), each with the audio group
/// when there is audio.
pub fn master_playlist(video: &[Track], audio: Option<&Track>) -> Vec<u8> {
    const GROUP: &str = "audio";
    let alternatives = audio
        .map(|a| AlternativeMedia {
            media_type: AlternativeMediaType::Audio,
            uri: Some(names::media_playlist(a.id)),
            group_id: GROUP.to_owned(),
            name: "audio".to_owned(),
            default: true,
            autoselect: true,
            channels: Some("2".to_owned()),
            ..Default::default()
        })
        .into_iter()
        .collect();
    let variants = video
        .iter()
        .map(|v| {
            let (peak, average, codecs) = with_audio(v, audio);
            VariantStream {
                uri: names::media_playlist(v.id),
                bandwidth: peak,
                average_bandwidth: Some(average),
                codecs: Some(codecs),
                resolution: Some(Resolution {
                    width: v.width as u64,
                    height: v.height as u64,
                }),
                frame_rate: v.frame_rate,
                audio: audio.map(|_| GROUP.to_owned()),
                ..Default::default()
            }
        })
        .collect();
    let p = MasterPlaylist {
        version: Some(7),
        variants,
        independent_segments: true,
        alternatives,
        ..Default::default()
    };
    let mut out = Vec::new();
    p.write_to(&mut out).expect("writes to memory");
    out
}

/// A variant's peak and average bitrate and codecs: its video with the audio it plays with.
fn with_audio(v: &Track, audio: Option<&Track>) -> (u64, u64, String) {
    match audio {
        Some(a) => (
            v.peak_bps() + a.peak_bps(),
            v.average_bps() + a.average_bps(),
            format!("{},{}", v.codecs, a.codecs),
        ),
        None => (v.peak_bps(), v.average_bps(), v.codecs.clone()),
    }
}

/// The DASH MPD (static, live profile): a video adaptation set with one representation per
/// rung and an audio one, each addressed by a segment template with an exact timeline.
pub fn mpd(video: &[Track], audio: Option<&Track>, segment_secs: u32) -> String {
    let duration = video
        .iter()
        .chain(audio)
        .map(Track::seconds)
        .fold(0.0, f64::max);
    let mut x = String::new();
    let _ = writeln!(x, r#"<?xml version="1.0" encoding="UTF-8"?>"#);
    let _ = writeln!(
        x,
        r#"<MPD xmlns="urn:mpeg:dash:schema:mpd:2011" profiles="urn:mpeg:dash:profile:isoff-live:2011" type="static" mediaPresentationDuration="{}" minBufferTime="PT{segment_secs}S">"#,
        iso_duration(duration)
    );
    let _ = writeln!(x, r#"  <Period id="0" start="PT0S">"#);
    if !video.is_empty() {
        let _ = writeln!(
            x,
            r#"    <AdaptationSet id="0" contentType="video" mimeType="video/mp4" segmentAlignment="true" startWithSAP="1">"#
        );
        for v in video {
            let rate = v.frame_rate.map(frame_rate).unwrap_or_default();
            let _ = writeln!(
                x,
                r#"      <Representation id="{}" bandwidth="{}" codecs="{}" width="{}" height="{}" frameRate="{rate}" sar="1:1">"#,
                v.id,
                v.peak_bps(),
                v.codecs,
                v.width,
                v.height,
            );
            template(&mut x, v);
            let _ = writeln!(x, "      </Representation>");
        }
        let _ = writeln!(x, "    </AdaptationSet>");
    }
    if let Some(a) = audio {
        let _ = writeln!(
            x,
            r#"    <AdaptationSet id="1" contentType="audio" mimeType="audio/mp4" lang="und" segmentAlignment="true" startWithSAP="1">"#
        );
        let _ = writeln!(
            x,
            r#"      <Representation id="{}" bandwidth="{}" codecs="{}" audioSamplingRate="48000">"#,
            a.id,
            a.peak_bps(),
            a.codecs
        );
        let _ = writeln!(
            x,
            r#"        <AudioChannelConfiguration schemeIdUri="urn:mpeg:dash:23003:3:audio_channel_configuration:2011" value="2"/>"#
        );
        template(&mut x, a);
        let _ = writeln!(x, "      </Representation>");
        let _ = writeln!(x, "    </AdaptationSet>");
    }
    let _ = writeln!(x, "  </Period>");
    let _ = writeln!(x, "</MPD>");
    x
}

/// A representation's segment template and timeline: each boundary is the running sum of
/// durations rounded once, so rounding never accumulates.
fn template(x: &mut String, t: &Track) {
    let _ = writeln!(
        x,
        r#"        <SegmentTemplate timescale="{TIMESCALE}" initialization="{}" media="{}" startNumber="0">"#,
        names::init_segment(t.id),
        names::segment_template(t.id, "$Number%05d$")
    );
    let _ = writeln!(x, "          <SegmentTimeline>");
    let mut edges = vec![0u64];
    let mut sum = 0.0;
    for s in &t.segments {
        sum += s.seconds;
        edges.push((sum * TIMESCALE).round() as u64);
    }
    let durations: Vec<u64> = edges.windows(2).map(|w| w[1] - w[0]).collect();
    let mut i = 0;
    while i < durations.len() {
        let d = durations[i];
        let repeats = durations[i..].iter().take_while(|&&e| e == d).count();
        let t0 = if i == 0 { r#" t="0""# } else { "" };
        let r = if repeats > 1 {
            format!(r#" r="{}""#, repeats - 1)
        } else {
            String::new()
        };
        let _ = writeln!(x, r#"            <S{t0} d="{d}"{r}/>"#);
        i += repeats;
    }
    let _ = writeln!(x, "          </SegmentTimeline>");
    let _ = writeln!(x, "        </SegmentTemplate>");
}

/// `PT10.010S`
fn iso_duration(seconds: f64) -> String {
    format!("PT{seconds:.3}S")
}

/// A frame rate as DASH and ffmpeg read it (`30000/1001`, `25`): the NTSC rates exactly,
/// others to the millisecond.
pub fn frame_rate(fps: f64) -> String {
    match rational(fps) {
        (n, 1) => n.to_string(),
        (n, d) => format!("{n}/{d}"),
    }
}

/// The frame rate as ffmpeg's `fps` filter takes it (see [`frame_rate`]): numerator and
/// denominator, the constant-rate timeline's frame `n` being at `n · den / num` seconds.
pub fn rational(fps: f64) -> (u32, u32) {
    let ntsc = (fps * 1.001).round();
    if (fps - ntsc / 1.001).abs() < 1e-3 && (fps - fps.round()).abs() > 1e-3 {
        (ntsc as u32 * 1000, 1001)
    } else if (fps - fps.round()).abs() < 1e-3 {
        (fps.round() as u32, 1)
    } else {
        ((fps * 1000.0).round() as u32, 1000)
    }
}

/// The entry points over `video` (every rung, tallest first) and `audio`.
pub fn entry_points(
    out_dir: &Path,
    formats: &[StreamingFormat],
    video: &[Track],
    audio: Option<&Track>,
    segment_secs: u32,
) -> Result<Vec<ProducedFile>, MediaError> {
    let top = video.first();
    let seconds = video
        .iter()
        .chain(audio)
        .map(Track::seconds)
        .fold(0.0, f64::max);
    let mut files = Vec::new();
    for format in formats {
        let (name, bytes, file_format) = match format {
            StreamingFormat::Hls => (
                names::HLS_MASTER,
                master_playlist(video, audio),
                FileFormat::Hls(None),
            ),
            StreamingFormat::Dash => (
                names::DASH_MPD,
                mpd(video, audio, segment_secs).into_bytes(),
                FileFormat::Dash,
            ),
        };
        let path = out_dir.join(name);
        std::fs::write(&path, &bytes)?;
        files.push(ProducedFile {
            name: name.to_owned(),
            path,
            role: Role::Stream,
            format: file_format,
            width: top.map_or(0, |t| t.width),
            height: top.map_or(0, |t| t.height),
            size_bytes: bytes.len() as u64,
            duration_ms: Some((seconds * 1000.0).round() as u64),
            frames: None,
            crop: None,
            quality: None,
        });
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn track(id: TrackId, seconds: &[f64]) -> Track {
        let video = matches!(id, TrackId::Video(_));
        Track {
            id,
            codecs: if video { "avc1.64001f" } else { AAC_LC }.to_owned(),
            width: if video { 1280 } else { 0 },
            height: if video { 720 } else { 0 },
            frame_rate: video.then_some(30000.0 / 1001.0),
            segments: seconds
                .iter()
                .map(|&s| Segment {
                    seconds: s,
                    bytes: (s * 100_000.0) as u64,
                })
                .collect(),
        }
    }

    #[test]
    fn the_master_lists_measured_bandwidths_codecs_and_the_audio_group() {
        let v = track(TrackId::Video(720), &[4.004, 4.004, 2.002]);
        let a = track(TrackId::Audio, &[4.0, 4.0, 2.0]);
        let text = String::from_utf8(master_playlist(std::slice::from_ref(&v), Some(&a))).unwrap();
        let m = m3u8_rs::parse_master_playlist_res(text.as_bytes()).unwrap();
        let variant = &m.variants[0];
        assert_eq!(variant.uri, "720p/index.m3u8");
        assert_eq!(variant.bandwidth, v.peak_bps() + a.peak_bps(), "{text}");
        assert_eq!(
            variant.average_bandwidth,
            Some(v.average_bps() + a.average_bps())
        );
        assert_eq!(variant.codecs.as_deref(), Some("avc1.64001f,mp4a.40.2"));
        assert!(text.contains("#EXT-X-INDEPENDENT-SEGMENTS"), "{text}");
        assert!(text.contains("FRAME-RATE=29.97"), "{text}");
        assert_eq!(m.alternatives[0].uri.as_deref(), Some("audio/index.m3u8"));
    }

    #[test]
    fn a_media_playlist_maps_its_init_segment_and_rounds_its_target() {
        let v = track(TrackId::Video(480), &[4.004, 1.5]);
        let text = String::from_utf8(media_playlist(&v)).unwrap();
        assert!(text.contains("#EXT-X-MAP:URI=\"init.mp4\""), "{text}");
        assert!(text.contains("#EXT-X-TARGETDURATION:4"), "{text}");
        assert!(text.contains("#EXT-X-INDEPENDENT-SEGMENTS"), "{text}");
        assert!(text.contains("seg-00001.m4s") && text.contains("#EXT-X-ENDLIST"));
    }

    #[test]
    fn the_mpd_timeline_never_drifts() {
        let v = track(TrackId::Video(720), &[4.004; 100]);
        let x = mpd(std::slice::from_ref(&v), None, 4);
        // 100 x 4.004 s = 400.4 s exactly; each boundary rounded once: 4004 ms each.
        assert!(x.contains(r#"<S t="0" d="4004" r="99"/>"#), "{x}");
        assert!(x.contains(r#"mediaPresentationDuration="PT400.400S""#));
        assert!(x.contains(r#"frameRate="30000/1001""#));
        let odd = track(TrackId::Audio, &[4.0213, 4.0213, 4.0213]);
        let x = mpd(&[], Some(&odd), 4);
        // 4021.3, 8042.6, 12063.9 -> 4021, 8043, 12064: durations 4021, 4022, 4021.
        assert!(
            x.contains(r#"<S t="0" d="4021"/>"#) && x.contains(r#"<S d="4022"/>"#),
            "{x}"
        );
    }

    #[test]
    fn frame_rates_are_written_exactly() {
        assert_eq!(frame_rate(30000.0 / 1001.0), "30000/1001");
        assert_eq!(frame_rate(25.0), "25");
        assert_eq!(frame_rate(8.797), "8797/1000");
        assert_eq!(frame_rate(60000.0 / 1001.0), "60000/1001");
    }

    #[test]
    fn the_codecs_come_from_avcc() {
        let mut init = b"....avcC".to_vec();
        init.extend([1, 0x64, 0x00, 0x1f, 0xff]);
        assert_eq!(avc_codecs(&init).as_deref(), Some("avc1.64001f"));
        assert_eq!(avc_codecs(b"no box here"), None);
    }
}
