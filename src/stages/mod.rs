//! The I/O stages of a job. Probe, analyze and transform are native media work: see `media`.
//! Publish is the Kafka producer's (see `kafka::producer`).

pub mod download;
pub mod replay;
pub mod upload;
pub mod validate;
