//! OpenCV analysis and the face-aware thumbnail, through the same `media::process` the worker
//! runs (default profile, real corpus files).

mod common;

use std::path::Path;

use common::corpus;
use media_worker::config::Settings;
use media_worker::contract::{ImageAnalysis, Rect, Vision};
use media_worker::media::vips::Image;
use media_worker::media::{self, Control, MediaOutput};

fn settings() -> Settings {
    Settings::load_from(None, Vec::new()).unwrap()
}

fn run_with(settings: &Settings, path: &Path) -> MediaOutput {
    let out = tempfile::tempdir().unwrap();
    media::init(1);
    let job = settings.media_job("default", None);
    // Only the metadata of the produced files is inspected; the directory goes with `out`.
    media::process(&job, path, out.path(), &mut Control::new(&mut |_| {})).unwrap()
}

fn image_analysis(out: &MediaOutput) -> ImageAnalysis {
    let a = out.analysis.as_ref().expect("default profile analyses");
    a.image().expect("an image").clone()
}

fn analyse(path: &Path) -> (ImageAnalysis, Vision, MediaOutput) {
    let out = run_with(&settings(), path);
    let a = image_analysis(&out);
    let v = a
        .vision
        .clone()
        .unwrap_or_else(|| panic!("{}: {:?}", path.display(), out.warnings));
    (a, v, out)
}

fn inside(inner: &Rect, outer: &Rect) -> bool {
    inner.x >= outer.x
        && inner.y >= outer.y
        && inner.x + inner.width <= outer.x + outer.width
        && inner.y + inner.height <= outer.y + outer.height
}

fn hamming(a: &str, b: &str) -> u32 {
    let (a, b) = (
        u64::from_str_radix(a, 16).unwrap(),
        u64::from_str_radix(b, 16).unwrap(),
    );
    (a ^ b).count_ones()
}

/// A temp JPEG made from a corpus image by `f`.
fn derived(name: &str, f: impl FnOnce(Image) -> Image) -> tempfile::TempPath {
    media::vips::init(1);
    let img = Image::open(&corpus(name)).unwrap();
    let path = tempfile::Builder::new()
        .suffix(".jpg")
        .tempfile()
        .unwrap()
        .into_temp_path();
    f(img)
        .save(&path, media_worker::contract::OutputFormat::Jpeg, 92)
        .unwrap();
    path
}

#[test]
fn fields_are_present_and_sane() {
    for name in [
        "face_recognition_obama.jpg",
        "imageio_coffee.png",
        "sharp_Landscape_6.jpg",
        "sharp_5_webp_a.webp",
    ] {
        let (a, v, out) = analyse(&corpus(name));
        assert!(out.warnings.is_empty(), "{name}: {:?}", out.warnings);
        assert_eq!(v.face_count as usize, v.faces.len());
        let image = Rect {
            x: 0,
            y: 0,
            width: a.width,
            height: a.height,
        };
        assert!(
            v.faces.iter().all(|f| inside(f, &image)),
            "{name}: faces inside the image"
        );
        assert!(
            v.focal_point.x < a.width && v.focal_point.y < a.height,
            "{name}"
        );
        assert!(v.blur_score > 0.0 && v.blur_score.is_finite(), "{name}");
        assert_eq!(v.phash.len(), 16);
        assert!(v.phash.chars().all(|c| c.is_ascii_hexdigit()));
        assert!(v.dominant_color.len() == 7 && v.dominant_color.starts_with('#'));
        assert!(
            (6..=40).contains(&v.blurhash.len()),
            "{name}: {}",
            v.blurhash
        );
        let thumbs: Vec<_> = out.files.iter().filter(|f| f.role == "thumbnail").collect();
        assert_eq!(thumbs.len(), 2, "{name}: webp + jpeg thumbnails");
        assert!(
            thumbs
                .iter()
                .all(|t| (t.width, t.height) == (256, 256.min(a.height)))
        );
    }
    // Upright coordinates: Landscape_6 is stored 450x600 and displayed 600x450.
    let (a, _, _) = analyse(&corpus("sharp_Landscape_6.jpg"));
    assert_eq!((a.width, a.height, a.orientation), (600, 450, 6));
}

