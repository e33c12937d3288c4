//! Video end to end: the worker binary against Apache Kafka and s3s-fs, and what SIGTERM does to a
//! running transcode.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use media_worker::contract::{MediaType, ProgressEvent, Status};

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
    // Both rungs of 30 s of 720p in one run take far longer than the 2 s deadline.
    env.insert("FFMPEG_PRESET".into(), "slow".into());
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

/// What ffprobe reads in a file: `codec,width,height` of its video stream.
fn video_stream(path: &std::path::Path) -> String {
    let probe = Command::new("ffprobe")
        .args(["-v", "error", "-select_streams", "v:0"])
        .args([
            "-show_entries",
            "stream=codec_name,width,height",
            "-of",
            "csv=p=0",
        ])
        .arg(path)
        .output()
        .unwrap();
    String::from_utf8_lossy(&probe.stdout).trim().to_owned()
}

/// A video request being worked on by a first worker while one of its outputs cannot land:
/// s3s-fs cannot write an object where a directory is (`blocker`; remove it to let it land).
struct Blocked {
    first: Worker,
    env: std::collections::HashMap<String, String>,
    /// The request's output folder in s3s-fs.
    out: std::path::PathBuf,
    blocker: std::path::PathBuf,
    responses: Responses,
}

impl Blocked {
    /// Lets the blocked output land and starts a second worker: it and its (completed)
    /// response.
    fn unblock_for_a_second_worker(&self) -> (Worker, media_worker::contract::OptimizeResponse) {
        std::fs::remove_dir_all(&self.blocker).unwrap();
        let second = Worker::start(&self.env);
        second.wait_ready();
        let resumed = self.responses.take(1, 3 * MINUTE).remove(0).body;
        assert_eq!(resumed.status, Status::Completed, "{:?}", resumed.error);
        (second, resumed)
    }
}

/// `media_worker_video_renditions_total` of `worker` by origin: (encoded, resumed).
fn renditions(worker: &Worker) -> (Option<f64>, Option<f64>) {
    let by = |origin: &str| {
        worker.metric(&format!(
            "media_worker_video_renditions_total{{origin=\"{origin}\"}}"
        ))
    };
    (by("encoded"), by("resumed"))
}

/// Uploads `video` as the request's source, blocks output `name`, starts a worker (its group
/// named after the media id) and sends `req`.
async fn with_one_output_blocked(
    stack: &Stack,
    video: &std::path::Path,
    req: &media_worker::contract::OptimizeRequest,
    name: &str,
) -> Blocked {
    stack.upload_file(&req.source.key, video).await;
    let out = stack
        .s3
        .data_dir()
        .join(OUTPUT_BUCKET)
        .join(format!("{}/videos/{}", req.user_id, req.media_id));
    let blocker = out.join(name);
    std::fs::create_dir_all(blocker.join("in-the-way")).unwrap();
    let env = stack.worker_env(&format!("g-{}", req.media_id));
    let first = Worker::start(&env);
    first.wait_ready();
    let responses = stack.responses();
    stack.send(req).await;
    Blocked {
        first,
        env,
        out,
        blocker,
        responses,
    }
}

