//! The job side of a long video spread over the fleet (the protocol: `crate::units`): the
//! request hands its plan on, a unit task lands its unit and the audio task the audio, the
//! stitch task answers. Each runs
//! through the same attempts as any job ([`JobRunner`]'s retries, holds and scratch rules);
//! what differs is what they download, which part of the media work they are and where their
//! files go.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use futures_util::{StreamExt, TryStreamExt, stream};
use tokio_util::sync::CancellationToken;

use super::response::{self, Done, Ending, Failure, Partial};
use super::role::{Answer, As, Handing, Progressed, handed_off};
use super::runner::{JobRunner, or_cancelled};
use crate::contract::{Analysis, MediaType, OptimizeRequest, OptimizeResponse, SourceInfo, Stage};
use crate::error::JobError;
use crate::media::MediaOutput;
use crate::media::part::{Part, StitchInput, Unit};
use crate::registry::JobHandle;
use crate::scratch::ScratchDir;
use crate::stages::{download, manifest};
use crate::storage::{ObjectMeta, StorageError};
use crate::units::store::{self, AudioRecord, PlanRecord, UnitRecord};
use crate::units::{Dispatch, PlanRef, Task};

const PARALLEL_TRANSFERS: usize = 8;

/// What a task of the unit topic ended with.
pub enum TaskEnd {
    Nothing,
    /// A unit is recorded (a progress event of the request).
    Landed(Box<OptimizeRequest>, Progressed),
    /// The stitch's response.
    Respond(Box<OptimizeResponse>),
}

/// A request's source replaced between two reads of its parts: it is read whole, as it is now
/// (a request names a key, not a version).
fn replaced(f: &Failure) -> bool {
    matches!(f.error, JobError::Storage(StorageError::Changed { .. }))
}

impl JobRunner {
    /// A task from the unit topic: nothing to publish (a unit), or the request's response (the
    /// stitch, or the part that completed the plan when the unit topic could not take the
    /// stitch). `by` names the task as a claimant of the answer (`store::Answered::by`).
    pub async fn run_task(&self, task: &Task, job: &JobHandle, by: &str) -> TaskEnd {
        let storage = &*self.services().storage;
        let plan = &task.plan;
        let record: PlanRecord = match store::read(storage, plan, plan.plan_key()).await {
            Ok(Some(r)) => r,
            Ok(None) => {
                tracing::warn!(plan = plan.id(), "a unit task whose plan is gone: dropped");
                return TaskEnd::Nothing;
            }
            Err(e) => {
                // Held like any job whose store is away: retried until it answers.
                tracing::warn!(plan = plan.id(), error = %e, "plan unreadable; retrying");
                return self.retry_task(task, job, by).await;
            }
        };
        let keys = match store::records(storage, plan).await {
            Ok(keys) => keys,
            Err(e) => {
                tracing::warn!(plan = plan.id(), error = %e, "records unreadable; retrying");
                return self.retry_task(task, job, by).await;
            }
        };
        if keys.contains(&plan.answered_key()) {
            match store::answered(storage, plan).await {
                // This record claimed the answer before, and its consumer went before it
                // published: the answer is this task's, whatever task it is.
                Ok(Some(a)) if a.unpublished_by(by) => {
                    tracing::info!(
                        plan = plan.id(),
                        task = task.key(),
                        "the answer was claimed by this task before it was delivered again"
                    );
                    return self.stitch_here(task, plan, record, job, by).await;
                }
                Ok(_) => {
                    tracing::info!(plan = plan.id(), task = task.key(), "already answered");
                    return TaskEnd::Nothing;
                }
                Err(e) => {
                    tracing::warn!(plan = plan.id(), error = %e, "claim unreadable; retrying");
                    return self.retry_task(task, job, by).await;
                }
            }
        }
        match (task.unit, task.audio) {
            (Some(index), _) => {
                let Some(unit) = record.units.get(index as usize).cloned() else {
                    tracing::warn!(plan = plan.id(), index, "no such unit: dropped");
                    return TaskEnd::Nothing;
                };
                let role = As::Unit {
                    plan: plan.clone(),
                    record: Box::new(record),
                    unit,
                };
                self.part_task(task, role, &keys, job, by).await
            }
            (None, true) => {
                let role = As::Audio {
                    plan: plan.clone(),
                    record: Box::new(record),
                };
                self.part_task(task, role, &keys, job, by).await
            }
            // The opening is the early stream's audio until the whole program's lands: not
            // made once it has.
            (None, false) if task.opening && keys.contains(&plan.audio_key()) => {
                tracing::info!(plan = plan.id(), "the audio landed: its opening not made");
                TaskEnd::Nothing
            }
            (None, false) if task.opening => {
                let role = As::Opening {
                    plan: plan.clone(),
                    record: Box::new(record),
                };
                self.part_task(task, role, &keys, job, by).await
            }
            (None, false) => self.stitch_here(task, plan, record, job, by).await,
        }
    }

