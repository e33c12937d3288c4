//! Publishing under faults injected with rdkafka's MockCluster: a broker outage or a missing
//! authorisation holds the response (the worker not ready meanwhile) and never dead-letters it;
//! a response the broker rejects is dead-lettered; when the dead letter is rejected too a minimal failure response is
//! published, and when even that is rejected the message is dropped and counted; a fatal
//! producer error replaces the producer.

mod common;

use std::sync::Arc;
use std::time::Duration;

use media_worker::config::Settings;
use media_worker::health::Health;
use media_worker::kafka::Publisher;
use media_worker::kafka::producer::{Outgoing, Published};
use media_worker::telemetry::Metrics;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::Producer;
use rdkafka::types::RDKafkaRespErr;
use tokio_util::sync::CancellationToken;

const RESPONSES: &str = "responses";
const DLQ: &str = "dlq";

struct Fixture {
    cluster: MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
    publisher: Arc<Publisher>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    _scratch: tempfile::TempDir,
}

fn fixture() -> Fixture {
    fixture_with(&[])
}

fn fixture_with(extra: &[(&str, &str)]) -> Fixture {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic(RESPONSES, 1, 1).unwrap();
    cluster.create_topic(DLQ, 1, 1).unwrap();
    let env = [
        ("KAFKA_BOOTSTRAP_SERVERS", cluster.bootstrap_servers()),
        ("KAFKA_RESPONSE_TOPIC", RESPONSES.to_owned()),
        ("KAFKA_DLQ_TOPIC", DLQ.to_owned()),
        ("KAFKA_PUBLISH_ATTEMPTS", "2".to_owned()),
        ("KAFKA_PROPERTY_MESSAGE_TIMEOUT_MS", "3000".to_owned()),
    ];
    let env = env
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .chain(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let settings = Settings::load_from(None, env).unwrap();
    let (metrics, health) = (Arc::new(Metrics::new()), Arc::new(Health::new(0, 0)));
    health.set_consuming(true);
    let publisher = Publisher::new(&settings.kafka, metrics.clone(), health.clone()).unwrap();
    Fixture {
        cluster,
        publisher: Arc::new(publisher),
        metrics,
        health,
        _scratch: tempfile::tempdir().unwrap(),
    }
}

/// The broker refuses the next `records` produce requests for good: the record is invalid (a
/// broker-side validation, e.g. of its timestamp). An authorisation failure is not the record's
/// fault but the pod's, and is held instead (see tests/delivery.rs).
fn reject(f: &Fixture, records: usize) {
    f.cluster.request_errors(
        rdkafka::types::RDKafkaApiKey::Produce,
        &vec![RDKafkaRespErr::RD_KAFKA_RESP_ERR_INVALID_RECORD; records],
    );
}

/// One publish of the test record, never given up.
async fn publish(f: &Fixture) -> Published {
    f.publisher
        .publish(&outgoing(), &CancellationToken::new())
        .await
        .unwrap()
}

fn outgoing() -> Outgoing<'static> {
    Outgoing {
        key: "m1",
        payload: br#"{"status":"completed"}"#,
        traceparent: None,
        request: Some(br#"{"media_id":"m1"}"#),
        source_topic: "requests",
        source_partition: 3,
        source_offset: 42,
        fallback: br#"{"status":"failed","error":{"stage":"publish"}}"#,
    }
}

/// Every record of `topic`, as JSON.
fn read_all(
    cluster: &MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
    topic: &str,
    n: usize,
) -> Vec<serde_json::Value> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", cluster.bootstrap_servers())
        .set("group.id", format!("reader-{topic}"))
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    c.subscribe(&[topic]).unwrap();
    let mut out = Vec::new();
    for _ in 0..100 {
        if out.len() == n {
            break;
        }
        if let Some(Ok(m)) = c.poll(Duration::from_millis(200)) {
            out.push(serde_json::from_slice(m.payload().unwrap()).unwrap());
        }
    }
    out
}

