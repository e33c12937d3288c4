//! The `[storage]` section: the output bucket and the S3 client's behaviour.

use serde::Deserialize;

use crate::section::{Invalid, Section, ensure};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageSettings {
    pub output_bucket: String,
    pub force_path_style: bool,
    pub multipart_threshold_bytes: u64,
    pub timeout_secs: u64,
    /// How often `/health/ready` checks the output bucket.
    pub probe_interval_secs: u64,
}

impl Section for StorageSettings {
    fn validate(&self) -> Result<(), Invalid> {
        ensure(
            !self.output_bucket.trim().is_empty(),
            "output_bucket",
            "must not be empty",
        )?;
        ensure(
            self.probe_interval_secs > 0,
            "probe_interval_secs",
            "must be positive",
        )
    }
}
