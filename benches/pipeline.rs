//! Throughput of the job runner over the corpus photos (no Kafka, local store):
//! images/s at a given pool size, CPU seconds per image, and peak RSS.
//!
//!   cargo bench --bench pipeline [-- --profile default --pool 2 --rounds 3 --analysis off]
//!
//! `--analysis compare` runs the profile with and without analysis, round by round, and
//! prints what analysis adds. `--isolation compare` does the same for media work in sandbox
//! children (`process`, the worker's default) and on the bench's own threads (`inline`), and
//! prints what the sandbox costs. CPU includes the sandbox children (and their ffmpeg); peak
//! RSS is given for this process (the worker's part), for the largest child and summed over
//! the processes (`peak_rss_total`, an upper bound); `peak_pss_total` is the largest memory
//! the processes held at once (`--pss on`: PSS sampled every 20 ms, shared library pages
//! counted once; the sampling costs CPU, so throughput is measured without it).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use futures_util::{StreamExt, stream};
use media_worker::config::{Isolation, Settings};
use media_worker::contract::OptimizeRequest;
use media_worker::job::JobRunner;
use media_worker::storage::LocalStorage;

mod util;
use util::{arg, corpus_photos, proc_cpu_seconds, proc_status_mib};

/// CPU seconds of this process, of its reaped children, and of the live `children` (with
/// what they reaped: a sandbox's ffmpeg runs).
fn cpu_seconds(children: &[i32]) -> f64 {
    util::cpu_seconds()
        + children
            .iter()
            .map(|&pid| proc_cpu_seconds(pid))
            .sum::<f64>()
}

/// Peak RSS (MiB) of process `pid` since its last reset, and a reset (`clear_refs` 5).
fn take_peak_mib(pid: &str) -> f64 {
    let peak = proc_status_mib(pid, "VmHWM:");
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
    peak
}

