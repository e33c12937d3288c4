//! Bytes at equal quality, against sharp (`make bench-quality`):
//!
//!   cargo bench --bench quality -- --sharp DIR --dssim PATH [--fixed variants] [--auto picture]
//!                                  [--rounds 3] [--formats avif,webp,jpeg] [--avif-target SCORE]
//!   cargo bench --bench quality -- --sharp DIR --dssim PATH --ceiling webp|jpeg|avif
//!                                  [--qualities 50,56,..] [--metric ssimulacra2|ssim]
//!
//! For each corpus photo, the variants of a fixed-quality profile and of an auto-quality one as
//! the worker makes them (`media::process`, one format at a time, so that CPU is per format,
//! the auto search included) and as sharp makes them at the fixed profile's qualities
//! (benches/quality/sharp.mjs, npm `sharp` installed in DIR by the Makefile, at the widths the
//! worker made). Every output is scored against a Pillow downscale of the upright sRGB source
//! (benches/quality/score.py) with dssim, given as SSIM = 1 / (1 + dssim), and with SSIMULACRA2
//! by an implementation written apart from the worker's fast-ssim2 (`ssimu2-lite`). sharp's JPEG
//! is made twice: at its default and with `mozjpeg: true`. Prints, per format and tool: total
//! bytes, mean and worst scores, CPU per photo (the least of `--rounds` runs); then issue 57's
//! goals, each at an equal or better mean SSIMULACRA2 than sharp's and a worst no worse: auto
//! JPEG at most 0.80x sharp's default bytes, auto WebP at most 0.90x; with AVIF in the auto
//! profile, sharp's AVIF at its defaults (the fixed worker's at the same quality): auto AVIF at
//! most sharp's bytes for at most its CPU, and the profile's CPU per photo at most 1.3x sharp's
//! making the same formats and widths at fixed quality.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use media_worker::config::Settings;
use media_worker::contract::OutputFormat;
use media_worker::media::settings::FormatSpec;
use media_worker::media::{self, Control};
use serde_json::{Value, json};

#[path = "quality/ceiling.rs"]
mod ceiling;
#[path = "../tests/common/lines.rs"]
mod lines;
mod util;
use util::{arg, corpus_photos};

/// sharp's default AVIF quality (`avif()` without options).
const SHARP_AVIF_QUALITY: u8 = 50;
/// The report's name for sharp's JPEG with `mozjpeg: true`.
const SHARP_MOZJPEG: &str = "sharp mozjpeg";

/// One variant, made by one tool.
#[derive(Debug, Clone)]
struct Made {
    photo: String,
    format: String,
    width: u32,
    path: PathBuf,
    bytes: u64,
    /// dssim (0 = identical) and SSIMULACRA2 (100 = identical, ssimu2-lite's) against the
    /// reference.
    dssim: f64,
    ssimulacra2: f64,
}

/// What one tool made of the corpus: its variants and CPU milliseconds per photo and format.
#[derive(Default)]
struct Tool {
    made: Vec<Made>,
    cpu_ms: BTreeMap<String, Vec<(String, f64)>>,
}

fn cpu_ms() -> f64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the struct.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 * 1e3 + tv.tv_usec as f64 / 1e3;
    t(ru.ru_utime) + t(ru.ru_stime)
}

