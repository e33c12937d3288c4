//! Stage 5 for video: the rendition ladder in one ffmpeg run. The source is decoded once and
//! split into the rungs (H.264 yuv420p, upright, never upscaled, HDR tone-mapped to SDR once),
//! written as the streams of one `tee` output so that the AAC audio is encoded once: each
//! encoded stream goes to its progressive MP4 and, for a streaming profile, to ffmpeg's HLS
//! muxer, which cuts it into CMAF segments (see `stream`). The storyboard and the poster
//! candidates are more branches of the same graph (see `storyboard`, `poster`).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::ffprobe::VideoProbe;
use super::{storyboard, stream};
use crate::media::output::{TrackId, names};
use crate::media::settings::{Rendition, VideoSettings};

/// The rungs to produce: those whose height (the shorter displayed side) is not above the
/// source's, tallest first. A source smaller than every rung gets one rendition at its own
/// size, with the smallest rung's quality and cap.
pub fn plan(ladder: &[Rendition], probe: &VideoProbe) -> Vec<Rendition> {
    let short = even(probe.short_side());
    let mut rungs: Vec<Rendition> = ladder
        .iter()
        .filter(|r| r.height <= short)
        .map(|r| Rendition {
            height: even(r.height),
            ..*r
        })
        .collect();
    rungs.sort_by_key(|r| std::cmp::Reverse(r.height));
    rungs.dedup_by_key(|r| r.height);
    if rungs.is_empty()
        && let Some(last) = ladder.iter().min_by_key(|r| r.height)
    {
        // The smallest rung's settings at the source's size: a cap set on it still bounds
        // the smaller picture, a default one is the guideline's for this height.
        rungs.push(Rendition {
            height: short,
            ..*last
        });
    }
    rungs
}

fn even(x: u32) -> u32 {
    (x & !1).max(2)
}

/// The frame size of a rung: the short side as asked, the other side rounded to the nearest
/// even number as ffmpeg's `scale=-2` does (`av_rescale`, round half up).
pub fn output_size(probe: &VideoProbe, short_side: u32) -> (u32, u32) {
    let (w, h) = (probe.width as u64, probe.height as u64);
    let s = short_side as u64;
    let other = |long: u64, short: u64| ((s * long + short) / (2 * short) * 2) as u32;
    if w >= h {
        (other(w, h), short_side)
    } else {
        (short_side, other(h, w))
    }
}

/// 8-bit SDR yuv420p, which every browser plays.
pub fn to_sdr(probe: &VideoProbe) -> &'static str {
    if probe.hdr {
        "zscale=t=linear:npl=100,format=gbrpf32le,zscale=p=bt709,\
         tonemap=tonemap=hable:desat=0,zscale=t=bt709:m=bt709:r=tv,format=yuv420p"
    } else {
        "format=yuv420p"
    }
}

/// What one ffmpeg run writes: renditions (tallest first), their streams, the storyboard and
/// poster candidate frames.
pub struct Outputs<'a> {
    pub rungs: &'a [Rendition],
    /// Each rung as a progressive MP4 (`names::rendition`).
    pub progressive: bool,
    /// Each rung, and the audio, also cut into CMAF segments (see `stream`).
    pub stream: Option<Streaming>,
    pub storyboard: Option<&'a storyboard::Plan>,
    /// The audio's filter: loudness normalisation (see `loudness`).
    pub audio_filter: Option<&'a str>,
    /// Poster candidates: the first frame from each time (ascending), upright, SDR, as RGB PNG,
    /// written to [`frame_file`]`(frame_dir, i)`.
    pub frames: &'a [Duration],
    pub frame_dir: &'a Path,
    /// A unit of a long video (see `units`): only its part of the video, and the poster
    /// candidates numbered from this one.
    pub span: Option<Span>,
    pub first_candidate: usize,
}

