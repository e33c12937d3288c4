//! The job API and malware scanning against real servers: the worker binary, a real clamd
//! (Debian's, with an EICAR-only database), s3s-fs and Apache Kafka. `POST /scan` (raw body and S3
//! object), `POST /transcode` (success and each error class, the concurrency limit, a client
//! going away), bearer tokens and the tenants they are bound to, clamd stopped and back, and
//! `scan = true` in the Kafka pipeline.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;

use common::http::{self, Answer};
use common::*;
use media_worker::contract::{ErrorCode, OptimizeResponse, Stage, Status};
use media_worker::scan::Scanner;

const TOKEN: &str = "s3cr3t-token-for-tests";

fn auth() -> String {
    format!("Bearer {TOKEN}")
}

/// A worker with the API on a free loopback port, clamd, a tokens file, and `extra`.
fn api_worker(
    stack: &Stack,
    clamd: &Clamd,
    dir: &Path,
    extra: &[(&str, &str)],
) -> (Worker, SocketAddr) {
    let api: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let tokens = dir.join("tokens");
    std::fs::write(&tokens, format!("# test clients\n{TOKEN}\n")).unwrap();
    let mut env: HashMap<String, String> = stack.worker_env(&format!("g-api-{}", api.port()));
    for (k, v) in [
        ("API_ADDR", api.to_string()),
        ("API_TOKENS_FILE", tokens.display().to_string()),
        ("CLAMD_ADDR", clamd.addr()),
        ("WORKER_POOL_SIZE", "1".into()),
        ("RETRY_COUNT", "2".into()),
    ] {
        env.insert(k.into(), v);
    }
    for (k, v) in extra {
        env.insert((*k).into(), (*v).into());
    }
    (Worker::start(&env), api)
}

/// [`api_worker`] without Kafka intake (its broker unreachable), one API job slot, and `extra`.
fn one_slot_api(
    stack: &Stack,
    clamd: &Clamd,
    dir: &Path,
    extra: (&str, &str),
) -> (Worker, SocketAddr) {
    let dead_broker = format!("127.0.0.1:{}", free_port());
    let env = [
        ("KAFKA_INTAKE", "false"),
        ("KAFKA_BOOTSTRAP_SERVERS", dead_broker.as_str()),
        ("API_MAX_CONCURRENT", "1"),
        extra,
    ];
    api_worker(stack, clamd, dir, &env)
}

fn scan_raw(api: SocketAddr, body: &[u8]) -> Answer {
    http::post(
        api,
        "/scan",
        &[
            ("Authorization", &auth()),
            ("Content-Type", "application/octet-stream"),
        ],
        body,
    )
}

fn transcode(api: SocketAddr, body: &serde_json::Value) -> (Answer, OptimizeResponse) {
    let a = http::post(
        api,
        "/transcode",
        &[
            ("Authorization", &auth()),
            ("Content-Type", "application/json"),
        ],
        body.to_string().as_bytes(),
    );
    let r: OptimizeResponse = serde_json::from_slice(&a.body)
        .unwrap_or_else(|e| panic!("{e}: {} {}", a.status, String::from_utf8_lossy(&a.body)));
    (a, r)
}

