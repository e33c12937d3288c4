//! End-to-end: the worker binary against a real broker (Apache Kafka) and a real S3 server (s3s-fs).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::*;
use media_worker::contract::ErrorCode;
use media_worker::contract::Stage;
use media_worker::contract::{OptimizeResponse, Status};
use media_worker::media::settings::DEFAULT_CACHE_CONTROL;
use media_worker::media::transform::plan_widths;
use media_worker::media::vips::Image;

fn by_media_id(rs: Vec<Received>) -> BTreeMap<String, Received> {
    rs.into_iter()
        .map(|r| (r.body.media_id.clone().unwrap_or_else(|| r.key.clone()), r))
        .collect()
}

/// Decodes bytes with libvips (through a temp file) and returns the image.
fn decode(bytes: &[u8]) -> Image {
    media_worker::media::vips::init(1);
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), bytes).unwrap();
    Image::open(f.path()).unwrap().into_memory().unwrap()
}

fn assert_failed(r: &OptimizeResponse, codes: &[ErrorCode]) {
    assert_eq!(r.status, Status::Failed, "{r:?}");
    assert!(!r.success);
    let e = r.error.as_ref().expect("error body");
    assert!(
        codes.contains(&e.code),
        "unexpected {:?} for {:?}",
        e.code,
        r.media_id
    );
}

/// A config file with a deliberately expensive profile `slow` (AVIF and WebP of the 25 MP
/// meadow strip at four sizes: seconds of work, for tests that need a job in flight).
fn slow_profile_config() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("slow.toml");
    std::fs::write(
        &config,
        "[profiles.slow]\nanalysis = false\nwidths = [640, 1280, 1920, 2048]\n\
         formats = [{ format = \"avif\", quality = 60 }, { format = \"webp\", quality = 90 }]\n",
    )
    .unwrap();
    (dir, config)
}

/// The environment of a worker with the `slow` profile, one job slot and at most
/// `max_in_flight` messages taken: it reaches its bound and pauses (flow control).
fn bounded_slow_worker(
    stack: &Stack,
    group: &str,
    max_in_flight: usize,
) -> (tempfile::TempDir, std::collections::HashMap<String, String>) {
    let (dir, config) = slow_profile_config();
    let mut env = stack.worker_env(group);
    env.insert("MEDIA_WORKER_CONFIG".into(), config.display().to_string());
    env.insert("WORKER_POOL_SIZE".into(), "1".into());
    env.insert("MAX_IN_FLIGHT".into(), max_in_flight.to_string());
    (dir, env)
}

const PHOTOS: [&str; 20] = [
    "dlib_2007_007763.jpg",
    "dlib_2008_002470.jpg",
    "dlib_dogs.jpg",
    "dlib_horses.jpg",
    "face_recognition_alex-lacamoire.png",
    "face_recognition_kit_with_rose.jpg",
    "face_recognition_obama.jpg",
    "face_recognition_two_people.jpg",
    "imageio_astronaut.png",
    "imageio_chelsea.png",
    "imageio_coffee.png",
    "libheif_example.avif",
    "libheif_example.heic",
    "libvips_sample.png",
    "pillow_flower.jpg",
    "sharp_4.webp",
    "sharp_5_webp_a.webp",
    "sharp_Channel_digital_image_CMYK_color.jpg",
    "sharp_concert.jpg",
    "sharp_cielab-dagams.tiff",
];

