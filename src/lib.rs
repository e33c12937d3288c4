//! media-worker: Kafka optimize-request → S3 → libvips variants → S3 → Kafka response.
//!
//! The pipeline, one named place per stage (`contract::Stage`): `stages::validate` →
//! `stages::download` → `scan` → `media::probe` → `media::analyze` → `media::transform`
//! (through `media::image` or `media::video`) → `stages::upload` (`stages::resume` for video
//! renditions, then `stages::manifest`) → `stages::publish`.
//!
//! `job` runs one request through the stages (attempts, retries, the response); `worker` is
//! start → poll/spawn → stop, the stop executed by `shutdown`'s sequence; `api` the job API;
//! `kafka` holds the consumer and producer mechanics, `storage` the object store interface,
//! `sandbox` the confined job processes. `health` decides readiness and pauses intake,
//! `registry` lists the jobs in progress, `http` serves both; `telemetry` only records (metrics,
//! logs, traces). `config` loads the layers; each section checks itself beside its code
//! (`section`). `contract` is the event types, with the `contract::vocabulary` every module may
//! use at the bottom. No file or folder imports one that imports it back
//! (`tests/architecture.rs`).

pub mod access;
pub mod allocator;
pub mod api;
pub mod cli;
pub mod commands;
pub mod config;
pub mod contract;
pub mod error;
pub mod health;
pub mod http;
pub mod job;
pub mod kafka;
pub mod media;
pub mod registry;
pub mod retry;
pub mod sandbox;
pub mod scan;
pub mod scratch;
pub mod section;
pub mod shutdown;
pub mod stages;
pub mod storage;
pub mod telemetry;
pub mod units;
pub mod worker;
