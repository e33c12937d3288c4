//! S3 through aws-sdk-s3: the standard credential chain, `AWS_ENDPOINT_URL_S3` for local
//! servers, path-style addressing on request. The SDK's own retries are off: the job runner
//! retries transient failures itself, so that `attempts` in the response is the whole truth.

use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;
use aws_config::BehaviorVersion;
use aws_config::timeout::TimeoutConfig;
use aws_sdk_s3::Client;
use aws_sdk_s3::config::SharedHttpClient;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::{ByteStream, Length};
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use aws_smithy_http_client::tls;
use tokio::io::{AsyncSeekExt, AsyncWriteExt};

use super::interface::{Created, Head, ObjectMeta, SourceObject, Storage, StorageError};
use super::settings::StorageSettings;
use crate::contract::SourceRef;

/// Parts of a multipart upload (S3's minimum is 5 MiB).
const PART_SIZE: u64 = 8 * 1024 * 1024;

/// The SDK's HTTPS client (hyper, rustls on ring), for the storage and its credential providers.
pub fn http_client() -> SharedHttpClient {
    aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https()
}

pub struct S3Storage {
    client: Client,
    multipart_threshold: u64,
}

impl S3Storage {
    pub async fn from_env(settings: &StorageSettings) -> S3Storage {
        let timeouts = TimeoutConfig::builder()
            .connect_timeout(Duration::from_secs(5))
            .operation_attempt_timeout(Duration::from_secs(settings.timeout_secs))
            .build();
        // The SDK's standard retries per call (3 attempts, or AWS_MAX_ATTEMPTS / AWS_RETRY_MODE
        // from the environment): one failed PUT is retried in place instead of redoing the job.
        // The worker's own attempts (RETRY_COUNT) come on top, for outages.
        let shared = aws_config::defaults(BehaviorVersion::latest())
            .http_client(http_client())
            .timeout_config(timeouts)
            .load()
            .await;
        let conf = aws_sdk_s3::config::Builder::from(&shared)
            .force_path_style(settings.force_path_style)
            .build();
        S3Storage {
            client: Client::from_conf(conf),
            multipart_threshold: settings.multipart_threshold_bytes.max(PART_SIZE),
        }
    }

    /// Wraps an existing client (tests, custom set-ups).
    pub fn with_client(client: Client, multipart_threshold: u64) -> S3Storage {
        S3Storage {
            client,
            multipart_threshold: multipart_threshold.max(PART_SIZE),
        }
    }

    async fn upload_multipart(
        &self,
        bucket: &str,
        key: &str,
        path: &Path,
        size: u64,
        meta: &ObjectMeta<'_>,
    ) -> Result<(), StorageError> {
        let c = &self.client;
        let created = c
            .create_multipart_upload()
            .bucket(bucket)
            .key(key)
            .content_type(meta.content_type)
            .cache_control(meta.cache_control)
            .send()
            .await
            .map_err(|e| classify_write(e, bucket, key))?;
        let upload_id = created.upload_id().unwrap_or_default().to_owned();
        let result = async {
            let mut parts = Vec::new();
            for (i, offset) in (0..size).step_by(PART_SIZE as usize).enumerate() {
                let n = (size - offset).min(PART_SIZE);
                let body = ByteStream::read_from()
                    .path(path)
                    .offset(offset)
                    .length(Length::Exact(n))
                    .build()
                    .await
                    .map_err(|e| StorageError::Scratch(e.to_string()))?;
                let part = (i + 1) as i32;
                let done = c
                    .upload_part()
                    .bucket(bucket)
                    .key(key)
                    .upload_id(&upload_id)
                    .part_number(part)
                    .body(body)
                    .send()
                    .await
                    .map_err(|e| classify_write(e, bucket, key))?;
                parts.push(
                    CompletedPart::builder()
                        .part_number(part)
                        .set_e_tag(done.e_tag)
                        .build(),
                );
            }
            c.complete_multipart_upload()
                .bucket(bucket)
                .key(key)
                .upload_id(&upload_id)
                .multipart_upload(
                    CompletedMultipartUpload::builder()
                        .set_parts(Some(parts))
                        .build(),
                )
                .send()
                .await
                .map_err(|e| classify_write(e, bucket, key))?;
            Ok(())
        }
        .await;
        if result.is_err() {
            let _ = c
                .abort_multipart_upload()
                .bucket(bucket)
                .key(key)
                .upload_id(&upload_id)
                .send()
                .await;
        }
        result
    }
}

/// HTTP status of a failed call, when a response came back at all.
fn status<E>(e: &SdkError<E, aws_sdk_s3::config::http::HttpResponse>) -> Option<u16> {
    e.raw_response().map(|r| r.status().as_u16())
}

