//! The `run` command's engine: consumer deliveries become job tasks; each task validates, runs
//! the job, publishes the response and only then acks its offset. Shutdown drains in-flight
//! jobs within the deadline.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::config::Settings;
use crate::contract::Stage;
use crate::contract::{OptimizeResponse, WorkerInfo};
use crate::job::{JobRunner, Registry, Services, response, scratch};
use crate::kafka::producer::Outgoing;
use crate::kafka::{Acker, Delivery, KafkaSource, Publisher};
use crate::media;
use crate::stages::validate;
use crate::storage::Storage;
use crate::telemetry::http::{self, HttpState};
use crate::telemetry::traces;
use crate::telemetry::{Health, Metrics};

/// Everything a message task needs.
struct Ctx {
    runner: JobRunner,
    publisher: Publisher,
    acker: Acker,
    /// Cancelled at the shutdown deadline: unfinished jobs are abandoned, offsets not committed.
    abandon: CancellationToken,
}

/// How a `run` ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Exit {
    /// Every in-flight job finished and was committed.
    Drained,
    /// Jobs were abandoned at the shutdown deadline (they will be redelivered).
    Abandoned(usize),
}

pub fn worker_info(settings: &Settings) -> WorkerInfo {
    WorkerInfo {
        id: settings.worker_id(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
    }
}

/// Builds the job services (shared by `run`, `demo` and `process`).
pub fn services(settings: Arc<Settings>, storage: Arc<dyn Storage>) -> anyhow::Result<Services> {
    let removed = scratch::sweep(&settings.worker.tmp_dir)?;
    if removed > 0 {
        tracing::warn!(removed, dir = %settings.worker.tmp_dir.display(), "swept scratch dirs left by a previous run");
    }
    media::init(settings.worker.vips_threads);
    Ok(Services {
        worker: worker_info(&settings),
        settings,
        storage,
        metrics: Arc::new(Metrics::new()),
        registry: Registry::default(),
    })
}

/// Runs the worker until `shutdown` is cancelled, then drains. `bound` receives the HTTP address.
pub async fn run(
    svc: Services,
    shutdown: CancellationToken,
    bound: Option<oneshot::Sender<SocketAddr>>,
) -> anyhow::Result<Exit> {
    let settings = svc.settings.clone();
    let health = Arc::new(Health::new(settings.worker.min_scratch_free_bytes));
    let http_stop = CancellationToken::new();
    let state = HttpState {
        metrics: svc.metrics.clone(),
        registry: svc.registry.clone(),
        health: health.clone(),
        scratch_dir: settings.worker.tmp_dir.clone(),
    };
    let addr = http::serve(settings.http.addr, state, http_stop.clone()).await?;
    tracing::info!(%addr, pool = settings.pool_size(), "http listening");
    if let Some(tx) = bound {
        let _ = tx.send(addr);
    }

    let (source, acker, mut deliveries) =
        KafkaSource::start(&settings, svc.metrics.clone(), health.clone())?;
    tokio::spawn(probe_storage(
        svc.storage.clone(),
        settings.clone(),
        health.clone(),
        http_stop.clone(),
    ));
    let publisher = Publisher::new(&settings.kafka, svc.metrics.clone(), health.clone())?;
    let ctx = Arc::new(Ctx {
        runner: JobRunner::new(svc.clone()),
        publisher,
        acker,
        abandon: CancellationToken::new(),
    });
    let tasks = TaskTracker::new();
    health.set_consuming(true);
    tracing::info!(topic = %settings.kafka.request_topic, "consuming");

    loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            d = deliveries.recv() => match d {
                Some(d) => { tasks.spawn(handle(d, ctx.clone())); }
                None => { tracing::error!("consumer stopped"); break; }
            },
        }
    }

    // Drain: not ready, no new messages, let in-flight jobs finish and publish.
    let deadline = Instant::now() + settings.shutdown_timeout();
    health.set_consuming(false);
    source.stop_fetching();
    tasks.close();
    // Keep a little of the budget for the final commit, leaving the group and flushing.
    let reserve = (settings.shutdown_timeout() / 5).min(Duration::from_secs(3));
    let in_flight = svc.registry.len();
    tracing::info!(in_flight, "draining");
    let drained = tokio::time::timeout_at((deadline - reserve).into(), tasks.wait())
        .await
        .is_ok();
    let exit = if drained {
        Exit::Drained
    } else {
        let left = svc.registry.len();
        tracing::error!(
            abandoned = left,
            "shutdown deadline reached, abandoning jobs"
        );
        ctx.abandon.cancel();
        // Native work cannot be abandoned like a task: kill the ffmpeg children now, so none
        // outlives the worker.
        let killed = ctx.runner.abort_all();
        if killed > 0 {
            tracing::warn!(killed, "ffmpeg processes killed");
        }
        Exit::Abandoned(left)
    };
    tokio::task::spawn_blocking(move || source.close()).await?;
    ctx.publisher.flush(
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(100)),
    );
    http_stop.cancel();
    tracing::info!(?exit, "worker stopped");
    Ok(exit)
}

