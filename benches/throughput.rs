//! The whole worker against sharp and a plain libvips loop on the same photos: images/s and
//! CPU per image.
//!
//!   cargo bench --bench throughput -- --sharp DIR [--photos 6] [--rounds 6]
//!       [--profiles variants,auto] [--baselines off]
//!
//! The photos are the corpus's plain photos (kind `photo`) that all three read (all but the
//! HEIC; at most `--photos`), each processed `--rounds` times. Every tool makes the `variants` outputs
//! (its widths, WebP and JPEG at its qualities), two jobs at a time (this machine's 2 cores):
//!
//! - the worker: the binary, with its defaults (sandbox on, a pool of one job per core), fed
//!   through Apache Kafka, reading from and writing to s3s-fs; each `--profiles` entry in turn.
//!   A first round per profile warms it (models, sandbox servers) and is not counted. Its CPU
//!   is the worker process and every process under it, not the broker's or the S3 server's.
//! - sharp (`benches/quality/sharp.mjs`: one pipeline per output, as its users write them) and
//!   the loop (`benches/throughput/vips_loop.c`: one decode per photo, every width derived from
//!   it): two processes of one thread each, fed half the list, reading local files.
//!
//! First, where the worker's CPU goes: each step of the `variants` and `auto` profiles run on
//! this bench's thread (libvips on one thread), per image: probe, the one decode, the cascade
//! of resizes, each encoder at each width, and auto quality's search.
//!
//! "cores busy" is the tool's CPU over the wall time, then the whole machine's: the broker and
//! the S3 server share the 2 cores with the worker (about 0.2 of a core here).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use media_worker::config::Settings;
use media_worker::media::{self, transform::plan_widths, vips::Image};

mod util;
use util::{arg, corpus_files, cpu_seconds, proc_cpu_seconds};

#[path = "../tests/common/mod.rs"]
mod common;

/// What one tool did: images, wall seconds, CPU seconds (its own, and the whole machine's).
struct Run {
    tool: String,
    images: usize,
    wall: f64,
    cpu: f64,
    machine: f64,
}

impl Run {
    fn print(&self, sharp: Option<&Run>) {
        let (per_s, cpu_ms) = (
            self.images as f64 / self.wall,
            self.cpu * 1000.0 / self.images as f64,
        );
        let vs = sharp.map_or(String::new(), |s| {
            format!(
                "  ({:.2}x sharp's images/s, {:.2}x its CPU)",
                per_s / (s.images as f64 / s.wall),
                self.cpu / self.images as f64 / (s.cpu / s.images as f64)
            )
        });
        println!(
            "{:<18} {:>4} images {:>7.2} s  {per_s:>5.2} images/s  {cpu_ms:>6.1} ms CPU/image  \
             cores busy: {:.2} its, {:.2} all{vs}",
            self.tool,
            self.images,
            self.wall,
            self.cpu / self.wall,
            self.machine / self.wall
        );
    }
}

/// A photo and the widths the worker plans for it.
struct Photo {
    name: String,
    widths: Vec<u32>,
}