/// (a) 20 corpus images → 20 responses; every output exists, has the right content type and
/// cache headers, decodes, and has the stated dimensions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corpus_images_become_decodable_variants() {
    let stack = Stack::start(2).await;
    let mut env = stack.worker_env("g-a");
    env.insert("WORKER_POOL_SIZE".into(), "2".into());
    let worker = Worker::start(&env);
    let responses = stack.responses();
    for (i, name) in PHOTOS.iter().enumerate() {
        stack.upload_corpus(name).await;
        stack.send(&request(&format!("photo-{i}"), name)).await;
    }
    let got = by_media_id(responses.take(PHOTOS.len(), 5 * MINUTE));
    assert_eq!(got.len(), PHOTOS.len());
    for (i, name) in PHOTOS.iter().enumerate() {
        let r = &got[&format!("photo-{i}")].body;
        assert_eq!(r.status, Status::Completed, "{name}: {:?}", r.error);
        assert_eq!(
            r.request_id.as_deref(),
            Some(format!("req-photo-{i}").as_str())
        );
        let a = r.analysis.as_ref().and_then(|a| a.image());
        let a = a.expect("default profile analyses an image");
        let v = a.vision.as_ref().expect("OpenCV analysis");
        assert_eq!(v.phash.len(), 16, "{name}");
        let variants: Vec<_> = r.outputs.iter().filter(|o| o.role == "variant").collect();
        let widths: BTreeSet<u32> = variants.iter().map(|o| o.width).collect();
        let planned: BTreeSet<u32> = plan_widths(&[320, 640, 1280, 1920], a.width)
            .into_iter()
            .collect();
        assert_eq!(widths, planned, "{name}");
        assert_eq!(
            variants.len(),
            planned.len() * 2,
            "{name}: webp + jpeg per width"
        );
        let thumbs: BTreeSet<&str> = r
            .outputs
            .iter()
            .filter(|o| o.role == "thumbnail")
            .map(|o| o.key.as_str())
            .collect();
        let prefix = format!("user-1/images/photo-{i}/thumb_256x256");
        assert_eq!(
            thumbs,
            BTreeSet::from([
                format!("{prefix}.webp").as_str(),
                format!("{prefix}.jpg").as_str()
            ])
        );
        for o in &r.outputs {
            let (bytes, ct, cc) = stack.get(&o.bucket, &o.key).await;
            assert_eq!(ct.as_deref(), Some(o.content_type.as_str()), "{}", o.key);
            assert_eq!(cc.as_deref(), Some(DEFAULT_CACHE_CONTROL));
            assert_eq!(bytes.len() as u64, o.size_bytes, "{}", o.key);
            let img = decode(&bytes);
            assert_eq!(
                (img.width(), img.height()),
                (o.width, o.height),
                "{}",
                o.key
            );
            if o.role == "variant" {
                let ext = if o.format == "jpeg" {
                    "jpg"
                } else {
                    o.format.as_str()
                };
                assert_eq!(o.key, format!("user-1/images/photo-{i}/{}w.{ext}", o.width));
                let expect_h = (a.height as f64 * o.width as f64 / a.width as f64).round() as i64;
                assert!(
                    (o.height as i64 - expect_h).abs() <= 1,
                    "{}: aspect kept",
                    o.key
                );
            }
        }
    }
    let completed = worker.metric("media_worker_jobs_total{error_code=\"\",outcome=\"completed\"}");
    assert_eq!(completed, Some(PHOTOS.len() as f64));
}

/// (b) EXIF orientations 1-8 → 320w and 600w, upright landscape 4:3, matching orientation 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exif_orientations_are_applied() {
    let stack = Stack::start(1).await;
    let _worker = Worker::start(&stack.worker_env("g-b"));
    let responses = stack.responses();
    for n in 1..=8 {
        let name = format!("sharp_Landscape_{n}.jpg");
        stack.upload_corpus(&name).await;
        stack.send(&request(&format!("landscape-{n}"), &name)).await;
    }
    let got = by_media_id(responses.take(8, 3 * MINUTE));
    let mut pixels = BTreeMap::new();
    for n in 1..=8 {
        let r = &got[&format!("landscape-{n}")].body;
        assert_eq!(r.status, Status::Completed);
        let dims: BTreeSet<(u32, u32)> = r
            .outputs
            .iter()
            .filter(|o| o.role == "variant")
            .map(|o| (o.width, o.height))
            .collect();
        assert_eq!(
            dims,
            BTreeSet::from([(320, 240), (600, 450)]),
            "orientation {n}"
        );
        let o = r
            .outputs
            .iter()
            .find(|o| o.width == 600 && o.format == "jpeg")
            .unwrap();
        let img = decode(&stack.get(&o.bucket, &o.key).await.0);
        pixels.insert(n, img.to_bytes().unwrap());
    }
    let diff = |a: &[u8], b: &[u8]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| x.abs_diff(*y) as u64)
            .sum::<u64>() as f64
            / a.len() as f64
    };
    // Sanity: the metric sees a mirror (orientation 1 vs its own flip) as very different.
    let flipped: Vec<u8> = pixels[&1]
        .chunks(600 * 3)
        .flat_map(|row| row.chunks(3).rev().flatten().copied().collect::<Vec<_>>())
        .collect();
    assert!(diff(&pixels[&1], &flipped) > 40.0);
    for n in 2..=8 {
        let d = diff(&pixels[&1], &pixels[&n]);
        // Each fixture carries its own digit and its own JPEG encoding: about 10 here.
        assert!(
            d < 20.0,
            "orientation {n} differs from 1 by {d:.2} per channel"
        );
    }
}

