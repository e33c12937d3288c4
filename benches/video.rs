//! The whole video job (probe, the ladder in one ffmpeg run, the poster) against plain
//! ffmpeg run by hand once per rung (`-vf scale=-2:H`, the same encoder settings, no poster),
//! on the same files. Goal: ours ≥ 1.15× faster over all inputs, with equivalent outputs
//! (same dimensions and duration, SSIM against the source within noise of plain's).
//!
//!   cargo bench --bench video [-- --rounds 3 --pool 2 --clip camera|ultrafast]
//!
//! Inputs: the corpus videos plus a generated 20 s 1080p30 clip encoded as a phone records
//! (H.264 High, CABAC, B-frames, 12 Mbit/s), or with `--clip ultrafast` the cheap-to-decode
//! 25 fps test clip of the tests (the bench's input before the one-run ladder). `--pool 2` gives the ffmpeg
//! thread count of a 2-core worker at pool 2 (one thread). Rounds alternate ours/plain.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use media_worker::config::Settings;
use media_worker::contract::Stage;
use media_worker::media::sniff::{self, Sniffed};
use media_worker::media::video::{self, ffprobe, transcode};
use media_worker::media::{self, Control, Event, MediaJob, ProducedFile};
use tokio_util::sync::CancellationToken;

#[path = "../tests/common/synthetic.rs"]
mod synthetic;
mod util;

use util::{arg, cpu_seconds};

const CORPUS_VIDEOS: &[&str] = &[
    "face_recognition_short_hamilton_clip.mp4",
    "moviepy_chaplin.mp4",
    "rails_rotated_hdr_video.mov",
    "rails_rotated_video.mp4",
    "rails_video.webm",
];

fn main() {
    let rounds: usize = arg("--rounds", "3").parse().unwrap();
    let pool = arg("--pool", "2");
    let corpus = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/corpus");
    let tmp = tempfile::tempdir().unwrap();
    let mut inputs: Vec<PathBuf> = CORPUS_VIDEOS.iter().map(|f| corpus.join(f)).collect();
    inputs.push(match arg("--clip", "camera").as_str() {
        "camera" => synthetic::camera_like_video(tmp.path(), 20, 1920, 1080),
        "ultrafast" => synthetic::synthetic_video(tmp.path(), 20, 1920, 1080),
        other => panic!("--clip camera|ultrafast, not {other}"),
    });

    let env = std::env::vars().chain([("WORKER_POOL_SIZE".to_owned(), pool.clone())]);
    let settings = Settings::load_from(None, env).unwrap();
    media::init(settings.worker.vips_threads);
    let job = settings.media_job("default", None);
    println!(
        "whole job (one run + poster) vs plain per-rung ffmpeg; ffmpeg -threads {} (pool {pool}), \
         preset {}, {rounds} rounds; CPU = user+sys of the process and its children",
        job.ffmpeg_threads, job.video.preset
    );
    println!(
        "{:<42} {:>5} {:>8} {:>8} {:>7} {:>8} {:>8} {:>8} {:>8}",
        "input",
        "rung",
        "ours s",
        "plain s",
        "speedup",
        "ours cpu",
        "plain cpu",
        "ssim ours",
        "ssim plain"
    );
    let (mut all_ours, mut all_plain) = (Duration::ZERO, Duration::ZERO);
    let (mut cpu_ours, mut cpu_plain) = (0.0, 0.0);
    for input in &inputs {
        let name = input.file_name().unwrap().to_string_lossy().into_owned();
        let Sniffed::Video(container) = sniff::sniff_file(input).unwrap() else {
            panic!("{name} is not a video");
        };
        let work = tmp.path().join("probe");
        std::fs::create_dir_all(&work).unwrap();
        let probe = ffprobe::run(
            &job.video,
            input,
            container,
            &work.join("p.log"),
            &CancellationToken::new(),
        )
        .unwrap();
        let rungs = transcode::plan(&job.profile.renditions, &probe);
        let (mut ours, mut plain) = (Duration::ZERO, Duration::ZERO);
        let (mut ours_cpu, mut plain_cpu) = (0.0, 0.0);
        let (ours_dir, plain_dir) = (tmp.path().join("ours"), tmp.path().join("plain"));
        let mut produced = Vec::new();
        // Wall time of ours in: probe, the ladder's run, the poster (scoring and outputs).
        let mut phases = [Duration::ZERO; 3];
        for _ in 0..rounds {
            let _ = std::fs::remove_dir_all(&ours_dir);
            std::fs::create_dir_all(&ours_dir).unwrap();
            let (t, c) = (Instant::now(), cpu_seconds());
            // When each stage started: the run is the first transform, the poster the rest.
            let mut marks = vec![(Stage::Probe, t)];
            let mut events = |e| {
                if let Event::Stage(s) = e {
                    marks.push((s, Instant::now()));
                }
            };
            let out = video::process(
                &job,
                input,
                container,
                &ours_dir,
                &mut Control::new(&mut events),
            )
            .unwrap_or_else(|f| panic!("{name}: {}", f.error));
            marks.push((Stage::Publish, Instant::now()));
            for (i, w) in marks.windows(2).enumerate() {
                phases[i.min(2)] += w[1].1 - w[0].1;
            }
            ours += t.elapsed();
            ours_cpu += cpu_seconds() - c;
            produced = out.files;

            std::fs::create_dir_all(&plain_dir).unwrap();
            let (t, c) = (Instant::now(), cpu_seconds());
            for r in &rungs {
                plain_rung(&job, &probe, input, r, &plain_dir);
            }
            plain += t.elapsed();
            plain_cpu += cpu_seconds() - c;
        }
        let rungs_made: Vec<&ProducedFile> = produced
            .iter()
            .filter(|f| f.name.starts_with("mp4/"))
            .collect();
        assert_eq!(rungs_made.len(), rungs.len(), "{name}: every rung made");
        assert!(
            produced.iter().any(|f| f.name.starts_with("poster/")),
            "{name}: a poster was made"
        );
        let mut ssim = Vec::new();
        for r in &rungs {
            let ours_file = ours_dir.join(format!("mp4/{}p.mp4", r.height));
            let plain_file = plain_dir.join(format!("{}p.mp4", r.height));
            let (a, b) = (shape(&ours_file), shape(&plain_file));
            assert_eq!((a.0, a.1), (b.0, b.1), "{name} {}p: same size", r.height);
            assert!(
                (a.2 - b.2).abs() < 0.1,
                "{name} {}p: same duration ({} / {})",
                r.height,
                a.2,
                b.2
            );
            ssim.push((
                r.height,
                ssim_to_source(&job, &probe, input, &ours_file, (a.0, a.1)),
                ssim_to_source(&job, &probe, input, &plain_file, (a.0, a.1)),
            ));
        }
        all_ours += ours;
        all_plain += plain;
        cpu_ours += ours_cpu;
        cpu_plain += plain_cpu;
        let n = rounds as f64;
        let [p, l, q] = phases.map(|d| d.as_secs_f64() / n);
        println!("  ours: probe {p:.3} s, ladder run {l:.3} s, poster {q:.3} s");
        let rung_list: Vec<String> = rungs.iter().map(|r| r.height.to_string()).collect();
        println!(
            "{name:<42} {:>5} {:>8.3} {:>8.3} {:>7.3} {:>8.2} {:>8.2} {:>8} {:>8}",
            rung_list.join("+"),
            ours.as_secs_f64() / n,
            plain.as_secs_f64() / n,
            plain.as_secs_f64() / ours.as_secs_f64(),
            ours_cpu / n,
            plain_cpu / n,
            ssim.iter()
                .map(|s| format!("{:.4}", s.1))
                .collect::<Vec<_>>()
                .join("/"),
            ssim.iter()
                .map(|s| format!("{:.4}", s.2))
                .collect::<Vec<_>>()
                .join("/"),
        );
    }
    let speedup = all_plain.as_secs_f64() / all_ours.as_secs_f64();
    println!(
        "total: ours {:.2} s ({:.2} CPU s), plain {:.2} s ({:.2} CPU s), speedup {speedup:.3} (goal >= 1.15)",
        all_ours.as_secs_f64(),
        cpu_ours,
        all_plain.as_secs_f64(),
        cpu_plain,
    );
}

