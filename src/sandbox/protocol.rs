//! What the worker, a fork server and a job process say to each other: one JSON document per
//! line, never longer than [`MAX_LINE`]. The worker writes a [`Request`] to a fork server's
//! stdin; the server answers on its stdout with [`Frame`]s: `Started` (the job process's pid),
//! the job process's own [`Reply`] lines, which the server reads from a pipe of that job's,
//! checks and passes on, and `Ended` once the job process and everything it started are gone.
//! A job process cannot forge a frame: it never holds the server's stdout.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::media::{Event, MediaFailure, MediaJob, MediaOutput};

use super::layers::Layers;

/// The longest line either side accepts. A longer one is a protocol violation: the job process
/// is killed and the job fails `media_crashed`.
pub const MAX_LINE: usize = 1 << 20;

/// One job for a fork server.
#[derive(Debug, Serialize, Deserialize)]
pub struct Request {
    pub job: MediaJob,
    pub input: PathBuf,
    /// Where the outputs go (read-write for the job process).
    pub out_dir: PathBuf,
    /// Its `TMPDIR` (read-write for the job process).
    pub tmp_dir: PathBuf,
    /// CPU seconds the job process may use (`RLIMIT_CPU`, a backstop behind the wall clock).
    pub cpu_secs: u64,
    /// Added to the job process's CPU priority (`nice`): what yields the cores to other work.
    pub nice: i32,
}

/// What a job process reports: events, then exactly one `Done`.
#[derive(Debug, Serialize, Deserialize)]
pub enum Reply {
    Event(Event),
    /// Boxed: an outcome is many times an event's size.
    Done(Box<Result<MediaOutput, MediaFailure>>),
}

/// What a fork server says.
#[derive(Debug, Serialize, Deserialize)]
pub enum Frame {
    /// Once, at start: libraries loaded, and the layers this kernel gives a job process.
    Ready(Layers),
    /// A job process was forked for the request.
    Started(i32),
    /// A line of the job process, checked.
    Reply(Reply),
    /// The job process is gone, and so is everything it started.
    Ended(Ended),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Ended {
    pub exit: Exit,
    /// Processes the job left running after its job process ended, killed.
    pub strays: u32,
    /// New processes or threads the pod's pids limit refused while the job ran.
    #[serde(default)]
    pub refused: u64,
}

/// How a job process ended.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Exit {
    Code(i32),
    Signal(i32),
    /// It broke the protocol (a line too long, an unreadable reply) and was killed.
    Violation(String),
    /// It could not be started (no pipe, no fork): the server's process limits, not the job.
    NotStarted(String),
}
