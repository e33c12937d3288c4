//! Runs one validated request to its response: attempts, retries, stages.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::contract::{
    Analysis, ErrorCode, MediaType, OptimizeRequest, OptimizeResponse, ScanVerdict, SourceInfo,
    Stage,
};
use crate::error::JobError;
use crate::media::{Event, MediaError};
use crate::registry::{JobHandle, Phase};
use crate::retry;
use crate::sandbox::{Executor, Work};
use crate::scratch::{self, ScratchDir};
use crate::shutdown::Shutdown;
use crate::stages::manifest::{self, Manifest, Produced};
use crate::stages::resume;
use crate::stages::{download, upload};
use crate::storage::{Head, StorageError};

use super::response::{self, Done, Ending, Failure, Partial};
use super::role::{Answer, As, Handing};
use super::services::Services;
use crate::media::part::Part;

/// The CPU priority a long video's tasks (units, audio, stitch) run at, in their sandbox
/// children: a request's work at 0 beside one gets 90 % of a contended core (CFS weights 1024
/// to 110), so an image waits little for a unit running beside it, and the unit still moves.
pub const PART_NICE: i32 = 10;

/// How much longer a task on the parts lane may take than its time limits say: it shares its
/// core with requests and gets a tenth of it while they keep coming.
const LANE_SLACK: u64 = 4;

#[derive(Clone)]
pub struct JobRunner {
    svc: Services,
    /// One permit per concurrent job (cores by default).
    pool: Arc<Semaphore>,
    /// A one-permit pod's lane for a long video's tasks (`Settings::parts_lane`): they take
    /// its permit instead of the pool's.
    parts: Option<Arc<Semaphore>>,
    /// Every attempt's native work stops when jobs are abandoned (`Shutdown::job`).
    shutdown: Shutdown,
    /// Where the native work runs.
    media: Executor,
    /// Whether a job out of attempts while the pod is sick is held until it is well (Kafka:
    /// the message waits, uncommitted) rather than answered (the API: its client retries).
    hold_when_sick: bool,
    /// Where a long video's units go (`kafka.unit_topic`): without it, a long video's units
    /// are encoded by the job that took it, one after another.
    dispatch: Option<Arc<dyn crate::units::Dispatch>>,
}

impl JobRunner {
    /// How many jobs run at once.
    pub fn pool_size(&self) -> usize {
        self.svc.settings.pool_size()
    }

    /// The Kafka intake's runner: `pool_size` permits.
    pub fn new(svc: Services, shutdown: Shutdown) -> JobRunner {
        let size = svc.settings.pool_size();
        svc.metrics.pool_size.set(size as i64);
        let lane = svc.settings.parts_lane();
        JobRunner {
            pool: Arc::new(Semaphore::new(size)),
            parts: (lane > 0).then(|| Arc::new(Semaphore::new(lane))),
            shutdown,
            media: svc.media.clone(),
            svc,
            hold_when_sick: true,
            dispatch: None,
        }
    }

    /// Long videos spread as units through `dispatch` (see `crate::units`).
    pub fn with_dispatch(mut self, dispatch: Arc<dyn crate::units::Dispatch>) -> JobRunner {
        self.dispatch = Some(dispatch);
        self
    }

    /// The job API's runner: permits and media executor of its own (its jobs never take the
    /// Kafka pool's), and a job is answered rather than held while the pod is sick.
    pub fn for_api(
        svc: Services,
        shutdown: Shutdown,
        permits: usize,
        media: Executor,
    ) -> JobRunner {
        JobRunner {
            pool: Arc::new(Semaphore::new(permits.max(1))),
            parts: None,
            shutdown,
            media,
            svc,
            hold_when_sick: false,
            dispatch: None,
        }
    }

    pub fn services(&self) -> &Services {
        &self.svc
    }

    /// Where a long video's units go, while they can go there.
    pub(super) fn dispatch(&self) -> Option<&Arc<dyn crate::units::Dispatch>> {
        self.dispatch.as_ref().filter(|d| d.available())
    }

