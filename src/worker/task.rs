//! One message, start to finish: validate → run the job → publish → ack. The offset is acked
//! only once the response is published; an abandoned job is neither published nor acked.

use std::sync::Arc;
use std::time::Instant;

use tracing::Instrument;

use crate::contract::{OptimizeResponse, Stage};
use crate::job::{Answer, As, JobRunner, TaskEnd, response};
use crate::kafka::{Delivery, Lane, Publisher};
use crate::shutdown::Shutdown;
use crate::stages::{publish, validate};
use crate::telemetry::{self, Origin, traces};
use crate::units::store::Answered;
use crate::units::{Stitches, Task};

use super::progress::{Follower, Progress};

/// Everything a message task needs.
pub(super) struct Ctx {
    pub runner: JobRunner,
    pub publisher: Arc<Publisher>,
    pub shutdown: Shutdown,
    /// Where long jobs report progress; `None` when progress events are off.
    pub progress: Option<Arc<Progress>>,
    /// A plan's stitch tasks, one at a time.
    pub stitches: Stitches,
}

/// The message in its `media.process_event` span (which continues the producer's trace).
pub(super) async fn handle(d: Delivery, ctx: Arc<Ctx>) {
    // OpenTelemetry's messaging conventions (v1.27+); `error.type` and an ERROR status when
    // the job fails.
    let group = &ctx.runner.services().settings.kafka.group_id;
    let span = tracing::info_span!(
        "media.process_event",
        otel.kind = "consumer",
        otel.status_code = tracing::field::Empty,
        messaging.system = "kafka",
        messaging.operation.type = "process",
        messaging.operation.name = "process",
        messaging.destination.name = %d.topic,
        messaging.destination.partition.id = %d.partition,
        messaging.consumer.group.name = %group,
        messaging.kafka.offset = d.offset,
        event.s3_key = tracing::field::Empty,
        "media.type" = tracing::field::Empty,
        job.retry_count = tracing::field::Empty,
        processing.success = tracing::field::Empty,
        error.code = tracing::field::Empty,
        error.type = tracing::field::Empty,
    );
    traces::continue_trace(&span, d.traceparent.as_deref());
    handle_in_span(d, ctx, span.clone()).instrument(span).await
}

async fn handle_in_span(d: Delivery, ctx: Arc<Ctx>, span: tracing::Span) {
    let svc = ctx.runner.services();
    if d.lane == Lane::Units {
        return unit_task(d, ctx).await;
    }
    let started = Instant::now();
    let (response, job) = match validate::parse(d.payload.as_deref(), &svc.settings) {
        Ok(req) => {
            span.record("event.s3_key", req.source.key.as_str());
            let job = svc.registry.start(&req.request_id, &req.media_id);
            let progress = ctx
                .progress
                .as_ref()
                .map(|p| Follower::start(p, &req, &job));
            let r = tokio::select! {
                r = ctx.runner.run_as(&req, &job, &As::Request) => Some(r),
                _ = ctx.shutdown.abandoned() => None,
            };
            // Every progress event is out before the response.
            if let Some(p) = progress {
                p.finish().await;
            }
            match r {
                None => return,
                // A long video's plan went to its units: the stitch answers (`crate::units`).
                Some(Answer::HandedOff) => return d.finished(),
                Some(Answer::Respond(r)) => (*r, Some(job)),
            }
        }
        Err(invalid) => {
            tracing::warn!(partition = d.partition, offset = d.offset, reason = %invalid.reason, "invalid request");
            (response::for_invalid(&svc.worker, &invalid, started), None)
        }
    };
    record_in_span(&span, &response);
    if publish_response(&ctx, &d, &response, job.as_ref(), started).await {
        d.finished();
    }
}

/// The response to `d`, observed and published; false when it could not be (the offset is
/// then held for redelivery).
async fn publish_response(
    ctx: &Ctx,
    d: &Delivery,
    response: &OptimizeResponse,
    job: Option<&crate::registry::JobHandle>,
    started: Instant,
) -> bool {
    let svc = ctx.runner.services();
    svc.metrics.observe_response(response, started.elapsed());
    telemetry::job_finished(
        response,
        Origin::Kafka {
            partition: d.partition,
            offset: d.offset,
        },
    );
    if let Some(job) = job {
        job.stage(Stage::Publish);
    }
    let topic = &svc.settings.kafka.response_topic;
    let give_up = ctx.shutdown.job();
    match publish::run(&ctx.publisher, &svc.metrics, topic, response, d, &give_up).await {
        Ok(()) => true,
        Err(e) => {
            tracing::error!(error = %e, partition = d.partition, offset = d.offset,
                "response not published; offset held for redelivery");
            false
        }
    }
}

/// A record of the unit topic (see `crate::units`): a unit, acked once recorded; or the
/// stitch, acked once its response is published and the plan marked answered, or once it
/// found the answer another task's.
async fn unit_task(d: Delivery, ctx: Arc<Ctx>) {
    let svc = ctx.runner.services();
    let group = svc.settings.kafka.unit_group();
    let by = Answered::by(&group, &d.topic, d.partition, d.offset);
    let task: Task = match d.payload.as_deref().map(serde_json::from_slice) {
        Some(Ok(t)) => t,
        _ => {
            tracing::warn!(
                partition = d.partition,
                offset = d.offset,
                "not a unit task: skipped"
            );
            return d.finished();
        }
    };
    // Held to its response published and the plan marked answered, so that a second stitch
    // task of the plan finds it answered.
    let _stitching = if task.is_stitch() {
        tokio::select! {
            s = ctx.stitches.hold(task.plan.id()) => Some(s),
            _ = ctx.shutdown.abandoned() => return,
        }
    } else {
        None
    };
    let started = Instant::now();
    let label = task.key();
    let job = svc.registry.start(&label, task.plan.id());
    let r = tokio::select! {
        r = ctx.runner.run_task(&task, &job, &by) => r,
        _ = ctx.shutdown.abandoned() => return,
    };
    let response = match r {
        TaskEnd::Respond(r) => *r,
        TaskEnd::Landed(request, p) => {
            if let Some(progress) = &ctx.progress {
                progress
                    .unit_landed(&request, p.landed, p.of, p.playable)
                    .await;
            }
            return d.finished();
        }
        TaskEnd::Nothing => return d.finished(),
    };
    // One answer per plan, whichever pods stitched it: the task that claims it publishes.
    match ctx.runner.claim_answer(&task.plan, &by).await {
        None => return,
        Some(false) => return d.finished(),
        Some(true) => {}
    }
    if publish_response(&ctx, &d, &response, Some(&job), started).await
        && ctx
            .runner
            .mark_published(&task.plan, &by, response.error.is_none())
            .await
    {
        d.finished();
    }
}

fn record_in_span(span: &tracing::Span, r: &OptimizeResponse) {
    if let Some(m) = r.media_type {
        span.record("media.type", m.as_str());
    }
    span.record("job.retry_count", i64::from(r.attempts.saturating_sub(1)));
    span.record("processing.success", r.success);
    if let Some(e) = &r.error {
        span.record("error.code", e.code.as_str());
        span.record("error.type", e.code.as_str());
        span.record("otel.status_code", "ERROR");
    }
}
