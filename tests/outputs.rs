//! What the worker publishes, read back by tools a user would look with: exiftool for metadata,
//! Pillow for colours, libvips for sizes. Every corpus file goes through the same
//! `media::process` the worker runs (images, thumbnails, video renditions and posters).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::corpus;
use media_worker::config::Settings;
use media_worker::contract::{OutputFormat, Warning};
use media_worker::media::vips::Image;
use media_worker::media::{self, Control, MediaOutput, ProducedFile};
use serde_json::Value;

/// Every format, every role: widths, a thumbnail, a small rendition and a poster for videos.
const PUBLIC_PROFILE: &str = r#"
[profiles.public]
analysis = true
widths = [320, 640, 1280, 1920]
formats = [{ format = "webp", quality = 80 }, { format = "jpeg", quality = 82 }, { format = "avif", quality = 50 }]
thumbnail = { width = 256, height = 256 }
renditions = [{ height = 144, crf = 35 }]
"#;

/// [`PUBLIC_PROFILE`] at two widths: a downscale of every source and, for those narrower than
/// 640, one at the source's width. Metadata is written the same way at every width, and the
/// wide AVIFs of the whole corpus would treble the metadata test's time.
const PUBLIC_NARROW_PROFILE: &str = r#"
[profiles.public]
analysis = true
widths = [320, 640]
formats = [{ format = "webp", quality = 80 }, { format = "jpeg", quality = 82 }, { format = "avif", quality = 50 }]
thumbnail = { width = 256, height = 256 }
renditions = [{ height = 144, crf = 35 }]
"#;

fn settings_with(profile_toml: &str) -> (tempfile::TempDir, Settings) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("profile.toml");
    std::fs::write(&path, profile_toml).unwrap();
    let settings = Settings::load_from(Some(&path), Vec::new()).unwrap();
    (dir, settings)
}

/// The outputs of `input` under `out`, or why there are none.
fn process(
    settings: &Settings,
    profile: &str,
    input: &Path,
    out: &Path,
) -> Result<MediaOutput, String> {
    media::init(1);
    std::fs::create_dir_all(out).unwrap();
    let job = settings.media_job(profile, None);
    media::process(&job, input, out, &mut Control::new(&mut |_| {}))
        .map_err(|f| format!("{}: {:?} at {:?}", input.display(), f.error, f.stage))
}

/// Every file of the corpus (MANIFEST.tsv lists them).
fn corpus_files() -> Vec<String> {
    common::corpus_manifest()
        .into_iter()
        .map(|f| f.name)
        .collect()
}

/// A JPEG and a WebP made from a corpus photo by the test, carrying what a phone writes:
/// GPS position, capture time, camera serial, XMP, IPTC and a comment.
fn tagged_uploads(dir: &Path) -> Vec<PathBuf> {
    let mut made = Vec::new();
    for ext in ["jpg", "webp"] {
        let path = dir.join(format!("gps.{ext}"));
        let img = Image::open(&corpus("face_recognition_kit_with_rose.jpg")).unwrap();
        match ext {
            "jpg" => img.save(&path, OutputFormat::Jpeg, 90).unwrap(),
            _ => img.save(&path, OutputFormat::Webp, 90).unwrap(),
        }
        let out = Command::new("exiftool")
            .args([
                "-q",
                "-overwrite_original",
                "-GPSLatitude=48.8584",
                "-GPSLatitudeRef=N",
                "-GPSLongitude=2.2945",
                "-GPSLongitudeRef=E",
                "-DateTimeOriginal=2026:11:01 10:00:00",
                "-SerialNumber=CAM-0042",
                "-Make=TestPhone",
                "-XMP-dc:Creator=Uploader Name",
                "-XMP-exif:GPSLatitude=48.8584",
            ])
            .args(if ext == "jpg" {
                &["-IPTC:Keywords=private", "-Comment=private comment"][..]
            } else {
                &[][..]
            })
            .arg(&path)
            .output()
            .expect("exiftool (scripts/setup.sh --test installs libimage-exiftool-perl)");
        assert!(out.status.success(), "{out:?}");
        let tags = exiftool(std::slice::from_ref(&path)).remove(0);
        assert!(tags.contains_key("GPS:GPSLatitude"), "fixture: {tags:?}");
        assert!(tags.contains_key("XMP-dc:Creator"), "fixture: {tags:?}");
        made.push(path);
    }
    made
}

