//! Fault containment against Apache Kafka + s3s-fs: media work runs in sandbox children, so a
//! crashing decoder, a decode over the memory cap or a runaway job costs that job only.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use media_worker::contract::{ErrorCode, OptimizeResponse, Stage, Status};

fn failed(r: &OptimizeResponse) -> (ErrorCode, String, Stage, bool) {
    let e = r
        .error
        .as_ref()
        .unwrap_or_else(|| panic!("not failed: {r:?}"));
    (e.code, e.message.clone(), e.stage, e.retryable)
}

/// A config file with three profiles for the 25 MP meadow strip: `slow` (AVIF and WebP at four
/// sizes: about 15 s of native work, for a job that is surely in flight), `long` (one AVIF
/// at 2048 px: one libvips call of about 4 s, which nothing can interrupt but a kill) and
/// `late` (one WebP at 640 px: a small job).
fn slow_profile(dir: &Path) -> String {
    let config = dir.join("slow.toml");
    std::fs::write(
        &config,
        "[profiles.slow]\nanalysis = false\nwidths = [640, 1280, 1920, 2048]\n\
         formats = [{ format = \"avif\", quality = 60 }, { format = \"webp\", quality = 90 }]\n\
         [profiles.long]\nanalysis = false\nwidths = [2048]\n\
         formats = [{ format = \"avif\", quality = 60 }]\n\
         [profiles.late]\nanalysis = false\nwidths = [640]\n\
         formats = [{ format = \"webp\", quality = 80 }]\n",
    )
    .unwrap();
    config.display().to_string()
}

/// A ready worker with a pool of one (so one sandbox child), the profiles of [`slow_profile`]
/// (written in `dir`) and the `extra` environment.
fn pool_of_one(stack: &Stack, group: &str, dir: &Path, extra: &[(&str, &str)]) -> Worker {
    let mut env = stack.worker_env(group);
    env.insert("MEDIA_WORKER_CONFIG".into(), slow_profile(dir));
    env.insert("WORKER_POOL_SIZE".into(), "1".into());
    env.extend(
        extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    let worker = Worker::start(&env);
    worker.wait_ready();
    worker
}

/// SIGSEGV to the sandbox child in the middle of a job: tried once more in a fresh child (and
/// completed); when that one is killed too, the job is answered `media_crashed` naming the
/// signal. The worker stays up and ready, and the next job succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashing_decoder_costs_one_job_and_never_the_worker() {
    let stack = Stack::start(1).await;
    let dir = tempfile::tempdir().unwrap();
    let worker = pool_of_one(&stack, "g-segv", dir.path(), &[]);
    let responses = stack.responses();
    stack.upload_corpus("imageio_meadow_cube.jpg").await;
    stack.upload_corpus("sharp_Landscape_1.jpg").await;

    for (id, crashes) in [("segv-once", 1), ("segv-twice", 2)] {
        let mut req = request(id, "imageio_meadow_cube.jpg");
        req.profile = Some("slow".into());
        let idle = sandbox_ticks(&worker);
        stack.send(&req).await;
        for _ in 0..crashes {
            // 0.3 s of CPU beyond start-up: well into the job, well before its end (15 s).
            let pid = busy_sandbox(&worker, &idle, 30);
            // SAFETY: a signal to a process of this test's worker.
            unsafe { libc::kill(pid, libc::SIGSEGV) };
            assert!(exits_within(pid, Duration::from_secs(5)), "{pid} survived");
        }
        let r = responses.take(1, 2 * MINUTE).remove(0).body;
        assert_eq!(r.media_id.as_deref(), Some(id));
        if crashes == 1 {
            assert_eq!(r.status, Status::Completed, "{r:?}");
        } else {
            let (code, message, stage, retryable) = failed(&r);
            assert_eq!(code, ErrorCode::MediaCrashed, "{message}");
            assert!(message.contains("SIGSEGV"), "{message}");
            assert!(!retryable && r.attempts == 1);
            assert!(
                matches!(stage, Stage::Probe | Stage::Transform),
                "{stage:?}"
            );
        }
    }
    stack.send(&request("after", "sharp_Landscape_1.jpg")).await;
    let r = responses.take(1, MINUTE).remove(0).body;
    assert_eq!(
        (r.media_id.as_deref(), r.status),
        (Some("after"), Status::Completed)
    );
    clean_and_well(&worker, 1);
}

