//! Streaming outputs through the same `media::process` the worker runs, read back with tools
//! of their own: the playlists with Python's `m3u8` package, the MPD with an XML parser and
//! ffprobe, every segment decoded by ffmpeg, the storyboard compared with the source's frames
//! (ffmpeg's SSIM), loudness measured by ffmpeg's `ebur128`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::stream::{decodes, duration, first_packet, hls, mpd_representations, playable, run};
use common::{corpus, synthetic_video};
use media_worker::config::Settings;
use media_worker::contract::{VideoAnalysis, WarningCode};
use media_worker::media::video::plan;
use media_worker::media::{self, Control, MediaJob, MediaOutput};
use serde_json::Value;

fn job() -> MediaJob {
    media::init(1);
    let settings = Settings::load_from(None, Vec::new()).unwrap();
    settings.media_job("streaming", None)
}

fn process(job: &MediaJob, input: &Path, out: &Path) -> MediaOutput {
    media::process(job, input, out, &mut Control::new(&mut |_| {}))
        .unwrap_or_else(|f| panic!("{}: {:?}", input.display(), f.error))
}

fn analysis(o: &MediaOutput) -> VideoAnalysis {
    o.analysis.as_ref().and_then(|a| a.video()).unwrap().clone()
}

/// SSIM (luma) of two pictures, the second scaled to the first's size.
fn ssim(a: &Path, a_filter: &str, b: &Path, b_filter: &str) -> f64 {
    let out = Command::new("ffmpeg")
        .args(["-hide_banner", "-i"])
        .arg(a)
        .arg("-i")
        .arg(b)
        .args(["-frames:v", "1", "-lavfi"])
        .arg(format!(
            "[0:v]{a_filter},format=gray[a];[1:v]{b_filter},format=gray[b];[b][a]scale2ref[b2][a2];\
             [a2][b2]ssim"
        ))
        .args(["-f", "null", "-"])
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    let all = log
        .rsplit("All:")
        .next()
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or_else(|| panic!("no SSIM in {log}"));
    all.parse().unwrap()
}

/// A 12 s 1280x720 test pattern at 30 fps with a tone, as a phone would record it.
fn clip(dir: &Path) -> PathBuf {
    common::synthetic::camera_like_video(dir, 12, 1280, 720)
}

