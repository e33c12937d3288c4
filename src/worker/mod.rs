//! The `run` command's engine, in the shape of mini-redis's `server.rs`: [`Worker::start`]
//! brings up the operations listener, the probes, the job API and Kafka intake;
//! [`Worker::run`] is poll → spawn until the drain (or the consumer stops), each delivery a
//! message task ([`task`]: validate, run the job, publish, ack); then the worker is handed to
//! [`Shutdown::stop`], which executes the stop sequence on it ([`Stoppable`]).

mod progress;
mod task;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio_util::task::TaskTracker;

use crate::api;
use crate::config::Settings;
use crate::health::watch_storage;
use crate::http::ops::{self, HttpState};
use crate::job::{JobRunner, Services};
use crate::kafka::flow::Places;
use crate::kafka::handover::{self, Seeded};
use crate::kafka::producer::TaskSender;
use crate::kafka::{Bound, Delivery, KafkaSource, Lane, LookAhead, Publisher};
use crate::shutdown::{Shutdown, Stoppable, Stopped};
use progress::Progress;
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

/// The Kafka side of a worker: its consumers (the request lane, and the unit lane with a unit
/// topic: `kafka::consumer`, "Two groups"), their deliveries and the message tasks' context.
struct Intake {
    sources: Vec<KafkaSource>,
    ctx: Arc<Ctx>,
}

type Deliveries = tokio::sync::mpsc::UnboundedReceiver<Delivery>;

/// The unit lane's choice among the tasks it has fetched (`kafka::ahead`): a plan's first unit,
/// its audio's opening and its stitch before the other tasks held, looked for up to 256 deep
/// in each partition (four 20-minute videos at once are 600 units over the partitions).
const UNIT_LOOK_AHEAD: LookAhead = LookAhead {
    depth: 256,
    urgent: crate::units::Task::is_urgent_key,
};

/// How often a worker asks the broker whether its unit topic exists (and how many partitions
/// it has): a topic created or grown after the pods started is used from then on.
const UNIT_TOPIC_CHECK: Duration = Duration::from_secs(30);

impl Intake {
    fn start(svc: &Services, shutdown: &Shutdown) -> anyhow::Result<(Intake, Vec<Deliveries>)> {
        let (settings, health) = (&svc.settings, &svc.health);
        let mut sources = Vec::new();
        let mut deliveries = Vec::new();
        let bound = bound(settings);
        for (lane, look) in [
            (Lane::Requests, LookAhead::IN_TURN),
            (Lane::Units, UNIT_LOOK_AHEAD),
        ] {
            let started = KafkaSource::start(
                &settings.kafka,
                lane,
                bound.clone(),
                settings.worker.tmp_dir.clone(),
                look,
                svc.metrics.clone(),
                health.clone(),
            )?;
            if let Some((source, d)) = started {
                sources.push(source);
                deliveries.push(d);
            }
        }
        let publisher = Arc::new(Publisher::new(
            &settings.kafka,
            svc.metrics.clone(),
            health.clone(),
        )?);
        let progress = Progress::new(&settings.kafka, svc.metrics.clone(), svc.worker.clone())?;
        let mut runner = JobRunner::new(svc.clone(), shutdown.clone());
        if let Some(topic) = settings.kafka.unit_topic() {
            let sender = Arc::new(TaskSender::new(&settings.kafka, topic)?);
            tokio::spawn(watch_unit_topic(
                sender.clone(),
                topic.to_owned(),
                svc.clone(),
                shutdown.finished(),
            ));
            runner = runner.with_dispatch(Arc::new(UnitTasks(sender)));
        }
        let ctx = Arc::new(Ctx {
            runner,
            publisher,
            shutdown: shutdown.clone(),
            progress,
            stitches: Default::default(),
        });
        Ok((Intake { sources, ctx }, deliveries))
    }
}

/// The lanes' bound: `MAX_IN_FLIGHT` for requests and unit-topic tasks together, of which the
/// unit lane holds at most its slots (`kafka::flow::Places`).
fn bound(settings: &Settings) -> Bound {
    Bound::new(Places::new(settings.max_in_flight(), settings.pool_size()))
}

