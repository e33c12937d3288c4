//! What of the source a long video's parts read: byte ranges, so that the fleet's bytes for
//! one video stay under twice the source's size, not units × size.
//!
//! - **The plan** (the request's worker) reads the container and the first packets
//!   ([`for_plan`]): it lists the packets from the index. Before that, the header, the index
//!   and the first bytes of the media data alone say whether the video is long and which bytes
//!   those are (`Part::Index`, see `stages::download::index`).
//! - **The audio** (a task of its own, on any worker) reads every audio packet too
//!   ([`for_audio`], named by the plan; the whole file past [`MAX_AUDIO_RANGES`]): it measures
//!   the loudness and encodes the audio over the whole program. Its opening (the early
//!   stream's audio until then) reads the audio packets of its first seconds ([`for_opening`]).
//! - **A unit** ([`ranges`]): its ffmpeg opens the container (its header and index), seeks to
//!   the keyframe before its range (`-ss`) and reads the video packets from there to its end
//!   (the ranges start from the keyframe a second before its first frame: the farthest back a
//!   unit seeks, see `units::exact_seek`); the probes read the header and the first packets.
//!
//! Those bytes are found from the packets themselves (one ffprobe pass over the index, nothing
//! decoded): the container's own bytes are what lies outside every packet, a part's are the
//! packets of the streams it decodes. A unit's window has a margin (half a second after its
//! end, 8 KiB around each range), and a part falls back to the whole file if its run fails on
//! the ranged one, or a unit comes out short (`job::runner`): a read too short can cost a
//! download, never a wrong answer.
//!
//! Only MP4/MOV files with one index (`moov`, at the start or the end) and no fragments are
//! read in ranges: their demuxer seeks by that index alone. A fragmented MP4 (indexes spread
//! through the file) and Matroska/WebM (whose seek lands on a cluster that may begin before
//! the keyframe, and which resyncs silently over bytes it cannot read) are read whole, as is
//! any other container, and a unit whose ranges would be most of the file.

use std::path::Path;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::child;
use super::ffprobe::{VideoProbe, input_args};
use crate::media::settings::VideoSettings;

/// The most ranged reads the audio makes: a file muxed by ffmpeg interleaves its audio in runs
/// of a packet or two (29 a second here), each a GET; past this (11 minutes of such a file,
/// hours of one whose runs are a second long) the whole file is one read, and quicker.
pub const MAX_AUDIO_RANGES: usize = 20_000;
/// Bytes between packets at least this long are the container's (a header, an index, cues);
/// shorter ones are per-packet framing, read with the packets around them.
const CONTAINER_GAP: u64 = 4096;
/// Bytes added around each range, and the distance under which two ranges become one.
/// The packets' places are the index's own, so this is insurance, not a need: at 64 KiB it
/// was a tenth of what the fleet read of a 2 Mbit/s source in 8 s units.
const MARGIN: u64 = 8 * 1024;
/// Seconds of packets the probes read from the start (ffprobe and ffmpeg read the first
/// packets of each stream for their parameters). Half a second gave the same probe, and the
/// same unit bit for bit, as the whole file (a 10-minute 1080p clip, B-frames, AAC).
const PROBE_SECS: f64 = 0.5;
/// Seconds of video packets read after the unit's end (B-frames decode with the frames after
/// them).
const AFTER_SECS: f64 = 0.5;
/// Ranges summing to more than this share of the file: the file whole.
const WORTH_IT: f64 = 0.8;

/// One packet as ffprobe lists it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Packet {
    pub stream: u32,
    pub video: bool,
    pub key: bool,
    /// Presentation and decode times, in seconds.
    pub pts: f64,
    pub dts: f64,
    pub pos: u64,
    pub size: u64,
}

/// A unit's window on the video's timeline: from where its ffmpeg seeks (`-ss`), to its end
/// (none for the last unit).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    pub seek_secs: f64,
    pub end_secs: Option<f64>,
}