#[tokio::test]
async fn an_unpublishable_response_is_dead_lettered() {
    let f = fixture();
    reject(&f, 1);
    assert_eq!(publish(&f).await, Published::DeadLettered);
    assert_eq!(f.metrics.dead_lettered.get(), 1);
    assert_eq!(
        f.metrics.publish_failures.get(),
        1,
        "a rejection is final: not retried"
    );
    let dlq = read_all(&f.cluster, DLQ, 1);
    assert_eq!(dlq.len(), 1);
    let d = &dlq[0];
    assert_eq!(
        (
            d["source"]["partition"].as_i64(),
            d["source"]["offset"].as_i64()
        ),
        (Some(3), Some(42))
    );
    assert_eq!(d["request"], r#"{"media_id":"m1"}"#);
    assert_eq!(d["response"]["status"], "completed");
    assert!(
        d["error"].as_str().unwrap().contains("InvalidRecord"),
        "{d}"
    );
    assert!(
        f.health.readiness(f._scratch.path()).ready,
        "dead-lettered is done"
    );
}

/// The broker cannot or may not take records of `topics` (`error`) while the test publishes:
/// the publish is held, the worker not ready, nothing dead-lettered or dropped; once the error
/// clears, the response itself goes out.
async fn held_until_cleared(f: &Fixture, topics: &[&str], error: RDKafkaRespErr) {
    for t in topics {
        f.cluster.topic_error(t, error).unwrap();
    }
    let (publisher, give_up) = (f.publisher.clone(), CancellationToken::new());
    let g = give_up.clone();
    let task = tokio::spawn(async move { publisher.publish(&outgoing(), &g).await });
    let scratch = f._scratch.path().to_owned();
    common::wait_until(
        "not ready while the response is held",
        Duration::from_secs(60),
        || (!f.health.readiness(&scratch).publishing).then_some(()),
    )
    .await;
    common::wait_until("retried", Duration::from_secs(60), || {
        (f.metrics.publish_failures.get() >= 2).then_some(())
    })
    .await;
    assert!(!task.is_finished(), "still holding the message");
    for t in topics {
        f.cluster
            .topic_error(t, RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR)
            .unwrap();
    }
    let r = tokio::time::timeout(Duration::from_secs(60), task)
        .await
        .expect("published once the error cleared")
        .unwrap();
    assert_eq!(r.unwrap(), Published::Response);
    assert!(f.health.readiness(&scratch).publishing, "ready again");
    assert_eq!(read_all(&f.cluster, RESPONSES, 1)[0]["status"], "completed");
    assert_eq!(f.metrics.dead_lettered.get(), 0);
    assert_eq!(f.metrics.responses_dropped.get(), 0);
}

/// A broker that cannot take the response now (its partition has no leader): retried for as
/// long as it takes, the worker not ready after `publish_attempts` failures; never a dead
/// letter. Once the broker is back the response itself goes out.
#[tokio::test]
async fn a_broker_outage_holds_the_response_and_never_dead_letters_it() {
    let f = fixture();
    let no_leader = RDKafkaRespErr::RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE;
    held_until_cleared(&f, &[RESPONSES], no_leader).await;
}

/// The worker's principal may not write the response topic (nor the dead-letter topic): the
/// pod's configuration, not the record's fault. Held like an outage, never dead-lettered; once
/// the right is granted the response itself goes out.
#[tokio::test]
async fn an_authorisation_failure_holds_the_response_until_it_is_granted() {
    let f = fixture();
    let unauthorised = RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED;
    held_until_cleared(&f, &[RESPONSES, DLQ], unauthorised).await;
}

/// A response over the broker's record limit, whose dead letter (which carries it) is too:
/// a minimal failure response with the same key stands for it.
#[tokio::test]
async fn a_response_too_large_for_the_broker_is_replaced_by_a_minimal_one() {
    let f = fixture_with(&[("KAFKA_PROPERTY_MESSAGE_MAX_BYTES", "4000")]);
    let big = format!(r#"{{"status":"completed","pad":"{}"}}"#, "x".repeat(8000));
    let out = Outgoing {
        payload: big.as_bytes(),
        ..outgoing()
    };
    let r = f.publisher.publish(&out, &CancellationToken::new()).await;
    assert_eq!(r.unwrap(), Published::Minimal);
    assert_eq!(f.metrics.minimal_responses.get(), 1);
    let got = read_all(&f.cluster, RESPONSES, 1);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0]["error"]["stage"], "publish");
    assert!(f.health.readiness(f._scratch.path()).ready);
}