/// The ladder as a stream: both entry points listed (and no segment), the playlists well
/// formed, every segment decodable, boundaries keyframes at the same times in every rung,
/// durations within the target and summing to the source's, bandwidths at least what the
/// segments need.
#[test]
fn the_ladder_streams_as_hls_and_dash_over_one_set_of_aligned_segments() {
    let dir = tempfile::tempdir().unwrap();
    let src = clip(dir.path());
    let out = dir.path().join("out");
    let job = job();
    let o = process(&job, &src, &out);

    let listed: Vec<(&str, &str)> = o
        .files
        .iter()
        .filter(|f| f.role.listed())
        .map(|f| (f.role.as_str(), f.name.as_str()))
        .collect();
    for entry in [
        ("stream", "hls/master.m3u8"),
        ("stream", "hls/manifest.mpd"),
        ("storyboard", "storyboard.webp"),
        ("storyboard", "storyboard.vtt"),
        ("rendition", "mp4/720p.mp4"),
        ("rendition", "mp4/480p.mp4"),
        ("rendition", "mp4/360p.mp4"),
        ("rendition", "mp4/234p.mp4"),
    ] {
        assert!(listed.contains(&entry), "{entry:?} not in {listed:?}");
    }
    assert!(
        !listed.iter().any(|(_, n)| n.ends_with(".m4s")),
        "{listed:?}"
    );
    // Every file on disk under hls/ is reported (so it is uploaded), except ffmpeg's own lists.
    let reported: Vec<PathBuf> = o.files.iter().map(|f| f.path.clone()).collect();
    for rung in ["720p", "480p", "360p", "234p", "audio"] {
        for e in std::fs::read_dir(out.join("hls").join(rung)).unwrap() {
            let p = e.unwrap().path();
            let ffmpegs = p.file_name().unwrap() == "ffmpeg.m3u8";
            assert!(
                ffmpegs || reported.contains(&p),
                "{} not reported",
                p.display()
            );
        }
    }

    let stream = out.join("hls");
    let m = hls(&stream.join("master.m3u8"));
    assert_eq!(m["independent_segments"], true);
    let variants = m["variants"].as_array().unwrap();
    let sizes: Vec<&Value> = variants.iter().map(|v| &v["resolution"]).collect();
    // Every rung not above the source, down to 234p.
    assert_eq!(
        sizes,
        [
            &serde_json::json!([1280, 720]),
            &serde_json::json!([854, 480]),
            &serde_json::json!([640, 360]),
            &serde_json::json!([416, 234])
        ]
    );
    let audio = &m["audio"][0]["playlist"];
    let source = duration(&src);
    let frame = 1.0 / 30.0;
    let scratch = tempfile::tempdir().unwrap();
    // Peak bitrate of a playlist's segments, measured from the files.
    let peak = |p: &Value, dir: &Path| -> f64 {
        p["segments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                let bytes = std::fs::metadata(dir.join(s["uri"].as_str().unwrap()))
                    .unwrap()
                    .len();
                bytes as f64 * 8.0 / s["duration"].as_f64().unwrap()
            })
            .fold(0.0, f64::max)
    };
    let audio_peak = peak(audio, &stream.join("audio"));
    let mut boundaries: Vec<Vec<f64>> = Vec::new();
    let mut segment_frames: Vec<Vec<u64>> = Vec::new();
    for v in variants {
        let p = &v["playlist"];
        let uri = v["uri"].as_str().unwrap();
        let rung_dir = stream.join(Path::new(uri).parent().unwrap());
        assert_eq!(v["codecs"].as_str().unwrap().split(',').count(), 2, "{v}");
        assert_eq!(v["frame_rate"], 30.0);
        assert!(v["average_bandwidth"].as_f64().unwrap() <= v["bandwidth"].as_f64().unwrap());
        assert_eq!(
            (&p["independent_segments"], &p["endlist"], &p["init"]),
            (
                &Value::Bool(true),
                &Value::Bool(true),
                &Value::from("init.mp4")
            ),
            "{p}"
        );
        assert_eq!(p["target_duration"], 4, "{uri}");
        let segments = p["segments"].as_array().unwrap();
        let durations: Vec<f64> = segments
            .iter()
            .map(|s| s["duration"].as_f64().unwrap())
            .collect();
        // Every segment within the target (HLS rounds), all but the last a full one.
        for d in &durations {
            assert!(d.round() <= 4.0, "{uri}: {durations:?}");
        }
        for d in &durations[..durations.len() - 1] {
            assert!(*d >= 4.0 - frame, "{uri}: {durations:?}");
        }
        let total: f64 = durations.iter().sum();
        assert!(
            (total - source).abs() <= frame,
            "{uri}: {total} s of segments for a {source} s source"
        );
        let need = peak(p, &rung_dir) + audio_peak;
        assert!(
            v["bandwidth"].as_f64().unwrap() >= need,
            "{uri}: BANDWIDTH {} under the measured peak {need}",
            v["bandwidth"]
        );
        // Every segment decodes, and starts with a keyframe.
        let mut starts = Vec::new();
        let mut counts = Vec::new();
        for s in segments {
            let file = playable(
                &rung_dir,
                "init.mp4",
                s["uri"].as_str().unwrap(),
                scratch.path(),
            );
            counts.push(decodes(&file));
            let (pts, key) = first_packet(&file);
            assert!(key, "{uri} {}: starts without a keyframe", s["uri"]);
            starts.push(pts);
        }
        assert_eq!(counts.iter().sum::<u64>(), 360, "{uri}: 12 s at 30 fps");
        boundaries.push(starts);
        segment_frames.push(counts);
    }
    // A plan of units of one segment each, made from the source's frame times, is this run's
    // cut: a unit per segment, starting at its time, with its frames.
    let (pts, time_base) = frame_times(&src);
    let units = plan::plan(&pts, time_base, 4, 1).unwrap();
    let seconds = |t: i64| (t - pts[0]) as f64 * time_base.num as f64 / time_base.den as f64;
    let planned: Vec<(f64, u64)> = units
        .iter()
        .map(|u| (seconds(u.first_pts), u.frames))
        .collect();
    let cut: Vec<(f64, u64)> = boundaries[0]
        .iter()
        .zip(&segment_frames[0])
        .map(|(t, n)| (t - boundaries[0][0], *n))
        .collect();
    assert_eq!(planned.len(), cut.len(), "{planned:?} {cut:?}");
    for ((a, n), (b, m)) in planned.iter().zip(&cut) {
        assert!((a - b).abs() < 1e-3 && n == m, "{planned:?} {cut:?}");
    }
    // The same boundaries in every rung: a player can switch at any segment.
    assert!(
        boundaries.windows(2).all(|w| w[0] == w[1]),
        "{boundaries:?}"
    );
    for s in audio["segments"].as_array().unwrap() {
        decodes(&playable(
            &stream.join("audio"),
            "init.mp4",
            s["uri"].as_str().unwrap(),
            scratch.path(),
        ));
    }

    // The MPD: well-formed XML whose representations match the master's rungs, and a
    // presentation ffprobe opens with its video and audio.
    let mpd = std::fs::read_to_string(stream.join("manifest.mpd")).unwrap();
    let reps = mpd_representations(&stream.join("manifest.mpd"));
    assert_eq!(reps.len(), 5, "{mpd}");
    assert_eq!(reps[0][..3], ["720p", "1280", "720"]);
    assert_eq!(reps[1][..3], ["480p", "854", "480"]);
    assert_eq!(reps[2][..3], ["360p", "640", "360"]);
    assert_eq!(reps[3][..3], ["234p", "416", "234"]);
    assert_eq!(reps[4][0], "audio");
    let segments = variants[0]["playlist"]["segments"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(
        reps[0][4],
        segments.to_string(),
        "one timeline entry per segment"
    );
    let probe = run(Command::new("ffprobe")
        .args([
            "-v",
            "error",
            "-show_entries",
            "stream=codec_type,width,height",
        ])
        .args(["-of", "csv=p=0"])
        .arg(stream.join("manifest.mpd")));
    for want in [
        "video,1280,720",
        "video,854,480",
        "video,640,360",
        "video,416,234",
        "audio",
    ] {
        assert!(
            probe.lines().any(|l| l.trim_end_matches(',') == want),
            "{probe}"
        );
    }
    assert!((duration(&stream.join("manifest.mpd")) - source).abs() <= 0.1);
}

