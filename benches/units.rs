//! A long video as units against one run (issue 45). On a 1080p30 camera-like clip (H.264
//! High, B-frames, 12 Mbit/s, AAC) of `--minutes`, the `streaming` profile's whole video job:
//!
//! - **one run**: the ladder in one ffmpeg run (`units_after_secs` above the clip's length);
//! - **units, one worker on one core**: the plan (the packet list), the audio (loudness,
//!   encode), every unit in turn, the stitch, each ffmpeg pinned to core 0 with one thread;
//! - **units, two workers on one core each**: the same parts, the units taken from one queue
//!   by two threads pinned to cores 0 and 1 (each thread's ffmpeg inherits its affinity), as
//!   two pods of one core would share a video's units through the unit topic (without Kafka's
//!   own latency, a few milliseconds a task).
//!
//! Goals: units on one core ≤ 1.05 × one run on one core (CPU and wall), bytes within ±2 %;
//! two workers ≥ 1.8 × faster than one. It also prints when the video would first be
//! playable (`early_playback`): once the plan, the first unit and the audio are done, from the
//! start (the source's download not counted). The audio is the queue's first job, as the
//! request sends its task before the units': with two workers it is made while the first unit
//! is encoded. Run it with `--minutes 1` and `--minutes 10` to compare.
//!
//!   cargo bench --bench units [-- --minutes 10 --unit-segments 1,2 --workers 1,2]
//!
//! This machine's speed drifts (a virtual machine's shared cores), so figures taken one after
//! the other can differ by more than what they compare: `--paired [--once [--swapped]]` runs
//! the one run and the units side by side, one on each core (see [`paired`]); `--clip FILE`
//! takes a clip made before, `--keyframe-secs 1` makes one with a keyframe every second (as
//! phones and cameras write them; x264 places them up to 250 frames apart otherwise); `--time-units 0,74` times single units; `--first-playable` times
//! when the clip and its first minute first play on a pod of two cores (see
//! [`first_playable`]).

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use media_worker::config::Settings;
use media_worker::contract::Analysis;
use media_worker::media::part::{Part, StitchInput, Unit};
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
    /// The plan's wall seconds (the packet list).
    plan: f64,
    /// From the start until the first unit and the audio are done: when the stream could
    /// first play.
    first_playable: f64,
}

/// The units `job` plans of `input` (its probe's log in `out`).
fn planned(job: &MediaJob, input: &Path, out: &Path) -> Vec<Unit> {
    let log = out.join("ffprobe.log");
    let probe = ffprobe::run(
        &job.video,
        input,
        Container::IsoBmff,
        &log,
        &Default::default(),
    );
    units::plan(job, &probe.unwrap()).expect("planned")
}

