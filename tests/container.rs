//! The image that ships, run as `deploy/k8s` runs it, in this machine's Docker Engine against
//! Apache Kafka + s3s-fs: the pod's uid, every capability dropped, no new privileges, the
//! engine's default seccomp profile, a read-only root with a tmpfs at /scratch, the pod's memory
//! and CPU limits, tini as PID 1, the host's network (every connection stays on loopback).
//! `make image` builds the images (`media-worker:latest`, and `media-worker:attack-probe`: the
//! same with the test-only probe) and `make setup-test` starts the engine. In the pod there is no
//! other uid for a job process to drop to: what keeps a compromised decoder from the worker is
//! PR_SET_DUMPABLE, Landlock and the worker's seccomp filter, under the engine's own.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::container::*;
use common::worker::http_get;
use common::*;
use media_worker::contract::{ErrorCode, MediaType, OptimizeResponse, Status};
use media_worker::media::video::components;

const SHIPPED: &str = "media-worker:latest";
const PROBE: &str = "media-worker:attack-probe";
const MARKER: &str = "MEDIA-WORKER-ATTACK-PROBE";
const LAYERS: [&str; 5] = [
    "unprivileged",
    "landlock_fs",
    "landlock_net",
    "landlock_scope",
    "seccomp",
];

/// A field of `/proc/<pid>/status` (`Uid:`), as the host reads it.
fn status_field(pid: i32, field: &str) -> String {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(field))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// The worker as the pod has it: the pod's uid and gid, no capability in any set, no new
/// privileges, under the engine's seccomp filter; every sandbox layer reported active.
fn assert_confined_as_the_pod(c: &Container) {
    let pid = c.worker_host_pid();
    let uid = pod().user.split(':').next().unwrap().to_owned();
    assert_eq!(status_field(pid, "Uid:"), [uid.as_str(); 4].join(" "));
    for caps in ["CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"] {
        assert_eq!(status_field(pid, caps), "0000000000000000", "{caps}");
    }
    assert_eq!(status_field(pid, "NoNewPrivs:"), "1");
    assert_eq!(status_field(pid, "Seccomp:"), "2", "the engine's filter");
    let layers: Vec<String> = LAYERS
        .iter()
        .map(|l| format!("{l}={}", c.layer(l).unwrap_or(-1.0)))
        .collect();
    println!(
        "container: media_worker_sandbox_layers {}",
        layers.join(" ")
    );
    for l in LAYERS {
        assert_eq!(c.layer(l), Some(1.0), "layer {l}");
    }
}

fn by_media_id(rs: Vec<Received>) -> BTreeMap<String, OptimizeResponse> {
    rs.into_iter()
        .map(|r| (r.body.media_id.clone().unwrap(), r.body))
        .collect()
}