/// The storyboard: a WebVTT whose every cue points inside the sprite, and the tile of a cue
/// is the source's frame at the cue's start.
#[test]
fn the_storyboard_shows_the_frame_of_each_cue() {
    let dir = tempfile::tempdir().unwrap();
    let src = clip(dir.path());
    let out = dir.path().join("out");
    process(&job(), &src, &out);
    let sprite = out.join("storyboard.webp");
    let size = run(Command::new("ffprobe")
        .args([
            "-v",
            "error",
            "-show_entries",
            "stream=width,height",
            "-of",
            "csv=p=0",
        ])
        .arg(&sprite));
    let (sw, sh) = size.trim().split_once(',').unwrap();
    let (sw, sh): (u32, u32) = (sw.parse().unwrap(), sh.parse().unwrap());
    let vtt = std::fs::read_to_string(out.join("storyboard.vtt")).unwrap();
    assert!(vtt.starts_with("WEBVTT\n"), "{vtt}");
    let mut cues = Vec::new();
    for block in vtt.split("\n\n").skip(1) {
        let mut lines = block.lines();
        let times = lines.next().unwrap();
        let target = lines.next().unwrap();
        let (start, end) = times.split_once(" --> ").unwrap();
        let (file, xywh) = target.split_once("#xywh=").unwrap();
        assert_eq!(file, "storyboard.webp");
        let r: Vec<u32> = xywh.split(',').map(|n| n.parse().unwrap()).collect();
        assert!(
            r[0] + r[2] <= sw && r[1] + r[3] <= sh,
            "{target} outside {sw}x{sh}"
        );
        cues.push((secs(start), secs(end), r));
    }
    // Every 2 s over 12 s, back to back, up to the end.
    assert_eq!(cues.len(), 6, "{vtt}");
    assert!(cues.windows(2).all(|w| w[0].1 == w[1].0));
    assert_eq!(cues[0].0, 0.0);
    assert!((cues[5].1 - duration(&src)).abs() < 0.1);
    for (start, _, r) in &cues {
        let tile = format!("crop={}:{}:{}:{}", r[2], r[3], r[0], r[1]);
        let at = dir.path().join(format!("frame-{start}.png"));
        run(Command::new("ffmpeg")
            .args(["-v", "error", "-y", "-ss", &start.to_string(), "-i"])
            .arg(&src)
            .args(["-frames:v", "1"])
            .arg(&at));
        let s = ssim(&sprite, &tile, &at, "null");
        assert!(s >= 0.9, "tile at {start} s: SSIM {s}");
    }
}