/// (c) broken files fail with corrupt_input / unsupported_media, and the worker keeps going.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_files_fail_cleanly_and_the_worker_continues() {
    let stack = Stack::start(1).await;
    let worker = Worker::start(&stack.worker_env("g-c"));
    let responses = stack.responses();
    let broken = [
        "sharp_truncated.jpg",
        "sharp_truncated.png",
        "sharp_corrupt-header.jpg",
        "pillow_broken.png",
        "chorus_not_an_image.jpg",
        "pillow_heif_empty.heic",
        "sharp_check.svg",
    ];
    for (i, name) in broken.iter().enumerate() {
        stack.upload_corpus(name).await;
        stack.send(&request(&format!("broken-{i}"), name)).await;
    }
    stack.upload_corpus("sharp_Landscape_1.jpg").await;
    stack
        .send(&request("after-broken", "sharp_Landscape_1.jpg"))
        .await;
    let got = by_media_id(responses.take(broken.len() + 1, 3 * MINUTE));
    for (i, name) in broken.iter().enumerate() {
        let r = &got[&format!("broken-{i}")].body;
        assert_failed(r, &[ErrorCode::CorruptInput, ErrorCode::UnsupportedMedia]);
        let e = r.error.as_ref().unwrap();
        assert!(
            !e.retryable && r.attempts == 1,
            "{name}: permanent, not retried"
        );
        assert!(
            matches!(e.stage, Stage::Probe | Stage::Analyze | Stage::Transform),
            "{name}: {:?}",
            e.stage
        );
    }
    assert_eq!(got["after-broken"].body.status, Status::Completed);
    assert_eq!(worker.http_get("/health/live").unwrap().0, 200);
}

/// (d) a missing source → source_not_found, not retried; traceparent continues the trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_source_is_not_retried() {
    let stack = Stack::start(1).await;
    let _worker = Worker::start(&stack.worker_env("g-d"));
    let responses = stack.responses();
    let req = request("ghost", "no/such/key.jpg");
    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    stack
        .send_raw(
            &req.media_id,
            &serde_json::to_vec(&req).unwrap(),
            Some(parent),
        )
        .await;
    let r = responses.take(1, MINUTE).remove(0);
    assert_failed(&r.body, &[ErrorCode::SourceNotFound]);
    let e = r.body.error.as_ref().unwrap();
    assert_eq!(
        (e.stage, e.retryable, r.body.attempts),
        (Stage::Download, false, 1)
    );
    assert_eq!(r.key, "ghost");
    let tp = r.traceparent.expect("traceparent on the response");
    assert!(
        tp.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-") && tp != parent,
        "{tp}"
    );
}

/// (e) S3 down → retried RETRY_COUNT times, then held (the output store is unreachable: the
/// pod is not well, so the job is not failed) with intake paused; S3 back → completed, and
/// nothing was answered failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_outage_holds_the_job_until_the_store_is_back() {
    let mut stack = Stack::start(1).await;
    let mut env = stack.worker_env("g-e");
    env.insert("RETRY_COUNT".into(), "2".into());
    env.insert("S3_PROBE_INTERVAL_SECS".into(), "1".into());
    let worker = Worker::start(&env);
    let responses = stack.responses();
    stack.upload_corpus("sharp_Landscape_1.jpg").await;

    stack.s3.stop();
    stack
        .send(&request("during-outage", "sharp_Landscape_1.jpg"))
        .await;
    wait_for("the job held", 2 * MINUTE, || {
        (worker.metric("media_worker_jobs_held") == Some(1.0)).then_some(())
    });
    let jobs = worker.jobs();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0]["phase"], "held", "{jobs:?}");
    let retried = "media_worker_retries_total{error_code=\"storage_unavailable\"}";
    assert_eq!(
        worker.metric(retried),
        Some(2.0),
        "RETRY_COUNT retries first"
    );
    wait_for("intake paused", MINUTE, || {
        (worker.metric("media_worker_kafka_paused") == Some(1.0)).then_some(())
    });
    assert!(
        responses.next(Duration::from_millis(500)).is_none(),
        "nothing answered"
    );

    stack.s3.restart();
    stack
        .send(&request("after-outage", "sharp_Landscape_1.jpg"))
        .await;
    let got = by_media_id(responses.take(2, 2 * MINUTE));
    for (id, r) in &got {
        assert_eq!(r.body.status, Status::Completed, "{id}: {:?}", r.body.error);
    }
    assert!(
        got["during-outage"].body.attempts >= 4,
        "3 before the hold, then 1+"
    );
    assert_eq!(worker.metric("media_worker_jobs_held"), Some(0.0));
}