/// Whether `input` (opened with `demuxer`) is read in ranges: an MP4/MOV whose top-level boxes
/// hold no fragment (`moof`).
pub fn ranged(demuxer: &str, input: &Path) -> bool {
    demuxer == "mov" && matches!(top_level_boxes(input), Ok(boxes) if !boxes.contains(b"moof"))
}

/// The types of an ISO BMFF file's top-level boxes (at most 100 000 of them).
fn top_level_boxes(input: &Path) -> std::io::Result<Vec<[u8; 4]>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(input)?;
    let size = f.metadata()?.len();
    let (mut at, mut types) = (0u64, Vec::new());
    while size.saturating_sub(at) >= 8 && types.len() < 100_000 {
        let mut head = [0u8; 16];
        f.seek(SeekFrom::Start(at))?;
        f.read_exact(&mut head[..8])?;
        let kind: [u8; 4] = head[4..8].try_into().expect("4 bytes");
        let len = match u32::from_be_bytes(head[..4].try_into().expect("4 bytes")) {
            0 => size - at,
            1 => {
                f.read_exact(&mut head[8..])?;
                u64::from_be_bytes(head[8..].try_into().expect("8 bytes"))
            }
            n => u64::from(n),
        };
        if len < 8 {
            return Err(std::io::Error::other("a box shorter than its header"));
        }
        types.push(kind);
        // A length past the end (a truncated file, or a crafted one) ends the walk.
        at = at.saturating_add(len);
    }
    Ok(types)
}

/// The packets of `input` (one ffprobe pass, nothing decoded), or `None` when one has no byte
/// position.
pub fn packets(
    settings: &VideoSettings,
    probe: &VideoProbe,
    input: &Path,
    log: &Path,
    limit: Duration,
    cancel: &CancellationToken,
) -> Option<Vec<Packet>> {
    let mut cmd = std::process::Command::new(&settings.ffprobe);
    cmd.current_dir(log.parent().unwrap_or(Path::new(".")))
        .args(["-v", "error", "-show_entries"])
        .arg("packet=stream_index,codec_type,pts_time,dts_time,pos,size,flags")
        .args(["-of", "csv=p=0"])
        // The index's own flags and times: a parser would take a keyframe whose bytes a
        // partial file lacks (zeros) for another frame.
        .args(["-fflags", "+noparse+nofillin"])
        .args(input_args(probe.demuxer, input));
    let mut out = Vec::new();
    let mut whole = true;
    child::run(cmd, log, limit, cancel, &mut |l| match parse(l) {
        Some(p) => out.push(p),
        None => whole &= l.trim().is_empty(),
    })
    .ok()?;
    (whole && !out.is_empty()).then_some(out)
}

/// `codec_type,stream_index,pts_time,dts_time,size,pos,flags` (ffprobe's order of the fields;
/// a packet with side data has more after them).
fn parse(line: &str) -> Option<Packet> {
    let f: Vec<&str> = line.trim().split(',').collect();
    let [kind, stream, pts, dts, size, pos, flags, ..] = f[..] else {
        return None;
    };
    let time = |t: &str| t.parse::<f64>().ok().filter(|t| t.is_finite());
    let (pts, dts) = match (time(pts), time(dts)) {
        (Some(p), Some(d)) => (p, d),
        (Some(t), None) | (None, Some(t)) => (t, t),
        (None, None) => return None,
    };
    Some(Packet {
        stream: stream.parse().ok()?,
        video: kind == "video",
        key: flags.starts_with('K'),
        pts,
        dts,
        pos: pos.parse().ok()?,
        size: size.parse().ok()?,
    })
}

