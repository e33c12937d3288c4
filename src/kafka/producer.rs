//! Publishing responses: idempotent producer, acks=all. A job is not done until its response
//! is acknowledged, so its offset is held while publishing fails:
//!
//! 1. A failure that another try may cure (broker unreachable, timeouts, leadership moving) is
//!    retried: inside librdkafka first (one attempt lasts up to `message.timeout.ms`, 5 min,
//!    with the same idempotent sequence, so an outage does not write a response twice), then
//!    with backoff for as long as it takes. Once a record has waited [`HOLD_AFTER`], or after
//!    `publish_attempts` failed attempts, the pod reports `publishing: false`, which pauses its
//!    intake, until the record goes through. A broker outage never turns answers into dead
//!    letters; at shutdown the message is left uncommitted and redelivered.
//!    A refusal for lack of authorisation (topic or cluster) is held the same way, and the pod
//!    is not ready from the first one: it is this pod's configuration (a missing or late WRITE
//!    ACL, a rotated principal), not the record's, and would refuse the dead letter and every
//!    other response alike. Once the right is granted, the response itself goes out.
//! 2. A record the broker rejects for good (too large, invalid) goes to the dead-letter topic
//!    instead: the request, its response and the error.
//! 3. If the dead letter is rejected too, a minimal failure response (the ids and an `internal`
//!    error, a few hundred bytes) is published in its place.
//! 4. If even that is rejected, the message is logged with its coordinates, counted
//!    (`media_worker_responses_dropped_total`) and committed: one record never blocks its
//!    partition.
//!
//! A delivery report carrying an error is a failed attempt, not a publish. When the idempotent
//! producer hits a fatal error (it can then send nothing more), it is replaced by a new one.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::util::Timeout;
use tokio_util::sync::CancellationToken;

use super::settings::KafkaSettings;
use crate::contract::{DeadLetter, RecordOrigin, SCHEMA_VERSION};
use crate::health::Health;
use crate::retry::backoff;
use crate::telemetry::Metrics;

/// How long a record may wait for its acknowledgement before the pod stops taking work.
pub const HOLD_AFTER: Duration = Duration::from_secs(10);

pub struct Publisher {
    config: ClientConfig,
    producer: RwLock<FutureProducer>,
    topic: String,
    dlq_topic: String,
    attempts_before_hold: u32,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

/// One response to publish, and where it came from (for the dead-letter record).
pub struct Outgoing<'a> {
    pub key: &'a str,
    pub payload: &'a [u8],
    pub traceparent: Option<&'a str>,
    /// The request message as received.
    pub request: Option<&'a [u8]>,
    pub source_topic: &'a str,
    pub source_partition: i32,
    pub source_offset: i64,
    /// The minimal failure response published when neither the response nor its dead letter
    /// is accepted.
    pub fallback: &'a [u8],
}

/// How a message ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Published {
    Response,
    /// The broker rejected the response: the request went to the dead-letter topic.
    DeadLettered,
    /// Response and dead letter rejected: a minimal failure response stands for them.
    Minimal,
    /// Nothing could be published (logged and counted); the offset is committed all the same.
    Dropped,
}

#[derive(Debug, thiserror::Error)]
#[error("publish abandoned after {attempts} attempts: {last}")]
pub struct PublishAbandoned {
    pub attempts: u32,
    pub last: String,
}

/// How a send failed.
enum SendError {
    /// The broker will never take this record (too large, invalid).
    Rejected(String),
    /// This pod may not write there: nothing it sends will go through until an operator
    /// grants the right.
    Unauthorized(String),
    /// Anything else (unreachable, timed out, leader moving): worth trying again.
    Failed(String),
}

impl SendError {
    fn of(e: &KafkaError) -> SendError {
        use RDKafkaErrorCode::*;
        match e.rdkafka_error_code() {
            Some(
                InvalidMessageSize
                | MessageSizeTooLarge
                | InvalidTopic
                | InvalidRequiredAcks
                | UnsupportedForMessageFormat
                | PolicyViolation
                | InvalidRecord,
            ) => SendError::Rejected(e.to_string()),
            Some(
                TopicAuthorizationFailed
                | ClusterAuthorizationFailed
                | TransactionalIdAuthorizationFailed
                | SaslAuthenticationFailed
                | Authentication,
            ) => SendError::Unauthorized(e.to_string()),
            _ => SendError::Failed(e.to_string()),
        }
    }
}