/// A repeated request is answered from the manifest (no download, no transform) while the
/// source and profile are unchanged; a new source version, another profile or `force`
/// process it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_requests_replay_the_stored_result() {
    let stack = Stack::start(1).await;
    let worker = Worker::start(&stack.worker_env("g-replay"));
    worker.wait_ready();
    let responses = stack.responses();
    stack.upload_corpus("rails_racecar.jpg").await;
    let first = request("rp", "rails_racecar.jpg");
    stack.send(&first).await;
    let r1 = responses.take(1, MINUTE).remove(0).body;
    assert_eq!((r1.status, r1.replayed), (Status::Completed, false));
    let manifest = stack
        .get(OUTPUT_BUCKET, "user-1/images/rp/manifest.json")
        .await;
    assert_eq!(manifest.1.as_deref(), Some("application/json"));
    let downloaded = worker.metric("media_worker_downloaded_bytes_total ");

    let mut again = first.clone();
    again.request_id = "req-rp-again".into();
    stack.send(&again).await;
    let r2 = responses.take(1, MINUTE).remove(0).body;
    assert!(r2.replayed, "answered from the manifest");
    assert_eq!(
        r2.request_id.as_deref(),
        Some("req-rp-again"),
        "ids are this request's"
    );
    assert_eq!(
        (r2.outputs.clone(), r2.analysis.clone()),
        (r1.outputs.clone(), r1.analysis.clone())
    );
    assert_eq!(
        worker.metric("media_worker_downloaded_bytes_total "),
        downloaded,
        "nothing downloaded"
    );
    assert_eq!(worker.metric("media_worker_replays_total "), Some(1.0));

    // Another profile, `force`, and a new version of the source are processed again.
    let other_profile = first.clone().with_profile("variants");
    let mut forced = first.clone();
    forced.force = true;
    for req in [other_profile, forced] {
        stack.send(&req).await;
        let r = responses.take(1, MINUTE).remove(0).body;
        assert_eq!((r.status, r.replayed), (Status::Completed, false));
    }
    stack
        .upload_file("rails_racecar.jpg", &corpus("sharp_4.webp"))
        .await;
    stack.send(&first).await;
    let r = responses.take(1, MINUTE).remove(0).body;
    assert_eq!(
        (r.status, r.replayed),
        (Status::Completed, false),
        "new ETag"
    );
    assert_ne!(r.analysis, r1.analysis, "the new source was analysed");
    assert_eq!(worker.metric("media_worker_replays_total "), Some(1.0));
}

/// (f) the same request twice → identical keys and bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redelivery_writes_identical_outputs() {
    let stack = Stack::start(1).await;
    let _worker = Worker::start(&stack.worker_env("g-f"));
    let responses = stack.responses();
    stack.upload_corpus("sharp_5_webp_a.webp").await;
    let mut req = request("twice", "sharp_5_webp_a.webp");
    let mut runs = Vec::new();
    for _ in 0..2 {
        stack.send(&req).await;
        // The second time, processed again rather than answered from the manifest.
        req.force = true;
        let r = responses.take(1, MINUTE).remove(0).body;
        assert_eq!(r.status, Status::Completed);
        let mut objects = BTreeMap::new();
        for o in &r.outputs {
            objects.insert(o.key.clone(), stack.get(&o.bucket, &o.key).await.0);
        }
        runs.push(objects);
    }
    assert!(!runs[0].is_empty());
    assert_eq!(runs[0], runs[1]);
}

/// (g) SIGTERM with 4 jobs in flight → 4 responses, offsets committed, exit 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_jobs() {
    let stack = Stack::start(1).await;
    let mut env = stack.worker_env("g-g");
    env.insert("WORKER_POOL_SIZE".into(), "4".into());
    env.insert("SHUTDOWN_TIMEOUT_SECS".into(), "240".into());
    let mut worker = Worker::start(&env);
    worker.wait_ready();
    let responses = stack.responses();
    for name in ["imageio_meadow_cube.jpg", "rails_racecar.jpg"] {
        stack.upload_corpus(name).await;
    }
    for (i, name) in ["imageio_meadow_cube.jpg", "rails_racecar.jpg"]
        .iter()
        .cycle()
        .take(4)
        .enumerate()
    {
        stack.send(&request(&format!("drain-{i}"), name)).await;
    }
    wait_for("4 jobs in flight", MINUTE, || {
        (worker.jobs().len() == 4).then_some(())
    });
    worker.sigterm();
    // Draining: not ready (no new work), the jobs still running.
    let ready: serde_json::Value = wait_for("not ready while draining", MINUTE, || {
        let (status, body) = worker.http_get("/health/ready")?;
        (status == 503).then(|| serde_json::from_str(&body).unwrap())
    });
    assert_eq!(ready["consuming"], false, "{ready}");
    assert!(!worker.jobs().is_empty(), "jobs run on while draining");
    let status = worker.wait_exit(5 * MINUTE);
    assert_eq!(status.code(), Some(0), "{}", worker.log());
    let got = responses.take(4, MINUTE);
    assert!(got.iter().all(|r| r.body.status == Status::Completed));
    assert_eq!(stack.committed("g-g", 1), vec![4]);
    assert!(
        std::fs::read_dir(worker.scratch_dir())
            .unwrap()
            .next()
            .is_none(),
        "scratch cleaned"
    );
}