/// Asks the broker whether the unit topic exists, at once and every [`UNIT_TOPIC_CHECK`]:
/// said at startup and whenever it changes, and in `/health/ready` (`unit_topic`). While it is
/// missing, long videos are encoded by the worker that takes them. A worker that holds no
/// partition of it at two checks in a row (`media_worker_kafka_unit_partitions` 0) says so
/// once: the topic has fewer partitions than its group has members, and this worker encodes
/// no unit of any long video.
async fn watch_unit_topic(
    sender: Arc<TaskSender>,
    topic: String,
    svc: Services,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut known = None;
    let (mut idle_before, mut idle_said) = (false, false);
    let mut every = tokio::time::interval(UNIT_TOPIC_CHECK);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = every.tick() => {}
        }
        let s = sender.clone();
        let Ok(Some(exists)) = tokio::task::spawn_blocking(move || s.check()).await else {
            continue;
        };
        svc.health.set_unit_topic(exists);
        if known != Some(exists) {
            if exists {
                tracing::info!(topic, "unit topic found: long videos spread over the fleet");
            } else {
                tracing::error!(
                    topic,
                    "the unit topic does not exist: long videos are encoded \
                    by the worker that takes them until it is created (docs/operations.md, \
                    \"Long videos\")"
                );
            }
            known = Some(exists);
        }
        let idle = exists && svc.metrics.unit_partitions.get() == 0;
        if idle && idle_before && !idle_said {
            tracing::warn!(
                topic,
                group = svc.settings.kafka.unit_group(),
                "this worker holds no partition of the unit topic: it has fewer partitions \
                than its group has members, so this worker encodes no unit of a long video \
                (give it at least as many partitions as workers: docs/operations.md, \
                \"Long videos\")"
            );
        }
        idle_said = idle && (idle_said || idle_before);
        idle_before = idle;
    }
}

/// The unit group started where the request group left the unit topic, when it is new
/// (`kafka::handover`): said in the log, and a failure said and passed over (the unit group
/// then starts at `earliest`, or where a pod that joined first left it).
async fn hand_over_units(kafka: &crate::kafka::KafkaSettings) {
    if kafka.unit_topic().is_none() {
        return;
    }
    let settings = kafka.clone();
    let seeded = tokio::task::spawn_blocking(move || handover::seed(&settings)).await;
    let group = kafka.unit_group();
    match seeded {
        Ok(Ok(Seeded::From(offsets))) => tracing::info!(
            unit_group = group,
            request_group = kafka.group_id,
            ?offsets,
            "the unit group starts where the request group left the unit topic"
        ),
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::warn!(unit_group = group, error = %e,
            "could not start the unit group where the request group left the unit topic"),
        Err(e) => tracing::error!(error = %e, "the unit group's start failed"),
    }
}

/// A long video's units, sent to the unit topic (see `crate::units`).
struct UnitTasks(Arc<TaskSender>);

#[async_trait::async_trait]
impl crate::units::Dispatch for UnitTasks {
    async fn send(&self, task: &crate::units::Task) -> Result<(), String> {
        let payload = serde_json::to_vec(task).expect("tasks serialise");
        let partition = task.place().map(|p| move |n| p.among(n));
        let sent = self.0.send(&task.key(), partition, &payload).await;
        if sent.is_err() {
            // The topic may be gone or refusing: asked again now rather than at the next
            // check, so that a long video taken meanwhile is encoded where it is taken.
            let sender = self.0.clone();
            let _ = tokio::task::spawn_blocking(move || sender.check()).await;
        }
        sent.map_err(|e| e.to_string())
    }

    fn available(&self) -> bool {
        self.0.available()
    }
}

/// A started worker: what [`Worker::run`] feeds and what the stop sequence stops.
pub struct Worker {
    svc: Services,
    intake: Option<Intake>,
    /// Taken by [`Worker::run`] and dropped when it returns: a message fetched after the drain
    /// is not dispatched (the poll loop sees the channel closed and stops).
    deliveries: Option<Vec<Deliveries>>,
    api: Option<api::Running>,
    /// The message tasks.
    tasks: TaskTracker,
    /// The job API's tasks (an empty tracker without the API).
    api_jobs: TaskTracker,
}