/// No response, a timeout, 5xx or throttling: the store may answer later.
fn unavailable<E: ProvideErrorMetadata + std::fmt::Debug>(
    e: &SdkError<E, aws_sdk_s3::config::http::HttpResponse>,
) -> Option<StorageError> {
    let code = e
        .as_service_error()
        .and_then(|s| s.code())
        .unwrap_or_default();
    let transient = match e {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            true
        }
        _ => {
            matches!(status(e), Some(429 | 500..=599))
                || matches!(
                    code,
                    "SlowDown" | "Throttling" | "RequestTimeout" | "InternalError"
                )
        }
    };
    transient.then(|| StorageError::Unavailable(describe(e)))
}

fn describe<E: ProvideErrorMetadata + std::fmt::Debug>(
    e: &SdkError<E, aws_sdk_s3::config::http::HttpResponse>,
) -> String {
    match e {
        SdkError::ServiceError(s) => {
            let err = s.err();
            format!(
                "{} (HTTP {}): {}",
                err.code().unwrap_or("error"),
                s.raw().status().as_u16(),
                err.message().unwrap_or_default()
            )
        }
        SdkError::TimeoutError(_) => "request timed out".to_owned(),
        SdkError::DispatchFailure(d) => format!("cannot reach the store: {d:?}")
            .chars()
            .take(300)
            .collect(),
        other => format!("{other}"),
    }
}

fn classify_read<E: ProvideErrorMetadata + std::fmt::Debug>(
    e: SdkError<E, aws_sdk_s3::config::http::HttpResponse>,
    src: &SourceRef,
) -> StorageError {
    if let Some(u) = unavailable(&e) {
        return u;
    }
    let code = e
        .as_service_error()
        .and_then(|s| s.code())
        .unwrap_or_default();
    match (status(&e), code) {
        (Some(404), _) | (_, "NoSuchKey" | "NoSuchBucket") => StorageError::NotFound {
            bucket: src.bucket.clone(),
            key: src.key.clone(),
        },
        (Some(401 | 403), _) | (_, "AccessDenied") => StorageError::AccessDenied {
            bucket: src.bucket.clone(),
            key: src.key.clone(),
        },
        _ => StorageError::Unavailable(describe(&e)),
    }
}

/// A rejected write (missing output bucket, no permission) is a deployment problem, not a
/// transient one: it is reported as such and not retried.
fn classify_write<E: ProvideErrorMetadata + std::fmt::Debug>(
    e: SdkError<E, aws_sdk_s3::config::http::HttpResponse>,
    bucket: &str,
    key: &str,
) -> StorageError {
    unavailable(&e).unwrap_or_else(|| {
        StorageError::Scratch(format!(
            "cannot write s3://{bucket}/{key}: {}",
            describe(&e)
        ))
    })
}

impl S3Storage {
    /// GetObject, refused up front when the announced length is over `max_bytes`.
    async fn get(
        &self,
        src: &SourceRef,
        max_bytes: u64,
    ) -> Result<aws_sdk_s3::operation::get_object::GetObjectOutput, StorageError> {
        let resp = self
            .client
            .get_object()
            .bucket(&src.bucket)
            .key(&src.key)
            .send()
            .await
            .map_err(|e| classify_read(e, src))?;
        if let Some(len) = resp.content_length().filter(|l| *l as u64 > max_bytes) {
            return Err(StorageError::TooLarge {
                size: len as u64,
                limit: max_bytes,
            });
        }
        Ok(resp)
    }
}

#[async_trait]
impl Storage for S3Storage {
    async fn head(&self, src: &SourceRef) -> Result<Head, StorageError> {
        let head = self
            .client
            .head_object()
            .bucket(&src.bucket)
            .key(&src.key)
            .send()
            .await
            .map_err(|e| classify_read(e, src))?;
        Ok(Head {
            size_bytes: head.content_length().unwrap_or(0).max(0) as u64,
            etag: head.e_tag().map(str::to_owned),
        })
    }

    async fn read(&self, src: &SourceRef, max_bytes: u64) -> Result<Vec<u8>, StorageError> {
        let resp = self.get(src, max_bytes).await?;
        let bytes = resp
            .body
            .collect()
            .await
            .map_err(|e| StorageError::Unavailable(format!("read interrupted: {e}")))?;
        Ok(bytes.into_bytes().to_vec())
    }

