//! The Kafka side: tansu, and clients that send requests and read responses.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use media_worker::contract::{OptimizeRequest, OptimizeResponse};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;

use super::*;

/// tansu with sqlite storage in its own directory.
pub struct Broker {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Broker {
    pub fn start() -> Broker {
        let mut b = Broker {
            port: free_port(),
            dir: tempfile::tempdir().unwrap(),
            child: None,
        };
        b.restart();
        b
    }

    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// (Re)starts on the same port and data (tansu keeps data and offsets in sqlite).
    pub fn restart(&mut self) {
        self.stop();
        let url = format!("tcp://127.0.0.1:{}", self.port);
        let mut cmd = Command::new("tansu");
        cmd.current_dir(self.dir.path()).args([
            "broker",
            "--listener-url",
            &url,
            "--advertised-listener-url",
            &url,
            "--storage-engine",
            "sqlite://tansu.db",
        ]);
        let log = self.dir.path().join("tansu.log");
        let mut child = spawn(&mut cmd, &log);
        wait_port(self.port, &mut child, "tansu", &log);
        // An open port does not prove the broker serves: wait for an answer to a metadata request.
        let probe: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", self.bootstrap())
            .create()
            .unwrap();
        wait_for("tansu answering", Duration::from_secs(60), || {
            probe.fetch_metadata(None, Duration::from_secs(2)).ok()
        });
        self.child = Some(child);
    }

    pub fn stop(&mut self) {
        stop_child(&mut self.child);
    }

    pub fn create_topic(&self, name: &str, partitions: u32) {
        let log = self.dir.path().join(format!("create-{name}.log"));
        let mut child = Command::new("tansu")
            .args([
                "topic",
                "create",
                name,
                "--partitions",
                &partitions.to_string(),
            ])
            .args(["--broker", &format!("tcp://127.0.0.1:{}", self.port)])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let status = wait_for("tansu topic create", Duration::from_secs(60), || {
            child.try_wait().unwrap()
        });
        assert!(
            status.success(),
            "tansu topic create {name}: {status}\n{}",
            log_tail(&log)
        );
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.stop();
        report_if_panicking("tansu", &self.dir.path().join("tansu.log"));
    }
}

/// Sends requests to `topic`, keyed by media id, all at once.
pub async fn produce_all(producer: &FutureProducer, topic: &str, reqs: &[OptimizeRequest]) {
    let sends = reqs.iter().map(|r| {
        let payload = serde_json::to_vec(r).unwrap();
        async move {
            let record = FutureRecord::to(topic).key(&r.media_id).payload(&payload);
            producer
                .send(record, Timeout::After(Duration::from_secs(30)))
                .await
                .map_err(|(e, _)| e)
                .unwrap();
        }
    });
    futures_util::future::join_all(sends).await;
}

/// A response as read from Kafka.
#[derive(Debug, Clone)]
pub struct Received {
    pub key: String,
    pub body: OptimizeResponse,
    pub traceparent: Option<String>,
}

/// Drops an rdkafka client on a thread of its own and waits for it at most 10 s. A consumer
/// with a group id polls in its drop until librdkafka reports it closed, without a bound
/// (rust-rdkafka #509); a test must fail, never hang.
pub(super) fn close_within<T: Send + 'static>(client: T, what: &'static str) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(client);
        let _ = tx.send(());
    });
    if rx.recv_timeout(Duration::from_secs(10)).is_err() {
        eprintln!("{what}: the Kafka client did not close within 10 s; left behind");
    }
}

pub struct Responses {
    pub(super) consumer: Option<BaseConsumer>,
}

impl Drop for Responses {
    fn drop(&mut self) {
        if let Some(c) = self.consumer.take() {
            close_within(c, "response reader");
        }
    }
}

impl Responses {
    /// Next response, or None after `timeout`.
    pub fn next(&self, timeout: Duration) -> Option<Received> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            let consumer = self.consumer.as_ref().expect("open until dropped");
            if let Some(m) = consumer.poll(Duration::from_millis(100)) {
                // Transport errors while the broker restarts: the consumer reconnects.
                let m = match m {
                    Ok(m) => m,
                    Err(e) => {
                        eprintln!("response reader: {e}");
                        continue;
                    }
                };
                let tp = m.headers().and_then(|h| {
                    h.iter()
                        .find(|h| h.key == "traceparent")
                        .and_then(|h| h.value.map(|v| String::from_utf8_lossy(v).into_owned()))
                });
                return Some(Received {
                    key: String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned(),
                    body: serde_json::from_slice(m.payload().expect("payload"))
                        .expect("response JSON"),
                    traceparent: tp,
                });
            }
        }
        None
    }

    /// Exactly `n` responses (panics if they do not arrive within `timeout`).
    pub fn take(&self, n: usize, timeout: Duration) -> Vec<Received> {
        let deadline = Instant::now() + timeout;
        let mut got = Vec::new();
        while got.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next(left) {
                Some(r) => got.push(r),
                None => panic!("got {} of {n} responses within {timeout:?}", got.len()),
            }
        }
        got
    }
}
