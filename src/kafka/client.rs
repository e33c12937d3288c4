//! librdkafka client settings: ours first, then every `[kafka.properties]` /
//! `KAFKA_PROPERTY_*` entry, so an operator can override anything.

use rdkafka::ClientConfig;

use super::settings::{GroupProtocol, KafkaSettings};

/// Our defaults first, then every `[kafka.properties]` / `KAFKA_PROPERTY_*` entry, so an
/// operator can override anything.
fn client_config(settings: &KafkaSettings, defaults: &[(&str, &str)]) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &settings.bootstrap_servers);
    for (k, v) in defaults {
        c.set(*k, *v);
    }
    for (k, v) in &settings.properties {
        c.set(k, v.to_string());
    }
    c
}

/// A member of `group` (the request group, or the unit topic's own).
pub fn consumer_config(settings: &KafkaSettings, group: &str) -> ClientConfig {
    let mut c = client_config(
        settings,
        &[
            ("group.id", group),
            // Offsets are committed by us, only for finished work (see offsets.rs).
            ("enable.auto.commit", "false"),
            ("enable.auto.offset.store", "false"),
            ("auto.offset.reset", "earliest"),
            // Both protocols revoke incrementally: a rebalance takes from a member only the
            // partitions that move (the drain on revoke, consumer.rs, relies on it).
            match settings.group_protocol {
                GroupProtocol::Classic => ("partition.assignment.strategy", "cooperative-sticky"),
                GroupProtocol::Consumer => ("group.protocol", "consumer"),
            },
            // Prefetch per partition (the consumer reads its partitions' queues only below
            // MAX_IN_FLIGHT, see consumer.rs): enough to keep the pool fed, small enough that
            // a deep backlog costs little memory.
            ("queued.min.messages", "1000"),
            ("queued.max.messages.kbytes", "16384"),
            // Consumer lag per partition for /metrics (see consumer.rs).
            ("statistics.interval.ms", "5000"),
        ],
    );
    // Static membership is per group: the same instance id serves in both.
    if let Some(id) = &settings.group_instance_id {
        c.set("group.instance.id", id);
    }
    c
}

/// The properties of a group's member, which a client that never joins has no use for (and
/// which librdkafka checks against each other: `max.poll.interval.ms` under the default
/// `session.timeout.ms` refuses the client).
const MEMBERSHIP: [&str; 6] = [
    "max.poll.interval.ms",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "partition.assignment.strategy",
    "group.instance.id",
    "group.remote.assignor",
];

/// A client that reads and commits `group`'s offsets without joining it (the unit group's
/// start, `kafka::handover`): the operator's properties but a member's.
pub fn offsets_config(settings: &KafkaSettings, group: &str) -> ClientConfig {
    let mut c = client_config(
        settings,
        &[("group.id", group), ("enable.auto.commit", "false")],
    );
    for p in MEMBERSHIP {
        c.remove(p);
    }
    c
}

pub fn producer_config(settings: &KafkaSettings) -> ClientConfig {
    client_config(
        settings,
        &[
            ("enable.idempotence", "true"),
            ("acks", "all"),
            // A response is one small message per job; waiting to batch it only delays the
            // job's end (and its offset). Concurrent responses still share requests.
            ("linger.ms", "0"),
            // One publish attempt rides out an outage of up to 5 min inside librdkafka: its
            // retries keep the idempotent sequence, so a record the broker appended but could
            // not acknowledge (NOT_ENOUGH_REPLICAS_AFTER_APPEND) is never written twice. A new
            // attempt after a timeout is a new record, and could be.
            ("message.timeout.ms", "300000"),
        ],
    )
}
