//! The `run` command's engine: poll → spawn → drain. Consumer deliveries become message tasks
//! ([`task`]: validate, run the job, publish, ack); the stop sequence is [`Shutdown`]'s.

mod progress;
mod task;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tokio_util::task::TaskTracker;

use crate::api;
use crate::job::{JobRunner, Services};
use crate::kafka::{Delivery, KafkaSource, Publisher};
use crate::shutdown::Shutdown;
use crate::telemetry::health::watch_storage;
use crate::telemetry::http::{self, HttpState};
use task::Ctx;

/// How a `run` ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Exit {
    /// Every in-flight job finished and was committed.
    Drained,
    /// Jobs were abandoned at the shutdown deadline (they will be redelivered).
    Abandoned(usize),
    /// The consumer stopped by itself (a fatal error): the worker drained and exits so that it
    /// is restarted, and the cause is in the log.
    ConsumerFailed,
}

/// The Kafka side of a worker: the consumer, its deliveries and the message tasks' context.
struct Intake {
    source: KafkaSource,
    ctx: Arc<Ctx>,
}

type Deliveries = tokio::sync::mpsc::UnboundedReceiver<Delivery>;

impl Intake {
    fn start(svc: &Services, shutdown: &Shutdown) -> anyhow::Result<(Intake, Deliveries)> {
        let (settings, health) = (&svc.settings, &svc.health);
        let (source, acker, deliveries) =
            KafkaSource::start(settings, svc.metrics.clone(), health.clone())?;
        let publisher = Publisher::new(&settings.kafka, svc.metrics.clone(), health.clone())?;
        let ctx = Arc::new(Ctx {
            runner: JobRunner::new(svc.clone(), shutdown.clone()),
            publisher,
            acker,
            shutdown: shutdown.clone(),
        });
        Ok((Intake { source, ctx }, deliveries))
    }
}

/// Runs the worker until `shutdown` drains, then stops as `Shutdown` documents. `bound`
/// receives the HTTP address.
pub async fn run(
    svc: Services,
    shutdown: Shutdown,
    bound: Option<oneshot::Sender<SocketAddr>>,
) -> anyhow::Result<Exit> {
    let settings = svc.settings.clone();
    let health = svc.health.clone();
    let state = HttpState {
        metrics: svc.metrics.clone(),
        registry: svc.registry.clone(),
        health: health.clone(),
        scratch_dir: settings.worker.tmp_dir.clone(),
        tokens: svc.tokens.clone(),
    };
    let limits = http::Limits {
        max_connections: settings.http.max_connections.max(1),
        header_timeout: Duration::from_millis(settings.http.header_timeout_ms),
        max_body_bytes: settings.http.max_body_bytes,
    };
    let addr = http::serve(settings.http.addr, state, limits, shutdown.finished()).await?;
    tracing::info!(%addr, pool = settings.pool_size(), "http listening");
    if let Some(tx) = bound {
        let _ = tx.send(addr);
    }

    tokio::spawn(watch_storage(
        svc.storage.clone(),
        settings.storage.output_bucket.clone(),
        Duration::from_secs(settings.storage.probe_interval_secs),
        health.clone(),
        shutdown.finished(),
    ));
    if let Some(scanner) = &svc.scanner {
        tokio::spawn(crate::scan::watch(
            scanner.clone(),
            Duration::from_secs(settings.scan.probe_interval_secs),
            shutdown.finished(),
        ));
    }
    let api = match settings.api.addr {
        Some(_) => Some(api::serve(svc.clone(), shutdown.clone()).await?),
        None => None,
    };
    let (intake, deliveries) = if settings.kafka.intake {
        let (i, d) = Intake::start(&svc, &shutdown)?;
        (Some(i), Some(d))
    } else {
        tracing::info!("KAFKA_INTAKE=false: serving the job API only");
        (None, None)
    };
    let tasks = TaskTracker::new();
    health.set_consuming(true);

    // Poll → spawn.
    let mut consumer_failed = false;
    match (&intake, deliveries) {
        (Some(Intake { ctx, .. }), Some(mut deliveries)) => {
            tracing::info!(topic = %settings.kafka.request_topic, "consuming");
            loop {
                tokio::select! {
                    biased;
                    _ = shutdown.draining() => break,
                    d = deliveries.recv() => match d {
                        Some(d) => { tasks.spawn(task::handle(d, ctx.clone())); }
                        None => {
                            tracing::error!("consumer stopped");
                            consumer_failed = true;
                            break;
                        }
                    },
                }
            }
        }
        _ => shutdown.draining().await,
    }

    // Drain: not ready, no new messages, in-flight jobs finish and publish.
    shutdown.drain();
    let deadline = Instant::now() + settings.shutdown_timeout();
    health.set_consuming(false);
    if let Some(i) = &intake {
        i.source.stop_fetching();
    }
    tasks.close();
    // The API stopped taking requests at the drain; its running jobs count like the others.
    let (api_jobs, api_media) = match api {
        Some(a) => (a.jobs, Some(a.media)),
        None => (TaskTracker::new(), None),
    };
    api_jobs.close();
    // Keep a little of the budget for the final commit, leaving the group and flushing.
    let reserve = (settings.shutdown_timeout() / 5).min(Duration::from_secs(3));
    tracing::info!(in_flight = svc.registry.len(), "draining");
    let all = async { tokio::join!(tasks.wait(), api_jobs.wait()) };
    let drained = tokio::time::timeout_at((deadline - reserve).into(), all)
        .await
        .is_ok();
    let exit = if drained && consumer_failed {
        Exit::ConsumerFailed
    } else if drained {
        Exit::Drained
    } else {
        let left = svc.registry.len();
        tracing::error!(
            abandoned = left,
            "shutdown deadline reached, abandoning jobs"
        );
        shutdown.abandon();
        // Kill the sandboxes and any ffmpeg now, so that none outlives the worker.
        let killed = svc.media.kill_all() + api_media.as_ref().map_or(0, |m| m.kill_all());
        if killed > 0 {
            tracing::warn!(killed, "media processes killed");
        }
        Exit::Abandoned(left)
    };
    svc.media.close().await;
    if let Some(m) = &api_media {
        m.close().await;
    }
    if let Some(Intake { source, ctx }) = intake {
        tokio::task::spawn_blocking(move || source.close()).await?;
        ctx.publisher.flush(
            deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(100)),
        );
    }
    shutdown.finish();
    tracing::info!(?exit, "worker stopped");
    Ok(exit)
}