/// exiftool's view of each file: `Group:Tag` → value (all groups, unknown tags included).
fn exiftool(files: &[PathBuf]) -> Vec<BTreeMap<String, Value>> {
    let out = Command::new("exiftool")
        .args(["-j", "-a", "-u", "-G1", "-b"])
        .args(files)
        .output()
        .expect("exiftool (scripts/setup.sh --test installs libimage-exiftool-perl)");
    let list: Vec<BTreeMap<String, Value>> =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "exiftool JSON: {e}: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    assert_eq!(list.len(), files.len());
    list
}

/// Groups a published file may show: the container and its coding (JFIF, RIFF, QuickTime
/// boxes and tracks, AVIF's item reference), exiftool's own and computed ones.
const ALLOWED_GROUPS: [&str; 11] = [
    "SourceFile",
    "ExifTool",
    "System",
    "File",
    "Composite",
    "JFIF",
    "RIFF",
    "QuickTime",
    "Meta",
    "Track1",
    "Track2",
];

/// What in exiftool's view of one output is the uploader's: any group outside the allowed
/// ones (EXIF IFDs, GPS, XMP, IPTC, ICC, Photoshop, maker notes...), and any tag about a
/// position, a comment, a camera or a person, whatever its group.
fn leaks(tags: &BTreeMap<String, Value>) -> Vec<String> {
    const WORDS: [&str; 9] = [
        "GPS", "Location", "Comment", "Serial", "Make", "Model", "Creator", "Artist", "Author",
    ];
    tags.keys()
        .filter(|k| {
            let group = k.split(':').next().unwrap_or(k);
            let tag = k.rsplit(':').next().unwrap_or(k);
            !ALLOWED_GROUPS.contains(&group) || WORDS.iter().any(|w| tag.contains(w))
        })
        .cloned()
        .collect()
}

/// Item 1: no output of any corpus file (or of uploads tagged by the test) carries EXIF, XMP,
/// IPTC, GPS, comments or an ICC profile, in any format or role.
#[test]
fn public_outputs_carry_none_of_the_uploaders_metadata() {
    let (_cfg, settings) = settings_with(PUBLIC_NARROW_PROFILE);
    let work = tempfile::tempdir().unwrap();
    let mut inputs: Vec<PathBuf> = corpus_files().iter().map(|f| corpus(f)).collect();
    inputs.extend(tagged_uploads(work.path()));
    let mut outputs: Vec<(String, ProducedFile)> = Vec::new();
    let mut sources_with_exif = 0;
    for (i, input) in inputs.iter().enumerate() {
        let name = input.file_name().unwrap().to_string_lossy().into_owned();
        let out = work.path().join(i.to_string());
        let source = exiftool(std::slice::from_ref(input)).remove(0);
        if source.keys().any(|k| k.starts_with("IFD0:")) {
            sources_with_exif += 1;
        }
        // Broken, bomb and unsupported files have no outputs (their codes are tested elsewhere).
        if let Ok(o) = process(&settings, "public", input, &out) {
            outputs.extend(o.files.into_iter().map(|f| (name.clone(), f)));
        }
    }
    assert!(
        sources_with_exif >= 17,
        "{sources_with_exif} sources with EXIF"
    );
    let roles: BTreeMap<&str, usize> = outputs.iter().fold(BTreeMap::new(), |mut m, (_, f)| {
        *m.entry(f.role.as_str()).or_default() += 1;
        m
    });
    for role in ["variant", "thumbnail", "poster", "rendition"] {
        assert!(roles.get(role).is_some_and(|n| *n > 0), "{roles:?}");
    }
    let formats: BTreeMap<&str, usize> = outputs.iter().fold(BTreeMap::new(), |mut m, (_, f)| {
        *m.entry(f.format.name()).or_default() += 1;
        m
    });
    assert_eq!(formats.len(), 4, "webp, jpeg, avif, mp4: {formats:?}");
    let paths: Vec<PathBuf> = outputs.iter().map(|(_, f)| f.path.clone()).collect();
    let mut found = Vec::new();
    for (chunk, files) in paths.chunks(200).zip(outputs.chunks(200)) {
        for (tags, (source, f)) in exiftool(chunk).iter().zip(files) {
            let leaked = leaks(tags);
            if !leaked.is_empty() {
                found.push(format!("{source} → {}: {leaked:?}", f.name));
            }
        }
    }
    assert!(
        found.is_empty(),
        "{} of {} outputs carry metadata:\n{}",
        found.len(),
        outputs.len(),
        found.join("\n")
    );
}

