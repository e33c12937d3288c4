//! The span tree of a job, exported to an in-memory exporter: the real worker in-process
//! (consumer, runner, publisher) against rdkafka's MockCluster and a local store.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use media_worker::config::Settings;
use media_worker::contract::OptimizeRequest;
use media_worker::storage::LocalStorage;
use media_worker::telemetry::traces;
use media_worker::worker;
use opentelemetry::Value;
use opentelemetry::trace::Status;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use tracing_subscriber::prelude::*;

const GOOD_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const BAD_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const PRODUCER_SPAN: &str = "00f067aa0ba902b7";
const API_TRACE: &str = "5cf92f3577b34da6a3ce929d0e0e4799";

/// Keeps every finished span. (The SDK's own `InMemorySpanExporter` is behind its `testing`
/// feature, which turns on its metrics, logs and runtimes: the tests would then build the SDK,
/// and what depends on it, apart from the release binary's.)
#[derive(Clone, Debug, Default)]
struct Collected(Arc<Mutex<Vec<SpanData>>>);

impl SpanExporter for Collected {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        self.0.lock().unwrap().extend(batch);
        Ok(())
    }
}

fn attr(span: &SpanData, key: &str) -> Option<Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.clone())
}

/// The spans of one trace, by name (each name once per trace here).
fn tree(spans: &[SpanData], trace: &str) -> HashMap<String, SpanData> {
    spans
        .iter()
        .filter(|s| s.span_context.trace_id().to_string() == trace)
        .map(|s| (s.name.to_string(), s.clone()))
        .collect()
}

