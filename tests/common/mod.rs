//! Test harness: a real Kafka-compatible broker (tansu) and a real S3 server (s3s-fs), each on a
//! free loopback port with its own data directory, plus the worker binary as a child process.
//! Every child gets PR_SET_PDEATHSIG, so nothing outlives a crashed test; `Drop` stops them.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use aws_sdk_s3::Client as S3Client;
use media_worker::contract::{OptimizeRequest, OptimizeResponse};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

pub const ACCESS_KEY: &str = "test-access";
pub const SECRET_KEY: &str = "test-secret-key";
pub const SOURCE_BUCKET: &str = "uploads";
pub const OUTPUT_BUCKET: &str = "media";

pub fn corpus(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/corpus")
        .join(name)
}

/// A loopback port for a server a test starts: random, below the kernel's ephemeral range (so an
/// outgoing connection cannot take it before the server binds), free now, and never handed out
/// twice by this process (tests run side by side).
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap();
    for _ in 0..1000 {
        let port = fastrand::u16(20_000..32_000);
        if !given.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.push(port);
            return port;
        }
    }
    panic!("no free loopback port in 20000..32000");
}

/// The last lines of a child's log, for a failure message.
fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// A failing test prints the end of each server's log as the server is stopped.
fn report_if_panicking(what: &str, log: &Path) {
    if std::thread::panicking() {
        eprintln!("---- {what} log, last lines ----\n{}", log_tail(log));
    }
}

pub mod synthetic;
#[allow(unused_imports)]
pub use synthetic::synthetic_video;

#[allow(unused_imports)]
pub use media_worker::media::video::exits_within;

/// Pids of running (not zombie) processes whose command line mentions `needle`.
pub fn processes_mentioning(needle: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if pid == std::process::id() as i32 {
            continue;
        }
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let zombie = stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim()
            .starts_with('Z');
        if !zombie && String::from_utf8_lossy(&cmdline).contains(needle) {
            found.push(pid);
        }
    }
    found
}

/// Polls `f` every 50 ms until it returns Some, or panics after `timeout`.
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn wait_port(port: u16, child: &mut Child, what: &str, log: &Path) {
    wait_for(what, Duration::from_secs(60), || {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} exited early: {status}\n{}", log_tail(log));
        }
        TcpStream::connect(("127.0.0.1", port)).ok()
    });
}

fn spawn(cmd: &mut Command, log: &Path) -> Child {
    let out = std::fs::File::create(log).unwrap();
    cmd.stdout(out.try_clone().unwrap())
        .stderr(out)
        .stdin(Stdio::null());
    // SAFETY: prctl is async-signal-safe; the child dies with the thread that spawned it.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    cmd.spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e} (run `make setup-test`)"))
}

fn kill(child: &mut Child, signal: i32) {
    // SAFETY: sending a signal to our own child.
    unsafe { libc::kill(child.id() as i32, signal) };
}

/// Kills and reaps a server, if running.
fn stop_child(child: &mut Option<Child>) {
    if let Some(mut c) = child.take() {
        kill(&mut c, libc::SIGKILL);
        let _ = c.wait();
    }
}

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

