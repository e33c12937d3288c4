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
use crate::media::output::{Track, TrackId};
use crate::media::sniff::{self, Sniffed};
use crate::media::{FileFormat, ProducedFile, Role};
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
    /// The progressive MP4s, as the response lists them.
    pub renditions: Vec<Output>,
    /// A streaming profile's rungs whose segments and media playlist landed, as the entry
    /// points list them.
    #[serde(default)]
    pub tracks: Vec<Track>,
}

impl Landed {
    /// An empty record for this source version and profile.
    pub fn new(source_etag: String, profile: &str, fingerprint: String) -> Landed {
        Landed {
            source_etag,
            profile: profile.to_owned(),
            fingerprint,
            renditions: Vec::new(),
            tracks: Vec::new(),
        }
    }

    /// The rung heights (shorter displayed sides) already there, for the media job.
    pub fn heights(&self) -> Vec<u32> {
        let mut h: Vec<u32> = self.renditions.iter().map(rung_height).collect();
        h.extend(self.tracks.iter().filter_map(|t| match t.id {
            TrackId::Video(h) => Some(h),
            TrackId::Audio => None,
        }));
        h.sort_by_key(|h| std::cmp::Reverse(*h));
        h.dedup();
        h
    }

    /// Whether nothing landed.
    pub fn is_empty(&self) -> bool {
        self.renditions.is_empty() && self.tracks.is_empty()
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

/// The upload stage. A stream's entry points go last, after every piece they lead to. Before
/// them: with a record ([`find`]) and a video, the rungs one at a time (each its MP4 and its
/// stream's pieces), each recorded as it lands, then the other files; otherwise every file at
/// once ([`upload::run`]), a track's media playlist after its segments. Returns the outputs a
/// response lists (not a stream's pieces).
pub async fn upload_all(
    to: &Destination<'_>,
    files: &[ProducedFile],
    tracks: &[Track],
    landed: Option<Landed>,
    scratch: &Path,
) -> Result<Vec<Output>, StorageError> {
    let (entries, rest): (Vec<_>, Vec<_>) = files.iter().partition(|f| f.role == Role::Stream);
    let mut outputs = match landed {
        Some(landed) if to.media_type == MediaType::Video => {
            let (rungs, others): (Vec<_>, Vec<_>) =
                rest.into_iter().partition(|f| rung_of(f).is_some());
            let mut outputs = upload(to, &rungs, tracks, landed, scratch).await?;
            outputs.extend(pieces_first(to, &others).await?);
            outputs
        }
        _ => pieces_first(to, &rest).await?,
    };
    outputs.extend(upload::run(to, entries).await?);
    outputs.retain(|o| o.role != Role::Segment.as_str());
    Ok(outputs)
}

/// The rung a file belongs to: a rendition, or a piece of a rung's stream.
fn rung_of(f: &ProducedFile) -> Option<u32> {
    match (f.role, f.format) {
        (Role::Rendition, _) => Some(f.width.min(f.height)),
        (Role::Segment, FileFormat::Cmaf(TrackId::Video(h), _))
        | (Role::Segment, FileFormat::Hls(Some(TrackId::Video(h)))) => Some(h),
        _ => None,
    }
}

/// Uploads `files`, media playlists after everything else (their segments).
async fn pieces_first(
    to: &Destination<'_>,
    files: &[&ProducedFile],
) -> Result<Vec<Output>, StorageError> {
    let playlist = |f: &&&ProducedFile| matches!(f.format, FileFormat::Hls(Some(_)));
    let mut outputs = upload::run(to, files.iter().filter(|f| !playlist(f)).copied()).await?;
    outputs.extend(upload::run(to, files.iter().filter(playlist).copied()).await?);
    Ok(outputs)
}

/// Uploads `files` rung by rung, tallest first, recording each rung in `landed` (and in
/// storage) once all its files landed; every landed rendition, tallest first, as the response
/// lists them.
async fn upload(
    to: &Destination<'_>,
    files: &[&ProducedFile],
    tracks: &[Track],
    mut landed: Landed,
    scratch: &Path,
) -> Result<Vec<Output>, StorageError> {
    let resumed = landed.heights().len() as u64;
    let mut heights: Vec<u32> = files.iter().filter_map(|f| rung_of(f)).collect();
    heights.sort_by_key(|h| std::cmp::Reverse(*h));
    heights.dedup();
    for &h in &heights {
        let group: Vec<_> = files
            .iter()
            .filter(|f| rung_of(f) == Some(h))
            .copied()
            .collect();
        for out in pieces_first(to, &group).await? {
            if out.role == Role::Rendition.as_str() {
                landed.renditions.retain(|o| o.key != out.key);
                landed.renditions.push(out);
            }
        }
        if let Some(t) = tracks.iter().find(|t| t.id == TrackId::Video(h)) {
            landed.tracks.retain(|o| o.id != t.id);
            landed.tracks.push(t.clone());
        }
        record(to, &landed, scratch).await?;
    }
    let m = to.metrics;
    m.renditions.with_label_values(&["resumed"]).inc_by(resumed);
    let encoded = heights.len() as u64;
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
            quality: None,
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