/// The units of `plan` by `workers` threads, pinned to cores `first_core`, `first_core + 1`, ...
fn units_by(job: &MediaJob, input: &Path, out: &Path, workers: usize, first_core: usize) -> Took {
    pin(first_core);
    let plan = planned(job, input, out);
    let (cpu, started) = (cpu_seconds(), Instant::now());
    let mut plan_job = job.clone();
    plan_job.part = Part::Plan;
    let planned = process(&plan_job, input, out);
    let plan_secs = started.elapsed().as_secs_f64();
    // When the first unit and the audio were done.
    let (first, audio_done) = (Mutex::new(None), Mutex::new(None));
    // The audio first (`None`), then the units.
    let queue = Mutex::new(std::iter::once(None).chain(plan.clone().into_iter().map(Some)));
    let audio = Mutex::new(None);
    let tracks = Mutex::new(vec![Vec::new(); plan.len()]);
    let walls = Mutex::new(Vec::new());
    // Each worker in a folder of its own, as each pod has its scratch; the stitch's gets the
    // units' pieces after.
    std::thread::scope(|s| {
        for core in 0..workers {
            let (queue, tracks, walls, first) = (&queue, &tracks, &walls, &first);
            let (audio, audio_done) = (&audio, &audio_done);
            let own = out.join(format!("worker-{core}"));
            s.spawn(move || {
                pin(first_core + core);
                let out = own.as_path();
                loop {
                    let Some(next) = queue.lock().unwrap().next() else {
                        break;
                    };
                    let Some(unit) = next else {
                        let mut audio_job = job.clone();
                        audio_job.part = Part::Audio;
                        *audio.lock().unwrap() = Some(process(&audio_job, input, out));
                        *audio_done.lock().unwrap() = Some(started.elapsed().as_secs_f64());
                        continue;
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
    let audio = audio.into_inner().unwrap().expect("the audio");
    let (Some(Analysis::Video(mut analysis)), Some(Analysis::Video(measured))) =
        (planned.analysis, audio.analysis)
    else {
        panic!("no analysis")
    };
    analysis.loudness = measured.loudness;
    let mut stitch_job = job.clone();
    stitch_job.part = Part::Stitch(Box::new(StitchInput {
        analysis,
        units: tracks.into_inner().unwrap(),
        audio: audio.tracks.into_iter().next(),
    }));
    process(&stitch_job, input, out);
    Took {
        wall: started.elapsed().as_secs_f64(),
        cpu: cpu_seconds() - cpu,
        units: walls.into_inner().unwrap(),
        plan: plan_secs,
        first_playable: first
            .into_inner()
            .unwrap()
            .expect("a first unit")
            .max(audio_done.into_inner().unwrap().expect("the audio")),
    }
}

/// When a long video first plays on a pod of two cores (`--first-playable`): the plan, then the
/// audio on core 0 beside the first unit on core 1, as two permits (or two pods) take the
/// audio's task and the first unit's, which the request sends first. Seconds from the start: (plan, audio done, first
/// unit done, first playable).
fn first_playable(job: &MediaJob, input: &Path, out: &Path) -> (f64, f64, f64, f64) {
    pin(0);
    std::fs::create_dir_all(out).unwrap();
    let first = planned(job, input, out).remove(0);
    let started = Instant::now();
    let mut plan_job = job.clone();
    plan_job.part = Part::Plan;
    process(&plan_job, input, &out.join("plan"));
    let plan = started.elapsed().as_secs_f64();
    let (audio, unit) = std::thread::scope(|s| {
        let audio = s.spawn(|| {
            let mut audio_job = job.clone();
            audio_job.part = Part::Audio;
            process(&audio_job, input, &out.join("audio"));
            started.elapsed().as_secs_f64()
        });
        let unit = s.spawn(|| {
            pin(1);
            let mut unit_job = job.clone();
            unit_job.part = Part::Unit(first);
            process(&unit_job, input, &out.join("unit"));
            started.elapsed().as_secs_f64()
        });
        (audio.join().unwrap(), unit.join().unwrap())
    });
    (plan, audio, unit, audio.max(unit))
}

/// [`first_playable`] for the clip and its first minute (cut without encoding, at a packet).
fn first_playable_report(job: &MediaJob, clip: &Path, dir: &Path) {
    let mut job = job.clone();
    job.profile.units_after_secs = 30;
    job.profile.unit_segments = arg("--unit-segments", "2").parse().unwrap();
    let short = dir.join("first-minute.mp4");
    let cut = std::process::Command::new("ffmpeg")
        .args(["-v", "error", "-y", "-i"])
        .arg(clip)
        .args(["-t", "60", "-c", "copy", "-movflags", "+faststart"])
        .arg(&short)
        .status()
        .unwrap();
    assert!(cut.success());
    let mut firsts = Vec::new();
    for (name, input) in [("1 minute", short.as_path()), ("whole clip", clip)] {
        let out = dir.join(format!("first-{}", firsts.len()));
        let (plan, audio, unit, first) = first_playable(&job, input, &out);
        println!(
            "{name}: first playable after {first:.1} s (the plan {plan:.1} s; the audio done \
             at {audio:.1} s on core 0, the first unit at {unit:.1} s on core 1)"
        );
        firsts.push(first);
        let _ = std::fs::remove_dir_all(&out);
    }
    println!(
        "first playable: the clip within {:.2} x its first minute's (goal 1.5 x)",
        firsts[1] / firsts[0]
    );
}

/// Each unit of `which` alone on core 0 (`--time-units 0,74`): whether a unit's cost depends
/// on where in the video it is.
fn time_units(job: &mut MediaJob, input: &Path, dir: &Path, which: &[u32]) {
    pin(0);
    job.profile.units_after_secs = 30;
    job.profile.unit_segments = arg("--unit-segments", "2").parse().unwrap();
    let plan = planned(job, input, dir);
    for &i in which {
        let unit = plan[i as usize].clone();
        let out = dir.join(format!("unit-{i}"));
        let mut unit_job = job.clone();
        unit_job.part = Part::Unit(unit);
        let (cpu, started) = (cpu_seconds(), Instant::now());
        process(&unit_job, input, &out);
        println!(
            "unit {i} of {}: wall {:.2} s, CPU {:.2} s",
            plan.len(),
            started.elapsed().as_secs_f64(),
            cpu_seconds() - cpu
        );
    }
}

/// The one run and the units (one worker) at the same time, one on each core, then with the
/// cores swapped (`--paired`): this machine's speed drifts by up to 1.6x from one minute to the
/// next (a virtual machine's shared cores), so figures taken one after the other compare two
/// machines. Run side by side, both see the same drift; swapping cancels a difference between
/// the cores. Each is one thread on its core, so its wall time is its CPU time.
fn paired(job: &mut MediaJob, input: &Path, dir: &Path, minutes: u32) {
    job.profile.unit_segments = arg("--unit-segments", "2").parse().unwrap();
    let mut ratios = Vec::new();
    // `--once`: one order only (a 10-minute clip takes about 15 minutes an order); with
    // `--swapped`, the other one.
    let has = |flag: &str| std::env::args().any(|a| a == flag);
    let orders = match (has("--once"), has("--swapped")) {
        (true, false) => &[(1, 0)][..],
        (true, true) => &[(0, 1)][..],
        _ => &[(1, 0), (0, 1)][..],
    };
    for &(one_core, units_core) in orders {
        let one_dir = dir.join(format!("one-{one_core}"));
        let units_dir = dir.join(format!("units-{units_core}"));
        std::fs::create_dir_all(&units_dir).unwrap();
        let (one, units) = std::thread::scope(|s| {
            let one = s.spawn(|| {
                pin(one_core);
                let mut job = job.clone();
                job.profile.units_after_secs = minutes * 60 + 1;
                let started = Instant::now();
                process(&job, input, &one_dir);
                started.elapsed().as_secs_f64()
            });
            let units = s.spawn(|| {
                let mut job = job.clone();
                job.profile.units_after_secs = 30;
                units_by(&job, input, &units_dir, 1, units_core)
            });
            (one.join().unwrap(), units.join().unwrap())
        });
        let (one_bytes, units_bytes) = (bytes(&one_dir), bytes(&units_dir));
        let mean = units.units.iter().sum::<f64>() / units.units.len() as f64;
        println!(
            "one run on core {one_core}: {one:.1} s; units on core {units_core}: {:.1} s \
             ({:.3} x; the plan {:.1} s, first playable {:.1} s, {} units of {mean:.2} s); \
             bytes {:+.2} %",
            units.wall,
            units.wall / one,
            units.plan,
            units.first_playable,
            units.units.len(),
            (units_bytes as f64 / one_bytes as f64 - 1.0) * 100.0
        );
        ratios.push(units.wall / one);
        let _ = std::fs::remove_dir_all(&one_dir);
        let _ = std::fs::remove_dir_all(&units_dir);
    }
    println!(
        "units against one run, side by side: {:.3} x (mean of both core orders)",
        ratios.iter().sum::<f64>() / ratios.len() as f64
    );
}

fn main() {
    let minutes: u32 = arg("--minutes", "10").parse().unwrap();
    let unit_segments: Vec<u32> = arg("--unit-segments", "2")
        .split(',')
        .map(|n| n.parse().unwrap())
        .collect();
    media::init(1);
    let dir = tempfile::tempdir().unwrap();
    let clip: PathBuf = match arg("--clip", "").as_str() {
        "" => {
            let keyframe_secs = Some(arg("--keyframe-secs", "")).filter(|k| !k.is_empty());
            let keyframe_secs = keyframe_secs.map(|k| k.parse().unwrap());
            synthetic::camera_like_video_keyed(dir.path(), minutes * 60, 1920, 1080, keyframe_secs)
        }
        path => PathBuf::from(path),
    };
    let settings = Settings::load_from(None, Vec::new()).unwrap();
    let mut job = settings.media_job("streaming", None);
    job.ffmpeg_threads = 1;
    if std::env::args().any(|a| a == "--paired") {
        paired(&mut job, &clip, dir.path(), minutes);
        return;
    }
    if std::env::args().any(|a| a == "--first-playable") {
        first_playable_report(&job, &clip, dir.path());
        return;
    }
    if let Some(which) = Some(arg("--time-units", "")).filter(|a| !a.is_empty()) {
        let which: Vec<u32> = which.split(',').map(|n| n.parse().unwrap()).collect();
        time_units(&mut job, &clip, dir.path(), &which);
        return;
    }

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
        let counts: Vec<usize> = arg("--workers", "1,2")
            .split(',')
            .map(|n| n.parse().unwrap())
            .collect();
        for &workers in &counts {
            let out = dir.path().join(format!("units-{segments}-{workers}"));
            std::fs::create_dir_all(&out).unwrap();
            let took = units_by(&job, &clip, &out, workers, 0);
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
                "  first playable after {:.1} s (the plan {:.1} s, then the first unit and the audio)",
                took.first_playable, took.plan
            );
            walls.push(took.wall);
            let _ = std::fs::remove_dir_all(&out);
        }
        if let [one, two] = walls[..] {
            println!(
                "units of {segments} segment(s): two workers {:.2} x faster than one",
                one / two
            );
        }
    }
    first_playable_report(&job, &clip, dir.path());
}