/// Format, size and frame count of image files, read by Pillow (not by libvips): Debian's
/// python3-pil (scripts/setup.sh --test).
fn pillow(paths: &[PathBuf]) -> Vec<serde_json::Value> {
    let out = Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(
            "import json, sys\nfrom PIL import Image\nout = []\nfor p in sys.argv[1:]:\n    \
             im = Image.open(p)\n    im.load()\n    out.append({'format': im.format, \
             'size': list(im.size), 'frames': getattr(im, 'n_frames', 1)})\n\
             print(json.dumps(out))",
        )
        .args(paths)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Codec, width and height of each stream of a media file (ffprobe).
fn ffprobe(path: &Path) -> String {
    let out = Command::new("ffprobe")
        .args([
            "-v",
            "error",
            "-show_entries",
            "stream=codec_name,width,height",
        ])
        .args(["-of", "csv=p=0"])
        .arg(path)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const PHOTO: &str = "sharp_concert.jpg";
const ANIMATED: &str = "sharp_rotating-squares.gif";
const HEIC: &str = "libheif_example.heic";

/// The shipped image starts as the pod with MEDIA_SANDBOX_REQUIRE, every layer active as
/// non-root without capabilities, and answers image, animated, HEIC, video and streaming
/// requests whose outputs read back with other decoders; the shipped image has no attack probe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_image_runs_every_kind_of_media_as_the_pod() {
    let dir = tempfile::tempdir().unwrap();
    for (image, probe) in [(SHIPPED, false), (PROBE, true)] {
        let binary = image_file(image, "/usr/local/bin/media-worker", dir.path());
        let bytes = std::fs::read(&binary).unwrap();
        let found = bytes.windows(MARKER.len()).any(|w| w == MARKER.as_bytes());
        assert_eq!(found, probe, "{image}");
        std::fs::remove_file(binary).unwrap();
    }
    let size: u64 = docker_ok(&["image", "inspect", "-f", "{{.Size}}", SHIPPED])
        .parse()
        .unwrap();
    println!("container: {SHIPPED} is {} MB", size / 1_000_000);

    let stack = Stack::start(1).await;
    let video = synthetic_video(dir.path(), 4, 1280, 720);
    for name in [PHOTO, ANIMATED, HEIC] {
        stack.upload_corpus(name).await;
    }
    stack.upload_file("clip.mp4", &video).await;
    let started = Instant::now();
    let c = Container::run(SHIPPED, &stack.worker_env("g-pod"), &[]);
    c.wait_consuming();
    println!(
        "container: start to ready (consuming) {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert_confined_as_the_pod(&c);

    let responses = stack.responses();
    for (id, key) in [("photo", PHOTO), ("animated", ANIMATED), ("heic", HEIC)] {
        stack.send(&request(id, key)).await;
    }
    let mut video_req = request("video", "clip.mp4");
    video_req.media_type = Some(MediaType::Video);
    stack.send(&video_req).await;
    let mut stream_req = request("stream", "clip.mp4").with_profile("streaming");
    stream_req.media_type = Some(MediaType::Video);
    stack.send(&stream_req).await;
    let got = by_media_id(responses.take(5, 5 * MINUTE));
    for (id, r) in &got {
        assert_eq!(r.status, Status::Completed, "{id}: {:?}", r.error);
    }

    // Images: every output in S3 decodes at the size the response states; the animated
    // source's WebP variants keep all its frames.
    let source_frames = pillow(&[corpus(ANIMATED)])[0]["frames"].as_u64().unwrap();
    assert!(source_frames > 1);
    for id in ["photo", "animated", "heic"] {
        let outputs = &got[id].outputs;
        assert!(outputs.len() >= 4, "{id}: {outputs:?}");
        let mut files = Vec::new();
        for (i, o) in outputs.iter().enumerate() {
            let (bytes, ct, _) = stack.get(&o.bucket, &o.key).await;
            assert_eq!(ct.as_deref(), Some(o.content_type.as_str()), "{}", o.key);
            assert_eq!(bytes.len() as u64, o.size_bytes, "{}", o.key);
            let path = dir.path().join(format!("{id}-{i}"));
            std::fs::write(&path, bytes).unwrap();
            files.push(path);
        }
        for (o, read) in outputs.iter().zip(pillow(&files)) {
            let want = serde_json::json!([o.width, o.height]);
            assert_eq!(read["size"], want, "{}", o.key);
            if id == "animated" && o.role == "variant" && o.format == "webp" {
                assert_eq!(read["frames"].as_u64(), Some(source_frames), "{}", o.key);
            }
        }
    }

    // Video: the renditions play as H.264 + AAC at their stated sizes.
    let renditions: Vec<_> = got["video"]
        .outputs
        .iter()
        .filter(|o| o.role == "rendition")
        .collect();
    assert!(!renditions.is_empty(), "{:?}", got["video"].outputs);
    for o in renditions {
        let (bytes, _, _) = stack.get(&o.bucket, &o.key).await;
        let path = dir.path().join("rendition.mp4");
        std::fs::write(&path, bytes).unwrap();
        let streams = ffprobe(&path);
        let video = format!("h264,{},{}", o.width, o.height);
        assert!(
            streams.contains(&video) && streams.contains("aac"),
            "{}: {streams}",
            o.key
        );
    }

    // Streaming: the HLS master and everything it names, read back through S3 and parsed by
    // an independent parser; both rungs of a 720p source.
    let master = got["stream"]
        .outputs
        .iter()
        .find(|o| o.role == "stream" && o.format == "hls")
        .expect("an HLS entry point");
    let local = dir.path().join("hls");
    let fetched = stack.fetch_hls(&master.key, &local).await;
    // The master; a playlist, an init segment and a segment at least for each rung and the audio.
    assert!(fetched > 3 * 3, "{fetched}");
    let master_file = local.join(master.key.rsplit('/').next().unwrap());
    let parsed = Command::new("python3")
        .arg(manifest_path("tests/streaming/hls.py"))
        .arg(master_file)
        .output()
        .unwrap();
    assert!(parsed.status.success(), "{parsed:?}");
    let parsed: serde_json::Value = serde_json::from_slice(&parsed.stdout).unwrap();
    let variants = parsed["variants"].as_array().unwrap();
    // The streaming ladder below a 720p source: 720p, 480p, 360p and 234p.
    assert_eq!(variants.len(), 4, "{parsed}");
    for v in variants {
        assert!(
            !v["playlist"]["segments"].as_array().unwrap().is_empty(),
            "{v}"
        );
    }
}

/// With a layer missing (here turned off, as on a node whose kernel lacks Landlock), the pod's
/// MEDIA_SANDBOX_REQUIRE stops the worker at start, naming the layer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pod_refuses_to_start_without_a_layer() {
    let stack = Stack::start(1).await;
    let mut env = stack.worker_env("g-pod-layers");
    env.insert("MEDIA_SANDBOX_DISABLE".into(), "landlock".into());
    let c = Container::run(SHIPPED, &env, &[]);
    let code = docker_ok(&["wait", &c.id]);
    assert_eq!(code, "1", "{}", c.logs());
    assert!(c.logs().contains("landlock_fs"), "{}", c.logs());
}

/// An upload that makes a job process of the probe image perform `attacks`.
fn hostile(attacks: serde_json::Value) -> Vec<u8> {
    let mut bytes = format!("{MARKER}\n").into_bytes();
    bytes.extend(serde_json::to_vec(&attacks).unwrap());
    bytes
}

/// The compromised-decoder probes of tests/confinement.rs, from the probe image run as the pod
/// runs the shipped one (no other uid: the job process has the worker's): each attempt is
/// refused and nothing it was after is in its answer; the next job succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compromised_decoder_in_the_pod_gets_nothing() {
    // The probe image holds this build's binary (`make image` built it after this test's).
    let built = Command::new("sha256sum")
        .arg(env!("CARGO_BIN_EXE_media-worker"))
        .output()
        .unwrap();
    let built = String::from_utf8_lossy(&built.stdout);
    let label = image_label(PROBE, "media-worker.binary-sha256");
    assert!(
        built.starts_with(&label),
        "{PROBE} holds another binary than this build's: run `make test-images`"
    );

    let stack = Stack::start(1).await;
    let host = tempfile::tempdir().unwrap();
    std::fs::set_permissions(host.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // A secret file the pod's uid may read (as a mounted Secret is), and a daemon's UNIX
    // socket it may write.
    let secrets = host.path().join("secrets");
    std::fs::create_dir(&secrets).unwrap();
    std::fs::write(secrets.join("secret.txt"), "the-secret-in-a-file").unwrap();
    std::fs::set_permissions(
        secrets.join("secret.txt"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let run = host.path().join("run");
    std::fs::create_dir(&run).unwrap();
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o777)).unwrap();
    let unix = UnixListener::bind(run.join("daemon.sock")).unwrap();
    unix.set_nonblocking(true).unwrap();
    std::fs::set_permissions(
        run.join("daemon.sock"),
        std::fs::Permissions::from_mode(0o777),
    )
    .unwrap();
    // The test's own server on the host's loopback, which the container shares.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let own = listener.local_addr().unwrap();

    let mut env = stack.worker_env("g-pod-attack");
    env.insert("WORKER_POOL_SIZE".into(), "2".into());
    let mounts = [
        format!("--volume={}:/secrets:ro", secrets.display()),
        format!("--volume={}:/run/daemon", run.display()),
    ];
    let c = Container::run(PROBE, &env, &[&mounts[0], &mounts[1]]);
    c.wait_consuming();
    assert_confined_as_the_pod(&c);
    // Another job's upload in the scratch, written by the pod's uid: only Landlock keeps a job
    // process (same uid) out of it.
    let planted = c.path("/scratch/job-of-another-tenant");
    std::fs::create_dir(&planted).unwrap();
    std::fs::write(planted.join("source"), "another-tenants-upload").unwrap();
    let uid = pod()
        .user
        .split(':')
        .map(|id| id.parse().unwrap())
        .collect::<Vec<u32>>();
    for p in [planted.clone(), planted.join("source")] {
        std::os::unix::fs::chown(&p, Some(uid[0]), Some(uid[1])).unwrap();
    }

    let pid = c.worker_pid();
    let s3 = env["AWS_ENDPOINT_URL_S3"].trim_start_matches("http://");
    let kafka = env["KAFKA_BOOTSTRAP_SERVERS"].split(',').next().unwrap();
    let probes = serde_json::json!([
        {"read_environ": pid},
        {"read_mem": pid},
        {"read_file": "/secrets/secret.txt"},
        {"read_file": "/scratch/job-of-another-tenant/source"},
        {"connect": s3},
        {"connect": kafka},
        {"connect": own.to_string()},
        {"connect_unix": "/run/daemon/daemon.sock"},
        {"create_file": "/scratch/left-by-the-attacker"},
        // A program of the image's that a job may not run (it has no shell).
        {"exec": "/usr/bin/tini"},
        {"ptrace": pid},
        {"signal": pid},
        "sleeper",
        {"ffmpeg_read": "/secrets/secret.txt"},
        {"ffmpeg_connect": format!("http://{own}/x")},
    ]);
    let responses = stack.responses();
    stack.upload_corpus(PHOTO).await;
    stack.send(&request("warm", PHOTO)).await;
    assert_eq!(responses.take(1, MINUTE)[0].body.status, Status::Completed);
    let file = host.path().join("probes.png");
    std::fs::write(&file, hostile(probes.clone())).unwrap();
    stack.upload_file("probes.png", &file).await;
    stack.send(&request("probes", "probes.png")).await;
    let got = responses.take(1, 2 * MINUTE).remove(0).body;

    let e = got.error.as_ref().expect("the probes' job failed");
    assert_eq!(e.code, ErrorCode::UnsupportedMedia, "{}", e.message);
    let report = &e.message;
    let lines = report.split_once("attack probe: ").unwrap().1.split("; ");
    for (probe, line) in probes.as_array().unwrap().iter().zip(lines) {
        println!("container: attack {probe} -> {line}");
    }
    assert_all_refused(report, &[&PROBES[..], &["read_mem"]].concat());
    assert!(
        !c.path("/scratch/left-by-the-attacker").exists(),
        "the attacker created a file"
    );
    match listener.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("a connection to the test's server: {other:?}"),
    }
    match unix.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("a connection to the daemon's socket: {other:?}"),
    }
    // The process it left behind is gone with its job.
    let sleeper = sleeper_pid(report);
    let proc_dir = c.path(&format!("/proc/{sleeper}"));
    wait_for("the sleeper gone", Duration::from_secs(10), || {
        (!proc_dir.exists()).then_some(())
    });

    stack.send(&request("after", PHOTO)).await;
    assert_eq!(responses.take(1, MINUTE)[0].body.status, Status::Completed);
    assert!(c.running());
}

