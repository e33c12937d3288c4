//! Stage 3 for video: what `ffprobe -print_format json` says, whether the container may carry
//! its streams (`components`), and the limits checked before anything is transcoded.

use std::ffi::OsString;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::child::{self, ChildError};
use super::components;
use crate::media::error::MediaError;
use crate::media::settings::{Limits, VideoSettings};
use crate::media::sniff::Container;

/// A video's facts, as displayed (rotation applied).
#[derive(Debug, Clone, PartialEq)]
pub struct VideoProbe {
    pub duration: Option<Duration>,
    pub width: u32,
    pub height: u32,
    /// Display rotation in degrees (as ffprobe reports it: -90 for a phone held upright).
    pub rotation: i32,
    pub fps: Option<f64>,
    pub video_codec: String,
    pub pix_fmt: String,
    pub audio_codec: Option<String>,
    pub bitrate: Option<u64>,
    /// PQ or HLG transfer.
    pub hdr: bool,
    /// Frames of the video stream (as the container says, else duration x frame rate).
    pub frames: Option<u64>,
    /// Streams of every kind.
    pub streams: u32,
    /// The ffmpeg demuxer every run opens the input with (see [`input_args`]).
    pub demuxer: &'static str,
}

impl VideoProbe {
    pub fn short_side(&self) -> u32 {
        self.width.min(self.height)
    }
}

/// How every ffprobe and ffmpeg run opens the input: local files only (no network, no
/// `concat`/`subfile` indirection to other files or protocols), with the demuxer of the sniffed
/// container.
pub fn input_args(demuxer: &str, input: &Path) -> Vec<OsString> {
    let mut a: Vec<OsString> = ["-protocol_whitelist", "file,pipe", "-f", demuxer, "-i"]
        .map(OsString::from)
        .into();
    a.push(input.into());
    a
}

/// Runs ffprobe on `input` (under a fixed time limit: it reads headers only).
pub fn run(
    settings: &VideoSettings,
    input: &Path,
    container: Container,
    log: &Path,
    cancel: &CancellationToken,
) -> Result<VideoProbe, MediaError> {
    let mut cmd = Command::new(&settings.ffprobe);
    cmd.current_dir(log.parent().unwrap_or(Path::new(".")))
        .args(["-v", "error", "-print_format", "json"])
        .args(["-show_format", "-show_streams"])
        .args(input_args(container.demuxer(), input));
    let mut json = String::new();
    child::run(cmd, log, Duration::from_secs(30), cancel, &mut |l| {
        json.push_str(l);
        json.push('\n');
    })
    .map_err(|e| match e {
        ChildError::Failed { stderr, .. } => {
            MediaError::Corrupt(format!("ffprobe cannot read it: {stderr}"))
        }
        ChildError::TimedOut(d) => MediaError::Timeout(d),
        other => MediaError::Transform(other.to_string()),
    })?;
    let v: Value = serde_json::from_str(&json)
        .map_err(|e| MediaError::Corrupt(format!("ffprobe output: {e}")))?;
    let mut probe = VideoProbe {
        demuxer: container.demuxer(),
        ..parse(&v)?
    };
    // What the container may carry (config/ffmpeg-components): the image's ffmpeg decodes
    // nothing else, and no host takes more than the image.
    components::check(container, &probe.video_codec, probe.audio_codec.as_deref())?;
    if probe.duration.is_none() {
        // Neither the stream nor the container says (a WebM written to a pipe, as browsers'
        // MediaRecorder writes them): the video's own timestamps do, read without decoding.
        probe.duration = measured_duration(settings, input, container, log, cancel);
        if let (Some(d), Some(fps), None) = (probe.duration, probe.fps, probe.frames) {
            probe.frames = Some((d.as_secs_f64() * fps).ceil() as u64);
        }
    }
    Ok(probe)
}

/// The video stream's duration from its packets' timestamps (the end of the last one presented),
/// when the file is read to its end within the time limit.
fn measured_duration(
    settings: &VideoSettings,
    input: &Path,
    container: Container,
    log: &Path,
    cancel: &CancellationToken,
) -> Option<Duration> {
    let mut cmd = Command::new(&settings.ffprobe);
    cmd.current_dir(log.parent().unwrap_or(Path::new(".")))
        .args(["-v", "error", "-select_streams", "v:0"])
        .args([
            "-show_entries",
            "packet=pts_time,duration_time",
            "-of",
            "csv=p=0",
        ])
        .args(input_args(container.demuxer(), input));
    let (mut first, mut end) = (f64::INFINITY, 0.0f64);
    child::run(cmd, log, Duration::from_secs(60), cancel, &mut |l| {
        let mut f = l.split(',').map(|x| x.trim().parse::<f64>().ok());
        if let Some(Some(pts)) = f.next() {
            let d = f.next().flatten().unwrap_or(0.0);
            first = first.min(pts);
            end = end.max(pts + d);
        }
    })
    .ok()?;
    let seconds = end - first.min(end);
    (seconds.is_finite() && seconds > 0.0 && seconds < MAX_PLAUSIBLE_SECONDS)
        .then(|| Duration::from_secs_f64(seconds))
}