    /// The plan's stitch, run by this task: the response, or nothing when a part has no
    /// record yet. A storage error is retried (the task is this answer's only bearer).
    async fn stitch_here(
        &self,
        task: &Task,
        plan: &PlanRef,
        record: PlanRecord,
        job: &JobHandle,
        by: &str,
    ) -> TaskEnd {
        match self.stitch_task(plan, record, job, by).await {
            Ok(Some(r)) => TaskEnd::Respond(Box::new(r)),
            Ok(None) => TaskEnd::Nothing,
            Err(e) => {
                tracing::warn!(plan = plan.id(), error = %e, "records unreadable; retrying");
                self.retry_task(task, job, by).await
            }
        }
    }

    /// Whether a request's source may be read in parts: on a worker that spreads long videos
    /// (the plan reads the audio, each unit its video), unless its profile scans it (clamd
    /// reads every byte) or it is an image.
    pub(super) fn reads_in_parts(&self, req: &OptimizeRequest, profile: &str, role: &As) -> bool {
        let scans = self.services().settings.profiles[profile].scan;
        matches!(role, As::Request)
            && self.dispatch().is_some()
            && !scans
            && req.media_type != Some(MediaType::Image)
    }

    /// The plan's part of a request's source, when its header and index (`download::index`)
    /// say it is a long MP4/MOV (`Part::Index`, in the sandbox): the container and the first
    /// packets, at their places in a sparse file. `None`: download it whole.
    pub(super) async fn plan_source(
        &self,
        req: &OptimizeRequest,
        job: &JobHandle,
        cancel: &CancellationToken,
        scratch: &ScratchDir,
        role: &As,
    ) -> Result<Option<SourceInfo>, (Failure, Partial)> {
        let svc = self.services();
        let (storage, metrics) = (&*svc.storage, &svc.metrics);
        let dest = scratch.source();
        let max = svc.settings.limits.max_input_bytes;
        let index = download::index(storage, metrics, &req.source, &dest, max);
        let index = self.timed(job, Stage::Download, req.media_type, index);
        let Some((source, held)) = (match or_cancelled(cancel, Stage::Download, index).await {
            Err(f) if replaced(&f) => None,
            r => r.map_err(|f| (f, Partial::default()))?,
        }) else {
            return Ok(None);
        };
        let mut media_job = svc
            .settings
            .media_job(manifest::profile_of(req), req.media_type);
        media_job.part = Part::Index;
        let reads = match self.native(job, media_job, scratch, cancel, role).await {
            Ok(Some(out)) => out.reads,
            // Cancelled, or a fault of this pod (no sandbox, scratch, memory): classified here,
            // not after a whole download on a sick pod.
            Err(f) if cancel.is_cancelled() || f.error.is_local() => {
                return Err((f, Partial::default()));
            }
            // Whatever else failed on the header alone is decided on the whole file.
            _ => Vec::new(),
        };
        let _ = tokio::fs::remove_dir_all(scratch.out_dir()).await;
        let (Some(size), Some(etag), false) = (source.size_bytes, &source.etag, reads.is_empty())
        else {
            return Ok(None);
        };
        let reads = download::missing(&reads, &held);
        let download = download::ranges(storage, metrics, &req.source, &dest, size, &reads, etag);
        let download = self.timed(job, Stage::Download, req.media_type, download);
        match or_cancelled(cancel, Stage::Download, download).await {
            Err(f) if replaced(&f) => Ok(None),
            r => r.map(Some).map_err(|f| (f, Partial::default())),
        }
    }

