//! Images beside a fanned-out video (issue 45): the latency of 20 image requests while a long
//! video's units are encoded on every worker, against the same images on an idle fleet. Goal:
//! p95 while busy at most 2x p95 when idle.
//!
//!   cargo bench --bench fairness [-- --workers 2 --images 20 --minutes 4 --pool 1]
//!
//! The fleet is as `tests/units.rs` runs it: an Apache Kafka node (`scripts/kafka.sh`), s3s-fs,
//! `--workers` worker processes in one group with a unit topic, a pool of `--pool` permits each
//! (1: one-core pods, the tests' shape) and the worker's other defaults (its `veryfast` preset;
//! they share this machine's cores). The video is a `--minutes` 1280x720 camera-like clip
//! (`tests/common/synthetic.rs`) under the `streaming` profile, past its `units_after_secs`
//! (set to 60): units of 8 s on the unit topic. The images are the corpus's small photos
//! (`../shared/corpus`, MANIFEST.tsv kinds `photo` and `faces`, under 300 kB) under the default
//! profile, the same files in the same order in both phases.
//!
//! 1. **Idle**: after one warm-up image per request partition (not counted), `--images`
//!    requests one at a time: each sent once the previous one is answered.
//! 2. **Busy**: the video is sent; once a worker logs its plan ("video planned as units") and
//!    every worker has begun a unit (its log says it read its part of the source), the same
//!    images one at a time again.
//!
//! A latency is from just before the request is produced to its response read from the
//! response topic. Percentiles are nearest-rank (p95 of 20: the 19th). Every request must get
//! exactly one response, not failed, and every busy image must be answered before the video
//! (otherwise it did not run beside the units: take a longer `--minutes`); the figures are
//! printed before those checks.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use media_worker::contract::{OptimizeRequest, Status};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;

mod util;
use util::{arg, corpus_files};

#[path = "../tests/common/mod.rs"]
mod common;

/// Every response read, by key: when it came and its status.
#[derive(Default)]
struct Answers {
    by_key: HashMap<String, Vec<(Instant, Status)>>,
}

impl Answers {
    /// Reads responses until one for `key` comes (within 10 minutes); when it came.
    fn until(&mut self, responses: &common::Responses, key: &str) -> Instant {
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            if let Some((at, _)) = self.by_key.get(key).and_then(|v| v.first()) {
                return *at;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let r = responses
                .next(left)
                .unwrap_or_else(|| panic!("no response to {key} within 10 minutes"));
            self.by_key
                .entry(r.key)
                .or_default()
                .push((Instant::now(), r.body.status));
        }
    }
}

/// `req` produced through `producer`, to `partition` if given (keyed by media id either way).
async fn produce(
    producer: &FutureProducer,
    topic: &str,
    req: &OptimizeRequest,
    partition: Option<i32>,
) {
    let payload = serde_json::to_vec(req).unwrap();
    let mut record = FutureRecord::to(topic).key(&req.media_id).payload(&payload);
    if let Some(p) = partition {
        record = record.partition(p);
    }
    producer
        .send(record, Timeout::After(Duration::from_secs(30)))
        .await
        .map_err(|(e, _)| e)
        .unwrap();
}

/// The images one at a time, each sent once the one before is answered: their latencies (s).
async fn one_at_a_time(
    stack: &common::Stack,
    producer: &FutureProducer,
    responses: &common::Responses,
    answers: &mut Answers,
    images: &[OptimizeRequest],
) -> Vec<f64> {
    let mut took = Vec::new();
    for req in images {
        let sent = Instant::now();
        produce(producer, &stack.request_topic, req, None).await;
        let at = tokio::task::block_in_place(|| answers.until(responses, &req.media_id));
        took.push(at.duration_since(sent).as_secs_f64());
    }
    took
}

/// Nearest-rank percentile `p` (0-100) of `v`.
fn percentile(v: &[f64], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = ((p / 100.0 * s.len() as f64).ceil() as usize).clamp(1, s.len());
    s[rank - 1]
}

fn summary(v: &[f64]) -> String {
    format!(
        "p50 {:.2} s  p95 {:.2} s  max {:.2} s  (n={})",
        percentile(v, 50.0),
        percentile(v, 95.0),
        percentile(v, 100.0),
        v.len()
    )
}

/// Whether worker `log` shows a unit begun: a part of the source read after the plan, if it
/// made the plan (the plan reads parts too), else at all (images read whole sources).
fn unit_begun(log: &str) -> bool {
    let after_plan = log
        .find("video planned as units")
        .map_or(log, |at| &log[at..]);
    after_plan.contains("part of the source downloaded")
}

fn main() {
    let workers: usize = arg("--workers", "2").parse().unwrap();
    let n: usize = arg("--images", "20").parse().unwrap();
    let minutes: f64 = arg("--minutes", "4").parse().unwrap();
    let pool: usize = arg("--pool", "1").parse().unwrap();
    let secs = (minutes * 60.0).round() as u32;
    assert!(secs > 60, "--minutes: more than 1, to be split into units");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run(workers, n, secs, pool));
}