/// Checks the output bucket every `storage.probe_interval_secs` for `/health/ready` (a worker
/// that cannot write its outputs should not take work).
async fn probe_storage(
    storage: Arc<dyn Storage>,
    settings: Arc<Settings>,
    health: Arc<Health>,
    stop: CancellationToken,
) {
    let bucket = &settings.storage.output_bucket;
    let period = Duration::from_secs(settings.storage.probe_interval_secs);
    let mut every = tokio::time::interval(period);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = every.tick() => {}
        }
        let r = storage.check(bucket).await;
        if let Err(e) = &r {
            tracing::warn!(bucket = %bucket, error = %e, "output bucket check failed");
        }
        health.set_storage_ok(r.is_ok());
    }
}

/// One message, start to finish, in its `media.process_event` span (which continues the
/// producer's trace).
async fn handle(d: Delivery, ctx: Arc<Ctx>) {
    let span = tracing::info_span!(
        "media.process_event",
        otel.kind = "consumer",
        messaging.system = "kafka",
        messaging.operation = "process",
        messaging.destination.name = %d.topic,
        messaging.kafka.destination.partition = d.partition,
        messaging.kafka.message.offset = d.offset,
        event.s3_key = tracing::field::Empty,
        "media.type" = tracing::field::Empty,
        job.retry_count = tracing::field::Empty,
        processing.success = tracing::field::Empty,
        error.code = tracing::field::Empty,
    );
    traces::continue_trace(&span, d.traceparent.as_deref());
    handle_in_span(d, ctx, span.clone()).instrument(span).await
}

/// The offset is acked only once the response is published.
async fn handle_in_span(d: Delivery, ctx: Arc<Ctx>, span: tracing::Span) {
    let svc = ctx.runner.services();
    let started = Instant::now();
    let (response, job) = match validate::parse(d.payload.as_deref(), &svc.settings) {
        Ok(req) => {
            span.record("event.s3_key", req.source.key.as_str());
            let job = svc.registry.start(&req.request_id, &req.media_id);
            let r = tokio::select! {
                r = ctx.runner.run(&req, &job) => r,
                _ = ctx.abandon.cancelled() => return,
            };
            (r, Some(job))
        }
        Err(invalid) => {
            tracing::warn!(partition = d.partition, offset = d.offset, reason = %invalid.reason, "invalid request");
            (response::for_invalid(&svc.worker, &invalid, started), None)
        }
    };
    record(svc, &response, &d, started);
    if let Some(m) = response.media_type {
        span.record("media.type", m.as_str());
    }
    span.record(
        "job.retry_count",
        i64::from(response.attempts.saturating_sub(1)),
    );
    span.record("processing.success", response.success);
    if let Some(e) = &response.error {
        span.record("error.code", e.code.as_str());
    }
    if let Some(job) = &job {
        job.stage(Stage::Publish);
    }
    // Key by media_id; a payload without a usable one is keyed by where it came from.
    let key = response
        .media_id
        .clone()
        .filter(|m| validate::is_valid_id(m))
        .unwrap_or_else(|| format!("{}-{}-{}", d.topic, d.partition, d.offset));
    let payload = serde_json::to_vec(&response).expect("response serialises");
    let publish = tracing::info_span!(
        "kafka.send_processing_result",
        otel.kind = "producer",
        messaging.system = "kafka",
        messaging.operation = "publish",
        messaging.destination.name = %svc.settings.kafka.response_topic,
        messaging.kafka.message.key = %key,
    );
    let traceparent = traces::traceparent_of(&publish);
    let t = Instant::now();
    let out = Outgoing {
        key: &key,
        payload: &payload,
        traceparent: traceparent.as_deref(),
        request: d.payload.as_deref(),
        source_topic: &d.topic,
        source_partition: d.partition,
        source_offset: d.offset,
    };
    let published = ctx
        .publisher
        .publish(&out, &ctx.abandon)
        .instrument(publish)
        .await;
    match published {
        Ok(_) => {
            svc.metrics.observe_stage(Stage::Publish, t.elapsed());
            ctx.acker.finished(d.token);
        }
        Err(e) => {
            tracing::error!(error = %e, key, "response not published; offset held for redelivery")
        }
    }
}

/// Metrics and the one log line per job outcome.
fn record(svc: &Services, r: &OptimizeResponse, d: &Delivery, started: Instant) {
    let outcome = match r.status {
        crate::contract::Status::Completed => "completed",
        crate::contract::Status::Degraded => "degraded",
        crate::contract::Status::Failed => "failed",
    };
    let code = r.error.as_ref().map_or("", |e| e.code.as_str());
    let media_type = r.media_type.map_or("unknown", |m| m.as_str());
    svc.metrics.jobs.with_label_values(&[outcome, code]).inc();
    svc.metrics.job_finished(started.elapsed());
    svc.metrics
        .job_duration
        .with_label_values(&[media_type, outcome])
        .observe(started.elapsed().as_secs_f64());
    tracing::info!(
        request_id = r.request_id.as_deref().unwrap_or(""),
        media_id = r.media_id.as_deref().unwrap_or(""),
        partition = d.partition,
        offset = d.offset,
        status = outcome,
        error_code = code,
        stage = r.error.as_ref().map_or("", |e| e.stage.as_str()),
        attempts = r.attempts,
        outputs = r.outputs.len(),
        replayed = r.replayed,
        duration_ms = r.duration_ms,
        "job finished"
    );
}