/// Requests that keep a worker busy for seconds each (a large photo under the default profile),
/// yet few enough in flight to drain within the shutdown timeout.
async fn busy_requests(stack: &Stack, prefix: &str, n: usize) -> Vec<String> {
    let photo = "rails_racecar.jpg";
    stack.upload_corpus(photo).await;
    let reqs: Vec<_> = (0..n)
        .map(|i| request(&format!("{prefix}-{i}"), photo))
        .collect();
    stack.send_all(&reqs).await;
    reqs.into_iter().map(|r| r.media_id).collect()
}

/// Responses per media id on the response topic, once the group has committed all `n`.
fn answers_once_committed(stack: &Stack, group: &str, n: usize) -> BTreeMap<String, usize> {
    wait_for("every request committed", 3 * MINUTE, || {
        (stack.committed(group, 1) == vec![n as i64]).then_some(())
    });
    let mut count = BTreeMap::new();
    for (_, body, _) in stack.records(&stack.response_topic) {
        *count
            .entry(body["media_id"].as_str().unwrap().to_owned())
            .or_insert(0) += 1;
    }
    count
}

/// `docker stop` while jobs run (SIGTERM through tini): the container drains them and exits 0
/// within the deployment's grace period; a new container answers the rest; every request is
/// answered exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_stop_drains_within_the_grace_period() {
    let stack = Stack::start(1).await;
    let env = stack.worker_env("g-pod-stop");
    let c = Container::run(SHIPPED, &env, &[]);
    c.wait_consuming();
    let n = 8;
    let ids = busy_requests(&stack, "stop", n).await;
    let in_flight = c.jobs_running();
    let grace = pod().grace;
    let (took, code) = c.stop(grace);
    let answered = stack.response_count();
    println!(
        "container: docker stop with {in_flight} jobs in flight: {answered} of {n} requests \
         answered before exit, exit code {code} after {:.1} s (grace period {} s)",
        took.as_secs_f64(),
        grace.as_secs()
    );
    assert_eq!(code, 0, "{}", c.logs());
    assert!(took < grace, "{took:?}");
    // The worker, not tini, heard SIGTERM (tini forwards it) and drained.
    assert!(c.logs().contains("SIGTERM: draining"), "{}", c.logs());
    assert!(
        answered >= in_flight as i64,
        "the jobs in flight were answered"
    );

    let next = Container::run(SHIPPED, &env, &[]);
    next.wait_consuming();
    let count = answers_once_committed(&stack, "g-pod-stop", n);
    for id in &ids {
        assert_eq!(count.get(id), Some(&1), "{id}: {count:?}");
    }
    assert_eq!(count.len(), n);
}

