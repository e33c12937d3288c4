//! Stage 2: stream the source object into the job's scratch directory, under the size cap.

use std::path::Path;

use futures_util::{StreamExt, TryStreamExt, stream};

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
    tracing::info!(bytes = obj.size_bytes, "source downloaded");
    Ok(SourceInfo {
        bucket: src.bucket.clone(),
        key: src.key.clone(),
        size_bytes: Some(obj.size_bytes),
        etag: obj.etag,
    })
}

/// Ranged reads at once per unit.
const PARALLEL_RANGES: usize = 4;

/// A long video's unit: only the bytes `ranges` of the source version `etag` (see
/// `media::video::reads`), at their offsets in a file of the source's `size` whose other bytes
/// are never read (a sparse file: zeros that take no disk).
pub async fn ranges(
    storage: &dyn Storage,
    metrics: &Metrics,
    src: &SourceRef,
    dest: &Path,
    size: u64,
    ranges: &[[u64; 2]],
    etag: &str,
) -> Result<SourceInfo, StorageError> {
    tokio::fs::File::create(dest).await?.set_len(size).await?;
    // Collected first: a stream mapping with a borrowing closure is not `Send` for the
    // spawned job.
    let reads: Vec<_> = ranges
        .iter()
        .map(|r| storage.download_range(src, dest, *r, etag))
        .collect();
    stream::iter(reads)
        .buffer_unordered(PARALLEL_RANGES)
        .try_collect::<Vec<()>>()
        .await?;
    let read: u64 = ranges.iter().map(|[a, b]| b - a).sum();
    metrics.bytes_downloaded.inc_by(read);
    tracing::info!(
        read,
        of = size,
        ranges = ranges.len(),
        "the unit's part of the source downloaded"
    );
    Ok(SourceInfo {
        bucket: src.bucket.clone(),
        key: src.key.clone(),
        size_bytes: Some(size),
        etag: Some(etag.to_owned()),
    })
}
