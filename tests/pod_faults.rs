//! Faults of the pod itself, against Apache Kafka + s3s-fs: a sick pod stops taking work instead
//! of failing it.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;
use media_worker::contract::Status;

const MIB: u64 = 1 << 20;

/// A small tmpfs of its own (the tests run as root, as CI does), unmounted on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size_mib: u64) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mib}m"), "tmpfs"])
            .arg(dir.path())
            .output()
            .expect("mount");
        assert!(
            out.status.success(),
            "mounting a tmpfs needs root (CI runs as root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn free(&self) -> u64 {
        media_worker::scratch::Space::file_system(self.path())
            .expect("statvfs")
            .free
    }

    /// Fills the filesystem until `left` bytes are free.
    fn fill_until(&self, left: u64) -> PathBuf {
        let filler = self.path().join("filler");
        let n = self.free().saturating_sub(left);
        std::fs::write(&filler, vec![0u8; n as usize]).unwrap();
        filler
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

fn readiness(worker: &Worker) -> Option<(u16, serde_json::Value)> {
    let (status, body) = worker.http_get("/health/ready")?;
    Some((status, serde_json::from_str(&body).ok()?))
}

/// Scratch space below `MIN_SCRATCH_FREE_BYTES`: the pod reports `scratch`, pauses its
/// partitions and takes nothing (no request is answered, none failed); once space is freed
/// every request completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_scratch_disk_pauses_intake_and_fails_nothing() {
    let scratch = Tmpfs::mount(32);
    let stack = Stack::start(1).await;
    let mut env = stack.worker_env("g-scratch");
    env.insert(
        "TMP_DIR".into(),
        scratch.path().join("jobs").display().to_string(),
    );
    env.insert("MIN_SCRATCH_FREE_BYTES".into(), (16 * MIB).to_string());
    let worker = Worker::start(&env);
    worker.wait_ready();

    let filler = scratch.fill_until(8 * MIB);
    let (_, ready) = wait_for("not ready for scratch", MINUTE, || {
        readiness(&worker).filter(|(status, _)| *status == 503)
    });
    assert_eq!(ready["scratch"], false, "{ready}");
    wait_for("partitions paused", MINUTE, || {
        (worker.metric("media_worker_kafka_paused") == Some(1.0)).then_some(())
    });

    let names = ["pillow_flower.jpg", "rails_racecar.jpg", "sharp_4.webp"];
    for (i, name) in names.iter().enumerate() {
        stack.upload_corpus(name).await;
        stack.send(&request(&format!("held-{i}"), name)).await;
    }
    let responses = stack.responses();
    // A negative cannot be awaited: over 3 s (15 commit intervals) nothing is taken or answered.
    assert!(
        responses.next(Duration::from_secs(3)).is_none(),
        "answered while sick"
    );
    assert!(worker.jobs().is_empty());
    assert_eq!(
        worker.metric("media_worker_requests_received_total"),
        Some(0.0)
    );

    std::fs::remove_file(filler).unwrap();
    let got = responses.take(names.len(), 2 * MINUTE);
    for r in &got {
        assert_eq!(r.body.status, Status::Completed, "{:?}", r.body.error);
    }
    wait_for("ready again", MINUTE, || {
        readiness(&worker).filter(|(status, _)| *status == 200)
    });
    wait_for("offsets committed", MINUTE, || {
        (stack.committed("g-scratch", 1) == vec![names.len() as i64]).then_some(())
    });
}

/// The HTTP server bounds its connections and the time a client may take to send headers, so
/// slow or idle clients cannot exhaust the pod; once they are cut off, probes are served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_http_clients_cannot_exhaust_the_server() {
    use std::io::{Read, Write};
    let stack = Stack::start(1).await;
    let mut env = stack.worker_env("g-http");
    env.insert("HTTP_MAX_CONNECTIONS".into(), "4".into());
    env.insert("HTTP_HEADER_TIMEOUT_MS".into(), "1500".into());
    let worker = Worker::start(&env);
    worker.wait_ready();

    // Four clients that connect and then send half a request line, never the rest.
    let mut slow: Vec<std::net::TcpStream> = (0..4)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(worker.http).unwrap();
            s.write_all(b"GET /metr").unwrap();
            s
        })
        .collect();
    wait_for("the cap reached", MINUTE, || {
        worker.http_get("/health/live").is_none().then_some(())
    });
    // The server cuts them off at the header timeout...
    for s in &mut slow {
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf).unwrap_or(0);
        let head = String::from_utf8_lossy(&buf[..n]).into_owned();
        assert!(n == 0 || head.starts_with("HTTP/1.1 408"), "{head:?}");
    }
    // ...and serves probes again.
    let (status, body) = wait_for("served again", MINUTE, || worker.http_get("/health/live"));
    assert_eq!((status, body.as_str()), (200, "ok"));
}