fn secs(t: &str) -> f64 {
    let p: Vec<f64> = t.split(':').map(|x| x.parse().unwrap()).collect();
    p[0] * 3600.0 + p[1] * 60.0 + p[2]
}

/// A tone at -30 LUFS is reported within 0.5 LU, and the outputs' audio measures -16 +- 0.3
/// LUFS (ffmpeg's ebur128 on the MP4 and on the stream's audio segments): a steady program
/// (range 0 LU) is brought there by a gain. The 44.1 kHz source comes out at the 48 kHz the
/// DASH manifest declares.
#[test]
fn loudness_is_reported_and_normalised() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("tone.mp4");
    // A 1 kHz sine at -30 dBFS in both channels is -30 LUFS (EBU Tech 3341).
    let a = "0.0316227766*sin(2*PI*1000*t)";
    run(Command::new("ffmpeg")
        .args(["-v", "error", "-y", "-f", "lavfi", "-i"])
        .arg("testsrc2=size=640x360:rate=25:duration=10")
        .args(["-f", "lavfi", "-i"])
        .arg(format!("aevalsrc={a}|{a}:s=44100:d=10"))
        .args([
            "-c:v",
            "libx264",
            "-preset",
            "ultrafast",
            "-c:a",
            "aac",
            "-b:a",
            "192k",
        ])
        .arg(&src));
    let out = dir.path().join("out");
    let o = process(&job(), &src, &out);
    let l = analysis(&o).loudness.expect("loudness reported");
    assert!((l.integrated_lufs + 30.0).abs() <= 0.5, "{l:?}");
    assert_eq!(l.normalized_to_lufs, Some(-16.0));
    let stream = out.join("hls/audio");
    let mut joined = std::fs::read(stream.join("init.mp4")).unwrap();
    for n in 0..3 {
        joined.extend(std::fs::read(stream.join(format!("seg-0000{n}.m4s"))).unwrap());
    }
    let segments = dir.path().join("audio.mp4");
    std::fs::write(&segments, joined).unwrap();
    for file in [out.join("mp4/360p.mp4"), segments] {
        let measured = integrated(&file);
        assert!(
            (measured + 16.0).abs() <= 0.3,
            "{}: {measured} LUFS",
            file.display()
        );
        let rate = Command::new("ffprobe")
            .args(["-v", "error", "-select_streams", "a:0", "-show_entries"])
            .args(["stream=sample_rate,channels", "-of", "csv=p=0"])
            .arg(&file)
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&rate.stdout).trim(), "48000,2");
    }
}

/// ffmpeg's ebur128 integrated loudness of a file's audio.
fn integrated(path: &Path) -> f64 {
    let out = Command::new("ffmpeg")
        .args(["-hide_banner", "-nostats", "-i"])
        .arg(path)
        .args(["-map", "0:a:0", "-af", "ebur128", "-f", "null", "-"])
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    let summary = log.rsplit("Summary:").next().unwrap();
    let i = summary.split("I:").nth(1).unwrap();
    i.split_whitespace().next().unwrap().parse().unwrap()
}

