//! A compromised decoder, played from inside the sandbox against Apache Kafka + s3s-fs: uploads
//! that start with the attack probe's marker make their job process (built with the test-only
//! feature `attack-probe`) attack from inside its confinement, as code injected into libvips
//! or FFmpeg would. Each attack is refused or contained, every job is answered, the worker's
//! memory stays flat, nothing of a job outlives it, and the next job succeeds.

mod common;

use std::collections::BTreeMap;
use std::io::Read;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::time::Duration;

use common::*;
use media_worker::contract::{ErrorCode, OptimizeResponse, Status};
use media_worker::sandbox::attack::MARKER;

/// An upload that makes its job process perform `attacks` (JSON).
fn hostile(dir: &Path, name: &str, attacks: serde_json::Value) -> std::path::PathBuf {
    let path = dir.join(name);
    let mut bytes = MARKER.to_vec();
    bytes.extend(serde_json::to_vec(&attacks).unwrap());
    std::fs::write(&path, bytes).unwrap();
    path
}

/// A file anyone may read or write, owned by the sandbox's uid: only the sandbox's own layers
/// stand between it and a job process.
fn open_to_all(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).unwrap();
    std::os::unix::fs::chown(path, Some(65534), Some(65534)).unwrap();
}

fn error_of(r: &OptimizeResponse) -> (ErrorCode, String) {
    let e = r
        .error
        .as_ref()
        .unwrap_or_else(|| panic!("not failed: {r:?}"));
    (e.code, e.message.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compromised_decoder_gets_nothing() {
    let stack = Stack::start(1).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut env = stack.worker_env("g-attack");
    env.insert("WORKER_POOL_SIZE".into(), "2".into());
    let worker = Worker::start(&env);
    worker.wait_ready();
    assert_eq!(
        worker.metric("media_worker_sandbox_layers{layer=\"seccomp\"}"),
        Some(1.0)
    );
    let responses = stack.responses();

    // What an attacker is after: the worker's S3 secret (its environment), a secret file,
    // another job's upload, the S3 endpoint, a way out (a shell, a file it leaves behind, a
    // process that stays), and an HTTP server of its own.
    let secret = dir.path().join("secret.txt");
    open_to_all(&secret, "the-secret-in-a-file");
    let other_job = worker.scratch_dir().join("job-of-another-tenant");
    std::fs::create_dir_all(&other_job).unwrap();
    std::fs::set_permissions(&other_job, std::fs::Permissions::from_mode(0o777)).unwrap();
    open_to_all(&other_job.join("source"), "another-tenants-upload");
    let created = dir.path().join("left-by-the-attacker");
    let s3 = env["AWS_ENDPOINT_URL_S3"]
        .trim_start_matches("http://")
        .to_owned();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let own = listener.local_addr().unwrap();
    // A daemon's UNIX socket that file permissions alone would let the job process reach.
    let daemon = dir.path().join("daemon.sock");
    let unix = UnixListener::bind(&daemon).unwrap();
    unix.set_nonblocking(true).unwrap();
    std::fs::set_permissions(&daemon, std::fs::Permissions::from_mode(0o777)).unwrap();
    let pid = worker.pid();
    let probes = serde_json::json!([
        {"read_environ": pid},
        {"read_file": secret},
        {"read_file": other_job.join("source")},
        {"connect": s3},
        {"connect": own.to_string()},
        {"connect_unix": daemon},
        {"create_file": created},
        {"exec": "/bin/sh"},
        {"ptrace": pid},
        {"signal": pid},
        "sleeper",
        {"ffmpeg_read": secret},
        {"ffmpeg_connect": format!("http://{own}/x")},
    ]);
    let misbehaviours = [
        (
            "flood-replies",
            serde_json::json!([{"flood_replies": 64 << 20}]),
        ),
        (
            "flood-stderr",
            serde_json::json!([{"flood_stderr": 64 << 20}]),
        ),
        ("forged-limit", serde_json::json!(["forge_time_limit"])),
        (
            "output-outside",
            serde_json::json!([{"output_outside": secret}]),
        ),
        (
            "output-symlink",
            serde_json::json!([{"output_symlink": secret}]),
        ),
    ];
    stack.upload_corpus("sharp_Landscape_1.jpg").await;
    stack.send(&request("warm", "sharp_Landscape_1.jpg")).await;
    assert_eq!(responses.take(1, MINUTE)[0].body.status, Status::Completed);
    let rss_before = worker.rss();

    let mut sent = 1;
    let file = hostile(dir.path(), "probes.png", probes);
    stack.upload_file("probes.png", &file).await;
    stack.send(&request("probes", "probes.png")).await;
    for (id, attacks) in &misbehaviours {
        let file = hostile(dir.path(), id, attacks.clone());
        stack.upload_file(id, &file).await;
        stack.send(&request(id, id)).await;
    }
    sent += 1 + misbehaviours.len();
    let got: BTreeMap<String, OptimizeResponse> = responses
        .take(1 + misbehaviours.len(), 3 * MINUTE)
        .into_iter()
        .map(|r| (r.body.media_id.clone().unwrap(), r.body))
        .collect();

    // Every probe refused, and nothing it was after in its answer.
    let (code, report) = error_of(&got["probes"]);
    assert_eq!(code, ErrorCode::UnsupportedMedia, "{report}");
    assert_all_refused(&report, &PROBES);
    assert!(
        !created.exists(),
        "the attacker created {}",
        created.display()
    );
    // Nothing reached the test's own server, not the job process and not its ffmpeg.
    match listener.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        Ok((mut s, from)) => {
            let mut said = String::new();
            let _ = s.read_to_string(&mut said);
            panic!("a connection from {from}: {said:?}");
        }
        Err(e) => panic!("{e}"),
    }
    match unix.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        Ok(_) => panic!("a connection to the daemon's UNIX socket"),
        Err(e) => panic!("{e}"),
    }
    // The process it left behind (in a new process group, since setsid was refused) is gone.
    let sleeper = sleeper_pid(&report);
    assert!(
        sleeper > 0 && exits_within(sleeper, Duration::from_secs(5)),
        "{sleeper} lives"
    );

    // Each misbehaviour costs its job, which is answered `media_crashed` (a forged time limit
    // is clamped, and the job's own answer goes out).
    for (id, _) in &misbehaviours {
        let (code, message) = error_of(&got[*id]);
        let want = if *id == "forged-limit" {
            ErrorCode::UnsupportedMedia
        } else {
            ErrorCode::MediaCrashed
        };
        assert_eq!(code, want, "{id}: {message}");
        assert!(got[*id].outputs.is_empty(), "{id}: {:?}", got[*id].outputs);
    }
    assert!(
        error_of(&got["flood-replies"])
            .1
            .contains("reply line longer")
    );
    assert!(error_of(&got["flood-stderr"]).1.contains("on stderr"));
    assert!(
        error_of(&got["output-outside"])
            .1
            .contains("an output it may not")
    );
    assert!(
        error_of(&got["output-symlink"])
            .1
            .contains("an output it may not")
    );
    assert!(
        error_of(&got["forged-limit"])
            .1
            .contains("forge_time_limit: sent")
    );

    // The worker's memory is flat after two 64 MiB lines; the next job succeeds; the
    // partition's commit reaches the end; no process but the idle fork servers is left.
    let rss_after = worker.rss();
    assert!(
        rss_after < rss_before + (32 << 20),
        "worker RSS grew from {} to {} MiB",
        rss_before >> 20,
        rss_after >> 20
    );
    stack.send(&request("after", "sharp_Landscape_1.jpg")).await;
    sent += 1;
    assert_eq!(responses.take(1, MINUTE)[0].body.status, Status::Completed);
    wait_for("the commit at the end", MINUTE, || {
        (stack.committed("g-attack", 1) == vec![sent as i64]).then_some(())
    });
    let left = descendants_of(worker.pid());
    assert!(
        left.len() <= 2
            && left
                .iter()
                .all(|p| proc_stat(*p).unwrap().1 == worker.pid()),
        "left: {:?}",
        left.iter().map(|p| cmdline(*p)).collect::<Vec<_>>()
    );
    assert_eq!(worker.http_get("/health/ready").unwrap().0, 200);
}

