//! Readiness: what `/health/ready` answers and what pauses intake. Each part is set by the
//! component that knows it: the worker (consuming, not draining), the consumer (broker
//! reachable, commits going through), the storage probe (output bucket reachable), the sandbox
//! pool (a sandbox can start), the publisher (responses going out); scratch space is read when
//! asked.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use serde::Serialize;

use crate::storage::Storage;

/// Failed offset commits in a row (on any one partition) after which the worker is not ready:
/// its finished work is not being recorded, so a restart would redo it.
pub const MAX_COMMIT_FAILURES: u32 = 3;

#[derive(Debug)]
pub struct Health {
    consuming: AtomicBool,
    broker_up: AtomicBool,
    storage_ok: AtomicBool,
    sandbox_ok: AtomicBool,
    /// Per consumer (the request lane, the unit lane).
    commit_failures: [AtomicU32; 2],
    /// The unit topic: 0 not configured, 1 there, 2 missing.
    unit_topic: AtomicU8,
    blocked_publishes: AtomicU32,
    min_scratch_free: AtomicU64,
    /// The scratch volume's size when less than its file system's (`SCRATCH_BYTES`; 0: none).
    scratch_limit: u64,
    /// What the scratch root holds, counted against `scratch_limit` (walked off the caller's
    /// thread, at most once a second: `scratch::Usage`).
    scratch_usage: std::sync::Arc<crate::scratch::Usage>,
    /// What a job that met a full scratch needs free before the pod takes work again (0: none).
    scratch_wanted: AtomicU64,
}

/// The answer of `/health/ready`.
#[derive(Debug, Serialize, PartialEq)]
pub struct Readiness {
    pub ready: bool,
    /// Started and not draining.
    pub consuming: bool,
    /// At least one broker connection is up (librdkafka statistics and error events).
    pub broker: bool,
    /// The last probe of the output bucket succeeded.
    pub storage: bool,
    /// Media work can start: no sandbox failed to start since the last successful probe.
    pub sandbox: bool,
    /// Free scratch space is above `worker.min_scratch_free_bytes`, and above what a job held
    /// for a full scratch needs.
    pub scratch: bool,
    pub scratch_free_bytes: Option<u64>,
    /// No partition had `MAX_COMMIT_FAILURES` offset commits rejected in a row.
    pub commits: bool,
    /// No finished job is stuck with a response that can be neither published nor
    /// dead-lettered (its offset is held meanwhile).
    pub publishing: bool,
    /// The unit topic exists (`None`: none is configured). Not part of `ready`: while it is
    /// missing, a long video is encoded by the pod that takes it, as without a unit topic.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unit_topic: Option<bool>,
}

impl Health {
    /// Not consuming yet; the other checks start optimistic until their first observation.
    pub fn new(min_scratch_free_bytes: u64, scratch_limit: u64) -> Health {
        Health {
            consuming: AtomicBool::new(false),
            broker_up: AtomicBool::new(true),
            storage_ok: AtomicBool::new(true),
            sandbox_ok: AtomicBool::new(true),
            commit_failures: Default::default(),
            unit_topic: AtomicU8::new(0),
            blocked_publishes: AtomicU32::new(0),
            min_scratch_free: AtomicU64::new(min_scratch_free_bytes),
            scratch_limit,
            scratch_usage: Default::default(),
            scratch_wanted: AtomicU64::new(0),
        }
    }

    pub fn set_consuming(&self, on: bool) {
        self.consuming.store(on, Ordering::Relaxed);
    }
    pub fn set_broker_up(&self, up: bool) {
        self.broker_up.store(up, Ordering::Relaxed);
    }
    pub fn set_storage_ok(&self, ok: bool) {
        self.storage_ok.store(ok, Ordering::Relaxed);
    }
    /// Returns whether it was ok before.
    pub fn set_sandbox_ok(&self, ok: bool) -> bool {
        self.sandbox_ok.swap(ok, Ordering::Relaxed)
    }
    /// The most commits rejected in a row on one partition of consumer `consumer` (its offset
    /// tracker).
    pub fn set_commit_failures(&self, consumer: usize, in_a_row: u32) {
        self.commit_failures[consumer].store(in_a_row, Ordering::Relaxed);
    }

    /// Whether the configured unit topic exists (the broker's metadata, `kafka::producer`).
    pub fn set_unit_topic(&self, exists: bool) {
        self.unit_topic
            .store(if exists { 1 } else { 2 }, Ordering::Relaxed);
    }

