//! The `[kafka]` section: the brokers, the group, the topics, intake and progress events, and
//! librdkafka properties passed through.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::section::{Invalid, Section, ensure};

/// Prefix of environment variables passed to librdkafka: `KAFKA_PROPERTY_SESSION_TIMEOUT_MS`
/// sets `session.timeout.ms`.
pub const KAFKA_PROPERTY_PREFIX: &str = "KAFKA_PROPERTY_";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSettings {
    pub bootstrap_servers: String,
    pub group_id: String,
    #[serde(default)]
    pub group_instance_id: Option<String>,
    /// How the group assigns partitions (`KAFKA_GROUP_PROTOCOL`).
    pub group_protocol: GroupProtocol,
    pub request_topic: String,
    pub response_topic: String,
    /// Where a request goes, with its error, when its response cannot be published.
    pub dlq_topic: String,
    /// Failed attempts at publishing a response after which the pod reports `publishing:
    /// false` and pauses its intake (it keeps retrying; see `kafka::producer`).
    pub publish_attempts: u32,
    pub commit_interval_ms: u64,
    /// The longest the poll loop sleeps with nothing waking it (a safety net; see
    /// `kafka::consumer`).
    pub safety_poll_ms: u64,
    pub max_in_flight: usize,
    /// On revoke, how long to wait for the revoked partitions' jobs before letting them go.
    pub revoke_drain_secs: u64,
    /// Consume requests from Kafka; `false` runs only the job API (`KAFKA_INTAKE=false`).
    pub intake: bool,
    /// Where long jobs publish progress events (unset or empty: none are published).
    #[serde(default)]
    pub progress_topic: Option<String>,
    /// Where long videos' units go (unset or empty: a long video's units are encoded one after
    /// another by the worker that took it; see `crate::units`).
    #[serde(default)]
    pub unit_topic: Option<String>,
    /// The consumer group of the unit topic (unset or empty: `{group_id}.units`). A group of its
    /// own, so that the unit topic's partitions are shared among the members by themselves,
    /// whatever the assignor (see `kafka::consumer`, "Two groups").
    #[serde(default)]
    pub unit_group_id: Option<String>,
    /// A job publishes progress once it has run this long (short jobs publish none)...
    pub progress_delay_secs: u64,
    /// ...then whenever it has advanced by this fraction of the job...
    pub progress_step: f32,
    /// ...or this long has passed since its last event (a heartbeat while a stage is long).
    pub progress_interval_secs: u64,
    #[serde(default)]
    pub properties: BTreeMap<String, PropertyValue>,
}

/// The consumer-group protocol (docs/operations.md has the figures behind the default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GroupProtocol {
    /// The client-side protocol: members join, the leader assigns (cooperative-sticky).
    Classic,
    /// KIP-848: the broker assigns and reconciles each member on its own heartbeat; the
    /// session and heartbeat times are the broker's (`group.consumer.*`).
    Consumer,
}

/// librdkafka properties the consumer protocol takes from the broker instead: setting one is
/// refused at start-up rather than left for librdkafka to ignore or reject later.
pub const CLASSIC_ONLY_PROPERTIES: [&str; 4] = [
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "partition.assignment.strategy",
    "group.protocol.type",
];

/// A librdkafka property value; TOML numbers and booleans are accepted as well as strings.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PropertyValue {
    Text(String),
    Int(i64),
    Bool(bool),
    Float(f64),
}

impl std::fmt::Display for PropertyValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Text(s) => f.write_str(s),
            Self::Int(i) => write!(f, "{i}"),
            Self::Bool(b) => write!(f, "{b}"),
            Self::Float(x) => write!(f, "{x}"),
        }
    }
}

impl KafkaSettings {
    /// The progress topic, when progress events are on (`KAFKA_PROGRESS_TOPIC` set, not empty).
    pub fn progress_topic(&self) -> Option<&str> {
        self.progress_topic.as_deref().filter(|t| !t.is_empty())
    }

    /// The unit topic, when long videos are spread over the fleet (`KAFKA_UNIT_TOPIC`).
    pub fn unit_topic(&self) -> Option<&str> {
        self.unit_topic.as_deref().filter(|t| !t.is_empty())
    }

    /// The consumer group that takes the unit topic: `kafka.unit_group_id`, or the request
    /// group's id with `.units` after it.
    pub fn unit_group(&self) -> String {
        match self.unit_group_id.as_deref().filter(|g| !g.is_empty()) {
            Some(g) => g.to_owned(),
            None => format!("{}.units", self.group_id),
        }
    }
}

impl Section for KafkaSettings {
    fn validate(&self) -> Result<(), Invalid> {
        ensure(
            !self.properties.contains_key("group.protocol"),
            "properties",
            "set kafka.group_protocol instead",
        )?;
        if self.group_protocol == GroupProtocol::Consumer
            && let Some(p) = CLASSIC_ONLY_PROPERTIES
                .iter()
                .find(|p| self.properties.contains_key(**p))
        {
            return Err(Invalid::new(
                "properties",
                format!(
                    "{p} is the broker's under group_protocol = \"consumer\" (group.consumer.*)"
                ),
            ));
        }
        ensure(
            self.unit_topic().is_none() || self.unit_group() != self.group_id,
            "unit_group_id",
            "must differ from group_id: the unit topic needs a group of its own",
        )?;
        ensure(
            self.unit_topic().is_none() || self.max_in_flight != 1,
            "max_in_flight",
            "need 2 at least with a unit topic: a unit-topic task takes a place beside a request's \
             (kafka::flow::Places)",
        )?;
        ensure(
            self.progress_step > 0.0 && self.progress_step <= 1.0,
            "progress_step",
            "need a fraction in (0, 1]",
        )?;
        ensure(
            self.progress_interval_secs > 0,
            "progress_interval_secs",
            "need at least 1 s",
        )?;
        ensure(
            !self.bootstrap_servers.trim().is_empty(),
            "bootstrap_servers",
            "must not be empty",
        )?;
        ensure(
            self.publish_attempts > 0,
            "publish_attempts",
            "must be at least 1",
        )?;
        ensure(
            self.safety_poll_ms > 0,
            "safety_poll_ms",
            "must be positive",
        )?;
        ensure(
            self.commit_interval_ms > 0,
            "commit_interval_ms",
            "must be positive",
        )
    }
}
