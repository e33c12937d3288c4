//! The stages of a job that are not native media work, one file each: validate → download →
//! (scan: `scan`) → (probe → analyze → transform: `media`) → upload (through `resume`, which
//! uploads a video's renditions one at a time) → manifest → publish. They take narrow
//! arguments (a storage handle, a bucket, metrics), never the job: `job::runner` calls them.

pub mod download;
pub mod manifest;
pub mod publish;
pub mod resume;
pub mod upload;
pub mod validate;
