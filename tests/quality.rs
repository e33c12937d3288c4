//! Auto quality, checked from outside: every output of the `picture` profile (AVIF, WebP and
//! JPEG at `quality = "auto"`) on the corpus photos is decoded apart from libvips (AVIF by
//! libavif's `avifdec` with dav1d, JPEG and WebP by Pillow) and scored again with an
//! SSIMULACRA2 written apart from the worker's (`ssimu2-lite`, not the fast-ssim2 the worker
//! uses) against the pixels it was encoded from; and the photos take fewer bytes than at the
//! fixed qualities of `variants`, AVIF fewer than WebP.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::corpus;
use media_worker::config::Settings;
use media_worker::media::{self, Control, MediaOutput};

/// How far the score here may fall from the worker's: the implementations agree within 0.01 on
/// the same pixels, but the decoders here (Pillow's libjpeg-turbo settings, dav1d) are not
/// libvips' (libjpeg-turbo, libaom through libheif); measured up to 0.4.
const DECODERS_DIFFER_BY: f64 = 0.5;

/// The corpus photos (those with alpha are skipped: the reference scorer takes RGB).
fn opaque_photos() -> Vec<String> {
    common::corpus_of_kinds(&["photo", "faces", "orientation", "color"])
        .into_iter()
        .map(|f| f.name)
        .collect()
}

fn process(settings: &Settings, profile: &str, input: &Path, out: &Path) -> MediaOutput {
    std::fs::create_dir_all(out).unwrap();
    let job = settings.media_job(profile, None);
    media::process(&job, input, out, &mut Control::new(&mut |_| {}))
        .unwrap_or_else(|f| panic!("{}: {:?}", input.display(), f.error))
}

#[test]
fn auto_quality_meets_its_target_on_every_output_with_fewer_bytes_than_fixed() {
    media::init(1);
    let settings = Settings::load_from(None, Vec::new()).unwrap();
    let picture = settings.media_job("picture", None);
    let work = tempfile::tempdir().unwrap();
    // Total bytes of the variants per (profile, format).
    let mut bytes: BTreeMap<(&str, String), u64> = BTreeMap::new();
    // Per output: its reference pixels and what decodes it; where the decoded pixels go.
    let mut jobs: Vec<(PathBuf, String)> = Vec::new();
    let mut raws = Vec::new();
    // What each scored output is: (photo, file, target, the worker's own score).
    let mut scored = Vec::new();
    for photo in opaque_photos() {
        let source = corpus(&photo);
        // The pixels each variant is encoded from, as raw RGB.
        let mut refs: BTreeMap<u32, PathBuf> = BTreeMap::new();
        let mut alpha = false;
        media::image::variant_pixels(&picture, &source, |w, img| {
            alpha |= img.bands() != 3;
            let path = work.path().join(format!("{photo}-{w}.rgb"));
            std::fs::write(&path, img.pixels().unwrap()).unwrap();
            refs.insert(w, path);
        })
        .unwrap();
        if alpha {
            println!("{photo}: not scored (alpha)");
            continue;
        }
        let out = process(&settings, "picture", &source, &work.path().join(&photo));
        let fixed = process(&settings, "variants", &source, &work.path().join("fixed"));
        for (profile, o) in [("picture", &out), ("variants", &fixed)] {
            for f in o.files.iter().filter(|f| f.role == "variant") {
                *bytes
                    .entry((profile, f.format.name().to_owned()))
                    .or_default() += f.size_bytes;
            }
        }
        // An animated WebP's frames are resized one by one: it takes the still's quality, unscored.
        for f in out
            .files
            .iter()
            .filter(|f| f.role == "variant" && f.frames.is_none())
        {
            let q = f.quality.expect("image outputs carry their quality");
            let target = q.target.expect("every format of `picture` is auto");
            // Every still output is scored.
            assert!(q.score.is_some(), "{photo} {}: no score", f.name);
            // AVIF through libavif (dav1d), the others through Pillow.
            let decoded = if f.format.name() == "avif" {
                let png = f.path.with_extension("avifdec.png");
                let run = Command::new("avifdec")
                    .arg(&f.path)
                    .arg(&png)
                    .output()
                    .expect("avifdec (libavif-bin, scripts/setup.sh --test)");
                assert!(run.status.success(), "{}: {run:?}", f.path.display());
                png
            } else {
                f.path.clone()
            };
            let raw = work.path().join(format!("{photo}-{}.rgb", f.name));
            let job = serde_json::json!({"input": decoded, "raw": raw}).to_string();
            jobs.push((refs[&f.width].clone(), job));
            raws.push(raw);
            scored.push((photo.clone(), f.name.clone(), target, q.score));
        }
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference/decode_rgb.py");
    let run = common::lines::pipe(
        Command::new("/usr/bin/python3").arg(script),
        jobs.iter().map(|(_, j)| j.clone()).collect::<Vec<_>>(),
        "Debian's python3 with python3-pil (scripts/setup.sh --test)",
    );
    assert!(run.status.success(), "{run:?}");
    let decoded = common::lines::json_lines(&run);
    assert_eq!(decoded.len(), jobs.len());
    let (mut below, mut worst_gap) = (Vec::new(), 0.0f64);
    for (((reference, raw), (photo, name, target, own)), d) in jobs
        .iter()
        .map(|(r, _)| r)
        .zip(&raws)
        .zip(&scored)
        .zip(&decoded)
    {
        let (w, h) = (d["width"].as_u64(), d["height"].as_u64());
        let (w, h) = (
            w.unwrap_or_else(|| panic!("{photo} {name}: {d}")) as usize,
            h.unwrap() as usize,
        );
        let (a, b) = (
            std::fs::read(reference).unwrap(),
            std::fs::read(raw).unwrap(),
        );
        let score = ssimu2_lite::compare(
            ssimu2_lite::RgbImage::srgb8(&a, w, h, w * 3).unwrap(),
            ssimu2_lite::RgbImage::srgb8(&b, w, h, w * 3).unwrap(),
        )
        .unwrap();
        if score < target - DECODERS_DIFFER_BY {
            below.push(format!("{photo} {name}: {score:.2} for {target}"));
        }
        if let Some(own) = own {
            worst_gap = worst_gap.max((score - own).abs());
        }
    }
    println!(
        "{} outputs scored; the implementations differed by up to {worst_gap:.2} where both \
         scored; bytes {bytes:?}",
        decoded.len()
    );
    assert!(below.is_empty(), "under the target: {below:#?}");
    assert!(worst_gap <= DECODERS_DIFFER_BY, "{worst_gap}");
    for format in ["webp", "jpeg"] {
        let (auto, fixed) = (
            bytes[&("picture", format.to_owned())],
            bytes[&("variants", format.to_owned())],
        );
        assert!(auto < fixed, "{format}: auto {auto} B, fixed {fixed} B");
    }
    let (avif, webp) = (
        bytes[&("picture", "avif".to_owned())],
        bytes[&("picture", "webp".to_owned())],
    );
    // The goal (at most 3/4 of WebP's) is measured by `make bench-quality`.
    assert!(avif < webp, "AVIF {avif} B, WebP {webp} B");
}