/// A unit's part of the video: its frames on the stream's constant-rate timeline
/// (`[first_slot, end_slot)`, the frame in slot `n` shown at `n / rate`) and the source time
/// they stand for, each end half a frame early, as the `fps` filter rounds a source frame to
/// its nearest slot.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Span {
    pub first_slot: i64,
    pub end_slot: Option<i64>,
    pub start_secs: f64,
    pub end_secs: Option<f64>,
    /// Its first segment's number: its segments keep the names a one-run encode gives them.
    pub first_segment: u32,
    pub segments: u32,
    /// Where its run seeks to (`-ss`): ffmpeg decodes from the keyframe at or before it and
    /// gives every frame to the filters, whose trims cut the span (chosen by `units`).
    pub seek_secs: f64,
}

impl Span {
    /// `trim` of the source's frames in this span (storyboard tiles, poster candidates).
    fn trim_seconds(&self) -> String {
        match self.end_secs {
            Some(e) => format!("trim=start={:.6}:end={e:.6},", self.start_secs),
            None => format!("trim=start={:.6},", self.start_secs),
        }
    }

    /// `trim` of the constant-rate frames in this span.
    fn trim_slots(&self) -> String {
        match self.end_slot {
            Some(e) => format!("trim=start_pts={}:end_pts={e},", self.first_slot),
            None => format!("trim=start_pts={},", self.first_slot),
        }
    }
}

/// How the rungs are cut for streaming.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Streaming {
    pub segment_secs: u32,
    /// The constant frame rate of every rung: segment boundaries fall at the same times in all
    /// of them, with no drift from a variable-rate source.
    pub frame_rate: f64,
}

/// The highest frame rate a stream is given: players and phones gain nothing above it.
const MAX_STREAM_FPS: f64 = 60.0;

impl Streaming {
    pub fn new(segment_secs: u32, probe: &VideoProbe) -> Streaming {
        Streaming {
            segment_secs,
            frame_rate: probe.fps.unwrap_or(30.0).clamp(1.0, MAX_STREAM_FPS),
        }
    }
}

impl Outputs<'_> {
    /// Whether the run has a `tee` output: rungs, or a stream's audio.
    fn tee(&self, probe: &VideoProbe) -> bool {
        !self.rungs.is_empty() || self.stream_audio(probe)
    }

    /// Whether the run cuts the audio into a stream's track.
    pub fn stream_audio(&self, probe: &VideoProbe) -> bool {
        self.stream.is_some() && probe.audio_codec.is_some()
    }

    /// The folders the run writes into, relative to its directory (the muxers do not create
    /// them).
    pub fn dirs(&self, probe: &VideoProbe) -> Vec<PathBuf> {
        let track = |t: TrackId| Path::new(names::STREAM_DIR).join(t.to_string());
        let mut dirs = Vec::new();
        for r in self.rungs {
            if self.progressive {
                let mp4 = PathBuf::from(names::rendition(r.height));
                dirs.push(mp4.parent().expect("in a folder").to_owned());
            }
            if self.stream.is_some() {
                dirs.push(track(TrackId::Video(r.height)));
            }
        }
        if self.stream_audio(probe) {
            dirs.push(track(TrackId::Audio));
        }
        dirs.sort();
        dirs.dedup();
        dirs
    }
}

/// Where candidate `i` is written. The k-th frame selected is candidate k: between two
/// candidate times (a fifth of the video apart by default) there is always a frame, so only
/// candidates past the end are missing, and they are the last ones.
pub fn frame_file(dir: &Path, i: impl std::fmt::Display) -> PathBuf {
    dir.join(format!("frame-{i}.png"))
}

/// `select`'s expression for the first frame at or after each of `times` (ascending).
fn first_frames_from(times: &[Duration]) -> String {
    let ts: Vec<String> = times
        .iter()
        .map(|t| format!("{:.3}", t.as_secs_f64()))
        .collect();
    let terms: Vec<String> = ts
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let before_next = ts.get(i + 1).map(|n| format!("*lt(t\\,{n})"));
            format!(
                "gte(t\\,{t}){}*not(gte(prev_selected_t\\,{t}))",
                before_next.unwrap_or_default()
            )
        })
        .collect();
    terms.join("+")
}

