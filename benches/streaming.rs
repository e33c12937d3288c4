//! What streaming costs. On a 1080p camera-like clip (H.264 High, CABAC, B-frames, 12 Mbit/s,
//! 30 fps, AAC), the whole video job of the `streaming` profile three ways:
//!
//! - **mp4**: the profile's ladder as progressive MP4s only (no stream, storyboard or loudness):
//!   today's ladder;
//! - **stream**: the profile as it is: the same MP4s plus HLS + DASH over CMAF segments, the
//!   storyboard, loudness measured and normalised, all from the one run;
//! - **plain**: the same outputs as a person would script them with ffmpeg: per rung one run
//!   (decode, scale, encode, the MP4 and that rung's segments from the one encode via `tee`),
//!   then one run for the audio's segments (normalised), one for the storyboard and one
//!   loudness measurement.
//!
//! Goals: stream ≤ 1.10 × mp4 (wall time), plain ≥ 1.15 × stream.
//!
//! `--caps` measures the capped ladder instead: on that clip and the corpus videos `--inputs`
//! (comma-separated), the streaming profile's whole job as it was (1080/720/480, rungs
//! uncapped), with the low rungs but uncapped, and as it is (capped, down to 240p); per rung
//! the MP4's bytes and mean SSIM (ffmpeg's `ssim`, against the source scaled to the rung), and
//! the CPU seconds of each job. "Uncapped" is a cap of 1 Gbit/s, which x264 never reaches.
//!
//!   cargo bench --bench streaming [-- --rounds 3 --pool 2 --seconds 20]
//!   cargo bench --bench streaming -- --caps [--inputs moviepy_chaplin.mp4,...]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use media_worker::config::Settings;
use media_worker::media::settings::StreamingFormat;
use media_worker::media::sniff::{self, Sniffed};
use media_worker::media::video::{self, ffprobe, loudness, storyboard, transcode};
use media_worker::media::{self, Control, MediaJob};
use tokio_util::sync::CancellationToken;

#[path = "../tests/common/synthetic.rs"]
#[allow(dead_code)] // the camera-like clip only
mod synthetic;
mod util;

use util::{arg, cpu_seconds};

fn main() {
    let rounds: usize = arg("--rounds", "3").parse().unwrap();
    let pool = arg("--pool", "2");
    let seconds: u32 = arg("--seconds", "20").parse().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let input = synthetic::camera_like_video(tmp.path(), seconds, 1920, 1080);
    let env = std::env::vars().chain([("WORKER_POOL_SIZE".to_owned(), pool.clone())]);
    let settings = Settings::load_from(None, env).unwrap();
    media::init(settings.worker.vips_threads);
    let stream_job = settings.media_job("streaming", None);
    if std::env::args().any(|a| a == "--caps") {
        return caps(&stream_job, &input, rounds, seconds);
    }
    let mut mp4_job = stream_job.clone();
    let p = &mut mp4_job.profile;
    (p.storyboard, p.loudness) = (None, None);
    p.streaming.clear();
    assert_eq!(
        stream_job.profile.streaming,
        [StreamingFormat::Hls, StreamingFormat::Dash]
    );

    let Sniffed::Video(container) = sniff::sniff_file(&input).unwrap() else {
        panic!("not a video");
    };
    let probe = ffprobe::run(
        &stream_job.video,
        &input,
        container,
        &tmp.path().join("probe.log"),
        &CancellationToken::new(),
    )
    .unwrap();
    let rungs = transcode::plan(&stream_job.profile.renditions, &probe);
    println!(
        "{seconds} s 1080p30 camera-like clip, rungs {:?}, ffmpeg -threads {} (pool {pool}), \
         preset {}, {rounds} rounds, wall s / CPU s (user+sys of the process and its children)",
        rungs.iter().map(|r| r.height).collect::<Vec<_>>(),
        stream_job.ffmpeg_threads,
        stream_job.video.preset
    );
    let mut totals = [(0.0, 0.0); 3];
    for round in 0..rounds {
        // Alternating, so that neither side gets the warm caches.
        let order: [usize; 3] = if round % 2 == 0 { [0, 1, 2] } else { [2, 1, 0] };
        for which in order {
            let dir = tmp.path().join(format!("out-{which}"));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let (t, c) = (Instant::now(), cpu_seconds());
            match which {
                0 => whole_job(&mp4_job, &input, container, &dir),
                1 => whole_job(&stream_job, &input, container, &dir),
                _ => plain(&stream_job, &probe, &input, &rungs, &dir),
            }
            totals[which].0 += t.elapsed().as_secs_f64();
            totals[which].1 += cpu_seconds() - c;
        }
    }
    let n = rounds as f64;
    let [mp4, stream, plain] = totals.map(|(w, c)| (w / n, c / n));
    println!("{:<8} {:>8} {:>8}", "", "wall s", "CPU s");
    for (name, (w, c)) in [("mp4", mp4), ("stream", stream), ("plain", plain)] {
        println!("{name:<8} {w:>8.2} {c:>8.2}");
    }
    println!(
        "stream / mp4 = {:.3} (goal <= 1.10); plain / stream = {:.3} (goal >= 1.15); \
         per minute of video: stream {:.1} wall s, {:.1} CPU s",
        stream.0 / mp4.0,
        plain.0 / stream.0,
        stream.0 * 60.0 / seconds as f64,
        stream.1 * 60.0 / seconds as f64,
    );
}