/// A worker killed (SIGKILL) after the first rendition of a video landed: the request is
/// redelivered, the next worker encodes only the missing rung, and its response equals an
/// uninterrupted run's (the same request redone with `force`). Without
/// `KAFKA_PROGRESS_TOPIC`, no progress event is published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_after_the_first_rendition_resumes_with_the_missing_rung() {
    let stack = Stack::start(1).await;
    let progress_topic = &stack.own("media.optimize.progress");
    stack.broker.create_topic(progress_topic, 1);
    let dir = tempfile::tempdir().unwrap();
    let video = synthetic_video(dir.path(), 10, 1280, 720);
    let mut req = request("vid-r", "clip.mp4");
    req.media_type = Some(MediaType::Video);
    // The second rung cannot land yet.
    let mut blocked = with_one_output_blocked(&stack, &video, &req, "mp4/480p.mp4").await;
    let out = blocked.out.clone();

    let record = out.join("renditions.json");
    let landed: serde_json::Value = wait_for("the first rendition recorded", 2 * MINUTE, || {
        serde_json::from_slice(&std::fs::read(&record).ok()?).ok()
    });
    blocked.first.kill9();
    blocked.first.wait_exit(MINUTE);
    let keys: Vec<&str> = landed["renditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["user-1/videos/vid-r/mp4/720p.mp4"]);
    assert_eq!(
        stack.response_count(),
        0,
        "the killed worker never answered"
    );

    let (second, resumed) = blocked.unblock_for_a_second_worker();
    assert_eq!(
        renditions(&second),
        (Some(1.0), Some(1.0)),
        "{}",
        second.log()
    );
    // ffmpeg wrote one rung's media time (10 s), not two.
    let encoded = second
        .metric("media_worker_video_encoded_seconds_total")
        .unwrap();
    assert!((9.0..=11.0).contains(&encoded), "{encoded}");

    // The same request redone from scratch: every rung encoded, the same response.
    req.force = true;
    stack.send(&req).await;
    let full = blocked.responses.take(1, 3 * MINUTE).remove(0).body;
    assert_eq!(full.status, Status::Completed, "{:?}", full.error);
    assert_eq!(renditions(&second).0, Some(3.0));
    assert_eq!(resumed.outputs, full.outputs);
    assert_eq!(resumed.analysis, full.analysis);
    assert_eq!(resumed.warnings, full.warnings);
    let sizes: Vec<String> = resumed
        .outputs
        .iter()
        .filter(|o| o.role == "rendition")
        .map(|o| format!("h264,{},{}", o.width, o.height))
        .collect();
    assert_eq!(sizes, ["h264,1280,720", "h264,854,480"]);
    for o in resumed.outputs.iter().filter(|o| o.role == "rendition") {
        let (bytes, _, _) = stack.get(OUTPUT_BUCKET, &o.key).await;
        assert_eq!(bytes.len() as u64, o.size_bytes, "{}", o.key);
        let local = dir.path().join("out.mp4");
        std::fs::write(&local, &bytes).unwrap();
        assert_eq!(
            video_stream(&local),
            format!("h264,{},{}", o.width, o.height)
        );
    }
    assert!(stack.records(progress_topic).is_empty());
    assert_eq!(
        second.metric("media_worker_progress_events_total{result=\"published\"}"),
        Some(0.0)
    );
}

/// With `KAFKA_PROGRESS_TOPIC` set, a video job's progress events carry its ids, arrive in
/// order, advance by a step or a heartbeat each (the rate bound) and all precede the response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_events_arrive_in_order_within_the_rate_bound_before_the_response() {
    let stack = Stack::start(1).await;
    let topic = &stack.own("media.optimize.progress");
    stack.broker.create_topic(topic, 1);
    let dir = tempfile::tempdir().unwrap();
    let video = synthetic_video(dir.path(), 20, 1280, 720);
    stack.upload_file("clip.mp4", &video).await;
    let mut env = stack.worker_env("g-progress");
    env.insert("KAFKA_PROGRESS_TOPIC".into(), topic.into());
    env.insert("MEDIA_WORKER_KAFKA__PROGRESS_DELAY_SECS".into(), "0".into());
    env.insert(
        "MEDIA_WORKER_KAFKA__PROGRESS_INTERVAL_SECS".into(),
        "2".into(),
    );
    let worker = Worker::start(&env);
    worker.wait_ready();
    let responses = stack.responses();
    let mut req = request("vid-p", "clip.mp4");
    req.media_type = Some(MediaType::Video);
    stack.send(&req).await;
    let r = responses.take(1, 3 * MINUTE).remove(0).body;
    assert_eq!(r.status, Status::Completed, "{:?}", r.error);

    let events = stack.records(topic);
    let answered_at = stack.records(&stack.response_topic)[0].2;
    assert!(events.len() >= 5, "{events:?}");
    let mut last: Option<ProgressEvent> = None;
    for (key, json, at) in &events {
        let e: ProgressEvent = serde_json::from_value(json.clone()).unwrap();
        assert_eq!((key.as_str(), e.media_id.as_str()), ("vid-p", "vid-p"));
        assert_eq!(
            (e.request_id.as_str(), e.status.as_str()),
            (req.request_id.as_str(), "progressing")
        );
        assert!((0.0..1.0).contains(&e.progress), "{e:?}");
        assert!(*at <= answered_at, "an event after the response: {e:?}");
        if let Some(prev) = &last {
            let step = e.progress - prev.progress;
            let quiet = e.elapsed_ms - prev.elapsed_ms;
            assert!(step >= 0.0, "progress went back: {prev:?} → {e:?}");
            assert!(
                step >= 0.1 - 1e-3 || quiet >= 2_000 - 50,
                "over the rate bound: {prev:?} → {e:?}"
            );
        }
        last = Some(e);
    }
    let stages: Vec<String> = events
        .iter()
        .map(|(_, j, _)| j["stage"].to_string())
        .collect();
    assert!(stages.iter().any(|s| s == "\"transform\""), "{stages:?}");
    assert_eq!(
        worker.metric("media_worker_progress_events_total{result=\"published\"}"),
        Some(events.len() as f64)
    );
}