/// The facts from ffprobe's JSON.
pub fn parse(v: &Value) -> Result<VideoProbe, MediaError> {
    let streams = v["streams"].as_array().cloned().unwrap_or_default();
    let of = |kind: &str| {
        streams.iter().find(|s| {
            s["codec_type"] == kind && s["disposition"]["attached_pic"].as_i64() != Some(1)
        })
    };
    let Some(video) = of("video") else {
        return Err(MediaError::Unsupported(
            "no video stream (an audio-only or data file)".into(),
        ));
    };
    let (w, h) = (u(&video["width"]), u(&video["height"]));
    let (Some(w), Some(h)) = (w, h) else {
        return Err(MediaError::Corrupt(
            "the video stream has no frame size".into(),
        ));
    };
    if w == 0 || h == 0 {
        return Err(MediaError::Corrupt("zero-sized video".into()));
    }
    let rotation = rotation(video);
    let (width, height) = if rotation.rem_euclid(180) == 90 {
        (h as u32, w as u32)
    } else {
        (w as u32, h as u32)
    };
    let transfer = video["color_transfer"].as_str().unwrap_or("");
    let duration = [&video["duration"], &v["format"]["duration"]]
        .into_iter()
        .find_map(|d| d.as_str()?.parse::<f64>().ok())
        .or_else(|| matroska_duration(video))
        .filter(|s| s.is_finite() && *s > 0.0);
    if let Some(s) = duration.filter(|s| *s > MAX_PLAUSIBLE_SECONDS) {
        return Err(MediaError::Corrupt(format!(
            "the container claims a duration of {s:.3e} s"
        )));
    }
    let fps = rate(&video["avg_frame_rate"]).or_else(|| rate(&video["r_frame_rate"]));
    let frames = u(&video["nb_frames"])
        .filter(|n| *n > 0)
        .or_else(|| Some((duration? * fps?).ceil() as u64));
    let duration = duration.map(Duration::from_secs_f64);
    Ok(VideoProbe {
        duration,
        width,
        height,
        rotation,
        fps,
        frames,
        streams: streams.len() as u32,
        demuxer: Container::IsoBmff.demuxer(),
        video_codec: video["codec_name"].as_str().unwrap_or("unknown").to_owned(),
        pix_fmt: video["pix_fmt"].as_str().unwrap_or("").to_owned(),
        audio_codec: of("audio").map(|a| a["codec_name"].as_str().unwrap_or("unknown").to_owned()),
        bitrate: u(&v["format"]["bit_rate"]),
        hdr: matches!(transfer, "smpte2084" | "arib-std-b67"),
    })
}

/// No real video is longer (a century); beyond it a duration is a broken or hostile header, and
/// far beyond it one that `Duration` cannot even hold.
const MAX_PLAUSIBLE_SECONDS: f64 = 100.0 * 365.25 * 86_400.0;

/// Duration, pixel and stream checks before any transcoding.
pub fn check(p: &VideoProbe, limits: &Limits) -> Result<(), MediaError> {
    if let Some(d) = p.duration
        && d.as_secs_f64() > limits.max_video_seconds as f64
    {
        return Err(MediaError::LimitsExceeded(format!(
            "{:.1} s long, over the {} s limit",
            d.as_secs_f64(),
            limits.max_video_seconds
        )));
    }
    let pixels = p.width as u64 * p.height as u64;
    if pixels > limits.max_video_pixels {
        return Err(MediaError::LimitsExceeded(format!(
            "{}x{} is {pixels} pixels per frame, over the {} limit",
            p.width, p.height, limits.max_video_pixels
        )));
    }
    let over = |what: String| Err(MediaError::LimitsExceeded(what));
    if let Some(fps) = p.fps.filter(|f| *f > limits.max_video_fps) {
        return over(format!(
            "{fps} frames/s, over the {} limit",
            limits.max_video_fps
        ));
    }
    if let Some(n) = p.frames.filter(|n| *n > limits.max_video_frames) {
        return over(format!(
            "{n} frames, over the {} limit",
            limits.max_video_frames
        ));
    }
    if p.streams > limits.max_video_streams {
        return over(format!(
            "{} streams, over the {} limit",
            p.streams, limits.max_video_streams
        ));
    }
    Ok(())
}