/// Proportional set size (MiB) of process `pid`: its private pages, and its share of pages
/// other processes map too (0 once it is gone).
fn pss_mib(pid: &str) -> f64 {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    rollup
        .lines()
        .find(|l| l.starts_with("Pss:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// One configuration under test: a job runner and the CPU and wall time it has used.
struct Mode {
    name: String,
    runner: JobRunner,
    cpu: f64,
    wall: f64,
    /// CPU seconds of each round.
    rounds: Vec<f64>,
    /// Peak RSS of this process, and of the largest sandbox child, over its rounds (MiB).
    peak_parent: f64,
    peak_child: f64,
    /// The largest sum, over a round, of this process's peak and every child's (an upper
    /// bound: the peaks need not coincide, and pages the processes share count once each).
    peak_total: f64,
    /// The largest sum of the processes' PSS seen (sampled every 20 ms): what they hold at
    /// once, shared pages counted once.
    peak_pss: f64,
}

impl Mode {
    /// The live sandbox children of this mode's runner (none inline).
    fn children(&self) -> Vec<i32> {
        match &self.runner.services().media {
            media_worker::sandbox::Executor::Sandbox(pool) => pool.children(),
            media_worker::sandbox::Executor::Inline => Vec::new(),
        }
    }
}

fn main() {
    // As in the worker binary (its sandbox children included).
    media_worker::allocator::tune();
    let profile = arg("--profile", "default");
    let pool = arg("--pool", "2");
    let rounds: usize = arg("--rounds", "3").parse().unwrap();
    let sample_pss = arg("--pss", "off") == "on";
    let corpus = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/corpus");
    let photos = corpus_photos(&corpus);
    let out = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();

    // `--analysis off|on`: the profile with OpenCV analysis turned off or on. `compare`: both,
    // alternating round by round so that drifts in machine speed fall on both alike, and the
    // cost of analysis as the difference.
    let analysis = arg("--analysis", "profile");
    let analysis: Vec<Option<bool>> = match analysis.as_str() {
        "profile" => vec![None],
        "compare" => vec![Some(true), Some(false)],
        other => vec![Some(other == "on")],
    };
    let isolation = arg("--isolation", "process");
    let isolation: Vec<Isolation> = match isolation.as_str() {
        "compare" => vec![Isolation::Process, Isolation::Inline],
        "inline" => vec![Isolation::Inline],
        _ => vec![Isolation::Process],
    };
    let combos: Vec<(Option<bool>, Isolation)> = analysis
        .iter()
        .flat_map(|a| isolation.iter().map(move |i| (*a, *i)))
        .collect();
    let mut modes: Vec<Mode> = combos
        .into_iter()
        .map(|(on, isolation)| {
            // The environment applies as for the worker (FACE_CASCADE, VIPS_THREADS, ...).
            let env = std::env::vars().chain([("WORKER_POOL_SIZE".to_owned(), pool.clone())]);
            let mut settings = Settings::load_from(None, env).unwrap();
            settings.worker.tmp_dir = out.path().join("scratch");
            settings.worker.isolation = isolation;
            settings.worker.sandbox_program =
                Some(PathBuf::from(env!("CARGO_BIN_EXE_media-worker")));
            let p = settings.profiles.get_mut(&profile).expect("profile");
            if let Some(on) = on {
                p.analysis = on;
            }
            let name = format!(
                "analysis={} isolation={}",
                if p.analysis { "on" } else { "off" },
                if isolation == Isolation::Process {
                    "process"
                } else {
                    "inline"
                }
            );
            let storage = LocalStorage::new(out.path()).with_bucket("corpus", &corpus);
            let svc = rt
                .block_on(async {
                    media_worker::job::services(Arc::new(settings), Arc::new(storage))
                })
                .unwrap();
            Mode {
                name,
                runner: JobRunner::new(svc, media_worker::shutdown::Shutdown::new()),
                cpu: 0.0,
                wall: 0.0,
                rounds: Vec::new(),
                peak_parent: 0.0,
                peak_child: 0.0,
                peak_total: 0.0,
                peak_pss: 0.0,
            }
        })
        .collect();
    // As the worker sizes it (WORKER_POOL_SIZE, 0 = the CPUs it may use).
    let pool_size = modes[0].runner.pool_size();
    let in_flight = pool_size * arg("--in-flight-factor", "2").parse::<usize>().unwrap();

    let run_round = |runner: &JobRunner, round: usize| {
        rt.block_on(async {
            stream::iter(photos.iter().enumerate())
                .map(|(i, name)| {
                    let runner = runner.clone();
                    let profile = profile.clone();
                    async move {
                        let mut req = OptimizeRequest::new(
                            format!("bench-{round}-{i}"),
                            format!("m{i}"),
                            "bench",
                            "corpus",
                            name.clone(),
                        )
                        .with_profile(&profile);
                        // Every round does the work (no answer from a stored manifest).
                        req.force = true;
                        let r = runner.run_registered(&req).await;
                        assert!(r.success && !r.replayed, "{name}: {:?}", r.error);
                    }
                })
                .buffer_unordered(in_flight)
                .collect::<Vec<_>>()
                .await
        });
    };

    // Warm-up: page cache, libvips start-up, cascades.
    for m in &modes {
        run_round(&m.runner, 0);
    }
    for round in 1..=rounds {
        let n = modes.len();
        for k in 0..n {
            let m = &mut modes[(round + k) % n];
            let children = m.children();
            take_peak_mib("self");
            for c in &children {
                take_peak_mib(&c.to_string());
            }
            let (t0, c0) = (Instant::now(), cpu_seconds(&children));
            // Off when not asked for: reading smaps costs CPU.
            let done = std::sync::atomic::AtomicBool::new(!sample_pss);
            let pss = std::thread::scope(|s| {
                let sampler = s.spawn(|| {
                    let mut peak: f64 = 0.0;
                    while !done.load(std::sync::atomic::Ordering::Relaxed) {
                        let pids = m.children().into_iter().map(|p| p.to_string());
                        let sum: f64 = std::iter::once("self".to_owned())
                            .chain(pids)
                            .map(|p| pss_mib(&p))
                            .sum();
                        peak = peak.max(sum);
                        std::thread::sleep(std::time::Duration::from_millis(20));
                    }
                    peak
                });
                run_round(&m.runner, round);
                done.store(true, std::sync::atomic::Ordering::Relaxed);
                sampler.join().unwrap()
            });
            m.peak_pss = m.peak_pss.max(pss);
            // A child replaced during the round is counted through RUSAGE_CHILDREN once reaped.
            let cpu = cpu_seconds(&m.children()) - c0;
            m.wall += t0.elapsed().as_secs_f64();
            m.cpu += cpu;
            m.rounds.push(cpu);
            let parent = take_peak_mib("self");
            let mut total = parent;
            m.peak_parent = m.peak_parent.max(parent);
            for c in m.children() {
                let child = take_peak_mib(&c.to_string());
                m.peak_child = m.peak_child.max(child);
                total += child;
            }
            m.peak_total = m.peak_total.max(total);
        }
    }
    let images = (photos.len() * rounds) as f64;
    for m in &modes {
        println!(
            "pipeline profile={profile} {} pool={pool_size} images={images} wall={:.2}s \
             throughput={:.2} images/s cpu_per_image={:.1}ms peak_rss_worker={:.0}MiB \
             peak_rss_child={:.0}MiB peak_rss_total={:.0}MiB{}",
            m.name,
            m.wall,
            images / m.wall,
            m.cpu / images * 1000.0,
            m.peak_parent,
            m.peak_child,
            m.peak_total,
            if sample_pss {
                format!(" peak_pss_total={:.0}MiB", m.peak_pss)
            } else {
                String::new()
            },
        );
    }
    if let ([process, inline], true) = (&modes[..], isolation.len() == 2) {
        let rate = |m: &Mode| images / m.wall;
        let cpu = |m: &Mode| m.cpu / images * 1000.0;
        let mut added: Vec<f64> = (process.rounds.iter().zip(&inline.rounds))
            .map(|(p, i)| (p / i - 1.0) * 100.0)
            .collect();
        added.sort_by(f64::total_cmp);
        println!(
            "sandbox vs inline: {:+.1} % images/s, {:+.1} % CPU per image (median of rounds \
             {:+.1} %; goal: at most 3 % fewer images/s and 3 % more CPU); peak RSS of the \
             process running the jobs {:.0} MiB inline, {:.0} MiB with sandboxes (each child \
             {:.0} MiB at most; run one mode alone for the worker's own figure)",
            (rate(process) / rate(inline) - 1.0) * 100.0,
            (cpu(process) / cpu(inline) - 1.0) * 100.0,
            (added[(added.len() - 1) / 2] + added[added.len() / 2]) / 2.0,
            inline.peak_parent,
            process.peak_parent,
            process.peak_child,
        );
    }
    if let ([on, off], true) = (&modes[..], isolation.len() == 1) {
        // Round by round as well: the machine's speed drifts by more than the effect between
        // rounds, and the median of the paired rounds is the figure least moved by one bad round.
        let mut added: Vec<f64> = (on.rounds.iter().zip(&off.rounds))
            .map(|(on, off)| (on / off - 1.0) * 100.0)
            .collect();
        added.sort_by(f64::total_cmp);
        let (on, off) = (on.cpu / images * 1000.0, off.cpu / images * 1000.0);
        println!(
            "analysis adds {:.1} ms CPU per image: {:+.1} % over all rounds, median of rounds \
             {:+.1} % (range {:+.1} to {:+.1} %; goal <= 20 %)",
            on - off,
            (on / off - 1.0) * 100.0,
            (added[(added.len() - 1) / 2] + added[added.len() / 2]) / 2.0,
            added[0],
            added[added.len() - 1],
        );
    }
}