    /// A token for [`JobRunner::run_until`]: cancelled by the caller, or when jobs are
    /// abandoned at shutdown.
    pub fn cancel_token(&self) -> CancellationToken {
        self.shutdown.job()
    }

    /// Registers the job in the registry and runs it (for callers without a Kafka message).
    pub async fn run_registered(&self, req: &OptimizeRequest) -> OptimizeResponse {
        let job = self.svc.registry.start(&req.request_id, &req.media_id);
        self.run(req, &job).await
    }

    /// Runs a request to its final response. Never fails: a failure is a response too.
    pub async fn run(&self, req: &OptimizeRequest, job: &JobHandle) -> OptimizeResponse {
        self.run_until(req, job, self.shutdown.job()).await
    }

    /// As [`JobRunner::run`], stopped early when `cancel` fires (an API client that went away):
    /// its native work is killed and reaped, its scratch removed, no further attempt made.
    pub async fn run_until(
        &self,
        req: &OptimizeRequest,
        job: &JobHandle,
        cancel: CancellationToken,
    ) -> OptimizeResponse {
        let span = tracing::info_span!(
            "media.process_job_with_retry",
            job.retry_count = tracing::field::Empty
        );
        let r = match self
            .run_attempts(req, job, &cancel, &As::Request)
            .instrument(span.clone())
            .await
        {
            Answer::Respond(r) => *r,
            // Only a runner with a dispatch hands a request on.
            Answer::HandedOff => unreachable!("the API's runner never hands a job on"),
        };
        span.record("job.retry_count", i64::from(r.attempts.saturating_sub(1)));
        r
    }

    /// A Kafka request, or a unit task (`role`): its response, or nothing when it was handed
    /// on (see `crate::units`).
    pub async fn run_as(&self, req: &OptimizeRequest, job: &JobHandle, role: &As) -> Answer {
        let span = tracing::info_span!(
            "media.process_job_with_retry",
            job.retry_count = tracing::field::Empty
        );
        let cancel = self.shutdown.job();
        let a = self
            .run_attempts(req, job, &cancel, role)
            .instrument(span.clone())
            .await;
        if let Answer::Respond(r) = &a {
            span.record("job.retry_count", i64::from(r.attempts.saturating_sub(1)));
        }
        a
    }

