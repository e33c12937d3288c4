//! Video through the same `media::process` the worker runs: corpus videos and generated ones,
//! outputs checked with ffprobe.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{corpus, processes_mentioning, synthetic_video};
use media_worker::config::Settings;
use media_worker::contract::Stage;
use media_worker::contract::VideoAnalysis;
use media_worker::media::{self, Control, Event, MediaError, MediaFailure, MediaOutput};
use serde_json::Value;

fn settings(env: &[(&str, &str)]) -> Settings {
    let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string()));
    Settings::load_from(None, env).unwrap()
}

fn run(settings: &Settings, input: &Path, out: &Path) -> Result<MediaOutput, MediaFailure> {
    media::init(1);
    let job = settings.media_job("default", None);
    media::process(&job, input, out, &mut Control::new(&mut |_| {}))
}

fn ok(input: &Path, out: &Path) -> (MediaOutput, VideoAnalysis) {
    let o = run(&settings(&[]), input, out)
        .unwrap_or_else(|f| panic!("{}: {:?}", input.display(), f.error));
    let a = o.analysis.as_ref().and_then(|a| a.video()).unwrap().clone();
    (o, a)
}

/// ffprobe's view of a file's first video stream.
fn stream(path: &Path) -> Value {
    let out = Command::new("ffprobe")
        .args(["-v", "error", "-print_format", "json", "-show_streams"])
        .arg(path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", path.display());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let streams = v["streams"].as_array().unwrap().clone();
    let video = streams.iter().find(|s| s["codec_type"] == "video").unwrap();
    let mut video = video.clone();
    video["audio_streams"] = streams
        .iter()
        .filter(|s| s["codec_type"] == "audio")
        .count()
        .into();
    video
}

/// The renditions, each checked against ffprobe: the size and duration the response will
/// report are the file's own.
fn renditions(o: &MediaOutput) -> Vec<(String, PathBuf, u32, u32)> {
    let r: Vec<_> = o.files.iter().filter(|f| f.role == "rendition").collect();
    for f in &r {
        let s = stream(&f.path);
        assert_eq!(
            (s["width"].as_u64(), s["height"].as_u64()),
            (Some(f.width as u64), Some(f.height as u64)),
            "{}",
            f.name
        );
        let probed: f64 = s["duration"].as_str().unwrap().parse().unwrap();
        let reported = f.duration_ms.unwrap() as f64 / 1000.0;
        assert!(
            (probed - reported).abs() < 0.25,
            "{}: {probed} vs {reported}",
            f.name
        );
    }
    r.iter()
        .map(|f| (f.name.clone(), f.path.clone(), f.width, f.height))
        .collect()
}

/// Upright, SDR, browser-playable H.264: what every rendition must be.
fn assert_plain_h264(path: &Path) -> Value {
    let s = stream(path);
    assert_eq!(s["codec_name"], "h264", "{}", path.display());
    assert_eq!(s["pix_fmt"], "yuv420p", "{}", path.display());
    let rotated = s["side_data_list"].as_array().is_some_and(|l| {
        l.iter()
            .any(|d| d["rotation"].as_f64().unwrap_or(0.0) != 0.0)
    });
    assert!(!rotated, "{} keeps a rotation tag: {s}", path.display());
    s
}

#[test]
fn rotated_phone_video_becomes_upright_portrait() {
    let out = tempfile::tempdir().unwrap();
    let (o, a) = ok(&corpus("rails_rotated_video.mp4"), out.path());
    assert_eq!((a.width, a.height, a.rotation), (480, 640, -90));
    assert_eq!((a.video_codec.as_str(), a.has_audio), ("h264", true));
    let r = renditions(&o);
    // 480 px is the short side: only the 480p rung fits, and nothing is upscaled to 720p.
    assert_eq!(r.len(), 1, "{r:?}");
    let (name, path, w, h) = &r[0];
    assert_eq!((name.as_str(), *w, *h), ("mp4/480p.mp4", 480, 640));
    let s = assert_plain_h264(path);
    assert_eq!(
        (s["width"].as_u64(), s["height"].as_u64()),
        (Some(480), Some(640))
    );
    assert_eq!(s["audio_streams"], 1);
    let f = o.files.iter().find(|f| f.role == "rendition").unwrap();
    let ms = f.duration_ms.unwrap();
    assert!((4500..6000).contains(&ms), "duration {ms} ms");
    // The poster is upright too.
    let poster = o
        .files
        .iter()
        .find(|f| f.name == "poster/480w.jpg")
        .unwrap();
    assert_eq!((poster.width, poster.height), (480, 640));
}

#[test]
fn iphone_hdr_hevc_becomes_sdr_h264_without_rotation() {
    let out = tempfile::tempdir().unwrap();
    let (o, a) = ok(&corpus("rails_rotated_hdr_video.mov"), out.path());
    assert!(a.hdr && !a.has_audio, "{a:?}");
    assert_eq!(
        (a.width, a.height, a.video_codec.as_str()),
        (1080, 1920, "hevc")
    );
    let r = renditions(&o);
    let sizes: Vec<(u32, u32)> = r.iter().map(|x| (x.2, x.3)).collect();
    assert_eq!(sizes, [(720, 1280), (480, 854)]);
    for (_, path, _, _) in &r {
        let s = assert_plain_h264(path);
        assert_eq!(s["color_transfer"], "bt709", "tone-mapped: {s}");
        assert_eq!(s["audio_streams"], 0, "no audio in, none out");
    }
}

#[test]
fn vp9_webm_without_stream_duration_is_transcoded() {
    let out = tempfile::tempdir().unwrap();
    let (o, a) = ok(&corpus("rails_video.webm"), out.path());
    assert_eq!(
        (a.video_codec.as_str(), a.audio_codec.as_deref()),
        ("vp9", Some("opus"))
    );
    assert_eq!(a.duration_ms, Some(5229), "the container's duration");
    let r = renditions(&o);
    assert_eq!(r.len(), 1);
    let s = assert_plain_h264(&r[0].1);
    assert_eq!(s["audio_streams"], 1, "Opus became AAC");
    assert!(o.warnings.is_empty(), "{:?}", o.warnings);
    assert!(
        o.files
            .iter()
            .any(|f| f.name == "poster/thumb_256x256.webp")
    );
}

#[test]
fn audio_only_mp4_is_unsupported() {
    let out = tempfile::tempdir().unwrap();
    let f = run(
        &settings(&[]),
        &corpus("rails_video_without_video_stream.mp4"),
        out.path(),
    )
    .unwrap_err();
    assert_eq!(f.stage, Stage::Probe);
    assert!(
        matches!(f.error, MediaError::Unsupported(_)),
        "{:?}",
        f.error
    );
}

#[test]
fn truncated_videos_are_corrupt_input() {
    let dir = tempfile::tempdir().unwrap();
    let clip = std::fs::read(corpus("face_recognition_short_hamilton_clip.mp4")).unwrap();
    // The corpus file keeps its index (moov) at the end: cut, it is gone.
    let tail = dir.path().join("tail-index.mp4");
    std::fs::write(&tail, &clip[..clip.len() / 2]).unwrap();
    // With the index first (+faststart), the header promises frames the file does not have.
    let faststart = dir.path().join("faststart.mp4");
    let status = Command::new("ffmpeg")
        .args(["-v", "error", "-y", "-i"])
        .arg(corpus("face_recognition_short_hamilton_clip.mp4"))
        .args(["-c", "copy", "-movflags", "+faststart"])
        .arg(&faststart)
        .status()
        .unwrap();
    assert!(status.success());
    let full = std::fs::read(&faststart).unwrap();
    let head = dir.path().join("head-index.mp4");
    std::fs::write(&head, &full[..full.len() / 2]).unwrap();
    for input in [tail, head] {
        let out = tempfile::tempdir().unwrap();
        let f = run(&settings(&[]), &input, out.path()).unwrap_err();
        assert!(
            matches!(f.error, MediaError::Corrupt(_)),
            "{}: {:?}",
            input.display(),
            f.error
        );
    }
}

#[test]
fn progress_and_the_time_limit_are_reported() {
    let out = tempfile::tempdir().unwrap();
    let s = settings(&[]);
    let job = s.media_job("default", None);
    let mut events = Vec::new();
    let mut record = |e: Event| events.push(e);
    media::init(1);
    let input = corpus("face_recognition_short_hamilton_clip.mp4");
    media::process(&job, &input, out.path(), &mut Control::new(&mut record)).unwrap();
    let stages: Vec<Stage> = events
        .iter()
        .filter_map(|e| match e {
            Event::Stage(s) => Some(*s),
            _ => None,
        })
        .collect();
    // The poster is chosen (analyze) from frames of the ladder's run, then made (transform).
    assert_eq!(
        stages,
        [
            Stage::Probe,
            Stage::Transform,
            Stage::Analyze,
            Stage::Transform
        ]
    );
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::TimeLimit(d) if *d >= Duration::from_secs(30)))
    );
    let progress: Vec<f32> = events
        .iter()
        .filter_map(|e| match e {
            Event::Progress(p) => Some(*p),
            _ => None,
        })
        .collect();
    assert!(!progress.is_empty());
    assert!(progress.windows(2).all(|w| w[0] <= w[1]), "{progress:?}");
    assert!(*progress.last().unwrap() > 0.9, "{progress:?}");
    let encoded: f64 = events
        .iter()
        .filter_map(|e| match e {
            Event::Encoded(d) => Some(d.as_secs_f64()),
            _ => None,
        })
        .sum();
    assert!(
        (9.0..11.0).contains(&encoded),
        "encoded {encoded} s of a 10 s clip"
    );
}