/// The filter graph of a run: the source split once into the ladder (`[v0]`, ...), the
/// storyboard (`[b]`) and the poster candidates (`[c]`). The tallest rung is scaled from the
/// source (and tone-mapped there, once, for HDR), each smaller one from the rung above it: a
/// scale costs by the pixels it reads, and the streaming ladder of a 1080p source took 14 %
/// more CPU with every rung scaled from 1080p, for an SSIM against the source at most 0.0006
/// higher and 1-2 % more bytes in the 480p, 360p and 234p rungs (`cargo bench --bench
/// streaming -- --caps`). A stream's rungs are brought to its constant frame rate first.
pub fn filter_graph(probe: &VideoProbe, outputs: &Outputs) -> String {
    let rungs = outputs.rungs;
    let size = |r: &Rendition| output_size(probe, r.height);
    let mut heads = Vec::new();
    let mut chains = Vec::new();
    // Each rung's output, and its copy for the rung below (if any).
    let outs = |i: usize| {
        if i + 1 < rungs.len() {
            format!("split=2[v{i}][s{}]", i + 1)
        } else {
            format!("split=1[v{i}]")
        }
    };
    if let Some(top) = rungs.first() {
        heads.push("[t]".to_owned());
        let (w, h) = size(top);
        let cfr = outputs
            .stream
            .map(|s| format!("fps={},", stream::frame_rate(s.frame_rate)))
            .unwrap_or_default();
        let cfr = cfr + &outputs.span.map(|s| s.trim_slots()).unwrap_or_default();
        chains.push(format!(
            "[t]{cfr}scale={w}:{h},{},{}",
            to_sdr(probe),
            outs(0)
        ));
        for (i, r) in rungs.iter().enumerate().skip(1) {
            let (w, h) = size(r);
            let out = if i + 1 < rungs.len() {
                format!(",{}", outs(i))
            } else {
                format!("[v{i}]")
            };
            chains.push(format!("[s{i}]scale={w}:{h}{out}"));
        }
    }
    if let Some(plan) = outputs.storyboard {
        heads.push("[b]".to_owned());
        let chain = match outputs.span {
            Some(s) => {
                let first = plan.tiles_in(s.start_secs, s.end_secs).start;
                s.trim_seconds() + &plan.tiles_filter(to_sdr(probe), Some(first))
            }
            None => plan.filter(to_sdr(probe)),
        };
        chains.push(format!("[b]{chain}[sb]"));
    }
    if !outputs.frames.is_empty() {
        heads.push("[f]".to_owned());
        chains.push(format!(
            "[f]{}select={},{},format=rgb24[c]",
            outputs.span.map(|s| s.trim_seconds()).unwrap_or_default(),
            first_frames_from(outputs.frames),
            to_sdr(probe)
        ));
    }
    if outputs.span.is_some() && !heads.is_empty() {
        // The time of the first frame decoded, in microseconds: where the seek landed.
        heads.push("[l]".to_owned());
        chains.push(format!(
            "[l]trim=end_frame=1,settb=AVTB,metadata=mode=add:key=landed:value=1,\
             metadata=mode=print:file={},nullsink",
            landed_file(outputs.frame_dir).display()
        ));
    }
    if heads.is_empty() {
        return String::new();
    }
    let split = format!("[0:v:0]split={}{}", heads.len(), heads.concat());
    std::iter::once(split)
        .chain(chains)
        .collect::<Vec<_>>()
        .join(";")
}

/// Where a unit's run writes the time of the first frame it decoded (ffmpeg's `metadata`
/// print, `pts:` in microseconds).
pub fn landed_file(frame_dir: &Path) -> PathBuf {
    frame_dir.join("landed.txt")
}

/// Where a unit's run landed: the time of the first frame it decoded, in microseconds, from
/// [`landed_file`]'s text.
pub fn landed_micros(printed: &str) -> Option<i64> {
    let line = printed.lines().find(|l| l.starts_with("frame:"))?;
    let pts = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("pts:"))?;
    pts.parse().ok()
}