/// (h) invalid JSON and bad ids → invalid_request; offsets committed; the worker carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_requests_are_answered_and_committed() {
    let stack = Stack::start(1).await;
    let _worker = Worker::start(&stack.worker_env("g-h"));
    let responses = stack.responses();
    stack.send_raw("k1", b"{this is not json", None).await;
    let mut bad_id = serde_json::to_value(request("x", "y")).unwrap();
    bad_id["media_id"] = "../../etc/passwd".into();
    bad_id["request_id"] = "req-bad-id".into();
    stack
        .send_raw("k2", bad_id.to_string().as_bytes(), None)
        .await;
    let mut no_source = serde_json::to_value(request("no-source", "y")).unwrap();
    no_source.as_object_mut().unwrap().remove("source");
    stack
        .send_raw("k3", no_source.to_string().as_bytes(), None)
        .await;
    stack.upload_corpus("pillow_flower.jpg").await;
    stack
        .send(&request("valid-after", "pillow_flower.jpg"))
        .await;

    let got = responses.take(4, 2 * MINUTE);
    let invalid: Vec<&Received> = got
        .iter()
        .filter(|r| r.body.media_id.as_deref() != Some("valid-after"))
        .collect();
    assert_eq!(invalid.len(), 3);
    for r in &invalid {
        assert_failed(&r.body, &[ErrorCode::InvalidRequest]);
        assert_eq!(r.body.error.as_ref().unwrap().stage, Stage::Validate);
    }
    let keys: BTreeSet<&str> = invalid.iter().map(|r| r.key.as_str()).collect();
    let topic = &stack.request_topic;
    assert_eq!(
        keys,
        BTreeSet::from([
            format!("{topic}-0-0").as_str(),
            format!("{topic}-0-1").as_str(),
            "no-source"
        ])
    );
    let echoed = invalid.iter().find(|r| r.key.ends_with("-0-1")).unwrap();
    assert_eq!(echoed.body.request_id.as_deref(), Some("req-bad-id"));
    assert!(
        got.iter()
            .any(|r| r.body.media_id.as_deref() == Some("valid-after") && r.body.success)
    );
    wait_for("offsets committed", MINUTE, || {
        (stack.committed("g-h", 1) == vec![4]).then_some(())
    });
}

/// Request shapes the worker refuses (docs/events.md): each is answered `invalid_request` at once
/// with a bounded message, never retried, and committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_request_shapes_get_bounded_invalid_request() {
    let stack = Stack::start(1).await;
    let mut env = stack.worker_env("g-shapes");
    env.insert("MAX_REQUEST_BYTES".into(), "960000".into());
    env.insert("ALLOWED_SOURCE_BUCKETS".into(), SOURCE_BUCKET.into());
    let _worker = Worker::start(&env);
    let responses = stack.responses();
    let shaped = |id: &str, f: &dyn Fn(&mut serde_json::Value)| {
        let mut v = serde_json::to_value(request(id, "pillow_flower.jpg")).unwrap();
        f(&mut v);
        v.to_string()
    };
    let big = |n: usize| "x".repeat(n);
    let cases = [
        shaped("huge-profile", &|v| v["profile"] = big(900_000).into()),
        shaped("huge-media-type", &|v| {
            v["media_type"] = big(900_000).into()
        }),
        shaped("huge-bucket", &|v| {
            v["source"]["bucket"] = big(950_000).into()
        }),
        shaped("upper-bucket", &|v| {
            v["source"]["bucket"] = "Uploads".into()
        }),
        shaped("long-key", &|v| v["source"]["key"] = big(1025).into()),
        shaped("other-bucket", &|v| {
            v["source"]["bucket"] = "billing".into()
        }),
        shaped("oversized", &|v| v["pad"] = big(970_000).into()),
    ];
    for (i, payload) in cases.iter().enumerate() {
        stack
            .send_raw(&format!("k{i}"), payload.as_bytes(), None)
            .await;
    }
    let got = responses.take(cases.len(), 2 * MINUTE);
    for r in &got {
        assert_failed(&r.body, &[ErrorCode::InvalidRequest]);
        let e = r.body.error.as_ref().unwrap();
        assert_eq!(
            (e.stage, e.retryable, r.body.attempts),
            (Stage::Validate, false, 0)
        );
        assert!(
            e.message.chars().count() <= 330,
            "{}: {} chars",
            r.key,
            e.message.len()
        );
        assert!(
            serde_json::to_vec(&r.body).unwrap().len() < 4096,
            "{}",
            r.key
        );
    }
    let by_key = by_media_id(got);
    let message = |id: &str| by_key[id].body.error.as_ref().unwrap().message.clone();
    assert!(message("huge-bucket").contains("not an S3 bucket name"));
    assert!(message("other-bucket").contains("not allowed"));
    assert!(message("long-key").contains("1-1024 bytes"));
    let oversized = format!("{}-0-6", stack.request_topic);
    assert!(
        message(&oversized).contains("960000-byte limit"),
        "{}",
        message(&oversized)
    );
    wait_for("offsets committed", MINUTE, || {
        (stack.committed("g-shapes", 1) == vec![cases.len() as i64]).then_some(())
    });
}

