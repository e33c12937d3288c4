//! Fleet delivery under faults: worker processes in one consumer group against a 3-node Apache
//! Kafka cluster (replication factor 3, `min.insync.replicas=2`) and a real S3 server (s3s-fs),
//! a 4-partition request topic, one scenario per fault.
//!
//! Every scenario produces its requests up front (a backlog: the workers are under load the
//! whole time), injects its fault when a given share of the responses has arrived, and then
//! asserts what the product promises:
//! - every request got a final success response;
//! - every output a response lists exists in S3 and decodes;
//! - no partition was owned by two workers at once (from their `partition assigned` and
//!   `partition revoked` log lines);
//! - requests processed to completion more than once (counted from the `job finished` log
//!   lines of every worker, killed ones included) ≤ what the workers a fault hit may hold
//!   (`MAX_IN_FLIGHT` each, a fixed ceiling from their configuration); none at all, and no
//!   request answered twice, in a rolling restart (every worker drains);
//! - every other repeated response was answered from the stored manifest (`replayed`).
//!
//! Every scenario runs under both group protocols (`classic::...`, `consumer::...`).
//!
//! Each scenario prints one `fleet ...` line with its figures (handovers: seconds from a
//! partition's revoke to its next assignment). `FLEET_REQUESTS` sets the
//! requests per scenario: 60 in `make test`, 300 in `make test-fleet`. Scenarios run one at a
//! time (each starts its own broker, S3 server and workers).

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use futures_util::StreamExt;
use media_worker::contract::OptimizeRequest;
use media_worker::media::vips::Image;

/// Small corpus photos (the jobs are real, with analysis, just short).
const IMAGES: [&str; 8] = [
    "sharp_bggn4a16.png",
    "sharp_5_webp_a.webp",
    "imageio_chelsea.png",
    "imageio_coffee.png",
    "imageio_astronaut.png",
    "sharp_Landscape_1.jpg",
    "pillow_hopper_orientation_6.webp",
    "face_recognition_obama.jpg",
];
const PARTITIONS: u32 = 4;
const DONE_WITHIN: Duration = Duration::from_secs(15 * 60);
/// Messages a worker holds dispatched and unfinished (`MAX_IN_FLIGHT`; pool 1): the most a
/// fault to it can make complete twice.
const MAX_IN_FLIGHT: usize = 2;

/// One scenario at a time: each runs three or more workers on this machine's cores.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn requests_per_scenario() -> usize {
    std::env::var("FLEET_REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60)
}

/// Reads responses on a thread of its own, timestamped, while the scenario runs.
struct Collector {
    got: Arc<Mutex<Vec<(Instant, Received)>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Collector {
    fn start(responses: Responses) -> Collector {
        let got = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let thread = {
            let (got, stop) = (got.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if let Some(r) = responses.next(Duration::from_millis(200)) {
                        got.lock().unwrap().push((Instant::now(), r));
                    }
                }
            })
        };
        Collector {
            got,
            stop,
            thread: Some(thread),
        }
    }

    fn count(&self) -> usize {
        self.got.lock().unwrap().len()
    }

    /// Distinct media ids answered with success (panics at the first failure response: none
    /// is expected, and waiting for the missing success would only time out).
    fn succeeded(&self) -> usize {
        assert!(
            !self.thread.as_ref().is_some_and(|t| t.is_finished()),
            "the response reader stopped"
        );
        let got = self.got.lock().unwrap();
        if let Some((_, r)) = got.iter().find(|(_, r)| !r.body.success) {
            panic!("{} failed: {:?}", r.key, r.body.error);
        }
        let mut ids: Vec<_> = got
            .iter()
            .filter(|(_, r)| r.body.success)
            .map(|(_, r)| r.key.as_str())
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids.len()
    }

    fn finish(mut self) -> Vec<(Instant, Received)> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        std::mem::take(&mut self.got.lock().unwrap())
    }
}