/// The rights fields `keep_metadata = ["copyright"]` keeps, as exiftool names them.
const RIGHTS: [&str; 6] = [
    "IFD0:Copyright",
    "IFD0:Artist",
    "XMP-dc:Rights",
    "XMP-dc:Creator",
    "IPTC:CopyrightNotice",
    "IPTC:By-line",
];

/// Item 3 of the images issue: with `keep_metadata = ["copyright"]` the outputs that can carry
/// them keep exactly the rights fields (JPEG all six, WebP EXIF and XMP; AVIF none), and
/// nothing else of the uploader's: no GPS, dates, camera, keywords or comment.
#[test]
fn only_the_rights_fields_are_kept_when_a_profile_asks() {
    let (_cfg, settings) = settings_with(
        r#"
[profiles.rights]
analysis = false
widths = [320]
formats = [{ format = "webp", quality = 80 }, { format = "jpeg", quality = 82 }, { format = "avif", quality = 50 }]
thumbnail = { width = 128, height = 128 }
keep_metadata = ["copyright"]
"#,
    );
    let work = tempfile::tempdir().unwrap();
    for (i, upload) in tagged_uploads(work.path()).iter().enumerate() {
        let jpeg = upload.extension().is_some_and(|e| e == "jpg");
        let out = Command::new("exiftool")
            .args([
                "-q",
                "-overwrite_original",
                "-Copyright=(c) 2026 Ada Lovelace",
                "-Artist=Ada Lovelace",
                "-XMP-dc:Rights=(c) 2026 Ada Lovelace",
            ])
            .args(if jpeg {
                &["-IPTC:CopyrightNotice=(c) 2026 Ada", "-IPTC:By-line=Ada"][..]
            } else {
                &[][..]
            })
            .arg(upload)
            .output()
            .expect("exiftool");
        assert!(out.status.success(), "{out:?}");
        let o = process(
            &settings,
            "rights",
            upload,
            &work.path().join(i.to_string()),
        )
        .unwrap();
        let paths: Vec<PathBuf> = o.files.iter().map(|f| f.path.clone()).collect();
        assert_eq!(paths.len(), 6, "3 formats x (variant, thumbnail)");
        for (tags, f) in exiftool(&paths).iter().zip(&o.files) {
            let kept: Vec<&str> = RIGHTS
                .into_iter()
                .filter(|k| tags.contains_key(*k))
                .collect();
            let want: &[&str] = match (f.format.name(), jpeg) {
                ("jpeg", true) => &RIGHTS,
                ("jpeg", false) | ("webp", _) => &RIGHTS[..4],
                _ => &[],
            };
            assert_eq!(kept, want, "{} of {}: {tags:?}", f.name, upload.display());
            assert_eq!(
                tags.get("IFD0:Copyright")
                    .map_or("(c) 2026 Ada Lovelace", |v| v.as_str().unwrap()),
                "(c) 2026 Ada Lovelace"
            );
            // The IIM record's version and character set come with it; nothing else.
            let structure = ["IPTC:ApplicationRecordVersion", "IPTC:CodedCharacterSet"];
            let others: Vec<String> = leaks(tags)
                .into_iter()
                .filter(|k| !RIGHTS.contains(&k.as_str()) && !structure.contains(&k.as_str()))
                .collect();
            assert!(
                others.is_empty(),
                "{} of {}: {others:?}",
                f.name,
                upload.display()
            );
        }
    }
}

