//! media-worker: Kafka optimize-request → S3 → libvips variants → S3 → Kafka response.
//!
//! The pipeline, one module per stage: `stages::validate` → `stages::download` →
//! `media::probe` → `media::analyze` → `media::transform` → `stages::upload` →
//! `kafka::producer` (publish). `job` holds the lifecycle and the runner, `kafka` the consumer
//! mechanics, `storage` the object store interface, `telemetry` metrics, logs and HTTP.

pub mod cli;
pub mod commands;
pub mod config;
pub mod contract;
pub mod error;
pub mod job;
pub mod kafka;
pub mod media;
pub mod retry;
pub mod shutdown;
pub mod stages;
pub mod storage;
pub mod telemetry;
pub mod worker;