fn main() {
    let sharp_dir = PathBuf::from(arg("--sharp", ""));
    let dssim = PathBuf::from(arg("--dssim", "dssim"));
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (fixed, auto) = (arg("--fixed", "variants"), arg("--auto", "picture"));
    let rounds: usize = arg("--rounds", "3").parse().expect("--rounds N");
    assert!(
        sharp_dir.join("node_modules/sharp").is_dir(),
        "--sharp DIR with node_modules/sharp (make bench-quality installs it)"
    );
    let corpus = root.join("../shared/corpus");
    let settings = Settings::load_from(None, Vec::new()).expect("settings");
    media::init(1);
    if let Some(format) = std::env::args().skip_while(|a| a != "--ceiling").nth(1) {
        return ceiling(&settings, root, &sharp_dir, &dssim, &format);
    }
    let work = tempfile::tempdir().unwrap();
    let photos = corpus_photos(&corpus);

    let mut fixed_job = settings.media_job(&fixed, None);
    let mut auto_job = settings.media_job(&auto, None);
    // `--formats avif,webp`: only those formats of both profiles.
    let only = arg("--formats", "");
    if !only.is_empty() {
        for job in [&mut fixed_job, &mut auto_job] {
            job.profile
                .formats
                .retain(|f| only.split(',').any(|n| n == f.format.name()));
        }
    }
    // `--avif-target SCORE`: the auto profile's AVIF at another target, for the AVIF goal's
    // equal mean (sharp's AVIF default scores under "high").
    if let Ok(target) = arg("--avif-target", "").parse::<f64>() {
        for f in &mut auto_job.profile.formats {
            if f.format == OutputFormat::Avif {
                f.target = Some(media::settings::Target::Score(target));
            }
        }
    }
    // An auto profile with AVIF is compared with sharp's AVIF at sharp's defaults (quality 50,
    // effort 4, 4:4:4), the fixed worker's beside it at the same quality.
    let avif = |job: &media::MediaJob| {
        job.profile
            .formats
            .iter()
            .any(|f| f.format == OutputFormat::Avif)
    };
    if avif(&auto_job) && !avif(&fixed_job) {
        let sharp_default = FormatSpec::fixed(OutputFormat::Avif, SHARP_AVIF_QUALITY);
        fixed_job.profile.formats.insert(0, sharp_default);
    }
    let run = |job, dir| worker(job, &corpus, &photos, &work.path().join(dir), rounds);
    let (fixed_tool, auto_tool) = (run(&fixed_job, "fixed"), run(&auto_job, "auto"));
    let sharp_jobs = sharp_jobs(&corpus, &photos, &fixed_tool.made, &fixed_job);
    // sharp's outputs are the same every round; its CPU per photo and format is the least.
    // Only its first tool names the photos sharp fails (the same ones for every tool).
    let sharp_tool = |jobs: &[Value], dir: &str, report: bool| {
        let dir = work.path().join(dir);
        let mut tool = run_sharp(root, &sharp_dir, &dir, jobs, report);
        for _ in 1..rounds {
            let again = run_sharp(root, &sharp_dir, &dir, jobs, false);
            for (format, per_photo) in &mut tool.cpu_ms {
                for ((_, ms), (_, ms2)) in per_photo.iter_mut().zip(&again.cpu_ms[format]) {
                    *ms = ms.min(*ms2);
                }
            }
        }
        tool
    };
    let sharp = sharp_tool(&sharp_jobs, "sharp", true);
    let mozjpeg_jobs = with_mozjpeg(&sharp_jobs);
    let fixed_name = format!("worker {fixed}");
    let auto_name = format!("worker {auto}");
    let mut tools = vec![
        (fixed_name.as_str(), fixed_tool),
        (auto_name.as_str(), auto_tool),
        ("sharp", sharp),
    ];
    if !mozjpeg_jobs.is_empty() {
        tools.push((
            SHARP_MOZJPEG,
            sharp_tool(&mozjpeg_jobs, "sharp-mozjpeg", false),
        ));
    }
    // Only photos every tool made count.
    let every: Vec<String> = photos
        .iter()
        .filter(|p| {
            tools
                .iter()
                .all(|(_, t)| t.made.iter().any(|m| &m.photo == *p))
        })
        .cloned()
        .collect();
    for (_, tool) in &mut tools {
        tool.made.retain(|m| every.contains(&m.photo));
        score(root, &dssim, work.path(), &mut tool.made);
    }
    // Sources Pillow cannot read (HEIF, AVIF, CIELab TIFF) have no reference.
    let unscored: std::collections::BTreeSet<String> = tools
        .iter()
        .flat_map(|(_, t)| t.made.iter().filter(|m| m.dssim.is_nan()))
        .map(|m| m.photo.clone())
        .collect();
    for photo in &unscored {
        println!("skipped {photo}: no reference (Pillow cannot read it)");
    }
    for (_, tool) in &mut tools {
        tool.made.retain(|m| !unscored.contains(&m.photo));
        // CPU of the photos scored only.
        let photos: Vec<String> = tool.made.iter().map(|m| m.photo.clone()).collect();
        for per_photo in tool.cpu_ms.values_mut() {
            per_photo.retain(|(p, _)| photos.contains(p));
        }
    }
    report(&tools);
}