#[test]
fn a_timeout_kills_ffmpeg_and_leaves_no_process() {
    let dir = tempfile::tempdir().unwrap();
    let input = synthetic_video(dir.path(), 30, 1280, 720);
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    // 30 s of 720p at `veryslow` takes far longer than 1 s + 0.01 s per second of video.
    let s = settings(&[
        ("FFMPEG_PRESET", "veryslow"),
        ("VIDEO_TIMEOUT_BASE_SECS", "1"),
        ("VIDEO_TIMEOUT_PER_SECOND", "0.01"),
    ]);
    let f = run(&s, &input, &out).unwrap_err();
    assert_eq!(f.stage, Stage::Transform);
    assert!(matches!(f.error, MediaError::Timeout(_)), "{:?}", f.error);
    // Killed mid-run: the rendition was never finished (no index written).
    let partial = out.join("mp4/720p.mp4");
    let complete = Command::new("ffprobe")
        .args(["-v", "error"])
        .arg(&partial)
        .status()
        .is_ok_and(|s| s.success());
    assert!(!complete, "ffmpeg ran to completion despite the limit");
    let left = processes_mentioning(&out.display().to_string());
    assert!(left.is_empty(), "processes left behind: {left:?}");
}

#[test]
fn a_failed_poster_degrades_the_job() {
    let dir = tempfile::tempdir().unwrap();
    // Fault injection: an ffmpeg whose poster frames come out unreadable (the renditions of the
    // same run are fine).
    let shim = dir.path().join("ffmpeg");
    std::fs::write(
        &shim,
        "#!/bin/sh\nffmpeg \"$@\"; rc=$?\nfor f in .work/frame-*.png; do echo 'injected failure' > \"$f\"; done\nexit $rc\n",
    )
    .unwrap();
    let mut perms = std::fs::metadata(&shim).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&shim, perms).unwrap();
    let mut s = settings(&[]);
    s.video.ffmpeg = shim;
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let o = run(&s, &corpus("rails_video.webm"), &out).unwrap();
    assert_eq!(
        o.warnings
            .iter()
            .map(|w| w.code.as_str())
            .collect::<Vec<_>>(),
        ["poster_failed"]
    );
    assert!(!o.warnings[0].message.is_empty(), "{:?}", o.warnings);
    assert_eq!(renditions(&o).len(), 1, "the video still ships");
    assert!(o.files.iter().all(|f| f.role != "poster"));
    let a = o.analysis.as_ref().and_then(|a| a.video()).unwrap();
    assert_eq!(a.poster_time_ms, None);
}

