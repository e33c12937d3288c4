//! Stage 2: stream the source object into the job's scratch directory, under the size cap.

use std::path::Path;

use crate::contract::{SourceInfo, SourceRef};
use crate::storage::{Storage, StorageError};
use crate::telemetry::Metrics;

pub async fn run(
    storage: &dyn Storage,
    metrics: &Metrics,
    src: &SourceRef,
    dest: &Path,
    max_bytes: u64,
) -> Result<SourceInfo, StorageError> {
    let obj = storage.download(src, dest, max_bytes).await?;
    metrics.bytes_downloaded.inc_by(obj.size_bytes);
    Ok(SourceInfo {
        bucket: src.bucket.clone(),
        key: src.key.clone(),
        size_bytes: Some(obj.size_bytes),
        etag: obj.etag,
    })
}
