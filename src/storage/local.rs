//! A local-file-system store: bucket names map to directories.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

use async_trait::async_trait;

use super::interface::{Created, Head, ObjectMeta, SourceObject, Storage, StorageError};
use crate::contract::SourceRef;

pub struct LocalStorage {
    root: PathBuf,
    buckets: HashMap<String, PathBuf>,
}

impl LocalStorage {
    /// Unmapped buckets live under `root/{bucket}`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        LocalStorage {
            root: root.into(),
            buckets: HashMap::new(),
        }
    }

    /// Maps a bucket name to a directory.
    pub fn with_bucket(mut self, bucket: &str, dir: impl Into<PathBuf>) -> Self {
        self.buckets.insert(bucket.to_owned(), dir.into());
        self
    }

    fn resolve(&self, bucket: &str, key: &str) -> Result<PathBuf, StorageError> {
        let rel = Path::new(key);
        if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
            return Err(StorageError::AccessDenied {
                bucket: bucket.into(),
                key: key.into(),
            });
        }
        let dir = self
            .buckets
            .get(bucket)
            .cloned()
            .unwrap_or_else(|| self.root.join(bucket));
        Ok(dir.join(rel))
    }

    /// The file behind `src` and its metadata; `TooLarge` above `max_bytes`.
    async fn object(
        &self,
        src: &SourceRef,
        max_bytes: u64,
    ) -> Result<(PathBuf, std::fs::Metadata), StorageError> {
        let path = self.resolve(&src.bucket, &src.key)?;
        let meta = match tokio::fs::metadata(&path).await {
            Ok(m) if m.is_file() => m,
            Ok(_) => {
                return Err(StorageError::NotFound {
                    bucket: src.bucket.clone(),
                    key: src.key.clone(),
                });
            }
            Err(e) => {
                return Err(match e.kind() {
                    std::io::ErrorKind::NotFound => StorageError::NotFound {
                        bucket: src.bucket.clone(),
                        key: src.key.clone(),
                    },
                    std::io::ErrorKind::PermissionDenied => StorageError::AccessDenied {
                        bucket: src.bucket.clone(),
                        key: src.key.clone(),
                    },
                    _ => StorageError::Unavailable(e.to_string()),
                });
            }
        };
        if meta.len() > max_bytes {
            return Err(StorageError::TooLarge {
                size: meta.len(),
                limit: max_bytes,
            });
        }
        Ok((path, meta))
    }
}

/// A name beside `dest` for writing it: the writer's own, so that two writers of one key never
/// rename (or link) each other's file.
fn partial_name(dest: &Path) -> PathBuf {
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut tmp = dest.as_os_str().to_owned();
    tmp.push(format!(".{}-{n}.partial", std::process::id()));
    tmp.into()
}

/// Size and modification time, like a web server's weak ETag.
fn etag_of(meta: &std::fs::Metadata) -> String {
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
    format!(
        "\"{:x}-{:x}\"",
        meta.len(),
        mtime.map(|d| d.as_nanos()).unwrap_or(0)
    )
}

#[async_trait]
impl Storage for LocalStorage {
    async fn check(&self, bucket: &str) -> Result<(), StorageError> {
        let dir = self.resolve(bucket, "probe")?;
        let dir = dir.parent().expect("bucket dir");
        tokio::fs::create_dir_all(dir)
            .await
            .map_err(|e| StorageError::Unavailable(format!("{}: {e}", dir.display())))
    }

    async fn download(
        &self,
        src: &SourceRef,
        dest: &Path,
        max_bytes: u64,
    ) -> Result<SourceObject, StorageError> {
        let (path, meta) = self.object(src, max_bytes).await?;
        let size = tokio::fs::copy(&path, dest).await?;
        Ok(SourceObject {
            size_bytes: size,
            etag: Some(etag_of(&meta)),
        })
    }

    async fn download_range(
        &self,
        src: &SourceRef,
        dest: &Path,
        range: [u64; 2],
        etag: &str,
    ) -> Result<(), StorageError> {
        use tokio::io::{AsyncReadExt, AsyncSeekExt};
        let (path, meta) = self.object(src, u64::MAX).await?;
        if etag_of(&meta) != etag {
            return Err(StorageError::Changed {
                bucket: src.bucket.clone(),
                key: src.key.clone(),
            });
        }
        let [start, end] = range;
        let mut from = tokio::fs::File::open(&path).await?;
        from.seek(std::io::SeekFrom::Start(start)).await?;
        let mut to = tokio::fs::OpenOptions::new().write(true).open(dest).await?;
        to.seek(std::io::SeekFrom::Start(start)).await?;
        let copied = tokio::io::copy(&mut from.take(end - start), &mut to).await?;
        if copied != end - start {
            return Err(StorageError::Unavailable(format!(
                "{}: {copied} of {} bytes read",
                path.display(),
                end - start
            )));
        }
        Ok(())
    }