/// `docker kill` while jobs run, then the container restarted (as the kubelet restarts it):
/// every request is answered, none lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_kill_then_restart_loses_nothing() {
    let stack = Stack::start(1).await;
    let c = Container::run(SHIPPED, &stack.worker_env("g-pod-kill"), &[]);
    c.wait_consuming();
    let n = 6;
    let ids = busy_requests(&stack, "kill", n).await;
    let in_flight = c.jobs_running();
    docker_ok(&["kill", &c.id]);
    let before = stack.response_count();
    assert!(!c.running());
    let restarted = Instant::now();
    docker_ok(&["start", &c.id]);
    c.wait_consuming();
    let count = answers_once_committed(&stack, "g-pod-kill", n);
    println!(
        "container: docker kill with {in_flight} jobs in flight ({before} of {n} answered); \
         restarted, consuming after {:.1} s; answered {} of {n}, {} twice",
        restarted.elapsed().as_secs_f64(),
        count.len(),
        count.values().filter(|c| **c > 1).count()
    );
    for id in &ids {
        assert!(count.get(id).is_some_and(|c| *c >= 1), "{id}: {count:?}");
    }
    assert_eq!(count.len(), n);
}

/// `ffmpeg -FLAG` in the shipped image: the names it lists (demuxers list several per line;
/// a decoder named otherwise than its codec is listed under both, as `-decoders` says "(codec
/// X)"; bitstream filters and protocols one a line).
fn image_ffmpeg_lists(flag: &str) -> Vec<String> {
    let text = docker_ok(&[
        "run",
        "--rm",
        "--network=none",
        "--entrypoint=/usr/bin/ffmpeg",
        SHIPPED,
        "-hide_banner",
        flag,
    ]);
    if ["-bsfs", "-protocols"].contains(&flag) {
        return text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.ends_with(':'))
            .map(str::to_owned)
            .collect();
    }
    // " FLAGS name[,name] description", past the legend: it ends with a line of dashes, or
    // (filters) its lines are indented further.
    let rows: Vec<&str> = match text.split_once("\n --") {
        Some((_, rows)) => rows.lines().skip(1).collect(),
        None => text.lines().filter(|l| !l.starts_with("  ")).collect(),
    };
    let codecs = rows.iter().filter_map(|l| {
        let (_, codec) = l.rsplit_once("(codec ")?;
        Some(codec.trim_end_matches(')').to_owned())
    });
    rows.iter()
        .filter_map(|l| l.split_whitespace().nth(1))
        .flat_map(|names| names.split(','))
        .map(str::to_owned)
        .chain(codecs)
        .collect()
}