/// Responses the broker rejects as too large (here: a producer limit below their size) do not
/// stop the partition: each request is answered by a minimal failure response (its dead letter,
/// which carries the response, is too large as well) and the offsets are committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_too_large_for_the_broker_keep_the_partition_moving() {
    let stack = Stack::start(1).await;
    let mut env = stack.worker_env("g-large");
    env.insert("KAFKA_PROPERTY_MESSAGE_MAX_BYTES".into(), "1500".into());
    let worker = Worker::start(&env);
    let responses = stack.responses();
    let names = ["pillow_flower.jpg", "sharp_4.webp"];
    for (i, name) in names.iter().enumerate() {
        stack.upload_corpus(name).await;
        stack.send(&request(&format!("large-{i}"), name)).await;
    }
    let got = responses.take(names.len(), 2 * MINUTE);
    for r in &got {
        let e = r.body.error.as_ref().expect("a minimal failure response");
        assert_eq!(
            (r.body.status, e.stage),
            (Status::Failed, media_worker::contract::Stage::Publish)
        );
        assert!(r.body.outputs.is_empty());
    }
    // Counted once its delivery is reported, which may come after a consumer has read it.
    wait_for("both minimal responses counted", MINUTE, || {
        (worker.metric("media_worker_minimal_responses_total") == Some(2.0)).then_some(())
    });
    wait_for("offsets committed", MINUTE, || {
        (stack.committed("g-large", 1) == vec![names.len() as i64]).then_some(())
    });
}

/// The pod is not ready for `check`, its intake paused, and its job held, unanswered.
fn held_while_not_ready(worker: &Worker, responses: &Responses, check: &str) {
    let (_, ready) = wait_for(&format!("not ready for {check}"), 2 * MINUTE, || {
        readiness(worker).filter(|(status, _)| *status == 503)
    });
    assert_eq!(ready[check], false, "{ready}");
    wait_for("the job held", MINUTE, || {
        worker
            .jobs()
            .iter()
            .any(|j| j["phase"] == "held")
            .then_some(())
    });
    wait_for("partitions paused", MINUTE, || {
        (worker.metric("media_worker_kafka_paused") == Some(1.0)).then_some(())
    });
    assert!(
        responses.next(Duration::from_millis(0)).is_none(),
        "answered while not ready for {check}"
    );
}

/// Runs a generator whose last argument is the output, in `dir`.
fn generated(dir: &Path, name: &str, make: &mut Command) -> PathBuf {
    let out = dir.join(name);
    let status = make.arg(&out).status().expect("generator");
    assert!(status.success(), "cannot make {name}");
    out
}

/// The worker env on a scratch volume of its own, readiness floor 1 MiB, pool 2, then `more`.
fn on_scratch(stack: &Stack, group: &str, scratch: &Tmpfs, more: &[(&str, &str)]) -> Worker {
    let mut env = stack.worker_env(group);
    env.insert(
        "TMP_DIR".into(),
        scratch.path().join("jobs").display().to_string(),
    );
    env.insert("MIN_SCRATCH_FREE_BYTES".into(), MIB.to_string());
    env.insert("WORKER_POOL_SIZE".into(), "2".into());
    for (k, v) in more {
        env.insert((*k).into(), (*v).into());
    }
    let worker = Worker::start(&env);
    worker.wait_ready();
    worker
}

