//! A job's life: one request taken through validate → download → probe → analyze → transform →
//! upload → publish, with retries of transient failures. The lifecycle is explicit ([`Stage`],
//! [`Phase`], attempt, [`Failure`]) because the response, the metrics and `/jobs` report it.

pub mod registry;
pub mod response;
pub mod retry;
mod runner;
pub mod scratch;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::JobError;

pub use registry::{JobHandle, Registry};
pub use runner::{JobRunner, Services};

/// The stages of a job, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    Validate,
    Download,
    Probe,
    Analyze,
    Transform,
    Upload,
    Publish,
}

impl Stage {
    pub const ALL: [Stage; 7] = [
        Stage::Validate,
        Stage::Download,
        Stage::Probe,
        Stage::Analyze,
        Stage::Transform,
        Stage::Upload,
        Stage::Publish,
    ];

    /// The trace span of an async stage.
    pub fn span_name(self) -> String {
        format!("media.{}", self.as_str())
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Validate => "validate",
            Stage::Download => "download",
            Stage::Probe => "probe",
            Stage::Analyze => "analyze",
            Stage::Transform => "transform",
            Stage::Upload => "upload",
            Stage::Publish => "publish",
        }
    }
}

/// Where a job is between stages: waiting for a pool permit, running a stage, or backing off
/// before another attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Queued,
    Running,
    Backoff,
}

/// A failed attempt: the error and the stage it happened in.
#[derive(Debug)]
pub struct Failure {
    pub stage: Stage,
    pub error: JobError,
}

impl Failure {
    /// `map_err(Failure::at(Stage::Download))`
    pub fn at<E: Into<JobError>>(stage: Stage) -> impl FnOnce(E) -> Failure {
        move |e| Failure {
            stage,
            error: e.into(),
        }
    }
}