    /// A message starts (`true`) or stops being unpublishable.
    pub fn publish_blocked(&self, blocked: bool) {
        if blocked {
            self.blocked_publishes.fetch_add(1, Ordering::Relaxed);
        } else {
            self.blocked_publishes.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Responses retried for as long as it takes (see `kafka::producer`), holding their offsets.
    pub fn held_publishes(&self) -> u32 {
        self.blocked_publishes.load(Ordering::Relaxed)
    }

    /// Why this pod should not take new work now, if it should not: scratch space low, no
    /// sandbox can start, the output store unreachable, or a response that cannot be
    /// published. The consumer stops dispatching while this holds (it stays in the group;
    /// running jobs go on).
    pub fn intake_blocker(&self, scratch_dir: &Path) -> Option<&'static str> {
        let r = self.readiness(scratch_dir);
        if !r.scratch {
            Some("scratch")
        } else if !r.sandbox {
            Some("sandbox")
        } else if !r.storage {
            Some("storage")
        } else if !r.publishing {
            Some("publishing")
        } else {
            None
        }
    }

    /// A job met a full scratch, or cannot be admitted with nothing else running: the pod is
    /// not ready until `bytes` are free (then the mark clears itself).
    pub fn want_scratch(&self, bytes: u64) {
        self.scratch_wanted.fetch_max(bytes, Ordering::Relaxed);
    }

    pub fn readiness(&self, scratch_dir: &Path) -> Readiness {
        let free = crate::scratch::free_bytes(scratch_dir, self.scratch_limit, &self.scratch_usage);
        let wanted = self.scratch_wanted.load(Ordering::Relaxed);
        if wanted > 0 && free.is_none_or(|f| f >= wanted) {
            let _ = self.scratch_wanted.compare_exchange(
                wanted,
                0,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
        let floor = self.min_scratch_free.load(Ordering::Relaxed).max(wanted);
        let r = Readiness {
            ready: false,
            consuming: self.consuming.load(Ordering::Relaxed),
            broker: self.broker_up.load(Ordering::Relaxed),
            storage: self.storage_ok.load(Ordering::Relaxed),
            sandbox: self.sandbox_ok.load(Ordering::Relaxed),
            scratch: free.is_none_or(|f| f >= floor),
            scratch_free_bytes: free,
            commits: self
                .commit_failures
                .iter()
                .all(|f| f.load(Ordering::Relaxed) < MAX_COMMIT_FAILURES),
            publishing: self.blocked_publishes.load(Ordering::Relaxed) == 0,
            unit_topic: match self.unit_topic.load(Ordering::Relaxed) {
                0 => None,
                known => Some(known == 1),
            },
        };
        Readiness {
            ready: r.consuming
                && r.broker
                && r.storage
                && r.sandbox
                && r.scratch
                && r.commits
                && r.publishing,
            ..r
        }
    }
}

/// Checks `bucket` every `period` for `/health/ready` until `stop` (a worker that cannot write
/// its outputs should not take work).
pub async fn watch_storage(
    storage: Arc<dyn Storage>,
    bucket: String,
    period: Duration,
    health: Arc<Health>,
    stop: CancellationToken,
) {
    let mut every = tokio::time::interval(period);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = every.tick() => {}
        }
        let r = storage.check(&bucket).await;
        if let Err(e) = &r {
            tracing::warn!(bucket = %bucket, error = %e, "output bucket check failed");
        }
        health.set_storage_ok(r.is_ok());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_check_can_make_the_worker_unready() {
        let dir = tempfile::tempdir().unwrap();
        let h = Health::new(0, 0);
        assert!(!h.readiness(dir.path()).ready, "not consuming yet");
        h.set_consuming(true);
        assert!(h.readiness(dir.path()).ready);

        h.set_broker_up(false);
        assert!(!h.readiness(dir.path()).ready);
        h.set_broker_up(true);

        h.set_storage_ok(false);
        assert!(!h.readiness(dir.path()).storage);
        h.set_storage_ok(true);

        // Either consumer's (the request lane's, the unit lane's).
        for consumer in [0, 1] {
            h.set_commit_failures(consumer, MAX_COMMIT_FAILURES);
            assert!(!h.readiness(dir.path()).commits);
            h.set_commit_failures(consumer, 0);
            assert!(h.readiness(dir.path()).ready);
        }
        // A missing unit topic is reported, and the pod stays ready.
        h.set_unit_topic(false);
        let r = h.readiness(dir.path());
        assert_eq!((r.ready, r.unit_topic), (true, Some(false)));
        h.set_unit_topic(true);

        h.publish_blocked(true);
        assert!(!h.readiness(dir.path()).publishing);
        h.publish_blocked(false);
        assert!(h.readiness(dir.path()).ready);

        let full = Health::new(u64::MAX, 0);
        full.set_consuming(true);
        let r = full.readiness(dir.path());
        assert!(!r.scratch && !r.ready && r.scratch_free_bytes.is_some());
    }
}