/// Inputs that are not a plain camera clip still stream: no audio (no audio rendition), shorter
/// than a segment, a variable frame rate (constant-rate segments, no drift), a rotated phone
/// video (upright), an HDR one (tone-mapped SDR, upright).
#[test]
fn awkward_sources_still_stream() {
    let dir = tempfile::tempdir().unwrap();
    let job = job();
    let scratch = tempfile::tempdir().unwrap();

    // Without audio: video only, no audio group, no audio adaptation set.
    let silent = dir.path().join("silent.mp4");
    run(Command::new("ffmpeg")
        .args(["-v", "error", "-y", "-f", "lavfi", "-i"])
        .arg("testsrc2=size=640x360:rate=25:duration=6")
        .args(["-c:v", "libx264", "-preset", "ultrafast"])
        .arg(&silent));
    let out = dir.path().join("silent");
    let o = process(&job, &silent, &out);
    let m = hls(&out.join("hls/master.m3u8"));
    assert_eq!(m["audio"].as_array().unwrap().len(), 0, "{m}");
    assert_eq!(
        m["variants"][0]["codecs"]
            .as_str()
            .unwrap()
            .matches(',')
            .count(),
        0
    );
    assert!(m["variants"][0]["audio"].is_null());
    assert!(!out.join("hls/audio").exists());
    let mpd = std::fs::read_to_string(out.join("hls/manifest.mpd")).unwrap();
    assert!(!mpd.contains("contentType=\"audio\""), "{mpd}");
    assert!(analysis(&o).loudness.is_none() && o.warnings.is_empty());

    // Shorter than one segment: one segment, which plays.
    let short = dir.path().join("short.mp4");
    run(Command::new("ffmpeg")
        .args(["-v", "error", "-y", "-f", "lavfi", "-i"])
        .arg("testsrc2=size=640x360:rate=25:duration=1.5")
        .args(["-f", "lavfi", "-i", "sine=duration=1.5"])
        .args(["-c:v", "libx264", "-preset", "ultrafast", "-c:a", "aac"])
        .arg(&short));
    let out = dir.path().join("short");
    process(&job, &short, &out);
    let m = hls(&out.join("hls/master.m3u8"));
    let segments = m["variants"][0]["playlist"]["segments"].as_array().unwrap();
    assert_eq!(segments.len(), 1, "{m}");
    assert!((segments[0]["duration"].as_f64().unwrap() - 1.5).abs() <= 0.04);
    let rung = out.join("hls/360p");
    assert_eq!(
        decodes(&playable(
            &rung,
            "init.mp4",
            "seg-00000.m4s",
            scratch.path()
        )),
        38,
        "1.5 s at 25 fps, the last frame rounded up"
    );

    // A variable frame rate: frames 1/30 s or 1/10 s apart by turns.
    let vfr = dir.path().join("vfr.mp4");
    run(Command::new("ffmpeg")
        .args(["-v", "error", "-y", "-f", "lavfi", "-i"])
        .arg("testsrc2=size=640x360:rate=30:duration=10")
        .args([
            "-vf",
            "select='lt(mod(n,8),5)',setpts=N/(20*TB)+floor(N/5)*0.1/TB",
        ])
        .args([
            "-fps_mode",
            "vfr",
            "-c:v",
            "libx264",
            "-preset",
            "ultrafast",
        ])
        .arg(&vfr));
    let out = dir.path().join("vfr");
    let o = process(&job, &vfr, &out);
    let a = analysis(&o);
    let rate = a.fps.unwrap();
    let rung = out.join("hls/360p");
    let m = hls(&out.join("hls/master.m3u8"));
    let durations: Vec<f64> = m["variants"][0]["playlist"]["segments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["duration"].as_f64().unwrap())
        .collect();
    let total: f64 = durations.iter().sum();
    assert!(
        (total - duration(&vfr)).abs() <= 1.0 / rate,
        "{total} vs {}: {durations:?}",
        duration(&vfr)
    );
    // Every frame of every segment lasts the same.
    let file = playable(&rung, "init.mp4", "seg-00001.m4s", scratch.path());
    let csv = run(Command::new("ffprobe")
        .args(["-v", "error", "-select_streams", "v:0"])
        .args(["-show_entries", "packet=duration_time", "-of", "csv=p=0"])
        .arg(&file));
    let lengths: Vec<&str> = csv.lines().collect();
    assert!(lengths.windows(2).all(|w| w[0] == w[1]), "{lengths:?}");

    // A rotated phone video and an HDR one: every rung upright, SDR.
    for (name, w, h) in [
        ("rails_rotated_video.mp4", 480, 640),
        ("rails_rotated_hdr_video.mov", 1080, 1920),
    ] {
        let out = dir.path().join(name);
        process(&job, &corpus(name), &out);
        let m = hls(&out.join("hls/master.m3u8"));
        assert_eq!(
            m["variants"][0]["resolution"],
            serde_json::json!([w, h]),
            "{name}"
        );
        let rung = out.join(format!("hls/{}p", w.min(h)));
        let file = playable(&rung, "init.mp4", "seg-00000.m4s", scratch.path());
        let s = run(Command::new("ffprobe")
            .args(["-v", "error", "-select_streams", "v:0"])
            .args([
                "-show_entries",
                "stream=width,height,pix_fmt,color_transfer",
            ])
            .args(["-show_entries", "stream_side_data=rotation", "-of", "json"])
            .arg(&file));
        let s: Value = serde_json::from_str(&s).unwrap();
        let s = &s["streams"][0];
        assert_eq!(
            (s["width"].as_u64(), s["height"].as_u64()),
            (Some(w), Some(h)),
            "{name}"
        );
        assert_eq!(s["pix_fmt"], "yuv420p", "{name}");
        assert!(s.get("side_data_list").is_none(), "{name}: {s}");
        assert!(
            !matches!(
                s["color_transfer"].as_str(),
                Some("arib-std-b67" | "smpte2084")
            ),
            "{name}: {s}"
        );
    }
}

/// A run told that the top rung landed encodes only the others, and its entry points list
/// every rung as an uninterrupted run's do, from the recorded track.
#[test]
fn a_resumed_run_lists_the_landed_rung_in_its_playlists() {
    let dir = tempfile::tempdir().unwrap();
    let src = synthetic_video(dir.path(), 6, 1280, 720);
    let full_dir = dir.path().join("full");
    let full = process(&job(), &src, &full_dir);
    let landed = full
        .tracks
        .iter()
        .find(|t| t.id == media::output::TrackId::Video(720))
        .unwrap()
        .clone();
    let mut resumed_job = job();
    resumed_job.resume = vec![720];
    resumed_job.resumed_tracks = vec![landed];
    let part_dir = dir.path().join("part");
    let part = process(&resumed_job, &src, &part_dir);
    assert!(!part_dir.join("hls/720p").exists() && !part_dir.join("mp4/720p.mp4").exists());
    assert!(part_dir.join("hls/480p/seg-00000.m4s").exists());
    let ids: Vec<_> = part.tracks.iter().map(|t| t.id).collect();
    let made = [480, 360, 234].map(media::output::TrackId::Video);
    assert_eq!(ids, made);
    // The landed rung's files are where the first run put them (in storage, for the worker).
    let landed_dir = part_dir.join("hls/720p");
    std::fs::create_dir_all(&landed_dir).unwrap();
    for e in std::fs::read_dir(full_dir.join("hls/720p")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), landed_dir.join(e.file_name())).unwrap();
    }
    // The landed rung as the full run lists it (its bandwidths come from its record); the
    // other one re-encoded (scaled from the source, not from the 720p rung: a few bytes off).
    let (p, f) = (
        hls(&part_dir.join("hls/master.m3u8")),
        hls(&full_dir.join("hls/master.m3u8")),
    );
    assert_eq!(p["variants"][0], f["variants"][0]);
    for key in ["uri", "resolution", "codecs", "frame_rate", "audio"] {
        assert_eq!(p["variants"][1][key], f["variants"][1][key], "{key}");
    }
    let reps = |d: &Path| {
        let mpd = std::fs::read_to_string(d.join("hls/manifest.mpd")).unwrap();
        mpd.lines()
            .filter(|l| l.contains("<Representation id=\"720p\"") || l.contains("<S "))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(reps(&part_dir), reps(&full_dir));
    assert!(
        !part
            .warnings
            .iter()
            .any(|w| w.code == WarningCode::StoryboardFailed)
    );
}

