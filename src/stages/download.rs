//! Stage 2: stream the source object into the job's scratch directory, under the size cap; or,
//! for a long video spread over the fleet, only the parts of it that this worker's part reads
//! (see `media::video::reads`): its header and index first ([`index`]), then byte ranges
//! ([`ranges`]) into a sparse file of the source's size.

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

/// Ranged reads at once per part: the audio's are thousands of small ones (a packet, or a few,
/// between the video's), each a round trip.
const PARALLEL_RANGES: usize = 16;

/// A source smaller than this is downloaded whole: its index and ranges would save little, for
/// a step more.
const INDEX_WORTH_BYTES: u64 = 32 << 20;
/// The first bytes of the media data, read with the index: the probes read the first packets
/// of each stream for their parameters.
const MEDIA_HEAD_BYTES: u64 = 2 << 20;
/// More top-level boxes than this: not a file to read in parts.
const MAX_BOXES: usize = 64;

/// The source's header and index alone: an MP4/MOV's top-level boxes other than its media data
/// (`mdat`), and the first [`MEDIA_HEAD_BYTES`] of that, in a sparse file of the source's size,
/// all of the version its HEAD names. From them the sandboxed `Part::Index` says what the plan
/// reads. `None`: download it whole (small, not ISO BMFF, fragmented, a box that does not fit,
/// a store without ETags). Box headers are the only bytes read here; nothing is decoded.
pub async fn index(
    storage: &dyn Storage,
    metrics: &Metrics,
    src: &SourceRef,
    dest: &Path,
    max_bytes: u64,
) -> Result<Option<(SourceInfo, Vec<[u64; 2]>)>, StorageError> {
    use tokio::io::{AsyncReadExt, AsyncSeekExt};
    let head = storage.head(src).await?;
    let size = head.size_bytes;
    if size > max_bytes {
        return Err(StorageError::TooLarge {
            size,
            limit: max_bytes,
        });
    }
    let Some(etag) = head.etag.filter(|_| size >= INDEX_WORTH_BYTES) else {
        return Ok(None);
    };
    let mut file = tokio::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(dest)
        .await?;
    file.set_len(size).await?;
    let (mut at, mut held) = (0u64, Vec::new());
    for n in 0.. {
        if at + 8 > size {
            break;
        }
        if n == MAX_BOXES {
            return Ok(None);
        }
        let header = [at, (at + 16).min(size)];
        storage.download_range(src, dest, header, &etag).await?;
        let mut b = [0u8; 16];
        file.seek(std::io::SeekFrom::Start(at)).await?;
        let got = file.read(&mut b).await?;
        let kind = &b[4..8];
        let len = match u32::from_be_bytes(b[..4].try_into().expect("4 bytes")) {
            0 => size - at,
            1 if got >= 16 => u64::from_be_bytes(b[8..].try_into().expect("8 bytes")),
            n => u64::from(n),
        };
        let first = n == 0 && kind != b"ftyp";
        if first || kind == b"moof" || len < 8 || len > size - at {
            return Ok(None);
        }
        let body = if kind == b"mdat" {
            len.min(MEDIA_HEAD_BYTES)
        } else {
            len
        };
        storage
            .download_range(src, dest, [at, at + body], &etag)
            .await?;
        held.push([at, at + body]);
        at += len;
    }
    let read: u64 = held.iter().map(|[a, b]| b - a).sum();
    metrics.bytes_downloaded.inc_by(read);
    tracing::info!(read, of = size, "the source's header and index downloaded");
    let source = SourceInfo {
        bucket: src.bucket.clone(),
        key: src.key.clone(),
        size_bytes: Some(size),
        etag: Some(etag),
    };
    Ok(Some((source, held)))
}

/// Of `ranges` (sorted, apart), the bytes not in `held` (sorted, apart): what is left to read.
pub fn missing(ranges: &[[u64; 2]], held: &[[u64; 2]]) -> Vec<[u64; 2]> {
    let mut out = Vec::new();
    for &[mut a, b] in ranges {
        for &[h0, h1] in held {
            if h1 <= a || h0 >= b {
                continue;
            }
            if h0 > a {
                out.push([a, h0]);
            }
            a = a.max(h1);
        }
        if a < b {
            out.push([a, b]);
        }
    }
    out
}

/// A part of a long video: only the bytes `ranges` of the source version `etag` (see
/// `media::video::reads`), at their offsets in a file of the source's `size` whose other bytes
/// are never read (a sparse file: zeros that take no disk); what an earlier read wrote there
/// (the index) stays.
pub async fn ranges(
    storage: &dyn Storage,
    metrics: &Metrics,
    src: &SourceRef,
    dest: &Path,
    size: u64,
    ranges: &[[u64; 2]],
    etag: &str,
) -> Result<SourceInfo, StorageError> {
    let file = tokio::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(dest)
        .await?;
    file.set_len(size).await?;
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
        "part of the source downloaded"
    );
    Ok(SourceInfo {
        bucket: src.bucket.clone(),
        key: src.key.clone(),
        size_bytes: Some(size),
        etag: Some(etag.to_owned()),
    })
}

#[cfg(test)]
mod tests {
    use super::missing;

    #[test]
    fn what_is_held_is_not_read_again() {
        let held = [[0, 100], [500, 600]];
        assert_eq!(
            missing(&[[0, 50], [80, 200], [450, 700], [900, 1000]], &held),
            vec![[100, 200], [450, 500], [600, 700], [900, 1000]]
        );
        assert_eq!(missing(&[[520, 580]], &held), Vec::<[u64; 2]>::new());
        assert_eq!(missing(&[[0, 1000]], &[]), vec![[0, 1000]]);
    }
}
