//! media-worker: Kafka optimize-request → S3 → libvips variants → S3 → Kafka response.
//!
//! The pipeline, one named place per stage: `stages::validate` → `stages::download` →
//! `media::probe` → `media::analyze` → `media::transform` (through `media::image` or
//! `media::video`) → `stages::upload` → `stages::manifest` → `stages::publish`.
//!
//! `job` runs one request through the stages (attempts, retries, the response); `worker` is
//! poll → spawn → drain, stopped by `shutdown`'s sequence; `kafka` holds the consumer and
//! producer mechanics, `storage` the object store interface, `telemetry` metrics, logs and
//! HTTP, `config` loading and validation. `contract` is the event types, with the
//! `contract::vocabulary` every module may use at the bottom; nothing imports upwards.

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
pub mod worker;
