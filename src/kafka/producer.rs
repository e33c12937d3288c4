//! Publishing responses: idempotent producer, acks=all. A job is not done until its response
//! is acknowledged, so its offset is held while publishing fails:
//!
//! 1. the response is retried with backoff (`publish_attempts` times);
//! 2. then the request, its response and the error go to the dead-letter topic, which ends the
//!    message (a poison response never blocks its partition);
//! 3. if that fails too, both are retried for as long as it takes, the offset stays held (so the
//!    partition stops committing past it) and `/health/ready` reports `publishing: false`.
//!
//! A delivery report carrying an error is a failed attempt, not a publish. When the idempotent
//! producer hits a fatal error (it can then send nothing more), it is replaced by a new one.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::error::KafkaResult;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::util::Timeout;
use tokio_util::sync::CancellationToken;

use crate::config::KafkaSettings;
use crate::retry::backoff;
use crate::telemetry::{Health, Metrics};

pub struct Publisher {
    config: ClientConfig,
    producer: RwLock<FutureProducer>,
    topic: String,
    dlq_topic: String,
    attempts_before_dlq: u32,
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
}

/// How a message ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Published {
    Response,
    DeadLettered,
}

#[derive(Debug, thiserror::Error)]
#[error("publish abandoned after {attempts} attempts: {last}")]
pub struct PublishAbandoned {
    pub attempts: u32,
    pub last: String,
}

/// Marks the worker not ready while a message can be neither published nor dead-lettered.
struct Blocked<'a>(Option<&'a Health>);

impl<'a> Blocked<'a> {
    fn set(&mut self, health: &'a Health) {
        if self.0.is_none() {
            health.publish_blocked(true);
            self.0 = Some(health);
        }
    }
}

impl Drop for Blocked<'_> {
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
            attempts_before_dlq: settings.publish_attempts.max(1),
            metrics,
            health,
        })
    }

    /// Publishes the response (or dead-letters it, see the module doc) unless `give_up` is
    /// cancelled first.
    pub async fn publish(
        &self,
        out: &Outgoing<'_>,
        give_up: &CancellationToken,
    ) -> Result<Published, PublishAbandoned> {
        let mut blocked = Blocked(None);
        let mut attempts = 0;
        loop {
            attempts += 1;
            let err = match self
                .send(&self.topic, out.key, out.payload, out.traceparent, give_up)
                .await
            {
                Ok(()) => return Ok(Published::Response),
                Err(e) => e,
            };
            self.metrics.publish_failures.inc();
            tracing::warn!(attempts, error = %err, key = out.key, "response publish failed");
            if attempts >= self.attempts_before_dlq && !give_up.is_cancelled() {
                let record = self.dead_letter(out, &err);
                match self
                    .send(&self.dlq_topic, out.key, &record, out.traceparent, give_up)
                    .await
                {
                    Ok(()) => {
                        self.metrics.dead_lettered.inc();
                        tracing::error!(key = out.key, topic = %self.dlq_topic, error = %err,
                            "response not publishable: request dead-lettered");
                        return Ok(Published::DeadLettered);
                    }
                    Err(dlq) => {
                        tracing::error!(key = out.key, error = %dlq,
                            "dead-letter publish failed too: offset held, not ready");
                        blocked.set(&self.health);
                    }
                }
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
    ) -> Result<(), String> {
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
            r = producer.send(record, Timeout::After(Duration::from_secs(30))) => {
                r.map(|_| ()).map_err(|(e, _)| e.to_string())
            }
            _ = give_up.cancelled() => Err("shutdown deadline".to_owned()),
        };
        if result.is_err() {
            self.replace_if_fatal(&producer);
        }
        result
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
        let text = |b: Option<&[u8]>| b.map(|b| String::from_utf8_lossy(b).into_owned());
        let response: serde_json::Value =
            serde_json::from_slice(out.payload).unwrap_or(serde_json::Value::Null);
        serde_json::to_vec(&serde_json::json!({
            "source": {
                "topic": out.source_topic,
                "partition": out.source_partition,
                "offset": out.source_offset,
            },
            "request": text(out.request),
            "response_topic": self.topic,
            "response": response,
            "error": error,
        }))
        .expect("dead-letter record serialises")
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