/// Corpus photos Pillow 9.4 reads (not HEIC/AVIF, nor 16-bit CIELab TIFF), each of a different
/// colour case: untagged sRGB, Adobe RGB, CMYK (SWOP), grey with Gray Gamma 2.2, XYB, 16-bit,
/// alpha, palette, WebP, EXIF orientations.
const COLOUR_PHOTOS: [&str; 16] = [
    "sharp_2569067123_aca715a2ee_o.jpg",
    "rails_racecar.jpg",
    "sharp_Channel_digital_image_CMYK_color.jpg",
    "sharp_concert.jpg",
    "libvips_sample-xyb.jpg",
    "libvips_sample.png",
    "face_recognition_alex-lacamoire.png",
    "sharp_5_webp_a.webp",
    "sharp_bggn4a16.png",
    "sharp_4.webp",
    "imageio_coffee.png",
    "dlib_2008_002470.jpg",
    "pillow_flower.jpg",
    "sharp_Landscape_6.jpg",
    "pillow_hopper_orientation_6.webp",
    "imageio_meadow_cube.jpg",
];

/// Tolerances against the Pillow reference, on the 0-255 scale: the mean of each channel and of
/// the luma within 1.5 (the darkening this guards against was 8), and the mean absolute
/// difference per channel under 8 (lossy coding of small variants measures up to 7.6).
const MEAN_TOLERANCE: f64 = 1.5;
const MAE_LIMIT: f64 = 8.0;

/// Item 2: each variant's colours match a Pillow reference of the same upright pixels
/// (ImageCms to sRGB for tagged sources; untagged ones taken as sRGB).
#[test]
fn variants_keep_the_colours_of_the_source() {
    let settings = Settings::load_from(None, Vec::new()).unwrap();
    let work = tempfile::tempdir().unwrap();
    let mut pairs = Vec::new();
    for (i, name) in COLOUR_PHOTOS.iter().enumerate() {
        let out = work.path().join(i.to_string());
        let o = process(&settings, "variants", &corpus(name), &out).unwrap();
        for f in o.files.iter().filter(|f| f.format.name() != "avif") {
            pairs.push((name, f.name.clone(), f.path.clone()));
        }
    }
    let lines: Vec<String> = pairs
        .iter()
        .map(|(name, _, path)| {
            serde_json::json!({"source": corpus(name), "output": path}).to_string()
        })
        .collect();
    let results = reference("colour.py", &lines);
    let mut off = Vec::new();
    for ((name, file, _), r) in pairs.iter().zip(&results) {
        assert!(r.get("error").is_none(), "{name} {file}: {r}");
        let num = |v: &Value| v.as_f64().unwrap();
        let list = |k: &str| r[k].as_array().unwrap().iter().map(num).collect::<Vec<_>>();
        let (out_mean, ref_mean, mae) = (list("mean_out"), list("mean_ref"), list("mae"));
        let luma = num(&r["luma_out"]) - num(&r["luma_ref"]);
        let worst_mean = (0..3)
            .map(|c| (out_mean[c] - ref_mean[c]).abs())
            .fold(luma.abs(), f64::max);
        let worst_mae = mae.iter().copied().fold(0.0, f64::max);
        if worst_mean > MEAN_TOLERANCE || worst_mae > MAE_LIMIT {
            off.push(format!(
                "{name} {file}: luma {luma:+.2}, channel means {out_mean:.1?} vs {ref_mean:.1?}, \
                 MAE {mae:.1?}"
            ));
        }
    }
    assert!(pairs.len() > 40, "{} variants compared", pairs.len());
    assert!(off.is_empty(), "outside tolerance:\n{}", off.join("\n"));
}

