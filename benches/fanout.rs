//! A long video through Kafka and S3 on one and on two one-core workers (issue 55): what the
//! fan-out over the unit topic buys, as users run it.
//!
//!   cargo bench --bench fanout [-- --minutes 4 --height 720 --workers 1,2 --videos 1
//!                                 --protocols consumer,classic --until-playable
//!                                 --clip-dir DIR --logs DIR]
//!
//! Per group protocol and per worker count: an Apache Kafka node of its own
//! (`scripts/kafka.sh`), s3s-fs, request and unit topics of 4 partitions each (as
//! docs/operations.md says to make them), a progress topic; the workers with their defaults but
//! a pool of one, each started under `taskset -c i` (a one-core pod: it and its ffmpeg run on
//! core `i`, and it sizes itself for one core). The video is a `--minutes` camera-like clip
//! (`tests/common/synthetic.rs`, `--height` lines, 16:9), made once, under the `streaming`
//! profile (past its `units_after_secs`: units of 8 s). `--videos N` sends N requests for it
//! at once (each its own source object, so its own plan): several long videos sharing the
//! fleet, where each plan's placement over the partitions decides who waits for whom.
//!
//! - **wall**: from just before the requests are produced to the last response read from the
//!   response topic (every one completed);
//! - **CPU**: user + system time of the workers and everything they started, from the bench's
//!   `RUSAGE_CHILDREN` once every worker has stopped (SIGTERM, drained);
//! - **first playable**: the Kafka timestamp of the first progress event that names the early
//!   master playlist (written once the lowest rung's first segment and the audio are in S3),
//!   from the request's production, per video;
//! - **units**: landed per worker (their logs).
//!
//! `--until-playable` stops each run at the first playable event (for a long `--minutes`,
//! whose whole encode would take long); wall and CPU are then not measured. `--clip-dir` keeps
//! the clip there and uses it again (a 20-minute one takes minutes to make); `--logs` writes
//! each run's worker logs there (`{protocol}-{workers}w-{i}.log`), for the timeline of a run.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use media_worker::contract::Status;

mod util;
use util::arg;

#[path = "../tests/common/mod.rs"]
mod common;

/// Request and unit topics' partitions, as a new user makes them (issue 55's run).
const PARTITIONS: u32 = 4;

struct Run {
    protocol: String,
    workers: usize,
    wall: Option<f64>,
    cpu: Option<f64>,
    /// Per video, in the order sent.
    first_playable: Vec<f64>,
    units: Vec<usize>,
    /// The unit partitions each worker was assigned (its log).
    held: Vec<Vec<i64>>,
}

fn main() {
    let minutes: f64 = arg("--minutes", "4").parse().unwrap();
    let height: u32 = arg("--height", "720").parse().unwrap();
    let counts: Vec<usize> = arg("--workers", "1,2")
        .split(',')
        .map(|n| n.parse().unwrap())
        .collect();
    let protocols: Vec<String> = arg("--protocols", "consumer,classic")
        .split(',')
        .map(str::to_owned)
        .collect();
    let videos: usize = arg("--videos", "1").parse().unwrap();
    let until_playable = std::env::args().any(|a| a == "--until-playable");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(
        counts.iter().all(|&n| n <= cores),
        "one core per worker: at most {cores}"
    );
    let secs = (minutes * 60.0).round() as u32;
    let width = (height * 16 / 9) & !1;
    let dir = tempfile::tempdir().unwrap();
    let clip_dir = match arg("--clip-dir", "") {
        kept if !kept.is_empty() => std::path::PathBuf::from(kept),
        _ => dir.path().to_owned(),
    };
    let logs = Some(arg("--logs", ""))
        .filter(|d| !d.is_empty())
        .map(std::path::PathBuf::from);
    let made = Instant::now();
    let name = format!("camera-like-{secs}s-{width}x{height}.mp4");
    let clip = match clip_dir.join(&name) {
        kept if kept.exists() => kept,
        _ => common::synthetic::camera_like_video(&clip_dir, secs, width, height),
    };
    eprintln!(
        "{secs} s {width}x{height} clip made in {:.0} s",
        made.elapsed().as_secs_f64()
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut runs = Vec::new();
    for protocol in &protocols {
        for &n in &counts {
            let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
            eprintln!("{protocol}, {n} worker(s); load before: {}", load.trim());
            let fleet = Fleet {
                protocol,
                workers: n,
                videos,
                until_playable,
                logs: logs.as_deref(),
            };
            let run = rt.block_on(run(&fleet, &clip));
            report(&run);
            runs.push(run);
        }
    }
    println!(
        "fanout: {videos} x {secs} s {width}x{height} clip at once, streaming profile, request \
         and unit topics of {PARTITIONS} partitions, one core per worker"
    );
    println!(
        "| protocol | workers | wall s | CPU s | first playable s (each video) | units per worker |"
    );
    println!("| --- | ---: | ---: | ---: | --- | --- |");
    for r in &runs {
        let f = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1}"));
        let playable: Vec<String> = r.first_playable.iter().map(|s| format!("{s:.1}")).collect();
        println!(
            "| {} | {} | {} | {} | {} | {:?} |",
            r.protocol,
            r.workers,
            f(r.wall),
            f(r.cpu),
            playable.join(" / "),
            r.units
        );
    }
    for protocol in &protocols {
        let wall = |n: usize| {
            runs.iter()
                .find(|r| &r.protocol == protocol && r.workers == n)
                .and_then(|r| r.wall)
        };
        if let (Some(one), Some(two)) = (wall(1), wall(2)) {
            println!(
                "{protocol}: two workers {:.2}x one (goal >= 1.8x)",
                one / two
            );
        }
    }
}

