//! Progress events of long jobs (opt-in: `KAFKA_PROGRESS_TOPIC`). A follower task per job
//! watches its stage and progress (`JobHandle::watch`) and publishes a [`ProgressEvent`] keyed
//! like the response, at a bounded rate ([`Gate`]): none before `progress_delay_secs`, then
//! whenever the job has advanced by `progress_step` or `progress_interval_secs` have passed.
//! The follower is stopped and awaited before the response is published, so every event of a
//! job precedes its response. Events are best effort: sent once, each delivered within
//! [`SEND_TIMEOUT`] or never ([`BestEffort`]), so a topic that takes nothing (missing, without
//! a leader) delays a response by at most the one event in flight; a failed send is counted,
//! never retried.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::contract::{
    OptimizeRequest, ProgressEvent, ProgressStatus, SCHEMA_VERSION, Stage, WorkerInfo,
};
use crate::kafka::KafkaSettings;
use crate::kafka::producer::BestEffort;
use crate::registry::{JobHandle, JobProgress};
use crate::telemetry::Metrics;

/// How long one event may take to be delivered: the most a response waits for progress.
const SEND_TIMEOUT: Duration = Duration::from_secs(5);
/// Reported progress stays below this: only the response says a job is done.
const MAX_PROGRESS: f32 = 0.99;

/// The job's estimated completion, from each stage's share of a long (video) job: the
/// transcode is most of it.
pub fn overall(p: &JobProgress) -> f32 {
    let (start, width) = match p.stage {
        Stage::Validate | Stage::Download => (0.0, 0.05),
        Stage::Scan | Stage::Probe => (0.05, 0.0),
        Stage::Analyze | Stage::Transform => (0.05, 0.85),
        Stage::Upload => (0.9, 0.09),
        Stage::Publish => (MAX_PROGRESS, 0.0),
    };
    start + width * p.fraction.unwrap_or(0.0)
}

/// When to publish: the rate bound, and progress that never goes back (a retried attempt
/// starts its stages over).
#[derive(Debug)]
pub struct Gate {
    first_due: Instant,
    step: f32,
    interval: Duration,
    last: Option<(f32, Instant)>,
}

impl Gate {
    pub fn new(started: Instant, delay: Duration, step: f32, interval: Duration) -> Gate {
        Gate {
            first_due: started + delay,
            step,
            interval,
            last: None,
        }
    }

    /// The progress to publish now, if an event is due.
    pub fn admit(&mut self, progress: f32, now: Instant) -> Option<f32> {
        if now < self.first_due {
            return None;
        }
        let progress = match self.last {
            Some((last, _)) => progress.clamp(last, MAX_PROGRESS),
            None => progress.clamp(0.0, MAX_PROGRESS),
        };
        let due = match self.last {
            None => true,
            // A little slack for float sums (0.1 + 0.2 ...).
            Some((last, at)) => progress - last >= self.step - 1e-4 || now >= at + self.interval,
        };
        due.then(|| {
            self.last = Some((progress, now));
            progress
        })
    }

    /// When an event is due even if nothing changes (the first, or the next heartbeat).
    pub fn next_due(&self) -> Instant {
        match self.last {
            None => self.first_due,
            Some((_, at)) => at + self.interval,
        }
    }
}

/// What the followers of this worker's jobs need: where to publish and how often.
pub(super) struct Progress {
    sender: BestEffort,
    metrics: Arc<Metrics>,
    worker: WorkerInfo,
    topic: String,
    delay: Duration,
    step: f32,
    interval: Duration,
}

impl Progress {
    /// `None` when progress events are off (no progress topic).
    pub fn new(
        settings: &KafkaSettings,
        metrics: Arc<Metrics>,
        worker: WorkerInfo,
    ) -> rdkafka::error::KafkaResult<Option<Arc<Progress>>> {
        let Some(topic) = settings.progress_topic() else {
            return Ok(None);
        };
        Ok(Some(Arc::new(Progress {
            topic: topic.to_owned(),
            delay: Duration::from_secs(settings.progress_delay_secs),
            step: settings.progress_step,
            interval: Duration::from_secs(settings.progress_interval_secs),
            sender: BestEffort::new(settings, SEND_TIMEOUT)?,
            metrics,
            worker,
        })))
    }
}

impl Progress {
    /// A long video's unit landed (see `crate::units`): `landed` of its `of` units, whichever
    /// worker encoded them. The landed count only grows, so the events never go back; the
    /// stitch's share (the last 5 %) is the response's.
    pub async fn unit_landed(
        &self,
        req: &OptimizeRequest,
        landed: usize,
        of: usize,
        playable: Option<String>,
    ) {
        let event = ProgressEvent {
            schema_version: SCHEMA_VERSION,
            request_id: req.request_id.clone(),
            media_id: req.media_id.clone(),
            user_id: req.user_id.clone(),
            status: ProgressStatus::Progressing,
            progress: (landed as f32 / of.max(1) as f32 * 0.95).min(MAX_PROGRESS),
            stage: Stage::Transform,
            attempt: 1,
            elapsed_ms: 0,
            worker: self.worker.clone(),
            at: humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
            playable,
        };
        self.publish(&event).await;
    }