fn main() {
    let sharp_dir = PathBuf::from(arg("--sharp", ""));
    assert!(
        sharp_dir.join("node_modules/sharp").is_dir(),
        "--sharp DIR with node_modules/sharp (make bench-quality installs it)"
    );
    let n_photos: usize = arg("--photos", "6").parse().expect("--photos N");
    let rounds: usize = arg("--rounds", "6").parse().expect("--rounds N");
    let profiles = arg("--profiles", "variants,auto");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let corpus = root.join("../shared/corpus");
    let settings = Settings::load_from(None, Vec::new()).expect("settings");
    let variants = &settings.profiles["variants"];
    media::init(1);

    // The plain photos (kind `photo`) but the HEIC, which sharp's prebuilt libvips cannot read.
    let photos: Vec<Photo> = corpus_files(&corpus, &["photo"])
        .into_iter()
        .filter(|name| !name.ends_with(".heic"))
        .take(n_photos)
        .map(|name| {
            let img = Image::open_header(&corpus.join(&name)).expect("a corpus photo");
            let widths = plan_widths(&variants.widths, img.width());
            Photo { name, widths }
        })
        .collect();
    let names: Vec<&str> = photos.iter().map(|p| p.name.as_str()).collect();
    println!(
        "{} photos x {rounds} rounds: {}",
        photos.len(),
        names.join(", ")
    );
    let quality = |format: &str| {
        let spec = variants.formats.iter().find(|f| f.format.name() == format);
        fixed_quality(spec.unwrap_or_else(|| panic!("the variants profile has {format}")))
    };
    let (webp_q, jpeg_q) = (quality("webp"), quality("jpeg"));

    where_cpu_goes(&settings, &corpus, &photos, rounds);

    let work = tempfile::tempdir().unwrap();
    let list: Vec<&Photo> = (0..rounds).flat_map(|_| photos.iter()).collect();
    // `--baselines off`: the worker alone, without sharp and the loop.
    let baselines = arg("--baselines", "on") == "on";
    let widths: Vec<String> = variants.widths.iter().map(u32::to_string).collect();
    let vips_loop = baselines.then(|| {
        let loop_bin = build_loop(work.path());
        two_at_a_time("libvips loop", &list, |half| {
            let mut cmd = Command::new(&loop_bin);
            cmd.args([webp_q.to_string(), jpeg_q.to_string(), widths.join(",")]);
            cmd.args(half.iter().map(|p| corpus.join(&p.name)));
            (cmd, String::new())
        })
    });
    let sharp_out = work.path().join("sharp");
    let sharp = baselines.then(|| {
        two_at_a_time("sharp", &list, |half| {
            let mut cmd = Command::new("node");
            cmd.arg(root.join("benches/quality/sharp.mjs"))
                .arg(&sharp_dir)
                .arg(&sharp_out);
            let jobs: Vec<String> = half
                .iter()
                .map(|p| {
                    serde_json::json!({
                        "source": corpus.join(&p.name), "name": p.name, "widths": p.widths,
                        "formats": [{"format": "webp", "quality": webp_q},
                                    {"format": "jpeg", "quality": jpeg_q}],
                    })
                    .to_string()
                })
                .collect();
            (cmd, jobs.join("\n"))
        })
    });

    let rt = tokio::runtime::Runtime::new().unwrap();
    let workers: Vec<Run> = rt.block_on(async {
        let stack = common::Stack::start(2).await;
        for p in &photos {
            stack.upload_corpus(&p.name).await;
        }
        let mut env = stack.worker_env("throughput");
        // The worker's own knobs, when set for the bench (MAX_IN_FLIGHT, WORKER_POOL_SIZE, ...).
        for knob in [
            "MAX_IN_FLIGHT",
            "WORKER_POOL_SIZE",
            "VIPS_THREADS",
            "MEDIA_ISOLATION",
        ] {
            if let Ok(v) = std::env::var(knob) {
                env.insert(knob.to_owned(), v);
            }
        }
        let worker = common::Worker::start(&env);
        worker.ready().await;
        let responses = stack.responses();
        let mut runs = Vec::new();
        for profile in profiles.split(',') {
            let batch = |round: usize| -> Vec<_> {
                (0..photos.len())
                    .map(|i| {
                        let mut req =
                            common::request(&format!("{profile}-{round}-{i}"), &photos[i].name)
                                .with_profile(profile);
                        req.force = true;
                        req
                    })
                    .collect()
            };
            // Warm-up, not counted.
            stack.send_all(&batch(0)).await;
            check(&responses, photos.len());
            let reqs: Vec<_> = (1..=rounds).flat_map(batch).collect();
            let (t0, c0, m0) = (Instant::now(), tree_cpu(worker.pid()), machine_cpu());
            stack.send_all(&reqs).await;
            check(&responses, reqs.len());
            runs.push(Run {
                tool: format!("worker {profile}"),
                images: reqs.len(),
                wall: t0.elapsed().as_secs_f64(),
                cpu: tree_cpu(worker.pid()) - c0,
                machine: machine_cpu() - m0,
            });
        }
        runs
    });

    println!();
    for run in vips_loop.iter().chain(&sharp).chain(&workers) {
        run.print(sharp.as_ref().filter(|s| s.tool != run.tool));
    }
    println!(
        "goal (issue 34): with auto quality, CPU per image <= 0.7x sharp's and images/s >= 1.3x"
    );
}