/// Marks the worker not ready (intake paused) while a record is held by failing sends.
struct Held<'a>(Option<&'a Health>);

impl<'a> Held<'a> {
    fn set(&mut self, health: &'a Health) {
        if self.0.is_none() {
            health.publish_blocked(true);
            self.0 = Some(health);
        }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if let Some(h) = self.0 {
            h.publish_blocked(false);
        }
    }
}

impl Publisher {
    pub fn new(
        settings: &KafkaSettings,
        metrics: Arc<Metrics>,
        health: Arc<Health>,
    ) -> KafkaResult<Publisher> {
        let config = super::client::producer_config(settings);
        Ok(Publisher {
            producer: RwLock::new(config.create()?),
            config,
            topic: settings.response_topic.clone(),
            dlq_topic: settings.dlq_topic.clone(),
            attempts_before_hold: settings.publish_attempts.max(1),
            metrics,
            health,
        })
    }

    /// Publishes the response, or what stands for it (see the module doc), unless `give_up`
    /// is cancelled first.
    pub async fn publish(
        &self,
        out: &Outgoing<'_>,
        give_up: &CancellationToken,
    ) -> Result<Published, PublishAbandoned> {
        let mut held = Held(None);
        let payload = (out.payload, out.traceparent);
        let Some(why) = self
            .send_until_rejected(&self.topic, out, payload, give_up, &mut held)
            .await?
        else {
            return Ok(Published::Response);
        };
        let record = self.dead_letter(out, &why);
        let dead = (record.as_slice(), out.traceparent);
        let Some(why_dlq) = self
            .send_until_rejected(&self.dlq_topic, out, dead, give_up, &mut held)
            .await?
        else {
            self.metrics.dead_lettered.inc();
            tracing::error!(key = out.key, topic = %self.dlq_topic, error = %why,
                "response rejected by the broker: request dead-lettered");
            return Ok(Published::DeadLettered);
        };
        let fallback = (out.fallback, out.traceparent);
        let Some(why_fallback) = self
            .send_until_rejected(&self.topic, out, fallback, give_up, &mut held)
            .await?
        else {
            self.metrics.minimal_responses.inc();
            tracing::error!(key = out.key, error = %why, dead_letter = %why_dlq,
                "response and dead letter rejected: a minimal failure response was published");
            return Ok(Published::Minimal);
        };
        self.metrics.responses_dropped.inc();
        tracing::error!(key = out.key, topic = out.source_topic, partition = out.source_partition,
            offset = out.source_offset, error = %why, dead_letter = %why_dlq, minimal = %why_fallback,
            "nothing about this request could be published: dropped, its offset committed");
        Ok(Published::Dropped)
    }