    /// Whether a part of `plan` has its record (`key`).
    pub(super) async fn part_landed(&self, plan: &PlanRef, key: String) -> bool {
        let storage = &*self.services().storage;
        let at = crate::contract::SourceRef {
            bucket: plan.bucket.clone(),
            key,
        };
        storage.head(&at).await.is_ok()
    }

    /// Claims the plan's answer for the task named `by` before it publishes it
    /// (`store::claim_answer`): `Some(true)` when it is this task's to publish, `Some(false)`
    /// when another task has it. Tried whatever it takes, until the job is abandoned at
    /// shutdown: `None` then, and the task is left unacknowledged.
    pub async fn claim_answer(&self, plan: &PlanRef, by: &str) -> Option<bool> {
        let svc = self.services();
        let give_up = self.cancel_token();
        loop {
            match store::claim_answer(&*svc.storage, plan, by, &svc.worker.id).await {
                Ok(claim) => {
                    let mine = claim == store::Claim::Mine;
                    if !mine {
                        tracing::info!(
                            plan = plan.id(),
                            task = by,
                            "the answer is another task's: nothing published"
                        );
                    }
                    return Some(mine);
                }
                Err(e) => tracing::warn!(plan = plan.id(), error = %e,
                    "could not claim the plan's answer; trying again"),
            }
            tokio::select! {
                _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                _ = give_up.cancelled() => return None,
            }
        }
    }

    /// The plan's response, claimed by the task `by`, is published: its claim says so (a
    /// later delivery of the same task publishes nothing); once the video is done, the pieces
    /// (as large as the outputs) are deleted; the plan and its records stay, small.
    ///
    /// The mark is written whatever it takes (this task delivered again would answer again
    /// without it), until the job is abandoned at shutdown: `false` then, and the task is left
    /// unacknowledged.
    pub async fn mark_published(&self, plan: &PlanRef, by: &str, completed: bool) -> bool {
        let svc = self.services();
        let storage = &*svc.storage;
        let scratch = &svc.settings.worker.tmp_dir;
        let give_up = self.cancel_token();
        let published = store::Answered {
            by: by.to_owned(),
            worker: svc.worker.id.clone(),
            published: true,
        };
        while let Err(e) =
            store::write(storage, plan, plan.answered_key(), &published, scratch).await
        {
            tracing::warn!(plan = plan.id(), error = %e,
                "could not mark the plan answered; trying again");
            tokio::select! {
                _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                _ = give_up.cancelled() => return false,
            }
        }
        self.after_answered(plan, completed).await;
        true
    }

    /// A plan answered: its early stream ended and, the video done, its pieces deleted.
    async fn after_answered(&self, plan: &PlanRef, completed: bool) {
        let storage = &*self.services().storage;
        self.end_early(plan, completed).await;
        // After a failure the landed units' pieces are kept: the request sent again uses them.
        if !completed {
            return;
        }
        let pieces = match storage.list(&plan.bucket, &plan.piece_key("")).await {
            Ok(keys) => keys,
            Err(e) => {
                tracing::warn!(plan = plan.id(), error = %e, "could not list the pieces");
                return;
            }
        };
        let deletes: Vec<_> = pieces
            .iter()
            .map(|k| storage.delete(&plan.bucket, k))
            .collect();
        let deleted: Result<Vec<()>, StorageError> = stream::iter(deletes)
            .buffer_unordered(PARALLEL_TRANSFERS)
            .try_collect()
            .await;
        match deleted {
            Ok(d) => tracing::info!(plan = plan.id(), pieces = d.len(), "pieces deleted"),
            Err(e) => tracing::warn!(plan = plan.id(), error = %e, "pieces left behind"),
        }
    }