/// A corpus photo on a black canvas of `w` x `h`, as JPEG.
fn canvas(dir: &Path, w: u32, h: u32) -> PathBuf {
    media::vips::init(1);
    let photo = Image::open(&corpus("sharp_2569067123_aca715a2ee_o.jpg")).unwrap();
    let photo = photo.resize(w.min(h) as f64 / 2725.0).unwrap();
    let path = dir.join(format!("canvas-{w}x{h}.jpg"));
    let (x, y) = ((w - photo.width()) / 2, (h - photo.height()) / 3);
    photo
        .embed(x, y, w, h)
        .unwrap()
        .save(&path, OutputFormat::Jpeg, 85)
        .unwrap();
    path
}

fn by_name(o: &MediaOutput) -> BTreeMap<String, &ProducedFile> {
    o.files.iter().map(|f| (f.name.clone(), f)).collect()
}

/// Read back with libvips: the size the file really has.
fn read_size(f: &ProducedFile) -> (u32, u32) {
    let img = Image::open(&f.path).unwrap_or_else(|e| panic!("{}: {e}", f.name));
    (img.width(), img.height())
}

fn codes(w: &[Warning]) -> Vec<(&str, &str)> {
    w.iter()
        .map(|w| (w.code.as_str(), w.message.as_str()))
        .collect()
}

/// Item 3: a 1080 x 20000 screenshot and a 20000 x 1080 panorama get every variant each format
/// can hold; what a format cannot hold is refitted within its limit, with a warning.
#[test]
fn tall_and_wide_images_get_every_variant_each_format_can_hold() {
    let (_cfg, settings) = settings_with(PUBLIC_PROFILE);
    let work = tempfile::tempdir().unwrap();

    let tall = canvas(work.path(), 1080, 20000);
    let o = process(&settings, "public", &tall, &work.path().join("tall")).unwrap();
    let files = by_name(&o);
    let mut names: Vec<&str> = files.keys().map(String::as_str).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "1080w.jpg",
            "320w.avif",
            "320w.jpg",
            "320w.webp",
            "640w.avif",
            "640w.jpg",
            "640w.webp",
            "884w.avif",
            "884w.webp",
            "thumb_256x256.avif",
            "thumb_256x256.jpg",
            "thumb_256x256.webp",
        ]
    );
    for f in files.values() {
        assert_eq!(read_size(f), (f.width, f.height), "{}", f.name);
    }
    assert_eq!(read_size(files["1080w.jpg"]), (1080, 20000));
    assert_eq!(read_size(files["640w.webp"]), (640, 11852));
    for name in ["884w.webp", "884w.avif"] {
        let (w, h) = read_size(files[name]);
        assert!(
            w == 884 && (16_360..=16_383).contains(&h),
            "{name}: {w}x{h}"
        );
    }
    assert_eq!(read_size(files["thumb_256x256.webp"]), (256, 256));
    let warnings = codes(&o.warnings);
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    for (code, message) in &warnings {
        assert_eq!(*code, "variant_refitted");
        assert!(message.starts_with("1080w."), "{message}");
        assert!(message.contains("as 884w."), "{message}");
    }
    let a = o
        .analysis
        .as_ref()
        .and_then(|a| a.image())
        .expect("analysis");
    let v = a.vision.as_ref().expect("vision on a tall image");
    assert!(v.focal_point.x < 1080 && v.focal_point.y < 20000, "{v:?}");
    let crop = files["thumb_256x256.jpg"].crop.expect("crop");
    assert!(crop.x + crop.width <= 1080 && crop.y + crop.height <= 20000);

    let wide = canvas(work.path(), 20000, 1080);
    let o = process(&settings, "public", &wide, &work.path().join("wide")).unwrap();
    assert!(o.warnings.is_empty(), "{:?}", o.warnings);
    let files = by_name(&o);
    for w in [320, 640, 1280, 1920] {
        for ext in ["webp", "jpg", "avif"] {
            let f = files[&format!("{w}w.{ext}")];
            let h = (w as f64 * 1080.0 / 20000.0).round() as u32;
            assert_eq!(read_size(f), (w, h), "{}", f.name);
        }
    }
    let thumb = files["thumb_256x256.webp"];
    assert_eq!(read_size(thumb), (256, 256));
    let crop = thumb.crop.expect("crop");
    assert!(
        crop.x + crop.width <= 20000 && crop.height <= 1080,
        "{crop:?}"
    );
}