fn report(r: &Run) {
    eprintln!(
        "  wall {:?} s, CPU {:?} s, first playable {:.1?} s, units {:?}, unit partitions {:?}",
        r.wall, r.cpu, r.first_playable, r.units, r.held
    );
}

/// CPU seconds (user + system) of this process's waited-for children and theirs.
fn children_cpu() -> f64 {
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a zeroed out-struct for getrusage.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut u) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

fn millis_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// One run's fleet and what it is sent.
struct Fleet<'a> {
    protocol: &'a str,
    workers: usize,
    videos: usize,
    until_playable: bool,
    logs: Option<&'a Path>,
}

async fn run(spec: &Fleet<'_>, clip: &Path) -> Run {
    let Fleet {
        protocol, workers, ..
    } = *spec;
    let mut stack = common::Stack::on(common::Broker::cluster(1), PARTITIONS).await;
    stack.group_protocol = protocol.to_owned();
    let unit_topic = stack.own("media.optimize.units");
    stack.broker.create_topic(&unit_topic, PARTITIONS);
    let progress_topic = stack.own("media.optimize.progress");
    stack.broker.create_topic(&progress_topic, 1);
    let media: Vec<String> = (0..spec.videos).map(|v| format!("long-{v}")).collect();
    for m in &media {
        stack.upload_file(&format!("{m}.mp4"), clip).await;
    }
    let mut env: HashMap<String, String> = stack.worker_env("fanout");
    env.insert("KAFKA_UNIT_TOPIC".into(), unit_topic);
    env.insert("KAFKA_PROGRESS_TOPIC".into(), progress_topic.clone());
    env.insert("WORKER_POOL_SIZE".into(), "1".into());
    // The tests' short backoff is not what users run.
    env.remove("RETRY_BASE_MS");
    let cpu_before = children_cpu();
    let mut fleet: Vec<common::Worker> = (0..workers)
        .map(|i| {
            let mut env = env.clone();
            env.insert("WORKER_ID".into(), format!("worker-{i}"));
            common::Worker::start_on_cpu(&env, i)
        })
        .collect();
    for w in &fleet {
        w.ready().await;
    }
    // Every worker holds unit partitions before the video comes (a fleet that was up).
    common::wait_until("every worker assigned", 2 * common::MINUTE, || {
        fleet
            .iter()
            .all(|w| w.log().contains("\"lane\":\"units\""))
            .then_some(())
    })
    .await;
    let responses = stack.responses();
    let sent_ms = millis_now();
    let sent = Instant::now();
    for m in &media {
        let mut req = common::request(m, &format!("{m}.mp4"));
        req.profile = Some("streaming".into());
        stack.send(&req).await;
    }
    // Each video's first event naming its early master, from the requests' production.
    let playable = |stack: &common::Stack| {
        let events = stack.records(&progress_topic);
        media
            .iter()
            .map(|m| {
                events
                    .iter()
                    .find(|(key, e, _)| key == m && !e["playable"].is_null())
                    .map(|(_, _, at)| (at - sent_ms) as f64 / 1000.0)
            })
            .collect::<Option<Vec<f64>>>()
    };
    let (wall, first_playable) = if spec.until_playable {
        let first =
            common::wait_until("first playable", 10 * common::MINUTE, || playable(&stack)).await;
        (None, first)
    } else {
        let mut answered = Vec::new();
        while answered.len() < media.len() {
            let r = tokio::task::block_in_place(|| responses.next(Duration::from_secs(3600)))
                .expect("a response within an hour");
            assert!(media.contains(&r.key), "{}", r.key);
            assert_eq!(r.body.status, Status::Completed, "{:?}", r.body.error);
            assert!(!answered.contains(&r.key), "{} answered twice", r.key);
            answered.push(r.key);
        }
        let wall = sent.elapsed().as_secs_f64();
        (Some(wall), playable(&stack).expect("a playable event each"))
    };
    let units = fleet
        .iter()
        .map(|w| w.log().matches("unit landed").count())
        .collect();
    let held = fleet
        .iter()
        .map(|w| {
            w.log()
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .map(|l| l["fields"].clone())
                .filter(|f| f["message"] == "partition assigned" && f["lane"] == "units")
                .filter_map(|f| f["partition"].as_i64())
                .collect()
        })
        .collect();
    if let Some(dir) = spec.logs {
        std::fs::create_dir_all(dir).unwrap();
        for (i, w) in fleet.iter().enumerate() {
            let at = dir.join(format!("{protocol}-{workers}w-{i}.log"));
            std::fs::write(at, w.log()).unwrap();
        }
    }
    for w in &mut fleet {
        w.sigterm();
    }
    for w in &mut fleet {
        w.exited(2 * common::MINUTE).await;
    }
    let cpu = children_cpu() - cpu_before;
    Run {
        protocol: protocol.to_owned(),
        workers,
        wall,
        cpu: wall.map(|_| cpu),
        first_playable,
        units,
        held,
    }
}