/// The image's ffmpeg has every component of config/ffmpeg-components (the list its build
/// configures ffmpeg with, and the worker reads): a decoder of each codec each container
/// accepts, each container's demuxer, and the encoders, filters, muxers, demuxers, bitstream
/// filters and protocols the worker's runs use (derived from every profile's arguments by the
/// unit tests of `media::video::uses`) or that ffmpeg adds to them (autorotation's filters,
/// conversions). `the_image_answers_every_accepted_input_as_the_host_does` decodes them.
#[test]
fn the_images_ffmpeg_has_what_every_profile_uses() {
    let list = components::list();
    let mut want: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (demuxer, codecs) in list.containers() {
        want.entry("-demuxers").or_default().insert(demuxer);
        let decoders = want.entry("-decoders").or_default();
        decoders.extend(codecs.iter().map(String::as_str));
    }
    for (flag, kind) in [
        ("-decoders", "decoder"),
        ("-encoders", "encoder"),
        ("-filters", "filter"),
        ("-muxers", "muxer"),
        ("-demuxers", "demuxer"),
        ("-bsfs", "bsf"),
        ("-protocols", "protocol"),
    ] {
        want.entry(flag).or_default().extend(list.all(kind));
    }
    let mut missing = Vec::new();
    for (flag, names) in &want {
        let listed = image_ffmpeg_lists(flag);
        println!(
            "container: ffmpeg {flag}: {} listed, {} wanted",
            listed.len(),
            names.len()
        );
        let lacks: Vec<_> = names
            .iter()
            .filter(|n| !listed.iter().any(|l| l == *n))
            .collect();
        if !lacks.is_empty() {
            missing.push(format!("{flag} lacks {lacks:?}"));
        }
    }
    assert!(
        missing.is_empty(),
        "the image's ffmpeg: {}",
        missing.join("; ")
    );
}

/// What a test compares of an answer: its status, its error's code, the kinds of its outputs
/// (role and format) and of its warnings.
fn answer_kinds(r: &OptimizeResponse) -> String {
    let mut outputs: Vec<String> = r
        .outputs
        .iter()
        .map(|o| format!("{}/{}", o.role, o.format))
        .collect();
    outputs.sort();
    let warnings: Vec<String> = r.warnings.iter().map(|w| format!("{:?}", w.code)).collect();
    format!(
        "{:?} {:?} outputs {outputs:?} warnings {warnings:?}",
        r.status,
        r.error.as_ref().map(|e| e.code)
    )
}

