//! `media-worker demo`'s gallery page in a real browser: the demo over a photo with faces, an
//! animated GIF, a video and a broken file, its folder served as the demo says
//! (`python3 -m http.server`), `index.html` opened in headless Chromium (Debian's, driven by
//! playwright-core; `make setup-test` installs it and hls.js). No console error or failed
//! request, every image decoded, the face boxes drawn where the response puts them, the stream
//! played past 1 s by hls.js, the failure's code shown; a full-page screenshot is kept under
//! the test's target directory.

mod common;

use std::path::Path;
use std::process::Command;

use serde_json::Value;

const PHOTO: &str = "face_recognition_two_people.jpg";
const GIF: &str = "sharp_rotating-squares.gif";
const VIDEO: &str = "rails_rotated_video.mp4";
const BROKEN: &str = "sharp_truncated.jpg";

#[test]
fn the_gallery_shows_every_output_draws_the_faces_and_plays_the_stream_in_chromium() {
    let modules = common::player_modules();
    let dir = tempfile::tempdir().unwrap();
    let inputs = dir.path().join("inputs");
    std::fs::create_dir(&inputs).unwrap();
    for name in [PHOTO, GIF, VIDEO, BROKEN] {
        std::os::unix::fs::symlink(common::corpus(name), inputs.join(name)).unwrap();
    }
    let work = dir.path().join("work");
    let run = Command::new(env!("CARGO_BIN_EXE_media-worker"))
        .arg("demo")
        .arg(&inputs)
        .arg("--out")
        .arg(&work)
        .arg("--hls-js")
        .arg(modules.join("node_modules/hls.js/dist/hls.min.js"))
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let page = work.join("index.html");
    assert!(
        stdout.contains(&format!("gallery: {}", page.display())),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "python3 -m http.server -d {} 8000",
            work.display()
        )),
        "{stdout}"
    );
    let responses: Vec<Value> =
        serde_json::from_slice(&std::fs::read(work.join("responses.json")).unwrap()).unwrap();
    let response = |name: &str| {
        let id = media_worker::commands::media_id_for(Path::new(name));
        responses
            .iter()
            .find(|r| r["media_id"] == id.as_str())
            .unwrap_or_else(|| panic!("no response for {name}"))
    };
    let photo = response(PHOTO);
    let faces = photo["analysis"]["faces"].as_array().unwrap();
    assert!(!faces.is_empty(), "no faces found in {PHOTO}: {photo}");
    let video = response(VIDEO);
    assert!(
        video["outputs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|o| o["format"] == "hls"),
        "{video}"
    );
    // The showcase ladder reaches the streaming one's low rungs: this 480x640 clip streams
    // adaptively (480p, 360p, 234p), not as one variant.
    let master = video["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|o| o["key"].as_str())
        .find(|k| k.ends_with("hls/master.m3u8"))
        .unwrap_or_else(|| panic!("no master playlist: {video}"));
    let master = std::fs::read_to_string(find_file(&work, master)).unwrap();
    let variants = master
        .lines()
        .filter(|l| l.starts_with("#EXT-X-STREAM-INF"))
        .count();
    assert_eq!(variants, 3, "{master}");
    assert_eq!(response(GIF)["success"], true);
    let broken = response(BROKEN);
    assert_eq!(broken["status"], "failed");

    // Served the way the demo tells its user to.
    let port = common::free_port();
    let mut server = common::start_server(
        Command::new("python3")
            .args(["-m", "http.server", "-b", "127.0.0.1", "-d"])
            .arg(&work)
            .arg(port.to_string()),
        &dir.path().join("http.log"),
        port,
        "python3 -m http.server",
    );
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("demo_gallery");
    std::fs::create_dir_all(&shots).unwrap();
    let screenshot = shots.join("gallery.png");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/demo_gallery/check.mjs");
    let check = Command::new("node")
        .arg(script)
        .arg(format!("http://127.0.0.1:{port}/index.html"))
        .arg(&modules)
        .arg(&screenshot)
        .output()
        .unwrap();
    let _ = server.kill();
    let _ = server.wait();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let report: Value = serde_json::from_slice(&check.stdout).unwrap();
    eprintln!("screenshot: {}", screenshot.display());

    assert_eq!(report["console"], serde_json::json!([]), "{report}");
    assert_eq!(report["failedRequests"], serde_json::json!([]), "{report}");
    // Every image: the sources a browser shows, each output, the BlurHash placeholders.
    let images = report["images"].as_array().unwrap();
    let photo_outputs = photo["outputs"].as_array().unwrap().len();
    assert!(images.len() > photo_outputs, "{report}");
    for img in images {
        assert!(
            img["naturalWidth"].as_u64().unwrap() > 0,
            "not decoded: {img}"
        );
    }
    let cards = report["cards"].as_array().unwrap();
    assert_eq!(cards.len(), 4, "{report}");
    let card = |r: &Value| {
        cards
            .iter()
            .find(|c| c["id"] == r["media_id"])
            .unwrap_or_else(|| panic!("no card for {}", r["media_id"]))
    };
    // The boxes drawn over the picture, in the source's pixels, are the response's faces (to
    // one CSS pixel of the picture as shown).
    let shown = card(photo);
    let (w, h) = (
        photo["analysis"]["width"].as_f64().unwrap(),
        photo["analysis"]["height"].as_f64().unwrap(),
    );
    let picture_width = shown["picture"]["width"].as_f64().unwrap();
    assert!(shown["picture"]["naturalWidth"].as_u64().unwrap() > 0);
    let tolerance = w / picture_width;
    let mut drawn: Vec<[f64; 4]> = shown["faces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let v = |k: &str| f[k].as_f64().unwrap();
            [v("x") * w, v("y") * h, v("width") * w, v("height") * h]
        })
        .collect();
    let mut expected: Vec<[f64; 4]> = faces
        .iter()
        .map(|f| {
            let v = |k: &str| f[k].as_f64().unwrap();
            [v("x"), v("y"), v("width"), v("height")]
        })
        .collect();
    let by_place = |a: &[f64; 4], b: &[f64; 4]| a[0].total_cmp(&b[0]).then(a[1].total_cmp(&b[1]));
    drawn.sort_by(by_place);
    expected.sort_by(by_place);
    assert_eq!(drawn.len(), expected.len(), "{shown}");
    for (d, e) in drawn.iter().zip(&expected) {
        for i in 0..4 {
            assert!(
                (d[i] - e[i]).abs() <= tolerance,
                "face drawn at {d:?}, the response says {e:?} (tolerance {tolerance:.2} px)"
            );
        }
    }
    // The failure's code and stage, as the response says.
    let failed = card(broken);
    assert_eq!(failed["status"], "failed");
    let text = failed["text"].as_str().unwrap();
    for field in ["code", "stage"] {
        let want = broken["error"][field].as_str().unwrap();
        assert!(text.contains(want), "{want} not in the card: {text}");
    }
    assert_eq!(report["summary"]["failed"], 1, "{report}");
    // The stream, through hls.js (Media Source Extensions: a blob: source), the pinned version.
    let played = &report["video"];
    assert_eq!(played["player"], "hls.js", "{played}");
    assert!(
        played["src"].as_str().unwrap().starts_with("blob:"),
        "{played}"
    );
    assert!(played["currentTime"].as_f64().unwrap() > 1.0, "{played}");
    let pinned: Value = serde_json::from_slice(
        &std::fs::read(modules.join("node_modules/hls.js/package.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(played["hlsVersion"], pinned["version"], "{played}");
    assert!(report["storyboardTiles"].as_u64().unwrap() > 0, "{report}");
    assert!(std::fs::metadata(&screenshot).unwrap().len() > 0);
}

/// The file under `dir` whose path ends with `key` (the demo's local store lays keys out as
/// paths under its work directory).
fn find_file(dir: &Path, key: &str) -> std::path::PathBuf {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.to_string_lossy().ends_with(key) {
                return p;
            }
        }
    }
    panic!("{key} not under {}", dir.display())
}