#[test]
fn faces_are_found_on_people_and_not_on_animals() {
    for (name, n) in [
        ("face_recognition_obama.jpg", 1),
        ("face_recognition_two_people.jpg", 2),
        ("imageio_astronaut.png", 1),
    ] {
        assert_eq!(analyse(&corpus(name)).1.face_count, n, "{name}");
    }
    for name in ["imageio_chelsea.png", "dlib_dogs.jpg", "dlib_horses.jpg"] {
        assert_eq!(
            analyse(&corpus(name)).1.face_count,
            0,
            "{name}: an animal is not a face"
        );
    }
}

#[test]
fn phash_matches_across_sizes_and_separates_different_images() {
    let half = derived("face_recognition_obama.jpg", |i| i.resize(0.5).unwrap());
    let full = analyse(&corpus("face_recognition_obama.jpg")).1.phash;
    let small = analyse(&half).1.phash;
    assert!(hamming(&full, &small) <= 4, "{full} vs {small}");
    for other in ["imageio_coffee.png", "sharp_4.webp", "dlib_horses.jpg"] {
        let h = analyse(&corpus(other)).1.phash;
        assert!(hamming(&full, &h) >= 16, "{other}: {full} vs {h}");
    }
}

#[test]
fn blur_score_is_higher_for_the_sharp_original() {
    let blurred = derived("sharp_4.webp", |i| {
        i.resize(0.125).unwrap().resize(8.0).unwrap()
    });
    let sharp = analyse(&corpus("sharp_4.webp")).1;
    let soft = analyse(&blurred).1;
    assert!(
        sharp.blur_score > 4.0 * soft.blur_score,
        "{} vs {}",
        sharp.blur_score,
        soft.blur_score
    );
    assert!(soft.is_blurry && !sharp.is_blurry);
}

#[test]
fn focal_point_is_inside_the_largest_face() {
    for name in [
        "face_recognition_obama.jpg",
        "imageio_astronaut.png",
        "face_recognition_alex-lacamoire.png",
    ] {
        let v = analyse(&corpus(name)).1;
        let largest = v
            .faces
            .iter()
            .max_by_key(|f| f.width * f.height)
            .expect("a face");
        let p = Rect {
            x: v.focal_point.x,
            y: v.focal_point.y,
            width: 0,
            height: 0,
        };
        assert!(
            inside(&p, largest),
            "{name}: {:?} not in {largest:?}",
            v.focal_point
        );
    }
    // Two faces of similar size: the area-weighted centre lies between them.
    let v = analyse(&corpus("face_recognition_two_people.jpg")).1;
    let centres: Vec<u32> = v.faces.iter().map(|f| f.x + f.width / 2).collect();
    let (lo, hi) = (
        *centres.iter().min().unwrap(),
        *centres.iter().max().unwrap(),
    );
    assert!(
        lo < v.focal_point.x && v.focal_point.x < hi,
        "{:?} between {centres:?}",
        v.focal_point
    );
}

#[test]
fn the_thumbnail_keeps_the_face_of_an_off_centre_portrait() {
    // The portrait at the left of a canvas three times as wide: a centre crop would miss it.
    let wide = derived("face_recognition_obama.jpg", |i| {
        let (w, h) = (i.width(), i.height());
        i.embed(0, 0, w * 3, h).unwrap()
    });
    let (a, v, out) = analyse(&wide);
    assert_eq!((a.width, v.face_count), (910 * 3, 1));
    let face = v.faces[0];
    for t in out.files.iter().filter(|f| f.role == "thumbnail") {
        let crop = t.crop.expect("thumbnails report their crop");
        assert!(inside(&face, &crop), "{face:?} not in {crop:?}");
        assert_eq!((t.width, t.height), (256, 256));
    }
}

#[test]
fn analysis_failure_degrades_instead_of_failing() {
    let dir = tempfile::tempdir().unwrap();
    let bogus = dir.path().join("not-a-cascade.xml");
    std::fs::write(&bogus, "<opencv_storage></opencv_storage>").unwrap();
    let mut s = settings();
    s.analysis.face_cascade = bogus;
    let out = run_with(&s, &corpus("face_recognition_obama.jpg"));
    assert_eq!(out.warnings.len(), 1);
    assert_eq!(out.warnings[0].code.as_str(), "analysis_failed");
    let a = image_analysis(&out);
    assert!(a.vision.is_none());
    assert!(
        out.files.iter().filter(|f| f.role == "variant").count() >= 4,
        "variants still ship"
    );
    assert!(
        out.files.iter().any(|f| f.role == "thumbnail"),
        "centre thumbnail still ships"
    );
}

