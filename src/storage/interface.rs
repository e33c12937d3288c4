//! The one interface every object store implements ([`Storage`]), and what it speaks in.

use std::path::Path;

use async_trait::async_trait;

use crate::contract::SourceRef;

/// What a download found.
#[derive(Debug, Clone)]
pub struct SourceObject {
    pub size_bytes: u64,
    pub etag: Option<String>,
}

/// Headers set on every upload.
#[derive(Debug, Clone, Copy)]
pub struct ObjectMeta<'a> {
    pub content_type: &'a str,
    pub cache_control: &'a str,
}

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("source s3://{bucket}/{key} does not exist")]
    NotFound { bucket: String, key: String },
    #[error("access to s3://{bucket}/{key} denied")]
    AccessDenied { bucket: String, key: String },
    #[error("source is larger than the {limit}-byte limit ({size} bytes)")]
    TooLarge { size: u64, limit: u64 },
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// A ranged read found another version than the one asked for (its ETag).
    #[error("s3://{bucket}/{key} is no longer the version read before")]
    Changed { bucket: String, key: String },
    /// Local disk trouble (scratch space) or a rejected write: not the source's fault.
    #[error("storage failure: {0}")]
    Scratch(String),
}

impl From<std::io::Error> for StorageError {
    fn from(e: std::io::Error) -> Self {
        StorageError::Scratch(e.to_string())
    }
}

/// What a write made only where nothing is ([`Storage::create`]) found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Created {
    /// Nothing was there: the object is now the body written.
    New,
    /// An object was there already (S3's `412 Precondition Failed`): it is left as it was.
    Exists,
}

/// What a HEAD request tells of an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub size_bytes: u64,
    pub etag: Option<String>,
}

#[async_trait]
pub trait Storage: Send + Sync {
    /// Streams `src` to the file `dest` (never holding it whole in memory). Fails with
    /// [`StorageError::TooLarge`] as soon as more than `max_bytes` would be read.
    async fn download(
        &self,
        src: &SourceRef,
        dest: &Path,
        max_bytes: u64,
    ) -> Result<SourceObject, StorageError>;

    /// Bytes `[start, end)` of `src`, written at the same offsets of the existing file `dest`
    /// (its other bytes untouched), only while `src` is the version `etag` names
    /// ([`StorageError::Changed`] otherwise). A long video's unit reads its part of the source
    /// this way (`media::video::reads`).
    async fn download_range(
        &self,
        src: &SourceRef,
        dest: &Path,
        range: [u64; 2],
        etag: &str,
    ) -> Result<(), StorageError>;

    /// Uploads the file at `path` to `bucket/key`.
    async fn upload(
        &self,
        bucket: &str,
        key: &str,
        path: &Path,
        meta: &ObjectMeta<'_>,
    ) -> Result<(), StorageError>;

    /// The object's size and current ETag (a HEAD request; `None` when the store gives none).
    async fn head(&self, src: &SourceRef) -> Result<Head, StorageError>;

    /// A small object, whole (at most `max_bytes`).
    async fn read(&self, src: &SourceRef, max_bytes: u64) -> Result<Vec<u8>, StorageError>;

    /// Whether `bucket` is reachable and exists (the readiness probe).
    async fn check(&self, bucket: &str) -> Result<(), StorageError>;

    /// The keys in `bucket` under `prefix`, in no particular order (a long video's landed
    /// units: see `crate::units`).
    async fn list(&self, bucket: &str, prefix: &str) -> Result<Vec<String>, StorageError>;

    /// Writes `body` to `bucket/key` only if no object is there (S3's `If-None-Match: *`):
    /// of writers of one key at once, one finds [`Created::New`], the others
    /// [`Created::Exists`]. A long video's answer is claimed this way (`crate::units`).
    async fn create(
        &self,
        bucket: &str,
        key: &str,
        body: &[u8],
        meta: &ObjectMeta<'_>,
    ) -> Result<Created, StorageError>;

    /// Deletes `bucket/key` (a long video's pieces once it is answered); a missing key is no
    /// error.
    async fn delete(&self, bucket: &str, key: &str) -> Result<(), StorageError>;
}