#[test]
fn a_webm_without_any_duration_is_transcoded() {
    let dir = tempfile::tempdir().unwrap();
    // Written to a pipe, the WebM muxer cannot go back to record the duration (as with
    // browser MediaRecorder uploads).
    let input = dir.path().join("no-duration.webm");
    let out = Command::new("ffmpeg")
        .args(["-v", "error", "-f", "lavfi", "-i"])
        .arg("testsrc2=size=640x360:rate=25:duration=4")
        .args([
            "-c:v",
            "libvpx-vp9",
            "-deadline",
            "realtime",
            "-cpu-used",
            "8",
        ])
        .args(["-f", "webm", "pipe:1"])
        .output()
        .unwrap();
    assert!(out.status.success());
    std::fs::write(&input, out.stdout).unwrap();
    let out_dir = dir.path().join("out");
    let (o, a) = ok(&input, &out_dir);
    // The file does not say: measured from its timestamps (100 frames at 25 fps).
    assert_eq!(a.duration_ms, Some(4000));
    assert!(o.warnings.is_empty(), "{:?}", o.warnings);
    assert!(!a.has_audio);
    let r = renditions(&o);
    assert_eq!(r.len(), 1);
    assert_plain_h264(&r[0].1);
    assert!(
        a.poster_time_ms.is_some(),
        "a poster from the first seconds"
    );
}

