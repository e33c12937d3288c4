//! The registry of active jobs: what `/jobs` lists and what the in-flight gauge counts. Jobs
//! report their stage, phase and progress here as they run.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;
use tokio::sync::watch;

use crate::contract::Stage;

/// Where a job is, as its progress events report it (see `worker::progress`): followed
/// through [`JobHandle::watch`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JobProgress {
    pub stage: Stage,
    /// Fraction of the stage done, when the stage reports it (video transcodes).
    pub fraction: Option<f32>,
    pub attempt: u32,
}

/// Where a job is between stages: waiting for a pool permit, running a stage, or backing off
/// before another attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Queued,
    Running,
    Backoff,
    /// Out of attempts while the pod is sick, or waiting for scratch space that no job of ours
    /// holds: waiting for the pod to be well (see `job::runner`).
    Held,
}

#[derive(Debug, Clone)]
struct Entry {
    id: String,
    request_id: String,
    media_id: String,
    stage: Stage,
    phase: Phase,
    attempt: u32,
    started: Instant,
    progress: Option<f32>,
}

/// One active job as `/jobs` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct JobView {
    pub id: String,
    pub request_id: String,
    pub media_id: String,
    pub stage: Stage,
    pub phase: Phase,
    pub attempt: u32,
    pub elapsed_ms: u64,
    pub progress: Option<f32>,
}

#[derive(Clone, Default)]
pub struct Registry {
    jobs: Arc<Mutex<BTreeMap<u64, Entry>>>,
    next: Arc<AtomicU64>,
}

impl Registry {
    /// Registers a job; it leaves the registry when the returned handle (and its clones) drop.
    pub fn start(&self, request_id: &str, media_id: &str) -> JobHandle {
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        // Unique within the process and across restarts (scratch dirs are named after it).
        let id = format!("job-{:x}-{seq}", fastrand::u64(..) & 0xffff_ffff);
        let entry = Entry {
            id: id.clone(),
            request_id: request_id.to_owned(),
            media_id: media_id.to_owned(),
            stage: Stage::Validate,
            phase: Phase::Queued,
            attempt: 0,
            started: Instant::now(),
            progress: None,
        };
        self.jobs.lock().unwrap().insert(seq, entry);
        let (progress, _) = watch::channel(JobProgress {
            stage: Stage::Validate,
            fraction: None,
            attempt: 0,
        });
        JobHandle(Arc::new(HandleInner {
            seq,
            id,
            registry: self.clone(),
            progress,
        }))
    }

    pub fn len(&self) -> usize {
        self.jobs.lock().unwrap().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn snapshot(&self) -> Vec<JobView> {
        self.jobs
            .lock()
            .unwrap()
            .values()
            .map(|e| JobView {
                id: e.id.clone(),
                request_id: e.request_id.clone(),
                media_id: e.media_id.clone(),
                stage: e.stage,
                phase: e.phase,
                attempt: e.attempt,
                elapsed_ms: e.started.elapsed().as_millis() as u64,
                progress: e.progress,
            })
            .collect()
    }

    fn update(&self, seq: u64, f: impl FnOnce(&mut Entry)) {
        if let Some(e) = self.jobs.lock().unwrap().get_mut(&seq) {
            f(e);
        }
    }
}

struct HandleInner {
    seq: u64,
    id: String,
    registry: Registry,
    progress: watch::Sender<JobProgress>,
}

impl Drop for HandleInner {
    fn drop(&mut self) {
        self.registry.jobs.lock().unwrap().remove(&self.seq);
    }
}

/// A job's entry in the registry; cheap to clone into blocking tasks.
#[derive(Clone)]
pub struct JobHandle(Arc<HandleInner>);

impl JobHandle {
    pub fn id(&self) -> &str {
        &self.0.id
    }
    pub fn stage(&self, stage: Stage) {
        self.0.registry.update(self.0.seq, |e| {
            e.stage = stage;
            e.phase = Phase::Running;
            e.progress = None;
        });
        self.0.progress.send_modify(|p| {
            p.stage = stage;
            p.fraction = None;
        });
    }
    pub fn phase(&self, phase: Phase) {
        self.0.registry.update(self.0.seq, |e| e.phase = phase);
    }
    pub fn attempt(&self, attempt: u32) {
        self.0.registry.update(self.0.seq, |e| e.attempt = attempt);
        self.0.progress.send_modify(|p| p.attempt = attempt);
    }
    pub fn progress(&self, fraction: f32) {
        let fraction = fraction.clamp(0.0, 1.0);
        self.0
            .registry
            .update(self.0.seq, |e| e.progress = Some(fraction));
        self.0.progress.send_modify(|p| p.fraction = Some(fraction));
    }
    /// The job's stage, progress and attempt as they change; closed when the job's last
    /// handle drops.
    pub fn watch(&self) -> watch::Receiver<JobProgress> {
        self.0.progress.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_is_listed_until_its_last_handle_drops() {
        let r = Registry::default();
        let h = r.start("req-1", "m1");
        h.attempt(2);
        h.stage(Stage::Transform);
        let h2 = h.clone();
        let view = &r.snapshot()[0];
        assert_eq!(
            (view.stage, view.attempt, view.phase),
            (Stage::Transform, 2, Phase::Running)
        );
        drop(h);
        assert_eq!(r.len(), 1);
        drop(h2);
        assert!(r.is_empty());
    }
}