/// The operator's scenario: six valid photos of about 20 MB on a 24 MiB scratch (readiness floor
/// 1 MiB), pool 2. Taken in together they would fill it, and libjpeg's "Output file write
/// error" used to answer them `transform_failed`. Admitted by need, they run one after the
/// other; none fails and all complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn photos_that_would_fill_the_scratch_together_all_complete() {
    let scratch = Tmpfs::mount(24);
    let stack = Stack::start(1).await;
    let worker = on_scratch(&stack, "g-fill", &scratch, &[]);
    let dir = tempfile::tempdir().unwrap();
    // 9,850 x 6,566 at quality 100 without chroma subsampling: a camera's 65 MP photo.
    let photo = dir.path().join("large.jpg");
    let made = Command::new("vips")
        .arg("resize")
        .arg(corpus("rails_racecar.jpg"))
        .arg(format!("{}[Q=100,subsample-mode=off]", photo.display()))
        .arg("2.4")
        .status()
        .unwrap();
    assert!(made.success());
    let size = std::fs::metadata(&photo).unwrap().len();
    assert!((18 * MIB..22 * MIB).contains(&size), "{size} bytes");
    let responses = stack.responses();
    for i in 0..6 {
        stack.upload_file(&format!("large-{i}.jpg"), &photo).await;
        stack
            .send(&request(&format!("large-{i}"), &format!("large-{i}.jpg")))
            .await;
    }
    let got = responses.take(6, 5 * MINUTE);
    for r in &got {
        assert_eq!(r.body.status, Status::Completed, "{:?}", r.body.error);
    }
    wait_for("offsets committed", MINUTE, || {
        (stack.committed("g-fill", 1) == vec![6]).then_some(())
    });
    let log = worker.log();
    let waited = log.matches("waiting for scratch space").count();
    let attempts: u32 = got.iter().map(|r| r.body.attempts).sum();
    eprintln!(
        "20 MB photos: answered {} completed, {attempts} attempts, {waited} waits for space",
        got.len()
    );
    assert!(
        waited > 0,
        "no job waited: the test did not fill the scratch"
    );
}

/// A small, heavily compressed noise photo (2560 x 1920 of grey noise at JPEG quality 5: 0.5 MB
/// that decodes to pixels no encoder can shrink) and a config with a profile per encoder
/// (`webp`, `avif`, `jpeg`) that makes four large variants of it.
fn noise_photo_and_profiles(dir: &Path) -> (PathBuf, PathBuf) {
    let config = dir.join("encoders.toml");
    let mut profiles = String::new();
    for (format, quality) in [("webp", 90), ("avif", 90), ("jpeg", 95)] {
        profiles += &format!(
            "[profiles.{format}]\nanalysis = false\nwidths = [640, 1280, 1920, 2560]\n\
             formats = [{{ format = \"{format}\", quality = {quality} }}]\n"
        );
    }
    std::fs::write(&config, profiles).unwrap();
    let noise = dir.join("noise.v");
    let grey = Command::new("vips")
        .args(["gaussnoise"])
        .arg(&noise)
        .args(["2560", "1920", "--sigma", "60", "--mean", "128"])
        .status()
        .unwrap();
    assert!(grey.success());
    let photo = generated(
        dir,
        "noise.jpg",
        Command::new("sh").arg("-c").arg(format!(
            "vips bandjoin '{n} {n} {n}' {d}/n3.v && vips cast {d}/n3.v {d}/n3u.v uchar && \
             vips copy {d}/n3u.v \"$0[Q=5]\"",
            n = noise.display(),
            d = dir.display()
        )),
    );
    (photo, config)
}

/// Outputs larger than the whole scratch volume (the noise photo's four large variants) on a
/// 3 MiB volume: no pod like this one could ever hold them. Whatever WebP's, AVIF's (libheif)
/// or JPEG's encoder says when the volume fills, the job passed its budget and is the
/// request's: answered `limits_exceeded` with the figures at its first attempt, the pod ready
/// throughout (a small upload must not stop the fleet partition by partition).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_larger_than_the_scratch_are_the_requests_whatever_the_encoder() {
    let dir = tempfile::tempdir().unwrap();
    let (photo, config) = noise_photo_and_profiles(dir.path());
    let scratch = Tmpfs::mount(3);
    let stack = Stack::start(1).await;
    let config = config.display().to_string();
    let worker = on_scratch(
        &stack,
        "g-encoders",
        &scratch,
        &[("MEDIA_WORKER_CONFIG", &config)],
    );
    stack.upload_file("noise.jpg", &photo).await;
    let responses = stack.responses();
    for format in ["webp", "avif", "jpeg"] {
        let mut req = request(&format!("noise-{format}"), "noise.jpg");
        req.profile = Some(format.into());
        stack.send(&req).await;
        let got = responses.take(1, 2 * MINUTE);
        too_large_for_the_scratch(&got[0].body, format);
        assert_eq!(readiness(&worker).map(|(s, _)| s), Some(200), "{format}");
    }
    let recognised = worker
        .log()
        .matches("outputs larger than the job's scratch budget")
        .count();
    assert!(
        recognised >= 3,
        "{recognised} failures recognised as past the budget"
    );
    wait_for("offsets committed", MINUTE, || {
        (stack.committed("g-encoders", 1) == vec![3]).then_some(())
    });
}