#[test]
fn videos_over_the_limits_are_rejected_before_transcoding() {
    let out = tempfile::tempdir().unwrap();
    let clip = corpus("face_recognition_short_hamilton_clip.mp4");
    for (key, value, what) in [
        ("MAX_VIDEO_SECONDS", "5", "s limit"),
        ("MAX_VIDEO_PIXELS", "100000", "pixels per frame"),
    ] {
        let f = run(&settings(&[(key, value)]), &clip, out.path()).unwrap_err();
        assert_eq!(f.stage, Stage::Probe);
        assert!(
            matches!(&f.error, MediaError::LimitsExceeded(m) if m.contains(what)),
            "{key}: {:?}",
            f.error
        );
        assert!(
            std::fs::read_dir(out.path()).unwrap().next().is_none(),
            "nothing written"
        );
    }
}

/// A 2-second 320x240 test pattern at 25 fps with a tone, made by the host's ffmpeg into
/// `name` with `args` (codecs and muxer).
fn made_with_ffmpeg(dir: &Path, name: &str, args: &[&str]) -> PathBuf {
    let out = dir.join(name);
    let made = Command::new("ffmpeg")
        .args(["-v", "error", "-y", "-f", "lavfi", "-i"])
        .arg("testsrc2=size=320x240:rate=25:duration=2")
        .args([
            "-f",
            "lavfi",
            "-i",
            "sine=frequency=440:sample_rate=48000:duration=2",
        ])
        .args(args)
        .arg(&out)
        .status()
        .unwrap();
    assert!(made.success(), "ffmpeg could not make {name}");
    out
}

