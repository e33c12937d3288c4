//! One job's media work, as the executor is given it and as the pool sends it to a child.

use std::path::PathBuf;
use std::time::Duration;

use crate::media::{self, MediaJob};

/// One job's media work.
#[derive(Debug, Clone)]
pub struct Work {
    pub job: MediaJob,
    pub input: PathBuf,
    pub out_dir: PathBuf,
    /// The work's `TMPDIR`.
    pub tmp_dir: PathBuf,
    /// Time limit, until the work announces its own (`Event::TimeLimit`, a video's).
    pub limit: Duration,
    /// The most the work may announce: the worker's own figure for this job.
    pub max_limit: Duration,
    /// Added to its CPU priority (`nice`) in a sandbox child; inline work ignores it.
    pub nice: i32,
}

impl Work {
    /// The work of `job` in a scratch directory: the limit `limit` until a video announces its
    /// own, at most what its profile and limits allow.
    pub fn new(job: MediaJob, scratch: &crate::scratch::ScratchDir, limit: Duration) -> Work {
        let max_limit = media::video::time_ceiling(&job).max(limit);
        Work {
            job,
            input: scratch.source(),
            out_dir: scratch.out_dir(),
            tmp_dir: scratch.tmp_dir(),
            limit,
            max_limit,
            nice: 0,
        }
    }
}
