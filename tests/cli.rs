//! The binary's contract outside Kafka: config errors, schemas, `process`.

use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_media-worker"))
}

#[test]
fn invalid_config_is_one_line_naming_the_key_and_exit_code_2() {
    let out = bin()
        .arg("run")
        .env("WORKER_POOL_SIZE", "lots")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("worker.pool_size") && err.contains("WORKER_POOL_SIZE"),
        "{err}"
    );
}

#[test]
fn committed_schemas_match_the_rust_types() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas");
    for (name, text) in media_worker::contract::schemas() {
        let on_disk = std::fs::read_to_string(dir.join(name)).unwrap_or_default();
        assert!(
            on_disk == text,
            "schemas/{name} is stale: run `make schemas`"
        );
    }
}

#[test]
fn process_writes_variants_and_prints_one_response_per_file() {
    let out = tempfile::tempdir().unwrap();
    let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/corpus");
    let run = bin()
        .args(["process", "--out"])
        .arg(out.path())
        .arg(corpus.join("sharp_Landscape_8.jpg"))
        .arg(corpus.join("sharp_truncated.jpg"))
        .env("WORKER_POOL_SIZE", "2")
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(1), "one file fails");
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&run.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    let ok = lines.iter().find(|r| r["success"] == true).unwrap();
    assert_eq!(
        ok["outputs"].as_array().unwrap().len(),
        6,
        "2 widths x 2 formats + 2 thumbnails"
    );
    for o in ok["outputs"].as_array().unwrap() {
        assert!(out.path().join(o["key"].as_str().unwrap()).is_file());
    }
    let bad = lines.iter().find(|r| r["success"] == false).unwrap();
    assert_eq!(bad["error"]["code"], "corrupt_input");
}

/// A file named twice (directly and through its directory) is one job: one response, its
/// outputs whole. Two files of one name in different directories would write the same keys:
/// refused before any work, naming both.
#[test]
fn process_runs_each_file_once_and_refuses_two_that_share_outputs() {
    let out = tempfile::tempdir().unwrap();
    let src = tempfile::tempdir().unwrap();
    let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/corpus");
    for dir in ["a", "b"] {
        std::fs::create_dir(src.path().join(dir)).unwrap();
        std::fs::copy(
            corpus.join("sharp_Landscape_8.jpg"),
            src.path().join(dir).join("photo.jpg"),
        )
        .unwrap();
    }
    let photo = src.path().join("a/photo.jpg");
    let run = bin()
        .args(["process", "--out"])
        .arg(out.path())
        .arg(&photo)
        .arg(&photo)
        .arg(src.path().join("a"))
        .env("WORKER_POOL_SIZE", "2")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "{stderr}");
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&run.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "one job for one file");
    assert_eq!(lines[0]["attempts"], 1, "{}", lines[0]);
    for o in lines[0]["outputs"].as_array().unwrap() {
        assert!(out.path().join(o["key"].as_str().unwrap()).is_file());
    }

    let clash = tempfile::tempdir().unwrap();
    let run = bin()
        .args(["process", "--out"])
        .arg(clash.path())
        .arg(&photo)
        .arg(src.path().join("b/photo.jpg"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert!(run.stdout.is_empty(), "no job ran");
    assert!(
        stderr.contains("a/photo.jpg") && stderr.contains("b/photo.jpg"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_dir(clash.path()).unwrap().count(),
        0,
        "nothing written"
    );
}