/// Pillow's reading of each file (tests/reference/frames.py): format, size, frames, each
/// frame's duration and the loop field; with a reference, how far the frames are from its.
fn read_frames(files: &[(&Path, Option<&Path>)]) -> Vec<Value> {
    let lines: Vec<String> = files
        .iter()
        .map(|(f, reference)| match reference {
            Some(r) => format!("{}\t{}", f.display(), r.display()),
            None => f.display().to_string(),
        })
        .collect();
    let read = reference("frames.py", &lines);
    for r in &read {
        assert!(r.get("error").is_none(), "{r}");
    }
    read
}

/// The JSON line each of `lines` gets from tests/reference/`script` (Pillow).
fn reference(script: &str, lines: &[String]) -> Vec<Value> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/reference")
        .join(script);
    let out = common::lines::pipe(
        Command::new("/usr/bin/python3").arg(script),
        lines.to_vec(),
        "Debian's python3 with python3-pil (scripts/setup.sh --test)",
    );
    assert!(out.status.success(), "{out:?}");
    let results = common::lines::json_lines(&out);
    assert_eq!(results.len(), lines.len());
    results
}

/// A GIF of six 64 x 48 frames, three of them shown for 0 ms, that plays three times (a
/// NETSCAPE repeat count of 2).
fn gif_with_zero_delays(dir: &Path) -> PathBuf {
    let path = dir.join("zero-delays.gif");
    let script = format!(
        "from PIL import Image\n\
         f = [Image.new('RGB', (64, 48), (i * 40, 255 - i * 40, i * 90 % 256)) for i in range(6)]\n\
         f[0].save('{}', save_all=True, append_images=f[1:], duration=[100, 0, 0, 50, 0, 200], \
         loop=2, disposal=1)\n",
        path.display()
    );
    let out = Command::new("/usr/bin/python3")
        .args(["-c", &script])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    path
}

const ANIMATION_PROFILE: &str = r#"
[profiles.anim]
analysis = true
widths = [64, 320, 640]
formats = [{ format = "webp", quality = 80 }, { format = "jpeg", quality = 82 }]
thumbnail = { width = 48, height = 48 }
animation_mp4 = true
renditions = [{ height = 720, crf = 23 }, { height = 240, crf = 26 }]
"#;