/// A job process that dies late in its try (held stopped until 17 s of a 20 s
/// `MEDIA_TIMEOUT_SECS`, then SIGSEGV: a crash at 250 s of a 300 s limit, scaled down) is tried
/// once more with a time limit of its own. Its retry used to get the 3 s its first try left and
/// be answered `timeout`, permanent. The retry is held stopped until 8 s of its own age (past
/// what the first try left, well within a limit of its own), then does what is left of a small
/// job (the `late` profile: one WebP at 640 px), so neither the holds nor the work depend on how
/// busy the machine is: each is measured from its own process's start (`/proc`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_late_crash_gets_a_time_limit_of_its_own() {
    let stack = Stack::start(1).await;
    let dir = tempfile::tempdir().unwrap();
    let worker = pool_of_one(
        &stack,
        "g-late-crash",
        dir.path(),
        &[("MEDIA_TIMEOUT_SECS", "20")],
    );
    let responses = stack.responses();
    stack.upload_corpus("imageio_meadow_cube.jpg").await;
    let mut req = request("late-crash", "imageio_meadow_cube.jpg");
    req.profile = Some("late".into());
    stack.send(&req).await;
    // The try began just before its process: at most 3 s of its limit are left at 17 s.
    let first = job_process(&worker, &[]);
    // SAFETY: signals to a process of this test's worker.
    unsafe { libc::kill(first, libc::SIGSTOP) };
    tokio::time::sleep(Duration::from_secs(17).saturating_sub(process_age(first))).await;
    unsafe {
        libc::kill(first, libc::SIGSEGV);
        libc::kill(first, libc::SIGCONT);
    }
    assert!(
        exits_within(first, Duration::from_secs(5)),
        "{first} survived"
    );
    let retry = job_process(&worker, &[first]);
    stopped_until(retry, Duration::from_secs(8)).await;
    let r = responses.take(1, 2 * MINUTE).remove(0).body;
    assert_eq!(r.status, Status::Completed, "{:?}", r.error);
    let log = worker.log();
    assert!(
        log.contains("sandbox job process died"),
        "the crash was not seen"
    );
    clean_and_well(&worker, 1);
}

/// A real image within the pixel limit whose decode needs more than MEDIA_MEMORY_LIMIT_BYTES
/// (an interlaced PNG is decoded whole) fails `limits_exceeded` naming the memory limit; the
/// worker's own memory does not grow, and the next job succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decode_over_the_memory_cap_fails_its_job_only() {
    let stack = Stack::start(1).await;
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("interlaced.png");
    let raw = dir.path().join("raw.v");
    // 10000 x 10000 RGB (the pixel limit exactly): 300 MB decoded, a small file.
    let vips = |args: &[&str]| {
        let ok = Command::new("vips").args(args).status().unwrap().success();
        assert!(ok, "vips {args:?}");
    };
    vips(&[
        "black",
        raw.to_str().unwrap(),
        "10000",
        "10000",
        "--bands",
        "3",
    ]);
    vips(&[
        "pngsave",
        raw.to_str().unwrap(),
        big.to_str().unwrap(),
        "--interlace",
    ]);
    let cap = (512u64 << 20).to_string();
    let worker = pool_of_one(
        &stack,
        "g-mem",
        dir.path(),
        &[("MEDIA_MEMORY_LIMIT_BYTES", &cap)],
    );
    let responses = stack.responses();
    stack.upload_file("interlaced.png", &big).await;
    stack.upload_corpus("sharp_Landscape_1.jpg").await;
    // The worker's memory once it has run a job (allocator and clients warmed up).
    stack.send(&request("warm", "sharp_Landscape_1.jpg")).await;
    assert_eq!(responses.take(1, MINUTE)[0].body.status, Status::Completed);
    let before = worker.rss();

    stack.send(&request("too-big", "interlaced.png")).await;
    let r = responses.take(1, 2 * MINUTE).remove(0).body;
    let (code, message, _, retryable) = failed(&r);
    assert_eq!(code, ErrorCode::LimitsExceeded, "{message}");
    assert!(message.contains("memory limit") && !retryable, "{message}");
    let after = worker.rss();
    assert!(
        after < before + (32 << 20),
        "worker RSS grew from {} to {} MiB",
        before >> 20,
        after >> 20
    );
    stack.send(&request("after", "sharp_Landscape_1.jpg")).await;
    assert_eq!(responses.take(1, MINUTE)[0].body.status, Status::Completed);
    clean_and_well(&worker, 1);
}