    /// Sends one record until it is delivered (`None`) or the broker rejects it for good
    /// (`Some(why)`); other failures are retried with backoff for as long as it takes, and after
    /// `publish_attempts` of them the pod is not ready (its intake pauses) until it goes through.
    async fn send_until_rejected<'a>(
        &'a self,
        topic: &str,
        out: &Outgoing<'_>,
        (payload, traceparent): (&[u8], Option<&str>),
        give_up: &CancellationToken,
        held: &mut Held<'a>,
    ) -> Result<Option<String>, PublishAbandoned> {
        let mut attempts = 0;
        loop {
            attempts += 1;
            let sending = self.send(topic, out.key, payload, traceparent, give_up);
            tokio::pin!(sending);
            let sent = tokio::select! {
                r = &mut sending => r,
                _ = tokio::time::sleep(HOLD_AFTER) => {
                    // Still not acknowledged: the pod takes no new work while it waits.
                    held.set(&self.health);
                    sending.await
                }
            };
            let err = match sent {
                Ok(()) => return Ok(None),
                Err(SendError::Rejected(why)) => {
                    self.metrics.publish_failures.inc();
                    tracing::warn!(topic, key = out.key, error = %why, "record rejected by the broker");
                    return Ok(Some(why));
                }
                Err(SendError::Unauthorized(why)) => {
                    // Not ready at once: every other response would be refused alike.
                    held.set(&self.health);
                    tracing::error!(topic, attempts, error = %why, key = out.key,
                        "not authorised to publish: response held until the right is granted");
                    tokio::select! {
                        _ = self.refresh_metadata(topic) => {}
                        _ = give_up.cancelled() => {}
                    }
                    why
                }
                Err(SendError::Failed(e)) => {
                    tracing::warn!(topic, attempts, error = %e, key = out.key, "publish failed, will retry");
                    e
                }
            };
            self.metrics.publish_failures.inc();
            if attempts >= self.attempts_before_hold {
                held.set(&self.health);
            }
            let wait = backoff(
                attempts,
                Duration::from_millis(200),
                Duration::from_secs(10),
            );
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = give_up.cancelled() => return Err(PublishAbandoned { attempts, last: err }),
            }
        }
    }

    /// One delivery: Ok only on a positive delivery report.
    async fn send(
        &self,
        topic: &str,
        key: &str,
        payload: &[u8],
        traceparent: Option<&str>,
        give_up: &CancellationToken,
    ) -> Result<(), SendError> {
        let mut headers = OwnedHeaders::new().insert(Header {
            key: "content-type",
            value: Some("application/json"),
        });
        if let Some(tp) = traceparent {
            headers = headers.insert(Header {
                key: "traceparent",
                value: Some(tp),
            });
        }
        let record = FutureRecord::to(topic)
            .key(key)
            .payload(payload)
            .headers(headers);
        let producer = self.producer.read().unwrap().clone();
        let result = tokio::select! {
            // The timeout bounds the wait for room in librdkafka's queue, not the delivery.
            r = producer.send(record, Timeout::After(Duration::from_secs(30))) => {
                r.map(|_| ()).map_err(|(e, _)| SendError::of(&e))
            }
            _ = give_up.cancelled() => Err(SendError::Failed("shutdown deadline".to_owned())),
        };
        if result.is_err() {
            self.replace_if_fatal(&producer);
        }
        result
    }

    /// librdkafka keeps a topic refused for lack of authorisation refused, failing each record
    /// at once, until its periodic metadata refresh (every 5 min): ask the broker again, so that
    /// a right granted meanwhile is seen by the next try.
    async fn refresh_metadata(&self, topic: &str) {
        let (producer, topic) = (self.producer(), topic.to_owned());
        let asked = tokio::task::spawn_blocking(move || {
            producer
                .client()
                .fetch_metadata(Some(&topic), Duration::from_secs(5))
                .map(|_| ())
        })
        .await;
        if let Ok(Err(e)) = asked {
            tracing::warn!(error = %e, "metadata refresh failed");
        }
    }

    /// A fatal error leaves the idempotent producer unable to send anything: start a new one.
    fn replace_if_fatal(&self, failed: &FutureProducer) {
        let Some((code, reason)) = failed.client().fatal_error() else {
            return;
        };
        let mut current = self.producer.write().unwrap();
        // Another task may have replaced it already.
        if current.client().native_ptr() != failed.client().native_ptr() {
            return;
        }
        match self.config.create::<FutureProducer>() {
            Ok(fresh) => {
                tracing::error!(
                    ?code,
                    reason,
                    "producer fatal error: replaced by a new producer"
                );
                self.metrics.producer_restarts.inc();
                *current = fresh;
            }
            Err(e) => tracing::error!(error = %e, "cannot create a new producer"),
        }
    }

    /// The dead-letter record: where the request came from, the request as received, the
    /// response that could not be published and why.
    fn dead_letter(&self, out: &Outgoing<'_>, error: &str) -> Vec<u8> {
        let record = DeadLetter {
            schema_version: SCHEMA_VERSION,
            source: RecordOrigin {
                topic: out.source_topic.to_owned(),
                partition: out.source_partition,
                offset: out.source_offset,
            },
            request: out.request.map(|b| String::from_utf8_lossy(b).into_owned()),
            response_topic: self.topic.clone(),
            response: serde_json::from_slice(out.payload).ok(),
            error: error.to_owned(),
        };
        serde_json::to_vec(&record).expect("dead-letter record serialises")
    }

    /// The producer in use (tests inject faults into it).
    pub fn producer(&self) -> FutureProducer {
        self.producer.read().unwrap().clone()
    }

    /// Waits for queued messages to be delivered.
    pub fn flush(&self, timeout: Duration) {
        if let Err(e) = self.producer().flush(Timeout::After(timeout)) {
            tracing::warn!(error = %e, "producer flush incomplete");
        }
    }
}