/// Runs the worker until `shutdown` drains, then stops as `Shutdown` documents. `bound`
/// receives the HTTP address.
pub async fn run(
    svc: Services,
    shutdown: Shutdown,
    bound: Option<oneshot::Sender<SocketAddr>>,
) -> anyhow::Result<Exit> {
    let timeout = svc.settings.shutdown_timeout();
    let mut worker = Worker::start(svc, &shutdown, bound).await?;
    let consumer_failed = worker.run(&shutdown).await;
    let exit = match shutdown.stop(worker, timeout).await {
        Stopped::Drained if consumer_failed => Exit::ConsumerFailed,
        Stopped::Drained => Exit::Drained,
        Stopped::Abandoned(n) => Exit::Abandoned(n),
    };
    tracing::info!(?exit, "worker stopped");
    Ok(exit)
}

impl Worker {
    /// The operations listener, the storage and clamd probes, the job API (when configured)
    /// and Kafka intake (unless `KAFKA_INTAKE=false`); the pod is ready from here.
    pub async fn start(
        svc: Services,
        shutdown: &Shutdown,
        bound: Option<oneshot::Sender<SocketAddr>>,
    ) -> anyhow::Result<Worker> {
        let settings = svc.settings.clone();
        let state = HttpState {
            metrics: svc.metrics.clone(),
            registry: svc.registry.clone(),
            health: svc.health.clone(),
            scratch_dir: settings.worker.tmp_dir.clone(),
            tokens: svc.tokens.clone(),
        };
        let limits = settings.http.limits();
        let addr = ops::serve(settings.http.addr, state, limits, shutdown.finished()).await?;
        tracing::info!(%addr, pool = settings.pool_size(), "http listening");
        if let Some(tx) = bound {
            let _ = tx.send(addr);
        }
        tokio::spawn(watch_storage(
            svc.storage.clone(),
            settings.storage.output_bucket.clone(),
            Duration::from_secs(settings.storage.probe_interval_secs),
            svc.health.clone(),
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
            hand_over_units(&settings.kafka).await;
            let (i, d) = Intake::start(&svc, shutdown)?;
            (Some(i), Some(d))
        } else {
            tracing::info!("KAFKA_INTAKE=false: serving the job API only");
            (None, None)
        };
        svc.health.set_consuming(true);
        let api_jobs = api
            .as_ref()
            .map_or_else(TaskTracker::new, |a| a.jobs.clone());
        Ok(Worker {
            svc,
            intake,
            deliveries,
            api,
            tasks: TaskTracker::new(),
            api_jobs,
        })
    }

    /// Poll → spawn until the drain; `true` when a consumer stopped by itself first.
    pub async fn run(&mut self, shutdown: &Shutdown) -> bool {
        let (Some(Intake { ctx, .. }), Some(deliveries)) = (&self.intake, self.deliveries.take())
        else {
            shutdown.draining().await;
            return false;
        };
        let kafka = &self.svc.settings.kafka;
        tracing::info!(topic = %kafka.request_topic, unit_topic = kafka.unit_topic(),
            unit_group = kafka.unit_topic().map(|_| kafka.unit_group()), "consuming");
        // Every lane's deliveries, in the order they come; one lane's consumer stopping (a
        // fatal error) stops the worker as a whole.
        let mut lanes = deliveries;
        loop {
            let next =
                futures_util::future::select_all(lanes.iter_mut().map(|l| Box::pin(l.recv())));
            tokio::select! {
                biased;
                _ = shutdown.draining() => return false,
                (d, _, _) = next => match d {
                    Some(d) => { self.tasks.spawn(task::handle(d, ctx.clone())); }
                    None => {
                        tracing::error!("consumer stopped");
                        return true;
                    }
                },
            }
        }
    }
}

impl Stoppable for Worker {
    /// Not ready, no new messages; in-flight jobs finish and publish. The API stopped taking
    /// requests at the drain; its running jobs count like the others.
    fn drain(&self) {
        self.svc.health.set_consuming(false);
        if let Some(intake) = &self.intake {
            for source in &intake.sources {
                source.stop_fetching();
            }
        }
        self.tasks.close();
        self.api_jobs.close();
        tracing::info!(in_flight = self.svc.registry.len(), "draining");
    }

    async fn jobs_finished(&self) {
        tokio::join!(self.tasks.wait(), self.api_jobs.wait());
    }

    /// Kills the sandboxes and any ffmpeg now, so that none outlives the worker.
    fn abandon(&self) -> usize {
        let left = self.svc.registry.len();
        tracing::error!(
            abandoned = left,
            "shutdown deadline reached, abandoning jobs"
        );
        let api_media = self.api.as_ref().map_or(0, |a| a.media.kill_all());
        let killed = self.svc.media.kill_all() + api_media;
        if killed > 0 {
            tracing::warn!(killed, "media processes killed");
        }
        left
    }