/// The same photo's WebP variants (4.6 MB: well within the job's budget on 24 MiB) on a volume
/// that something else filled to 2 MiB free (the pod ready, the job admitted): the job meets a
/// full disk that is not its doing. That stays the pod's fault, as before the budget: retried,
/// and answered `internal`, retryable (the filler is not this pod's: no wait would free it, so
/// the pod stays ready and the job is not held), never `limits_exceeded`. Once the space is back
/// the same request completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_filled_by_something_else_is_the_pods_fault_not_the_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let (photo, config) = noise_photo_and_profiles(dir.path());
    let scratch = Tmpfs::mount(24);
    let stack = Stack::start(1).await;
    let config = config.display().to_string();
    let more = [
        ("MEDIA_WORKER_CONFIG", config.as_str()),
        ("WORKER_POOL_SIZE", "1"),
        ("RETRY_COUNT", "1"),
    ];
    let worker = on_scratch(&stack, "g-filled", &scratch, &more);
    let filler = scratch.fill_until(2 * MIB);
    assert_eq!(readiness(&worker).map(|(s, _)| s), Some(200), "2 MiB free");
    stack.upload_file("noise.jpg", &photo).await;
    let responses = stack.responses();
    let mut req = request("filled", "noise.jpg");
    req.profile = Some("webp".into());
    stack.send(&req).await;
    let got = responses.take(1, 2 * MINUTE);
    let body = &got[0].body;
    let error = body.error.as_ref().expect("failed");
    eprintln!(
        "filled by something else: {} after {} attempts",
        error.message, body.attempts
    );
    assert_eq!(
        (error.code, error.retryable, body.attempts),
        (media_worker::contract::ErrorCode::Internal, true, 2),
        "the pod's fault, retried"
    );
    assert!(
        error.message.contains("scratch space exhausted"),
        "{error:?}"
    );
    assert!(
        !worker.log().contains("scratch budget"),
        "taken for the job's own"
    );

    std::fs::remove_file(filler).unwrap();
    stack.send(&req).await;
    let got = responses.take(1, 2 * MINUTE);
    let body = &got[0].body;
    assert_eq!(body.status, Status::Completed, "{:?}", body.error);
    let written: u64 = body.outputs.iter().map(|o| o.size_bytes).sum();
    eprintln!("then completed with {written} bytes of outputs");
    assert!(
        written > 2 * MIB,
        "the outputs could not fit the 2 MiB left"
    );
    wait_for("offsets committed", MINUTE, || {
        (stack.committed("g-filled", 1) == vec![2]).then_some(())
    });
}

/// Answered `limits_exceeded` at the first attempt, naming what the job wrote, its budget and
/// the volume's size.
fn too_large_for_the_scratch(r: &media_worker::contract::OptimizeResponse, what: &str) {
    let error = r
        .error
        .as_ref()
        .unwrap_or_else(|| panic!("{what}: not failed: {r:?}"));
    eprintln!("{what}: {} after {} attempts", error.message, r.attempts);
    assert_eq!(
        error.code,
        media_worker::contract::ErrorCode::LimitsExceeded,
        "{what}: {error:?}"
    );
    assert!(!error.retryable, "{what}: {error:?}");
    assert!(
        ["wrote", "budget", "bytes of scratch"]
            .iter()
            .all(|w| error.message.contains(w)),
        "{what}: {}",
        error.message
    );
    assert_eq!(r.attempts, 1, "{what}: answered at its first attempt");
}

/// The review's trigger, scaled to the capped rungs: the 20-second 720p noise video
/// (about 2.7 MB) with the streaming profile on an 8 MiB scratch, which the 720p rung alone
/// exceeds. The need became twice what the job wrote, about twice the volume, and the job waited
/// forever with the pod not ready and its partition paused (and after a restart the next worker
/// the same). Now it is the request's: answered `limits_exceeded` with the figures at its first
/// attempt, the offset committed, the pod ready, and the next request served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_video_whose_outputs_can_never_fit_the_scratch_is_answered_not_held() {
    a_video_that_can_never_fit(8, "g-video-fill").await;
}

