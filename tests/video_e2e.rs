//! Video end to end: the worker binary against tansu and s3s-fs, and what SIGTERM does to a
//! running transcode.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use media_worker::contract::{MediaType, Status};

const MINUTE: Duration = Duration::from_secs(60);

/// Waits until the worker's job is transcoding and ffmpeg has reported progress.
fn wait_transcoding(worker: &Worker) {
    wait_for("transcode under way", MINUTE, || {
        worker
            .jobs()
            .iter()
            .any(|j| j["stage"] == "transform" && j["progress"].as_f64().unwrap_or(0.0) > 0.0)
            .then_some(())
    });
}

/// A video request: renditions and poster land in S3 under the video keys, the response
/// describes them, and SIGTERM during the transcode lets it finish (drain) before exiting 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn video_job_end_to_end_and_sigterm_drains_the_transcode() {
    let stack = Stack::start(1).await;
    let dir = tempfile::tempdir().unwrap();
    // Long enough (at `medium`) that SIGTERM arrives mid-transcode.
    let video = synthetic_video(dir.path(), 20, 1280, 720);
    stack.upload_file("clip.mp4", &video).await;
    let mut env = stack.worker_env("g-video");
    env.insert("SHUTDOWN_TIMEOUT_SECS".into(), "240".into());
    env.insert("FFMPEG_PRESET".into(), "medium".into());
    let mut worker = Worker::start(&env);
    worker.wait_ready();
    let responses = stack.responses();
    let mut req = request("vid-1", "clip.mp4");
    req.media_type = Some(MediaType::Video);
    stack.send(&req).await;

    wait_transcoding(&worker);
    let encoded = worker.metric("media_worker_video_encoded_seconds_total");
    assert!(
        encoded.is_some_and(|s| s > 0.0),
        "encoded seconds: {encoded:?}"
    );
    worker.sigterm();
    let status = worker.wait_exit(5 * MINUTE);
    assert_eq!(status.code(), Some(0), "{}", worker.log());

    let r = responses.take(1, MINUTE).remove(0).body;
    assert_eq!(r.status, Status::Completed, "{:?}", r.error);
    assert_eq!(r.media_type, Some(MediaType::Video));
    let a = r
        .analysis
        .as_ref()
        .and_then(|a| a.video())
        .expect("video analysis");
    assert_eq!((a.width, a.height, a.has_audio), (1280, 720, true));
    assert_eq!(a.duration_ms, Some(20_000));
    let renditions: Vec<_> = r.outputs.iter().filter(|o| o.role == "rendition").collect();
    let keys: Vec<&str> = renditions.iter().map(|o| o.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "user-1/videos/vid-1/mp4/720p.mp4",
            "user-1/videos/vid-1/mp4/480p.mp4"
        ]
    );
    assert!(
        r.outputs
            .iter()
            .any(|o| o.role == "poster" && o.key == "user-1/videos/vid-1/poster/thumb_256x256.webp")
    );
    let o = renditions[0];
    assert_eq!(
        (o.width, o.height, o.content_type.as_str()),
        (1280, 720, "video/mp4")
    );
    let ms = o.duration_ms.unwrap();
    assert!((19_500..=20_500).contains(&ms), "{ms}");

    // What S3 holds plays: H.264 + AAC, the size the response says.
    let (bytes, content_type, _) = stack.get(OUTPUT_BUCKET, &o.key).await;
    assert_eq!(content_type.as_deref(), Some("video/mp4"));
    assert_eq!(bytes.len() as u64, o.size_bytes);
    let local = dir.path().join("720p.mp4");
    std::fs::write(&local, &bytes).unwrap();
    let probe = Command::new("ffprobe")
        .args([
            "-v",
            "error",
            "-show_entries",
            "stream=codec_name,width,height,pix_fmt",
        ])
        .args(["-of", "csv=p=0"])
        .arg(&local)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&probe.stdout);
    assert!(text.contains("h264,1280,720,yuv420p"), "{text}");
    assert!(text.contains("aac"), "{text}");
    assert_eq!(stack.committed("g-video", 1), vec![1]);
}

/// SIGTERM with a transcode that cannot finish before SHUTDOWN_TIMEOUT_SECS: the job is
/// abandoned (exit 1, offset not committed), ffmpeg is killed with the worker, and the request
/// is redelivered to the next worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_deadline_kills_ffmpeg_and_redelivers() {
    let stack = Stack::start(1).await;
    let dir = tempfile::tempdir().unwrap();
    let video = synthetic_video(dir.path(), 30, 1280, 720);
    stack.upload_file("long.mp4", &video).await;
    let mut env = stack.worker_env("g-video-kill");
    env.insert("SHUTDOWN_TIMEOUT_SECS".into(), "2".into());
    env.insert("FFMPEG_PRESET".into(), "veryslow".into());
    let mut worker = Worker::start(&env);
    let responses = stack.responses();
    stack.send(&request("vid-long", "long.mp4")).await;

    wait_transcoding(&worker);
    let scratch = worker.scratch_dir().display().to_string();
    let ffmpeg = processes_mentioning(&scratch);
    assert!(!ffmpeg.is_empty(), "ffmpeg runs in the job's scratch dir");
    worker.sigterm();
    let status = worker.wait_exit(MINUTE);
    assert_eq!(status.code(), Some(1), "abandoned work is a non-zero exit");
    for pid in &ffmpeg {
        assert!(
            exits_within(*pid, Duration::from_secs(5)),
            "ffmpeg {pid} outlived the worker"
        );
    }
    assert!(processes_mentioning(&scratch).is_empty());
    assert!(responses.next(Duration::from_secs(1)).is_none());
    assert!(stack.committed("g-video-kill", 1)[0] <= 0);

    env.insert("SHUTDOWN_TIMEOUT_SECS".into(), "25".into());
    env.insert("FFMPEG_PRESET".into(), "ultrafast".into());
    let _next = Worker::start(&env);
    let r = responses.take(1, 5 * MINUTE).remove(0).body;
    assert_eq!(
        (r.media_id.as_deref(), r.status),
        (Some("vid-long"), Status::Completed)
    );
}