    /// A transient failure before the job began: once more, after the backoff.
    async fn retry_task(&self, task: &Task, job: &JobHandle, by: &str) -> TaskEnd {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        Box::pin(self.run_task(task, job, by)).await
    }

    /// A unit's or the audio's task: made and recorded (once: a part with a record is not
    /// made again), or its failure for good recorded, which stops the plan's other parts and
    /// sends the stitch to answer with it. The part that completes the plan and whose stitch
    /// the unit topic cannot take runs the stitch itself.
    async fn part_task(
        &self,
        task: &Task,
        role: As,
        keys: &[String],
        job: &JobHandle,
        by: &str,
    ) -> TaskEnd {
        let Some((plan, record, _, key)) = role.part() else {
            unreachable!("a part's task")
        };
        let what = match &role {
            As::Unit { unit, .. } => format!("unit {}", unit.index),
            As::Opening { .. } => "the audio's opening".to_owned(),
            _ => "the audio".to_owned(),
        };
        tracing::info!(plan = plan.id(), part = what, "part taken");
        if keys.contains(&key) {
            tracing::info!(plan = plan.id(), part = what, "already landed");
        } else if keys.contains(&plan.failed_key()) {
            tracing::info!(
                plan = plan.id(),
                part = what,
                "another part failed: not made"
            );
            return TaskEnd::Nothing;
        } else if let Answer::Respond(r) = self.run_as(&record.request, job, &role).await {
            // Only a failure answers a part: recorded, and the stitch answers with it.
            let Some(e) = r.error else {
                return TaskEnd::Nothing;
            };
            // But the opening's: the early stream waits for the whole program's audio, which
            // decides the video's answer.
            if let As::Opening { .. } = role {
                tracing::warn!(plan = plan.id(), error = %e.message,
                    "the audio's opening failed: the early stream waits for the whole audio");
                return TaskEnd::Nothing;
            }
            let (index, at_secs) = match &role {
                As::Unit { unit, .. } => (Some(unit.index), unit_start(record, unit)),
                _ => (None, 0.0),
            };
            // The media code names the unit in what it finds; the pod's own findings (a
            // crash, a time limit) are named here.
            let (named, prefix) = match index {
                Some(i) => (format!("unit {i} (from "), format!("{at_secs:.1} s): ")),
                None => ("the audio: ".to_owned(), String::new()),
            };
            let message = if e.message.contains(&named) {
                e.message
            } else {
                format!("{named}{prefix}{}", e.message)
            };
            let failed = UnitRecord::Failed {
                index,
                code: e.code,
                stage: e.stage,
                message,
                at_secs,
            };
            let scratch = self.services().settings.worker.tmp_dir.clone();
            let storage = &*self.services().storage;
            // Recorded, whatever it takes: the request's answer depends on it (at shutdown
            // the task is abandoned unacknowledged, and redelivered).
            loop {
                let written = async {
                    if index.is_some() {
                        store::write(storage, plan, key.clone(), &failed, &scratch).await?;
                    }
                    store::write(storage, plan, plan.failed_key(), &failed, &scratch).await
                };
                match written.await {
                    Ok(()) => break,
                    Err(e) => tracing::error!(plan = plan.id(), part = what, error = %e,
                        "the part's failure could not be recorded; trying again"),
                }
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            tracing::warn!(plan = plan.id(), part = what, error = ?failed, "part failed for good");
            if self.send_stitch(plan).await {
                return TaskEnd::Nothing;
            }
            return self.stitch_here(task, plan, record.clone(), job, by).await;
        }
        // The part is recorded: the one that completes the plan sends the stitch.
        match self.landed(plan, record).await {
            Some(progressed) => TaskEnd::Landed(Box::new(record.request.clone()), progressed),
            None => self.stitch_here(task, plan, record.clone(), job, by).await,
        }
    }

    /// After a part's record (a unit's or the audio's): the stitch sent when this part
    /// completed the plan, the early playlist extended. Each part writes its record before it
    /// looks for the others', so of two landing at once at least one sees both. `None`: this
    /// part completed the plan and the unit topic could not take its stitch (the caller runs
    /// it).
    async fn landed(&self, plan: &PlanRef, record: &PlanRecord) -> Option<Progressed> {
        let storage = &*self.services().storage;
        // Whatever it takes: this may be the plan's last part (at shutdown the task is
        // abandoned unacknowledged, and redelivered).
        let keys = loop {
            match store::records(storage, plan).await {
                Ok(keys) => break keys,
                Err(e) => tracing::warn!(plan = plan.id(), error = %e,
                    "could not list the units; trying again"),
            }
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        };
        let landed = store::units_in(plan, &keys).len();
        if landed == record.units.len()
            && keys.contains(&plan.audio_key())
            && !self.send_stitch(plan).await
        {
            return None;
        }
        // A plan answered (or failing) has no early stream to extend: `end_early` took it down.
        let over = keys.contains(&plan.failed_key()) || keys.contains(&plan.answered_key());
        let playable = if self.early(&record.request) && !over {
            self.extended(plan, record).await
        } else {
            None
        };
        Some(Progressed {
            landed,
            of: record.units.len(),
            playable,
        })
    }

    /// The plan's stitch task, sent to the unit topic: `false` when the topic cannot take it
    /// (gone or refused, now or within the send's bound), and the caller stitches here: the
    /// request was committed when it handed off, and nothing else would answer it.
    async fn send_stitch(&self, plan: &PlanRef) -> bool {
        let Some(dispatch) = self.dispatch() else {
            tracing::warn!(
                plan = plan.id(),
                "no unit topic for the stitch: stitched here"
            );
            return false;
        };
        match dispatch.send(&Task::stitch(plan)).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(plan = plan.id(), error = %e,
                    "the unit topic did not take the stitch: stitched here");
                false
            }
        }
    }

    /// The stitch's answer; `Ok(None)`: not this task's to give (a part has no record yet, or
    /// another task claimed the answer).
    async fn stitch_task(
        &self,
        plan: &PlanRef,
        record: PlanRecord,
        job: &JobHandle,
        by: &str,
    ) -> Result<Option<OptimizeResponse>, StorageError> {
        let storage = &*self.services().storage;
        let req = record.request.clone();
        let failed = store::read(storage, plan, plan.failed_key()).await?;
        // The answer is claimed before the work, once the stitch can give it (a part failed,
        // or every part landed): of two stitches at once (a task taken in two groups, or
        // delivered again beside a live one), one makes and answers it and the other ends
        // here; else the second, failing on pieces the first deletes once it has answered,
        // could claim first and answer with its failure. A claimant that dies is delivered
        // again under its own name and takes its claim back (`store::claim_answer`).
        let claimed = || async {
            match self.claim_answer(plan, by).await {
                Some(mine) => Ok(mine),
                // Abandoned at shutdown: left unacknowledged, retried like a store away.
                None => Err(StorageError::Unavailable(
                    "shutting down before the answer was claimed".into(),
                )),
            }
        };
        // A part failed for good: its failure is the answer (the units after it were skipped).
        if failed.is_some() && !claimed().await? {
            return Ok(None);
        }
        if let Some(UnitRecord::Failed {
            index,
            code,
            stage,
            message,
            at_secs,
        }) = failed
        {
            let failure = Failure {
                stage,
                error: JobError::UnitFailed {
                    index,
                    at_secs,
                    code,
                    message,
                },
            };
            let ending = Ending::Failed {
                failure,
                partial: Partial::default(),
            };
            let worker = &self.services().worker;
            return Ok(Some(response::for_request(
                worker,
                &req,
                ending,
                1,
                Instant::now(),
            )));
        }
        // The audio is made beside the units, and its record may come last.
        let Some(audio) = store::read::<AudioRecord>(storage, plan, plan.audio_key()).await? else {
            tracing::warn!(plan = plan.id(), "stitch before the audio landed: dropped");
            return Ok(None);
        };
        let mut units = Vec::with_capacity(record.units.len());
        for i in 0..record.units.len() as u32 {
            match store::read::<UnitRecord>(storage, plan, plan.unit_key(i)).await? {
                Some(u @ UnitRecord::Landed { .. }) => units.push(u),
                _ => {
                    tracing::warn!(
                        plan = plan.id(),
                        unit = i,
                        "stitch before unit landed: dropped"
                    );
                    return Ok(None);
                }
            }
        }
        if !claimed().await? {
            return Ok(None);
        }
        let role = As::Stitch {
            plan: plan.clone(),
            record: Box::new(record),
            audio: Box::new(audio),
            units,
        };
        match self.run_as(&req, job, &role).await {
            Answer::Respond(r) => Ok(Some(*r)),
            Answer::HandedOff => Ok(None),
        }
    }

    /// The request's part once its media job came back planned: the plan stored, a task sent
    /// for the audio and for each unit without a record (the audio first: it and the first
    /// unit make the stream playable).
    pub(super) async fn hand_off(
        &self,
        h: Handing<'_>,
        media: MediaOutput,
        dispatch: &Arc<dyn Dispatch>,
        scratch: &Path,
    ) -> Result<Done, (Failure, Partial)> {
        let partial = || Partial {
            source: Some(h.source.clone()),
            scan: None,
        };
        let fail = |e: StorageError| (Failure::at(Stage::Upload)(e), partial());
        let svc = self.services();
        let etag = h.source.etag.clone().unwrap_or_default();
        let plan = PlanRef::new(
            &svc.settings.storage.output_bucket,
            h.req,
            &etag,
            h.fingerprint,
        );
        let Some(Analysis::Video(analysis)) = media.analysis else {
            let e = JobError::Internal("a plan without its video's analysis".into());
            return Err((Failure::at(Stage::Transform)(e), partial()));
        };
        let record = PlanRecord {
            request: h.req.clone(),
            source_etag: etag,
            source_size: h.source.size_bytes.unwrap_or(0),
            units: h.units,
            audio_reads: h.audio_reads,
            opening: h.opening.filter(|_| self.early(h.req)),
            analysis,
            fingerprint: h.fingerprint.to_owned(),
        };
        let storage = &*svc.storage;
        store::write(storage, &plan, plan.plan_key(), &record, scratch)
            .await
            .map_err(fail)?;
        // A request sent again after this plan was answered with a failure is tried again: the
        // failure and the answer are forgotten (the landed units and audio are kept).
        let keys = store::records(storage, &plan).await.map_err(fail)?;
        if keys.contains(&plan.failed_key()) {
            for i in 0..record.units.len() as u32 {
                let key = plan.unit_key(i);
                if keys.contains(&key)
                    && let Some(UnitRecord::Failed { .. }) =
                        store::read(storage, &plan, key.clone())
                            .await
                            .map_err(fail)?
                {
                    storage.delete(&plan.bucket, &key).await.map_err(fail)?;
                }
            }
            storage
                .delete(&plan.bucket, &plan.failed_key())
                .await
                .map_err(fail)?;
        }
        storage
            .delete(&plan.bucket, &plan.answered_key())
            .await
            .map_err(fail)?;
        // Listed again: a forgotten unit's failure is no record.
        let keys = store::records(storage, &plan).await.map_err(fail)?;
        let landed = store::units_in(&plan, &keys);
        let audio_missing = !keys.contains(&plan.audio_key());
        let missing: Vec<u32> = (0..record.units.len() as u32)
            .filter(|i| !landed.contains(i))
            .collect();
        tracing::info!(
            plan = plan.id(),
            units = record.units.len(),
            missing = missing.len(),
            audio_missing,
            "video planned as units: sending them to the fleet"
        );
        // The audio's opening first: the early stream plays on it until the audio lands.
        let opening =
            audio_missing && record.opening.is_some() && !keys.contains(&plan.opening_key());
        let mut tasks: Vec<Task> = opening.then(|| Task::opening(&plan)).into_iter().collect();
        tasks.extend(audio_missing.then(|| Task::audio(&plan)));
        tasks.extend(missing.iter().map(|&i| Task::unit(&plan, i)));
        if tasks.is_empty() {
            tasks.push(Task::stitch(&plan));
        }
        for t in &tasks {
            dispatch.send(t).await.map_err(|e| {
                let e = JobError::Storage(StorageError::Unavailable(format!("unit topic: {e}")));
                (Failure::at(Stage::Publish)(e), partial())
            })?;
        }
        Ok(handed_off(h.source))
    }

    /// A part's pieces stored (and, playable early, in the early stream: a unit's lowest
    /// rung, the audio whole), then its record: nothing names a piece before it exists.
    pub(super) async fn land_part(
        &self,
        req: &OptimizeRequest,
        role: &As,
        media: MediaOutput,
        scratch: &Path,
    ) -> Result<Done, (Failure, Partial)> {
        let Some((plan, _, _, key)) = role.part() else {
            unreachable!("a part lands")
        };
        let fail = |e: StorageError| (Failure::at(Stage::Upload)(e), Partial::default());
        let worker = self.services().worker.id.clone();
        let storage = &*self.services().storage;
        if let As::Opening { .. } = role {
            // Its files into the early stream alone, never over the whole program's audio
            // (whose files are named alike).
            let landed = self.land_opening(plan, req, media, key, scratch);
            if landed.await.map_err(fail)? {
                tracing::info!(plan = plan.id(), %worker, "the audio's opening landed");
            }
            return Ok(part_done());
        }
        let pieces = self.store_pieces(plan, &media.files).await.map_err(fail)?;
        let early = self.early(req);
        match role {
            As::Unit { unit, .. } => {
                if early {
                    self.publish_lowest(plan, req, &media.tracks, &media.files)
                        .await
                        .map_err(fail)?;
                }
                let record = UnitRecord::Landed {
                    tracks: media.tracks,
                    pieces,
                    worker: worker.clone(),
                };
                let write = store::write(storage, plan, key, &record, scratch);
                write.await.map_err(fail)?;
                tracing::info!(plan = plan.id(), unit = unit.index, %worker, "unit landed");
            }
            _ => {
                if early {
                    self.publish_early(plan, req, media.files.iter().collect())
                        .await
                        .map_err(fail)?;
                }
                let loudness = match media.analysis {
                    Some(Analysis::Video(a)) => a.loudness,
                    _ => None,
                };
                let record = AudioRecord {
                    track: media.tracks.into_iter().next(),
                    pieces,
                    loudness,
                    warnings: media.warnings,
                };
                let write = store::write(storage, plan, key, &record, scratch);
                write.await.map_err(fail)?;
                if early {
                    let files = &media.files;
                    self.over_opening(plan, req, files).await.map_err(fail)?;
                }
                tracing::info!(plan = plan.id(), %worker, "the video's audio landed");
            }
        }
        Ok(part_done())
    }

    /// Uploads `files` beside the plan; their names.
    async fn store_pieces(
        &self,
        plan: &PlanRef,
        files: &[crate::media::ProducedFile],
    ) -> Result<Vec<String>, StorageError> {
        let storage = &*self.services().storage;
        let uploads: Vec<_> = files
            .iter()
            .map(|f| store_piece(storage, plan, f))
            .collect();
        stream::iter(uploads)
            .buffered(PARALLEL_TRANSFERS)
            .try_collect()
            .await
    }

    /// The stitch's attempt: the pieces downloaded into the output directory, the stitch's
    /// media work, then the outputs and the manifest as any job's.
    pub(super) async fn stitch_in(
        &self,
        req: &OptimizeRequest,
        job: &JobHandle,
        cancel: &CancellationToken,
        scratch: &ScratchDir,
        role: &As,
    ) -> Result<Done, (Failure, Partial)> {
        let As::Stitch {
            plan,
            record,
            audio,
            units,
        } = role
        else {
            unreachable!("stitch_in is the stitch's")
        };
        let svc = self.services();
        let source = SourceInfo {
            bucket: req.source.bucket.clone(),
            key: req.source.key.clone(),
            size_bytes: Some(record.source_size),
            etag: Some(record.source_etag.clone()),
        };
        let partial = || Partial {
            source: Some(source.clone()),
            scan: None,
        };
        let out_dir = scratch.out_dir();
        // The stitch reads no source; the sandbox grants access to the job's input all the same.
        tokio::fs::write(scratch.source(), b"").await.map_err(|e| {
            (
                Failure::at(Stage::Download)(StorageError::from(e)),
                partial(),
            )
        })?;
        let names = audio
            .pieces
            .iter()
            .chain(units.iter().flat_map(|u| match u {
                UnitRecord::Landed { pieces, .. } => pieces.as_slice(),
                UnitRecord::Failed { .. } => &[],
            }));
        job.stage(Stage::Download);
        let storage = &*svc.storage;
        let downloads: Vec<_> = names
            .map(|name| fetch_piece(storage, plan, name, &out_dir))
            .collect();
        let fetched: Result<Vec<()>, StorageError> = stream::iter(downloads)
            .buffer_unordered(PARALLEL_TRANSFERS)
            .try_collect()
            .await;
        fetched.map_err(|e| (Failure::at(Stage::Download)(e), partial()))?;
        let mut media_job = svc
            .settings
            .media_job(manifest::profile_of(req), req.media_type);
        let mut analysis = record.analysis.clone();
        analysis.loudness = audio.loudness.clone();
        media_job.part = Part::Stitch(Box::new(StitchInput {
            analysis,
            units: units
                .iter()
                .map(|u| match u {
                    UnitRecord::Landed { tracks, .. } => tracks.clone(),
                    UnitRecord::Failed { .. } => Vec::new(),
                })
                .collect(),
            audio: audio.track.clone(),
        }));
        let mut media = self
            .native(job, media_job, scratch, cancel, role)
            .await
            .map_err(|f| (f, partial()))?
            .expect("only a unit is skipped");
        media.warnings.splice(0..0, audio.warnings.iter().cloned());
        debug_assert_eq!(media.media_type, MediaType::Video);
        let fingerprint = record.fingerprint.clone();
        self.finish(req, job, cancel, &source, fingerprint, media, None, scratch)
            .await
            .map_err(|f| (f, partial()))
    }
}