/// Issue 56: the same upload on a 24 MiB scratch, one job at a time. ffmpeg's last write there
/// did not fit and its temporary segment was deleted, so every failure left 1,097,728 bytes
/// free: the volume never looked full, the job was taken for a fault of the pod, retried and held,
/// and never answered. Its writes pass its budget (the volume less the reserve and the source)
/// however its encoder writes: answered at its first attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_video_past_its_budget_is_answered_whatever_its_last_write() {
    a_video_that_can_never_fit(24, "g-video-budget").await;
}

/// The upload (`ffmpeg -f lavfi -i "nullsrc=s=1280x720:r=30,geq=random(1)*255:128:128"
/// -t 20 -c:v libx264 -preset ultrafast -crf 51 -pix_fmt yuv420p`) with the `streaming` profile
/// on a `mib` MiB scratch, one job at a time, a photo behind it: the video is answered
/// `limits_exceeded` with the figures at its first attempt, never taken for the pod's fault, the
/// pod ready, the photo completed, both offsets committed.
async fn a_video_that_can_never_fit(mib: u64, group: &str) {
    let scratch = Tmpfs::mount(mib);
    let stack = Stack::start(1).await;
    let worker = on_scratch(&stack, group, &scratch, &[("WORKER_POOL_SIZE", "1")]);
    let dir = tempfile::tempdir().unwrap();
    let noise = noise_video(dir.path(), 20);
    let size = std::fs::metadata(&noise).unwrap().len();
    eprintln!("noise video: {size} bytes");
    stack.upload_file("noise.mp4", &noise).await;
    stack.upload_corpus("pillow_flower.jpg").await;
    let responses = stack.responses();
    let mut req = request("noise", "noise.mp4");
    req.profile = Some("streaming".into());
    stack.send(&req).await;
    stack.send(&request("after", "pillow_flower.jpg")).await;
    // Before issue 56 on 24 MiB: 10 attempts in 100 s, then held, never answered.
    let got = responses.take(2, 3 * MINUTE);
    let answer = |key: &str| {
        let r = got.iter().find(|r| r.key == key);
        &r.unwrap_or_else(|| panic!("{key} not answered")).body
    };
    let noise = answer("noise");
    eprintln!(
        "noise video on {mib} MiB: answered after {} ms",
        noise.duration_ms
    );
    too_large_for_the_scratch(noise, &format!("noise video on {mib} MiB"));
    assert!(
        !worker
            .log()
            .contains("failed with the scratch file system full"),
        "taken for the pod's fault"
    );
    let after = answer("after");
    assert_eq!(after.status, Status::Completed, "{:?}", after.error);
    wait_for("offsets committed", MINUTE, || {
        (stack.committed(group, 1) == vec![2]).then_some(())
    });
    assert_eq!(readiness(&worker).map(|(s, _)| s), Some(200), "ready");
}