    async fn check(&self, bucket: &str) -> Result<(), StorageError> {
        self.client
            .head_bucket()
            .bucket(bucket)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| classify_write(e, bucket, ""))
    }

    async fn list(&self, bucket: &str, prefix: &str) -> Result<Vec<String>, StorageError> {
        let mut keys = Vec::new();
        let mut pages = self
            .client
            .list_objects_v2()
            .bucket(bucket)
            .prefix(prefix)
            .into_paginator()
            .send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| classify_write(e, bucket, prefix))?;
            keys.extend(
                page.contents()
                    .iter()
                    .filter_map(|o| o.key().map(str::to_owned)),
            );
        }
        Ok(keys)
    }

    async fn create(
        &self,
        bucket: &str,
        key: &str,
        body: &[u8],
        meta: &ObjectMeta<'_>,
    ) -> Result<Created, StorageError> {
        let put = self
            .client
            .put_object()
            .bucket(bucket)
            .key(key)
            .content_type(meta.content_type)
            .cache_control(meta.cache_control)
            .if_none_match("*")
            .body(ByteStream::from(body.to_vec()))
            .send()
            .await;
        match put {
            Ok(_) => Ok(Created::New),
            Err(e) if status(&e) == Some(412) => Ok(Created::Exists),
            // S3's answer to a conditional write racing another on the key: the other may
            // fail, so this one is to be tried again (it then finds the winner's object).
            Err(e) if status(&e) == Some(409) => Err(StorageError::Unavailable(describe(&e))),
            Err(e) => Err(classify_write(e, bucket, key)),
        }
    }

    async fn delete(&self, bucket: &str, key: &str) -> Result<(), StorageError> {
        self.client
            .delete_object()
            .bucket(bucket)
            .key(key)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| classify_write(e, bucket, key))
    }

    async fn download(
        &self,
        src: &SourceRef,
        dest: &Path,
        max_bytes: u64,
    ) -> Result<SourceObject, StorageError> {
        let resp = self.get(src, max_bytes).await?;
        let etag = resp.e_tag().map(str::to_owned);
        let mut body = resp.body;
        let mut file = tokio::fs::File::create(dest).await?;
        let mut written: u64 = 0;
        loop {
            let chunk = body
                .try_next()
                .await
                .map_err(|e| StorageError::Unavailable(format!("download interrupted: {e}")))?;
            let Some(chunk) = chunk else { break };
            written += chunk.len() as u64;
            if written > max_bytes {
                return Err(StorageError::TooLarge {
                    size: written,
                    limit: max_bytes,
                });
            }
            file.write_all(&chunk).await?;
        }
        file.flush().await?;
        Ok(SourceObject {
            size_bytes: written,
            etag,
        })
    }

    async fn download_range(
        &self,
        src: &SourceRef,
        dest: &Path,
        range: [u64; 2],
        etag: &str,
    ) -> Result<(), StorageError> {
        let [start, end] = range;
        let changed = || StorageError::Changed {
            bucket: src.bucket.clone(),
            key: src.key.clone(),
        };
        let resp = self
            .client
            .get_object()
            .bucket(&src.bucket)
            .key(&src.key)
            .range(format!("bytes={start}-{}", end - 1))
            .if_match(etag)
            .send()
            .await
            .map_err(|e| match status(&e) {
                // Another version (412), or one shorter than the range asked (416).
                Some(412 | 416) => changed(),
                _ => classify_read(e, src),
            })?;
        // A store that ignores `If-Match` still names the version it answered with.
        if resp.e_tag() != Some(etag) {
            return Err(changed());
        }
        let mut body = resp.body;
        let mut file = tokio::fs::OpenOptions::new().write(true).open(dest).await?;
        file.seek(std::io::SeekFrom::Start(start)).await?;
        let mut written = 0u64;
        while let Some(chunk) = body
            .try_next()
            .await
            .map_err(|e| StorageError::Unavailable(format!("download interrupted: {e}")))?
        {
            written += chunk.len() as u64;
            if written > end - start {
                return Err(StorageError::Unavailable(format!(
                    "a ranged read of {} bytes answered more",
                    end - start
                )));
            }
            file.write_all(&chunk).await?;
        }
        if written != end - start {
            return Err(StorageError::Unavailable(format!(
                "a ranged read of {} bytes answered {written}",
                end - start
            )));
        }
        file.flush().await?;
        Ok(())
    }

    async fn upload(
        &self,
        bucket: &str,
        key: &str,
        path: &Path,
        meta: &ObjectMeta<'_>,
    ) -> Result<(), StorageError> {
        let size = tokio::fs::metadata(path).await?.len();
        if size > self.multipart_threshold {
            return self.upload_multipart(bucket, key, path, size, meta).await;
        }
        let body = ByteStream::from_path(path)
            .await
            .map_err(|e| StorageError::Scratch(e.to_string()))?;
        self.client
            .put_object()
            .bucket(bucket)
            .key(key)
            .content_type(meta.content_type)
            .cache_control(meta.cache_control)
            .body(body)
            .send()
            .await
            .map_err(|e| classify_write(e, bucket, key))?;
        Ok(())
    }
}
