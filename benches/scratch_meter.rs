//! The scratch meter (`scratch::Meter`) on a long video's stitch: what one measurement of the
//! job's directory costs, and whether the runtime's workers wait on it.
//!
//!   cargo bench --bench scratch_meter [-- --hours 2 --seconds 5]
//!
//! The directory holds what the `streaming` profile's stitch of `--hours` of program holds:
//! every segment and init segment of every rung and of the audio (`segment_secs` each), the
//! playlists, the MPD, the progressive MP4s and the storyboard's tiles (4 KiB each: the walk
//! costs a `stat` per file whatever its size). Three figures:
//! - a walk's time (`scratch::used_bytes`, the meter's tick), 20 times;
//! - a one-worker runtime (a one-core pod) metering that directory for `--seconds`, beside a
//!   task that sleeps 1 ms at a time: how late it wakes (the longest, and the total late by
//!   more than 2 ms: the time the worker could run nothing else);
//! - the process's CPU over that time, less an idle run's.

use std::path::Path;
use std::time::{Duration, Instant};

use media_worker::config::Settings;
use media_worker::scratch::{Admission, ScratchDir, used_bytes};

mod util;
use util::{arg, cpu_seconds};

/// Files of a stitch of `hours` of program with the `streaming` profile.
fn stitch_files(settings: &Settings, hours: f64) -> u64 {
    let p = &settings.profiles["streaming"];
    let segments = (hours * 3600.0 / f64::from(p.segment_secs)).ceil() as u64;
    let rungs = p.renditions.len() as u64;
    let tracks = rungs + 1;
    let playlists = tracks + 2; // each track's, the master and the MPD
    let tiles = p.storyboard.as_ref().map_or(0, |s| u64::from(s.max_tiles));
    tracks * (segments + 1) + playlists + rungs + tiles
}

fn fill(dir: &Path, files: u64) {
    let stream = dir.join("out").join("stream");
    std::fs::create_dir_all(&stream).unwrap();
    let block = vec![7u8; 4096];
    for i in 0..files {
        std::fs::write(stream.join(format!("f{i}.m4s")), &block).unwrap();
    }
}

/// How late a task sleeping 1 ms at a time wakes, over `secs` on `rt`: (longest, total of the
/// wakes late by more than 2 ms).
fn lateness(rt: &tokio::runtime::Runtime, secs: f64) -> (Duration, Duration) {
    rt.block_on(async {
        let end = Instant::now() + Duration::from_secs_f64(secs);
        let (mut worst, mut late) = (Duration::ZERO, Duration::ZERO);
        while Instant::now() < end {
            let t = Instant::now();
            tokio::time::sleep(Duration::from_millis(1)).await;
            let over = t.elapsed().saturating_sub(Duration::from_millis(1));
            worst = worst.max(over);
            if over > Duration::from_millis(2) {
                late += over;
            }
        }
        (worst, late)
    })
}

fn main() {
    let hours: f64 = arg("--hours", "2").parse().unwrap();
    let secs: f64 = arg("--seconds", "5").parse().unwrap();
    let settings = Settings::load(None).expect("settings");
    let files = stitch_files(&settings, hours);
    let root = tempfile::tempdir().unwrap();
    let job = ScratchDir::create(root.path(), "job-stitch").unwrap();
    let made = Instant::now();
    fill(job.path(), files);
    println!(
        "{files} files ({hours} h of the streaming profile's stitch) made in {:.1} s",
        made.elapsed().as_secs_f64()
    );

    let mut walks: Vec<Duration> = (0..20)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(used_bytes(job.path()));
            t.elapsed()
        })
        .collect();
    walks.sort();
    println!(
        "a walk (the meter's tick): median {:.1} ms, longest {:.1} ms",
        walks[walks.len() / 2].as_secs_f64() * 1e3,
        walks[walks.len() - 1].as_secs_f64() * 1e3
    );

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let cpu = cpu_seconds();
    let (idle_worst, idle_late) = lateness(&rt, secs);
    let idle_cpu = cpu_seconds() - cpu;
    let admission = Admission::new(root.path(), 0, 0);
    let stop = tokio_util::sync::CancellationToken::new();
    let meter = rt.block_on(async { admission.meter(job.path(), stop.clone()) });
    let cpu = cpu_seconds();
    let (worst, late) = lateness(&rt, secs);
    let metered_cpu = cpu_seconds() - cpu;
    drop(meter);
    assert!(!stop.is_cancelled(), "within its budget");
    println!(
        "one-worker runtime, {secs} s: a 1 ms sleeper wakes late by at most {:.1} ms \
         ({:.0} ms late in all) idle, {:.1} ms ({:.0} ms in all) while the meter runs",
        idle_worst.as_secs_f64() * 1e3,
        idle_late.as_secs_f64() * 1e3,
        worst.as_secs_f64() * 1e3,
        late.as_secs_f64() * 1e3
    );
    println!(
        "the meter's CPU: {:.1} % of a core ({:.2} s over {secs} s, less {:.2} s idle)",
        (metered_cpu - idle_cpu) / secs * 100.0,
        metered_cpu,
        idle_cpu
    );
}