/// Each window's byte ranges of a file of `size` bytes (`[start, end)`, sorted, apart), or
/// an empty list for a window that reads the file whole.
pub fn ranges(packets: &[Packet], size: u64, windows: &[Window]) -> Vec<Vec<[u64; 2]>> {
    let Some(t0) = packets.iter().map(|p| p.dts.min(p.pts)).reduce(f64::min) else {
        return vec![Vec::new(); windows.len()];
    };
    let container = container_bytes(packets, size);
    let head = head(packets);
    windows
        .iter()
        .map(|w| {
            // The keyframe ffmpeg's seek lands on: the last one at or before `seek_secs`.
            let key = packets
                .iter()
                .filter(|p| p.video && p.key && p.pts - t0 <= w.seek_secs + 1e-6)
                .map(|p| p.dts)
                .reduce(f64::max)
                .unwrap_or(t0);
            // Its video alone: a unit encodes no audio (`-an`), and ffmpeg's demuxer skips the
            // packets of a stream nothing uses.
            let to = w.end_secs.map(|e| t0 + e + AFTER_SECS);
            let own = stream_spans(packets, |p| {
                p.video && p.dts >= key && to.is_none_or(|to| p.dts.min(p.pts) <= to)
            });
            let all = container.iter().chain(&head).chain(&own).copied();
            worth_it(join(all, size, MARGIN, MARGIN), size)
        })
        .collect()
}

/// `ranges`, or none (the file whole) when they are most of it.
fn worth_it(ranges: Vec<[u64; 2]>, size: u64) -> Vec<[u64; 2]> {
    let read: u64 = ranges.iter().map(|[a, b]| b - a).sum();
    if read as f64 > WORTH_IT * size as f64 {
        Vec::new()
    } else {
        ranges
    }
}

/// The bytes a long video's plan reads: the container's and the first seconds of every stream
/// (its probe). Empty when that is most of the file.
pub fn for_plan(packets: &[Packet], size: u64) -> Vec<[u64; 2]> {
    reading(packets, size, |_| false)
}

/// The bytes its audio reads: the plan's and every audio packet (the loudness and the audio
/// are made over the whole program); the video's packets are the units'. Each packet's bytes
/// exactly (no margin: the packet list is the index's). Empty (the whole file) when that is
/// most of the file, or more than [`MAX_AUDIO_RANGES`] reads.
pub fn for_audio(packets: &[Packet], size: u64) -> Vec<[u64; 2]> {
    let r = reading(packets, size, |p| !p.video);
    if r.len() > MAX_AUDIO_RANGES {
        Vec::new()
    } else {
        r
    }
}

/// The container's bytes, the first seconds of every stream and the packets `also` takes.
/// The bytes the audio's opening reads (`Part::Opening`, its first `secs`): the plan's and the
/// audio packets up to half a second past its end (the copy stops at the first past it).
pub fn for_opening(packets: &[Packet], size: u64, secs: u32) -> Vec<[u64; 2]> {
    let end = f64::from(secs) + AFTER_SECS;
    reading(packets, size, |p| !p.video && p.dts <= end)
}

fn reading(packets: &[Packet], size: u64, also: impl Fn(&Packet) -> bool) -> Vec<[u64; 2]> {
    if packets.is_empty() {
        return Vec::new();
    }
    let container = container_bytes(packets, size);
    let head = head(packets);
    let packets = packets
        .iter()
        .filter(|p| also(p))
        .map(|p| [p.pos, p.pos + p.size]);
    let all = container.into_iter().chain(head).chain(packets);
    worth_it(join(all, size, 0, CONTAINER_GAP), size)
}

/// Each stream's first [`PROBE_SECS`] of packets, from its own first (a stream may start later
/// than another).
fn head(packets: &[Packet]) -> Vec<[u64; 2]> {
    let mut first: std::collections::BTreeMap<u32, f64> = Default::default();
    for p in packets {
        let t = first.entry(p.stream).or_insert(p.dts);
        *t = t.min(p.dts);
    }
    stream_spans(packets, |p| p.dts - first[&p.stream] <= PROBE_SECS)
}

