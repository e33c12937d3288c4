//! Publishing responses: idempotent producer, acks=all. A job is not done until its response
//! is acknowledged, so a failed delivery is retried with backoff while the offset is held.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::error::KafkaResult;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::util::Timeout;
use tokio_util::sync::CancellationToken;

use crate::config::KafkaSettings;
use crate::job::retry::backoff;
use crate::telemetry::Metrics;

pub struct Publisher {
    producer: FutureProducer,
    topic: String,
    metrics: Arc<Metrics>,
}

#[derive(Debug, thiserror::Error)]
#[error("publish abandoned after {attempts} attempts: {last}")]
pub struct PublishAbandoned {
    pub attempts: u32,
    pub last: String,
}

impl Publisher {
    pub fn new(settings: &KafkaSettings, metrics: Arc<Metrics>) -> KafkaResult<Publisher> {
        let producer: FutureProducer = super::producer_config(settings).create()?;
        Ok(Publisher {
            producer,
            topic: settings.response_topic.clone(),
            metrics,
        })
    }

    /// Publishes until acknowledged, or until `give_up` is cancelled.
    pub async fn publish(
        &self,
        key: &str,
        payload: &[u8],
        traceparent: Option<&str>,
        give_up: &CancellationToken,
    ) -> Result<(), PublishAbandoned> {
        let mut attempts = 0;
        loop {
            attempts += 1;
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
            let record = FutureRecord::to(&self.topic)
                .key(key)
                .payload(payload)
                .headers(headers);
            let err = tokio::select! {
                r = self.producer.send(record, Timeout::After(Duration::from_secs(30))) => match r {
                    Ok(_) => return Ok(()),
                    Err((e, _)) => e.to_string(),
                },
                _ = give_up.cancelled() => "shutdown deadline".to_owned(),
            };
            self.metrics.publish_failures.inc();
            tracing::warn!(attempts, error = %err, key, "response publish failed");
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

    /// Waits for queued messages to be delivered.
    pub fn flush(&self, timeout: Duration) {
        if let Err(e) = self.producer.flush(Timeout::After(timeout)) {
            tracing::warn!(error = %e, "producer flush incomplete");
        }
    }
}
