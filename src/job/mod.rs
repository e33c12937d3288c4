//! A job's life: one request taken through validate → download → probe → analyze → transform →
//! upload → publish, with retries of transient failures ([`runner`]). The lifecycle is explicit
//! (stage, phase, attempt, [`Failure`]) because the response ([`response`]), the metrics and
//! `/jobs` (`telemetry::registry`) report it.

pub mod response;
mod runner;
mod services;

pub use response::Failure;
pub use runner::JobRunner;
pub use services::{Services, services, worker_info};