/// Nothing accepted at all (response, dead letter and minimal response all rejected): the
/// message is dropped and counted, so that its partition keeps moving.
#[tokio::test]
async fn when_everything_is_rejected_the_message_is_dropped_and_counted() {
    let f = fixture();
    reject(&f, 3);
    assert_eq!(publish(&f).await, Published::Dropped);
    assert_eq!(f.metrics.responses_dropped.get(), 1);
    assert_eq!(f.metrics.publish_failures.get(), 3, "each rejected once");
    assert!(f.health.readiness(f._scratch.path()).ready);
}

#[tokio::test]
async fn a_fatal_producer_error_replaces_the_producer() {
    let f = fixture();
    let broken = f.publisher.producer();
    let reason = std::ffi::CString::new("injected by the test").unwrap();
    // SAFETY: librdkafka's test hook on a live producer handle.
    unsafe {
        rdkafka::bindings::rd_kafka_test_fatal_error(
            broken.client().native_ptr(),
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER,
            reason.as_ptr(),
        );
    }
    assert!(broken.client().fatal_error().is_some());
    assert_eq!(publish(&f).await, Published::Response);
    assert_eq!(f.metrics.producer_restarts.get(), 1);
    assert!(f.publisher.producer().client().fatal_error().is_none());
    assert_eq!(read_all(&f.cluster, RESPONSES, 1).len(), 1);
}

/// The whole worker, in process, on a MockCluster (the corpus as its source bucket).
struct InProcess {
    cluster: MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
    requests: String,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    stop: media_worker::shutdown::Shutdown,
    running: tokio::task::JoinHandle<anyhow::Result<media_worker::worker::Exit>>,
    producer: rdkafka::producer::FutureProducer,
    tmp: tempfile::TempDir,
}

impl InProcess {
    fn start(
        cluster: MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
    ) -> InProcess {
        use media_worker::storage::LocalStorage;
        let tmp = tempfile::tempdir().unwrap();
        let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/corpus");
        let env = [
            ("KAFKA_BOOTSTRAP_SERVERS", cluster.bootstrap_servers()),
            ("KAFKA_RESPONSE_TOPIC", RESPONSES.to_owned()),
            ("KAFKA_DLQ_TOPIC", DLQ.to_owned()),
            ("KAFKA_PUBLISH_ATTEMPTS", "2".to_owned()),
            ("KAFKA_PROPERTY_MESSAGE_TIMEOUT_MS", "2000".to_owned()),
            ("KAFKA_COMMIT_INTERVAL_MS", "200".to_owned()),
            ("HTTP_ADDR", "127.0.0.1:0".to_owned()),
            ("TMP_DIR", tmp.path().join("scratch").display().to_string()),
            // Sandbox children are the worker binary (this process is the test binary).
            (
                "MEDIA_SANDBOX_PROGRAM",
                env!("CARGO_BIN_EXE_media-worker").to_owned(),
            ),
        ];
        let settings = Settings::load_from(None, env.map(|(k, v)| (k.to_owned(), v))).unwrap();
        let requests = settings.kafka.request_topic.clone();
        for t in [requests.as_str(), RESPONSES, DLQ] {
            cluster.create_topic(t, 1, 1).unwrap();
        }
        let storage = LocalStorage::new(tmp.path().join("store")).with_bucket("uploads", &corpus);
        let svc = media_worker::job::services(Arc::new(settings), Arc::new(storage)).unwrap();
        let (metrics, health) = (svc.metrics.clone(), svc.health.clone());
        let stop = media_worker::shutdown::Shutdown::new();
        let running = tokio::spawn(media_worker::worker::run(svc, stop.clone(), None));
        let producer = ClientConfig::new()
            .set("bootstrap.servers", cluster.bootstrap_servers())
            .create()
            .unwrap();
        InProcess {
            cluster,
            requests,
            metrics,
            health,
            stop,
            running,
            producer,
            tmp,
        }
    }

