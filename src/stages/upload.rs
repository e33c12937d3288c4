//! Stage 6: upload every produced file under its deterministic key.

use futures_util::{StreamExt, TryStreamExt, stream};

use crate::contract::{MediaType, OptimizeRequest, Output};
use crate::job::Services;
use crate::media::ProducedFile;
use crate::storage::{ObjectMeta, StorageError};

/// Outputs are immutable: the same request always writes the same bytes to the same key.
pub const CACHE_CONTROL: &str = "public, max-age=31536000, immutable";
const PARALLEL_UPLOADS: usize = 4;

/// `{user_id}/{images|videos}/{media_id}/{name}`
pub fn key(user_id: &str, media_type: MediaType, media_id: &str, name: &str) -> String {
    let kind = match media_type {
        MediaType::Image => "images",
        MediaType::Video => "videos",
    };
    format!("{user_id}/{kind}/{media_id}/{name}")
}

pub async fn run(
    svc: &Services,
    req: &OptimizeRequest,
    media_type: MediaType,
    files: &[ProducedFile],
) -> Result<Vec<Output>, StorageError> {
    let uploads: Vec<_> = files
        .iter()
        .map(|f| upload_one(svc, req, media_type, f))
        .collect();
    stream::iter(uploads)
        .buffered(PARALLEL_UPLOADS)
        .try_collect()
        .await
}

async fn upload_one(
    svc: &Services,
    req: &OptimizeRequest,
    media_type: MediaType,
    f: &ProducedFile,
) -> Result<Output, StorageError> {
    let bucket = svc.settings.storage.output_bucket.as_str();
    let key = key(&req.user_id, media_type, &req.media_id, &f.name);
    let meta = ObjectMeta {
        content_type: f.format.content_type(),
        cache_control: CACHE_CONTROL,
    };
    svc.storage.upload(bucket, &key, &f.path, &meta).await?;
    svc.metrics.bytes_uploaded.inc_by(f.size_bytes);
    Ok(Output {
        role: f.role.to_owned(),
        bucket: bucket.to_owned(),
        key,
        format: f.format.name().to_owned(),
        content_type: f.format.content_type().to_owned(),
        width: f.width,
        height: f.height,
        size_bytes: f.size_bytes,
        crop: f.crop,
        duration_ms: f.duration_ms,
    })
}