/// The presentation times of a file's video frames, ascending, and their time base.
fn frame_times(path: &Path) -> (Vec<i64>, plan::TimeBase) {
    let probe = |entries: &str| {
        run(Command::new("ffprobe")
            .args([
                "-v",
                "error",
                "-select_streams",
                "v:0",
                "-show_entries",
                entries,
            ])
            .args(["-of", "csv=p=0"])
            .arg(path))
    };
    let tb = probe("stream=time_base");
    let (num, den) = tb.trim().split_once('/').unwrap();
    let time_base = plan::TimeBase {
        num: num.parse().unwrap(),
        den: den.parse().unwrap(),
    };
    let mut pts: Vec<i64> = probe("packet=pts")
        .lines()
        .map(|l| l.trim_end_matches(',').parse().unwrap())
        .collect();
    pts.sort_unstable();
    (pts, time_base)
}

/// The video bits of a playable segment and the time they cover: ffprobe's packet sizes and
/// durations.
fn video_bits(path: &Path) -> (f64, f64) {
    let lines = run(Command::new("ffprobe")
        .args(["-v", "error", "-select_streams", "v:0"])
        .args(["-show_entries", "packet=size,duration_time"])
        .args(["-of", "compact=p=0"])
        .arg(path));
    // `duration_time=0.033333|size=1234`, in ffprobe's order.
    lines.lines().fold((0.0, 0.0), |(bits, secs), line| {
        let field = |name: &str| -> f64 {
            let f = line.split('|').find_map(|f| f.strip_prefix(name));
            f.and_then(|v| v.strip_prefix('=')?.parse().ok())
                .unwrap_or_else(|| panic!("{name} in {line}"))
        };
        (bits + field("size") * 8.0, secs + field("duration_time"))
    })
}