    async fn run_attempts(
        &self,
        req: &OptimizeRequest,
        job: &JobHandle,
        cancel: &CancellationToken,
        role: &As,
    ) -> Answer {
        let started = Instant::now();
        // A redelivered or repeated request whose result is stored: replayed from the manifest.
        job.stage(Stage::Download);
        let svc = &self.svc;
        let (bucket, profile) = (
            &svc.settings.storage.output_bucket,
            manifest::profile_of(req),
        );
        let fingerprint = manifest::fingerprint(&svc.settings, profile);
        // One HEAD of the source: its ETag for the manifest, its size for admission. A source
        // that is gone is answered from its manifest when that records this profile (a request
        // delivered again after its original was deleted: see `manifest::lookup_without_source`).
        let head = svc.storage.head(&req.source).await;
        let source_missing = matches!(head, Err(StorageError::NotFound { .. }));
        let head = head.ok();
        let etag = head.as_ref().and_then(|h| h.etag.as_deref());
        let stored = if role.part().is_some() {
            None
        } else if source_missing {
            manifest::lookup_without_source(&*svc.storage, bucket, req).await
        } else {
            manifest::lookup(&*svc.storage, bucket, &fingerprint, req, etag).await
        };
        if let Some(done) = stored.map(|m| Done {
            produced: m.replay(req),
            replayed: true,
            source_missing,
            handed_off: false,
        }) {
            svc.metrics.replays.inc();
            tracing::info!(job = job.id(), source_missing, "replayed from the manifest");
            let r = response::for_request(&svc.worker, req, Ending::Done(done), 1, started);
            return Answer::Respond(Box::new(r));
        }
        let settings = &svc.settings;
        let max_attempts = settings.worker.retry_count + 1;
        // `attempt` counts every attempt (reported); `tries` those since the pod was last well.
        let (mut attempt, mut tries) = (0, 0);
        // The scratch the job needs, once an attempt met a full disk (more than it expected).
        let mut needs = 0;
        let ending = loop {
            attempt += 1;
            tries += 1;
            job.attempt(attempt);
            let span = tracing::info_span!("media.process_job", job.attempt = attempt);
            let result = self
                .attempt(req, job, &cancel.child_token(), head.as_ref(), needs, role)
                .instrument(span)
                .await;
            if let Err((f, _)) = &result
                && let JobError::ScratchFull { needed, .. } = f.error
            {
                needs = needed;
            }
            match result {
                Ok(done) if done.handed_off => return Answer::HandedOff,
                Ok(done) => break Ending::Done(done),
                // Nobody waits for the answer any more.
                Err((failure, partial)) if cancel.is_cancelled() => {
                    break Ending::Failed { failure, partial };
                }
                Err((failure, _)) if failure.error.is_transient() && tries < max_attempts => {
                    let code = failure.error.code().as_str();
                    svc.metrics.retries.with_label_values(&[code]).inc();
                    tracing::warn!(job = job.id(), attempt, stage = failure.stage.as_str(),
                        error = %failure.error, "transient failure, will retry");
                    job.phase(Phase::Backoff);
                    let wait = retry::backoff(
                        tries,
                        Duration::from_millis(settings.worker.retry_base_ms),
                        Duration::from_millis(settings.worker.retry_max_ms),
                    );
                    // A cancelled job's next attempt ends at once (and is not retried).
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = cancel.cancelled() => {}
                    }
                }
                Err((failure, partial)) => {
                    // Out of attempts for a fault of this pod or a dependency: while the pod is
                    // sick, hold the job (unanswered, uncommitted) until it is well, then start
                    // over. At shutdown it is abandoned and redelivered elsewhere.
                    if failure.error.is_transient()
                        && self.hold_when_sick
                        && self.hold_while_sick(job, &failure).await
                    {
                        tries = 0;
                        continue;
                    }
                    break Ending::Failed { failure, partial };
                }
            }
        };
        Answer::Respond(Box::new(response::for_request(
            &svc.worker,
            req,
            ending,
            attempt,
            started,
        )))
    }

    /// Waits while the pod cannot take work (`Health::intake_blocker`); false when it is well
    /// (the failure is then the job's to answer).
    async fn hold_while_sick(&self, job: &JobHandle, failure: &Failure) -> bool {
        let Some(reason) = self.blocker(failure).await else {
            return false;
        };
        tracing::warn!(job = job.id(), reason, stage = failure.stage.as_str(), error = %failure.error,
            "the pod is not well: job held until it is");
        let _held = self.svc.metrics.held_job();
        job.phase(Phase::Held);
        while self.blocker(failure).await.is_some() {
            tokio::time::sleep(HOLD_CHECK).await;
        }
        tracing::info!(job = job.id(), "the pod is well again: job resumed");
        true
    }

    /// Why the pod cannot take work now. After a storage failure the output store is checked
    /// at once: the periodic probe may not have seen the outage (or the recovery) yet.
    async fn blocker(&self, failure: &Failure) -> Option<&'static str> {
        let svc = &self.svc;
        if failure.error.code() == ErrorCode::StorageUnavailable {
            let ok = svc.storage.check(&svc.settings.storage.output_bucket).await;
            svc.health.set_storage_ok(ok.is_ok());
        }
        svc.health.intake_blocker(&svc.settings.worker.tmp_dir)
    }

    /// One attempt, in its own scratch directory (removed when this returns or is dropped),
    /// once its scratch is reserved (at least `needs` bytes), its writes metered against its
    /// budget (`scratch::Meter`: past it, the attempt is stopped). `cancel` stops it: the
    /// transfers at once, the native work killed and reaped. A failure is then judged by the
    /// scratch ([`JobRunner::by_pod_state`]).
    async fn attempt(
        &self,
        req: &OptimizeRequest,
        job: &JobHandle,
        cancel: &CancellationToken,
        head: Option<&Head>,
        needs: u64,
        role: &As,
    ) -> Result<Done, (Failure, Partial)> {
        let svc = &self.svc;
        let (_reservation, need) = self
            .admit(req, job, cancel, head, needs)
            .await
            .map_err(|f| (f, Partial::default()))?;
        let scratch = ScratchDir::create(&svc.settings.worker.tmp_dir, job.id())
            .map_err(|e| (Failure::at(Stage::Download)(e), Partial::default()))?;
        let stop = cancel.child_token();
        let meter = svc.admission.meter(scratch.path(), stop.clone());
        let r = self.attempt_in(req, job, &stop, &scratch, role).await;
        r.map_err(|(f, partial)| (self.by_pod_state(f, &meter, need), partial))
    }

    /// Admission by need, before anything is downloaded: the source's size from its HEAD (the
    /// job's, or a new one when that failed), what the job is expected to need
    /// ([`scratch::Admission::need_for`], or `needs` when an earlier attempt found it needed
    /// more), reserved against the free scratch; the job waits while it does not fit. A source
    /// larger than the whole scratch is the request's failure (`limits_exceeded`). Without a
    /// HEAD answer, no reservation: the download reports the source's fault or the store's.
    async fn admit(
        &self,
        req: &OptimizeRequest,
        job: &JobHandle,
        cancel: &CancellationToken,
        head: Option<&Head>,
        needs: u64,
    ) -> Result<(Option<scratch::Reservation>, u64), Failure> {
        let svc = &self.svc;
        let size = match head {
            Some(h) => Some(h.size_bytes),
            None => svc
                .storage
                .head(&req.source)
                .await
                .ok()
                .map(|h| h.size_bytes),
        };
        let Some(size) = size.filter(|s| *s <= svc.settings.limits.max_input_bytes) else {
            return Ok((None, needs));
        };
        let expected = svc.admission.need_for(size).map_err(|total| {
            Failure::at(Stage::Download)(JobError::ScratchTooSmall {
                source_bytes: size,
                total,
            })
        })?;
        let need = expected.max(needs);
        let reserve = svc.admission.reserve(need, |others| {
            // With nothing of ours holding space, only a larger or emptier volume lets it run:
            // the pod steps aside meanwhile.
            if !others {
                svc.health.want_scratch(need);
            }
            job.phase(if others { Phase::Queued } else { Phase::Held });
            tracing::warn!(job = job.id(), need, others, "waiting for scratch space");
        });
        let reservation =
            or_cancelled(cancel, Stage::Download, async { Ok(reserve.await) }).await?;
        Ok((Some(reservation), need))
    }

    /// A failure as the pod's state explains it. No sandbox could start: the pod's. Past the
    /// job's scratch budget: the request's, `limits_exceeded` with the figures, at once (no
    /// retry or wait could give it more). Within it, met on a full scratch: the pod's, whatever
    /// words the library used (libjpeg's "Output file write error", ffmpeg's "No space left",
    /// a short download), retried, and while the space the job needs is not back the pod steps
    /// aside and the job is held (see `scratch::Meter::verdict`).
    fn by_pod_state(&self, failure: Failure, meter: &scratch::Meter, need: u64) -> Failure {
        if let JobError::Media(MediaError::NotStarted(_)) = failure.error {
            self.sandbox_unavailable();
            return failure;
        }
        let verdict = meter.verdict(need, failure.error.could_be_scratch(), &failure.error);
        if let scratch::Verdict::Full { needed, .. } = verdict {
            self.svc.health.want_scratch(needed);
        }
        Failure {
            stage: failure.stage,
            error: failure.error.in_scratch(verdict),
        }
    }

    /// No process for media work could start (fork or exec failed: the pod's process or file
    /// limits): the pod is not ready (`sandbox: false`) and takes no new work until a probe
    /// starts a sandbox again, every [`HOLD_CHECK`]; its jobs are retried, then held.
    fn sandbox_unavailable(&self) {
        let health = self.svc.health.clone();
        if !health.set_sandbox_ok(false) {
            return; // already probing
        }
        tracing::warn!("no sandbox could start: a fault of this pod; not ready until one can");
        let media = self.media.clone();
        tokio::spawn(async move {
            let mut told = None;
            loop {
                tokio::time::sleep(HOLD_CHECK).await;
                match media.check().await {
                    Ok(()) => break,
                    Err(e) if told.as_ref() != Some(&e) => {
                        tracing::warn!(error = %e, "sandbox probe failed");
                        told = Some(e);
                    }
                    Err(_) => {}
                }
            }
            tracing::info!("a sandbox started again: ready for work");
            health.set_sandbox_ok(true);
        });
    }

    /// The stages of one attempt, in `scratch`.
    async fn attempt_in(
        &self,
        req: &OptimizeRequest,
        job: &JobHandle,
        cancel: &CancellationToken,
        scratch: &ScratchDir,
        role: &As,
    ) -> Result<Done, (Failure, Partial)> {
        let svc = &self.svc;
        if let As::Stitch { .. } = role {
            return self.stitch_in(req, job, cancel, scratch, role).await;
        }

        let source_path = scratch.source();
        // A part (a unit, the audio) reads its part of the source where its plan says which
        // (the whole file otherwise, and if its work fails on the part: see below).
        let ranged = match role.part() {
            Some((_, record, reads, _)) if !reads.is_empty() => Some((record, reads)),
            _ => None,
        };
        // The request of a long MP4/MOV on a worker that spreads it: the plan's part.
        let profile = manifest::profile_of(req);
        let mut plan_ranged = false;
        let mut source = match ranged {
            None if self.reads_in_parts(req, profile, role) => {
                match self.plan_source(req, job, cancel, scratch, role).await? {
                    Some(source) => {
                        plan_ranged = true;
                        source
                    }
                    None => self.download_whole(req, job, cancel, &source_path).await?,
                }
            }
            Some((record, reads)) => {
                let download = download::ranges(
                    &*svc.storage,
                    &svc.metrics,
                    &req.source,
                    &source_path,
                    record.source_size,
                    reads,
                    &record.source_etag,
                );
                let download = self.timed(job, Stage::Download, req.media_type, download);
                or_cancelled(cancel, Stage::Download, download)
                    .await
                    .map_err(|f| (changed(f, record), Partial::default()))?
            }
            None => self.download_whole(req, job, cancel, &source_path).await?,
        };
        // A part is made of the version its plan was made of, or nothing.
        if let Some(f) = not_planned(role, &source) {
            return Err((f, partial(&source, &None)));
        }

        // Scan → nothing decodes a source that clamd has not passed.
        // What the resume record and the manifest are kept for: this profile's settings.
        let fingerprint = manifest::fingerprint(&svc.settings, profile);
        // A unit's source was scanned when its request was.
        let scan = if svc.settings.profiles[profile].scan && matches!(role, As::Request) {
            let scanning = self.timed(job, Stage::Scan, req.media_type, self.scan(scratch));
            let verdict = or_cancelled(cancel, Stage::Scan, scanning)
                .await
                .map_err(|f| (f, partial(&source, &None)))?;
            if let Some(sig) = &verdict.signature {
                let failure = Failure::at(Stage::Scan)(JobError::Malware(sig.clone()));
                return Err((failure, partial(&source, &Some(verdict))));
            }
            Some(verdict)
        } else {
            None
        };

        // probe → analyze → transform: native code behind the one narrow function
        // `media::process`, in a sandbox child (or inline, see `sandbox::Executor`).
        // A video resumes what an earlier attempt uploaded (see `stages::resume`).
        let landed = match role {
            As::Request => {
                resume::find(
                    &*svc.storage,
                    &svc.settings.storage.output_bucket,
                    req,
                    &scratch.source(),
                    source.etag.as_deref(),
                    fingerprint.clone(),
                )
                .await
            }
            _ => None,
        };
        let mut media_job = svc.settings.media_job(profile, req.media_type);
        media_job.part = match role {
            As::Request if self.dispatch().is_some() => Part::Plan,
            As::Unit { unit, .. } => Part::Unit(unit.clone()),
            As::Audio { .. } => Part::Audio,
            As::Opening { record, .. } => {
                Part::Opening(record.opening.as_ref().map_or(0, |o| o.secs))
            }
            _ => Part::Whole,
        };
        if let Some(l) = landed.as_ref().filter(|l| !l.is_empty()) {
            media_job.resume = l.heights();
            media_job.resumed_tracks = l.tracks.clone();
            tracing::info!(job = job.id(), renditions = ?media_job.resume,
                "renditions uploaded by an earlier attempt are not made again");
        }
        let mut media = self
            .native(job, media_job.clone(), scratch, cancel, role)
            .await;
        // A part that failed on its bytes of the source, or a request's that found no plan in
        // them (its video was not long after all): again on the whole file.
        let again = match &media {
            Err(f) => verdict_on_the_input(&f.error),
            Ok(m) => plan_ranged && m.as_ref().is_some_and(|m| m.plan.is_none()),
        };
        if (ranged.is_some() || plan_ranged) && again {
            let error = media.as_ref().err().map(|f| f.error.to_string());
            tracing::warn!(
                job = job.id(),
                error,
                "the part failed on its bytes of the source: again on the whole file"
            );
            let whole = self.download_whole(req, job, cancel, &source_path).await?;
            if let Some(f) = not_planned(role, &whole) {
                return Err((f, partial(&whole, &None)));
            }
            // A request's plan is made of the version read now (it may have been replaced
            // since its index was read).
            source = whole;
            // Nothing of the first run is taken for the second's.
            let _ = tokio::fs::remove_dir_all(scratch.out_dir()).await;
            media = self.native(job, media_job, scratch, cancel, role).await;
        }
        let media = media.map_err(|f| (f, partial(&source, &scan)))?;
        let Some(mut media) = media else {
            return Ok(super::role::handed_off(&source));
        };

        if role.part().is_some() {
            return self.land_part(req, role, media, scratch.path()).await;
        }
        if let (Some(units), Some(dispatch)) = (media.plan.take(), &self.dispatch) {
            let handing = Handing {
                req,
                source: &source,
                fingerprint: &fingerprint,
                units,
                audio_reads: std::mem::take(&mut media.reads),
                opening: media.opening.take(),
            };
            return self
                .hand_off(handing, media, dispatch, scratch.path())
                .await;
        }
        if let Some(verdict) = scan.clone() {
            media.analysis = Some(Analysis::with_scan(media.analysis.take(), verdict));
        }
        let finished = self.finish(
            req,
            job,
            cancel,
            &source,
            fingerprint,
            media,
            landed,
            scratch,
        );
        finished.await.map_err(|f| (f, partial(&source, &scan)))
    }

    /// The stage that downloads the whole source.
    async fn download_whole(
        &self,
        req: &OptimizeRequest,
        job: &JobHandle,
        cancel: &CancellationToken,
        dest: &std::path::Path,
    ) -> Result<SourceInfo, (Failure, Partial)> {
        let svc = &self.svc;
        let download = download::run(
            &*svc.storage,
            &svc.metrics,
            &req.source,
            dest,
            svc.settings.limits.max_input_bytes,
        );
        let download = self.timed(job, Stage::Download, req.media_type, download);
        or_cancelled(cancel, Stage::Download, download)
            .await
            .map_err(|f| (f, Partial::default()))
    }

    /// The native work of `media_job` in `scratch` (probe → analyze → transform, behind the one
    /// narrow function `media::process`, in a sandbox child or inline: see `sandbox::Executor`).
    pub(super) async fn native(
        &self,
        job: &JobHandle,
        mut media_job: crate::media::MediaJob,
        scratch: &ScratchDir,
        cancel: &CancellationToken,
        role: &As,
    ) -> Result<Option<crate::media::MediaOutput>, Failure> {
        let svc = &self.svc;
        // A pool permit is one core: held for the native work only, so downloads and uploads
        // overlap other jobs' CPU work (their number is bounded by the consumer's in-flight cap).
        // The executor keeps it until the native work has really stopped. A long video's task
        // (a part, the stitch) yields the cores to requests, and takes the parts lane's permit
        // where there is one: there it shares a core with requests, so its time limits stretch.
        let lane = self.parts.as_ref().filter(|_| role.is_task());
        if lane.is_some() {
            media_job.video.timeout_base_secs *= LANE_SLACK;
            media_job.video.timeout_per_second *= LANE_SLACK as f64;
        }
        // MEDIA_TIMEOUT_SECS, or what the media code announces once it knows (a video's limit
        // follows its duration).
        let limit = Duration::from_secs(svc.settings.worker.media_timeout_secs);
        let mut work = Work::new(media_job, scratch, limit);
        if role.is_task() {
            work.nice = PART_NICE;
        }
        let pool = lane.unwrap_or(&self.pool);
        job.phase(Phase::Queued);
        let permit = pool
            .clone()
            .acquire_owned()
            .await
            .expect("pool is never closed");
        // A part another worker landed while this one waited (its task sent twice: a request
        // redelivered after it sent them) is not made again.
        if let Some((plan, _, _, key)) = role.part()
            && self.part_landed(plan, key.clone()).await
        {
            tracing::info!(plan = plan.id(), record = key, "already landed");
            return Ok(None);
        }
        let hold = (permit, svc.metrics.busy_permit());
        let clock = StageClock::new(job.clone(), svc.metrics.clone());
        let on_event = Box::new(move |e| clock.on(e));
        self.media
            .run(work, cancel.clone(), on_event, hold)
            .await
            .map(Some)
            .map_err(|f| f.into::<JobError>())
    }

    /// The outputs, then the manifest, last: its presence means they all exist.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn finish(
        &self,
        req: &OptimizeRequest,
        job: &JobHandle,
        cancel: &CancellationToken,
        source: &SourceInfo,
        fingerprint: String,
        media: crate::media::MediaOutput,
        landed: Option<resume::Landed>,
        scratch: &ScratchDir,
    ) -> Result<Done, Failure> {
        let svc = &self.svc;
        let profile = manifest::profile_of(req);
        let media_type = media.media_type;
        let (files, analysis, warnings) = (media.files, media.analysis, media.warnings);
        let tracks = media.tracks;
        let (src, scratch_path) = (source.clone(), scratch.path().to_owned());
        let upload = self.timed(job, Stage::Upload, Some(media_type), async move {
            let to = upload::Destination {
                storage: &*svc.storage,
                metrics: &svc.metrics,
                bucket: &svc.settings.storage.output_bucket,
                req,
                media_type,
                cache_control: &svc.settings.profiles[profile].cache_control,
            };
            let outputs = resume::upload_all(&to, &files, &tracks, landed, &scratch_path).await?;
            let produced = Produced {
                source: src,
                media_type,
                outputs,
                analysis,
                warnings,
            };
            if let Some(m) = Manifest::of(req, fingerprint, &produced) {
                manifest::record(to.storage, to.bucket, req, &m, &scratch_path).await?;
            }
            Ok::<_, StorageError>(Done {
                produced,
                replayed: false,
                source_missing: false,
                handed_off: false,
            })
        });
        or_cancelled(cancel, Stage::Upload, upload).await
    }

    /// The scan stage: the downloaded source through clamd.
    async fn scan(&self, scratch: &ScratchDir) -> Result<ScanVerdict, JobError> {
        let scanner = self
            .svc
            .scanner
            .as_ref()
            .ok_or(crate::scan::ScanError::NotConfigured)?;
        Ok(scanner.scan_file(&scratch.source()).await?)
    }

    /// Runs an async stage, recording it in the registry and the stage histogram.
    pub(super) async fn timed<T, E: Into<crate::error::JobError>>(
        &self,
        job: &JobHandle,
        stage: Stage,
        media_type: Option<MediaType>,
        fut: impl Future<Output = Result<T, E>>,
    ) -> Result<T, Failure> {
        job.stage(stage);
        let t = Instant::now();
        let span = tracing::info_span!("stage", otel.name = stage.span_name());
        let r = fut.instrument(span).await.map_err(Failure::at(stage));
        self.svc
            .metrics
            .observe_stage(stage, media_type, t.elapsed());
        r
    }
}