/// Every codec that config/ffmpeg-components accepts in each container, in a small file made
/// with the host's ffmpeg (tests/common/inputs.rs: each listed video and audio codec once per
/// container), is answered by the image as by a worker on the host, whose ffmpeg is Debian's
/// with every decoder: the same status, error code and kinds of outputs and warnings. A codec
/// the list does not accept (Cinepak in AVI, which the host's ffmpeg decodes) is refused alike,
/// as unsupported media.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_answers_every_accepted_input_as_the_host_does() {
    let dir = tempfile::tempdir().unwrap();
    let mut files = inputs::accepted(dir.path());
    let refused = inputs::refused(dir.path());
    files.push(refused.clone());
    println!("container: {} inputs made", files.len());
    let (host_stack, pod_stack) = (Stack::start(1).await, Stack::start(1).await);
    let mut requests = Vec::new();
    for f in &files {
        let key = f.path.file_name().unwrap().to_str().unwrap();
        host_stack.upload_file(key, &f.path).await;
        pod_stack.upload_file(key, &f.path).await;
        // An animated GIF reaches ffmpeg as the profile that also makes it an MP4.
        let profile = if f.demuxer == "gif" {
            "showcase"
        } else {
            "default"
        };
        requests.push(request(&f.id, key).with_profile(profile));
    }
    let host = Worker::start(&host_stack.worker_env("g-host-inputs"));
    let c = Container::run(SHIPPED, &pod_stack.worker_env("g-image-inputs"), &[]);
    host.ready().await;
    c.wait_consuming();
    let (on_host, in_image) = (host_stack.responses(), pod_stack.responses());
    host_stack.send_all(&requests).await;
    pod_stack.send_all(&requests).await;
    let n = requests.len();
    let on_host = by_media_id(on_host.take(n, 10 * MINUTE));
    let in_image = by_media_id(in_image.take(n, 10 * MINUTE));
    assert_eq!((on_host.len(), in_image.len()), (n, n));

    let mut differ = Vec::new();
    for f in &files {
        let (h, i) = (
            answer_kinds(&on_host[&f.id]),
            answer_kinds(&in_image[&f.id]),
        );
        if h != i {
            let why = |r: &OptimizeResponse| r.error.as_ref().map(|e| e.message.clone());
            println!(
                "container: {}: host {h}, image {i} ({:?})",
                f.id,
                why(&in_image[&f.id])
            );
            differ.push(f.id.as_str());
        }
    }
    for f in &files[..files.len() - 1] {
        let r = &on_host[&f.id];
        assert_eq!(r.status, Status::Completed, "{}: {:?}", f.id, r.error);
    }
    let code = |r: &OptimizeResponse| r.error.as_ref().map(|e| e.code);
    assert_eq!(
        code(&on_host[&refused.id]),
        Some(ErrorCode::UnsupportedMedia)
    );
    assert!(
        differ.is_empty(),
        "{} of {n} inputs answered otherwise by the image: {differ:?}",
        differ.len()
    );
}

/// The image holds Debian's current packages and says which state of the archive they are
/// from: its label `media-worker.debian-snapshot` is the archive's latest publication as apt
/// reads it now (scripts/image.sh --archive, as `make image` reads it), every Debian package
/// whose files it holds is at the version apt installs now (bookworm, -updates and -security,
/// in a container of the base), and its ffmpeg is built from Debian's current source. (Debian
/// publishing between `make image` and this test fails it, rightly: the image is behind.)
#[test]
fn the_image_holds_debians_current_packages_and_says_which() {
    let now = Command::new(manifest_path("scripts/image.sh"))
        .arg("--archive")
        .output()
        .unwrap();
    assert!(now.status.success(), "{now:?}");
    let now = String::from_utf8(now.stdout).unwrap();
    let (snapshot, ffmpeg) = now.trim().split_once(' ').expect("SNAPSHOT FFMPEG_VERSION");

    // The image's packages, from their stanzas (scripts/image-root.sh).
    let dir = tempfile::tempdir().unwrap();
    let status = image_file(SHIPPED, "/var/lib/dpkg/status.d", dir.path());
    let mut held = BTreeMap::new();
    for entry in std::fs::read_dir(status).unwrap() {
        let stanza = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        let field = |k: &str| {
            stanza
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .unwrap()
                .trim()
                .to_owned()
        };
        held.insert(field("Package:"), field("Version:"));
    }
    assert!(held.len() > 20 && held.contains_key("libc6"), "{held:?}");
    let names: Vec<&str> = held
        .keys()
        .map(String::as_str)
        .filter(|p| *p != "ffmpeg")
        .collect();
    let policy = docker_ok(&[
        "run",
        "--rm",
        "--network=host",
        "debian:12-slim",
        "bash",
        "-c",
        &format!(
            "apt-get update -qq >/dev/null && apt-cache policy {}",
            names.join(" ")
        ),
    ]);
    let mut candidate = BTreeMap::new();
    let mut package = "";
    for line in policy.lines() {
        if let Some(p) = line.strip_suffix(':').filter(|_| !line.starts_with(' ')) {
            package = p;
        } else if let Some(v) = line.trim().strip_prefix("Candidate: ") {
            candidate.insert(package.to_owned(), v.to_owned());
        }
    }
    candidate.insert("ffmpeg".to_owned(), ffmpeg.to_owned());
    let behind: Vec<String> = held
        .iter()
        .filter(|(p, v)| candidate.get(*p) != Some(v))
        .map(|(p, v)| format!("{p} {v} (now {:?})", candidate.get(p)))
        .collect();
    let label = image_label(SHIPPED, "media-worker.debian-snapshot");
    println!(
        "container: {} Debian packages in {SHIPPED}, labelled {label:?}; the archive now {snapshot}",
        held.len()
    );
    assert!(
        behind.is_empty() && label == snapshot,
        "the image is labelled {label:?}, the archive is at {snapshot}; behind it: {behind:?}"
    );
}