async fn run(workers: usize, n: usize, secs: u32, pool: usize) {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let request_partitions = 2 * workers as u32;
    let stack = common::Stack::on(common::Broker::cluster(1), request_partitions).await;
    let unit_topic = stack.own("media.optimize.units");
    stack.broker.create_topic(&unit_topic, 3 * workers as u32);

    let dir = tempfile::tempdir().unwrap();
    let made = Instant::now();
    let video = common::synthetic::camera_like_video(dir.path(), secs, 1280, 720);
    eprintln!(
        "{secs} s 720p clip made in {:.0} s",
        made.elapsed().as_secs_f64()
    );
    stack.upload_file("long.mp4", &video).await;
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/corpus");
    let photos: Vec<String> = corpus_files(&corpus, &["photo", "faces"])
        .into_iter()
        .filter(|f| std::fs::metadata(corpus.join(f)).is_ok_and(|m| m.len() < 300_000))
        .collect();
    assert!(
        !photos.is_empty(),
        "no small photos in {}",
        corpus.display()
    );
    for p in &photos {
        stack.upload_corpus(p).await;
    }
    let image =
        |phase: &str, i: usize| common::request(&format!("{phase}-{i}"), &photos[i % photos.len()]);

    let mut env = stack.worker_env("fairness");
    env.insert("KAFKA_UNIT_TOPIC".into(), unit_topic);
    env.insert("WORKER_POOL_SIZE".into(), pool.to_string());
    env.insert(
        "MEDIA_WORKER_PROFILES__STREAMING__UNITS_AFTER_SECS".into(),
        "60".into(),
    );
    let fleet = common::Worker::fleet(&env, workers).await;
    let producer = stack.producer();
    let responses = stack.responses();
    let mut answers = Answers::default();

    // Warm-up: one image on every request partition, so every worker has run one job.
    let warm: Vec<_> = (0..request_partitions as usize)
        .map(|i| image("warm", i))
        .collect();
    for (p, req) in warm.iter().enumerate() {
        produce(&producer, &stack.request_topic, req, Some(p as i32)).await;
    }
    for req in &warm {
        tokio::task::block_in_place(|| answers.until(&responses, &req.media_id));
    }

    let idle_reqs: Vec<_> = (0..n).map(|i| image("idle", i)).collect();
    let idle = one_at_a_time(&stack, &producer, &responses, &mut answers, &idle_reqs).await;

    let mut long = common::request("long", "long.mp4");
    long.profile = Some("streaming".into());
    let video_sent = Instant::now();
    produce(&producer, &stack.request_topic, &long, None).await;
    common::wait_until("a unit begun on every worker", 10 * common::MINUTE, || {
        let logs: Vec<String> = fleet.iter().map(|w| w.log()).collect();
        (logs.iter().any(|l| l.contains("video planned as units"))
            && logs.iter().all(|l| unit_begun(l)))
        .then_some(())
    })
    .await;
    let busy_from = video_sent.elapsed().as_secs_f64();
    let busy_reqs: Vec<_> = (0..n).map(|i| image("busy", i)).collect();
    let busy = one_at_a_time(&stack, &producer, &responses, &mut answers, &busy_reqs).await;
    let busy_until = video_sent.elapsed().as_secs_f64();
    let video_at = tokio::task::block_in_place(|| answers.until(&responses, "long"));
    let video_took = video_at.duration_since(video_sent).as_secs_f64();
    // Late duplicates, if any, come within this.
    while let Some(r) = responses.next(Duration::from_secs(5)) {
        answers
            .by_key
            .entry(r.key)
            .or_default()
            .push((Instant::now(), r.body.status));
    }

    let units: usize = fleet
        .iter()
        .map(|w| w.log().matches("unit landed").count())
        .sum();
    let before_video = busy_reqs
        .iter()
        .filter(|r| answers.by_key[&r.media_id][0].0 < video_at)
        .count();
    let ratio = percentile(&busy, 95.0) / percentile(&idle, 95.0);
    println!(
        "fairness workers={workers} pool={pool} images={n} ({} photos) video={secs}s 1280x720, \
         load before: {}",
        photos.len(),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!("  idle fleet: {}", summary(&idle));
    println!("  busy fleet: {}", summary(&busy));
    println!("  p95 busy / idle = {ratio:.2}x (goal <= 2x)");
    println!(
        "  video: answered after {video_took:.1} s, {units} units landed; images sent from \
         {busy_from:.1} s to {busy_until:.1} s, {before_video} of {n} answered before the video"
    );

    // Exactly one response to every request, not failed.
    let sent: Vec<&OptimizeRequest> = warm
        .iter()
        .chain(&idle_reqs)
        .chain(&busy_reqs)
        .chain([&long])
        .collect();
    for req in &sent {
        let got = answers.by_key.get(&req.media_id).map_or(0, Vec::len);
        assert_eq!(got, 1, "{} responses to {}", got, req.media_id);
        let status = answers.by_key[&req.media_id][0].1;
        assert_ne!(status, Status::Failed, "{}", req.media_id);
    }
    assert_eq!(
        answers.by_key.len(),
        sent.len(),
        "responses to unknown keys"
    );
    assert_eq!(
        before_video, n,
        "busy images answered after the video: take a longer --minutes"
    );
}