/// Issue 65: a volume that another job fills. The upload (its outputs pass any budget
/// 24 MiB can give) beside an ordinary photo (the noise photo at thirteen WebP widths, within
/// its budget), pool 2. The photo is slow: held stopped once its directory holds 6 MiB (7.5 MB
/// here), until the video's first attempt has failed. The video then meets a full volume before
/// it passes its budget (about 13 MB of its 19.8 MB): the pod's fault for that attempt (SIGBUS
/// twice, "failed with the scratch file system full"). Answered once, `limits_exceeded`, at its
/// second attempt, once it ran with the room it needed; the photo completed; both offsets
/// committed. (It passed before the fix too: ffmpeg leaves its segments, so what the directory
/// held at the failure was its peak; `scratch::a_full_volume_makes_a_job_wait_for_twice_its_peak`
/// is the encoder that deletes its work.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_video_that_can_never_fit_beside_a_job_that_fills_the_volume_is_answered_once() {
    let dir = tempfile::tempdir().unwrap();
    let (photo, _) = noise_photo_and_profiles(dir.path());
    let config = dir.path().join("wide.toml");
    let widths: Vec<String> = (0..13).map(|i| (640 + 160 * i).to_string()).collect();
    std::fs::write(
        &config,
        format!(
            "[profiles.wide]\nanalysis = false\nwidths = [{}]\n\
             formats = [{{ format = \"webp\", quality = 90 }}]\n",
            widths.join(", ")
        ),
    )
    .unwrap();
    let noise = noise_video(dir.path(), 20);
    let scratch = Tmpfs::mount(24);
    let stack = Stack::start(1).await;
    let config = config.display().to_string();
    let worker = on_scratch(
        &stack,
        "g-beside",
        &scratch,
        &[("MEDIA_WORKER_CONFIG", &config)],
    );
    stack.upload_file("noise.jpg", &photo).await;
    stack.upload_file("noise.mp4", &noise).await;
    let responses = stack.responses();
    let mut ordinary = request("photo", "noise.jpg");
    ordinary.profile = Some("wide".into());
    stack.send(&ordinary).await;
    // The photo's directory once it holds 6 MiB: its job process is stopped there.
    let jobs = scratch.path().join("jobs");
    let photo_dir = wait_for("the photo's directory", MINUTE, || {
        let id = worker
            .jobs()
            .into_iter()
            .find(|j| j["media_id"] == "photo")?["id"]
            .as_str()?
            .to_owned();
        Some(jobs.join(id))
    });
    wait_for("6 MiB in the photo's directory", MINUTE, || {
        (media_worker::scratch::used_bytes(&photo_dir) >= 6 * MIB).then_some(())
    });
    let photo_process = job_process(&worker, &[]);
    // SAFETY: signals to a process of this test's worker.
    unsafe { libc::kill(photo_process, libc::SIGSTOP) };
    let held = media_worker::scratch::used_bytes(&photo_dir);
    let mut video = request("noise", "noise.mp4");
    video.profile = Some("streaming".into());
    stack.send(&video).await;
    let video_of = |w: &Worker| w.jobs().into_iter().find(|j| j["media_id"] == "noise");
    wait_for("the video taken in", MINUTE, || video_of(&worker));
    // Its first attempt over: a second one, or its answer.
    wait_for("the video's first attempt over", 5 * MINUTE, || {
        video_of(&worker)
            .is_none_or(|j| j["attempt"].as_u64() >= Some(2))
            .then_some(())
    });
    eprintln!("the photo held {held} bytes while the video's first attempt ran");
    unsafe { libc::kill(photo_process, libc::SIGCONT) };
    let got = responses.take(2, 5 * MINUTE);
    let answer = |key: &str| {
        let r = got.iter().find(|r| r.key == key);
        &r.unwrap_or_else(|| panic!("{key} not answered: {got:?}"))
            .body
    };
    let photo = answer("photo");
    assert_eq!(photo.status, Status::Completed, "{:?}", photo.error);
    let noise = answer("noise");
    let error = noise.error.as_ref().expect("the video failed");
    eprintln!(
        "video beside the photo: {:?} after {} attempts: {}",
        error.code, noise.attempts, error.message
    );
    assert_eq!(
        (error.code, error.retryable),
        (media_worker::contract::ErrorCode::LimitsExceeded, false),
        "{}",
        error.message
    );
    assert!(
        responses.next(Duration::from_secs(3)).is_none(),
        "answered twice"
    );
    wait_for("offsets committed", MINUTE, || {
        (stack.committed("g-beside", 1) == vec![2]).then_some(())
    });
}

/// The upload, `secs` long: 720p of noise, each frame new (`geq=random(1)`), in H.264
/// at the lowest quality (about 135 KB a second), whose rungs no encoder can shrink.
fn noise_video(dir: &Path, secs: u32) -> PathBuf {
    generated(
        dir,
        &format!("noise-{secs}s.mp4"),
        Command::new("ffmpeg").args([
            "-v",
            "error",
            "-y",
            "-f",
            "lavfi",
            "-i",
            "nullsrc=s=1280x720:r=30,geq=random(1)*255:128:128",
            "-t",
            &secs.to_string(),
            "-c:v",
            "libx264",
            "-preset",
            "ultrafast",
            "-crf",
            "51",
            "-pix_fmt",
            "yuv420p",
        ]),
    )
}