/// Animated GIFs and WebPs keep their animation in their WebP variants: Pillow reads back the
/// source's frame count, each frame's delay (zero-duration frames included) and how many
/// times it plays; the JPEG variants and the thumbnail are stills of the first frame.
#[test]
fn animations_keep_every_frame_delay_and_loop_in_webp_variants() {
    let (_cfg, settings) = settings_with(ANIMATION_PROFILE);
    let work = tempfile::tempdir().unwrap();
    let sources = [
        corpus("sharp_rotating-squares.gif"),
        corpus("dlib_elon-musk-smoke.gif"),
        corpus("sharp_animated-loop-3.webp"),
        gif_with_zero_delays(work.path()),
    ];
    let source_reads = read_frames(
        &sources
            .iter()
            .map(|p| (p.as_path(), None))
            .collect::<Vec<_>>(),
    );
    for (i, (source, src)) in sources.iter().zip(&source_reads).enumerate() {
        let name = source.file_name().unwrap().to_string_lossy().into_owned();
        let out = work.path().join(i.to_string());
        let o = process(&settings, "anim", source, &out).unwrap();
        let webps: Vec<&ProducedFile> = o
            .files
            .iter()
            .filter(|f| f.role == "variant" && f.format.name() == "webp")
            .collect();
        let stills: Vec<&ProducedFile> = o
            .files
            .iter()
            .filter(|f| f.format.name() == "jpeg")
            .collect();
        assert!(!webps.is_empty() && !stills.is_empty(), "{name}: {o:?}");
        let gif = src["format"] == "GIF";
        // A GIF's NETSCAPE count is how many times it repeats; WebP's how many times it plays.
        let plays = match src["loop"].as_u64().unwrap_or(1) {
            0 => 0,
            n if gif => n + 1,
            n => n,
        };
        let durations = src["durations"].as_array().unwrap();
        let total: u64 = durations.iter().map(|d| d.as_u64().unwrap()).sum();
        let with_source: Vec<(&Path, Option<&Path>)> = webps
            .iter()
            .map(|f| (f.path.as_path(), Some(source.as_path())))
            .collect();
        let reads = read_frames(&with_source);
        for (f, r) in webps.iter().zip(&reads) {
            let at = format!("{name} {}", f.name);
            assert_eq!(r["format"], "WEBP", "{at}");
            assert_eq!(r["frames"], src["frames"], "{at}: frames");
            assert_eq!(&r["durations"], &src["durations"], "{at}: delays");
            assert_eq!(r["loop"].as_u64(), Some(plays), "{at}: loop");
            assert_eq!(r["size"], serde_json::json!([f.width, f.height]), "{at}");
            assert_eq!(f.frames, src["frames"].as_u64().map(|n| n as u32), "{at}");
            assert_eq!(f.duration_ms, Some(total), "{at}");
            // Every frame shows its own picture (each holds only what changed).
            let mae = r["worst_mae"].as_f64().unwrap();
            assert!(mae < 6.0, "{at}: a frame is {mae:.2} from the source's");
        }
        let reads = read_frames(
            &stills
                .iter()
                .map(|f| (f.path.as_path(), None))
                .collect::<Vec<_>>(),
        );
        for (f, r) in stills.iter().zip(&reads) {
            assert_eq!(
                (r["format"].as_str(), r["frames"].as_u64()),
                (Some("JPEG"), Some(1))
            );
            assert_eq!(r["size"], serde_json::json!([f.width, f.height]), "{name}");
            assert_eq!((f.frames, f.duration_ms), (None, None), "{name}");
        }
        // The variants of the planned widths up to the source's, in both formats.
        let w = src["size"][0].as_u64().unwrap() as u32;
        let widths = |v: &[&ProducedFile]| v.iter().map(|f| f.width).collect::<Vec<_>>();
        let planned: Vec<u32> = [64, 320, 640]
            .into_iter()
            .filter(|p| *p < w)
            .chain([w])
            .collect();
        assert_eq!(widths(&webps), planned, "{name}");
        assert_eq!(widths(&stills[..stills.len() - 1]), planned, "{name}");
    }
    // The zero-delay GIF: three frames of 0 ms, played three times.
    assert_eq!(
        source_reads[3]["durations"],
        serde_json::json!([100, 0, 0, 50, 0, 200])
    );
}