fn whole_job(job: &MediaJob, input: &Path, container: sniff::Container, dir: &Path) {
    let out = video::process(job, input, container, dir, &mut Control::new(&mut |_| {}))
        .unwrap_or_else(|f| panic!("{}", f.error));
    assert!(out.files.iter().any(|f| f.name.starts_with("mp4/")));
}

/// The streaming profile's outputs from plain ffmpeg runs (see the module doc).
fn plain(
    job: &MediaJob,
    probe: &ffprobe::VideoProbe,
    input: &Path,
    rungs: &[media::settings::Rendition],
    dir: &Path,
) {
    let threads = job.ffmpeg_threads.to_string();
    let secs = job.profile.segment_secs;
    let ffmpeg = |args: Vec<String>| {
        let ok = Command::new(&job.video.ffmpeg)
            .args([
                "-hide_banner",
                "-nostdin",
                "-v",
                "error",
                "-y",
                "-threads",
                &threads,
            ])
            .args(ffprobe::input_args(probe.demuxer, input))
            .args(args)
            .current_dir(dir)
            .stdout(Stdio::null())
            .status()
            .unwrap()
            .success();
        assert!(ok, "plain ffmpeg failed");
    };
    // The loudness measurement, as ours does it.
    let spec = job.profile.loudness.unwrap();
    let measured = loudness::measure(
        &job.video,
        probe,
        input,
        &dir.join("loudness.log"),
        std::time::Duration::from_secs(600),
        &CancellationToken::new(),
    )
    .unwrap()
    .unwrap();
    let normalise = loudness::normalise(&measured, &spec).unwrap();
    let rate = transcode::Streaming::new(secs, probe).frame_rate;
    let hls = |name: &str| {
        format!(
            "f=hls:hls_time={secs}:hls_segment_type=fmp4:hls_playlist_type=vod:\
             hls_fmp4_init_filename=init.mp4:\
             hls_segment_options=\\'movflags=+negative_cts_offsets:use_editlist=0\\':\
             hls_segment_filename={name}/seg-%05d.m4s]{name}/index.m3u8"
        )
    };
    for r in rungs {
        let (w, h) = transcode::output_size(probe, r.height);
        let name = format!("{}p", r.height);
        std::fs::create_dir_all(dir.join(&name)).unwrap();
        let mut a: Vec<String> = vec![
            "-map".into(),
            "0:v:0".into(),
            "-vf".into(),
            format!("fps={rate},scale={w}:{h},{}", transcode::to_sdr(probe)),
        ];
        a.extend(
            transcode::video_encoder_args(&job.video, job.ffmpeg_threads, probe, r, None)
                .into_iter()
                .map(|s| s.to_string_lossy().into_owned()),
        );
        a.extend([
            "-force_key_frames".into(),
            format!("expr:gte(t,n_forced*{secs})"),
        ]);
        a.extend([
            "-map".into(),
            "0:a:0".into(),
            "-af".into(),
            normalise.clone(),
        ]);
        a.extend(["-ar", "48000", "-c:a", "aac", "-b:a", "128k", "-ac", "2"].map(String::from));
        a.extend(
            [
                "-flags",
                "+global_header",
                "-map_metadata",
                "-1",
                "-f",
                "tee",
            ]
            .map(String::from),
        );
        a.push(format!(
            "[select=\\'v:0,a\\':f=mp4:movflags=+faststart]{name}.mp4|[select=\\'v:0\\':{}",
            hls(&name)
        ));
        ffmpeg(a);
    }
    std::fs::create_dir_all(dir.join("audio")).unwrap();
    let mut a: Vec<String> = ["-map", "0:a:0", "-af"].map(String::from).into();
    a.push(normalise);
    a.extend(
        [
            "-ar", "48000", "-c:a", "aac", "-b:a", "128k", "-ac", "2", "-f", "tee",
        ]
        .map(String::from),
    );
    a.push(format!("[select=\\'a\\':{}", hls("audio")));
    ffmpeg(a);
    let board = storyboard::plan(job.profile.storyboard.as_ref().unwrap(), probe).unwrap();
    let mut a: Vec<String> = vec![
        "-map".into(),
        "0:v:0".into(),
        "-vf".into(),
        board.filter(transcode::to_sdr(probe)),
    ];
    a.extend(
        board
            .output_args()
            .into_iter()
            .map(|s| s.to_string_lossy().into_owned()),
    );
    ffmpeg(a);
}