    /// One event, within its bound; counted as published or failed.
    async fn publish(&self, event: &ProgressEvent) {
        let payload = serde_json::to_vec(event).expect("progress event serialises");
        let result = match self
            .sender
            .send(&self.topic, &event.media_id, &payload)
            .await
        {
            Ok(()) => "published",
            Err(e) => {
                tracing::warn!(error = %e, media_id = %event.media_id, "progress event not sent");
                "failed"
            }
        };
        self.metrics
            .progress_events
            .with_label_values(&[result])
            .inc();
    }
}

/// A job's follower: stop it with [`Follower::finish`] before publishing the response.
pub(super) struct Follower {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Follower {
    /// Starts following `job`.
    pub fn start(progress: &Arc<Progress>, req: &OptimizeRequest, job: &JobHandle) -> Follower {
        let gate = Gate::new(
            Instant::now(),
            progress.delay,
            progress.step,
            progress.interval,
        );
        let stop = CancellationToken::new();
        let template = ProgressEvent {
            schema_version: SCHEMA_VERSION,
            request_id: req.request_id.clone(),
            media_id: req.media_id.clone(),
            user_id: req.user_id.clone(),
            status: ProgressStatus::Progressing,
            progress: 0.0,
            stage: Stage::Validate,
            attempt: 0,
            elapsed_ms: 0,
            worker: progress.worker.clone(),
            at: String::new(),
            playable: None,
        };
        let follow = follow(progress.clone(), template, gate, job.watch(), stop.clone());
        Follower {
            stop,
            task: tokio::spawn(follow),
        }
    }

    /// Stops following; returns once no event is being sent.
    pub async fn finish(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

async fn follow(
    out: Arc<Progress>,
    mut event: ProgressEvent,
    mut gate: Gate,
    mut job: tokio::sync::watch::Receiver<JobProgress>,
    stop: CancellationToken,
) {
    let started = Instant::now();
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            changed = job.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep_until(gate.next_due()) => {}
        }
        let now = *job.borrow_and_update();
        let Some(progress) = gate.admit(overall(&now), Instant::now()) else {
            continue;
        };
        event.progress = progress;
        event.stage = now.stage;
        event.attempt = now.attempt;
        event.elapsed_ms = started.elapsed().as_millis() as u64;
        event.at = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();
        out.publish(&event).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(stage: Stage, fraction: Option<f32>) -> JobProgress {
        JobProgress {
            stage,
            fraction,
            attempt: 1,
        }
    }

    #[test]
    fn the_transcode_is_most_of_a_job() {
        assert_eq!(overall(&at(Stage::Download, None)), 0.0);
        assert!((overall(&at(Stage::Transform, Some(0.5))) - 0.475).abs() < 1e-6);
        let transcoded = overall(&at(Stage::Transform, Some(1.0)));
        assert!(overall(&at(Stage::Upload, None)) + 1e-6 >= transcoded);
        assert!(overall(&at(Stage::Publish, None)) < 1.0);
    }

    #[test]
    fn events_are_bounded_by_step_and_interval_and_never_go_back() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut g = Gate::new(t0, s(5), 0.1, s(30));
        assert_eq!(g.admit(0.3, t0 + s(4)), None, "nothing before the delay");
        assert_eq!(g.next_due(), t0 + s(5));
        assert_eq!(g.admit(0.3, t0 + s(5)), Some(0.3));
        assert_eq!(g.admit(0.35, t0 + s(6)), None, "less than a step");
        assert_eq!(g.admit(0.4, t0 + s(7)), Some(0.4));
        assert_eq!(g.next_due(), t0 + s(37));
        assert_eq!(g.admit(0.42, t0 + s(37)), Some(0.42), "heartbeat");
        // A retried attempt starts over at download: reported progress holds.
        assert_eq!(g.admit(0.0, t0 + s(67)), Some(0.42));
        assert_eq!(g.admit(1.0, t0 + s(68)), Some(MAX_PROGRESS), "never done");
        // 0 → 0.99 by tiny increments every 100 ms for 100 s: 10 steps and 3 heartbeats at most.
        let mut g = Gate::new(t0, s(0), 0.1, s(30));
        let n = (0..=1000)
            .filter(|i| {
                g.admit(*i as f32 / 1000.0, t0 + Duration::from_millis(100 * i))
                    .is_some()
            })
            .count();
        assert!((10..=14).contains(&n), "{n}");
    }
}