/// sharp's jobs: for each photo, the widths the worker made (`made`), at `job`'s qualities.
fn sharp_jobs(
    corpus: &Path,
    photos: &[String],
    made: &[Made],
    job: &media::MediaJob,
) -> Vec<Value> {
    let formats: Vec<Value> = job
        .profile
        .formats
        .iter()
        .map(|f| json!({"format": f.format.name(), "quality": f.quality}))
        .collect();
    photos
        .iter()
        .filter_map(|photo| {
            let mut widths: Vec<u32> =
                made.iter().filter(|m| &m.photo == photo).map(|m| m.width).collect();
            widths.sort_unstable();
            widths.dedup();
            (!widths.is_empty()).then(|| {
                json!({"source": corpus.join(photo), "name": photo, "widths": widths, "formats": formats})
            })
        })
        .collect()
}

/// sharp's JPEG jobs of `jobs` again, with `mozjpeg: true` (trellis quantisation, optimised
/// progressive scans) at the same quality.
fn with_mozjpeg(jobs: &[Value]) -> Vec<Value> {
    jobs.iter()
        .filter_map(|job| {
            let formats: Vec<Value> = job["formats"]
                .as_array()?
                .iter()
                .filter(|f| f["format"] == "jpeg")
                .map(|f| json!({"format": "jpeg", "quality": f["quality"], "mozjpeg": true}))
                .collect();
            let mut job = job.clone();
            job["formats"] = json!(formats);
            (!formats.is_empty()).then_some(job)
        })
        .collect()
}

/// The qualities `--ceiling` makes every variant at: finer where sharp's q80 and q82 sit.
const QUALITIES: &str = "50,56,60,63,66,68,70,72,74,76,77,78,79,80,81,82,84,86,88,90,92";

/// `--ceiling FORMAT` (see `ceiling`): the fixed profile's variants of FORMAT at each of
/// `--qualities`, scored, against sharp's at the profile's quality.
fn ceiling(settings: &Settings, root: &Path, sharp_dir: &Path, dssim: &Path, format: &str) {
    let corpus = root.join("../shared/corpus");
    let photos = corpus_photos(&corpus);
    let work = tempfile::tempdir().unwrap();
    let mut job = settings.media_job(&arg("--fixed", "variants"), None);
    // AVIF, in no fixed profile, at sharp's default quality (what sharp is compared at).
    if format == "avif"
        && !job
            .profile
            .formats
            .iter()
            .any(|f| f.format == OutputFormat::Avif)
    {
        let sharp_default = FormatSpec::fixed(OutputFormat::Avif, SHARP_AVIF_QUALITY);
        job.profile.formats.insert(0, sharp_default);
    }
    job.profile.formats.retain(|f| f.format.name() == format);
    assert!(
        !job.profile.formats.is_empty(),
        "--ceiling: a format of the fixed profile, or avif"
    );
    // Ascending: the rules step from one quality to the next.
    let mut qualities: Vec<u8> = arg("--qualities", QUALITIES)
        .split(',')
        .map(|q| q.parse().expect("--qualities Q,Q,..."))
        .collect();
    qualities.sort_unstable();
    qualities.dedup();
    let mut outputs: BTreeMap<(String, u32), Vec<ceiling::Point>> = BTreeMap::new();
    let mut made = Vec::new();
    for q in &qualities {
        let mut one = job.clone();
        one.profile.formats[0].quality = media::settings::Quality::Fixed(*q);
        let mut tool = worker(
            &one,
            &corpus,
            &photos,
            &work.path().join(format!("q{q}")),
            1,
        );
        score(root, dssim, work.path(), &mut tool.made);
        for m in tool.made.iter().filter(|m| !m.dssim.is_nan()) {
            outputs
                .entry((m.photo.clone(), m.width))
                .or_default()
                .push(point(m));
        }
        made = tool.made;
    }
    let mut sharp = run_sharp(
        root,
        sharp_dir,
        &work.path().join("sharp"),
        &sharp_jobs(&corpus, &photos, &made, &job),
        true,
    );
    score(root, dssim, work.path(), &mut sharp.made);
    let sharp: BTreeMap<(String, u32), ceiling::Point> = sharp
        .made
        .iter()
        .filter(|m| !m.dssim.is_nan())
        .map(|m| ((m.photo.clone(), m.width), point(m)))
        .collect();
    // Only outputs scored at every quality, and made by sharp too.
    outputs.retain(|k, p| p.len() == qualities.len() && sharp.contains_key(k));
    let metric = ceiling::Metric::parse(&arg("--metric", "ssimulacra2"));
    let (bytes, mean, worst) = ceiling::totals(metric, outputs.keys().map(|k| sharp[k]));
    let sharp = ceiling::Sharp { bytes, mean, worst };
    ceiling::Grid {
        qualities,
        outputs,
        metric,
    }
    .report(format, sharp);
}

