//! Bytes at equal quality, against sharp (`make bench-quality`):
//!
//!   cargo bench --bench quality -- --sharp DIR --dssim PATH [--profile variants] [--rounds 3]
//!
//! For each corpus photo, the profile's variants as the worker makes them (`media::process`,
//! one format at a time, so that CPU is per format) and as sharp makes them
//! (benches/quality/sharp.mjs, npm `sharp` installed in DIR by the Makefile, at the widths the
//! worker made). Every output is scored with dssim (lower is better; 0 = identical) against a
//! Pillow downscale of the upright sRGB source (benches/quality/score.py). Prints, per format
//! and tool: total bytes, mean and worst score, CPU per image (the least of `--rounds` runs);
//! then the goals: the worker's mean
//! score at most sharp's, its bytes at most sharp's, its CPU per image at most sharp's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use media_worker::config::Settings;
use media_worker::media::{self, Control};
use serde_json::{Value, json};

#[path = "../tests/common/lines.rs"]
mod lines;
mod util;
use util::{arg, corpus_photos};

/// One variant, made by one tool.
#[derive(Debug, Clone)]
struct Made {
    photo: String,
    format: String,
    width: u32,
    path: PathBuf,
    bytes: u64,
    score: f64,
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

/// `--calibrate`: for each corpus photo, auto format and width, the lowest quality that meets
/// `--target` found on that width itself, against the quality carried from the proxy (the
/// narrowest variant): what `media::quality::carry` should add at each width.
fn calibrate(job: &media::MediaJob, corpus: &Path, target: f64) {
    use media::quality::{self, Scorer};
    println!("| format | photo | width | ratio | own quality | proxy quality | carried | delta |");
    println!("|---|---|---|---|---|---|---|---|");
    let mut deltas: BTreeMap<(String, u32), Vec<i32>> = BTreeMap::new();
    for photo in corpus_photos(corpus) {
        let mut stills = Vec::new();
        let made = media::image::variant_pixels(job, &corpus.join(&photo), |w, img| {
            // Opaque copies, as JPEG is scored (the corpus photos' alpha is flattened).
            let img = if img.has_alpha() {
                img.flatten([255.0; 3]).and_then(|i| i.into_memory())
            } else {
                img.to_srgb8().and_then(|i| i.into_memory())
            };
            stills.push((w, img.expect("flatten")));
        });
        if made.is_err() || stills.is_empty() {
            continue;
        }
        let (pw, proxy) = stills.last().expect("a variant");
        for spec in &job.profile.formats {
            let f = spec.format;
            let search = |img: &media::vips::Image, w: u32| {
                let scorer = Scorer::new(img).expect("scorer");
                scorer
                    .search(img, f, quality::effort(f, w), target)
                    .expect("search")
                    .quality
            };
            let qp = search(proxy, *pw);
            // The widest variant's busiest window of the proxy's size, and its centre.
            let (ww, wide) = &stills[0];
            let (cw, ch) = (
                proxy.width().min(wide.width()),
                proxy.height().min(wide.height()),
            );
            let (bx, by) = quality::busiest_window(wide, cw, ch).expect("window");
            let crop = |x, y| {
                wide.extract(x, y, cw, ch)
                    .and_then(|i| i.into_memory())
                    .expect("crop")
            };
            let qb = search(&crop(bx, by), *ww);
            let qc = search(
                &crop((wide.width() - cw) / 2, (wide.height() - ch) / 2),
                *ww,
            );
            let own_wide = search(wide, *ww);
            println!(
                "CROP | {} | {photo} | {ww} | own {own_wide} | busiest {qb} | centre {qc} | proxy {qp} |",
                f.name()
            );
            for (w, img) in &stills {
                let own = search(img, *w);
                let carried = quality::carry(f, qp, *pw, *w);
                let delta = own as i32 - qp as i32;
                println!(
                    "| {} | {photo} | {w} | {:.1} | {own} | {qp} | {carried} | {delta} |",
                    f.name(),
                    *w as f64 / *pw as f64
                );
                deltas
                    .entry((f.name().to_owned(), w / 100 * 100))
                    .or_default()
                    .push(delta);
            }
        }
    }
    println!("\n| format | width (100s) | photos | min delta | mean delta | max delta |");
    println!("|---|---|---|---|---|---|");
    for ((f, w), d) in &deltas {
        let mean = d.iter().sum::<i32>() as f64 / d.len() as f64;
        let (min, max) = (d.iter().min().unwrap(), d.iter().max().unwrap());
        println!("| {f} | {w} | {} | {min} | {mean:.1} | {max} |", d.len());
    }
}

fn main() {
    if std::env::args().any(|a| a == "--calibrate") {
        let settings = Settings::load_from(None, Vec::new()).expect("settings");
        let job = settings.media_job(&arg("--profile", "picture"), None);
        media::init(1);
        let target: f64 = arg("--target", "70").parse().expect("--target SCORE");
        let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/corpus");
        return calibrate(&job, &corpus, target);
    }
    let sharp_dir = PathBuf::from(arg("--sharp", ""));
    let dssim = PathBuf::from(arg("--dssim", "dssim"));
    let profile = arg("--profile", "variants");
    let rounds: usize = arg("--rounds", "3").parse().expect("--rounds N");
    assert!(
        sharp_dir.join("node_modules/sharp").is_dir(),
        "--sharp DIR with node_modules/sharp (make bench-quality installs it)"
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let corpus = root.join("../shared/corpus");
    let settings = Settings::load_from(None, Vec::new()).expect("settings");
    let job = settings.media_job(&profile, None);
    media::init(1);
    let work = tempfile::tempdir().unwrap();

    // The worker, one format at a time; sharp is asked for the widths the worker made.
    let mut worker = Tool::default();
    let mut sharp_jobs = Vec::new();
    for photo in corpus_photos(&corpus) {
        let source = corpus.join(&photo);
        let mut widths = Vec::new();
        for spec in &job.profile.formats {
            let mut one = job.clone();
            one.profile.formats = vec![*spec];
            one.profile.thumbnail = None;
            let out = work
                .path()
                .join("worker")
                .join(&photo)
                .join(spec.format.name());
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
            let result = result.expect("a round");
            let Ok(o) = result else {
                println!("skipped {photo}: the worker fails it ({:?})", result.err());
                break;
            };
            for f in o.files.iter().filter(|f| f.role == "variant") {
                widths.push(f.width);
                worker.made.push(Made {
                    photo: photo.clone(),
                    format: spec.format.name().to_owned(),
                    width: f.width,
                    path: f.path.clone(),
                    bytes: f.size_bytes,
                    score: f64::NAN,
                });
            }
            worker
                .cpu_ms
                .entry(spec.format.name().to_owned())
                .or_default()
                .push((photo.clone(), cpu));
        }
        widths.sort_unstable();
        widths.dedup();
        let formats: Vec<Value> = job
            .profile
            .formats
            .iter()
            .map(|f| json!({"format": f.format.name(), "quality": f.quality}))
            .collect();
        sharp_jobs.push(json!({
            "source": source, "name": photo, "widths": widths, "formats": formats,
        }));
    }
    // sharp's outputs are the same every round; its CPU per photo and format is the least.
    let mut sharp = run_sharp(
        root,
        &sharp_dir,
        &work.path().join("sharp"),
        &sharp_jobs,
        true,
    );
    for _ in 1..rounds {
        let again = run_sharp(
            root,
            &sharp_dir,
            &work.path().join("sharp"),
            &sharp_jobs,
            false,
        );
        for (format, per_photo) in &mut sharp.cpu_ms {
            for ((_, ms), (_, ms2)) in per_photo.iter_mut().zip(&again.cpu_ms[format]) {
                *ms = ms.min(*ms2);
            }
        }
    }
    // Only photos both tools made count.
    let both: Vec<String> = sharp
        .made
        .iter()
        .map(|m| m.photo.clone())
        .filter(|p| worker.made.iter().any(|m| &m.photo == p))
        .collect();
    let mut tools = [("worker", worker), ("sharp", sharp)];
    for (_, tool) in &mut tools {
        tool.made.retain(|m| both.contains(&m.photo));
        score(root, &dssim, work.path(), &mut tool.made);
    }
    // Sources Pillow cannot read (HEIF, AVIF, CIELab TIFF) have no reference.
    let unscored: std::collections::BTreeSet<String> = tools
        .iter()
        .flat_map(|(_, t)| t.made.iter().filter(|m| m.score.is_nan()))
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
    report(&tools, &job.profile.formats);
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
                score: f64::NAN,
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
            json!({"source": source, "output": m.path, "ref": r, "out": o}).to_string()
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
        m.score = text
            .split_whitespace()
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("dssim said {text}"));
        let _ = (std::fs::remove_file(r), std::fs::remove_file(o));
    }
}