/// s3s-fs serving a directory.
pub struct S3 {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl S3 {
    pub fn start() -> S3 {
        let mut s = S3 {
            port: free_port(),
            dir: tempfile::tempdir().unwrap(),
            child: None,
        };
        std::fs::create_dir_all(s.dir.path().join("data")).unwrap();
        s.restart();
        s
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn restart(&mut self) {
        self.stop();
        let mut cmd = Command::new("s3s-fs");
        cmd.args(["--host", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .arg(self.dir.path().join("data"));
        let log = self.dir.path().join("s3s.log");
        let mut child = spawn(&mut cmd, &log);
        wait_port(self.port, &mut child, "s3s-fs", &log);
        self.child = Some(child);
    }

    pub fn stop(&mut self) {
        stop_child(&mut self.child);
    }

    pub async fn client(&self) -> S3Client {
        let creds =
            aws_sdk_s3::config::Credentials::new(ACCESS_KEY, SECRET_KEY, None, None, "test");
        let conf = aws_sdk_s3::config::Builder::new()
            .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
            .region(aws_sdk_s3::config::Region::new("us-east-1"))
            .endpoint_url(self.endpoint())
            .credentials_provider(creds)
            .force_path_style(true)
            // A test fails rather than hangs on a server that stops answering.
            .timeout_config(
                aws_sdk_s3::config::timeout::TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(5))
                    .operation_attempt_timeout(Duration::from_secs(60))
                    .build(),
            )
            .build();
        S3Client::from_conf(conf)
    }
}

impl Drop for S3 {
    fn drop(&mut self) {
        self.stop();
        report_if_panicking("s3s-fs", &self.dir.path().join("s3s.log"));
    }
}

/// A broker, an S3 server with the source and output buckets, and unique topic names.
pub struct Stack {
    pub broker: Broker,
    pub s3: S3,
    pub s3c: S3Client,
    pub request_topic: String,
    pub response_topic: String,
}

impl Stack {
    pub async fn start(request_partitions: u32) -> Stack {
        let broker = Broker::start();
        let s3 = S3::start();
        let s3c = s3.client().await;
        for b in [SOURCE_BUCKET, OUTPUT_BUCKET] {
            s3c.create_bucket().bucket(b).send().await.unwrap();
        }
        let request_topic = "media.optimize.request".to_owned();
        let response_topic = "media.optimize.response".to_owned();
        broker.create_topic(&request_topic, request_partitions);
        broker.create_topic(&response_topic, 1);
        Stack {
            broker,
            s3,
            s3c,
            request_topic,
            response_topic,
        }
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

    pub fn worker_env(&self, group: &str) -> HashMap<String, String> {
        let mut env = HashMap::new();
        let mut set = |k: &str, v: &str| {
            env.insert(k.to_owned(), v.to_owned());
        };
        set("KAFKA_BOOTSTRAP_SERVERS", &self.broker.bootstrap());
        set("KAFKA_GROUP_ID", group);
        set("KAFKA_REQUEST_TOPIC", &self.request_topic);
        set("KAFKA_RESPONSE_TOPIC", &self.response_topic);
        set("KAFKA_PROPERTY_SESSION_TIMEOUT_MS", "6000");
        set("KAFKA_PROPERTY_MAX_POLL_INTERVAL_MS", "20000");
        // A third of the session timeout: at librdkafka's default (3 s, half of it) tansu
        // rebalances the group every few seconds, with 3 members even when idle.
        set("KAFKA_PROPERTY_HEARTBEAT_INTERVAL_MS", "2000");
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
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", self.broker.bootstrap())
            .set("group.id", group)
            .create()
            .unwrap();
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition(&self.request_topic, p);
        }
        let got = c.committed_offsets(tpl, Duration::from_secs(10)).unwrap();
        close_within(c, "offset reader");
        (0..partitions)
            .map(|p| {
                match got
                    .find_partition(&self.request_topic, p)
                    .map(|e| e.offset())
                {
                    Some(Offset::Offset(o)) => o,
                    _ => -1,
                }
            })
            .collect()
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

pub fn request(media_id: &str, source_key: &str) -> OptimizeRequest {
    OptimizeRequest::new(
        format!("req-{media_id}"),
        media_id.to_owned(),
        "user-1",
        SOURCE_BUCKET,
        source_key.to_owned(),
    )
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
fn close_within<T: Send + 'static>(client: T, what: &'static str) {
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
    consumer: Option<BaseConsumer>,
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

/// The worker binary, running `run`.
pub struct Worker {
    child: Child,
    pub http: SocketAddr,
    log: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Worker {
    pub fn start(env: &HashMap<String, String>) -> Worker {
        let tmp = tempfile::tempdir().unwrap();
        let http: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let log = tmp.path().join("worker.log");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_media-worker"));
        cmd.arg("run")
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("TMP_DIR", tmp.path().join("scratch"))
            .env("HTTP_ADDR", http.to_string())
            .envs(env);
        let mut child = spawn(&mut cmd, &log);
        wait_port(http.port(), &mut child, "worker http", &log);
        Worker {
            child,
            http,
            log,
            _tmp: tmp,
        }
    }

    /// One sample of a metric from /metrics: the first line starting with `line_start`.
    pub fn metric(&self, line_start: &str) -> Option<f64> {
        let (_, text) = self.http_get("/metrics")?;
        text.lines()
            .find(|l| l.starts_with(line_start))?
            .split_whitespace()
            .last()?
            .parse()
            .ok()
    }

    pub fn scratch_dir(&self) -> PathBuf {
        self._tmp.path().join("scratch")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// GET a path on the worker's HTTP server (plain HTTP/1.0, no client crate needed).
    pub fn http_get(&self, path: &str) -> Option<(u16, String)> {
        use std::io::{Read, Write};
        let mut s = TcpStream::connect_timeout(&self.http, Duration::from_secs(5)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
        s.set_write_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
        let mut buf = String::new();
        s.read_to_string(&mut buf).ok()?;
        let status = buf.split_whitespace().nth(1)?.parse().ok()?;
        let body = buf
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        Some((status, body))
    }

    /// Waits until the worker is consuming (ready, with partitions assigned).
    pub fn wait_ready(&self) {
        wait_for("worker ready", Duration::from_secs(60), || {
            let (status, _) = self.http_get("/health/ready")?;
            let (_, metrics) = self.http_get("/metrics")?;
            let assigned = metrics
                .lines()
                .find(|l| l.starts_with("media_worker_kafka_assigned_partitions "))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())?;
            (status == 200 && assigned > 0.0).then_some(())
        });
    }

    /// Active jobs per `/jobs`.
    pub fn jobs(&self) -> Vec<serde_json::Value> {
        self.http_get("/jobs")
            .and_then(|(_, b)| serde_json::from_str::<serde_json::Value>(&b).ok())
            .and_then(|v| v["jobs"].as_array().cloned())
            .unwrap_or_default()
    }

    pub fn sigterm(&mut self) {
        kill(&mut self.child, libc::SIGTERM);
    }

    pub fn kill9(&mut self) {
        kill(&mut self.child, libc::SIGKILL);
        let _ = self.child.wait();
    }

    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        wait_for("worker exit", timeout, || self.child.try_wait().unwrap())
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            kill(&mut self.child, libc::SIGKILL);
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!("---- worker log ----\n{}", self.log());
        }
    }
}