/// The bytes outside every packet that are the container's own: before the first packet,
/// after the last, and every gap of at least [`CONTAINER_GAP`] between them.
fn container_bytes(packets: &[Packet], size: u64) -> Vec<[u64; 2]> {
    let mut spans: Vec<[u64; 2]> = packets.iter().map(|p| [p.pos, p.pos + p.size]).collect();
    spans.sort_unstable();
    let mut out = Vec::new();
    let mut end = 0;
    for [a, b] in spans {
        if a >= end + CONTAINER_GAP || (end == 0 && a > 0) {
            out.push([end, a]);
        }
        end = end.max(b);
    }
    if end < size {
        out.push([end, size]);
    }
    out
}

/// For each stream, from the first byte to the last of its packets that `keep` takes.
fn stream_spans(packets: &[Packet], keep: impl Fn(&Packet) -> bool) -> Vec<[u64; 2]> {
    let mut by_stream: std::collections::BTreeMap<u32, [u64; 2]> = Default::default();
    for p in packets.iter().filter(|p| keep(p)) {
        let s = by_stream.entry(p.stream).or_insert([u64::MAX, 0]);
        s[0] = s[0].min(p.pos);
        s[1] = s[1].max(p.pos + p.size);
    }
    by_stream.into_values().collect()
}