/// (i) a job finishing before an earlier, slower one does not commit past it: after a crash
/// the slow one is redelivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_job_never_commits_past_a_slow_one() {
    let stack = Stack::start(1).await;
    let (_dir, config) = slow_profile_config();
    let mut env = stack.worker_env("g-i");
    env.insert("WORKER_POOL_SIZE".into(), "2".into());
    env.insert("MEDIA_WORKER_CONFIG".into(), config.display().to_string());
    let mut worker = Worker::start(&env);
    let responses = stack.responses();
    stack.upload_corpus("imageio_meadow_cube.jpg").await;
    stack.upload_corpus("pillow_flower.jpg").await;
    let mut slow = request("slow", "imageio_meadow_cube.jpg");
    slow.profile = Some("slow".into());
    stack.send(&slow).await;
    wait_for("slow job running", MINUTE, || {
        (!worker.jobs().is_empty()).then_some(())
    });
    stack.send(&request("fast", "pillow_flower.jpg")).await;

    let first = responses.take(1, 2 * MINUTE).remove(0);
    assert_eq!(
        first.body.media_id.as_deref(),
        Some("fast"),
        "the fast job answers first"
    );
    // A negative cannot be awaited: read the committed offset once per commit interval
    // (KAFKA_COMMIT_INTERVAL_MS=200) for 10 intervals after the fast job's ack, and require that
    // it never passes the unfinished offset 0.
    let mut every_commit = tokio::time::interval(Duration::from_millis(200));
    for _ in 0..10 {
        every_commit.tick().await;
        let committed = stack.committed("g-i", 1)[0];
        assert!(
            committed <= 0,
            "committed {committed} past the slow job's offset 0"
        );
    }
    assert_eq!(worker.jobs().len(), 1, "slow job still running");
    worker.kill9();

    let _restarted = Worker::start(&env);
    let redelivered = wait_for("slow job redelivered", 5 * MINUTE, || {
        responses
            .next(Duration::from_millis(500))
            .filter(|r| r.body.media_id.as_deref() == Some("slow"))
    });
    assert_eq!(
        redelivered.body.status,
        Status::Completed,
        "{:?}",
        redelivered.body.error
    );
}

/// Jobs still running at the shutdown deadline are abandoned: exit non-zero, no commit, and the
/// next worker gets the message again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_deadline_abandons_without_committing() {
    let stack = Stack::start(1).await;
    let (_dir, config) = slow_profile_config();
    let mut env = stack.worker_env("g-j");
    env.insert("MEDIA_WORKER_CONFIG".into(), config.display().to_string());
    env.insert("SHUTDOWN_TIMEOUT_SECS".into(), "2".into());
    let mut worker = Worker::start(&env);
    let responses = stack.responses();
    stack.upload_corpus("imageio_meadow_cube.jpg").await;
    let mut slow = request("too-slow", "imageio_meadow_cube.jpg");
    slow.profile = Some("slow".into());
    stack.send(&slow).await;
    wait_for("job running", MINUTE, || {
        worker
            .jobs()
            .iter()
            .any(|j| j["stage"] == "transform")
            .then_some(())
    });
    worker.sigterm();
    let status = worker.wait_exit(MINUTE);
    assert_eq!(status.code(), Some(1), "abandoned work is a non-zero exit");
    assert!(
        responses.next(Duration::from_secs(1)).is_none(),
        "no response for abandoned work"
    );
    assert!(stack.committed("g-j", 1)[0] <= 0);

    env.insert("SHUTDOWN_TIMEOUT_SECS".into(), "25".into());
    let _next = Worker::start(&env);
    let r = responses.take(1, 5 * MINUTE).remove(0).body;
    assert_eq!(
        (r.media_id.as_deref(), r.status),
        (Some("too-slow"), Status::Completed)
    );
}

/// A source over MAX_INPUT_BYTES fails input_too_large at download, without retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_sources_are_rejected() {
    let stack = Stack::start(1).await;
    let mut env = stack.worker_env("g-k");
    env.insert("MAX_INPUT_BYTES".into(), "50000".into());
    let _worker = Worker::start(&env);
    let responses = stack.responses();
    stack.upload_corpus("sharp_Landscape_1.jpg").await; // 139 KB
    stack.send(&request("big", "sharp_Landscape_1.jpg")).await;
    let r = responses.take(1, MINUTE).remove(0).body;
    assert_failed(&r, &[ErrorCode::InputTooLarge]);
    assert_eq!((r.error.unwrap().stage, r.attempts), (Stage::Download, 1));
}