/// A number ffprobe writes as a JSON number or a string.
fn u(v: &Value) -> Option<u64> {
    v.as_u64().or_else(|| v.as_str()?.parse().ok())
}

/// `30000/1001` → 29.97.
fn rate(v: &Value) -> Option<f64> {
    let (n, d) = v.as_str()?.split_once('/')?;
    let (n, d): (f64, f64) = (n.parse().ok()?, d.parse().ok()?);
    (n > 0.0 && d > 0.0).then(|| (n / d * 1000.0).round() / 1000.0)
}

/// The display matrix's rotation, or the older `rotate` tag.
fn rotation(video: &Value) -> i32 {
    let side = video["side_data_list"].as_array().and_then(|l| {
        l.iter()
            .find_map(|s| s["rotation"].as_f64().map(|r| r.round() as i32))
    });
    side.or_else(|| {
        video["tags"]["rotate"]
            .as_str()?
            .parse::<i32>()
            .ok()
            .map(|r| -r)
    })
    .unwrap_or(0)
}

/// Matroska keeps a stream's duration as a `DURATION` tag (`00:00:05.229000000`).
fn matroska_duration(video: &Value) -> Option<f64> {
    let t = video["tags"]["DURATION"].as_str()?;
    let mut secs = 0.0;
    for part in t.split(':') {
        secs = secs * 60.0 + part.parse::<f64>().ok()?;
    }
    Some(secs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rotation_swaps_the_displayed_size_and_duration_falls_back_to_the_container() {
        let v = json!({
            "streams": [
                {"codec_type": "video", "codec_name": "h264", "width": 640, "height": 480,
                 "pix_fmt": "yuv420p", "avg_frame_rate": "30000/1001",
                 "side_data_list": [{"side_data_type": "Display Matrix", "rotation": -90}]},
                {"codec_type": "audio", "codec_name": "aac"}
            ],
            "format": {"duration": "5.229", "bit_rate": "421000"}
        });
        let p = parse(&v).unwrap();
        assert_eq!((p.width, p.height, p.rotation), (480, 640, -90));
        assert_eq!(p.duration, Some(Duration::from_millis(5229)));
        assert_eq!(p.fps, Some(29.97));
        assert_eq!(p.audio_codec.as_deref(), Some("aac"));
        assert_eq!(p.bitrate, Some(421000));
        assert!(!p.hdr);
    }

    #[test]
    fn audio_only_and_cover_art_are_not_video() {
        let v = json!({"streams": [
            {"codec_type": "audio", "codec_name": "mp3"},
            {"codec_type": "video", "codec_name": "mjpeg", "width": 300, "height": 300,
             "disposition": {"attached_pic": 1}}
        ], "format": {}});
        assert!(matches!(parse(&v), Err(MediaError::Unsupported(_))));
    }

    #[test]
    fn an_absurd_container_duration_is_corrupt_input() {
        for d in ["1e300", "4e12"] {
            let v = json!({"streams": [
                {"codec_type": "video", "codec_name": "h264", "width": 64, "height": 64}
            ], "format": {"duration": d}});
            assert!(matches!(parse(&v), Err(MediaError::Corrupt(_))), "{d}");
        }
    }

    #[test]
    fn matroska_duration_tag_and_limits() {
        let v = json!({"streams": [
            {"codec_type": "video", "codec_name": "vp9", "width": 3840, "height": 2160,
             "color_transfer": "smpte2084", "tags": {"DURATION": "00:10:00.500000000"}}
        ], "format": {}});
        let p = parse(&v).unwrap();
        assert_eq!(p.duration, Some(Duration::from_millis(600_500)));
        assert!(p.hdr);
        let limits = Limits {
            max_input_bytes: 1,
            max_image_pixels: 1,
            max_video_seconds: 600,
            max_video_pixels: 3840 * 2160,
            max_frames: 1,
            max_animation_pixels: 1,
            max_output_file_bytes: 1,
            max_video_fps: 240.0,
            max_video_frames: 600 * 60,
            max_video_streams: 4,
        };
        let e = check(&p, &limits).unwrap_err();
        assert!(matches!(e, MediaError::LimitsExceeded(_)), "{e}");
        let e = check(
            &VideoProbe {
                duration: None,
                width: 4096,
                ..p
            },
            &limits,
        )
        .unwrap_err();
        assert!(e.to_string().contains("pixels"), "{e}");
    }
}