fn point(m: &Made) -> ceiling::Point {
    ceiling::Point {
        bytes: m.bytes,
        ssim: ssim(m.dssim),
        ssimulacra2: m.ssimulacra2,
    }
}

/// SSIM as the report gives it, from dssim.
fn ssim(dssim: f64) -> f64 {
    1.0 / (1.0 + dssim)
}

/// The variants `job` makes of each photo, one format at a time (the least CPU of `rounds`).
fn worker(
    job: &media::MediaJob,
    corpus: &Path,
    photos: &[String],
    dir: &Path,
    rounds: usize,
) -> Tool {
    let mut tool = Tool::default();
    for photo in photos {
        let source = corpus.join(photo);
        for spec in &job.profile.formats {
            let mut one = job.clone();
            one.profile.formats = vec![*spec];
            one.profile.thumbnail = None;
            let out = dir.join(photo).join(spec.format.name());
            // The least CPU of `rounds` runs: the work, without what else the machine did.
            let mut cpu = f64::INFINITY;
            let mut result = None;
            for _ in 0..rounds {
                let _ = std::fs::remove_dir_all(&out);
                std::fs::create_dir_all(&out).unwrap();
                let start = cpu_ms();
                result = Some(media::process(
                    &one,
                    &source,
                    &out,
                    &mut Control::new(&mut |_| {}),
                ));
                cpu = cpu.min(cpu_ms() - start);
            }
            let Ok(o) = result.expect("a round") else {
                println!("skipped {photo}: the worker fails it");
                break;
            };
            for f in o.files.iter().filter(|f| f.role == "variant") {
                tool.made.push(Made {
                    photo: photo.clone(),
                    format: spec.format.name().to_owned(),
                    width: f.width,
                    path: f.path.clone(),
                    bytes: f.size_bytes,
                    dssim: f64::NAN,
                    ssimulacra2: f64::NAN,
                });
            }
            tool.cpu_ms
                .entry(spec.format.name().to_owned())
                .or_default()
                .push((photo.clone(), cpu));
        }
    }
    tool
}

/// sharp's outputs of `jobs`, through benches/quality/sharp.mjs (naming, when `report`, the
/// photos sharp fails).
fn run_sharp(root: &Path, sharp_dir: &Path, out: &Path, jobs: &[Value], report: bool) -> Tool {
    let sharp = lines::pipe(
        Command::new("node")
            .arg(root.join("benches/quality/sharp.mjs"))
            .arg(sharp_dir.join("node_modules/sharp"))
            .arg(out),
        jobs.to_vec(),
        "node",
    );
    assert!(sharp.status.success(), "sharp.mjs failed");
    let mut tool = Tool::default();
    for v in lines::json_lines(&sharp) {
        let photo = v["name"].as_str().unwrap().to_owned();
        if let Some(e) = v.get("error") {
            if report {
                println!("skipped {photo}: sharp fails it ({e})");
            }
            continue;
        }
        for o in v["outputs"].as_array().unwrap() {
            tool.made.push(Made {
                photo: photo.clone(),
                format: o["format"].as_str().unwrap().to_owned(),
                width: o["width"].as_u64().unwrap() as u32,
                path: PathBuf::from(o["path"].as_str().unwrap()),
                bytes: o["bytes"].as_u64().unwrap(),
                dssim: f64::NAN,
                ssimulacra2: f64::NAN,
            });
        }
        for (format, ms) in v["cpu_ms"].as_object().unwrap() {
            let ms = ms.as_f64().unwrap();
            tool.cpu_ms
                .entry(format.clone())
                .or_default()
                .push((photo.clone(), ms));
        }
    }
    tool
}