/// ffmpeg's arguments for one run writing `outputs`, progress reports on stdout.
pub fn args(
    settings: &VideoSettings,
    threads: usize,
    probe: &VideoProbe,
    input: &Path,
    outputs: &Outputs,
) -> Vec<OsString> {
    let graph = filter_graph(probe, outputs);
    let ext = |a: &mut Vec<OsString>, args: &[&str]| a.extend(args.iter().map(OsString::from));
    let mut a = Vec::new();
    ext(
        &mut a,
        &["-hide_banner", "-nostdin", "-v", "error", "-xerror", "-y"],
    );
    let t = threads.to_string();
    ext(&mut a, &["-threads", &t]);
    if let Some(span) = outputs.span {
        // The run's timestamps are the video's own (from 0 as in a one-run encode), so that
        // the segments of consecutive units follow one another. No trim at the seek point:
        // the filters' own trims cut the span, and the `fps` filter must see the frame before
        // its first slot.
        let from = format!("{:.6}", span.seek_secs);
        ext(
            &mut a,
            &[
                "-copyts",
                "-start_at_zero",
                "-noaccurate_seek",
                "-ss",
                &from,
            ],
        );
    }
    a.extend(super::ffprobe::input_args(probe.demuxer, input));
    if !graph.is_empty() {
        ext(
            &mut a,
            &["-filter_complex_threads", &t, "-filter_complex", &graph],
        );
    }
    // Reports every 0.2 s (not 0.5): candidates are scored soon after they are written.
    ext(
        &mut a,
        &["-progress", "pipe:1", "-stats_period", "0.2", "-nostats"],
    );
    if let Some(span) = outputs.span {
        a.extend(unit_outputs(settings, threads, probe, outputs, span));
    } else if outputs.tee(probe) {
        // The rungs are the streams of one `tee` output, each MP4 taking its video stream and
        // the one audio stream: the audio is encoded once for the whole ladder. A stream's
        // segments are more slaves of the same output: the same encoded streams, cut.
        let audio = probe.audio_codec.is_some();
        let mut slaves = Vec::new();
        for (i, rung) in outputs.rungs.iter().enumerate() {
            ext(&mut a, &["-map", &format!("[v{i}]")]);
            a.extend(video_encoder_args(settings, threads, probe, rung, Some(i)));
            if let Some(s) = outputs.stream {
                // A closed GOP at every segment boundary, in every rung alike.
                ext(
                    &mut a,
                    &[
                        &format!("-force_key_frames:v:{i}"),
                        &format!("expr:gte(t,n_forced*{})", s.segment_secs),
                    ],
                );
                let track = TrackId::Video(rung.height);
                slaves.push(format!(
                    "[select=\\'v:{i}\\':{}",
                    stream::muxer(track, s.segment_secs)
                ));
            }
            if outputs.progressive {
                let streams = if audio {
                    format!("v:{i},a")
                } else {
                    format!("v:{i}")
                };
                // No metadata of the source, and none of ours either (bitexact: no encoder
                // tag).
                slaves.push(format!(
                    "[select=\\'{streams}\\':f=mp4:movflags=+faststart:fflags=+bitexact]{}",
                    names::rendition(rung.height)
                ));
            }
        }
        if audio {
            ext(&mut a, &["-map", "0:a:0"]);
            if let Some(f) = outputs.audio_filter {
                ext(&mut a, &["-af", f]);
            }
        }
        if let Some(s) = outputs.stream.filter(|_| audio) {
            slaves.push(format!(
                "[select=\\'a\\':{}",
                stream::muxer(TrackId::Audio, s.segment_secs)
            ));
        }
        a.extend(audio_encoder_args(settings, probe));
        ext(&mut a, &["-map_metadata", "-1", "-map_chapters", "-1"]);
        ext(
            &mut a,
            &["-flags", "+global_header", "-fflags", "+bitexact"],
        );
        ext(&mut a, &["-f", "tee", &slaves.join("|")]);
    }
    match (outputs.storyboard, outputs.span) {
        (Some(plan), Some(span)) => {
            // The unit's tiles one by one, numbered in the whole video's sprite.
            let tiles = plan.tiles_in(span.start_secs, span.end_secs);
            ext(&mut a, &["-map", "[sb]", "-fps_mode", "passthrough"]);
            ext(&mut a, &["-c:v", "png", "-compression_level", "1"]);
            ext(&mut a, &["-frames:v", &tiles.len().to_string()]);
            ext(&mut a, &["-f", "image2", "-start_number"]);
            a.push(tiles.start.to_string().into());
            a.push(storyboard::tile_file(outputs.frame_dir, "%05d").into());
        }
        (Some(plan), None) => {
            ext(&mut a, &["-map", "[sb]"]);
            a.extend(plan.output_args());
        }
        (None, _) => {}
    }
    if !outputs.frames.is_empty() {
        ext(&mut a, &["-map", "[c]", "-fps_mode", "passthrough"]);
        ext(&mut a, &["-c:v", "png", "-compression_level", "1"]);
        // Whole or not at all: candidates are scored while the run goes on.
        ext(
            &mut a,
            &["-f", "image2", "-atomic_writing", "1", "-start_number"],
        );
        a.push(outputs.first_candidate.to_string().into());
        a.push(frame_file(outputs.frame_dir, "%d").into());
    }
    a
}

