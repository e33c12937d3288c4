//! Stage 6: upload every produced file under its deterministic key.

use futures_util::{StreamExt, TryStreamExt, stream};

use crate::contract::{MediaType, OptimizeRequest, Output};
use crate::media::ProducedFile;
use crate::storage::{ObjectMeta, Storage, StorageError};
use crate::telemetry::Metrics;

const PARALLEL_UPLOADS: usize = 4;

/// `{user_id}/{images|videos}/{media_id}/{name}`
pub fn key(user_id: &str, media_type: MediaType, media_id: &str, name: &str) -> String {
    let kind = match media_type {
        MediaType::Image => "images",
        MediaType::Video => "videos",
    };
    format!("{user_id}/{kind}/{media_id}/{name}")
}

/// Where and for whom the files of one job go.
pub struct Destination<'a> {
    pub storage: &'a dyn Storage,
    pub metrics: &'a Metrics,
    pub bucket: &'a str,
    pub req: &'a OptimizeRequest,
    pub media_type: MediaType,
    /// The profile's `cache_control`.
    pub cache_control: &'a str,
}

/// Uploads `files`, a few at a time; their outputs in the same order.
pub async fn run<'f>(
    to: &Destination<'_>,
    files: impl IntoIterator<Item = &'f ProducedFile>,
) -> Result<Vec<Output>, StorageError> {
    let uploads: Vec<_> = files.into_iter().map(|f| one(to, f)).collect();
    stream::iter(uploads)
        .buffered(PARALLEL_UPLOADS)
        .try_collect()
        .await
}

/// Uploads one file under its key.
pub async fn one(to: &Destination<'_>, f: &ProducedFile) -> Result<Output, StorageError> {
    let bucket = to.bucket;
    let key = key(&to.req.user_id, to.media_type, &to.req.media_id, &f.name);
    let meta = ObjectMeta {
        content_type: f.format.content_type(),
        cache_control: to.cache_control,
    };
    to.storage.upload(bucket, &key, &f.path, &meta).await?;
    to.metrics.bytes_uploaded.inc_by(f.size_bytes);
    Ok(Output {
        role: f.role.as_str().to_owned(),
        bucket: bucket.to_owned(),
        key,
        format: f.format.name().to_owned(),
        content_type: f.format.content_type().to_owned(),
        width: f.width,
        height: f.height,
        size_bytes: f.size_bytes,
        crop: f.crop,
        duration_ms: f.duration_ms,
        frames: f.frames,
        quality: f.quality,
    })
}