/// The ranges widened by `margin`, clipped to the file, sorted and joined where less than
/// `apart` separates them.
fn join(
    ranges: impl Iterator<Item = [u64; 2]>,
    size: u64,
    margin: u64,
    apart: u64,
) -> Vec<[u64; 2]> {
    let mut v: Vec<[u64; 2]> = ranges
        .map(|[a, b]| [a.saturating_sub(margin), (b + margin).min(size)])
        .filter(|[a, b]| a < b)
        .collect();
    v.sort_unstable();
    let mut out: Vec<[u64; 2]> = Vec::new();
    for r in v {
        match out.last_mut() {
            Some(last) if r[0] <= last[1] + apart => last[1] = last[1].max(r[1]),
            _ => out.push(r),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 60 s file: a 10 000-byte header, then each second of video (30 packets of 100 KB,
    /// keyframes every 2 s) and of audio (one 20 KB packet), interleaved second by second or
    /// all the audio after all the video, and a 50 000-byte index at the end.
    fn file(interleaved: bool) -> (Vec<Packet>, u64) {
        let mut v = Vec::new();
        for s in 0..60 {
            for f in 0..30 {
                let t = s as f64 + f as f64 / 30.0;
                v.push(Packet {
                    stream: 0,
                    video: true,
                    key: f == 0 && s % 2 == 0,
                    pts: t,
                    dts: t,
                    pos: 0,
                    size: 100_000,
                });
            }
            v.push(Packet {
                stream: 1,
                video: false,
                key: true,
                pts: s as f64,
                dts: s as f64,
                pos: 0,
                size: 20_000,
            });
        }
        if !interleaved {
            v.sort_by_key(|p| !p.video);
        }
        let mut pos = 10_000;
        for p in &mut v {
            p.pos = pos;
            pos += p.size + 16;
        }
        (v, pos + 50_000)
    }

    #[test]
    fn a_unit_reads_the_container_the_first_seconds_and_its_own_packets() {
        let (p, size) = file(true);
        let w = Window {
            seek_secs: 29.0,
            end_secs: Some(38.0),
        };
        let r = &ranges(&p, size, &[w])[0];
        // The header with the video's first half second and the audio's first packet (probe),
        // the unit from the keyframe at 28 s to past its end, and the index.
        assert_eq!(r.len(), 4, "{r:?}");
        assert_eq!(r[0][0], 0);
        let at = |t: f64| p.iter().find(|x| x.video && x.pts >= t).unwrap().pos;
        assert!(r[0][1] >= at(0.5) && r[0][1] < at(1.0), "{r:?}");
        assert!(r[2][0] <= at(28.0) && r[2][0] > at(27.0), "{r:?}");
        assert!(r[2][1] >= at(38.5) && r[2][1] < at(40.0), "{r:?}");
        assert_eq!(r[3][1], size);
        assert!(size - r[3][0] < 50_000 + 2 * MARGIN);
        // Half a second of probe, 10.5 s of unit, of 60.
        let read: u64 = r.iter().map(|[a, b]| b - a).sum();
        assert!(read < size * 2 / 10, "{read} of {size}");
    }

    #[test]
    fn a_stream_that_starts_late_has_its_own_first_packets_read() {
        // The video starts 3 s after the audio (a lead-in): its first half second is still
        // read, for the probes.
        let (mut p, size) = file(true);
        for x in p.iter_mut().filter(|x| x.video) {
            (x.pts, x.dts) = (x.pts + 3.0, x.dts + 3.0);
        }
        let first = *p.iter().find(|x| x.video).unwrap();
        let r = for_plan(&p, size);
        assert!(
            r.iter()
                .any(|[a, b]| *a <= first.pos && first.pos + first.size <= *b)
        );
    }

    #[test]
    fn the_plan_reads_the_container_and_the_first_packets_the_audio_its_packets_too() {
        for interleaved in [true, false] {
            let (p, size) = file(interleaved);
            let plan = for_plan(&p, size);
            let r = for_audio(&p, size);
            let in_ = |r: &[[u64; 2]], x: &Packet| {
                r.iter().any(|[a, b]| *a <= x.pos && x.pos + x.size <= *b)
            };
            let has = |x: &Packet| in_(&r, x);
            assert!(p.iter().filter(|x| !x.video).all(has), "{r:?}");
            let late_video = p.iter().filter(|x| x.video && x.dts > 1.0);
            assert!(late_video.clone().all(|x| !has(x)), "{r:?}");
            assert_eq!((r[0][0], r.last().unwrap()[1]), (0, size));
            // 60 packets of 20 KB of audio, half a second of video (16 packets of 100 KB),
            // header and index, and the framing between them.
            let read: u64 = r.iter().map(|[a, b]| b - a).sum();
            assert!(read < 1_200_000 + 1_600_000 + 60_000 + 4096, "{read}");
            // The plan: the same but the audio after its first half second.
            let late_audio = p.iter().filter(|x| !x.video && x.dts > 1.0);
            assert!(late_audio.clone().all(|x| !in_(&plan, x)), "{plan:?}");
            assert!(p.iter().filter(|x| x.dts == 0.0).all(|x| in_(&plan, x)));
            assert!(
                plan.iter()
                    .all(|[a, b]| r.iter().any(|[c, d]| c <= a && b <= d))
            );
        }
    }

    #[test]
    fn the_opening_reads_the_audio_of_its_seconds_only() {
        for interleaved in [true, false] {
            let (p, size) = file(interleaved);
            let r = for_opening(&p, size, 8);
            let has = |x: &Packet| r.iter().any(|[a, b]| *a <= x.pos && x.pos + x.size <= *b);
            let (inside, after): (Vec<&Packet>, Vec<&Packet>) =
                p.iter().filter(|x| !x.video).partition(|x| x.dts <= 8.5);
            assert!(inside.iter().all(|x| has(x)), "{r:?}");
            assert!(after.iter().all(|x| !has(x)), "{r:?}");
            assert!(p.iter().filter(|x| x.video && x.dts > 1.0).all(|x| !has(x)));
            // What the probe and the demuxer read first: the container's and the head.
            assert_eq!((r[0][0], r.last().unwrap()[1]), (0, size));
            assert!(r.iter().all(|o| {
                for_audio(&p, size)
                    .iter()
                    .any(|a| a[0] <= o[0] && o[1] <= a[1])
            }));
        }
    }

    #[test]
    fn audio_in_more_runs_than_the_cap_is_read_whole() {
        // Each audio packet between two 10 KB video packets: one run each.
        let packets = |runs: usize| -> (Vec<Packet>, u64) {
            let mut v = Vec::new();
            let mut pos = 10_000;
            for i in 0..runs {
                let t = i as f64 / 30.0;
                for (video, size) in [(true, 10_000), (false, 300)] {
                    v.push(Packet {
                        stream: u32::from(!video),
                        video,
                        key: video && i % 60 == 0,
                        pts: t,
                        dts: t,
                        pos,
                        size,
                    });
                    pos += size;
                }
            }
            (v, pos + 10_000)
        };
        let (v, size) = packets(MAX_AUDIO_RANGES - 100);
        // The first half second is one read with the video's head.
        assert!(for_audio(&v, size).len() > MAX_AUDIO_RANGES - 200);
        let (v, size) = packets(MAX_AUDIO_RANGES + 100);
        assert_eq!(for_audio(&v, size), Vec::<[u64; 2]>::new());
        assert!(!for_plan(&v, size).is_empty());
    }

    #[test]
    fn the_last_unit_reads_to_the_end_and_a_wide_window_reads_it_all() {
        let (p, size) = file(true);
        let last = Window {
            seek_secs: 50.0,
            end_secs: None,
        };
        let all = Window {
            seek_secs: 0.0,
            end_secs: Some(59.0),
        };
        let r = ranges(&p, size, &[last, all]);
        assert_eq!(r[0].last().unwrap()[1], size);
        assert!(r[1].is_empty(), "most of the file: read whole");
    }

    #[test]
    fn a_stream_stored_apart_is_read_where_it_is() {
        // Audio after all the video (a file not interleaved): the unit reads its seconds of
        // each, not everything between them.
        let (p, size) = file(false);
        let w = Window {
            seek_secs: 20.0,
            end_secs: Some(26.0),
        };
        let r = &ranges(&p, size, &[w])[0];
        let read: u64 = r.iter().map(|[a, b]| b - a).sum();
        assert!(read < size / 3, "{r:?}");
        // The header with the video's first half second, the unit's video, the audio's first
        // packet, the index: not the unit's audio (a unit encodes none).
        assert_eq!(r.len(), 4, "{r:?}");
    }

    #[test]
    fn fragmented_mp4s_are_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, boxes: &[(&[u8; 4], u32)]| {
            let mut bytes = Vec::new();
            for (kind, len) in boxes {
                bytes.extend(len.to_be_bytes());
                bytes.extend(*kind);
                bytes.resize(bytes.len() + *len as usize - 8, 0);
            }
            let path = dir.path().join(name);
            std::fs::write(&path, bytes).unwrap();
            path
        };
        let plain = file(
            "plain.mp4",
            &[(b"ftyp", 24), (b"moov", 400), (b"mdat", 9000)],
        );
        let at_end = file("end.mp4", &[(b"ftyp", 24), (b"mdat", 9000), (b"moov", 400)]);
        let fragmented = file(
            "frag.mp4",
            &[
                (b"ftyp", 24),
                (b"moov", 400),
                (b"moof", 100),
                (b"mdat", 900),
            ],
        );
        assert!(ranged("mov", &plain) && ranged("mov", &at_end));
        assert!(!ranged("mov", &fragmented));
        assert!(!ranged("matroska", &plain));
        // A box that says it is shorter than its own header.
        let broken = dir.path().join("broken.mp4");
        let mut bytes = std::fs::read(&plain).unwrap();
        bytes[24..28].copy_from_slice(&4u32.to_be_bytes());
        std::fs::write(&broken, bytes).unwrap();
        assert!(!ranged("mov", &broken));
    }

    #[test]
    fn ffprobe_lines_parse_and_others_do_not() {
        let p = parse("video,0,1.033333,0.966667,4821,123456,K__").unwrap();
        assert_eq!(
            (p.stream, p.video, p.key, p.pos, p.size),
            (0, true, true, 123456, 4821)
        );
        assert!((p.pts - 1.033333).abs() < 1e-9 && (p.dts - 0.966667).abs() < 1e-9);
        assert!(parse("audio,1,2.0,2.0,300,N/A,K__").is_none());
        let side_data = parse("audio,1,-0.023220,-0.023220,258,5756,KD,").unwrap();
        assert_eq!((side_data.pos, side_data.video), (5756, false));
        assert!(parse("garbage").is_none());
    }
}