/// At MEDIA_TIMEOUT_SECS the child is killed and reaped and the permit is free at once: with a
/// pool of one, the next job starts its native work within a second of the timeout. (Inline,
/// the timed-out encode would keep the permit to its end.) The slow job's process is held
/// stopped (a job that makes no progress, however idle the machine), and the next is a small
/// photo, so a limit of 10 s is far from what either needs, whatever the machine's load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_job_frees_its_permit_at_once() {
    let stack = Stack::start(1).await;
    let dir = tempfile::tempdir().unwrap();
    let worker = pool_of_one(
        &stack,
        "g-timeout",
        dir.path(),
        &[("MEDIA_TIMEOUT_SECS", "10")],
    );
    let responses = stack.responses();
    stack.upload_corpus("imageio_meadow_cube.jpg").await;
    stack.upload_corpus("sharp_Landscape_1.jpg").await;
    let mut slow = request("slow", "imageio_meadow_cube.jpg");
    slow.profile = Some("long".into());
    stack.send(&slow).await;
    // `next` is sent once `slow` holds the permit (its native work begun), and must wait.
    wait_for("the slow job's native work", MINUTE, || {
        worker
            .jobs()
            .iter()
            .find(|j| {
                j["media_id"] == "slow" && j["phase"] == "running" && j["stage"] == "transform"
            })
            .map(|_| ())
    });
    // SAFETY: a signal to a process of this test's worker (killed at the limit, stopped or not).
    unsafe { libc::kill(job_process(&worker, &[]), libc::SIGSTOP) };
    stack.send(&request("next", "sharp_Landscape_1.jpg")).await;

    // While `slow` runs, `next` waits for the permit (`queued` on /jobs): note when it was last
    // seen waiting, and when `slow`'s answer arrived.
    let (mut last_queued, mut slow_answered) = (None, None);
    let mut got = BTreeMap::new();
    wait_for("both answers", 2 * MINUTE, || {
        let queued = worker
            .jobs()
            .iter()
            .any(|j| j["media_id"] == "next" && j["phase"] == "queued");
        if queued {
            last_queued = Some(Instant::now());
        }
        if let Some(r) = responses.next(Duration::from_millis(20)) {
            if r.body.media_id.as_deref() == Some("slow") {
                slow_answered = Some(Instant::now());
            }
            got.insert(r.body.media_id.clone().unwrap(), r.body);
        }
        (got.len() == 2).then_some(())
    });
    let (code, _, stage, _) = failed(&got["slow"]);
    assert_eq!((code, stage), (ErrorCode::Timeout, Stage::Transform));
    assert_eq!(got["next"].status, Status::Completed);
    let (queued, answered) = (last_queued.expect("next waited"), slow_answered.unwrap());
    // The permit is released before the answer is published: `next` leaves the queue first.
    assert!(
        queued < answered + Duration::from_secs(1),
        "next still waiting {:?} after the timeout was answered",
        queued - answered
    );
    clean_and_well(&worker, 1);
}