/// Informational records (progress events): each reported delivered or failed within its bound
/// (twice over at most: the wait for room in the queue, then the delivery), by a producer of
/// their own whose `message.timeout.ms` is that bound. The enqueue timeout alone bounded
/// nothing: delivery waited up to the responses' `message.timeout.ms` (5 min) for a missing or
/// leaderless topic, and a job's response waits for its last event. A record librdkafka gave
/// up on is not sent again (one already on the wire may still be appended by a slow broker).
/// No retries, no dead letter, no effect on the pod's health.
pub struct BestEffort {
    producer: FutureProducer,
    within: Duration,
}

impl BestEffort {
    pub fn new(settings: &KafkaSettings, within: Duration) -> KafkaResult<BestEffort> {
        let mut config = super::client::producer_config(settings);
        config
            .set("message.timeout.ms", within.as_millis().to_string())
            // Losing or repeating an event is harmless; a fatal idempotence error is not.
            .set("enable.idempotence", "false")
            .set("acks", "1");
        Ok(BestEffort {
            producer: config.create()?,
            within,
        })
    }

    /// One try, delivered or failed within the bound.
    pub async fn send(&self, topic: &str, key: &str, payload: &[u8]) -> Result<(), KafkaError> {
        let record = FutureRecord::to(topic).key(key).payload(payload);
        match self
            .producer
            .send(record, Timeout::After(self.within))
            .await
        {
            Ok(_) => Ok(()),
            Err((e, _)) => Err(e),
        }
    }
}

/// A long video's unit tasks (`kafka.unit_topic`): each acknowledged by the broker before `send`
/// returns, with the responses' durability (idempotent, all replicas). Parts go to the topic's
/// partitions the caller chooses (`units::Task::place`), so that the unit group's members get
/// equal shares.
/// The topic is never created by sending to it (a broker with `auto.create.topics.enable`
/// would make it with its default partition count): [`TaskSender::check`] asks whether it
/// exists and how many partitions it has.
pub struct TaskSender {
    producer: FutureProducer,
    topic: String,
    /// The topic's partitions: 0 while it is missing, -1 before the first answer.
    partitions: AtomicI32,
}

/// How long [`TaskSender::check`] waits for the broker.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

impl TaskSender {
    pub fn new(settings: &KafkaSettings, topic: &str) -> KafkaResult<TaskSender> {
        let mut config = super::client::producer_config(settings);
        config.set("allow.auto.create.topics", "false");
        Ok(TaskSender {
            producer: config.create()?,
            topic: topic.to_owned(),
            partitions: AtomicI32::new(-1),
        })
    }

    /// Asks the broker for the topic (blocking, up to 10 s): `Some(exists)`, or `None` when
    /// the broker did not answer (what was known stays).
    pub fn check(&self) -> Option<bool> {
        let metadata = self
            .producer
            .client()
            .fetch_metadata(Some(&self.topic), METADATA_TIMEOUT);
        let count = match &metadata {
            Ok(m) => m
                .topics()
                .iter()
                .find(|t| t.name() == self.topic && t.error().is_none())
                .map_or(0, |t| t.partitions().len() as i32),
            Err(e) => {
                tracing::warn!(topic = %self.topic, error = %e, "unit topic metadata unavailable");
                return None;
            }
        };
        self.partitions.store(count, Ordering::Relaxed);
        Some(count > 0)
    }

    /// Whether the topic may be sent to: it exists, or no answer came yet.
    pub fn available(&self) -> bool {
        self.partitions.load(Ordering::Relaxed) != 0
    }

    /// One task, acknowledged by the broker (or failed) within 30 s; to the partition
    /// `partition` picks among the topic's count when given and the count is known, else by
    /// its key.
    pub async fn send(
        &self,
        key: &str,
        partition: Option<impl FnOnce(u32) -> u32>,
        payload: &[u8],
    ) -> Result<(), KafkaError> {
        let mut record = FutureRecord::to(&self.topic).key(key).payload(payload);
        let partitions = self.partitions.load(Ordering::Relaxed);
        if let Some(pick) = partition.filter(|_| partitions > 0) {
            record = record.partition(pick(partitions as u32) as i32);
        }
        self.producer
            .send(record, Timeout::After(Duration::from_secs(30)))
            .await
            .map(|_| ())
            .map_err(|(e, _)| e)
    }
}
