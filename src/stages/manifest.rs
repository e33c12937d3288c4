//! The manifest, and replay. After every output of a job is uploaded, `manifest.json` is written
//! last next to them: what the response said, for which source version (its ETag) and
//! which profile (a fingerprint of every setting that shapes the outputs). A later request for
//! the same media whose source ETag and fingerprint match is answered from the manifest
//! (`"replayed": true`) without downloading or transforming anything. Because the manifest is
//! written last, its presence means every output it lists exists. A request whose source is gone
//! is answered from the manifest when it records the request's profile (`"source_missing":
//! true`): deleting originals once their variants exist is common, and a redelivery after a
//! crash before the commit must not turn a finished upload into `source_not_found`.

use serde::{Deserialize, Serialize};

use super::upload::key;
use crate::config::Settings;
use crate::contract::{
    Analysis, MediaType, OptimizeRequest, Output, SourceInfo, SourceRef, Warning,
};
use crate::storage::{ObjectMeta, Storage, StorageError};

pub const MANIFEST: &str = "manifest.json";
/// The manifest and the rendition record are replaced when the source or profile changes:
/// not immutable like the outputs.
pub const NO_CACHE: &str = "no-cache";
/// Larger manifests are not ours: ignored.
const MAX_MANIFEST_BYTES: u64 = 4 << 20;

/// What a successful job produced: what its response reports and its manifest stores.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Produced {
    pub media_type: MediaType,
    pub source: SourceInfo,
    pub outputs: Vec<Output>,
    pub analysis: Option<Analysis>,
    pub warnings: Vec<Warning>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub schema_version: u32,
    pub source_etag: String,
    pub profile: String,
    pub fingerprint: String,
    #[serde(flatten)]
    pub produced: Produced,
}

impl Manifest {
    /// The manifest of what `req` produced, for a source with an ETag (see the module doc).
    pub fn of(req: &OptimizeRequest, fingerprint: String, produced: &Produced) -> Option<Manifest> {
        Some(Manifest {
            schema_version: crate::contract::SCHEMA_VERSION,
            source_etag: produced.source.etag.clone()?,
            profile: profile_of(req).to_owned(),
            fingerprint,
            produced: produced.clone(),
        })
    }

    /// What is replayed for `req`: the stored outputs, with this request's source names.
    pub fn replay(self, req: &OptimizeRequest) -> Produced {
        let source = SourceInfo {
            bucket: req.source.bucket.clone(),
            key: req.source.key.clone(),
            ..self.produced.source
        };
        Produced {
            source,
            ..self.produced
        }
    }
}

/// Everything that decides a profile's outputs: the profile, the analysis, video and limit
/// settings, and the worker version (whose code makes the bytes). FNV-1a over their `Debug`
/// text: stable for one build, which is what a fleet runs.
pub fn fingerprint(settings: &Settings, profile: &str) -> String {
    let text = format!(
        "{}|{profile}|{:?}|{:?}|{:?}|{:?}",
        env!("CARGO_PKG_VERSION"),
        settings.profiles.get(profile),
        settings.analysis,
        settings.video,
        settings.limits,
    );
    fnv1a(&text)
}

/// FNV-1a of `text`, in hex: a stable name.
pub fn fnv1a(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

pub fn profile_of(req: &OptimizeRequest) -> &str {
    req.profile.as_deref().unwrap_or("default")
}

/// The stored manifest for this request, when it is still valid: same source ETag (`etag`, from
/// the caller's HEAD of the source), same profile `fingerprint`. Any miss or error means
/// "process it" (and is no failure).
pub async fn lookup(
    storage: &dyn Storage,
    bucket: &str,
    fingerprint: &str,
    req: &OptimizeRequest,
    etag: Option<&str>,
) -> Option<Manifest> {
    if req.force {
        return None;
    }
    let etag = etag?;
    let m = stored(storage, bucket, req).await?;
    // Another source version or profile: process again.
    (m.source_etag == etag && m.fingerprint == fingerprint && m.profile == profile_of(req))
        .then_some(m)
}

/// The stored manifest for a request whose source is gone (deleted once its outputs existed,
/// then the request delivered again after a crash before its commit): valid when it was made
/// from this request's source object with this request's profile, whatever the settings now
/// (nothing could be made again; the outputs it lists exist). `force` still asks for a
/// processing, which then fails `source_not_found`.
pub async fn lookup_without_source(
    storage: &dyn Storage,
    bucket: &str,
    req: &OptimizeRequest,
) -> Option<Manifest> {
    if req.force {
        return None;
    }
    let m = stored(storage, bucket, req).await?;
    let source = &m.produced.source;
    let same_source = source.bucket == req.source.bucket && source.key == req.source.key;
    (same_source && m.profile == profile_of(req)).then_some(m)
}

/// The manifest stored for `req`'s media, whatever it is valid for.
async fn stored(storage: &dyn Storage, bucket: &str, req: &OptimizeRequest) -> Option<Manifest> {
    // The type is only known after a download: a hint says where to look first.
    let kinds = match req.media_type {
        Some(MediaType::Video) => [MediaType::Video, MediaType::Image],
        _ => [MediaType::Image, MediaType::Video],
    };
    for kind in kinds {
        let src = SourceRef {
            bucket: bucket.to_owned(),
            key: key(&req.user_id, kind, &req.media_id, MANIFEST),
        };
        let Ok(bytes) = storage.read(&src, MAX_MANIFEST_BYTES).await else {
            continue;
        };
        let Ok(m) = serde_json::from_slice::<Manifest>(&bytes) else {
            tracing::warn!(key = %src.key, "unreadable manifest ignored");
            continue;
        };
        return Some(m);
    }
    None
}

/// Writes the manifest of a finished job, after all its outputs (a manifest is only made for a
/// source with an ETag: without one there is nothing to check a later request against).
pub async fn record(
    storage: &dyn Storage,
    bucket: &str,
    req: &OptimizeRequest,
    manifest: &Manifest,
    scratch: &std::path::Path,
) -> Result<(), StorageError> {
    let path = scratch.join(MANIFEST);
    let json = serde_json::to_vec_pretty(manifest).expect("manifest serialises");
    crate::scratch::write_record(&path, &json).await?;
    let key = key(
        &req.user_id,
        manifest.produced.media_type,
        &req.media_id,
        MANIFEST,
    );
    let meta = ObjectMeta {
        content_type: "application/json",
        cache_control: NO_CACHE,
    };
    storage.upload(bucket, &key, &path, &meta).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fingerprint_follows_the_profile() {
        let s = Settings::load_from(None, Vec::new()).unwrap();
        assert_eq!(fingerprint(&s, "default"), fingerprint(&s, "default"));
        assert_ne!(fingerprint(&s, "default"), fingerprint(&s, "variants"));
        let mut changed = s.clone();
        changed
            .profiles
            .get_mut("default")
            .unwrap()
            .widths
            .push(2560);
        assert_ne!(fingerprint(&s, "default"), fingerprint(&changed, "default"));
    }
}
