//! A broker and an S3 server together, with the buckets and topics a test needs.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use aws_sdk_s3::Client as S3Client;
use media_worker::contract::OptimizeRequest;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use super::broker::close_within;
use super::*;

/// A broker, an S3 server with the source and output buckets, and topic and group names of this
/// stack's own (the end-to-end tests share one Kafka node per run).
pub struct Stack {
    pub broker: Broker,
    pub s3: S3,
    pub s3c: S3Client,
    pub request_topic: String,
    pub response_topic: String,
    /// `KAFKA_GROUP_PROTOCOL` of the workers: `MEDIA_TEST_GROUP_PROTOCOL`, else the default.
    pub group_protocol: String,
    ns: String,
}

impl Stack {
    /// The run's shared Kafka node, one S3 server.
    pub async fn start(request_partitions: u32) -> Stack {
        Stack::on(Broker::shared(), request_partitions).await
    }

    /// On `broker` (a cluster of several nodes, for the fleet).
    pub async fn on(broker: Broker, request_partitions: u32) -> Stack {
        let s3 = S3::start();
        let s3c = s3.client().await;
        for b in [SOURCE_BUCKET, OUTPUT_BUCKET] {
            s3c.create_bucket().bucket(b).send().await.unwrap();
        }
        let ns = format!("{:08x}", fastrand::u32(..));
        let request_topic = format!("media.optimize.request.{ns}");
        let response_topic = format!("media.optimize.response.{ns}");
        broker.create_topic(&request_topic, request_partitions);
        broker.create_topic(&response_topic, 1);
        Stack {
            broker,
            s3,
            s3c,
            request_topic,
            response_topic,
            group_protocol: std::env::var("MEDIA_TEST_GROUP_PROTOCOL")
                .unwrap_or_else(|_| "consumer".into()),
            ns,
        }
    }

    /// `name` made this stack's own: a topic or a consumer group no other test on the shared
    /// broker uses.
    pub fn own(&self, name: &str) -> String {
        format!("{name}.{}", self.ns)
    }

    /// Uploads a corpus file as `uploads/{name}`.
    pub async fn upload_corpus(&self, name: &str) {
        self.upload_file(name, &corpus(name)).await;
    }

    /// Uploads a file as `uploads/{key}`.
    pub async fn upload_file(&self, key: &str, path: &Path) {
        let body = aws_sdk_s3::primitives::ByteStream::from_path(path)
            .await
            .unwrap();
        self.s3c
            .put_object()
            .bucket(SOURCE_BUCKET)
            .key(key)
            .body(body)
            .send()
            .await
            .unwrap();
    }

    pub async fn get(&self, bucket: &str, key: &str) -> (Vec<u8>, Option<String>, Option<String>) {
        let o = self
            .s3c
            .get_object()
            .bucket(bucket)
            .key(key)
            .send()
            .await
            .unwrap();
        let ct = o.content_type().map(str::to_owned);
        let cc = o.cache_control().map(str::to_owned);
        (
            o.body.collect().await.unwrap().into_bytes().to_vec(),
            ct,
            cc,
        )
    }

    /// Fetches an HLS master playlist (output `master_key`) and every playlist and segment it
    /// leads to into `local`, keeping their relative paths; how many objects (each GET must
    /// succeed: the object exists).
    pub async fn fetch_hls(&self, master_key: &str, local: &Path) -> usize {
        let (prefix, master) = master_key.rsplit_once('/').unwrap();
        let mut pending = vec![master.to_owned()];
        let mut fetched = 0;
        while let Some(name) = pending.pop() {
            let (bytes, _, _) = self.get(OUTPUT_BUCKET, &format!("{prefix}/{name}")).await;
            let path = local.join(&name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &bytes).unwrap();
            fetched += 1;
            if name.ends_with(".m3u8") {
                let base = Path::new(&name).parent().unwrap();
                for line in String::from_utf8(bytes).unwrap().lines() {
                    let uri = match line.split_once("URI=\"") {
                        Some((_, rest)) => rest.split('"').next().unwrap(),
                        None if !line.starts_with('#') && !line.is_empty() => line,
                        None => continue,
                    };
                    pending.push(base.join(uri).to_string_lossy().into_owned());
                }
            }
        }
        fetched
    }

    pub fn worker_env(&self, group: &str) -> HashMap<String, String> {
        let mut env = HashMap::new();
        let mut set = |k: &str, v: &str| {
            env.insert(k.to_owned(), v.to_owned());
        };
        set("KAFKA_BOOTSTRAP_SERVERS", &self.broker.bootstrap());
        set("KAFKA_GROUP_ID", &self.own(group));
        set("KAFKA_REQUEST_TOPIC", &self.request_topic);
        set("KAFKA_RESPONSE_TOPIC", &self.response_topic);
        set("KAFKA_DLQ_TOPIC", &self.own("media.optimize.dlq"));
        set("KAFKA_GROUP_PROTOCOL", &self.group_protocol);
        set("KAFKA_PROPERTY_MAX_POLL_INTERVAL_MS", "20000");
        if self.group_protocol == "classic" {
            // Heartbeats at a third of the session timeout, as Kafka advises. Under the consumer
            // protocol the broker sets both (scripts/kafka.sh: 6 s and 1 s).
            set("KAFKA_PROPERTY_SESSION_TIMEOUT_MS", "6000");
            set("KAFKA_PROPERTY_HEARTBEAT_INTERVAL_MS", "2000");
        }
        set("KAFKA_COMMIT_INTERVAL_MS", "200");
        set("AWS_ENDPOINT_URL_S3", &self.s3.endpoint());
        set("AWS_ACCESS_KEY_ID", ACCESS_KEY);
        set("AWS_SECRET_ACCESS_KEY", SECRET_KEY);
        set("AWS_REGION", "us-east-1");
        set("S3_FORCE_PATH_STYLE", "true");
        set("S3_TIMEOUT_SECS", "5");
        set("OUTPUT_BUCKET", OUTPUT_BUCKET);
        set("RETRY_BASE_MS", "50");
        set("RUST_LOG", "info,librdkafka=warn,rdkafka=warn");
        env
    }