/// Workers, the requests and what the faults did.
struct Fleet {
    _one_at_a_time: tokio::sync::MutexGuard<'static, ()>,
    name: &'static str,
    protocol: &'static str,
    stack: Stack,
    env: HashMap<String, String>,
    workers: Vec<Worker>,
    /// Stopped or killed workers, kept for their logs.
    retired: Vec<Worker>,
    collector: Collector,
    requests: Vec<OptimizeRequest>,
    /// Workers a fault hit, summed over the faults.
    hit_by_faults: usize,
    /// The scenario promises that no request completes twice (a drain-only fault).
    no_repeats: bool,
    /// Workers killed with SIGKILL.
    killed: usize,
    started: Instant,
}

impl Fleet {
    /// Starts `workers` workers, produces the scenario's backlog and waits until `share` of it
    /// is answered: the moment of the fault.
    async fn under_load(
        name: &'static str,
        protocol: &'static str,
        workers: usize,
        share: f64,
    ) -> Fleet {
        let mut fleet = Fleet::start(name, protocol, workers).await;
        fleet.send(requests_per_scenario()).await;
        fleet.wait_share(share).await;
        fleet
    }

    async fn start(name: &'static str, protocol: &'static str, workers: usize) -> Fleet {
        let one_at_a_time = SERIAL.lock().await;
        let mut stack = Stack::on(Broker::cluster(3), PARTITIONS).await;
        stack.group_protocol = protocol.to_owned();
        for image in IMAGES {
            stack.upload_corpus(image).await;
        }
        let mut env = stack.worker_env(&format!("fleet-{name}"));
        // Production retry policy (the harness default shortens backoff for other tests).
        env.remove("RETRY_BASE_MS");
        env.insert("WORKER_POOL_SIZE".into(), "1".into());
        env.insert("MAX_IN_FLIGHT".into(), MAX_IN_FLIGHT.to_string());
        env.insert(
            "RUST_LOG".into(),
            "info,librdkafka=warn,rdkafka=warn".into(),
        );
        let collector = Collector::start(stack.responses());
        let mut fleet = Fleet {
            _one_at_a_time: one_at_a_time,
            name,
            protocol,
            stack,
            env,
            workers: Vec::new(),
            retired: Vec::new(),
            collector,
            requests: Vec::new(),
            hit_by_faults: 0,
            no_repeats: false,
            killed: 0,
            started: Instant::now(),
        };
        for _ in 0..workers {
            fleet.add_worker();
        }
        for w in &fleet.workers {
            w.ready().await;
        }
        fleet
    }

    fn add_worker(&mut self) {
        self.workers.push(Worker::start(&self.env));
    }

    /// Produces the whole backlog.
    async fn send(&mut self, n: usize) {
        self.requests = (0..n)
            .map(|i| request(&format!("{}-{i}", self.name), IMAGES[i % IMAGES.len()]))
            .collect();
        self.started = Instant::now();
        self.stack.send_all(&self.requests).await;
    }

    /// Waits until `share` of the requests have a success response.
    async fn wait_share(&self, share: f64) {
        let want = (self.requests.len() as f64 * share).ceil() as usize;
        wait_until("responses", DONE_WITHIN, || {
            (self.collector.succeeded() >= want).then_some(())
        })
        .await;
    }

    fn note_hit(&mut self) {
        self.hit_by_faults += 1;
    }

    fn note_all_hit(&mut self) {
        self.hit_by_faults += self.workers.len();
    }

    fn kill9(&mut self, i: usize) {
        let mut w = self.workers.remove(i);
        self.killed += 1;
        self.note_hit();
        w.kill9();
        self.retired.push(w);
    }

    /// The fault of a rolling restart or a scale-in: SIGTERM to worker `i`.
    async fn stop(&mut self, i: usize) {
        let w = self.workers.remove(i);
        self.note_hit();
        self.retire(w).await;
    }

    /// SIGTERM: the worker drains and exits 0.
    async fn retire(&mut self, mut w: Worker) {
        w.sigterm();
        let status = w.exited(Duration::from_secs(60)).await;
        assert!(status.success(), "a drained worker exits 0: {status}");
        self.retired.push(w);
    }

