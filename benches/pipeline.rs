//! Throughput of the job runner over the corpus photos (no Kafka, local store):
//! images/s at a given pool size, CPU seconds per image, and peak RSS.
//!
//!   cargo bench --bench pipeline [-- --profile default --pool 2 --rounds 3 --analysis off]

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

fn main() {
    let profile = arg("--profile", "default");
    let pool = arg("--pool", "2");
    let rounds: usize = arg("--rounds", "3").parse().unwrap();
    let corpus = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/corpus");
    let photos = corpus_photos(&corpus);
    let out = tempfile::tempdir().unwrap();

    // The environment applies as for the worker (FACE_CASCADE, VIPS_THREADS, ...).
    let env = std::env::vars().chain([("WORKER_POOL_SIZE".to_owned(), pool.clone())]);
    let mut settings = Settings::load_from(None, env).unwrap();
    settings.worker.tmp_dir = out.path().join("scratch");
    // `--analysis off`: the same profile without OpenCV, to measure what analysis costs.
    let analysis = arg("--analysis", "profile");
    if analysis != "profile" {
        settings
            .profiles
            .get_mut(&profile)
            .expect("profile")
            .analysis = analysis == "on";
    }
    let storage = LocalStorage::new(out.path()).with_bucket("corpus", &corpus);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let svc = rt
        .block_on(async { media_worker::worker::services(Arc::new(settings), Arc::new(storage)) })
        .unwrap();
    let pool_size = svc.settings.pool_size();
    let runner = JobRunner::new(svc);

    let run_round = |round: usize| {
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
                .buffer_unordered(
                    pool_size * arg("--in-flight-factor", "2").parse::<usize>().unwrap(),
                )
                .collect::<Vec<_>>()
                .await
        });
    };

    run_round(0); // warm-up: page cache, libvips start-up
    let (t0, c0) = (Instant::now(), cpu_seconds());
    for round in 1..=rounds {
        run_round(round);
    }
    let (wall, cpu) = (t0.elapsed().as_secs_f64(), cpu_seconds() - c0);
    let images = photos.len() * rounds;
    println!(
        "pipeline profile={profile} analysis={analysis} pool={pool_size} images={images} wall={wall:.2}s \
         throughput={:.2} images/s cpu_per_image={:.1}ms peak_rss={:.0}MiB",
        images as f64 / wall,
        cpu / images as f64 * 1000.0,
        status_mib("VmHWM:")
    );
}