/// A stage that gives up when its job is cancelled.
pub(super) async fn or_cancelled<T>(
    cancel: &CancellationToken,
    stage: Stage,
    fut: impl Future<Output = Result<T, Failure>>,
) -> Result<T, Failure> {
    tokio::select! {
        r = fut => r,
        _ = cancel.cancelled() => Err(Failure::at(stage)(MediaError::Cancelled)),
    }
}

/// What a failed attempt keeps: the source read, and clamd's verdict.
fn partial(source: &SourceInfo, scan: &Option<ScanVerdict>) -> Partial {
    Partial {
        source: Some(source.clone()),
        scan: scan.clone(),
    }
}

/// A failure that a part's ranged source could cause (bytes its plan missed read as zeros):
/// worth one more run on the whole file before it is the input's answer.
fn verdict_on_the_input(e: &JobError) -> bool {
    matches!(
        e,
        JobError::Media(
            MediaError::Corrupt(_)
                | MediaError::Unsupported(_)
                | MediaError::Crashed(_)
                | MediaError::Transform(_)
        )
    )
}

/// A part whose source download is not the version its plan was made of: it is made of that
/// version or nothing.
fn not_planned(role: &As, source: &SourceInfo) -> Option<Failure> {
    let (_, record, _, _) = role.part()?;
    (source.etag.as_deref() != Some(record.source_etag.as_str())).then(|| {
        Failure::at(Stage::Download)(JobError::SourceChanged {
            planned: record.source_etag.clone(),
            now: source.etag.clone().unwrap_or_default(),
        })
    })
}

