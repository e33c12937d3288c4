//! The worker's transcode against plain ffmpeg with identical arguments, on the same files:
//! what our child-process handling (process group, progress pipe, time limit, the rendition's
//! ffprobe) costs, as a ratio of wall times (goal ≤ 1.05).
//!
//!   cargo bench --bench video [-- --rounds 3]
//!
//! Inputs: the corpus videos plus a generated 20 s 1080p clip (short clips are dominated by
//! process start-up, a long one by encoding). Rounds alternate ours/plain to spread drift.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use media_worker::config::Settings;
use media_worker::media::Control;
use media_worker::media::sniff::{self, Sniffed};
use media_worker::media::video::{self, Rung, ffprobe, transcode};
use tokio_util::sync::CancellationToken;

#[path = "../tests/common/synthetic.rs"]
mod synthetic;
mod util;

use util::arg;

const CORPUS_VIDEOS: &[&str] = &[
    "face_recognition_short_hamilton_clip.mp4",
    "moviepy_chaplin.mp4",
    "rails_rotated_hdr_video.mov",
    "rails_rotated_video.mp4",
    "rails_video.webm",
];

fn main() {
    let rounds: usize = arg("--rounds", "3").parse().unwrap();
    let corpus = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/corpus");
    let tmp = tempfile::tempdir().unwrap();
    let mut inputs: Vec<PathBuf> = CORPUS_VIDEOS.iter().map(|f| corpus.join(f)).collect();
    inputs.push(synthetic::synthetic_video(tmp.path(), 20, 1920, 1080));

    let env = std::env::vars().chain([("WORKER_POOL_SIZE".to_owned(), "1".to_owned())]);
    let settings = Settings::load_from(None, env).unwrap();
    let job = settings.media_job("default", None);
    println!(
        "ffmpeg -threads {} (pool 1), preset {}, {rounds} rounds",
        job.ffmpeg_threads, job.video.preset
    );
    println!(
        "{:<44} {:>5} {:>9} {:>9} {:>7}",
        "input", "rung", "ours s", "plain s", "ratio"
    );
    let (mut all_ours, mut all_plain) = (Duration::ZERO, Duration::ZERO);
    for input in &inputs {
        let work = tmp.path().join("work");
        std::fs::create_dir_all(&work).unwrap();
        let Sniffed::Video(container) = sniff::sniff_file(input).unwrap() else {
            panic!("{} is not a video", input.display());
        };
        let probe = ffprobe::run(
            &job.video,
            input,
            container,
            &work.join("p.log"),
            &CancellationToken::new(),
        )
        .unwrap();
        for rendition in transcode::plan(&job.profile.renditions, &probe) {
            let rung = Rung {
                rendition,
                time_limit: Duration::from_secs(600),
                progress_share: (0.0, 1.0),
            };
            let (mut ours, mut plain) = (Duration::ZERO, Duration::ZERO);
            for _ in 0..rounds {
                let out = tmp.path().join("ours");
                let t = Instant::now();
                let mut ctl_events = |_| {};
                video::transcode_rung(
                    &job,
                    &probe,
                    &rung,
                    input,
                    &out,
                    &work,
                    &mut Control::new(&mut ctl_events),
                )
                .unwrap();
                ours += t.elapsed();

                let file = tmp.path().join("plain.mp4");
                let args = transcode::args(
                    &job.video,
                    job.ffmpeg_threads,
                    &probe,
                    &rendition,
                    input,
                    &file,
                );
                let t = Instant::now();
                let ok = Command::new(&job.video.ffmpeg)
                    .args(args)
                    .stdout(Stdio::null())
                    .status()
                    .unwrap()
                    .success();
                plain += t.elapsed();
                assert!(ok);
            }
            all_ours += ours;
            all_plain += plain;
            let name = input.file_name().unwrap().to_string_lossy();
            println!(
                "{name:<44} {:>5} {:>9.3} {:>9.3} {:>7.3}",
                format!("{}p", rendition.height),
                ours.as_secs_f64() / rounds as f64,
                plain.as_secs_f64() / rounds as f64,
                ours.as_secs_f64() / plain.as_secs_f64()
            );
        }
    }
    println!(
        "total: ours {:.2} s, plain {:.2} s, ratio {:.3} (goal <= 1.05)",
        all_ours.as_secs_f64(),
        all_plain.as_secs_f64(),
        all_ours.as_secs_f64() / all_plain.as_secs_f64()
    );
}
