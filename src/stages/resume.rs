//! Resume at rendition granularity. A video's renditions are uploaded one at a time, and after
//! each one `renditions.json`, beside the manifest, records those that have landed for this
//! source ETag and profile fingerprint. A later attempt for the same source and profile (a
//! retry, or a redelivery after a crash or a shutdown deadline, on any replica) reads it and
//! does not make them again: only the missing rungs are encoded, and the response lists the
//! recorded outputs as an uninterrupted run would have. `force: true` redoes everything.
//!
//! The record is only ever written after the rendition it lists, so whatever it lists exists.
//!
//! All of resuming is here: what an earlier attempt left ([`find`]) and the upload stage of an
//! attempt that may resume ([`upload_all`]); the runner only passes the record between them.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::manifest;
use super::upload::{self, Destination, key};
use crate::contract::{MediaType, OptimizeRequest, Output, SourceRef};
use crate::media::sniff::{self, Sniffed};
use crate::media::{ProducedFile, Role};
use crate::storage::{ObjectMeta, Storage, StorageError};

pub const RECORD: &str = "renditions.json";
/// Larger records are not ours: ignored.
const MAX_RECORD_BYTES: u64 = 1 << 20;

/// The renditions of one source version and profile that have landed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Landed {
    pub source_etag: String,
    pub profile: String,
    pub fingerprint: String,
    pub renditions: Vec<Output>,
}

impl Landed {
    /// An empty record for this source version and profile.
    pub fn new(source_etag: String, profile: &str, fingerprint: String) -> Landed {
        Landed {
            source_etag,
            profile: profile.to_owned(),
            fingerprint,
            renditions: Vec::new(),
        }
    }

    /// The rung heights (shorter displayed sides) already there, for the media job.
    pub fn heights(&self) -> Vec<u32> {
        self.renditions.iter().map(rung_height).collect()
    }

    fn is_for(&self, other: &Landed) -> bool {
        (&self.source_etag, &self.profile, &self.fingerprint)
            == (&other.source_etag, &other.profile, &other.fingerprint)
    }
}

/// A rendition's rung: its shorter side (see `media::video::transcode::plan`).
fn rung_height(o: &Output) -> u32 {
    o.width.min(o.height)
}

/// For a video `source` with an ETag: the record of this source version and `profile`
/// (`fingerprint` is the profile's, see `manifest::fingerprint`), with the renditions an
/// earlier attempt uploaded, if any. `None` for anything else: nothing can resume.
pub async fn find(
    storage: &dyn Storage,
    bucket: &str,
    req: &OptimizeRequest,
    source: &Path,
    etag: Option<&str>,
    fingerprint: String,
) -> Option<Landed> {
    let etag = etag?.to_owned();
    let Ok(Sniffed::Video(_)) = sniff::sniff_file(source) else {
        return None;
    };
    let want = Landed::new(etag, manifest::profile_of(req), fingerprint);
    Some(lookup(storage, bucket, req, want).await)
}

/// What an earlier attempt left for `want`'s source version and profile: `want` with the
/// renditions that landed, or `want` itself (nothing to resume, `force`, or any read error).
async fn lookup(
    storage: &dyn Storage,
    bucket: &str,
    req: &OptimizeRequest,
    want: Landed,
) -> Landed {
    if req.force {
        return want;
    }
    let src = SourceRef {
        bucket: bucket.to_owned(),
        key: key(&req.user_id, MediaType::Video, &req.media_id, RECORD),
    };
    let Ok(bytes) = storage.read(&src, MAX_RECORD_BYTES).await else {
        return want;
    };
    match serde_json::from_slice::<Landed>(&bytes) {
        Ok(found) if found.is_for(&want) => found,
        Ok(_) => want, // another source version or profile: start over
        Err(e) => {
            tracing::warn!(key = %src.key, error = %e, "unreadable rendition record ignored");
            want
        }
    }
}

/// The upload stage: with a record ([`find`]) and a video, its renditions one at a time, each
/// recorded as it lands, then the other files; otherwise every file at once ([`upload::run`]).
pub async fn upload_all(
    to: &Destination<'_>,
    files: &[ProducedFile],
    landed: Option<Landed>,
    scratch: &Path,
) -> Result<Vec<Output>, StorageError> {
    match landed {
        Some(landed) if to.media_type == MediaType::Video => {
            let (renditions, rest): (Vec<_>, Vec<_>) =
                files.iter().partition(|f| f.role == Role::Rendition);
            let mut outputs = upload(to, &renditions, landed, scratch).await?;
            outputs.extend(upload::run(to, rest).await?);
            Ok(outputs)
        }
        _ => upload::run(to, files).await,
    }
}

/// Uploads `renditions` one at a time, recording each in `landed` (and in storage) as it lands;
/// every landed rendition, tallest first, as the response lists them.
async fn upload(
    to: &Destination<'_>,
    renditions: &[&ProducedFile],
    mut landed: Landed,
    scratch: &Path,
) -> Result<Vec<Output>, StorageError> {
    let resumed = landed.renditions.len() as u64;
    for f in renditions {
        let out = upload::one(to, f).await?;
        landed.renditions.retain(|o| o.key != out.key);
        landed.renditions.push(out);
        record(to, &landed, scratch).await?;
    }
    let m = to.metrics;
    m.renditions.with_label_values(&["resumed"]).inc_by(resumed);
    let encoded = renditions.len() as u64;
    m.renditions.with_label_values(&["encoded"]).inc_by(encoded);
    let mut all = landed.renditions;
    all.sort_by_key(|o| std::cmp::Reverse(rung_height(o)));
    Ok(all)
}

async fn record(to: &Destination<'_>, landed: &Landed, scratch: &Path) -> Result<(), StorageError> {
    let path = scratch.join(RECORD);
    let json = serde_json::to_vec_pretty(landed).expect("record serialises");
    crate::scratch::write_record(&path, &json).await?;
    let key = key(&to.req.user_id, MediaType::Video, &to.req.media_id, RECORD);
    let meta = ObjectMeta {
        content_type: "application/json",
        cache_control: manifest::NO_CACHE,
    };
    to.storage.upload(to.bucket, &key, &path, &meta).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output(w: u32, h: u32) -> Output {
        Output {
            role: "rendition".into(),
            bucket: "b".into(),
            key: format!("u/videos/m/mp4/{}p.mp4", w.min(h)),
            format: "mp4".into(),
            content_type: "video/mp4".into(),
            width: w,
            height: h,
            size_bytes: 1,
            crop: None,
            duration_ms: Some(1000),
            frames: None,
        }
    }

    #[test]
    fn a_record_is_for_one_source_version_and_profile() {
        let want = Landed::new("e1".into(), "default", "f1".into());
        let mut found = want.clone();
        found.renditions = vec![output(1280, 720), output(480, 854)];
        assert!(found.is_for(&want));
        assert_eq!(
            found.heights(),
            [720, 480],
            "the shorter side, portrait too"
        );
        for other in [
            Landed::new("e2".into(), "default", "f1".into()),
            Landed::new("e1".into(), "variants", "f1".into()),
            Landed::new("e1".into(), "default", "f2".into()),
        ] {
            assert!(!found.is_for(&other), "{other:?}");
        }
    }
}
