//! Stage 2: stream the source object into the job's scratch directory, under the size cap.

use std::path::Path;

use crate::contract::{SourceInfo, SourceRef};
use crate::job::Services;
use crate::storage::StorageError;

pub async fn run(svc: &Services, src: &SourceRef, dest: &Path) -> Result<SourceInfo, StorageError> {
    let obj = svc
        .storage
        .download(src, dest, svc.settings.limits.max_input_bytes)
        .await?;
    svc.metrics.bytes_downloaded.inc_by(obj.size_bytes);
    Ok(SourceInfo {
        bucket: src.bucket.clone(),
        key: src.key.clone(),
        size_bytes: Some(obj.size_bytes),
        etag: obj.etag,
    })
}
