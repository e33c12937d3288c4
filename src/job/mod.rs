//! A job's life: one request taken through validate → download → probe → analyze → transform →
//! upload → publish, with retries of transient failures ([`runner`]). The lifecycle is explicit
//! (stage, [`Phase`], attempt, [`Failure`]) because the response, the metrics and `/jobs`
//! report it ([`registry`], [`response`]).

pub mod registry;
pub mod response;
mod runner;
pub mod scratch;
mod services;

pub use registry::{JobHandle, Phase, Registry};
pub use response::Failure;
pub use runner::JobRunner;
pub use services::{Services, services, worker_info};
