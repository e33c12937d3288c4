//! Stage 7: the response onto the response topic, keyed by `media_id` (or by where the request
//! came from, when it carried no usable one), in a producer span that continues the job's trace.
//! Retries, dead letters and holding the offset are the publisher's (`kafka::producer`).

use std::time::Instant;

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::contract::{ErrorBody, ErrorCode, OptimizeResponse, Stage, Status};
use crate::kafka::producer::{Outgoing, PublishAbandoned};
use crate::kafka::{Delivery, Publisher};
use crate::telemetry::{Metrics, traces};

use super::validate;

/// The record key of the response to the request in `d`.
pub fn key(response: &OptimizeResponse, d: &Delivery) -> String {
    response
        .media_id
        .clone()
        .filter(|m| validate::is_valid_id(m))
        .unwrap_or_else(|| format!("{}-{}-{}", d.topic, d.partition, d.offset))
}

/// What is published when neither `response` nor its dead letter is accepted by the broker: the
/// same ids and metadata, no outputs or analysis, an `internal` error. A few kilobytes at most:
/// the ids and the metadata are bounded by validation.
pub fn minimal(r: &OptimizeResponse) -> OptimizeResponse {
    // Field by field: cloning the whole response would copy its outputs and analysis on every
    // job, only to drop them.
    OptimizeResponse {
        schema_version: r.schema_version,
        request_id: r.request_id.clone(),
        media_id: r.media_id.clone(),
        user_id: r.user_id.clone(),
        success: false,
        status: Status::Failed,
        media_type: r.media_type,
        source: None,
        outputs: Vec::new(),
        srcset: Vec::new(),
        analysis: None,
        warnings: Vec::new(),
        error: Some(ErrorBody {
            code: ErrorCode::Internal,
            message: "the response was rejected by the broker, and so was its dead letter".into(),
            stage: Stage::Publish,
            retryable: false,
        }),
        attempts: r.attempts,
        duration_ms: r.duration_ms,
        worker: r.worker.clone(),
        completed_at: r.completed_at.clone(),
        replayed: false,
        source_missing: false,
        metadata: r.metadata.clone(),
    }
}

/// Publishes `response` (the answer to `d`) on `topic`; `give_up` ends the attempts when the job
/// is abandoned at shutdown.
pub async fn run(
    publisher: &Publisher,
    metrics: &Metrics,
    topic: &str,
    response: &OptimizeResponse,
    d: &Delivery,
    give_up: &CancellationToken,
) -> Result<(), PublishAbandoned> {
    let key = key(response, d);
    let payload = serde_json::to_vec(response).expect("response serialises");
    let fallback = serde_json::to_vec(&minimal(response)).expect("response serialises");
    let span = tracing::info_span!(
        "kafka.send_processing_result",
        otel.kind = "producer",
        messaging.system = "kafka",
        messaging.operation.type = "send",
        messaging.operation.name = "send",
        messaging.destination.name = %topic,
        messaging.kafka.message.key = %key,
    );
    let traceparent = traces::traceparent_of(&span);
    let started = Instant::now();
    let out = Outgoing {
        key: &key,
        payload: &payload,
        traceparent: traceparent.as_deref(),
        request: d.payload.as_deref(),
        source_topic: &d.topic,
        source_partition: d.partition,
        source_offset: d.offset,
        fallback: &fallback,
    };
    publisher.publish(&out, give_up).instrument(span).await?;
    metrics.observe_stage(Stage::Publish, response.media_type, started.elapsed());
    Ok(())
}