fn error_code(a: &Answer) -> String {
    a.json()["error"]["code"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// The nice value of process `pid` (field 19 of `/proc/<pid>/stat`).
fn nice_of(pid: i32) -> Option<i64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(16)?
        .parse()
        .ok()
}

/// `format width height` of an image as Pillow reads it.
fn pillow(path: &Path) -> String {
    let out = std::process::Command::new("/usr/bin/python3")
        .args(["-c", "import sys; from PIL import Image; im = Image.open(sys.argv[1]); im.load(); print(im.format, *im.size)"])
        .arg(path)
        .output()
        .expect("Debian's python3 with python3-pil (scripts/setup.sh --test)");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scan_route_streams_bodies_and_objects_to_clamd() {
    let stack = Stack::start(1).await;
    let mut clamd = Clamd::start();
    let dir = tempfile::tempdir().unwrap();
    let (worker, api) = api_worker(
        &stack,
        &clamd,
        dir.path(),
        &[("MAX_INPUT_BYTES", "1000000")],
    );

    // The raw body: EICAR is found, a photo is clean; the verdict names the engine.
    let a = scan_raw(api, EICAR);
    assert_eq!(a.status, 200, "{}", String::from_utf8_lossy(&a.body));
    let v = a.json();
    assert_eq!(v["clean"], false);
    assert_eq!(v["signature"], EICAR_SIGNATURE);
    assert_eq!(v["scanned_bytes"], 68);
    assert!(
        v["engine"].as_str().unwrap().starts_with("ClamAV 1.4"),
        "{v}"
    );
    let photo = std::fs::read(corpus("imageio_coffee.png")).unwrap();
    assert!(photo.len() < 1_000_000);
    let v = scan_raw(api, &photo).json();
    assert_eq!(v["clean"], true, "{v}");
    assert_eq!(v["signature"], serde_json::Value::Null);
    assert_eq!(v["scanned_bytes"], photo.len());

    // Over MAX_INPUT_BYTES: refused by its declared length, and when streamed without one.
    let big = vec![7u8; 1_500_000];
    let a = scan_raw(api, &big);
    assert_eq!((a.status, error_code(&a).as_str()), (413, "too_large"));
    let a = http::post_chunked(api, "/scan", &[("Authorization", &auth())], &big, 16 << 10);
    assert_eq!((a.status, error_code(&a).as_str()), (413, "too_large"));

    // An object in S3, by reference.
    let eicar = dir.path().join("eicar.bin");
    std::fs::write(&eicar, EICAR).unwrap();
    // The scanner itself over both transports clamd offers.
    let metrics = std::sync::Arc::new(media_worker::telemetry::Metrics::new());
    for addr in [clamd.addr(), clamd.unix_addr()] {
        let scanner = Scanner::new(addr.parse().unwrap(), MINUTE, metrics.clone());
        assert!(scanner.ping().await, "{addr}");
        let v = scanner.scan_file(&eicar).await.unwrap();
        assert_eq!(v.signature.as_deref(), Some(EICAR_SIGNATURE), "{addr}");
        let v = scanner
            .scan_file(&corpus("imageio_coffee.png"))
            .await
            .unwrap();
        assert!(
            v.clean && v.engine.starts_with("ClamAV 1.4"),
            "{addr}: {v:?}"
        );
    }
    stack.upload_file("user-1/eicar.jpg", &eicar).await;
    let by_ref = |key: &str| {
        let body = serde_json::json!({"bucket": SOURCE_BUCKET, "key": key}).to_string();
        http::post(
            api,
            "/scan",
            &[
                ("Authorization", &auth()),
                ("Content-Type", "application/json"),
            ],
            body.as_bytes(),
        )
    };
    let v = by_ref("user-1/eicar.jpg").json();
    assert_eq!(
        (v["clean"].as_bool(), v["signature"].as_str()),
        (Some(false), Some(EICAR_SIGNATURE))
    );
    let a = by_ref("user-1/missing.jpg");
    assert_eq!((a.status, error_code(&a).as_str()), (404, "not_found"));
    let a = http::post(
        api,
        "/scan",
        &[
            ("Authorization", &auth()),
            ("Content-Type", "application/json"),
        ],
        b"{\"bucket\": \"Not_A_Bucket\", \"key\": \"k\"}",
    );
    assert_eq!((a.status, error_code(&a).as_str()), (400, "bad_request"));

    // Authentication: none, a wrong token, then a rotated file.
    let a = http::post(api, "/scan", &[], EICAR);
    assert_eq!(
        (a.status, a.header("www-authenticate")),
        (401, Some("Bearer"))
    );
    let a = http::post(api, "/scan", &[("Authorization", "Bearer wrong")], EICAR);
    assert_eq!((a.status, error_code(&a).as_str()), (401, "unauthorized"));
    std::fs::write(dir.path().join("tokens"), "rotated-token-after-a-while\n").unwrap();
    assert_eq!(
        scan_raw(api, EICAR).status,
        401,
        "the old token is refused once the file changes"
    );
    let a = http::post(
        api,
        "/scan",
        &[("Authorization", "Bearer rotated-token-after-a-while")],
        EICAR,
    );
    assert_eq!(a.status, 200);
    std::fs::write(dir.path().join("tokens"), format!("{TOKEN}\n")).unwrap();
    assert!(!worker.log().contains(TOKEN), "a token was logged");

    // clamd stopped: 503 with Retry-After, the metrics say so; back: scanned again.
    clamd.stop();
    let a = scan_raw(api, EICAR);
    assert_eq!(
        (a.status, error_code(&a).as_str()),
        (503, "scan_unavailable")
    );
    assert_eq!(a.header("retry-after"), Some("5"));
    assert!(worker.metric("media_worker_clamd_errors_total").unwrap() >= 1.0);
    let up = format!("media_worker_clamd_up{{clamd=\"{}\"}}", clamd.addr());
    assert_eq!(worker.metric(&up), Some(0.0));
    clamd.restart();
    assert_eq!(scan_raw(api, EICAR).json()["clean"], false);
    assert_eq!(worker.metric(&up), Some(1.0));
    assert!(
        worker
            .metric("media_worker_scans_total{verdict=\"infected\"}")
            .unwrap()
            >= 4.0
    );
    assert!(
        worker
            .metric("media_worker_api_requests_total{route=\"/scan\",status=\"401\"}")
            .unwrap()
            >= 3.0
    );
    // Probes are on their own listener: the API port serves none of them.
    let (status, _) = worker.http_get("/health/live").unwrap();
    assert_eq!(status, 200);
}

/// API-only (KAFKA_INTAKE=false, no broker at all): `POST /transcode` answers what Kafka would
/// carry, with statuses per error class; the limit answers 503 at once; a client going away
/// cancels its job (children reaped, scratch removed, the slot given back); the store down is
/// a 503, not a held request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transcode_answers_synchronously_and_a_gone_client_cancels_its_job() {
    let mut stack = Stack::start(1).await;
    let mut clamd = Clamd::start();
    let dir = tempfile::tempdir().unwrap();
    let (worker, api) = one_slot_api(
        &stack,
        &clamd,
        dir.path(),
        ("MEDIA_WORKER_PROFILES__VARIANTS__SCAN", "true"),
    );
    let (status, ready) = worker.http_get("/health/ready").unwrap();
    assert_eq!(status, 200, "{ready}");

    // Success: the outputs are in S3 and decode.
    stack.upload_corpus("sharp_Landscape_1.jpg").await;
    let req = serde_json::to_value(request("landscape", "sharp_Landscape_1.jpg")).unwrap();
    let (a, r) = transcode(api, &req);
    assert_eq!((a.status, r.status), (200, Status::Completed), "{r:?}");
    assert!(r.outputs.len() >= 4);
    let webp = r
        .outputs
        .iter()
        .find(|o| o.format == "webp" && o.role == "variant")
        .unwrap();
    let (bytes, ct, _) = stack.get(OUTPUT_BUCKET, &webp.key).await;
    assert_eq!(ct.as_deref(), Some("image/webp"));
    let file = dir.path().join("out.webp");
    std::fs::write(&file, bytes).unwrap();
    assert_eq!(
        pillow(&file),
        format!("WEBP {} {}", webp.width, webp.height)
    );
    // The same again: replayed from the manifest, like a redelivery.
    let (a, again) = transcode(api, &req);
    assert_eq!(
        (a.status, again.replayed, again.outputs),
        (200, true, r.outputs)
    );

    // Each class of error.
    let a = http::post(
        api,
        "/transcode",
        &[("Authorization", &auth())],
        b"{not json",
    );
    assert_eq!(
        (a.status, a.json()["error"]["code"].as_str()),
        (400, Some("invalid_request"))
    );
    let (a, r) = transcode(
        api,
        &serde_json::to_value(request("gone", "no/such.jpg")).unwrap(),
    );
    assert_eq!(
        (a.status, r.error.unwrap().code),
        (404, ErrorCode::SourceNotFound)
    );
    stack.upload_corpus("sharp_truncated.jpg").await;
    let (a, r) = transcode(
        api,
        &serde_json::to_value(request("trunc", "sharp_truncated.jpg")).unwrap(),
    );
    assert_eq!(
        (a.status, r.error.unwrap().code),
        (422, ErrorCode::CorruptInput)
    );
    stack.upload_corpus("chorus_not_an_image.jpg").await;
    let (a, r) = transcode(
        api,
        &serde_json::to_value(request("chorus", "chorus_not_an_image.jpg")).unwrap(),
    );
    assert_eq!(
        (a.status, r.error.unwrap().code),
        (415, ErrorCode::UnsupportedMedia)
    );
    let huge = serde_json::json!({"schema_version": 1, "padding": "x".repeat(70_000)});
    let a = http::post(
        api,
        "/transcode",
        &[("Authorization", &auth())],
        huge.to_string().as_bytes(),
    );
    assert_eq!(a.status, 413);
    let a = http::post(api, "/transcode", &[], req.to_string().as_bytes());
    assert_eq!(a.status, 401);
    // A retryable failure: clamd down for a scanning profile → 503 with Retry-After.
    clamd.stop();
    let scanned =
        serde_json::to_value(request("scanned", "sharp_Landscape_1.jpg").with_profile("variants"))
            .unwrap();
    let (a, r) = transcode(api, &scanned);
    let e = r.error.unwrap();
    assert_eq!(
        (a.status, e.code, e.retryable),
        (503, ErrorCode::ScanUnavailable, true)
    );
    assert_eq!(a.header("retry-after"), Some("5"));
    clamd.restart();

    // A long video job holds the one slot: the next request is answered 503 at once.
    let video = synthetic_video(dir.path(), 20, 640, 360);
    stack.upload_file("long.mp4", &video).await;
    let long = serde_json::to_value(request("long", "long.mp4")).unwrap();
    let conn = http::post_open(
        api,
        "/transcode",
        &[("Authorization", &auth())],
        long.to_string().as_bytes(),
    );
    let ffmpeg = wait_for("the long job's ffmpeg", MINUTE, || {
        let under: Vec<i32> = worker
            .sandboxes()
            .into_iter()
            .flat_map(children_of)
            .collect();
        under.into_iter().find(|p| cmdline(*p).contains("ffmpeg"))
    });
    // The API's children (and their ffmpeg) yield the cores to Kafka's: nice 19.
    assert_eq!(nice_of(ffmpeg), Some(19), "{}", cmdline(ffmpeg));
    let (a, _) = {
        let a = http::post(
            api,
            "/transcode",
            &[("Authorization", &auth())],
            req.to_string().as_bytes(),
        );
        (a, ())
    };
    assert_eq!((a.status, error_code(&a).as_str()), (503, "busy"));
    assert_eq!(a.header("retry-after"), Some("5"));

    // The client goes away: its ffmpeg is killed, the job leaves, scratch is emptied.
    drop(conn);
    wait_for("the cancelled job to stop", MINUTE, || {
        let gone = proc_stat(ffmpeg).is_none_or(|(state, _, _)| state == 'Z');
        let empty = std::fs::read_dir(worker.scratch_dir())
            .unwrap()
            .next()
            .is_none();
        (gone && worker.jobs().is_empty() && empty).then_some(())
    });
    assert!(zombies_of(worker.pid()).is_empty());
    let closed = "media_worker_api_requests_total{route=\"/transcode\",status=\"499\"}";
    wait_for("the cancelled request counted", MINUTE, || {
        worker.metric(closed).filter(|n| *n == 1.0)
    });
    // The slot is free again.
    let (a, _) = transcode(api, &req);
    assert_eq!(a.status, 200);

    // The store down: answered 503 after the retries, not held until it is back (a Kafka
    // message would be held, uncommitted; an API client retries, maybe on another pod).
    stack.s3.stop();
    let down = serde_json::to_value(request("s3-down", "sharp_Landscape_1.jpg")).unwrap();
    let (a, r) = transcode(api, &down);
    let e = r.error.unwrap();
    assert_eq!(
        (a.status, e.code, e.retryable),
        (503, ErrorCode::StorageUnavailable, true)
    );
    assert_eq!(a.header("retry-after"), Some("5"));
}

/// `scan = true` in a profile of a config file: an infected upload fails `malware_detected`
/// before anything decodes it and writes nothing; a clean one carries its verdict; with clamd
/// stopped the job is retried, then answered `scan_unavailable` (retryable); clamd back, the
/// next job completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scanning_profile_refuses_malware_in_the_pipeline() {
    let stack = Stack::start(1).await;
    let mut clamd = Clamd::start();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("worker.toml");
    std::fs::write(&config, "[profiles.scanned]\nanalysis = true\nwidths = [320]\nformats = [{ format = \"webp\", quality = 80 }]\nscan = true\n").unwrap();
    let mut env = stack.worker_env("g-scan");
    env.insert("MEDIA_WORKER_CONFIG".into(), config.display().to_string());
    env.insert("CLAMD_ADDR".into(), clamd.addr());
    env.insert("RETRY_COUNT".into(), "2".into());
    let worker = Worker::start(&env);
    worker.wait_ready();
    let responses = stack.responses();

    let eicar = dir.path().join("eicar.jpg");
    std::fs::write(&eicar, EICAR).unwrap();
    stack.upload_file("user-1/eicar.jpg", &eicar).await;
    stack.upload_corpus("imageio_coffee.png").await;
    stack
        .send(&request("infected", "user-1/eicar.jpg").with_profile("scanned"))
        .await;
    stack
        .send(&request("clean", "imageio_coffee.png").with_profile("scanned"))
        .await;
    let got = responses.take(2, MINUTE);

    let bad = answer_to(&got, "infected");
    let e = bad.error.as_ref().unwrap();
    assert_eq!(
        (e.code, e.stage, e.retryable, bad.status),
        (
            ErrorCode::MalwareDetected,
            Stage::Scan,
            false,
            Status::Failed
        )
    );
    assert!(e.message.contains(EICAR_SIGNATURE), "{}", e.message);
    let verdict = bad.analysis.as_ref().and_then(|a| a.scan()).unwrap();
    assert_eq!(
        (verdict.clean, verdict.signature.as_deref()),
        (false, Some(EICAR_SIGNATURE))
    );
    let listed = stack
        .s3c
        .list_objects_v2()
        .bucket(OUTPUT_BUCKET)
        .prefix("user-1/infected")
        .send()
        .await
        .unwrap();
    assert_eq!(
        listed.key_count(),
        Some(0),
        "nothing written for the infected upload"
    );

    let good = answer_to(&got, "clean");
    assert_eq!(good.status, Status::Completed, "{good:?}");
    let a = good.analysis.as_ref().unwrap();
    assert!(a.image().is_some() && a.scan().unwrap().clean);
    assert_eq!(
        a.scan().unwrap().scanned_bytes,
        std::fs::metadata(corpus("imageio_coffee.png"))
            .unwrap()
            .len()
    );

    // clamd down: retried, then a retryable failure; back: completes.
    clamd.stop();
    stack
        .send(&request("while-down", "imageio_coffee.png").with_profile("scanned"))
        .await;
    let r = responses.take(1, MINUTE).remove(0).body;
    let e = r.error.as_ref().unwrap();
    assert_eq!(
        (e.code, e.stage, e.retryable, r.attempts),
        (ErrorCode::ScanUnavailable, Stage::Scan, true, 3),
        "{r:?}"
    );
    assert!(
        worker
            .metric("media_worker_retries_total{error_code=\"scan_unavailable\"}")
            .unwrap()
            >= 2.0
    );
    clamd.restart();
    stack
        .send(&request("after", "imageio_coffee.png").with_profile("scanned"))
        .await;
    let r = responses.take(1, MINUTE).remove(0).body;
    assert_eq!(r.status, Status::Completed, "{r:?}");
    assert!(
        worker
            .metric("media_worker_scans_total{verdict=\"error\"}")
            .unwrap()
            >= 3.0
    );
}