    /// Produces request `i` (a photo of the corpus).
    async fn send(&self, i: usize) {
        use media_worker::contract::OptimizeRequest;
        use rdkafka::producer::FutureRecord;
        let req = OptimizeRequest::new(
            format!("req-{i}"),
            format!("m{i}"),
            "u1",
            "uploads",
            "pillow_flower.jpg".into(),
        );
        let payload = serde_json::to_vec(&req).unwrap();
        let record = FutureRecord::to(&self.requests)
            .key(&req.media_id)
            .payload(&payload);
        self.producer
            .send(record, Duration::from_secs(10))
            .await
            .unwrap();
    }

    /// The group's committed offset of the request partition (-1: none).
    fn committed(&self) -> i64 {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", self.cluster.bootstrap_servers())
            .set("group.id", "media-worker")
            .create()
            .unwrap();
        let mut tpl = rdkafka::TopicPartitionList::new();
        tpl.add_partition(&self.requests, 0);
        let got = c.committed_offsets(tpl, Duration::from_secs(10)).unwrap();
        match got.find_partition(&self.requests, 0).map(|e| e.offset()) {
            Some(rdkafka::Offset::Offset(o)) => o,
            _ => -1,
        }
    }

    async fn stop(self) {
        self.stop.drain();
        self.running.await.unwrap().unwrap();
    }
}

/// The whole worker, in process, against a MockCluster whose response topic has no leader for a
/// while: the answer is held (never dead-lettered), the worker is not ready and takes no new
/// work; once the topic is back every request is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_topic_outage_pauses_intake_and_loses_nothing() {
    let w = InProcess::start(MockCluster::new(1).unwrap());
    let (cluster, metrics, health) = (&w.cluster, &w.metrics, &w.health);
    cluster
        .topic_error(
            RESPONSES,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE,
        )
        .unwrap();
    w.send(0).await;
    let scratch = w.tmp.path().join("scratch");
    common::wait_until(
        "the answer held, intake paused",
        Duration::from_secs(60),
        || {
            let held = health.held_publishes() == 1 && !health.readiness(&scratch).publishing;
            (held && metrics.paused.get() == 1).then_some(())
        },
    )
    .await;
    w.send(1).await;
    w.send(2).await;
    // A negative cannot be awaited: over 2 s (10 commit intervals) nothing new is taken.
    let until = std::time::Instant::now() + Duration::from_secs(2);
    while std::time::Instant::now() < until {
        assert_eq!(metrics.requests_received.get(), 1, "taken while not ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cluster
        .topic_error(RESPONSES, RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR)
        .unwrap();
    let got = tokio::task::block_in_place(|| read_all(cluster, RESPONSES, 3));
    assert_eq!(got.len(), 3, "every request answered");
    assert!(got.iter().all(|r| r["status"] == "completed"), "{got:?}");
    assert_eq!(
        metrics.dead_lettered.get(),
        0,
        "an outage is no reason to dead-letter"
    );
    w.stop().await;
}

/// Item 6 of the delivery review: the broker rejects an offset commit (injected: a real broker
/// rejects commits only around group changes). The finished work's position is sent again,
/// though nothing new finishes on the partition, so a crash would not redo it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_commit_is_sent_again() {
    use rdkafka::types::RDKafkaApiKey;
    let w = InProcess::start(MockCluster::new(1).unwrap());
    // The next three commits are refused, each with an error librdkafka does not retry.
    w.cluster.request_errors(
        RDKafkaApiKey::OffsetCommit,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_INVALID_COMMIT_OFFSET_SIZE; 3],
    );
    w.send(0).await;
    let got = tokio::task::block_in_place(|| read_all(&w.cluster, RESPONSES, 1));
    assert_eq!(got.len(), 1, "answered");
    common::wait_until("the position committed", Duration::from_secs(30), || {
        (tokio::task::block_in_place(|| w.committed()) == 1).then_some(())
    })
    .await;
    assert!(
        w.metrics.commit_failures.get() >= 3,
        "the rejections were not seen: {}",
        w.metrics.commit_failures.get()
    );
    w.stop().await;
}
