//! A long video as units against one run (issue 45). On a 1080p30 camera-like clip (H.264
//! High, B-frames, 12 Mbit/s, AAC) of `--minutes`, the `streaming` profile's whole video job:
//!
//! - **one run**: the ladder in one ffmpeg run (`units_after_secs` above the clip's length);
//! - **units, one worker on one core**: the plan (loudness, audio), every unit in turn, the
//!   stitch, each ffmpeg pinned to core 0 with one thread;
//! - **units, two workers on one core each**: the same parts, the units taken from one queue
//!   by two threads pinned to cores 0 and 1 (each thread's ffmpeg inherits its affinity), as
//!   two pods of one core would share a video's units through the unit topic (without Kafka's
//!   own latency, a few milliseconds a task).
//!
//! Goals: units on one core ≤ 1.05 × one run on one core (CPU and wall), bytes within ±2 %;
//! two workers ≥ 1.8 × faster than one. It also prints when the video would first be
//! playable (`early_playback`): the plan, then the first unit, from the start (the source's
//! download not counted); run it with `--minutes 1` and `--minutes 10` to compare.
//!
//!   cargo bench --bench units [-- --minutes 10 --unit-segments 1,2]

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use media_worker::config::Settings;
use media_worker::contract::Analysis;
use media_worker::media::part::{Part, StitchInput};
use media_worker::media::sniff::Container;
use media_worker::media::video::{ffprobe, units};
use media_worker::media::{self, Control, MediaJob};

#[path = "../tests/common/synthetic.rs"]
#[allow(dead_code)] // the camera-like clip only
mod synthetic;
mod util;

use util::{arg, cpu_seconds};

/// Pins the calling thread (and the processes it starts) to `core`.
fn pin(core: usize) {
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET writes within it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
            0
        );
    }
}

fn bytes(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            if name.starts_with('.') || name == "ffmpeg.m3u8" || name == "pieces" {
                continue;
            }
            if p.is_dir() {
                stack.push(p);
            } else {
                total += e.metadata().unwrap().len();
            }
        }
    }
    total
}

/// Moves every file under `from` to the same place under `to`.
fn gather(from: &Path, to: &Path) {
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let (src, dest) = (e.path(), to.join(e.file_name()));
        if src.is_dir() {
            std::fs::create_dir_all(&dest).unwrap();
            gather(&src, &dest);
        } else {
            std::fs::rename(&src, &dest).unwrap();
        }
    }
}

fn process(job: &MediaJob, input: &Path, out: &Path) -> media::MediaOutput {
    std::fs::create_dir_all(out).unwrap();
    media::process(job, input, out, &mut Control::new(&mut |_| {}))
        .unwrap_or_else(|f| panic!("{:?}", f.error))
}

/// What one way of making the outputs took.
struct Took {
    wall: f64,
    cpu: f64,
    /// Each unit's wall seconds, on its core.
    units: Vec<f64>,
    /// The plan's wall seconds (loudness, the audio, the packet list).
    plan: f64,
    /// From the start until the first unit is done: when the stream could first play.
    first_playable: f64,
}

