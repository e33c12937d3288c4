//! The stages of a job that are not native media work, one file each: validate → download →
//! (probe → analyze → transform: `media`) → upload → manifest → publish. They take narrow
//! arguments (a storage handle, a bucket, metrics), never the job: `job::runner` calls them.

pub mod download;
pub mod manifest;
pub mod publish;
pub mod upload;
pub mod validate;
