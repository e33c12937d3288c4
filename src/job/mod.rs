//! A job's life: one request taken through validate → download → probe → analyze → transform →
//! upload → publish, with retries of transient failures. The lifecycle is explicit (stage,
//! [`Phase`], attempt, [`Failure`]) because the response, the metrics and `/jobs` report it.

pub mod registry;
pub mod response;
pub mod retry;
mod runner;
pub mod scratch;

use serde::Serialize;

use crate::error::JobError;

pub use registry::{JobHandle, Registry};
pub use runner::{JobRunner, Services};

/// Where a job is between stages: waiting for a pool permit, running a stage, or backing off
/// before another attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Queued,
    Running,
    Backoff,
}

/// A failed attempt: the classified error and the stage it happened in.
pub type Failure = crate::contract::Failure<JobError>;