/// One rung as a person would run it: one ffmpeg run, `-vf scale`, our encoder settings.
fn plain_rung(
    job: &MediaJob,
    probe: &ffprobe::VideoProbe,
    input: &Path,
    rung: &media_worker::media::settings::Rendition,
    dir: &Path,
) {
    let height = rung.height;
    let scale = if probe.width >= probe.height {
        format!("scale=-2:{height}")
    } else {
        format!("scale={height}:-2")
    };
    let vf = format!("{scale},{}", transcode::to_sdr(probe));
    let threads = job.ffmpeg_threads;
    let mut cmd = Command::new(&job.video.ffmpeg);
    cmd.args(["-hide_banner", "-nostdin", "-v", "error", "-y"])
        .args(["-threads", &threads.to_string()])
        .args(ffprobe::input_args(probe.demuxer, input))
        .args([
            "-map",
            "0:v:0",
            "-map",
            "0:a:0?",
            "-map_metadata",
            "-1",
            "-vf",
            &vf,
        ])
        .args(transcode::video_encoder_args(
            &job.video, threads, probe, rung, None,
        ))
        .args(transcode::audio_encoder_args(&job.video, probe))
        .args(["-movflags", "+faststart", "-f", "mp4"])
        .arg(dir.join(format!("{height}p.mp4")));
    let ok = cmd.stdout(Stdio::null()).status().unwrap().success();
    assert!(ok, "plain ffmpeg failed on {}", input.display());
}

/// (width, height, duration s) of a file's video stream, read back with ffprobe.
fn shape(file: &Path) -> (u32, u32, f64) {
    let out = Command::new("ffprobe")
        .args(["-v", "error", "-select_streams", "v:0", "-show_entries"])
        .args(["stream=width,height:format=duration", "-of", "default=nw=1"])
        .arg(file)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("no {k} for {}: {text}", file.display()))
            .to_owned()
    };
    (
        field("width").parse().unwrap(),
        field("height").parse().unwrap(),
        field("duration").parse().unwrap(),
    )
}

/// ffmpeg's `ssim` of `file` against the upright SDR source scaled to the same size.
fn ssim_to_source(
    job: &MediaJob,
    probe: &ffprobe::VideoProbe,
    input: &Path,
    file: &Path,
    (w, h): (u32, u32),
) -> f64 {
    let graph = format!(
        "[1:v]scale={w}:{h},{}[ref];[0:v][ref]ssim",
        transcode::to_sdr(probe)
    );
    util::ffmpeg_ssim(
        Command::new(&job.video.ffmpeg)
            .args(["-hide_banner", "-nostdin", "-i"])
            .arg(file)
            .args(ffprobe::input_args(probe.demuxer, input))
            .args(["-filter_complex", &graph, "-f", "null", "-"]),
        file,
    )
}
