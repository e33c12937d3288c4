//! The event contract as integrators meet it: the examples of docs/events.md and real records
//! of the worker, validated against the published schemas by an independent validator
//! (Debian's python3-jsonschema, tests/reference/validate_schema.py) and read by the Rust types.

#[path = "common/lines.rs"]
mod lines;

use std::path::Path;
use std::process::Command;

use media_worker::contract::{
    ApiError, DeadLetter, OptimizeResponse, ProgressEvent, ProgressStatus, ScanVerdict, SourceRef,
    Status,
};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Validates JSON lines against `schemas/<schema>`; panics with the validator's report.
fn validate(schema: &str, records: &[String]) {
    let out = lines::pipe(
        Command::new("/usr/bin/python3")
            .arg(root().join("tests/reference/validate_schema.py"))
            .arg(root().join("schemas").join(schema)),
        records.to_vec(),
        "python3 with python3-jsonschema (make setup-test)",
    );
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{schema}:\n{report}");
    assert!(
        report.contains(&format!("{} records, 0 invalid", records.len())),
        "{report}"
    );
}

/// The example blocks of docs/events.md marked `<!-- example: SCHEMA -->`, as (schema, JSON).
fn examples() -> Vec<(String, String)> {
    let doc = std::fs::read_to_string(root().join("docs/events.md")).unwrap();
    let mut out = Vec::new();
    let mut rest = doc.as_str();
    while let Some(at) = rest.find("<!-- example: ") {
        rest = &rest[at + "<!-- example: ".len()..];
        let schema = rest[..rest.find(" -->").unwrap()].to_owned();
        let start = rest.find("```json\n").unwrap() + "```json\n".len();
        let end = start + rest[start..].find("\n```").unwrap();
        let json: serde_json::Value = serde_json::from_str(&rest[start..end]).unwrap();
        out.push((schema, json.to_string()));
        rest = &rest[end..];
    }
    out
}

#[test]
fn the_documented_examples_match_the_schemas_and_the_types() {
    let all = examples();
    let kinds = |s: &str| all.iter().filter(|(k, _)| k == s).count();
    assert!(kinds("optimize-response.v1.json") >= 4 && kinds("dead-letter.v1.json") == 1);
    assert!(kinds("scan-response.v1.json") >= 1 && kinds("scan-request.v1.json") >= 1);
    assert_eq!(kinds("progress-event.v1.json"), 1);
    for schema in [
        "optimize-response.v1.json",
        "dead-letter.v1.json",
        "scan-response.v1.json",
        "scan-request.v1.json",
        "api-error.v1.json",
        "progress-event.v1.json",
    ] {
        let records: Vec<String> = all
            .iter()
            .filter(|(k, _)| k == schema)
            .map(|(_, j)| j.clone())
            .collect();
        validate(schema, &records);
    }
    let mut statuses = Vec::new();
    let mut replayed = false;
    for (schema, json) in &all {
        if schema == "dead-letter.v1.json" {
            let d: DeadLetter = serde_json::from_str(json).unwrap();
            assert!(d.response.is_some() && d.request.is_some());
        } else if schema == "scan-response.v1.json" {
            let v: ScanVerdict = serde_json::from_str(json).unwrap();
            assert_eq!(v.clean, v.signature.is_none());
        } else if schema == "scan-request.v1.json" {
            let _: SourceRef = serde_json::from_str(json).unwrap();
        } else if schema == "progress-event.v1.json" {
            let p: ProgressEvent = serde_json::from_str(json).unwrap();
            assert!(p.status == ProgressStatus::Progressing && (0.0..1.0).contains(&p.progress));
        } else if schema == "api-error.v1.json" {
            let e: ApiError = serde_json::from_str(json).unwrap();
            assert!(media_worker::contract::API_ERROR_CODES.contains(&e.error.code.as_str()));
        } else {
            let r: OptimizeResponse = serde_json::from_str(json).unwrap();
            statuses.push(r.status);
            replayed |= r.replayed;
        }
    }
    for s in [Status::Completed, Status::Degraded, Status::Failed] {
        assert!(statuses.contains(&s), "no {s:?} example");
    }
    assert!(replayed, "no replayed example");
}

/// Real responses (a photo, a video, a truncated file, a text file, an animated GIF) and the
/// requests that make them, against the published schemas.
#[test]
fn real_records_match_the_schemas() {
    let out = tempfile::tempdir().unwrap();
    let corpus = root().join("../shared/corpus");
    let files = [
        "sharp_Landscape_6.jpg",
        "rails_rotated_video.mp4",
        "sharp_truncated.jpg",
        "chorus_not_an_image.jpg",
        "sharp_rotating-squares.gif",
    ];
    let run = Command::new(env!("CARGO_BIN_EXE_media-worker"))
        .arg("process")
        .args(files.map(|f| corpus.join(f)))
        .arg("--out")
        .arg(out.path())
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    let lines: Vec<String> = String::from_utf8(run.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(
        lines.len(),
        files.len(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    validate("optimize-response.v1.json", &lines);

    let request = media_worker::contract::OptimizeRequest::new(
        "r-1".into(),
        "m_1".into(),
        "u-1",
        "uploads",
        "u-1/a.jpg".into(),
    )
    .with_profile("default");
    let mut with_metadata = request.clone();
    with_metadata.metadata = Some([("tenant.id".to_owned(), "42".to_owned())].into());
    validate(
        "optimize-request.v1.json",
        &[request, with_metadata].map(|r| serde_json::to_string(&r).unwrap()),
    );
}