/// The analysis of a full-resolution decode of `path` (no shrink-on-load, no variant): what
/// the worker's reduced decode is compared with.
fn analyse_full(path: &Path) -> Vision {
    use media_worker::media::{analyze, probe, sniff, transform};
    media::init(1);
    let job = settings().media_job("default", None);
    let sniff::Sniffed::Image(format) = sniff::sniff_file(path).unwrap() else {
        panic!("{}: an image", path.display());
    };
    let probe = probe::run(path, format, &job.limits).unwrap();
    let full = transform::decode(path, format, probe.width, probe.colour).unwrap();
    assert_eq!((full.width(), full.height()), (probe.width, probe.height));
    let a = analyze::run(&probe, &full, &job.analysis).unwrap();
    a.vision.expect("vision")
}

/// The RGB of a `#rrggbb` colour.
fn rgb(hex: &str) -> [i32; 3] {
    let c = |i: usize| i32::from_str_radix(&hex[1 + 2 * i..3 + 2 * i], 16).unwrap();
    [c(0), c(1), c(2)]
}

/// The mean channel difference (of 255) between two BlurHashes decoded at 8 x 6.
fn blurhash_gap(a: &str, b: &str) -> f64 {
    let (a, b) = (
        blurhash::decode(a, 8, 6, 1.0).unwrap(),
        blurhash::decode(b, 8, 6, 1.0).unwrap(),
    );
    let sum: i32 = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (*x as i32 - *y as i32).abs())
        .sum();
    sum as f64 / a.len() as f64
}

/// The worker decodes once, shrunk on load to what its outputs need, and analyses a variant
/// of that decode. On every corpus photo its results are those of a full-resolution decode:
/// the same faces and blur verdict, the focal point within 3 % of the image, BlurHash (2/255
/// on average), dominant colour (8/255) and perceptual hash (4 bits) close.
#[test]
fn analysis_from_the_reduced_decode_matches_a_full_decode() {
    let photos: Vec<String> =
        common::corpus_of_kinds(&["photo", "faces", "color", "orientation", "large"])
            .into_iter()
            // The pixel bombs are refused before any decode (tests/e2e.rs).
            .filter(|f| !f.expected.starts_with("pixel bomb"))
            .map(|f| f.name)
            .collect();
    let mut worst = (0.0f64, 0.0f64, 0i32);
    for name in &photos {
        let (a, reduced, _) = analyse(&corpus(name));
        let full = analyse_full(&corpus(name));
        assert_eq!(
            reduced.face_count, full.face_count,
            "{name}: faces {:?} vs {:?}",
            reduced.faces, full.faces
        );
        let off = |r: u32, f: u32, size: u32| (r as f64 - f as f64).abs() / size as f64;
        let focal = off(reduced.focal_point.x, full.focal_point.x, a.width).max(off(
            reduced.focal_point.y,
            full.focal_point.y,
            a.height,
        ));
        assert!(
            focal <= 0.03,
            "{name}: focal point {focal:.3} of the image apart"
        );
        let hash = blurhash_gap(&reduced.blurhash, &full.blurhash);
        assert!(hash <= 2.0, "{name}: BlurHash {hash:.2}/255 apart");
        let phash = hamming(&reduced.phash, &full.phash);
        assert!(phash <= 4, "{name}: perceptual hashes {phash} bits apart");
        // The Laplacian's variance follows the resampling chain (up to 54 % apart on the corpus:
        // shrink-on-load and a variant, or OpenCV alone); the verdict it gives must not.
        assert_eq!(reduced.is_blurry, full.is_blurry, "{name}: blurry or not");
        let (r, f) = (rgb(&reduced.dominant_color), rgb(&full.dominant_color));
        let colour = (0..3).map(|i| (r[i] - f[i]).abs()).max().unwrap();
        assert!(
            colour <= 8,
            "{name}: dominant colour {} vs {}",
            reduced.dominant_color,
            full.dominant_color
        );
        worst = (worst.0.max(focal), worst.1.max(hash), worst.2.max(colour));
    }
    eprintln!(
        "{} photos: focal points at most {:.1} % apart, BlurHash {}/255, dominant colour {}/255",
        photos.len(),
        worst.0 * 100.0,
        worst.1,
        worst.2
    );
    assert!(photos.len() >= 30, "the corpus has {} photos", photos.len());
}
