//! Publishing under faults injected with rdkafka's MockCluster: a response that cannot be
//! published is dead-lettered; when the dead-letter topic fails too the message is held and
//! the worker is not ready until it goes through; a fatal producer error replaces the producer.

mod common;

use std::sync::Arc;
use std::time::Duration;

use media_worker::config::Settings;
use media_worker::kafka::Publisher;
use media_worker::kafka::producer::{Outgoing, Published};
use media_worker::telemetry::{Health, Metrics};
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
    let settings = Settings::load_from(None, env.map(|(k, v)| (k.to_owned(), v))).unwrap();
    let (metrics, health) = (Arc::new(Metrics::new()), Arc::new(Health::new(0)));
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

fn outgoing() -> Outgoing<'static> {
    Outgoing {
        key: "m1",
        payload: br#"{"status":"completed"}"#,
        traceparent: None,
        request: Some(br#"{"media_id":"m1"}"#),
        source_topic: "requests",
        source_partition: 3,
        source_offset: 42,
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
    f.cluster
        .topic_error(
            RESPONSES,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED,
        )
        .unwrap();
    let r = f
        .publisher
        .publish(&outgoing(), &CancellationToken::new())
        .await;
    assert_eq!(r.unwrap(), Published::DeadLettered);
    assert_eq!(f.metrics.dead_lettered.get(), 1);
    assert!(
        f.metrics.publish_failures.get() >= 2,
        "two response attempts first"
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
        d["error"]
            .as_str()
            .unwrap()
            .to_lowercase()
            .contains("authoriz"),
        "{d}"
    );
    assert!(
        f.health.readiness(f._scratch.path()).ready,
        "dead-lettered is done"
    );
}

#[tokio::test]
async fn when_nothing_can_be_published_the_worker_is_not_ready_until_it_can() {
    let f = fixture();
    for t in [RESPONSES, DLQ] {
        f.cluster
            .topic_error(
                t,
                RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED,
            )
            .unwrap();
    }
    let (publisher, give_up) = (f.publisher.clone(), CancellationToken::new());
    let g = give_up.clone();
    let task = tokio::spawn(async move { publisher.publish(&outgoing(), &g).await });
    let scratch = f._scratch.path().to_owned();
    common::wait_until(
        "not ready while the message is stuck",
        Duration::from_secs(15),
        || (!f.health.readiness(&scratch).publishing).then_some(()),
    )
    .await;
    assert!(!task.is_finished(), "still holding the message");
    // The broker lets us write again: the held response goes out.
    f.cluster
        .topic_error(RESPONSES, RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR)
        .unwrap();
    let r = tokio::time::timeout(Duration::from_secs(60), task)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.unwrap(), Published::Response);
    assert!(f.health.readiness(&scratch).publishing, "ready again");
    assert_eq!(read_all(&f.cluster, RESPONSES, 1).len(), 1);
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
    let r = f
        .publisher
        .publish(&outgoing(), &CancellationToken::new())
        .await;
    assert_eq!(r.unwrap(), Published::Response);
    assert_eq!(f.metrics.producer_restarts.get(), 1);
    assert!(f.publisher.producer().client().fatal_error().is_none());
    assert_eq!(read_all(&f.cluster, RESPONSES, 1).len(), 1);
}
