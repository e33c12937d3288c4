//! The Kafka side: an Apache Kafka cluster of the test's own, and clients that send requests
//! and read responses.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use media_worker::contract::{OptimizeRequest, OptimizeResponse};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;

use super::*;

/// An Apache Kafka KRaft cluster (`scripts/kafka.sh`): one node shared by the end-to-end tests of
/// a run, three of a test's own (replication factor 3, `min.insync.replicas=2`) for the fleet's.
pub struct Broker {
    dir: PathBuf,
    bootstrap: String,
    /// The SASL/PLAIN listener under Kafka's authorizer ([`Broker::with_authorizer`]).
    sasl_bootstrap: Option<String>,
    pub nodes: usize,
    /// Taken down when dropped; a shared node belongs to the run.
    owned: bool,
}

/// The cluster script, from the crate's root.
fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/kafka.sh")
}

fn kafka_sh(args: &[&str]) -> String {
    kafka_sh_with(args, "")
}

/// `broker_properties`: lines added to every node's server.properties.
fn kafka_sh_with(args: &[&str], broker_properties: &str) -> String {
    kafka_sh_env(args, &[("KAFKA_BROKER_PROPERTIES", broker_properties)])
}

fn kafka_sh_env(args: &[&str], env: &[(&str, &str)]) -> String {
    let out = Command::new(script())
        .args(args)
        .env("KAFKA_OWNER_PID", std::process::id().to_string())
        .env("KAFKA_PORT_CLAIMS", port_claims())
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("scripts/kafka.sh {args:?}: {e}"));
    assert!(
        out.status.success(),
        "scripts/kafka.sh {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl Broker {
    /// The run's one node: nextest's setup script (`.config/nextest.toml`) starts it and names it
    /// in `MEDIA_TEST_KAFKA_BOOTSTRAP`; a test run some other way starts a node of its own.
    pub fn shared() -> Broker {
        match (
            std::env::var("MEDIA_TEST_KAFKA_DIR"),
            std::env::var("MEDIA_TEST_KAFKA_BOOTSTRAP"),
        ) {
            (Ok(dir), Ok(bootstrap)) => {
                let b = Broker {
                    dir: dir.into(),
                    bootstrap,
                    sasl_bootstrap: None,
                    nodes: 1,
                    owned: false,
                };
                b.wait_serving();
                b
            }
            _ => Broker::cluster(1),
        }
    }

    /// `nodes` combined controller+broker nodes, serving.
    pub fn cluster(nodes: usize) -> Broker {
        Broker::cluster_with(nodes, "")
    }

    /// A cluster whose nodes have `broker_properties` (server.properties lines) besides ours.
    pub fn cluster_with(nodes: usize, broker_properties: &str) -> Broker {
        Broker::up(nodes, &[("KAFKA_BROKER_PROPERTIES", broker_properties)])
    }

    /// One node that also listens for SASL/PLAIN clients (users `admin` and `worker`) under
    /// Kafka's StandardAuthorizer: such a client may do only what [`Broker::acl`] grants. The
    /// plain listener ([`Broker::bootstrap`]) stays the tests' own, with every right.
    pub fn with_authorizer() -> Broker {
        Broker::up(1, &[("KAFKA_SASL", "1")])
    }

    fn up(nodes: usize, env: &[(&str, &str)]) -> Broker {
        let out = kafka_sh_env(&["up", &nodes.to_string()], env);
        let value = |key: &str| {
            out.lines()
                .find_map(|l| l.strip_prefix(key))
                .map(str::to_owned)
        };
        let required = |key: &str| value(key).unwrap_or_else(|| panic!("no {key} in {out}"));
        let b = Broker {
            dir: PathBuf::from(required("KAFKA_DIR=")),
            bootstrap: required("KAFKA_BOOTSTRAP_SERVERS="),
            sasl_bootstrap: value("KAFKA_SASL_BOOTSTRAP_SERVERS="),
            nodes,
            owned: true,
        };
        b.wait_serving();
        b
    }

    pub fn bootstrap(&self) -> String {
        self.bootstrap.clone()
    }

    /// The worker's environment for the SASL listener, as user `worker`.
    pub fn sasl_client_env(&self) -> Vec<(&'static str, String)> {
        let bootstrap = self
            .sasl_bootstrap
            .clone()
            .expect("a broker with an authorizer");
        vec![
            ("KAFKA_BOOTSTRAP_SERVERS", bootstrap),
            ("KAFKA_PROPERTY_SECURITY_PROTOCOL", "SASL_PLAINTEXT".into()),
            ("KAFKA_PROPERTY_SASL_MECHANISM", "PLAIN".into()),
            ("KAFKA_PROPERTY_SASL_USERNAME", "worker".into()),
            ("KAFKA_PROPERTY_SASL_PASSWORD", "worker-secret".into()),
        ]
    }

    /// Kafka's ACL tool on this cluster (`--add ...`, `--remove --force ...`); its output.
    pub fn acl(&self, args: &[&str]) -> String {
        let dir = self.dir.display().to_string();
        let mut all = vec!["acl", dir.as_str()];
        all.extend_from_slice(args);
        kafka_sh(&all)
    }

    /// An open port does not prove the cluster serves: wait until metadata names every broker.
    fn wait_serving(&self) {
        let probe: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", self.bootstrap())
            .create()
            .unwrap();
        wait_for("Kafka answering", Duration::from_secs(60), || {
            let m = probe.fetch_metadata(None, Duration::from_secs(2)).ok()?;
            (m.brokers().len() == self.nodes).then_some(())
        });
    }

    /// Stops node `i` (1-based; SIGTERM, a controlled shutdown).
    pub fn stop_node(&self, i: usize) {
        assert!(self.owned, "a shared node is not a test's to stop");
        kafka_sh(&["stop", &self.dir.display().to_string(), &i.to_string()]);
    }

    /// Kills node `i` with SIGKILL: a crash, no controlled shutdown.
    pub fn kill_node(&self, i: usize) {
        assert!(self.owned, "a shared node is not a test's to kill");
        kafka_sh(&["kill", &self.dir.display().to_string(), &i.to_string()]);
    }

    /// The node leading each partition of `topic` (node ids are 1..=nodes).
    pub fn leaders(&self, topic: &str) -> Vec<usize> {
        let probe: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", self.bootstrap())
            .create()
            .unwrap();
        let m = probe
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .unwrap();
        let mut parts: Vec<_> = m.topics()[0]
            .partitions()
            .iter()
            .map(|p| (p.id(), p.leader() as usize))
            .collect();
        parts.sort_unstable();
        parts.into_iter().map(|(_, leader)| leader).collect()
    }

    /// Starts node `i` again, on its ports and data.
    pub fn start_node(&self, i: usize) {
        kafka_sh(&["start", &self.dir.display().to_string(), &i.to_string()]);
        self.wait_serving();
    }

    /// A topic with `partitions`, replicated on up to three nodes.
    pub fn create_topic(&self, name: &str, partitions: u32) {
        use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
        let admin = self.admin();
        let rf = self.nodes.min(3) as i32;
        let topic = NewTopic::new(name, partitions as i32, TopicReplication::Fixed(rf));
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        let created = on_own_runtime(admin.create_topics([&topic], &opts));
        for r in created.unwrap() {
            if let Err((t, e)) = r {
                assert_eq!(
                    e,
                    rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists,
                    "create topic {t}: {e}"
                );
            }
        }
        // Every partition with a leader before the test uses it.
        wait_for("the topic's leaders", Duration::from_secs(60), || {
            let m = admin
                .inner()
                .fetch_metadata(Some(name), Duration::from_secs(2))
                .ok()?;
            let t = m.topics().first()?;
            (t.partitions().len() == partitions as usize
                && t.partitions().iter().all(|p| p.leader() >= 0))
            .then_some(())
        });
    }

    /// Deletes `name`, once no node's metadata lists it any more.
    pub fn delete_topic(&self, name: &str) {
        use rdkafka::admin::AdminOptions;
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        let deleted = on_own_runtime(self.admin().delete_topics(&[name], &opts));
        for r in deleted.unwrap() {
            if let Err((t, e)) = r {
                panic!("delete topic {t}: {e}");
            }
        }
        wait_for("the topic gone", Duration::from_secs(60), || {
            (!self.topics().iter().any(|t| t == name)).then_some(())
        });
    }

    /// Every topic's name (all topics asked for: a request for one missing topic may create
    /// it on a broker with `auto.create.topics.enable`).
    pub fn topics(&self) -> Vec<String> {
        let m = self
            .admin()
            .inner()
            .fetch_metadata(None, Duration::from_secs(10))
            .expect("the cluster's metadata");
        m.topics().iter().map(|t| t.name().to_owned()).collect()
    }

    /// Sets `topic`'s configuration overrides to `entries`, replacing any earlier ones (none:
    /// the cluster's defaults again).
    pub fn set_topic_config(&self, topic: &str, entries: &[(&str, &str)]) {
        use rdkafka::admin::{AdminOptions, AlterConfig, ResourceSpecifier};
        let config = entries.iter().fold(
            AlterConfig::new(ResourceSpecifier::Topic(topic)),
            |c, (k, v)| c.set(k, v),
        );
        let opts = AdminOptions::new().request_timeout(Some(Duration::from_secs(30)));
        let altered = on_own_runtime(self.admin().alter_configs([&config], &opts));
        for r in altered.unwrap() {
            if let Err((resource, e)) = r {
                panic!("alter {resource:?}: {e}");
            }
        }
    }

    fn admin(&self) -> rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> {
        ClientConfig::new()
            .set("bootstrap.servers", self.bootstrap())
            .create()
            .unwrap()
    }

    /// Every node's log so far (the broker's own account, e.g. of a group's rebalances).
    pub fn log(&self) -> String {
        (1..=self.nodes)
            .map(|i| {
                std::fs::read_to_string(self.dir.join(format!("node{i}/kafka.log")))
                    .unwrap_or_default()
            })
            .collect()
    }

    /// How many times the group coordinator rebalanced `group`, from its log: a new generation
    /// (classic protocol) or a new group epoch (consumer protocol).
    pub fn group_rebalances(&self, group: &str) -> usize {
        let classic = format!("Preparing to rebalance group {group} ");
        let consumer = format!("[GroupId {group}] Bumped group epoch");
        self.log()
            .lines()
            .filter(|l| l.contains(&classic) || l.contains(&consumer))
            .count()
    }

    /// The node logs' ends, for a failing test.
    fn report(&self) {
        for i in 1..=self.nodes {
            report_if_panicking(
                &format!("kafka node {i}"),
                &self.dir.join(format!("node{i}/kafka.log")),
            );
        }
    }
}

/// Runs an admin call on a thread and runtime of its own: the caller may be inside a Tokio
/// runtime.
fn on_own_runtime<T: Send>(call: impl std::future::Future<Output = T> + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(call)
        })
        .join()
        .unwrap()
    })
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.report();
        if !self.owned {
            return;
        }
        let _ = Command::new(script())
            .args(["down", &self.dir.display().to_string()])
            .stdin(Stdio::null())
            .output();
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

/// The response to `id` among `got`; panics when there is none.
pub fn answer_to(got: &[Received], id: &str) -> OptimizeResponse {
    got.iter()
        .find(|r| r.body.media_id.as_deref() == Some(id))
        .unwrap_or_else(|| panic!("no answer to {id}"))
        .body
        .clone()
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