    /// Everything answered, workers stopped, every response read: checks and figures.
    async fn finish(mut self) {
        let n = self.requests.len();
        wait_until("every request answered with success", DONE_WITHIN, || {
            (self.collector.succeeded() >= n).then_some(())
        })
        .await;
        let all_done = self.started.elapsed();
        // All drain at once (a scale-in to zero), each exits 0.
        let mut last = std::mem::take(&mut self.workers);
        for w in &mut last {
            w.sigterm();
        }
        for mut w in last {
            let status = w.exited(Duration::from_secs(60)).await;
            assert!(status.success(), "a drained worker exits 0: {status}");
            self.retired.push(w);
        }
        // The stopped workers flushed their producers: read up to the topic's end.
        let published = self.stack.response_count() as usize;
        wait_until(
            "every published response read",
            Duration::from_secs(60),
            || (self.collector.count() >= published).then_some(()),
        )
        .await;
        let got = self.collector.finish();
        assert_eq!(got.len(), published);

        // One final success per request; no failure at all.
        let mut by_id: BTreeMap<&str, Vec<&Received>> = BTreeMap::new();
        for (_, r) in &got {
            by_id.entry(r.key.as_str()).or_default().push(r);
        }
        for req in &self.requests {
            let rs = by_id
                .get(req.media_id.as_str())
                .unwrap_or_else(|| panic!("no response for {}", req.media_id));
            for r in rs {
                assert!(r.body.success, "{}: {:?}", req.media_id, r.body.error);
            }
        }
        assert_eq!(by_id.len(), n, "responses only for the requests sent");

        // Every output of every response exists and decodes.
        let outputs: Vec<(String, String)> = got
            .iter()
            .flat_map(|(_, r)| r.body.outputs.iter())
            .map(|o| (o.bucket.clone(), o.key.clone()))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let stack = &self.stack;
        let decoded = futures_util::stream::iter(outputs.iter())
            .map(|(bucket, key)| async move {
                let bytes = stack.get(bucket, key).await.0;
                tokio::task::spawn_blocking(move || decodes(&bytes))
                    .await
                    .unwrap()
            })
            .buffer_unordered(8)
            .collect::<Vec<bool>>()
            .await;
        let undecodable = decoded.iter().filter(|ok| !**ok).count();
        assert_eq!(undecodable, 0, "of {} outputs", outputs.len());

        // FLEET_LOGS=DIR keeps every worker's log for a look afterwards.
        if let Ok(dir) = std::env::var("FLEET_LOGS") {
            std::fs::create_dir_all(&dir).unwrap();
            for (i, w) in self.retired.iter().enumerate() {
                let path = format!("{dir}/{}-{i}.log", self.name);
                std::fs::write(path, w.log()).unwrap();
            }
        }
        // Repeats: processed twice vs answered from the manifest.
        let logs: Vec<Vec<Line>> = self.retired.iter().map(lines).collect();
        let done = completions(&logs);
        let mut per_id: HashMap<&str, usize> = HashMap::new();
        for c in &done {
            *per_id.entry(c.media_id.as_str()).or_default() += 1;
        }
        let completed_twice: usize = per_id.values().map(|c| c.saturating_sub(1)).sum();
        // A partition's owners never overlap: a Kafka coordinator moves it only after its
        // owner revoked it (or was evicted).
        let doubled = double_ownership(&logs);
        let duplicates = got.len() - n;
        let replayed = got.iter().filter(|(_, r)| r.body.replayed).count();
        let repeated_not_replayed: usize = by_id
            .values()
            .map(|rs| {
                rs.iter()
                    .filter(|r| !r.body.replayed)
                    .count()
                    .saturating_sub(1)
            })
            .sum();
        let longest_gap = got
            .windows(2)
            .map(|w| w[1].0 - w[0].0)
            .max()
            .unwrap_or_default();
        let handovers = handovers(&logs);
        let handover_max = handovers.iter().copied().fold(0.0, f64::max);
        println!(
            "fleet scenario={} protocol={} requests={n} all_succeeded_after={:.1}s \
             throughput={:.1} req/s responses={} duplicates={duplicates} replayed={replayed} \
             completed_twice={completed_twice} workers_hit={} \
             longest_gap_between_responses={:.1}s handovers={} handover_max={handover_max:.2}s \
             outputs_decoded={}",
            self.name,
            self.protocol,
            all_done.as_secs_f64(),
            n as f64 / all_done.as_secs_f64(),
            got.len(),
            self.hit_by_faults,
            longest_gap.as_secs_f64(),
            handovers.len(),
            outputs.len(),
        );
        assert!(
            doubled.is_empty(),
            "partitions owned by two workers at once: {doubled:?}"
        );
        let ceiling = if self.no_repeats {
            0
        } else {
            self.hit_by_faults * MAX_IN_FLIGHT
        };
        assert!(
            completed_twice <= ceiling,
            "completed twice {completed_twice} > {ceiling} ({} workers hit, {MAX_IN_FLIGHT} \
             messages in flight each at most)",
            self.hit_by_faults
        );
        if self.no_repeats {
            assert_eq!(duplicates, 0, "no request answered twice");
        }
        // Each answering attempt (a `job finished` line, logged before its publish) lands on the
        // response topic once: no publish lost, none doubled by a retry. A killed worker may
        // have logged a job it never published.
        let attempts = logs
            .iter()
            .flatten()
            .filter(|l| l.fields["message"] == "job finished")
            .count();
        if self.killed == 0 {
            assert_eq!(got.len(), attempts, "responses vs answering attempts");
        } else {
            assert!(
                got.len() <= attempts,
                "{} responses > {attempts} attempts",
                got.len()
            );
        }
        assert!(
            repeated_not_replayed <= completed_twice,
            "a repeated response not from the manifest ({repeated_not_replayed}) for a job \
             completed once"
        );
        // The log count misses only jobs whose worker was killed between writing the manifest
        // and logging: those were answered from the manifest alone.
        for req in &self.requests {
            let logged = per_id.contains_key(req.media_id.as_str());
            let only_replayed = by_id[req.media_id.as_str()].iter().all(|r| r.body.replayed);
            assert!(
                logged || only_replayed,
                "{} neither completed in a worker's log nor replayed",
                req.media_id
            );
        }
    }
}