/// A part's ranged read that found another version of its source: the plan's version is gone.
fn changed(f: Failure, record: &crate::units::store::PlanRecord) -> Failure {
    match f.error {
        JobError::Storage(StorageError::Changed { .. }) => Failure {
            stage: f.stage,
            error: JobError::SourceChanged {
                planned: record.source_etag.clone(),
                now: "another version".into(),
            },
        },
        _ => f,
    }
}

/// How often a held job checks whether the pod is well again.
const HOLD_CHECK: Duration = Duration::from_secs(1);

/// Follows a job's media stages: the registry, the stage histogram and a span per stage
/// (under the attempt's span, wherever the work runs). The last stage is closed on drop.
struct StageClock {
    job: JobHandle,
    metrics: Arc<crate::telemetry::Metrics>,
    parent: tracing::Span,
    current: std::sync::Mutex<Option<(Stage, Instant, tracing::Span)>>,
    media_type: std::sync::Mutex<Option<MediaType>>,
}

impl StageClock {
    fn new(job: JobHandle, metrics: Arc<crate::telemetry::Metrics>) -> StageClock {
        StageClock {
            job,
            metrics,
            parent: tracing::Span::current(),
            current: Default::default(),
            media_type: Default::default(),
        }
    }

    fn on(&self, event: Event) {
        match event {
            Event::Stage(stage) => {
                let span = tracing::info_span!(parent: &self.parent, "stage", otel.name = stage.span_name());
                let next = Some((stage, Instant::now(), span));
                self.close(std::mem::replace(&mut *self.current.lock().unwrap(), next));
                self.job.stage(stage);
            }
            Event::Progress(p) => self.job.progress(p),
            Event::Encoded(d) => self.metrics.video_encoded_seconds.inc_by(d.as_secs_f64()),
            Event::Detected(t) => *self.media_type.lock().unwrap() = Some(t),
            Event::TimeLimit(_) => {}
        }
    }

    fn close(&self, stage: Option<(Stage, Instant, tracing::Span)>) {
        if let Some((s, t, _span)) = stage {
            let media_type = *self.media_type.lock().unwrap();
            self.metrics.observe_stage(s, media_type, t.elapsed());
        }
    }
}

impl Drop for StageClock {
    fn drop(&mut self) {
        let last = self.current.lock().unwrap().take();
        self.close(last);
    }
}