/// No credential reaches a decoder: the environment of a running ffmpeg (and of its sandbox)
/// holds none of the worker's AWS or Kafka settings, and its limits are the sandbox's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ffmpeg_never_sees_the_workers_credentials() {
    let stack = Stack::start(1).await;
    let dir = tempfile::tempdir().unwrap();
    let video = synthetic_video(dir.path(), 20, 640, 360);
    let cap = (3u64 << 30).to_string();
    let worker = pool_of_one(
        &stack,
        "g-env",
        dir.path(),
        &[("MEDIA_MEMORY_LIMIT_BYTES", &cap)],
    );
    assert!(
        environ(worker.pid())
            .iter()
            .any(|e| e.starts_with("AWS_SECRET_ACCESS_KEY="))
    );
    let responses = stack.responses();
    stack.upload_file("clip.mp4", &video).await;
    stack.send(&request("clip", "clip.mp4")).await;

    let ffmpeg = wait_for("a running ffmpeg", MINUTE, || {
        descendants_of(worker.pid())
            .into_iter()
            .find(|p| cmdline(*p).starts_with("ffmpeg"))
    });
    // The fork server, the job process, and its ffmpeg.
    let job = proc_stat(ffmpeg).unwrap().1;
    let server = proc_stat(job).unwrap().1;
    for pid in [server, job, ffmpeg] {
        let env = environ(pid);
        let leaked: Vec<_> = env
            .iter()
            .filter(|e| e.starts_with("AWS_") || e.starts_with("KAFKA_") || e.contains(SECRET_KEY))
            .collect();
        assert!(leaked.is_empty(), "{}: {leaked:?}", cmdline(pid));
        assert!(env.iter().any(|e| e.starts_with("PATH=")), "{env:?}");
        let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
        let line = |name: &str| {
            limits
                .lines()
                .find(|l| l.starts_with(name))
                .unwrap_or_else(|| panic!("{name} in {limits}"))
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert!(line("Max address space").contains(&(3u64 << 30).to_string()));
        assert!(line("Max core file size").starts_with("Max core file size 0 0"));
        assert!(line("Max open files").starts_with("Max open files 512 512"));
    }
    // ffmpeg reads the input as a local file through the pinned demuxer only.
    let args = cmdline(ffmpeg);
    assert!(
        args.contains("-protocol_whitelist file,pipe -f mov -i"),
        "{args}"
    );
    let r = responses.take(1, 2 * MINUTE).remove(0).body;
    assert_eq!(r.status, Status::Completed, "{r:?}");
}

/// Every file of ../shared/corpus (bombs, truncated files and garbage included) through one
/// worker: each answered with the code its kind calls for, the worker alive and ready, and a
/// clean exit 0 on SIGTERM that leaves no sandbox child behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_corpus_is_answered_and_the_worker_survives() {
    let stack = Stack::start(2).await;
    let mut worker = Worker::start(&stack.worker_env("g-corpus"));
    worker.wait_ready();
    let responses = stack.responses();
    let files: Vec<String> = corpus_manifest().into_iter().map(|f| f.name).collect();
    assert!(files.len() >= 50, "{} files", files.len());
    for (i, name) in files.iter().enumerate() {
        stack.upload_corpus(name).await;
        stack.send(&request(&format!("c{i}"), name)).await;
    }
    let expected_failure = |name: &str| match name {
        "chorus_not_an_image.jpg" | "sharp_check.svg" | "rails_video_without_video_stream.mp4" => {
            Some(ErrorCode::UnsupportedMedia)
        }
        "pillow_broken.png"
        | "pillow_heif_empty.heic"
        | "sharp_corrupt-header.jpg"
        | "sharp_truncated.jpg"
        | "sharp_truncated.png" => Some(ErrorCode::CorruptInput),
        "sharp_65536-uint32-limit.png" | "sharp_giant-image.jpg" => Some(ErrorCode::LimitsExceeded),
        _ => None,
    };
    let sandboxes = worker.sandboxes();
    let got: BTreeMap<String, OptimizeResponse> = responses
        .take(files.len(), 10 * MINUTE)
        .into_iter()
        .map(|r| (r.body.media_id.clone().unwrap(), r.body))
        .collect();
    assert_eq!(got.len(), files.len(), "every request answered once");
    let mut wrong = Vec::new();
    for (i, name) in files.iter().enumerate() {
        let r = &got[&format!("c{i}")];
        let code = r.error.as_ref().map(|e| e.code);
        if code != expected_failure(name) {
            wrong.push(format!("{name}: {:?} {:?}", r.status, r.error));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    assert_eq!(worker.http_get("/health/ready").unwrap().0, 200);

    worker.sigterm();
    assert!(worker.wait_exit(MINUTE).success());
    for pid in sandboxes {
        assert!(
            exits_within(pid, Duration::from_secs(5)),
            "sandbox {pid} outlived the worker"
        );
    }
}