fn report(tools: &[(&str, Tool)], formats: &[media::settings::FormatSpec]) {
    println!(
        "\n| format | tool | photos | outputs | total bytes | mean dssim | worst dssim (output) | \
         CPU ms / photo |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let mut sums = BTreeMap::new();
    for spec in formats {
        let format = spec.format.name();
        for (name, tool) in tools {
            let made: Vec<&Made> = tool.made.iter().filter(|m| m.format == format).collect();
            let photos: std::collections::BTreeSet<&str> =
                made.iter().map(|m| m.photo.as_str()).collect();
            let bytes: u64 = made.iter().map(|m| m.bytes).sum();
            let mean = made.iter().map(|m| m.score).sum::<f64>() / made.len() as f64;
            let worst = made
                .iter()
                .max_by(|a, b| a.score.total_cmp(&b.score))
                .expect("outputs");
            let cpu = &tool.cpu_ms[format];
            let cpu = cpu.iter().map(|(_, ms)| ms).sum::<f64>() / cpu.len() as f64;
            println!(
                "| {format} | {name} | {} | {} | {bytes} | {mean:.6} | {:.6} ({} {}w) | {cpu:.1} |",
                photos.len(),
                made.len(),
                worst.score,
                worst.photo,
                worst.width,
            );
            sums.insert((format, *name), (bytes as f64, mean, cpu));
        }
    }
    println!();
    for spec in formats {
        let format = spec.format.name();
        let (wb, ws, wc) = sums[&(format, "worker")];
        let (sb, ss, sc) = sums[&(format, "sharp")];
        let mark = |ok: bool| if ok { "met" } else { "NOT met" };
        println!(
            "{format}: bytes {:.3}x sharp's ({}), mean dssim {:.3}x sharp's ({}), CPU {:.2}x \
             sharp's ({})",
            wb / sb,
            mark(wb <= sb),
            ws / ss,
            mark(ws <= ss),
            wc / sc,
            mark(wc <= sc),
        );
    }
}