/// Without a layer (here turned off, as on a kernel without Landlock) the worker says so in
/// its metric and, with MEDIA_SANDBOX_REQUIRE, refuses to start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_layer_is_reported_and_can_be_required() {
    let stack = Stack::start(1).await;
    let mut env = stack.worker_env("g-layers");
    env.insert("MEDIA_SANDBOX_DISABLE".into(), "landlock".into());
    let worker = Worker::start(&env);
    worker.wait_ready();
    let layer =
        |name: &str| worker.metric(&format!("media_worker_sandbox_layers{{layer=\"{name}\"}}"));
    assert_eq!(layer("landlock_fs"), Some(0.0));
    assert_eq!(layer("seccomp"), Some(1.0));
    assert_eq!(layer("unprivileged"), Some(1.0));
    drop(worker);

    env.insert("MEDIA_SANDBOX_REQUIRE".into(), "true".into());
    let mut refused = Worker::spawn(&env);
    let status = refused.wait_exit(MINUTE);
    assert_eq!(status.code(), Some(1));
    assert!(refused.log().contains("landlock_fs"), "{}", refused.log());
}

/// The shipped binary carries no attack probe: the marker is in this test build's binary and
/// in no release build (`make deploy-check` looks for it in the one it builds).
#[test]
fn the_attack_probe_is_in_test_builds_only() {
    let bin = std::fs::read(env!("CARGO_BIN_EXE_media-worker")).unwrap();
    let marker = std::str::from_utf8(MARKER).unwrap().trim();
    assert!(
        bin.windows(marker.len()).any(|w| w == marker.as_bytes()),
        "this build has no attack probe"
    );
}