    /// Each step within what is left of `left`: the consumer's final commit and leaving the
    /// group wait for a coordinator that may be gone, and the pod is killed at its deadline.
    async fn close(self, left: Duration) {
        let by = tokio::time::Instant::now() + left;
        self.svc.media.close().await;
        if let Some(a) = &self.api {
            a.media.close().await;
        }
        if let Some(Intake { sources, ctx }) = self.intake {
            // The final commits first (their offsets matter more than the producer's queue:
            // every response was acknowledged before its offset was), the consumers side by
            // side with three quarters of what is left, so that the producer's flush gets the
            // rest.
            let within = by.saturating_duration_since(tokio::time::Instant::now()) * 3 / 4;
            let closing = sources
                .into_iter()
                .map(|source| tokio::task::spawn_blocking(move || source.close(within)));
            for closed in futures_util::future::join_all(closing).await {
                if let Err(e) = closed {
                    tracing::error!(error = %e, "closing a consumer failed");
                }
            }
            ctx.publisher
                .flush(by.saturating_duration_since(tokio::time::Instant::now()));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::kafka::flow::{Flow, Intake};

    fn settings(pairs: &[(&str, &str)]) -> Settings {
        let env = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        Settings::load_from(None, env).unwrap()
    }

    /// What a lane's poll loop takes now: its Flow's room, each message counted as taken.
    fn takes(bound: &Bound, lane: Lane, own: usize) -> usize {
        let mut flow = Flow::new(bound.max(lane), Duration::from_secs(1), Instant::now());
        let in_flight = bound.set(lane, own);
        let room = flow.turn(Instant::now(), in_flight, Intake::default()).room;
        (0..room).take_while(|_| bound.take(lane)).count()
    }

    #[test]
    fn max_in_flight_bounds_units_and_requests_together_and_leaves_requests_a_place() {
        // The disk-pressure runbook: MAX_IN_FLIGHT=2 on a pool of 4.
        let s = settings(&[
            ("KAFKA_UNIT_TOPIC", "units"),
            ("WORKER_POOL_SIZE", "4"),
            ("MAX_IN_FLIGHT", "2"),
        ]);
        let b = bound(&s);
        // Units queued by the dozen come first: one taken, one place left to a request.
        let units = takes(&b, Lane::Units, 0);
        assert_eq!(units, 1, "unit tasks taken with MAX_IN_FLIGHT=2");
        let requests = takes(&b, Lane::Requests, 0);
        assert_eq!((units, requests), (1, 1), "a request finds a place");
        assert_eq!(takes(&b, Lane::Units, units), 0, "all places held");
        // Requests first: they take both; a unit waits until one finishes, then takes it.
        let b = bound(&s);
        assert_eq!(takes(&b, Lane::Requests, 0), 2);
        assert_eq!(takes(&b, Lane::Units, 0), 0);
        b.set(Lane::Requests, 1);
        assert_eq!(takes(&b, Lane::Units, 0), 1);
        assert_eq!(takes(&b, Lane::Requests, 1), 0);
        // The defaults (2 x the pool): the units take all but one permit, the requests the
        // rest of the places.
        let s = settings(&[("KAFKA_UNIT_TOPIC", "units"), ("WORKER_POOL_SIZE", "4")]);
        let b = bound(&s);
        assert_eq!(takes(&b, Lane::Units, 0), 3);
        assert_eq!(takes(&b, Lane::Requests, 0), 5);
        // One permit: its unit on its lane beside one request.
        let s = settings(&[("KAFKA_UNIT_TOPIC", "units"), ("WORKER_POOL_SIZE", "1")]);
        let b = bound(&s);
        assert_eq!(
            (takes(&b, Lane::Units, 0), takes(&b, Lane::Requests, 0)),
            (1, 1)
        );
        // One place for all work leaves none for a unit beside a request: refused.
        let one = [("KAFKA_UNIT_TOPIC", "units"), ("MAX_IN_FLIGHT", "1")];
        let e = Settings::load_from(None, one.map(|(k, v)| (k.to_owned(), v.to_owned())));
        assert!(e.unwrap_err().to_string().contains("max_in_flight"));
    }
}