/// Capped rungs, on the worst case: temporal noise (nothing to predict, every frame new). Each
/// segment of each rung keeps to what its rung's rate control allows, `maxrate x d + bufsize`
/// bits for d seconds (the VBV's bound: at most a full buffer above the peak rate), so its
/// bitrate is at most the cap x (1 + bufsize / (maxrate x d)); and the caps bind (uncapped CRF
/// makes several times more of noise), so the check can fail.
#[test]
fn every_segment_of_a_noise_video_keeps_to_its_rungs_cap() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("noise.mp4");
    run(Command::new("ffmpeg")
        .args(["-v", "error", "-y", "-f", "lavfi", "-i"])
        .arg("color=gray:s=1280x720:r=30:d=6,noise=alls=100:allf=t+u")
        .args(["-c:v", "libx264", "-preset", "ultrafast", "-crf", "12"])
        .arg(&src));
    let job = job();
    let out = dir.path().join("out");
    process(&job, &src, &out);
    let m = hls(&out.join("hls/master.m3u8"));
    let variants = m["variants"].as_array().unwrap();
    assert_eq!(variants.len(), 4, "720p down to 234p: {m}");
    let scratch = tempfile::tempdir().unwrap();
    for v in variants {
        let uri = v["uri"].as_str().unwrap();
        let height = v["resolution"][1].as_u64().unwrap() as u32;
        let rung = job
            .profile
            .renditions
            .iter()
            .find(|r| r.height == height)
            .unwrap();
        let maxrate = rung.maxrate() as f64 * 1000.0;
        let bufsize = rung.bufsize() as f64 * 1000.0;
        let rung_dir = out.join("hls").join(Path::new(uri).parent().unwrap());
        let (mut all_bits, mut all_secs) = (0.0, 0.0);
        for s in v["playlist"]["segments"].as_array().unwrap() {
            let name = s["uri"].as_str().unwrap();
            let file = playable(&rung_dir, "init.mp4", name, scratch.path());
            let (bits, secs) = video_bits(&file);
            let tolerance = 1.0 + bufsize / (maxrate * secs);
            assert!(
                bits / secs <= maxrate * tolerance,
                "{uri} {name}: {:.0} kbit/s over {secs} s, cap {} kbit/s x {tolerance:.2}",
                bits / secs / 1000.0,
                rung.maxrate()
            );
            (all_bits, all_secs) = (all_bits + bits, all_secs + secs);
        }
        // BANDWIDTH (the peak segment's file rate; no audio here) keeps the same promise, a
        // few % of fragment headers aside.
        let shortest = v["playlist"]["segments"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["duration"].as_f64().unwrap())
            .fold(f64::INFINITY, f64::min);
        let promise = (maxrate + bufsize / shortest) * 1.05;
        let bandwidth = v["bandwidth"].as_f64().unwrap();
        assert!(
            bandwidth <= promise,
            "{uri}: BANDWIDTH {bandwidth} over {promise}"
        );
        let mean = all_bits / all_secs;
        assert!(
            mean >= 0.5 * maxrate,
            "{uri}: {:.0} kbit/s: the cap of {} kbit/s does not bind on noise",
            mean / 1000.0,
            rung.maxrate()
        );
    }
}

/// A 360p source streams adaptively: the ladder reaches below it (360p and 234p), never above.
#[test]
fn a_360p_source_gets_more_than_one_variant() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    process(&job(), &corpus("moviepy_chaplin.mp4"), &out);
    let m = hls(&out.join("hls/master.m3u8"));
    let variants = m["variants"].as_array().unwrap();
    let sizes: Vec<&Value> = variants.iter().map(|v| &v["resolution"]).collect();
    assert_eq!(
        sizes,
        [
            &serde_json::json!([640, 360]),
            &serde_json::json!([416, 234])
        ],
        "{m}"
    );
    assert!(
        variants[0]["bandwidth"].as_u64() > variants[1]["bandwidth"].as_u64(),
        "{m}"
    );
}