/// Tenants kept apart at the edges of the API: a token bound to a tenant (`token users
/// buckets`) cannot name another tenant's `user_id` or a bucket it was not given; `/jobs` names
/// no request to a caller without a token; `POST /scan` takes a job slot as `/transcode` does;
/// a body that does not arrive within `API_BODY_TIMEOUT_SECS` is answered 408.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_are_kept_apart_at_the_api() {
    let stack = Stack::start(1).await;
    let clamd = Clamd::start();
    let dir = tempfile::tempdir().unwrap();
    let (worker, api) = one_slot_api(&stack, &clamd, dir.path(), ("API_BODY_TIMEOUT_SECS", "1"));
    // Re-read on change: one token for any tenant, two bound ones.
    std::fs::write(
        dir.path().join("tokens"),
        format!("{TOKEN}\nacme-token acme-* {SOURCE_BUCKET}\nother-token other-* other-bucket\n"),
    )
    .unwrap();
    stack.upload_corpus("sharp_Landscape_1.jpg").await;
    let as_token = |token: &str, path: &str, body: &serde_json::Value| {
        let bearer = format!("Bearer {token}");
        let headers = [
            ("Authorization", bearer.as_str()),
            ("Content-Type", "application/json"),
        ];
        http::post(api, path, &headers, body.to_string().as_bytes())
    };
    let for_user = |id: &str, user: &str| {
        let mut req = request(id, "sharp_Landscape_1.jpg");
        req.user_id = user.into();
        serde_json::to_value(req).unwrap()
    };

    let a = as_token("acme-token", "/transcode", &for_user("own", "acme-42"));
    assert_eq!(a.status, 200, "{}", String::from_utf8_lossy(&a.body));
    for (token, body, why) in [
        ("acme-token", for_user("theirs", "globex-7"), "user_id"),
        ("other-token", for_user("mine", "acme-42"), "user_id"),
        ("other-token", for_user("wrong-bucket", "other-1"), "bucket"),
    ] {
        let a = as_token(token, "/transcode", &body);
        assert_eq!(
            (a.status, error_code(&a)),
            (403, "forbidden".into()),
            "{token} {body}"
        );
        assert!(a.json()["error"]["message"].as_str().unwrap().contains(why));
    }
    let object = serde_json::json!({"bucket": SOURCE_BUCKET, "key": "sharp_Landscape_1.jpg"});
    let a = as_token("other-token", "/scan", &object);
    assert_eq!((a.status, error_code(&a)), (403, "forbidden".into()));

    // A long job holds the one slot: /jobs shows it without naming it to a caller without a
    // token, and a scan is refused like a second transcode.
    let video = synthetic_video(dir.path(), 20, 640, 360);
    stack.upload_file("long.mp4", &video).await;
    let long = serde_json::to_value(request("long", "long.mp4")).unwrap();
    let conn = http::post_open(
        api,
        "/transcode",
        &[
            ("Authorization", &auth()),
            ("Content-Type", "application/json"),
        ],
        long.to_string().as_bytes(),
    );
    let anonymous = wait_for("the long job on /jobs", MINUTE, || {
        let (_, body) = worker.http_get("/jobs")?;
        body.contains("\"phase\":\"running\"").then_some(body)
    });
    assert!(
        !anonymous.contains("long") && !anonymous.contains("request_id"),
        "{anonymous}"
    );
    let named = http::get(worker.http, "/jobs", &[("Authorization", &auth())]);
    assert!(String::from_utf8_lossy(&named.body).contains("req-long"));
    let a = scan_raw(api, b"just some bytes");
    assert_eq!((a.status, error_code(&a)), (503, "busy".into()));
    drop(conn);
    wait_for("the slot back", MINUTE, || {
        worker.jobs().is_empty().then_some(())
    });

    // A client that declares a body and stalls.
    let stalled = http::post_partial(
        api,
        "/transcode",
        &[
            ("Authorization", &auth()),
            ("Content-Type", "application/json"),
        ],
        1000,
        b"{\"request_id\"",
    );
    assert_eq!(
        stalled.status,
        408,
        "{}",
        String::from_utf8_lossy(&stalled.body)
    );
}