/// Scores each output with dssim against its reference downscale (made by score.py).
fn score(root: &Path, dssim: &Path, work: &Path, made: &mut [Made]) {
    let pngs = work.join("png");
    std::fs::create_dir_all(&pngs).unwrap();
    let corpus = root.join("../shared/corpus");
    let pairs: Vec<(PathBuf, PathBuf)> = (0..made.len())
        .map(|i| {
            (
                pngs.join(format!("{i}-ref.png")),
                pngs.join(format!("{i}-out.png")),
            )
        })
        .collect();
    let jobs: Vec<String> = made
        .iter()
        .zip(&pairs)
        .map(|(m, (r, o))| {
            let source = corpus.join(&m.photo);
            // Pillow 9.4 reads no AVIF: libavif's avifdec decodes it first.
            let output = if m.format == "avif" {
                let png = o.with_extension("avifdec.png");
                let run = Command::new("avifdec").arg(&m.path).arg(&png).output();
                assert!(
                    run.is_ok_and(|r| r.status.success()),
                    "avifdec {}",
                    m.path.display()
                );
                png
            } else {
                m.path.clone()
            };
            json!({"source": source, "output": output, "ref": r, "out": o}).to_string()
        })
        .collect();
    let scored = lines::pipe(
        Command::new("/usr/bin/python3").arg(root.join("benches/quality/score.py")),
        jobs,
        "python3 with Pillow",
    );
    assert!(scored.status.success());
    let results = lines::json_lines(&scored);
    for ((m, (r, o)), v) in made.iter_mut().zip(&pairs).zip(&results) {
        if v.get("error").is_some() {
            continue;
        }
        let out = Command::new(dssim).arg(r).arg(o).output().expect("dssim");
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        m.dssim = text
            .split_whitespace()
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("dssim said {text}"));
        let ((a, w, h), (b, w2, h2)) = (rgb8(r), rgb8(o));
        assert_eq!((w, h), (w2, h2), "{}", m.path.display());
        m.ssimulacra2 = ssimu2_lite::compare(
            ssimu2_lite::RgbImage::srgb8(&a, w, h, w * 3).expect("reference"),
            ssimu2_lite::RgbImage::srgb8(&b, w, h, w * 3).expect("output"),
        )
        .expect("SSIMULACRA2");
        let _ = (std::fs::remove_file(r), std::fs::remove_file(o));
    }
}

/// The interleaved 8-bit RGB pixels of one of score.py's PNGs, with its width and height.
fn rgb8(path: &Path) -> (Vec<u8>, usize, usize) {
    let img = media::vips::Image::open(path)
        .and_then(|i| i.to_srgb8())
        .and_then(|i| i.into_memory())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(img.bands(), 3, "{}: score.py writes RGB", path.display());
    let (w, h) = (img.width() as usize, img.height() as usize);
    (img.pixels().expect("pixels").to_vec(), w, h)
}