fn decodes(bytes: &[u8]) -> bool {
    media_worker::media::vips::init(1);
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), bytes).unwrap();
    Image::open(f.path()).and_then(|i| i.into_memory()).is_ok()
}

/// One log line of a worker: its RFC 3339 UTC timestamp (fixed width, so it orders as text)
/// and its fields.
struct Line {
    at: String,
    fields: serde_json::Value,
}

fn lines(w: &Worker) -> Vec<Line> {
    w.log()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|v| Line {
            at: v["timestamp"].as_str().unwrap_or_default().to_owned(),
            fields: v["fields"].clone(),
        })
        .collect()
}

/// A job processed to completion (not answered from the manifest).
struct Completion {
    media_id: String,
}

fn completions(logs: &[Vec<Line>]) -> Vec<Completion> {
    logs.iter()
        .flatten()
        .filter(|l| {
            let f = &l.fields;
            f["message"] == "job finished" && f["replayed"] == false && f["status"] != "failed"
        })
        .map(|l| Completion {
            media_id: l.fields["media_id"].as_str().unwrap_or_default().to_owned(),
        })
        .collect()
}

/// (partition, from, to)
type Span = (i64, String, String);

/// Seconds from each `partition revoked` to the next `partition assigned` of that partition on
/// any worker: how long a rebalance leaves the partition without a consumer.
fn handovers(logs: &[Vec<Line>]) -> Vec<f64> {
    let mut events: Vec<(&str, i64, bool)> = logs
        .iter()
        .flatten()
        .filter_map(|l| {
            let p = l.fields["partition"].as_i64()?;
            match l.fields["message"].as_str()? {
                "partition assigned" => Some((l.at.as_str(), p, true)),
                "partition revoked" => Some((l.at.as_str(), p, false)),
                _ => None,
            }
        })
        .collect();
    events.sort_unstable();
    let secs = |at: &str| {
        humantime::parse_rfc3339_weak(at)
            .map(|t| {
                t.duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_secs_f64()
            })
            .unwrap_or_default()
    };
    let mut revoked: HashMap<i64, &str> = HashMap::new();
    let mut out = Vec::new();
    for (at, p, assigned) in events {
        if !assigned {
            revoked.insert(p, at);
        } else if let Some(from) = revoked.remove(&p) {
            out.push(secs(at) - secs(from));
        }
    }
    out
}