/// A scan in progress when the worker is told to stop is a job like a transcode: listed in
/// `/jobs` while the worker drains, answered, and only then does the worker exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_in_progress_is_answered_before_the_worker_stops() {
    let stack = Stack::start(1).await;
    let clamd = Clamd::start();
    let dir = tempfile::tempdir().unwrap();
    let (mut worker, api) = api_worker(&stack, &clamd, dir.path(), &[]);
    worker.wait_ready();
    let scanning = |w: &Worker| w.jobs().iter().any(|j| j["stage"] == "scan");

    let photo = std::fs::read(corpus("imageio_coffee.png")).unwrap();
    let (head, rest) = photo.split_at(photo.len() / 2);
    let auth = auth();
    let headers = [
        ("Authorization", auth.as_str()),
        ("Content-Type", "application/octet-stream"),
    ];
    let open = http::post_started(api, "/scan", &headers, photo.len(), head);
    wait_for("the scan listed", MINUTE, || {
        scanning(&worker).then_some(())
    });
    worker.sigterm();
    wait_for("draining", MINUTE, || {
        worker.log().contains("\"draining\"").then_some(())
    });
    assert!(
        scanning(&worker),
        "the scan is a job while the worker drains"
    );

    let a = http::finish(open, rest);
    assert_eq!(a.status, 200, "{}", String::from_utf8_lossy(&a.body));
    let v = a.json();
    assert_eq!(
        (v["clean"].clone(), v["scanned_bytes"].clone()),
        (serde_json::json!(true), serde_json::json!(photo.len()))
    );
    assert!(worker.wait_exit(MINUTE).success());
}
