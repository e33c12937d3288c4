//! Stage 5 for video: the rendition ladder, each rung one ffmpeg run (H.264 + AAC, yuv420p,
//! `+faststart`), upright, never upscaled, HDR tone-mapped to SDR.

use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use super::ffprobe::VideoProbe;
use crate::media::settings::{Rendition, VideoSettings};

/// The rungs to produce: those whose height (the shorter displayed side) is not above the
/// source's, tallest first. A source smaller than every rung gets one rendition at its own
/// size, with the last rung's quality.
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
    if rungs.is_empty() {
        if let Some(last) = ladder.iter().min_by_key(|r| r.height) {
            rungs.push(Rendition {
                height: short,
                crf: last.crf,
            });
        }
    }
    rungs
}

fn even(x: u32) -> u32 {
    (x & !1).max(2)
}

/// The filters after ffmpeg's own autorotation (which also drops the rotation tag): scale to
/// the rung, then to 8-bit yuv420p, tone-mapping PQ/HLG to BT.709 on the way.
pub fn video_filter(probe: &VideoProbe, short_side: u32) -> String {
    let scale = if probe.width >= probe.height {
        format!("scale=-2:{short_side}")
    } else {
        format!("scale={short_side}:-2")
    };
    format!("{scale},{}", to_sdr(probe))
}

/// The frame size `video_filter` gives: the short side as asked, the other side rounded to
/// the nearest even number as ffmpeg's `scale=-2` does (`av_rescale`, round half up).
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

/// ffmpeg's arguments for one rung, progress reports on stdout.
pub fn args(
    settings: &VideoSettings,
    threads: usize,
    probe: &VideoProbe,
    rung: &Rendition,
    input: &Path,
    output: &Path,
) -> Vec<OsString> {
    let (threads, crf) = (threads.to_string(), rung.crf.to_string());
    let (vf, bitrate) = (
        video_filter(probe, rung.height),
        format!("{}k", settings.audio_bitrate_kbps),
    );
    let mut opts = vec!["-map", "0:v:0", "-map", "0:a:0?", "-dn", "-sn"];
    opts.extend(["-map_metadata", "-1", "-map_chapters", "-1", "-vf", &vf]);
    opts.extend(["-c:v", "libx264", "-preset", &settings.preset, "-crf", &crf]);
    opts.extend([
        "-pix_fmt",
        "yuv420p",
        "-profile:v",
        "high",
        "-threads",
        &threads,
    ]);
    if probe.hdr {
        opts.extend(["-color_primaries", "bt709", "-color_trc", "bt709"]);
        opts.extend(["-colorspace", "bt709"]);
    }
    if probe.audio_codec.is_some() {
        opts.extend(["-c:a", "aac", "-b:a", &bitrate, "-ac", "2"]);
    } else {
        opts.push("-an");
    }
    // No metadata of the source, and none of ours either (bitexact: no encoder tag).
    opts.extend([
        "-fflags",
        "+bitexact",
        "-movflags",
        "+faststart",
        "-f",
        "mp4",
        "-progress",
        "pipe:1",
        "-nostats",
    ]);
    let head = ["-hide_banner", "-nostdin", "-v", "error", "-xerror", "-y"];
    let mut a: Vec<OsString> = head.iter().map(OsString::from).collect();
    a.extend(["-threads", &threads].map(OsString::from));
    a.extend(super::ffprobe::input_args(probe.demuxer, input));
    a.extend(opts.into_iter().map(OsString::from));
    a.push(output.into());
    a
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
        crate::config::Settings::load_from(None, Vec::new())
            .unwrap()
            .profiles["default"]
            .renditions
            .clone()
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
    }

    #[test]
    fn output_size_rounds_like_ffmpeg() {
        assert_eq!(output_size(&probe(1920, 1080), 720), (1280, 720));
        assert_eq!(output_size(&probe(1080, 1920), 480), (480, 854));
        assert_eq!(output_size(&probe(640, 360), 360), (640, 360));
        assert_eq!(output_size(&probe(480, 640), 480), (480, 640));
    }

    #[test]
    fn filters_scale_the_short_side_and_tone_map_hdr() {
        assert_eq!(
            video_filter(&probe(1920, 1080), 720),
            "scale=-2:720,format=yuv420p"
        );
        let hdr = VideoProbe {
            hdr: true,
            ..probe(1080, 1920)
        };
        let f = video_filter(&hdr, 720);
        assert!(f.starts_with("scale=720:-2,zscale=t=linear"), "{f}");
        assert!(
            f.contains("tonemap=") && f.ends_with("format=yuv420p"),
            "{f}"
        );
    }

    #[test]
    fn video_only_input_gets_no_audio_and_progress_parses() {
        let s = crate::config::Settings::load_from(None, Vec::<(String, String)>::new()).unwrap();
        let a = args(
            &s.video,
            2,
            &probe(640, 360),
            &ladder()[1],
            Path::new("in"),
            Path::new("out.mp4"),
        );
        let a: Vec<String> = a.iter().map(|x| x.to_string_lossy().into_owned()).collect();
        assert!(a.contains(&"-an".to_owned()) && !a.contains(&"aac".to_owned()));
        assert!(a.windows(2).any(|w| w == ["-movflags", "+faststart"]));
        assert!(a.windows(2).any(|w| w == ["-threads", "2"]));
        assert_eq!(
            progress_time("out_time_us=1500000"),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(progress_time("out_time_us=N/A"), None);
    }
}