/// The `--caps` comparison (see the module doc).
fn caps(job: &MediaJob, clip: &Path, rounds: usize, seconds: u32) {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/corpus");
    let names = arg(
        "--inputs",
        "moviepy_chaplin.mp4,face_recognition_short_hamilton_clip.mp4,rails_rotated_video.mp4",
    );
    let tmp = tempfile::tempdir().unwrap();
    // The worst case: temporal noise, nothing to predict.
    let noise = tmp.path().join("noise.mp4");
    let made = Command::new("ffmpeg")
        .args(["-v", "error", "-y", "-f", "lavfi", "-i"])
        .arg("color=gray:s=1280x720:r=30:d=6,noise=alls=100:allf=t+u")
        .args(["-c:v", "libx264", "-preset", "ultrafast", "-crf", "12"])
        .arg(&noise)
        .status()
        .unwrap();
    assert!(made.success());
    let mut inputs = vec![
        (format!("{seconds} s 1080p clip"), clip.to_owned()),
        ("6 s 720p noise".to_owned(), noise),
    ];
    inputs.extend(names.split(',').map(|n| (n.to_owned(), corpus.join(n))));
    let uncapped = |keep: &dyn Fn(u32) -> bool| {
        let mut j = job.clone();
        j.profile.renditions.retain(|r| keep(r.height));
        for r in &mut j.profile.renditions {
            (r.maxrate_kbps, r.bufsize_kbps) = (Some(1_000_000), Some(2_000_000));
        }
        j
    };
    let variants = [
        ("before", uncapped(&|h| h >= 480)),
        ("low rungs", uncapped(&|_| true)),
        ("capped", job.clone()),
    ];
    println!(
        "{:<44} {:<10} {:>6} {:>10} {:>7} {:>7}",
        "input", "ladder", "rung", "bytes", "SSIM", "CPU s"
    );
    for (name, input) in &inputs {
        let Sniffed::Video(container) = sniff::sniff_file(input).unwrap() else {
            panic!("{name}: not a video");
        };
        for (label, j) in &variants {
            let dir = tmp.path().join("caps");
            let mut cpu = 0.0;
            for _ in 0..rounds.max(1) {
                let _ = std::fs::remove_dir_all(&dir);
                std::fs::create_dir_all(&dir).unwrap();
                let c = cpu_seconds();
                whole_job(j, input, container, &dir);
                cpu += cpu_seconds() - c;
            }
            let cpu = cpu / rounds.max(1) as f64;
            let mut rungs: Vec<u32> = std::fs::read_dir(dir.join("mp4"))
                .unwrap()
                .filter_map(|e| {
                    let n = e.unwrap().file_name().to_string_lossy().into_owned();
                    n.strip_suffix("p.mp4")?.parse().ok()
                })
                .collect();
            rungs.sort_unstable_by(|a, b| b.cmp(a));
            for h in rungs {
                let mp4 = dir.join(format!("mp4/{h}p.mp4"));
                let bytes = std::fs::metadata(&mp4).unwrap().len();
                println!(
                    "{name:<44} {label:<10} {:>6} {bytes:>10} {:>7.4} {cpu:>7.2}",
                    format!("{h}p"),
                    ssim(&mp4, input)
                );
            }
        }
    }
}

/// Mean SSIM (all planes) of a rendition against its source, scaled to the rendition's size
/// (ffmpeg applies the source's rotation). Frames are paired by time: the rendition keeps the
/// source's timeline (a video that starts after its audio, as the Hamilton clip's at 0.85 s,
/// included).
fn ssim(rendition: &Path, source: &Path) -> f64 {
    let graph = "[1:v][0:v]scale2ref=flags=bicubic[src][out];[src]format=yuv420p[s];[out][s]ssim";
    util::ffmpeg_ssim(
        Command::new("ffmpeg")
            .args(["-hide_banner", "-nostdin", "-i"])
            .arg(rendition)
            .arg("-i")
            .arg(source)
            .args(["-lavfi", graph, "-f", "null", "-"]),
        rendition,
    )
}
