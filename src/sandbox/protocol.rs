//! What the worker and a sandbox child say to each other: one JSON document per line, a
//! [`Request`] on the child's stdin, [`Reply`] lines on its stdout.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::media::{Event, MediaFailure, MediaJob, MediaOutput};

/// One job for a child.
#[derive(Debug, Serialize, Deserialize)]
pub struct Request {
    pub job: MediaJob,
    pub input: PathBuf,
    pub out_dir: PathBuf,
    /// CPU seconds this job may use (`RLIMIT_CPU`, a backstop behind the worker's wall clock).
    pub cpu_secs: u64,
}

/// What a child reports about the job it runs: events, then exactly one `Done`.
#[derive(Debug, Serialize, Deserialize)]
pub enum Reply {
    Event(Event),
    Done(Result<MediaOutput, MediaFailure>),
}