/// Times when the broker had given a partition to two workers at once: for each partition, the
/// overlaps of the workers' ownership (from `partition assigned` to `partition revoked`, or
/// the worker's last line when it was killed). A correct group coordinator never does this (a
/// partition moves only after its owner revoked it); some Kafka-API servers do when members
/// join, and then both owners process the same messages.
fn double_ownership(logs: &[Vec<Line>]) -> Vec<Span> {
    let spans: Vec<Vec<Span>> = logs
        .iter()
        .map(|log| {
            let end = log.last().map(|l| l.at.clone()).unwrap_or_default();
            let mut open: HashMap<i64, String> = HashMap::new();
            let mut mine = Vec::new();
            for l in log {
                let Some(p) = l.fields["partition"].as_i64() else {
                    continue;
                };
                match l.fields["message"].as_str() {
                    Some("partition assigned") => {
                        open.entry(p).or_insert_with(|| l.at.clone());
                    }
                    Some("partition revoked") => {
                        if let Some(from) = open.remove(&p) {
                            mine.push((p, from, l.at.clone()));
                        }
                    }
                    _ => {}
                }
            }
            mine.extend(open.into_iter().map(|(p, from)| (p, from, end.clone())));
            mine
        })
        .collect();
    let mut both = Vec::new();
    for (i, a) in spans.iter().enumerate() {
        for b in &spans[i + 1..] {
            for (pa, fa, ta) in a {
                for (pb, fb, tb) in b {
                    let (from, to) = (fa.max(fb), ta.min(tb));
                    if pa == pb && from < to {
                        both.push((*pa, from.clone(), to.clone()));
                    }
                }
            }
        }
    }
    both
}

/// kill -9 one worker mid-run; a replacement starts 5 s later. Repeats: at most what the killed
/// worker held ([`MAX_IN_FLIGHT`]).
async fn kill_9_a_worker(protocol: &'static str) {
    let mut fleet = Fleet::under_load("kill9", protocol, 3, 0.3).await;
    fleet.kill9(0);
    // The fault: the worker stays down for 5 s.
    tokio::time::sleep(Duration::from_secs(5)).await;
    fleet.add_worker();
    fleet.finish().await;
}

/// Rolling restart: SIGTERM each worker in turn under load and start a new one. Each drains
/// what it holds before its partitions move: no request is answered twice.
async fn rolling_restart(protocol: &'static str) {
    let mut fleet = Fleet::under_load("rolling", protocol, 3, 0.15).await;
    for _ in 0..3 {
        fleet.stop(0).await;
        fleet.add_worker();
        fleet.workers.last().unwrap().ready().await;
    }
    fleet.no_repeats = true;
    fleet.finish().await;
}

/// kill -9 the broker that leads the response topic and some of the request partitions (4
/// partitions over 3 nodes: each node leads one or two), under load: the leaders of both, and
/// perhaps the group coordinator, fail over to the other two nodes, which keep
/// `min.insync.replicas`. The responses being published meanwhile (acks=all, idempotence)
/// land once per answering attempt: `finish` counts them against the workers' log lines.
async fn kill_9_the_leading_broker(protocol: &'static str) {
    let mut fleet = Fleet::under_load("leader", protocol, 3, 0.3).await;
    let node = fleet.stack.broker.leaders(&fleet.stack.response_topic)[0];
    let requests_led = fleet
        .stack
        .broker
        .leaders(&fleet.stack.request_topic)
        .iter()
        .filter(|l| **l == node)
        .count();
    assert!(requests_led > 0, "node {node} leads request partitions too");
    fleet.note_all_hit();
    fleet.stack.broker.kill_node(node);
    fleet.finish().await;
}