/// The start times of a file's first video and audio streams, as ffprobe reads them.
fn starts(path: &Path) -> Option<(f64, f64)> {
    let out = Command::new("ffprobe")
        .args(["-v", "error", "-print_format", "json", "-show_streams"])
        .arg(path)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let start = |kind: &str| {
        v["streams"]
            .as_array()?
            .iter()
            .find(|s| s["codec_type"] == kind)?["start_time"]
            .as_str()?
            .parse::<f64>()
            .ok()
    };
    Some((start("video")?, start("audio")?))
}

/// What people upload besides MP4, WebM and AVI, one file per container and codec family:
/// camcorders' and screen recorders' MPEG-TS (188-byte and `.m2ts` 192-byte packets), DVD's
/// MPEG-2 program stream, Flash Video, Windows Media, MXF, Ogg Theora. Each is transcoded,
/// every frame kept (the renditions' frames counted by ffprobe, which decodes them).
#[test]
fn uploads_in_every_stream_container_are_transcoded() {
    let dir = tempfile::tempdir().unwrap();
    let h264_aac = ["-c:v", "libx264", "-preset", "ultrafast", "-c:a", "aac"];
    let cases: [(&str, Vec<&str>, &str, &str); 7] = [
        (
            "camera.ts",
            [&h264_aac[..], &["-f", "mpegts"]].concat(),
            "h264",
            "aac",
        ),
        (
            "camcorder.m2ts",
            [&h264_aac[..], &["-f", "mpegts", "-mpegts_m2ts_mode", "1"]].concat(),
            "h264",
            "aac",
        ),
        (
            "dvd.vob",
            vec!["-c:v", "mpeg2video", "-c:a", "mp2", "-f", "vob"],
            "mpeg2video",
            "mp2",
        ),
        (
            "flash.flv",
            [&h264_aac[..], &["-f", "flv"]].concat(),
            "h264",
            "aac",
        ),
        (
            "windows.wmv",
            vec!["-c:v", "wmv2", "-c:a", "wmav2", "-f", "asf"],
            "wmv2",
            "wmav2",
        ),
        (
            "broadcast.mxf",
            vec!["-c:v", "mpeg2video", "-c:a", "pcm_s16le", "-f", "mxf"],
            "mpeg2video",
            "pcm_s16le",
        ),
        (
            "open.ogv",
            vec!["-c:v", "libtheora", "-c:a", "libvorbis", "-f", "ogg"],
            "theora",
            "vorbis",
        ),
    ];
    for (name, args, video, audio) in cases {
        let input = made_with_ffmpeg(dir.path(), name, &args);
        let out = tempfile::tempdir().unwrap();
        let (o, a) = ok(&input, out.path());
        assert_eq!(
            (
                a.video_codec.as_str(),
                a.audio_codec.as_deref(),
                a.width,
                a.height
            ),
            (video, Some(audio), 320, 240),
            "{name}"
        );
        let r = renditions(&o);
        assert!(!r.is_empty(), "{name}: no rendition");
        for (rendition, path, _, _) in &r {
            let s = assert_plain_h264(path);
            assert_eq!(s["audio_streams"], 1, "{name} {rendition}");
            let frames = Command::new("ffprobe")
                .args(["-v", "error", "-count_frames", "-select_streams", "v:0"])
                .args(["-show_entries", "stream=nb_read_frames", "-of", "csv=p=0"])
                .arg(path)
                .output()
                .unwrap();
            let frames: i64 = String::from_utf8_lossy(&frames.stdout)
                .trim()
                .parse()
                .unwrap();
            // Every frame, and one more per frame time by which the muxer started the audio
            // before the video (21 ms in MPEG-TS and FLV, 43 in ASF): the constant-rate
            // rendition shows the first frame from the audio's start, in sync.
            let lead = starts(&input).map_or(0.0, |(v, a)| (v - a).max(0.0));
            let expected = 50 + (lead * 25.0).round() as i64;
            assert_eq!(
                frames, expected,
                "{name} {rendition}: frames (audio leads by {lead} s)"
            );
        }
    }
}