fn report(tools: &[(&str, Tool)]) {
    println!(
        "\n| format | tool | photos | outputs | total bytes | mean SSIM | worst SSIM (output) | \
         mean SSIMULACRA2 | worst SSIMULACRA2 | CPU ms / photo |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    // Per (format, tool): bytes, mean SSIM, worst SSIM, CPU.
    let mut sums = BTreeMap::new();
    for format in ["avif", "webp", "jpeg"] {
        for (name, tool) in tools {
            let made: Vec<&Made> = tool.made.iter().filter(|m| m.format == format).collect();
            if made.is_empty() {
                continue;
            }
            let photos: std::collections::BTreeSet<&str> =
                made.iter().map(|m| m.photo.as_str()).collect();
            let bytes: u64 = made.iter().map(|m| m.bytes).sum();
            let n = made.len() as f64;
            let mean = made.iter().map(|m| ssim(m.dssim)).sum::<f64>() / n;
            let worst = made
                .iter()
                .max_by(|a, b| a.dssim.total_cmp(&b.dssim))
                .expect("outputs");
            let mean2 = made.iter().map(|m| m.ssimulacra2).sum::<f64>() / n;
            let worst2 = made
                .iter()
                .map(|m| m.ssimulacra2)
                .fold(f64::INFINITY, f64::min);
            let cpu = &tool.cpu_ms[format];
            let cpu = cpu.iter().map(|(_, ms)| ms).sum::<f64>() / cpu.len() as f64;
            println!(
                "| {format} | {name} | {} | {} | {bytes} | {mean:.4} | {:.4} ({} {}w) | \
                 {mean2:.1} | {worst2:.1} | {cpu:.1} |",
                photos.len(),
                made.len(),
                ssim(worst.dssim),
                worst.photo,
                worst.width,
            );
            sums.insert(
                (format, *name),
                Sums {
                    bytes: bytes as f64,
                    ssim: mean,
                    cpu,
                    mean: mean2,
                    worst: worst2,
                },
            );
        }
    }
    println!();
    let mark = |ok: bool| if ok { "met" } else { "NOT met" };
    let (auto, sharp) = (tools[1].0, "sharp");
    // Issue 57's goals: bytes against sharp's default at an equal or better mean SSIMULACRA2 and
    // a worst no worse.
    for (format, goal) in [("webp", 0.90), ("jpeg", 0.80), ("avif", 1.0)] {
        let (Some(a), Some(s)) = (sums.get(&(format, auto)), sums.get(&(format, sharp))) else {
            continue;
        };
        println!(
            "{format}: auto bytes {:.3}x sharp's (at most {goal}x: {}), mean SSIMULACRA2 {:.2} vs \
             {:.2} ({}), worst {:.2} vs {:.2} ({}), mean SSIM {:.4} vs {:.4}, CPU {:.2}x sharp's{}",
            a.bytes / s.bytes,
            mark(a.bytes <= goal * s.bytes),
            a.mean,
            s.mean,
            mark(a.mean >= s.mean),
            a.worst,
            s.worst,
            mark(a.worst >= s.worst),
            a.ssim,
            s.ssim,
            a.cpu / s.cpu,
            if format == "avif" {
                format!(" ({})", mark(a.cpu <= s.cpu))
            } else {
                String::new()
            },
        );
    }
    if let (Some(m), Some(s)) = (
        sums.get(&("jpeg", SHARP_MOZJPEG)),
        sums.get(&("jpeg", sharp)),
    ) {
        println!(
            "jpeg: sharp's mozjpeg {:.3}x its default's bytes, mean SSIMULACRA2 {:.2} vs {:.2}, \
             CPU {:.2}x",
            m.bytes / s.bytes,
            m.mean,
            s.mean,
            m.cpu / s.cpu,
        );
    }
    // The whole profile: CPU per photo over every format sharp made too.
    let formats: Vec<&str> = ["avif", "webp", "jpeg"]
        .into_iter()
        .filter(|f| sums.contains_key(&(*f, auto)) && sums.contains_key(&(*f, sharp)))
        .collect();
    if formats.len() > 1 {
        let cpu = |tool| formats.iter().map(|f| sums[&(*f, tool)].cpu).sum::<f64>();
        let (a, s) = (cpu(auto), cpu(sharp));
        println!(
            "{auto} ({}): CPU {a:.0} ms per photo, {:.2}x sharp's fixed {s:.0} ms ({})",
            formats.join(" + "),
            a / s,
            mark(a <= 1.3 * s),
        );
    }
    if let (Some(a), Some(w)) = (sums.get(&("avif", auto)), sums.get(&("webp", auto))) {
        println!(
            "avif: bytes {:.3}x auto WebP's at the same target ({})",
            a.bytes / w.bytes,
            mark(a.bytes <= 0.75 * w.bytes)
        );
    }
}

/// One format and tool in the report.
struct Sums {
    bytes: f64,
    /// Mean SSIM (from dssim).
    ssim: f64,
    /// CPU ms per photo.
    cpu: f64,
    /// Mean and worst SSIMULACRA2.
    mean: f64,
    worst: f64,
}