/// One broker stopped (a controlled shutdown) for 30 s, then started again.
async fn one_broker_down_30_s(protocol: &'static str) {
    let mut fleet = Fleet::under_load("broker30", protocol, 3, 0.3).await;
    fleet.note_all_hit();
    fleet.stack.broker.stop_node(2);
    // The fault: the node stays down for 30 s.
    tokio::time::sleep(Duration::from_secs(30)).await;
    fleet.stack.broker.start_node(2);
    fleet.finish().await;
}

/// The S3 server is down for 20 s mid-run.
async fn s3_down_20_s(protocol: &'static str) {
    let mut fleet = Fleet::under_load("s3", protocol, 3, 0.3).await;
    fleet.note_all_hit();
    fleet.stack.s3.stop();
    // The fault: S3 stays down for 20 s.
    tokio::time::sleep(Duration::from_secs(20)).await;
    fleet.stack.s3.restart();
    fleet.finish().await;
}

/// The response topic refuses every record for 30 s mid-run while the request topic serves:
/// it asks for all three replicas in sync (`min.insync.replicas` 3, the request topic 2) and
/// one node is stopped for 30 s, so each produce of a response is answered
/// NOT_ENOUGH_REPLICAS, a failure another try may cure. The answers wait (their offsets held,
/// the worker's intake paused), and once the topic takes records again every request is
/// answered once, none dead-lettered or failed.
async fn response_topic_unavailable_30_s(protocol: &'static str) {
    let mut fleet = Fleet::under_load("responses30", protocol, 3, 0.3).await;
    let topic = fleet.stack.response_topic.clone();
    let broker = &fleet.stack.broker;
    broker.set_topic_config(&topic, &[("min.insync.replicas", "3")]);
    fleet.note_all_hit();
    fleet.stack.broker.stop_node(2);
    // The fault is in force: a record of our own (acks=all) is refused.
    let probe: rdkafka::producer::FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", fleet.stack.broker.bootstrap())
        .set("acks", "all")
        .set("message.timeout.ms", "3000")
        .create()
        .unwrap();
    let refused = probe
        .send(
            rdkafka::producer::FutureRecord::to(&topic)
                .key("probe")
                .payload("{}"),
            Duration::from_secs(10),
        )
        .await;
    assert!(refused.is_err(), "the response topic still takes records");
    // A response waiting for the topic pauses its worker's intake.
    let outage = Instant::now();
    wait_until("intake paused", Duration::from_secs(30), || {
        fleet
            .workers
            .iter()
            .any(|w| w.metric("media_worker_kafka_paused") == Some(1.0))
            .then_some(())
    })
    .await;
    // The fault: the topic stays unavailable for 30 s.
    tokio::time::sleep(Duration::from_secs(30).saturating_sub(outage.elapsed())).await;
    fleet.stack.broker.start_node(2);
    // Every request answered successfully on the response topic, once per answering attempt.
    fleet.finish().await;
}

/// Scale 1 → 3 → 1 under load.
async fn scale_1_3_1(protocol: &'static str) {
    let mut fleet = Fleet::under_load("scale", protocol, 1, 0.2).await;
    fleet.add_worker();
    fleet.add_worker();
    for w in &fleet.workers {
        w.ready().await;
    }
    fleet.wait_share(0.6).await;
    fleet.stop(2).await;
    fleet.stop(1).await;
    fleet.finish().await;
}

/// Each scenario under both group protocols: `classic::...` and `consumer::...`.
macro_rules! under_both_protocols {
    ($($scenario:ident),* $(,)?) => {
        mod classic {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                super::$scenario("classic").await
            })*
        }
        mod consumer {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                super::$scenario("consumer").await
            })*
        }
    };
}

under_both_protocols!(
    kill_9_a_worker,
    rolling_restart,
    kill_9_the_leading_broker,
    one_broker_down_30_s,
    s3_down_20_s,
    response_topic_unavailable_30_s,
    scale_1_3_1,
);