/// A source larger than this pod's whole scratch is the request's failure: answered
/// `limits_exceeded` with the reason, before any byte is downloaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_larger_than_the_scratch_is_refused_without_a_download() {
    let scratch = Tmpfs::mount(8);
    let stack = Stack::start(1).await;
    let worker = on_scratch(&stack, "g-too-big", &scratch, &[]);
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.jpg");
    let mut bytes = std::fs::read(corpus("imageio_meadow_cube.jpg")).unwrap();
    bytes.resize(10 * MIB as usize, 0);
    std::fs::write(&big, bytes).unwrap();
    stack.upload_file("big.jpg", &big).await;
    let responses = stack.responses();
    stack.send(&request("big", "big.jpg")).await;
    let got = responses.take(1, MINUTE);
    let error = got[0].body.error.as_ref().expect("failed");
    assert_eq!(
        error.code,
        media_worker::contract::ErrorCode::LimitsExceeded,
        "{error:?}"
    );
    assert!(
        error.message.contains("bytes of scratch"),
        "{}",
        error.message
    );
    assert_eq!(
        worker.metric("media_worker_downloaded_bytes_total"),
        Some(0.0)
    );
}

/// A pids cgroup (v1) of the test's own, removed on drop once its processes are gone.
struct PidsCgroup {
    dir: PathBuf,
}

impl PidsCgroup {
    /// Moves `pids` into a new cgroup that allows no process beyond them.
    fn confining(pids: &[i32]) -> PidsCgroup {
        let dir = PathBuf::from(format!(
            "/sys/fs/cgroup/pids/media-worker-test-{}",
            std::process::id()
        ));
        std::fs::create_dir(&dir).expect("a pids cgroup (v1, root)");
        for pid in pids {
            std::fs::write(dir.join("cgroup.procs"), pid.to_string()).unwrap();
        }
        std::fs::write(dir.join("pids.max"), pids.len().to_string()).unwrap();
        PidsCgroup { dir }
    }

    fn lift(&self) {
        std::fs::write(self.dir.join("pids.max"), "max").unwrap();
    }
}

impl Drop for PidsCgroup {
    fn drop(&mut self) {
        let root = self.dir.parent().unwrap().join("cgroup.procs");
        let procs = std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines() {
            let _ = std::fs::write(&root, pid);
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// No sandbox can start: the fork servers are in a pids cgroup at its limit (the first one's
/// fork says EAGAIN and it is replaced; the job process the second forks once a slot is free
/// is refused a thread, and libvips says "corrupt") and a new server cannot be executed (its
/// program is gone: ENOENT). That is the pod's fault: the pod is not ready (`sandbox`), takes
/// nothing new, retries the job and then holds it, answering nothing; once a sandbox can start
/// again the job completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_that_cannot_start_holds_the_job_until_one_can() {
    let dir = tempfile::tempdir().unwrap();
    let program = dir.path().join("media-worker");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_media-worker"), &program).unwrap();
    let stack = Stack::start(1).await;
    let mut env = stack.worker_env("g-no-sandbox");
    env.insert(
        "MEDIA_SANDBOX_PROGRAM".into(),
        program.display().to_string(),
    );
    env.insert("WORKER_POOL_SIZE".into(), "2".into());
    env.insert("RETRY_COUNT".into(), "1".into());
    let worker = Worker::start(&env);
    worker.wait_ready();
    let servers = worker.sandboxes();
    assert_eq!(servers.len(), 2, "two fork servers warm");

    let cgroup = PidsCgroup::confining(&servers);
    let gone = dir.path().join("moved-away");
    std::fs::rename(&program, &gone).unwrap();
    stack.upload_corpus("pillow_flower.jpg").await;
    let responses = stack.responses();
    stack
        .send(&request("no-sandbox", "pillow_flower.jpg"))
        .await;

    held_while_not_ready(&worker, &responses, "sandbox");
    let log = worker.log();
    assert!(
        log.contains("cannot fork: Resource temporarily unavailable"),
        "{log}"
    );
    assert!(
        log.contains("failed under the pod's process limit"),
        "{log}"
    );
    wait_for("the probe refused", MINUTE, || {
        worker
            .log()
            .contains("cannot start a sandbox: No such file")
            .then_some(())
    });

    cgroup.lift();
    std::fs::rename(&gone, &program).unwrap();
    let got = responses.take(1, 2 * MINUTE);
    let body = &got[0].body;
    assert_eq!(body.status, Status::Completed, "{:?}", body.error);
    eprintln!(
        "no sandbox: held, {} attempts ({} retried), answered completed",
        body.attempts,
        body.attempts - 1
    );
    wait_for("ready again", MINUTE, || {
        readiness(&worker).filter(|(status, _)| *status == 200)
    });
    wait_for("offset committed", MINUTE, || {
        (stack.committed("g-no-sandbox", 1) == vec![1]).then_some(())
    });
    drop(cgroup);
}
