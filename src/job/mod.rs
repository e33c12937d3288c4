//! A job's life: a validated request taken through download → scan → probe → analyze →
//! transform → upload → manifest ([`runner`]), with retries of transient failures, to its
//! response ([`response`]). The message task (`worker::task`) validates before and publishes after. The
//! lifecycle is explicit (stage, phase, attempt, [`Failure`]) because the response, the metrics
//! and `/jobs` (`registry`) report it.

pub mod response;
mod runner;
mod services;
mod units;

pub use response::{Failure, Partial};
pub use runner::{Answer, JobRunner};
pub use services::{Services, executor, services, worker_info};
pub use units::As;