/// Prints the CPU (ms per image) of each step of the `variants` profile and of auto quality's
/// search (the `auto` profile's), over `rounds` of `photos`.
fn where_cpu_goes(settings: &Settings, corpus: &Path, photos: &[Photo], rounds: usize) {
    use media_worker::media::{image, probe, quality, sniff, transform};
    let (fixed, auto) = (
        settings.media_job("variants", None),
        settings.media_job("auto", None),
    );
    let mut steps: Vec<(String, f64)> = Vec::new();
    let mut add = |step: String, since: f64| {
        let cpu = cpu_seconds() - since;
        match steps.iter_mut().find(|(s, _)| *s == step) {
            Some((_, total)) => *total += cpu,
            None => steps.push((step, cpu)),
        }
    };
    // The profile width a planned width stands for (a narrower source's own width: the next).
    let bucket = |w: u32| {
        fixed
            .profile
            .widths
            .iter()
            .copied()
            .find(|p| w <= *p)
            .unwrap_or(w)
    };
    for _ in 0..rounds {
        for photo in photos {
            let path = corpus.join(&photo.name);
            let t = cpu_seconds();
            let sniff::Sniffed::Image(format) = sniff::sniff_file(&path).unwrap() else {
                panic!("{}: an image", photo.name);
            };
            let probe = probe::run(&path, format, &fixed.limits).unwrap();
            add("probe".into(), t);
            let t = cpu_seconds();
            let (decoded, _) = image::decode_image(&path, &probe, &fixed.profile, None).unwrap();
            add("decode (shrink-on-load)".into(), t);
            let t = cpu_seconds();
            let size = (decoded.width(), decoded.height());
            let (plan, _) = transform::plan_variants(&photo.widths, size, &fixed.profile.formats);
            let stills = transform::Stills::make(&decoded, None, &plan, None).unwrap();
            add("cascade of resizes".into(), t);
            for (w, img) in stills.iter() {
                for spec in &fixed.profile.formats {
                    let t = cpu_seconds();
                    img.encode(
                        spec.format,
                        fixed_quality(spec),
                        quality::effort(spec.format, w),
                    )
                    .unwrap();
                    add(format!("{} {}w", spec.format.name(), bucket(w)), t);
                }
            }
            // Auto quality: each output searched from its width's base on its own pixels (the
            // scorer's reference included).
            for spec in &auto.profile.formats {
                let target = spec.auto_target().expect("auto has auto qualities");
                for (w, img) in stills.iter() {
                    let t = cpu_seconds();
                    let scorer = quality::Scorer::new(img).unwrap();
                    scorer.search(img, spec.format, target).unwrap();
                    add(
                        format!("auto: {} search {}w", spec.format.name(), bucket(w)),
                        t,
                    );
                }
            }
        }
    }
    let images = (photos.len() * rounds) as f64;
    println!("\nwhere the CPU goes (ms per image, one thread):");
    for (step, cpu) in &steps {
        println!("  {step:<26} {:>7.1}", cpu * 1000.0 / images);
    }
    println!();
}

/// The quality of one of the `variants` profile's formats (all fixed).
fn fixed_quality(spec: &media::settings::FormatSpec) -> u8 {
    match spec.quality {
        media::settings::Quality::Fixed(q) => q,
        _ => panic!(
            "the variants profile's {} quality is fixed",
            spec.format.name()
        ),
    }
}

/// Compiles the loop against the system's libvips.
fn build_loop(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/throughput/vips_loop.c");
    let bin = dir.join("vips_loop");
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "cc -O2 -o '{}' '{}' $(pkg-config --cflags --libs vips)",
            bin.display(),
            src.display()
        ))
        .status()
        .expect("cc");
    assert!(status.success(), "building {}", src.display());
    bin
}

/// Runs two processes of `tool` on the halves of `list` (`command` gives each its command and
/// what to write to its stdin) and waits for both; panics if one fails or reports an error.
fn two_at_a_time(
    tool: &str,
    list: &[&Photo],
    command: impl Fn(&[&Photo]) -> (Command, String),
) -> Run {
    let (t0, c0, m0) = (Instant::now(), cpu_seconds(), machine_cpu());
    let children: Vec<_> = list
        .chunks(list.len().div_ceil(2))
        .map(|half| {
            let (mut cmd, input) = command(half);
            let mut child = cmd
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("{tool}: {e}"));
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(input.as_bytes()).unwrap();
            drop(stdin);
            child
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && !text.contains("\"error\""),
            "{tool}: {text}"
        );
    }
    Run {
        tool: tool.to_owned(),
        images: list.len(),
        wall: t0.elapsed().as_secs_f64(),
        cpu: cpu_seconds() - c0,
        machine: machine_cpu() - m0,
    }
}

/// CPU seconds the whole machine has spent busy (not idle or waiting for I/O), from /proc/stat.
fn machine_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap();
    let ticks: Vec<u64> = stat
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal ...
    let busy: u64 = ticks.iter().take(8).sum::<u64>() - ticks[3] - ticks[4];
    // SAFETY: sysconf has no preconditions.
    busy as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// CPU seconds of process `pid` and every process under it (the worker and its sandbox).
fn tree_cpu(pid: i32) -> f64 {
    std::iter::once(pid)
        .chain(common::descendants_of(pid))
        .map(proc_cpu_seconds)
        .sum()
}

/// Awaits `n` responses; panics on a failed one.
fn check(responses: &common::Responses, n: usize) {
    for r in responses.take(n, Duration::from_secs(600)) {
        assert!(r.body.success, "{:?}", r.body.error);
    }
}