/// Large outputs go up in parts, with the same headers, and come back byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_uploads_use_multipart() {
    use media_worker::storage::{ObjectMeta, S3Storage, Storage};
    let stack = Stack::start(1).await;
    let storage = S3Storage::with_client(stack.s3c.clone(), 16 * 1024 * 1024);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.bin");
    let data: Vec<u8> = (0..20 * 1024 * 1024u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 24) as u8)
        .collect();
    std::fs::write(&path, &data).unwrap();
    let meta = ObjectMeta {
        content_type: "video/mp4",
        cache_control: "public, max-age=31536000, immutable",
    };
    storage
        .upload(OUTPUT_BUCKET, "u/videos/m/big.mp4", &path, &meta)
        .await
        .unwrap();
    let head = stack
        .s3c
        .head_object()
        .bucket(OUTPUT_BUCKET)
        .key("u/videos/m/big.mp4")
        .send()
        .await
        .unwrap();
    let etag = head.e_tag().unwrap_or_default().to_owned();
    assert!(
        etag.trim_matches('"').ends_with("-3"),
        "3 parts of 8 MiB: {etag}"
    );
    let (bytes, ct, cc) = stack.get(OUTPUT_BUCKET, "u/videos/m/big.mp4").await;
    assert!(bytes == data, "round trip");
    assert_eq!(
        (ct.as_deref(), cc.as_deref()),
        (Some("video/mp4"), Some(meta.cache_control))
    );
}

/// Native work over MEDIA_TIMEOUT_SECS answers `timeout` (permanent: not retried).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn media_time_limit_answers_timeout() {
    let stack = Stack::start(1).await;
    let (_dir, config) = slow_profile_config();
    let mut env = stack.worker_env("g-t");
    env.insert("MEDIA_WORKER_CONFIG".into(), config.display().to_string());
    env.insert("MEDIA_TIMEOUT_SECS".into(), "1".into());
    let _worker = Worker::start(&env);
    let responses = stack.responses();
    stack.upload_corpus("imageio_meadow_cube.jpg").await;
    let mut slow = request("over-time", "imageio_meadow_cube.jpg");
    slow.profile = Some("slow".into());
    stack.send(&slow).await;
    let r = responses.take(1, MINUTE).remove(0).body;
    assert_failed(&r, &[ErrorCode::Timeout]);
    let e = r.error.unwrap();
    assert_eq!(
        (e.stage, e.retryable, r.attempts),
        (Stage::Transform, false, 1)
    );
}

/// The consumer takes no more than MAX_IN_FLIGHT messages; when the bound holds (long jobs) it
/// pauses its partitions (and keeps polling); it resumes below the low-water mark, and every
/// request is answered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_control_pauses_at_the_in_flight_bound() {
    let stack = Stack::start(1).await;
    let (_dir, env) = bounded_slow_worker(&stack, "g-flow", 2);
    let worker = Worker::start(&env);
    worker.wait_ready();
    let responses = stack.responses();
    stack.upload_corpus("rails_racecar.jpg").await;
    for i in 0..4 {
        let mut r = request(&format!("flow-{i}"), "rails_racecar.jpg");
        r.profile = Some("slow".into());
        stack.send(&r).await;
    }
    wait_for("consumer paused", MINUTE, || {
        (worker.metric("media_worker_kafka_paused ")? == 1.0).then_some(())
    });
    assert!(
        worker.jobs().len() <= 2,
        "never more than MAX_IN_FLIGHT jobs: {:?}",
        worker.jobs()
    );
    let got = by_media_id(responses.take(4, 5 * MINUTE));
    assert_eq!(got.len(), 4, "each request answered once");
    assert!(got.values().all(|r| r.body.status == Status::Completed));
    wait_for("resumed", MINUTE, || {
        (worker.metric("media_worker_kafka_paused ")? == 0.0).then_some(())
    });
}

/// `KAFKA_GROUP_PROTOCOL=consumer` against a broker without the consumer group protocol (Kafka
/// before 4.0, or one that turned it off): the worker says why and exits 1 rather than stay up
/// consuming nothing; the request stays in its topic, uncommitted, for a worker set up right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consumer_protocol_on_a_broker_without_it_stops_the_worker_with_a_reason() {
    let broker = Broker::cluster_with(1, "group.coordinator.rebalance.protocols=classic");
    let mut stack = Stack::on(broker, 1).await;
    stack.group_protocol = "consumer".into();
    stack.upload_corpus("imageio_chelsea.png").await;
    stack.send(&request("kip848", "imageio_chelsea.png")).await;
    let mut worker = Worker::spawn(&stack.worker_env("g-kip848"));
    let status = worker.wait_exit(MINUTE);
    assert_eq!(status.code(), Some(1), "{}", worker.log());
    assert!(
        worker.log().contains("consumer fatal error"),
        "{}",
        worker.log()
    );
    assert_eq!(stack.committed("g-kip848", 1), vec![-1]);
}

