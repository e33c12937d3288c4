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
