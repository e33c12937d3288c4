//! Throughput of the job runner over the corpus photos (no Kafka, local store):
//! images/s at a given pool size, CPU seconds per image, and peak RSS.
//!
//!   cargo bench --bench pipeline [-- --profile default --pool 2 --rounds 3 --analysis off]
//!
//! `--analysis compare` runs the profile with and without analysis, round by round, and
//! prints what analysis adds.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use futures_util::{StreamExt, stream};
use media_worker::config::Settings;
use media_worker::contract::OptimizeRequest;
use media_worker::job::JobRunner;
use media_worker::storage::LocalStorage;

mod util;
use util::{arg, status_mib};

/// Manifest kinds that are ordinary photos (not broken files, pixel bombs or videos).
const PHOTO_KINDS: &[&str] = &["photo", "faces", "orientation", "color", "alpha"];

fn corpus_photos(dir: &Path) -> Vec<String> {
    let manifest = std::fs::read_to_string(dir.join("MANIFEST.tsv")).expect("corpus manifest");
    manifest
        .lines()
        .skip(1)
        .filter_map(|l| {
            let cols: Vec<&str> = l.split('\t').collect();
            (cols.len() > 5 && PHOTO_KINDS.contains(&cols[5])).then(|| cols[0].to_owned())
        })
        .collect()
}

fn cpu_seconds() -> f64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the struct.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// One configuration under test: a job runner and the CPU and wall time it has used.
struct Mode {
    name: String,
    runner: JobRunner,
    cpu: f64,
    wall: f64,
    /// CPU seconds of each round.
    rounds: Vec<f64>,
}

fn main() {
    let profile = arg("--profile", "default");
    let pool = arg("--pool", "2");
    let rounds: usize = arg("--rounds", "3").parse().unwrap();
    let corpus = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/corpus");
    let photos = corpus_photos(&corpus);
    let out = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();

    // `--analysis off|on`: the profile with OpenCV analysis turned off or on. `compare`: both,
    // alternating round by round so that drifts in machine speed fall on both alike, and the
    // cost of analysis as the difference.
    let analysis = arg("--analysis", "profile");
    let modes: Vec<Option<bool>> = match analysis.as_str() {
        "profile" => vec![None],
        "compare" => vec![Some(true), Some(false)],
        other => vec![Some(other == "on")],
    };
    let mut modes: Vec<Mode> = modes
        .into_iter()
        .map(|on| {
            // The environment applies as for the worker (FACE_CASCADE, VIPS_THREADS, ...).
            let env = std::env::vars().chain([("WORKER_POOL_SIZE".to_owned(), pool.clone())]);
            let mut settings = Settings::load_from(None, env).unwrap();
            settings.worker.tmp_dir = out.path().join("scratch");
            let p = settings.profiles.get_mut(&profile).expect("profile");
            if let Some(on) = on {
                p.analysis = on;
            }
            let name = if p.analysis { "on" } else { "off" }.to_owned();
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
            let (t0, c0) = (Instant::now(), cpu_seconds());
            run_round(&m.runner, round);
            let cpu = cpu_seconds() - c0;
            m.wall += t0.elapsed().as_secs_f64();
            m.cpu += cpu;
            m.rounds.push(cpu);
        }
    }
    let images = (photos.len() * rounds) as f64;
    let peak = status_mib("VmHWM:");
    for m in &modes {
        println!(
            "pipeline profile={profile} analysis={} pool={pool_size} images={images} wall={:.2}s \
             throughput={:.2} images/s cpu_per_image={:.1}ms peak_rss={peak:.0}MiB",
            m.name,
            m.wall,
            images / m.wall,
            m.cpu / images * 1000.0,
        );
    }
    if let [on, off] = &modes[..] {
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
