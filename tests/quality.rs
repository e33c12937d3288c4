//! Auto quality, checked from outside: every output of the `picture` profile (AVIF, WebP and
//! JPEG at `quality = "auto"`) on the corpus photos is decoded apart from libvips (AVIF by
//! libavif's `avifdec` with dav1d, JPEG and WebP by Pillow) and scored again with an
//! SSIMULACRA2 written apart from the worker's (`ssimu2-lite`, not the fast-ssim2 the worker
//! uses) against the pixels it was encoded from; and the photos take fewer bytes than at the
//! fixed qualities of `variants`, AVIF fewer than WebP. The corpus animations' animated WebP
//! variants are checked the same way on their frames as shown (Pillow composites them), and
//! every output that says it has a target, of every kind the `showcase` profile makes of an
//! animated GIF (MP4 renditions and thumbnails too), carries its score.

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
        // An animated WebP is checked on its frames as shown, by the next test.
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

/// Each output of an animated input that says it has a target carries its score; each
/// animated WebP variant, decoded by Pillow (frames as shown) and scored by ssimu2-lite
/// against the frames it was encoded from, meets its target on the frames the worker's score
/// is taken on (`media::animation`: the frame showing at the middle of each of 8 equal spans of
/// one play, the worst of them; computed here from Pillow's durations), and the worker's own
/// score is not above that worst. The worst of every frame shown is printed beside it.
///
/// Not "within 0.5 either way" as for the photos: on the same pixels (sharp's
/// animated-loop-3, a flat graphic, frame 0 at 370 px, opaque) fast-ssim2 gives 90.65 and
/// ssimu2-lite 92.13, where on photos and the other animations they agree within 0.02; the
/// worker is the stricter one there.
#[test]
fn every_animated_output_with_a_target_meets_it_and_carries_its_score() {
    media::init(1);
    let settings = Settings::load_from(None, Vec::new()).unwrap();
    let picture = settings.media_job("picture", None);
    let work = tempfile::tempdir().unwrap();
    let mut unscored = Vec::new();
    // Per animated output: (input, name, target, own score, its reference frames).
    let mut animated = Vec::new();
    let mut jobs = Vec::new();
    let animations = common::corpus_of_kinds(&["animated"]);
    assert!(animations.len() >= 3, "the corpus's animations");
    for input in &animations {
        let source = corpus(&input.name);
        // The frames each animated variant is encoded from, by width: raw files and bands.
        let mut refs: BTreeMap<u32, Vec<(PathBuf, u32)>> = BTreeMap::new();
        media::image::animated_pixels(&picture, &source, |_, i, img| {
            let path = work
                .path()
                .join(format!("{}-{}-{i}.ref", input.name, img.width()));
            std::fs::write(&path, img.pixels().unwrap()).unwrap();
            refs.entry(img.width())
                .or_default()
                .push((path, img.bands()));
        })
        .unwrap();
        let out = process(
            &settings,
            "picture",
            &source,
            &work.path().join(&input.name),
        );
        let mut outputs: Vec<_> = out.files.into_iter().map(|f| ("picture", f)).collect();
        if input.name.ends_with(".gif") {
            // Every kind of output an animated GIF makes: MP4 renditions, a thumbnail.
            let dir = work.path().join(format!("{}-showcase", input.name));
            let showcase = process(&settings, "showcase", &source, &dir);
            assert!(
                showcase.files.iter().any(|f| f.name.ends_with(".mp4")),
                "{}: no MP4 rendition",
                input.name
            );
            outputs.extend(showcase.files.into_iter().map(|f| ("showcase", f)));
        }
        for (profile, f) in &outputs {
            let Some(q) = f.quality else { continue };
            let Some(target) = q.target else { continue };
            if q.score.is_none() {
                unscored.push(format!(
                    "{} {profile} {}: target {target}, no score",
                    input.name, f.name
                ));
            }
            // The animated variants of `picture` (`showcase` makes the same ones).
            if f.frames.is_some() && f.role == "variant" && *profile == "picture" {
                let raw = work
                    .path()
                    .join(format!("{}-{}.frames", input.name, f.name));
                jobs.push(
                    serde_json::json!({"input": f.path, "raw": raw, "frames": true}).to_string(),
                );
                let frames = refs.get(&f.width).cloned().unwrap_or_else(|| {
                    panic!("{} {}: no reference frames {refs:?}", input.name, f.name)
                });
                animated.push((
                    input.name.clone(),
                    f.name.clone(),
                    target,
                    q.score,
                    frames,
                    raw,
                ));
            }
        }
    }
    assert!(!animated.is_empty(), "no animated output");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference/decode_rgb.py");
    let run = common::lines::pipe(
        Command::new("/usr/bin/python3").arg(script),
        jobs,
        "Debian's python3 with python3-pil (scripts/setup.sh --test)",
    );
    assert!(run.status.success(), "{run:?}");
    let decoded = common::lines::json_lines(&run);
    assert_eq!(decoded.len(), animated.len());
    let (mut below, mut overclaimed) = (Vec::new(), Vec::new());
    for ((name, file, target, own, refs, raw), d) in animated.iter().zip(&decoded) {
        let (w, h) = (
            d["width"]
                .as_u64()
                .unwrap_or_else(|| panic!("{name} {file}: {d}")) as usize,
            d["height"].as_u64().unwrap() as usize,
        );
        let durations: Vec<u64> = d["durations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        assert_eq!(durations.len(), refs.len(), "{name} {file}: frames");
        let shown = std::fs::read(raw).unwrap();
        let scores: Vec<f64> = refs
            .iter()
            .enumerate()
            .map(|(i, (reference, bands))| {
                let reference = std::fs::read(reference).unwrap();
                let frame = &shown[i * w * h * 4..][..w * h * 4];
                // With alpha, the worse of a dark and a light background.
                let backgrounds: &[f32] = if *bands == 4 { &[0.1, 0.9] } else { &[0.5] };
                backgrounds
                    .iter()
                    .map(|bg| {
                        let (a, b) = (on(&reference, *bands as usize, *bg), on(frame, 4, *bg));
                        ssimu2_lite::compare(
                            ssimu2_lite::RgbImage::srgb_f32(&a, w, h, w * 3).unwrap(),
                            ssimu2_lite::RgbImage::srgb_f32(&b, w, h, w * 3).unwrap(),
                        )
                        .unwrap()
                    })
                    .fold(f64::INFINITY, f64::min)
            })
            .collect();
        let samples = sampled(&durations);
        let worst = samples
            .iter()
            .map(|i| scores[*i])
            .fold(f64::INFINITY, f64::min);
        let seen = scores
            .iter()
            .zip(&durations)
            .filter(|(_, d)| **d > 0)
            .map(|(s, _)| *s)
            .fold(f64::INFINITY, f64::min);
        println!(
            "{name} {file} ({} frames, {w}x{h}): worst of frames {samples:?} {worst:.2}, of every \
             frame shown {seen:.2}; the worker's {own:?} for {target}",
            refs.len()
        );
        if worst < target - DECODERS_DIFFER_BY {
            below.push(format!("{name} {file}: {worst:.2} for {target}"));
        }
        // The worker may score lower than ssimu2-lite (stricter), never higher.
        if let Some(own) = own
            && *own > worst + DECODERS_DIFFER_BY
        {
            overclaimed.push(format!(
                "{name} {file}: {worst:.2} here, {own} by the worker"
            ));
        }
    }
    assert!(
        unscored.is_empty(),
        "outputs with a target and no score: {unscored:#?}"
    );
    assert!(below.is_empty(), "under the target: {below:#?}");
    assert!(
        overclaimed.is_empty(),
        "the worker claims more: {overclaimed:#?}"
    );
}

/// The frames an animation's score is taken on, from its frames' durations: the frame showing
/// at the middle of each of 8 equal spans of one play, each once (by number without any
/// duration).
fn sampled(durations: &[u64]) -> Vec<usize> {
    let total: u64 = durations.iter().sum();
    let n = durations.len().min(8);
    let mut picked: Vec<usize> = (0..n)
        .map(|k| {
            if total == 0 {
                return k * durations.len() / n;
            }
            let at = (k as f64 + 0.5) * total as f64 / n as f64;
            let mut end = 0;
            durations
                .iter()
                .position(|d| {
                    end += d;
                    end as f64 > at
                })
                .unwrap()
        })
        .collect();
    picked.dedup();
    picked
}

/// 8-bit sRGB pixels of `bands` (3, or 4 with alpha) as RGB composited onto a grey `bg` (0-1)
/// in encoded values, as SSIMULACRA2's reference tool (and the worker's fast-ssim2) treats
/// alpha: the worse of backgrounds 0.1 and 0.9.
fn on(pixels: &[u8], bands: usize, bg: f32) -> Vec<f32> {
    pixels
        .chunks_exact(bands)
        .flat_map(|p| {
            let a = if bands == 4 { p[3] as f32 / 255.0 } else { 1.0 };
            [0, 1, 2].map(|c| a * p[c] as f32 / 255.0 + (1.0 - a) * bg)
        })
        .collect()
}