/// A unit's rungs, each an HLS output of its own (nothing to share: no audio, no MP4), with a
/// keyframe (closed GOP) on the first frame of each of its segments, counted in frames so that
/// no rounding of times can move one.
fn unit_outputs(
    settings: &VideoSettings,
    threads: usize,
    probe: &VideoProbe,
    outputs: &Outputs,
    span: Span,
) -> Vec<OsString> {
    let Some(s) = outputs.stream else {
        return Vec::new();
    };
    let (num, den) = stream::rational(s.frame_rate);
    // Segment k starts on the first slot at or after k · segment_secs: ceil(k·S·num/den).
    let per = s.segment_secs as i64 * num as i64;
    let starts: Vec<String> = (span.first_segment as i64..)
        .take(span.segments as usize)
        .map(|k| (k * per + den as i64 - 1) / den as i64)
        .map(|slot| format!("eq(n,{})", slot - span.first_slot))
        .collect();
    let keyframes = format!("expr:{}", starts.join("+"));
    let mut a = Vec::new();
    for (i, rung) in outputs.rungs.iter().enumerate() {
        a.extend(["-map".into(), format!("[v{i}]").into()]);
        a.extend(video_encoder_args(settings, threads, probe, rung, None));
        a.extend(
            [
                "-force_key_frames:v",
                &keyframes,
                // No keyframe of x264's own at a scene change: the HLS muxer cuts a unit at
                // every keyframe (see `stream::output_args`).
                "-sc_threshold:v",
                "0",
                "-fps_mode",
                "passthrough",
                "-an",
            ]
            .map(OsString::from),
        );
        a.extend(
            [
                "-map_metadata",
                "-1",
                "-map_chapters",
                "-1",
                "-fflags",
                "+bitexact",
            ]
            .map(OsString::from),
        );
        let track = TrackId::Video(rung.height);
        a.extend(stream::output_args(
            track,
            s.segment_secs,
            Some(span.first_segment),
        ));
    }
    a
}

/// A rung's video encoder: H.264 High yuv420p at its CRF under its peak bitrate cap (x264's
/// VBV: capped CRF), BT.709 tags after tone mapping. `stream`: its index among the run's video
/// streams (the options apply to it alone), or None for a run of its own.
pub fn video_encoder_args(
    settings: &VideoSettings,
    threads: usize,
    probe: &VideoProbe,
    rung: &Rendition,
    stream: Option<usize>,
) -> Vec<OsString> {
    let spec = stream.map_or(":v".to_owned(), |i| format!(":v:{i}"));
    let (threads, crf) = (threads.to_string(), rung.crf.to_string());
    let (maxrate, bufsize) = (
        format!("{}k", rung.maxrate()),
        format!("{}k", rung.bufsize()),
    );
    let mut o = vec![
        ("-c", "libx264"),
        ("-preset", settings.preset.as_str()),
        ("-crf", &crf),
        ("-maxrate", &maxrate),
        ("-bufsize", &bufsize),
        ("-pix_fmt", "yuv420p"),
        ("-profile", "high"),
        ("-threads", &threads),
    ];
    if probe.hdr {
        o.extend([("-color_primaries", "bt709"), ("-color_trc", "bt709")]);
        o.push(("-colorspace", "bt709"));
    }
    o.into_iter()
        .flat_map(|(name, value)| [OsString::from(format!("{name}{spec}")), value.into()])
        .collect()
}