/// Regular files of `image` (path → size), from `docker export` of a container created from it.
fn image_files(image: &str) -> BTreeMap<String, u64> {
    let id = docker_ok(&["create", image]);
    let docker = std::env::var("DOCKER").unwrap_or_else(|_| "docker".into());
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("{docker} export {id} | tar -tv"))
        .output()
        .unwrap();
    docker_ok(&["rm", &id]);
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with('-'))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (format!("/{}", f[5..].join(" ")), f[2].parse().unwrap())
        })
        .collect()
}

/// A shared object by its name: `lib.so`, `lib.so.6`, `lib.so.1.2.3` (not `ld.so.conf`).
fn is_library(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap();
    name.split_once(".so").is_some_and(|(_, version)| {
        version.is_empty()
            || version.starts_with('.') && version.chars().all(|c| c == '.' || c.is_ascii_digit())
    })
}

/// Opens of files in directories of a container's root (inotify `IN_OPEN` through
/// `/proc/TINI/root`): a program's `execve`, a library the loader loads. It misses nothing, where
/// sampling maps misses a run shorter than its period (ffprobe, static, probes a clip in a few ms).
struct Opens {
    fd: std::os::fd::OwnedFd,
    dirs: BTreeMap<i32, String>,
}

impl Opens {
    fn watch(tini: i32, dirs: &BTreeSet<String>) -> Opens {
        use std::os::fd::FromRawFd;
        // SAFETY: a new descriptor, owned from here on.
        let raw = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        assert!(raw >= 0, "inotify: {}", std::io::Error::last_os_error());
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
        let mut watched = BTreeMap::new();
        for dir in dirs {
            let path = std::ffi::CString::new(format!("/proc/{tini}/root{dir}")).unwrap();
            // SAFETY: a valid descriptor and NUL-terminated path.
            let wd = unsafe { libc::inotify_add_watch(raw, path.as_ptr(), libc::IN_OPEN) };
            assert!(
                wd >= 0,
                "inotify {dir}: {}",
                std::io::Error::last_os_error()
            );
            watched.insert(wd, dir.clone());
        }
        Opens { fd, dirs: watched }
    }

    /// The paths opened since the last call (none when the queue is empty).
    fn drain(&self) -> Vec<String> {
        use std::os::fd::AsRawFd;
        let mut paths = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            // SAFETY: reads into a buffer of its length.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                return paths;
            }
            let mut at = 0;
            while at < n as usize {
                let wd = i32::from_ne_bytes(buf[at..at + 4].try_into().unwrap());
                let len = u32::from_ne_bytes(buf[at + 12..at + 16].try_into().unwrap()) as usize;
                let name = &buf[at + 16..at + 16 + len];
                let name = String::from_utf8_lossy(name)
                    .trim_end_matches('\0')
                    .to_owned();
                if let Some(dir) = self.dirs.get(&wd).filter(|_| !name.is_empty()) {
                    paths.push(format!("{dir}/{name}"));
                }
                at += 16 + len;
            }
        }
    }
}

/// Files mapped by the processes under `tini` (the container's), sampled until `done` is set,
/// and those `opens` saw opened: path → the names of the programs that mapped it (`comm`), or
/// "(opened)".
fn sample_maps(tini: i32, opens: &Opens, done: &AtomicBool) -> BTreeMap<String, BTreeSet<String>> {
    let mut mapped: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    while !done.load(Ordering::Relaxed) {
        for pid in std::iter::once(tini).chain(descendants_of(tini)) {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
            for path in maps.lines().filter_map(|l| l.split_whitespace().nth(5)) {
                if path.starts_with('/') {
                    let by = mapped.entry(path.to_owned()).or_default();
                    by.insert(comm.trim().to_owned());
                }
            }
        }
        for path in opens.drain() {
            mapped.entry(path).or_default().insert("(opened)".into());
        }
        // A sampling period: each ffmpeg run lasts longer.
        std::thread::sleep(Duration::from_millis(20));
    }
    for path in opens.drain() {
        mapped.entry(path).or_default().insert("(opened)".into());
    }
    mapped
}

