//! A job's life: a validated request taken through download → scan → probe → analyze →
//! transform → upload → manifest ([`runner`]), with retries of transient failures, to its
//! response ([`response`]). The message task (`worker::task`) validates before and publishes after. The
//! lifecycle is explicit (stage, phase, attempt, [`Failure`]) because the response, the metrics
//! and `/jobs` (`registry`) report it. A long video's plan, units and stitch are jobs too
//! ([`role`], `units`; the protocol is `crate::units`).

mod early;
#[cfg(test)]
mod early_races;
pub mod response;
mod role;
mod runner;
mod services;
mod units;

pub use response::{Failure, Partial};
pub use role::{Answer, As};
pub use runner::JobRunner;
pub use services::{Services, executor, services, worker_info};
pub use units::TaskEnd;