/// Where a unit starts in the video, in seconds.
fn unit_start(record: &PlanRecord, unit: &Unit) -> f64 {
    let fps = record.analysis.fps.unwrap_or(30.0).clamp(1.0, 60.0);
    unit.first_slot as f64 / fps
}

async fn store_piece(
    storage: &dyn crate::storage::Storage,
    plan: &PlanRef,
    f: &crate::media::ProducedFile,
) -> Result<String, StorageError> {
    let meta = ObjectMeta {
        content_type: f.format.content_type(),
        cache_control: manifest::NO_CACHE,
    };
    storage
        .upload(&plan.bucket, &plan.piece_key(&f.name), &f.path, &meta)
        .await
        .map(|()| f.name.clone())
}

async fn fetch_piece(
    storage: &dyn crate::storage::Storage,
    plan: &PlanRef,
    name: &str,
    out_dir: &Path,
) -> Result<(), StorageError> {
    // Names from our own records, checked all the same: root writes them.
    let inside = Path::new(name)
        .components()
        .all(|c| matches!(c, std::path::Component::Normal(_)));
    if !inside {
        return Err(StorageError::Scratch(format!("piece name {name:?}")));
    }
    let dest = out_dir.join(name);
    if let Some(dir) = dest.parent() {
        tokio::fs::create_dir_all(dir).await?;
    }
    let src = crate::contract::SourceRef {
        bucket: plan.bucket.clone(),
        key: plan.piece_key(name),
    };
    storage.download(&src, &dest, u64::MAX).await.map(|_| ())
}

/// What a part that landed reports: nothing to publish, no source of its own.
fn part_done() -> Done {
    handed_off(&SourceInfo {
        bucket: String::new(),
        key: String::new(),
        size_bytes: None,
        etag: None,
    })
}