/// The shipped image is the release build it says it is (labels, media_worker_build_info), runs
/// jobs of every profile (photos, HEIC, a GIF made MP4, a TIFF, HDR HEVC, VP9 + Opus in WebM,
/// AV1, H.264 as HLS + DASH) as the pod, and holds no library that none of its processes loads:
/// every library of the image is mapped by the worker, its sandbox processes, ffmpeg, ffprobe or
/// tini under those jobs (their maps sampled every 20 ms, and every open of the image's
/// libraries and programs watched with inotify), and every program in it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_holds_only_what_every_profile_loads() {
    let label = |k: &str| image_label(SHIPPED, k);
    assert_eq!(label("media-worker.profile"), "release");
    let revision = label("media-worker.revision");
    assert_eq!(label("org.opencontainers.image.revision"), revision);

    let stack = Stack::start(1).await;
    let dir = tempfile::tempdir().unwrap();
    let clip = synthetic_video(dir.path(), 4, 1280, 720);
    // AV1 + Opus in Matroska, from the clip (the host's ffmpeg, Debian's as the image's).
    let av1 = dir.path().join("av1.mkv");
    let made = Command::new("ffmpeg")
        .args(["-v", "error", "-i"])
        .arg(&clip)
        .args(["-c:v", "libsvtav1", "-preset", "12", "-c:a", "libopus"])
        .arg(&av1)
        .status()
        .unwrap();
    assert!(made.success());
    stack.upload_file("clip.mp4", &clip).await;
    stack.upload_file("av1.mkv", &av1).await;
    // The photo under every image profile; each other kind under one that makes the most of it.
    let mut images: Vec<(&str, &str)> = ["default", "variants", "auto", "picture", "showcase"]
        .map(|profile| (PHOTO, profile))
        .into();
    images.extend([
        (HEIC, "picture"),
        (ANIMATED, "showcase"),
        ("sharp_cielab-dagams.tiff", "default"),
        ("sharp_Channel_digital_image_CMYK_color.jpg", "auto"),
        ("sharp_5_webp_a.webp", "variants"),
        ("imageio_chelsea.png", "default"),
    ]);
    let videos = ["rails_rotated_hdr_video.mov", "rails_video.webm"];
    for name in images.iter().map(|(name, _)| *name).chain(videos) {
        stack.upload_corpus(name).await;
    }
    let mut requests: Vec<_> = images
        .iter()
        .enumerate()
        .map(|(i, (name, profile))| request(&format!("{profile}-{i}"), name).with_profile(profile))
        .collect();
    for (id, key, profile) in [
        ("hevc-hdr", videos[0], "default"),
        ("vp9-opus", videos[1], "default"),
        ("av1", "av1.mkv", "default"),
        ("h264-streaming", "clip.mp4", "streaming"),
    ] {
        let mut r = request(id, key).with_profile(profile);
        r.media_type = Some(MediaType::Video);
        requests.push(r);
    }

    let c = Container::run(SHIPPED, &stack.worker_env("g-pod-closure"), &[]);
    c.wait_consuming();
    let (_, metrics) = http_get(c.http, "/metrics").unwrap();
    let info = metrics
        .lines()
        .find(|l| l.starts_with("media_worker_build_info{"))
        .unwrap();
    println!("container: {info}");
    assert!(
        info.contains("profile=\"release\"") && info.contains(&format!("revision=\"{revision}\"")),
        "{info} (image labelled {revision})"
    );

    let files = image_files(SHIPPED);
    let programs = [
        "/usr/local/bin/media-worker",
        "/usr/bin/ffmpeg",
        "/usr/bin/ffprobe",
        "/usr/bin/tini",
    ];
    let watched: BTreeSet<String> = (files.keys())
        .filter(|p| is_library(p) || programs.contains(&p.as_str()))
        .map(|p| p[..p.rfind('/').unwrap()].to_owned())
        .collect();
    let tini: i32 = c.inspect("{{.State.Pid}}").parse().unwrap();
    let opens = Opens::watch(tini, &watched);
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let done = done.clone();
        std::thread::spawn(move || sample_maps(tini, &opens, &done))
    };
    let responses = stack.responses();
    let started = Instant::now();
    stack.send_all(&requests).await;
    let got = by_media_id(responses.take(requests.len(), 6 * MINUTE));
    done.store(true, Ordering::Relaxed);
    let mapped = sampler.join().unwrap();
    println!(
        "container: {} jobs of every profile in {:.1} s",
        got.len(),
        started.elapsed().as_secs_f64()
    );
    for (id, r) in &got {
        assert_eq!(r.status, Status::Completed, "{id}: {:?}", r.error);
    }
    let formats: Vec<_> = got["h264-streaming"]
        .outputs
        .iter()
        .map(|o| o.format.as_str())
        .collect();
    assert!(
        formats.contains(&"hls") && formats.contains(&"dash"),
        "{formats:?}"
    );

    let unused: Vec<_> = files
        .keys()
        .filter(|p| is_library(p) || programs.contains(&p.as_str()))
        .filter(|p| !mapped.contains_key(p.as_str()))
        .collect();
    let loaded: Vec<_> = mapped.keys().filter(|p| is_library(p)).collect();
    let outside: Vec<_> = loaded
        .iter()
        .filter(|p| !files.contains_key(p.as_str()))
        .collect();
    let bytes: u64 = files.values().sum();
    println!(
        "container: {} files, {:.1} MB; {} libraries loaded under the jobs; unused: {unused:?}",
        files.len(),
        bytes as f64 / 1e6,
        loaded.len()
    );
    assert!(unused.is_empty(), "in the image, never loaded: {unused:?}");
    assert!(outside.is_empty(), "loaded, not in the image: {outside:?}");
}