/// The units of `plan` by `workers` threads, each pinned to a core of its own.
fn units_by(job: &MediaJob, input: &Path, out: &Path, workers: usize) -> Took {
    let probe = ffprobe::run(
        &job.video,
        input,
        Container::IsoBmff,
        &out.join("ffprobe.log"),
        &Default::default(),
    )
    .unwrap();
    let plan = units::plan(job, &probe).expect("planned");
    let (cpu, started) = (cpu_seconds(), Instant::now());
    let mut plan_job = job.clone();
    plan_job.part = Part::Plan;
    let planned = process(&plan_job, input, out);
    let plan_secs = started.elapsed().as_secs_f64();
    let first = Mutex::new(None);
    let queue = Mutex::new(plan.clone().into_iter());
    let tracks = Mutex::new(vec![Vec::new(); plan.len()]);
    let walls = Mutex::new(Vec::new());
    // Each worker in a folder of its own, as each pod has its scratch; the stitch's gets the
    // units' pieces after.
    std::thread::scope(|s| {
        for core in 0..workers {
            let (queue, tracks, walls, first) = (&queue, &tracks, &walls, &first);
            let own = out.join(format!("worker-{core}"));
            s.spawn(move || {
                pin(core);
                let out = own.as_path();
                loop {
                    let Some(unit) = queue.lock().unwrap().next() else {
                        break;
                    };
                    let mut unit_job = job.clone();
                    unit_job.part = Part::Unit(unit.clone());
                    let t = Instant::now();
                    let o = process(&unit_job, input, out);
                    walls.lock().unwrap().push(t.elapsed().as_secs_f64());
                    if unit.index == 0 {
                        *first.lock().unwrap() = Some(started.elapsed().as_secs_f64());
                    }
                    tracks.lock().unwrap()[unit.index as usize] = o.tracks;
                }
            });
        }
    });
    for core in 0..workers {
        gather(&out.join(format!("worker-{core}")), out);
    }
    let Some(Analysis::Video(analysis)) = planned.analysis else {
        panic!("no analysis")
    };
    let mut stitch_job = job.clone();
    stitch_job.part = Part::Stitch(Box::new(StitchInput {
        analysis,
        units: tracks.into_inner().unwrap(),
        audio: planned.tracks.into_iter().next(),
    }));
    process(&stitch_job, input, out);
    Took {
        wall: started.elapsed().as_secs_f64(),
        cpu: cpu_seconds() - cpu,
        units: walls.into_inner().unwrap(),
        plan: plan_secs,
        first_playable: first.into_inner().unwrap().expect("a first unit"),
    }
}

fn main() {
    let minutes: u32 = arg("--minutes", "10").parse().unwrap();
    let unit_segments: Vec<u32> = arg("--unit-segments", "2")
        .split(',')
        .map(|n| n.parse().unwrap())
        .collect();
    media::init(1);
    let dir = tempfile::tempdir().unwrap();
    let clip: PathBuf = synthetic::camera_like_video(dir.path(), minutes * 60, 1920, 1080);
    let settings = Settings::load_from(None, Vec::new()).unwrap();
    let mut job = settings.media_job("streaming", None);
    job.ffmpeg_threads = 1;

    // One run, on one core (or its figures from an earlier run: `--one-run WALL,CPU,BYTES`).
    pin(0);
    let (one_wall, one_cpu, one_bytes) = match arg("--one-run", "").as_str() {
        "" => {
            job.profile.units_after_secs = minutes * 60 + 1;
            let one = dir.path().join("one");
            let (cpu, started) = (cpu_seconds(), Instant::now());
            process(&job, &clip, &one);
            let took = (started.elapsed().as_secs_f64(), cpu_seconds() - cpu);
            (took.0, took.1, bytes(&one))
        }
        figures => {
            let f: Vec<&str> = figures.split(',').collect();
            (
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
            )
        }
    };
    println!(
        "one run, 1 core: wall {one_wall:.1} s, CPU {one_cpu:.1} s ({:.1} s per minute of \
         1080p), {one_bytes} bytes",
        one_cpu / minutes as f64
    );

    job.profile.units_after_secs = 30;
    for segments in unit_segments {
        job.profile.unit_segments = segments;
        let mut walls = Vec::new();
        for workers in [1, 2] {
            let out = dir.path().join(format!("units-{segments}-{workers}"));
            std::fs::create_dir_all(&out).unwrap();
            let took = units_by(&job, &clip, &out, workers);
            let b = bytes(&out);
            let slowest = took.units.iter().copied().fold(0.0, f64::max);
            let mean = took.units.iter().sum::<f64>() / took.units.len() as f64;
            println!(
                "units of {segments} segment(s), {workers} worker(s) on a core each: wall \
                 {:.1} s ({:.3} x one run), CPU {:.1} s ({:.3} x), {b} bytes ({:+.2} %); \
                 {} units, each {mean:.2} s on its core (slowest {slowest:.2} s)",
                took.wall,
                took.wall / one_wall,
                took.cpu,
                took.cpu / one_cpu,
                (b as f64 / one_bytes as f64 - 1.0) * 100.0,
                took.units.len()
            );
            println!(
                "  first playable after {:.1} s (the plan {:.1} s, then the first unit)",
                took.first_playable, took.plan
            );
            walls.push(took.wall);
            let _ = std::fs::remove_dir_all(&out);
        }
        println!(
            "units of {segments} segment(s): two workers {:.2} x faster than one",
            walls[0] / walls[1]
        );
    }
}