    pub fn producer(&self) -> FutureProducer {
        ClientConfig::new()
            .set("bootstrap.servers", self.broker.bootstrap())
            .create()
            .unwrap()
    }

    pub async fn send_raw(&self, key: &str, payload: &[u8], traceparent: Option<&str>) {
        let mut headers = OwnedHeaders::new();
        if let Some(tp) = traceparent {
            headers = headers.insert(Header {
                key: "traceparent",
                value: Some(tp),
            });
        }
        let record = FutureRecord::to(&self.request_topic)
            .key(key)
            .payload(payload)
            .headers(headers);
        self.producer()
            .send(record, Timeout::After(Duration::from_secs(30)))
            .await
            .map_err(|(e, _)| e)
            .unwrap();
    }

    pub async fn send(&self, req: &OptimizeRequest) {
        self.send_raw(&req.media_id, &serde_json::to_vec(req).unwrap(), None)
            .await;
    }

    /// Sends many requests through one producer.
    pub async fn send_all(&self, reqs: &[OptimizeRequest]) {
        produce_all(&self.producer(), &self.request_topic, reqs).await;
    }

    /// How many responses the (single-partition) response topic holds: its high watermark.
    pub fn response_count(&self) -> i64 {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", self.broker.bootstrap())
            .create()
            .unwrap();
        let (_, high) = c
            .fetch_watermarks(&self.response_topic, 0, Duration::from_secs(10))
            .unwrap();
        high
    }

    /// Every record of partition 0 of `topic`, from the start to its high watermark: (key,
    /// JSON payload, create time in ms).
    pub fn records(&self, topic: &str) -> Vec<(String, serde_json::Value, i64)> {
        use rdkafka::Message;
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", self.broker.bootstrap())
            .set("group.id", format!("reader-{}", fastrand::u64(..)))
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        let (_, high) = c
            .fetch_watermarks(topic, 0, Duration::from_secs(10))
            .unwrap();
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, 0, Offset::Beginning)
            .unwrap();
        c.assign(&tpl).unwrap();
        let mut got = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while (got.len() as i64) < high {
            assert!(
                std::time::Instant::now() < deadline,
                "read {} of {high} records of {topic}",
                got.len()
            );
            if let Some(Ok(m)) = c.poll(Duration::from_millis(100)) {
                got.push((
                    String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned(),
                    serde_json::from_slice(m.payload().expect("payload")).expect("JSON"),
                    m.timestamp().to_millis().expect("create time"),
                ));
            }
        }
        close_within(c, "topic reader");
        got
    }

    /// Reads the response topic from the start.
    pub fn responses(&self) -> Responses {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", self.broker.bootstrap())
            .set("group.id", format!("reader-{}", fastrand::u64(..)))
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        c.subscribe(&[self.response_topic.as_str()]).unwrap();
        Responses { consumer: Some(c) }
    }

    /// The group's committed offset for each partition of the request topic (-1: none).
    pub fn committed(&self, group: &str, partitions: i32) -> Vec<i64> {
        self.committed_on(&self.request_topic, group, partitions)
    }

    /// The group's committed offset for each partition of `topic` (-1: none).
    pub fn committed_on(&self, topic: &str, group: &str, partitions: i32) -> Vec<i64> {
        self.committed_by(topic, &self.own(group), partitions)
    }

    /// [`Stack::committed_on`] for a group named `group_id` as it is.
    fn committed_by(&self, topic: &str, group_id: &str, partitions: i32) -> Vec<i64> {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", self.broker.bootstrap())
            .set("group.id", group_id)
            .create()
            .unwrap();
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition(topic, p);
        }
        let got = c.committed_offsets(tpl, Duration::from_secs(10)).unwrap();
        close_within(c, "offset reader");
        (0..partitions)
            .map(|p| match got.find_partition(topic, p).map(|e| e.offset()) {
                Some(Offset::Offset(o)) => o,
                _ => -1,
            })
            .collect()
    }

    /// How many records of `topic` (its `partitions`) the group has not committed: those it
    /// has yet to take or to finish.
    pub fn uncommitted(&self, topic: &str, group: &str, partitions: i32) -> i64 {
        self.uncommitted_by(topic, &self.own(group), partitions)
    }

    /// [`Stack::uncommitted`] of the unit topic by the unit group of workers in `group` (the
    /// worker's default: the request group's id and `.units`).
    pub fn uncommitted_units(&self, topic: &str, group: &str, partitions: i32) -> i64 {
        self.uncommitted_by(topic, &format!("{}.units", self.own(group)), partitions)
    }

    fn uncommitted_by(&self, topic: &str, group_id: &str, partitions: i32) -> i64 {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", self.broker.bootstrap())
            .create()
            .unwrap();
        let committed = self.committed_by(topic, group_id, partitions);
        let left = (0..partitions)
            .map(|p| {
                let (low, high) = c
                    .fetch_watermarks(topic, p, Duration::from_secs(10))
                    .unwrap();
                high - committed[p as usize].max(low)
            })
            .sum();
        close_within(c, "watermark reader");
        left
    }
}

pub fn request(media_id: &str, source_key: &str) -> OptimizeRequest {
    OptimizeRequest::new(
        format!("req-{media_id}"),
        media_id.to_owned(),
        "user-1",
        SOURCE_BUCKET,
        source_key.to_owned(),
    )
}