/// A partition taken from a paused worker and given back after it resumed is consumed again
/// (librdkafka keeps a partition's pause flag while it is away; the worker sets it anew on
/// every assignment). Found on Apache Kafka, where a broker failover moved partitions while
/// the workers were paused and one partition was never read again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_back_from_another_member_after_a_pause_is_consumed() {
    let stack = Stack::start(2).await;
    let (_dir, env) = bounded_slow_worker(&stack, "g-paused-away", 1);
    let a = Worker::start(&env);
    a.wait_ready();
    let responses = stack.responses();
    stack.upload_corpus("rails_racecar.jpg").await;
    stack.upload_corpus("imageio_chelsea.png").await;
    let mut slow = request("paused-slow", "rails_racecar.jpg");
    slow.profile = Some("slow".into());
    stack.send(&slow).await;
    wait_for("A paused at its bound", MINUTE, || {
        (a.metric("media_worker_kafka_paused ")? == 1.0).then_some(())
    });
    // B joins while A is paused: one partition moves to B.
    let mut b = Worker::start(&env);
    wait_for("B holding a partition", MINUTE, || {
        (b.metric("media_worker_kafka_assigned_partitions ")? == 1.0).then_some(())
    });
    let first = responses.take(1, 5 * MINUTE).remove(0).body;
    assert_eq!(first.status, Status::Completed);
    wait_for("A resumed", MINUTE, || {
        (a.metric("media_worker_kafka_paused ")? == 0.0).then_some(())
    });
    // B leaves: the partition comes back to A, which resumed while it was away.
    b.sigterm();
    assert!(b.wait_exit(MINUTE).success());
    wait_for("A holding both partitions", MINUTE, || {
        (a.metric("media_worker_kafka_assigned_partitions ")? == 2.0).then_some(())
    });
    let producer = stack.producer();
    for p in 0..2 {
        let r = request(&format!("after-{p}"), "imageio_chelsea.png");
        let payload = serde_json::to_vec(&r).unwrap();
        let record = rdkafka::producer::FutureRecord::to(&stack.request_topic)
            .key(&r.media_id)
            .partition(p)
            .payload(&payload);
        producer
            .send(record, Duration::from_secs(30))
            .await
            .map_err(|(e, _)| e)
            .unwrap();
    }
    let got = by_media_id(responses.take(2, 2 * MINUTE));
    assert!(got.values().all(|r| r.body.status == Status::Completed));
}

/// A job far longer than max.poll.interval.ms does not cost the member its partitions: the poll
/// loop never waits on jobs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_job_keeps_group_membership() {
    let stack = Stack::start(1).await;
    let (_dir, config) = slow_profile_config();
    let mut env = stack.worker_env("g-long");
    env.insert("MEDIA_WORKER_CONFIG".into(), config.display().to_string());
    // Short group timeouts, so that the job (about 13 s here) lasts several poll intervals even
    // on a faster machine. librdkafka wants the session timeout no longer than the interval; the
    // heartbeat is a third of it, as for every test worker.
    let interval = Duration::from_secs(3);
    let ms = interval.as_millis().to_string();
    env.insert("KAFKA_PROPERTY_MAX_POLL_INTERVAL_MS".into(), ms.clone());
    if stack.group_protocol == "classic" {
        env.insert("KAFKA_PROPERTY_SESSION_TIMEOUT_MS".into(), ms);
        env.insert("KAFKA_PROPERTY_HEARTBEAT_INTERVAL_MS".into(), "1000".into());
    }
    let worker = Worker::start(&env);
    worker.wait_ready();
    let responses = stack.responses();
    stack.upload_corpus("imageio_meadow_cube.jpg").await;
    let mut slow = request("long", "imageio_meadow_cube.jpg");
    slow.profile = Some("slow".into());
    let started = std::time::Instant::now();
    stack.send(&slow).await;
    let r = responses.take(1, 5 * MINUTE).remove(0).body;
    assert_eq!(r.status, Status::Completed);
    assert!(
        started.elapsed() > 2 * interval,
        "the job outlasted max.poll.interval.ms twice: {:?}",
        started.elapsed()
    );
    let revokes = worker
        .metric("media_worker_kafka_rebalances_total{kind=\"revoke\"}")
        .unwrap_or(0.0);
    assert_eq!(revokes, 0.0, "no eviction, no revoke");
    assert!(
        responses.next(Duration::from_secs(3)).is_none(),
        "processed once, not redelivered"
    );
}