    async fn list(&self, bucket: &str, prefix: &str) -> Result<Vec<String>, StorageError> {
        let root = self.resolve(bucket, "probe")?;
        let root = root.parent().expect("bucket dir").to_owned();
        // The folder the prefix names (up to its last `/`), walked.
        let dir = match prefix.rfind('/') {
            Some(i) => root.join(&prefix[..i]),
            None => root.clone(),
        };
        let mut keys = Vec::new();
        let mut stack = vec![dir];
        while let Some(d) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&d) else {
                continue;
            };
            for e in entries.flatten() {
                let path = e.path();
                if path.is_dir() {
                    stack.push(path);
                } else if let Ok(rel) = path.strip_prefix(&root) {
                    let key = rel.to_string_lossy().into_owned();
                    if key.starts_with(prefix) {
                        keys.push(key);
                    }
                }
            }
        }
        Ok(keys)
    }

    /// Written beside the key, then linked to it: the link fails if the key exists (atomic,
    /// as S3's `If-None-Match: *`), and no reader sees a half-written object.
    async fn create(
        &self,
        bucket: &str,
        key: &str,
        body: &[u8],
        _meta: &ObjectMeta<'_>,
    ) -> Result<Created, StorageError> {
        let dest = self.resolve(bucket, key)?;
        if let Some(parent) = dest.parent() {
            tokio::fs::create_dir_all(parent).await?;
        }
        let tmp = partial_name(&dest);
        let linked = async {
            tokio::fs::write(&tmp, body).await?;
            tokio::fs::hard_link(&tmp, &dest).await
        }
        .await;
        let _ = tokio::fs::remove_file(&tmp).await;
        match linked {
            Ok(()) => Ok(Created::New),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(Created::Exists),
            Err(e) => Err(e.into()),
        }
    }

    async fn delete(&self, bucket: &str, key: &str) -> Result<(), StorageError> {
        let path = self.resolve(bucket, key)?;
        match tokio::fs::remove_file(&path).await {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
            _ => Ok(()),
        }
    }

    async fn head(&self, src: &SourceRef) -> Result<Head, StorageError> {
        let meta = self.object(src, u64::MAX).await?.1;
        Ok(Head {
            size_bytes: meta.len(),
            etag: Some(etag_of(&meta)),
        })
    }

    async fn read(&self, src: &SourceRef, max_bytes: u64) -> Result<Vec<u8>, StorageError> {
        let (path, _) = self.object(src, max_bytes).await?;
        Ok(tokio::fs::read(&path).await?)
    }

    async fn upload(
        &self,
        bucket: &str,
        key: &str,
        path: &Path,
        _meta: &ObjectMeta<'_>,
    ) -> Result<(), StorageError> {
        let dest = self.resolve(bucket, key)?;
        if let Some(parent) = dest.parent() {
            tokio::fs::create_dir_all(parent).await?;
        }
        // Write then rename, so readers never see a half-written output.
        let tmp = partial_name(&dest);
        let written = async {
            tokio::fs::copy(path, &tmp).await?;
            tokio::fs::rename(&tmp, &dest).await
        }
        .await;
        if written.is_err() {
            let _ = tokio::fs::remove_file(&tmp).await;
        }
        Ok(written?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const META: ObjectMeta<'static> = ObjectMeta {
        content_type: "image/webp",
        cache_control: "no-cache",
    };

    /// Writers of one key (a file named twice to `process`) each land whole; a failed write
    /// leaves nothing beside the outputs.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writers_of_one_key_each_land_whole_and_a_failed_write_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStorage::new(dir.path()).with_bucket("out", dir.path().join("out"));
        let body = vec![7u8; 1 << 20];
        let src = dir.path().join("src.bin");
        std::fs::write(&src, &body).unwrap();
        let writes = (0..8).map(|_| store.upload("out", "a/b.webp", &src, &META));
        for written in futures_util::future::join_all(writes).await {
            written.unwrap();
        }
        assert_eq!(
            std::fs::read(dir.path().join("out/a/b.webp")).unwrap(),
            body
        );

        // A directory where the output should go: written, but not put in place.
        std::fs::create_dir(dir.path().join("out/a/c.webp")).unwrap();
        assert!(store.upload("out", "a/c.webp", &src, &META).await.is_err());
        let mut names: Vec<_> = std::fs::read_dir(dir.path().join("out/a"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(names, ["b.webp", "c.webp"]);
    }
}