/// The audio encoder: AAC stereo, or no audio when the source has none.
pub fn audio_encoder_args(settings: &VideoSettings, probe: &VideoProbe) -> Vec<OsString> {
    let bitrate = format!("{}k", settings.audio_bitrate_kbps);
    let o = if probe.audio_codec.is_some() {
        // Stereo at 48 kHz whatever the source: what the DASH manifest declares.
        vec!["-c:a", "aac", "-b:a", &bitrate, "-ac", "2", "-ar", "48000"]
    } else {
        vec!["-an"]
    };
    o.into_iter().map(OsString::from).collect()
}

/// How long one ffmpeg run over this input may take.
pub fn time_limit(settings: &VideoSettings, probe: &VideoProbe, max_seconds: u64) -> Duration {
    let media = probe
        .duration
        .map_or(max_seconds as f64, |d| d.as_secs_f64());
    Duration::from_secs(settings.timeout_base_secs)
        + Duration::from_secs_f64(media * settings.timeout_per_second)
}

/// `out_time_us=1234567` from `-progress`: media time written so far.
pub fn progress_time(line: &str) -> Option<Duration> {
    let v = line.strip_prefix("out_time_us=")?;
    v.parse::<u64>().ok().map(Duration::from_micros)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(w: u32, h: u32) -> VideoProbe {
        VideoProbe {
            duration: Some(Duration::from_secs(10)),
            width: w,
            height: h,
            rotation: 0,
            fps: Some(30.0),
            video_codec: "h264".into(),
            pix_fmt: "yuv420p".into(),
            audio_codec: None,
            bitrate: None,
            hdr: false,
            frames: Some(300),
            streams: 1,
            demuxer: "mov",
        }
    }

    /// The default profile's ladder (720p CRF 23, 480p CRF 26).
    fn ladder() -> Vec<Rendition> {
        crate::media::settings::defaults::job("default")
            .profile
            .renditions
    }

    #[test]
    fn where_a_run_landed_is_read_from_the_metadata_print() {
        // As ffmpeg 5.1's `metadata=mode=print` writes it, `pts` left-aligned in 7 columns.
        let printed = "frame:0    pts:16000000 pts_time:16\nlanded=1\n";
        assert_eq!(landed_micros(printed), Some(16_000_000));
        assert_eq!(
            landed_micros("frame:0    pts:0       pts_time:0\nlanded=1\n"),
            Some(0)
        );
        // Nothing decoded: nothing printed.
        assert_eq!(landed_micros(""), None);
    }

    #[test]
    fn the_ladder_never_upscales_and_keeps_one_rung_for_small_sources() {
        let heights = |p: &VideoProbe| {
            plan(&ladder(), p)
                .iter()
                .map(|r| r.height)
                .collect::<Vec<_>>()
        };
        assert_eq!(heights(&probe(1920, 1080)), [720, 480]);
        assert_eq!(
            heights(&probe(1080, 1920)),
            [720, 480],
            "portrait: the short side"
        );
        assert_eq!(heights(&probe(480, 640)), [480]);
        let small = plan(&ladder(), &probe(640, 361));
        assert_eq!((small.len(), small[0].height, small[0].crf), (1, 360, 26));
        // Capped at its own height's rate, not the 480p rung's; a set cap is kept.
        assert_eq!(small[0].maxrate(), 365);
        let mut capped = ladder();
        capped[1].maxrate_kbps = Some(300);
        assert_eq!(plan(&capped, &probe(640, 361))[0].maxrate(), 300);
    }

    #[test]
    fn output_size_rounds_like_ffmpeg() {
        assert_eq!(output_size(&probe(1920, 1080), 720), (1280, 720));
        assert_eq!(output_size(&probe(1080, 1920), 480), (480, 854));
        assert_eq!(output_size(&probe(640, 360), 360), (640, 360));
        assert_eq!(output_size(&probe(480, 640), 480), (480, 640));
    }

    fn outputs<'a>(rungs: &'a [Rendition], frames: &'a [Duration]) -> Outputs<'a> {
        Outputs {
            rungs,
            progressive: true,
            stream: None,
            storyboard: None,
            audio_filter: None,
            frames,
            frame_dir: Path::new("work"),
            span: None,
            first_candidate: 0,
        }
    }

    #[test]
    fn one_graph_splits_the_source_into_rungs_and_poster_frames() {
        let rungs = ladder();
        let secs = [2, 10].map(Duration::from_secs);
        assert_eq!(
            filter_graph(&probe(1920, 1080), &outputs(&rungs, &secs)),
            "[0:v:0]split=2[t][f];\
             [t]scale=1280:720,format=yuv420p,split=2[v0][s1];[s1]scale=854:480[v1];\
             [f]select=gte(t\\,2.000)*lt(t\\,10.000)*not(gte(prev_selected_t\\,2.000))\
             +gte(t\\,10.000)*not(gte(prev_selected_t\\,10.000)),format=yuv420p,format=rgb24[c]"
        );
        // HDR: tone-mapped once for the ladder, at the tallest rung's size, and once for each
        // selected candidate.
        let hdr = VideoProbe {
            hdr: true,
            ..probe(1080, 1920)
        };
        let g = filter_graph(&hdr, &outputs(&rungs, &secs[..1]));
        assert_eq!(g.matches("tonemap=hable").count(), 2, "{g}");
        assert!(
            g.starts_with("[0:v:0]split=2[t][f];[t]scale=720:1280,zscale=t=linear"),
            "{g}"
        );
        assert!(g.contains("split=2[v0][s1];[s1]scale=480:854[v1]"), "{g}");
        // Only poster frames (every rung resumed).
        let g = filter_graph(&hdr, &outputs(&[], &secs[..1]));
        assert!(g.starts_with("[0:v:0]split=1[f];[f]select=gte(t"), "{g}");
    }

    #[test]
    fn each_rung_is_scaled_from_the_one_above() {
        let ladder = crate::media::settings::defaults::job("streaming")
            .profile
            .renditions;
        let source = probe(1920, 1080);
        let rungs = plan(&ladder, &source);
        assert_eq!(
            filter_graph(&source, &outputs(&rungs, &[])),
            "[0:v:0]split=1[t];\
             [t]scale=1920:1080,format=yuv420p,split=2[v0][s1];\
             [s1]scale=1280:720,split=2[v1][s2];[s2]scale=854:480,split=2[v2][s3];\
             [s3]scale=640:360,split=2[v3][s4];[s4]scale=416:234[v4]"
        );
    }

    #[test]
    fn a_stream_is_cut_from_the_same_encoded_rungs_at_a_constant_rate() {
        let s = crate::media::settings::defaults::job("default");
        let rungs = ladder();
        let vfr = VideoProbe {
            fps: Some(8.797),
            audio_codec: Some("aac".into()),
            ..probe(1920, 1080)
        };
        let spec = crate::media::settings::StoryboardSpec {
            interval_secs: 2.0,
            max_tiles: 100,
            tile_width: 160,
            columns: 10,
            format: crate::contract::OutputFormat::Webp,
            quality: 70,
        };
        let board = storyboard::plan(&spec, &vfr).unwrap();
        let o = Outputs {
            stream: Some(Streaming::new(4, &vfr)),
            storyboard: Some(&board),
            audio_filter: Some("loudnorm=I=-16"),
            ..outputs(&rungs, &[])
        };
        let g = filter_graph(&vfr, &o);
        assert!(
            g.starts_with("[0:v:0]split=2[t][b];[t]fps=8797/1000,scale=1280:720"),
            "{g}"
        );
        assert!(g.ends_with("tile=5x1[sb]"), "{g}");
        let a: Vec<String> = args(&s.video, 2, &vfr, Path::new("in"), &o)
            .iter()
            .map(|x| x.to_string_lossy().into_owned())
            .collect();
        let has = |pair: [&str; 2]| a.windows(2).any(|w| w == pair);
        assert!(has(["-force_key_frames:v:1", "expr:gte(t,n_forced*4)"]));
        assert!(has(["-af", "loudnorm=I=-16"]));
        let tee = &a[a.iter().position(|x| x == "tee").unwrap() + 1];
        let slaves: Vec<&str> = tee.split('|').collect();
        // Per rung its stream and its MP4, then the audio's stream: 5 slaves, one encode each.
        assert_eq!(slaves.len(), 5, "{tee}");
        assert!(slaves[0].starts_with("[select=\\'v:0\\':f=hls:hls_time=4:"));
        assert!(
            slaves[0].ends_with("hls_segment_filename=hls/720p/seg-%05d.m4s]hls/720p/ffmpeg.m3u8")
        );
        assert!(slaves[4].starts_with("[select=\\'a\\':f=hls:"), "{tee}");
        assert_eq!(a.iter().filter(|x| *x == "aac").count(), 1);
        assert!(has(["-map", "[sb]"]) && a.contains(&"storyboard.webp".to_owned()));
    }

    #[test]
    fn the_rungs_are_streams_of_one_tee_output() {
        let s = crate::media::settings::defaults::job("default");
        let rungs = ladder();
        let frames = [Duration::from_secs(1)];
        let outputs = outputs(&rungs, &frames);
        let args_for = |p: &VideoProbe| -> Vec<String> {
            args(&s.video, 2, p, Path::new("in"), &outputs)
                .iter()
                .map(|x| x.to_string_lossy().into_owned())
                .collect()
        };
        let has = |a: &[String], pair: [&str; 2]| a.windows(2).any(|w| w == pair);
        // Video-only input: no audio anywhere.
        let a = args_for(&probe(640, 360));
        assert!(a.contains(&"-an".to_owned()) && !a.contains(&"aac".to_owned()));
        assert!(has(&a, ["-crf:v:0", "23"]) && has(&a, ["-crf:v:1", "26"]));
        // Capped CRF: each rung under its guideline peak, with a buffer of twice that.
        assert!(has(&a, ["-maxrate:v:0", "3000k"]) && has(&a, ["-bufsize:v:0", "6000k"]));
        assert!(has(&a, ["-maxrate:v:1", "1260k"]) && has(&a, ["-bufsize:v:1", "2520k"]));
        assert!(has(&a, ["-threads:v:1", "2"]) && has(&a, ["-threads", "2"]));
        let tee = &a[a.iter().position(|x| x == "tee").unwrap() + 1];
        assert_eq!(
            tee,
            "[select=\\'v:0\\':f=mp4:movflags=+faststart:fflags=+bitexact]mp4/720p.mp4|\
             [select=\\'v:1\\':f=mp4:movflags=+faststart:fflags=+bitexact]mp4/480p.mp4"
        );
        let at = |x: &str| a.iter().position(|y| y == x).unwrap();
        assert!(at("[c]") > at("tee") && at("[c]") < at("work/frame-%d.png"));
        // With audio: one AAC encoder, in both MP4s.
        let a = args_for(&VideoProbe {
            audio_codec: Some("aac".into()),
            ..probe(640, 360)
        });
        assert_eq!(a.iter().filter(|x| *x == "aac").count(), 1);
        assert!(a.iter().any(|x| x.contains("select=\\'v:1,a\\'")));
        assert_eq!(
            progress_time("out_time_us=1500000"),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(progress_time("out_time_us=N/A"), None);
    }
}