/// A streaming request through Kafka and S3: while a rung cannot land, neither entry point is
/// there (a player never finds one whose segments are missing); a worker killed then is
/// followed by one that encodes only the missing rung; the master it writes names only objects
/// that exist, read back through S3 by an independent parser; and the outputs are those
/// `media-worker process` makes of the same file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_lands_before_its_entry_points_and_resumes_per_rung() {
    let stack = Stack::start(1).await;
    let dir = tempfile::tempdir().unwrap();
    let video = synthetic_video(dir.path(), 8, 1280, 720);
    let req = request("vid-s", "clip.mp4").with_profile("streaming");
    // The 480p rung's first segment cannot land yet.
    let mut blocked = with_one_output_blocked(&stack, &video, &req, "hls/480p/seg-00000.m4s").await;
    let out = blocked.out.clone();

    let record = out.join("renditions.json");
    let landed: serde_json::Value = wait_for("the 720p rung recorded", 2 * MINUTE, || {
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&record).ok()?).ok()?;
        (!v["tracks"].as_array()?.is_empty()).then_some(v)
    });
    assert_eq!(landed["tracks"][0]["id"], serde_json::json!({"Video": 720}));
    assert!(out.join("hls/720p/index.m3u8").is_file() && out.join("mp4/720p.mp4").is_file());
    for entry in ["hls/master.m3u8", "hls/manifest.mpd"] {
        assert!(
            !out.join(entry).exists(),
            "{entry} before every rung landed"
        );
    }
    blocked.first.kill9();
    blocked.first.wait_exit(MINUTE);

    let (second, resumed) = blocked.unblock_for_a_second_worker();
    // 480p, 360p and 234p encoded, 720p resumed.
    assert_eq!(renditions(&second), (Some(3.0), Some(1.0)));

    // The master, read back through S3, and every object it leads to.
    let master = resumed
        .outputs
        .iter()
        .find(|o| o.role == "stream" && o.format == "hls")
        .expect("an HLS entry point");
    assert_eq!(master.key, "user-1/videos/vid-s/hls/master.m3u8");
    let local = dir.path().join("read-back");
    let fetched = stack.fetch_hls(&master.key, &local).await;
    // master, 4 rungs (720p down to 234p) and the audio: a playlist, an init segment and at
    // least 2 segments each (every GET above succeeded: the object exists).
    let least = 5 * 4 + 1;
    assert!(fetched >= least, "{fetched}");
    let parsed = Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/streaming/hls.py"
        ))
        .arg(local.join("master.m3u8"))
        .output()
        .unwrap();
    assert!(parsed.status.success(), "{parsed:?}");
    let parsed: serde_json::Value = serde_json::from_slice(&parsed.stdout).unwrap();
    assert_eq!(parsed["variants"].as_array().unwrap().len(), 4);

    // `media-worker process` makes the same outputs of the same file.
    let cli = Command::new(env!("CARGO_BIN_EXE_media-worker"))
        .args(["process", "--profile", "streaming", "--out"])
        .arg(dir.path().join("cli"))
        .arg(&video)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let cli = lines::json_lines(&cli).pop().expect("a response");
    let names = |keys: Vec<String>| {
        let mut n: Vec<String> = keys
            .iter()
            .map(|k| k.splitn(4, '/').nth(3).unwrap().to_owned())
            .collect();
        n.sort();
        n
    };
    let kafka: Vec<String> = resumed.outputs.iter().map(|o| o.key.clone()).collect();
    let local: Vec<String> = cli["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["key"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names(kafka), names(local));
}