fn child_of(spans: &HashMap<String, SpanData>, child: &str, parent: &str) {
    let c = spans
        .get(child)
        .unwrap_or_else(|| panic!("no {child} span"));
    let p = spans
        .get(parent)
        .unwrap_or_else(|| panic!("no {parent} span"));
    assert_eq!(
        c.parent_span_id,
        p.span_context.span_id(),
        "{child} is a child of {parent}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_is_one_span_tree_that_continues_the_producers_trace() {
    let exporter = Collected::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    tracing_subscriber::registry()
        .with(traces::layer(&provider))
        .init();

    let cluster = MockCluster::new(1).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/corpus");
    let api: std::net::SocketAddr = format!("127.0.0.1:{}", common::free_port())
        .parse()
        .unwrap();
    let env = [
        ("KAFKA_BOOTSTRAP_SERVERS", cluster.bootstrap_servers()),
        ("HTTP_ADDR", "127.0.0.1:0".to_owned()),
        ("API_ADDR", api.to_string()),
        ("TMP_DIR", tmp.path().join("scratch").display().to_string()),
        // Sandbox children are the worker binary (this process is the test binary).
        (
            "MEDIA_SANDBOX_PROGRAM",
            env!("CARGO_BIN_EXE_media-worker").to_owned(),
        ),
    ];
    let settings = Settings::load_from(None, env.map(|(k, v)| (k.to_owned(), v))).unwrap();
    let (requests, responses) = (
        settings.kafka.request_topic.clone(),
        settings.kafka.response_topic.clone(),
    );
    cluster.create_topic(&requests, 1, 1).unwrap();
    cluster.create_topic(&responses, 1, 1).unwrap();
    let storage = LocalStorage::new(tmp.path().join("store")).with_bucket("uploads", &corpus);
    let svc = media_worker::job::services(Arc::new(settings), Arc::new(storage)).unwrap();
    let stop = media_worker::shutdown::Shutdown::new();
    let running = tokio::spawn(worker::run(svc, stop.clone(), None));

    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", cluster.bootstrap_servers())
        .create()
        .unwrap();
    for (media_id, key, trace) in [
        ("good", "rails_racecar.jpg", GOOD_TRACE),
        ("missing", "no-such-file.jpg", BAD_TRACE),
    ] {
        let req = OptimizeRequest::new(
            format!("req-{media_id}"),
            media_id.to_owned(),
            "u1",
            "uploads",
            key.to_owned(),
        );
        let payload = serde_json::to_vec(&req).unwrap();
        let tp = format!("00-{trace}-{PRODUCER_SPAN}-01");
        let headers = OwnedHeaders::new().insert(Header {
            key: "traceparent",
            value: Some(tp.as_str()),
        });
        producer
            .send(
                FutureRecord::to(&requests)
                    .key(media_id)
                    .payload(&payload)
                    .headers(headers),
                Timeout::Never,
            )
            .await
            .unwrap();
    }

    let reader: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", cluster.bootstrap_servers())
        .set("group.id", "trace-reader")
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    reader.subscribe(&[responses.as_str()]).unwrap();
    let mut sent: HashMap<String, String> = HashMap::new();
    let sent = common::wait_for("both responses published", Duration::from_secs(120), || {
        let polled = tokio::task::block_in_place(|| reader.poll(Duration::from_millis(200)));
        if let Some(Ok(m)) = polled {
            let key = String::from_utf8_lossy(m.key().unwrap()).into_owned();
            let tp = m
                .headers()
                .and_then(|h| h.iter().find(|h| h.key == "traceparent"))
                .and_then(|h| h.value)
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .expect("the response carries a traceparent");
            sent.insert(key, tp);
        }
        (sent.len() == 2).then(|| sent.clone())
    });
    // A job through the API: its server span continues the caller's traceparent.
    let req = OptimizeRequest::new(
        "req-api".into(),
        "api".into(),
        "u1",
        "uploads",
        "rails_racecar.jpg".into(),
    );
    let tp = format!("00-{API_TRACE}-{PRODUCER_SPAN}-01");
    let a = tokio::task::block_in_place(|| {
        common::wait_for("the API listening", Duration::from_secs(30), || {
            std::net::TcpStream::connect(api).ok()
        });
        common::http::post(
            api,
            "/transcode",
            &[("traceparent", &tp)],
            &serde_json::to_vec(&req).unwrap(),
        )
    });
    assert_eq!(a.status, 200);
    stop.drain();
    running.await.unwrap().unwrap();
    provider.force_flush().unwrap();
    let spans = exporter.0.lock().unwrap().clone();

    let good = tree(&spans, GOOD_TRACE);
    let root = &good["media.process_event"];
    assert_eq!(
        root.parent_span_id.to_string(),
        PRODUCER_SPAN,
        "continues the producer's span"
    );
    assert_eq!(attr(root, "event.s3_key"), Some("rails_racecar.jpg".into()));
    assert_eq!(attr(root, "media.type"), Some("image".into()));
    assert_eq!(attr(root, "processing.success"), Some(true.into()));
    assert_eq!(attr(root, "job.retry_count"), Some(0i64.into()));
    assert_eq!(attr(root, "messaging.system"), Some("kafka".into()));
    assert_eq!(
        attr(root, "messaging.operation.type"),
        Some("process".into())
    );
    assert_eq!(
        attr(root, "messaging.destination.name"),
        Some(requests.clone().into())
    );
    assert_eq!(
        attr(root, "messaging.destination.partition.id"),
        Some("0".into())
    );
    assert_eq!(
        attr(root, "messaging.consumer.group.name"),
        Some("media-worker".into())
    );
    assert!(matches!(
        attr(root, "messaging.kafka.offset"),
        Some(Value::I64(0 | 1))
    ));
    assert_eq!(attr(root, "error.code"), None);
    assert_eq!(attr(root, "error.type"), None);
    assert_eq!(root.status, Status::Unset);
    child_of(&good, "media.process_job_with_retry", "media.process_event");
    child_of(&good, "media.process_job", "media.process_job_with_retry");
    // The media stages run in a sandbox child; their spans are made from its stage events.
    for stage in [
        "media.download",
        "media.probe",
        "media.analyze",
        "media.transform",
        "media.upload",
    ] {
        child_of(&good, stage, "media.process_job");
    }
    child_of(&good, "kafka.send_processing_result", "media.process_event");
    let publish = &good["kafka.send_processing_result"];
    assert_eq!(
        sent["good"],
        format!("00-{GOOD_TRACE}-{}-01", publish.span_context.span_id()),
        "the response's traceparent is the publish span"
    );

    let by_api = tree(&spans, API_TRACE);
    let server = &by_api["POST /transcode"];
    assert_eq!(server.parent_span_id.to_string(), PRODUCER_SPAN);
    assert_eq!(attr(server, "http.route"), Some("/transcode".into()));
    assert_eq!(
        attr(server, "http.response.status_code"),
        Some(200i64.into())
    );
    assert_eq!(server.status, Status::Unset);
    child_of(&by_api, "media.process_job_with_retry", "POST /transcode");
    child_of(&by_api, "media.transform", "media.process_job");

    let bad = tree(&spans, BAD_TRACE);
    let root = &bad["media.process_event"];
    assert_eq!(attr(root, "processing.success"), Some(false.into()));
    assert_eq!(attr(root, "error.code"), Some("source_not_found".into()));
    assert_eq!(attr(root, "error.type"), Some("source_not_found".into()));
    assert!(
        matches!(root.status, Status::Error { .. }),
        "{:?}",
        root.status
    );
    let send = &bad["kafka.send_processing_result"];
    assert_eq!(attr(send, "messaging.operation.type"), Some("send".into()));
    child_of(&bad, "media.download", "media.process_job");
    assert!(
        !bad.contains_key("image.compress"),
        "no work after a failed download"
    );
}
