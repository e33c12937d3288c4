//! Dispatch overhead: messages/s through one in-process worker (consume → dispatch → job →
//! publish → commit) when the job itself is next to nothing, and RSS while a backlog waits.
//!
//!   cargo bench --bench dispatch [-- --messages 20000 --ids 50 --broker mock|kafka]
//!
//! The broker is rdkafka's MockCluster (in-process, so the broker's own speed is not measured)
//! or Apache Kafka (one node of `scripts/kafka.sh` on loopback, as in the tests), and the
//! store is local. `--ids` tiny images are processed first; then the backlog of
//! `--messages` requests is produced before the worker starts, all for those ids, so every job
//! is answered from its stored manifest (the "no-op profile": no decode, no encode, but the
//! full storage lookup, response, publish and commit path).
//!
//! The environment applies as for the worker (`MAX_IN_FLIGHT`, `KAFKA_PROPERTY_*`). Two
//! figures: the wall time from the worker's start (including joining the group, about 3 s on
//! MockCluster) and the steady rate from the first response to the last.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use media_worker::config::Settings;
use media_worker::contract::OptimizeRequest;
use media_worker::storage::LocalStorage;
use media_worker::worker;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{DefaultProducerContext, FutureProducer};

mod util;
use util::{arg, status_mib};

#[path = "../tests/common/mod.rs"]
mod common;

/// Where the topics live.
enum Cluster {
    Mock(MockCluster<'static, DefaultProducerContext>),
    Kafka(common::Broker),
}

impl Cluster {
    fn start(kind: &str) -> Cluster {
        match kind {
            "mock" => Cluster::Mock(MockCluster::new(1).unwrap()),
            "kafka" => Cluster::Kafka(common::Broker::cluster(1)),
            other => panic!("--broker {other}: mock or kafka"),
        }
    }

    fn bootstrap(&self) -> String {
        match self {
            Cluster::Mock(c) => c.bootstrap_servers(),
            Cluster::Kafka(b) => b.bootstrap(),
        }
    }

    fn create_topic(&self, name: &str, partitions: i32) {
        match self {
            Cluster::Mock(c) => c.create_topic(name, partitions, 1).unwrap(),
            Cluster::Kafka(b) => b.create_topic(name, partitions as u32),
        }
    }
}

/// Reads `n` responses; returns how many said `replayed` and when the first one came.
fn take(reader: &BaseConsumer, n: usize) -> (usize, Instant) {
    let (mut got, mut replayed, mut first) = (0, 0, None);
    let deadline = Instant::now() + Duration::from_secs(600);
    while got < n && Instant::now() < deadline {
        if let Some(Ok(m)) = reader.poll(Duration::from_millis(100)) {
            first.get_or_insert_with(Instant::now);
            let r: serde_json::Value = serde_json::from_slice(m.payload().unwrap()).unwrap();
            assert_eq!(r["success"], true, "{r}");
            replayed += (r["replayed"] == true) as usize;
            got += 1;
        }
    }
    assert_eq!(got, n, "responses");
    (replayed, first.unwrap())
}

fn main() {
    let messages: usize = arg("--messages", "20000").parse().unwrap();
    let ids: usize = arg("--ids", "50").parse().unwrap();
    let broker = arg("--broker", "mock");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let cluster = Cluster::start(&broker);
        let tmp = tempfile::tempdir().unwrap();
        let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/corpus");
        let env = std::env::vars().chain([
            (
                "KAFKA_BOOTSTRAP_SERVERS".to_owned(),
                cluster.bootstrap(),
            ),
            ("HTTP_ADDR".to_owned(), "127.0.0.1:0".to_owned()),
            // The mock cluster's consumer group protocol stalls a run this long (15,263 of
            // 20,000); the real broker runs the default.
            (
                "KAFKA_GROUP_PROTOCOL".to_owned(),
                match cluster {
                    Cluster::Mock(_) => "classic",
                    Cluster::Kafka(_) => "consumer",
                }
                .to_owned(),
            ),
            (
                "TMP_DIR".to_owned(),
                tmp.path().join("scratch").display().to_string(),
            ),
            ("RUST_LOG".to_owned(), "warn".to_owned()),
            (
                "MEDIA_SANDBOX_PROGRAM".to_owned(),
                env!("CARGO_BIN_EXE_media-worker").to_owned(),
            ),
        ]);
        let settings = Settings::load_from(None, env).unwrap();
        let (requests, responses) = (
            settings.kafka.request_topic.clone(),
            settings.kafka.response_topic.clone(),
        );
        cluster.create_topic(&requests, 4);
        cluster.create_topic(&responses, 1);
        let max_in_flight = settings.max_in_flight();
        let storage = LocalStorage::new(tmp.path().join("store")).with_bucket("corpus", &corpus);
        let svc = media_worker::job::services(Arc::new(settings.clone()), Arc::new(storage)).unwrap();

        let producer: FutureProducer = ClientConfig::new()
            .set("bootstrap.servers", cluster.bootstrap())
            .set("linger.ms", "5")
            .create()
            .unwrap();
        let reader: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", cluster.bootstrap())
            .set("group.id", "dispatch-reader")
            .set("auto.offset.reset", "earliest")
            .create()
            .unwrap();
        reader.subscribe(&[responses.as_str()]).unwrap();
        let req = |i: usize| {
            OptimizeRequest::new(
                format!("r{i}"),
                format!("m{}", i % ids),
                "bench",
                "corpus",
                "sharp_bggn4a16.png".to_owned(), // 32x32, 2.2 kB
            )
            .with_profile("variants")
        };

        // The stored results (through the job runner directly), then the backlog, before the
        // worker runs.
        let runner = media_worker::job::JobRunner::new(svc.clone(), media_worker::shutdown::Shutdown::new());
        for i in 0..ids {
            let mut r = req(i);
            r.force = true;
            assert!(runner.run_registered(&r).await.success);
        }
        let backlog: Vec<_> = (ids..ids + messages).map(req).collect();
        common::produce_all(&producer, &requests, &backlog).await;
        let rss_before = status_mib("VmRSS:");
        let stop = media_worker::shutdown::Shutdown::new();
        let started = Instant::now();
        let running = tokio::spawn(worker::run(svc, stop.clone(), None));
        let sampler = {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut peak: f64 = 0.0;
                while !stop.is_draining() {
                    peak = peak.max(status_mib("VmRSS:"));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                peak
            })
        };
        let (replayed, first) = tokio::task::block_in_place(|| take(&reader, messages));
        let wall = started.elapsed();
        let steady = first.elapsed();
        stop.drain();
        running.await.unwrap().unwrap();
        let peak = sampler.await.unwrap();
        println!(
            "dispatch broker={broker} messages={messages} replayed={replayed} max_in_flight={max_in_flight} \
             wall={:.2}s ({:.0} msg/s incl. joining the group) steady={:.0} msg/s \
             rss_before={rss_before:.0}MiB rss_peak_during={peak:.0}MiB (goal >= 2000 msg/s)",
            wall.as_secs_f64(),
            messages as f64 / wall.as_secs_f64(),
            (messages - 1) as f64 / steady.as_secs_f64()
        );
    });
}