/// With `animation_mp4`, an animated GIF also becomes a playable H.264 MP4 at its own size
/// (smaller than every rung of the ladder), a fraction of the GIF's bytes: ffprobe reads its
/// stream and ffmpeg decodes every frame without an error. A GIF the video limits refuse
/// keeps its image outputs.
#[test]
fn animated_gifs_can_also_be_h264_mp4() {
    let (_cfg, settings) = settings_with(ANIMATION_PROFILE);
    let work = tempfile::tempdir().unwrap();
    let gif = corpus("dlib_elon-musk-smoke.gif");
    let o = process(&settings, "anim", &gif, work.path()).unwrap();
    let mp4: Vec<&ProducedFile> = o.files.iter().filter(|f| f.role == "rendition").collect();
    assert_eq!(mp4.len(), 1, "{o:?}");
    let f = mp4[0];
    assert_eq!(
        (f.name.as_str(), f.width, f.height),
        ("mp4/240p.mp4", 424, 240)
    );
    let gif_bytes = std::fs::metadata(&gif).unwrap().len();
    assert!(
        f.size_bytes * 5 < gif_bytes,
        "{} of {gif_bytes} bytes",
        f.size_bytes
    );
    let probe = Command::new("ffprobe")
        .args(["-v", "error", "-count_frames", "-select_streams", "v:0"])
        .args([
            "-show_entries",
            "stream=codec_name,profile,pix_fmt,width,height,nb_read_frames",
        ])
        .args(["-of", "json"])
        .arg(&f.path)
        .output()
        .unwrap();
    assert!(probe.status.success(), "{probe:?}");
    let v: Value = serde_json::from_slice(&probe.stdout).unwrap();
    let s = &v["streams"][0];
    assert_eq!(s["codec_name"], "h264", "{v}");
    assert_eq!(s["pix_fmt"], "yuv420p", "{v}");
    assert_eq!(
        (s["width"].as_u64(), s["height"].as_u64()),
        (Some(424), Some(240))
    );
    assert_eq!(s["nb_read_frames"], "35", "every frame of the GIF: {v}");
    let decode = Command::new("ffmpeg")
        .args(["-v", "error", "-xerror", "-i"])
        .arg(&f.path)
        .args(["-f", "null", "-"])
        .output()
        .unwrap();
    assert!(
        decode.status.success() && decode.stderr.is_empty(),
        "{decode:?}"
    );
    // A GIF over the video limits keeps its image outputs, with a warning instead of the MP4.
    let (_cfg, short) = settings_with(&format!(
        "{ANIMATION_PROFILE}\n[limits]\nmax_video_seconds = 1\n"
    ));
    let o = process(&short, "anim", &gif, &work.path().join("short")).unwrap();
    assert!(o.files.iter().all(|f| f.role != "rendition"), "{o:?}");
    assert!(o.files.iter().any(|f| f.frames == Some(35)), "{o:?}");
    assert_eq!(
        codes(&o.warnings),
        [(
            "animation_mp4_failed",
            "limits exceeded: 1.8 s long, over the 1 s limit"
        )]
    );
    // Without the option, no rendition.
    let (_cfg, plain) = settings_with(&ANIMATION_PROFILE.replace("animation_mp4 = true", ""));
    let o = process(&plain, "anim", &gif, &work.path().join("plain")).unwrap();
    assert!(o.files.iter().all(|f| f.role != "rendition"), "{o:?}");
}

/// A GIF with more frames than `limits.max_frames` fails `limits_exceeded`, and one cut off
/// in the middle of a frame fails as corrupt (libvips alone would ship its whole frames as a
/// shorter animation), both before any frame is decoded.
#[test]
fn gifs_over_the_frame_limit_or_cut_off_fail_before_decoding() {
    let (_cfg, settings) =
        settings_with(&format!("{ANIMATION_PROFILE}\n[limits]\nmax_frames = 29\n"));
    let work = tempfile::tempdir().unwrap();
    media::init(1);
    let job = settings.media_job("anim", None);
    let run = |input: &Path| {
        let out = work.path().join("out").join(input.file_name().unwrap());
        std::fs::create_dir_all(&out).unwrap();
        let failure =
            media::process(&job, input, &out, &mut Control::new(&mut |_| {})).expect_err("fails");
        assert_eq!(
            failure.stage,
            media_worker::contract::Stage::Probe,
            "{failure:?}"
        );
        assert!(std::fs::read_dir(&out).unwrap().next().is_none());
        failure.error
    };
    let error = run(&corpus("sharp_rotating-squares.gif"));
    assert!(
        matches!(&error, media::MediaError::LimitsExceeded(m) if m == "30 frames, over the 29 limit"),
        "{error:?}"
    );
    let gif = std::fs::read(corpus("dlib_elon-musk-smoke.gif")).unwrap();
    let cut = work.path().join("cut.gif");
    std::fs::write(&cut, &gif[..gif.len() / 2]).unwrap();
    let error = run(&cut);
    assert!(
        matches!(&error, media::MediaError::Corrupt(m) if m == "the GIF is cut off after 17 whole frames"),
        "{error:?}"
    );
}
