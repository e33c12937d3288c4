//! Where a plan and its units live, beside the video's outputs in the output bucket:
//!
//! ```text
//! {user_id}/videos/{media_id}/units/{plan_id}/plan.json                the plan
//!                                            /pieces/...                what the audio and units made
//!                                            /records/audio.json        the audio's (after its pieces)
//!                                            /records/opening.json      the audio's opening's (early stream)
//!                                            /records/unit-00003.json   unit 3's (after its pieces)
//!                                            /records/failed            a part failed for good
//!                                            /records/answered          who answers, and whether it has
//! ```
//!
//! `plan_id` is derived from the source object and version (its ETag), the profile's
//! fingerprint (every setting that shapes the outputs and the worker's version, see
//! `manifest::fingerprint`): a redelivered request finds the same plan and its landed units;
//! a replaced source gets a plan of its own, so no stream mixes two versions.

use std::path::Path;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::contract::{
    ErrorCode, Loudness, MediaType, OptimizeRequest, SourceRef, Stage, VideoAnalysis, Warning,
};
use crate::media::part::{Opening, Unit};
use crate::media::track::Track;
use crate::stages::upload;
use crate::storage::{Created, ObjectMeta, Storage, StorageError};

/// Larger records are not ours.
const MAX_RECORD_BYTES: u64 = 16 << 20;
const JSON: ObjectMeta = ObjectMeta {
    content_type: "application/json",
    cache_control: "no-cache",
};

/// A plan's place in the output bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanRef {
    pub bucket: String,
    /// `{user_id}/videos/{media_id}/units/{plan_id}/`
    pub prefix: String,
}

impl PlanRef {
    pub fn new(bucket: &str, req: &OptimizeRequest, etag: &str, fingerprint: &str) -> PlanRef {
        let id = crate::stages::manifest::fnv1a(&format!(
            "{}|{}|{etag}|{fingerprint}",
            req.source.bucket, req.source.key
        ));
        let units = upload::key(&req.user_id, MediaType::Video, &req.media_id, "units");
        PlanRef {
            bucket: bucket.to_owned(),
            prefix: format!("{units}/{id}/"),
        }
    }

    pub fn id(&self) -> &str {
        self.prefix
            .trim_end_matches('/')
            .rsplit('/')
            .next()
            .unwrap_or_default()
    }

    /// Where the plan's units start among the unit topic's partitions (`Task::place`, taken
    /// modulo their count): its id's upper half (the id is a hash in hex, and FNV-1a's upper
    /// bits are the mixed ones), 0 for an id that is not one.
    pub fn first(&self) -> u64 {
        u64::from_str_radix(self.id(), 16).map_or(0, |h| h >> 32)
    }

    fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    pub fn plan_key(&self) -> String {
        self.key("plan.json")
    }

    pub fn unit_key(&self, index: u32) -> String {
        self.key(&format!("records/unit-{index:05}.json"))
    }

    pub fn audio_key(&self) -> String {
        self.key("records/audio.json")
    }

    /// The audio's opening (`media::part::Opening`): its track, whose files are in the early
    /// stream only.
    pub fn opening_key(&self) -> String {
        self.key("records/opening.json")
    }

    pub fn failed_key(&self) -> String {
        self.key("records/failed")
    }

    /// Where the records are (listed to find the landed units).
    pub fn records(&self) -> String {
        self.key("records/")
    }

    /// Where a piece (named as the media code names it, `hls/720p/seg-00003.m4s`) is kept.
    pub fn piece_key(&self, name: &str) -> String {
        self.key(&format!("pieces/{name}"))
    }

    /// A file of the video's early stream (`job::early`), named as the media code names it
    /// (`hls/master.m3u8`).
    pub fn early_key(&self, name: &str) -> String {
        self.key(&format!("early/{name}"))
    }

    /// What the early stream's growing playlist covers.
    pub fn early_state_key(&self) -> String {
        self.key("early.json")
    }

    pub fn answered_key(&self) -> String {
        self.key("records/answered")
    }

    fn source(&self, key: String) -> SourceRef {
        SourceRef {
            bucket: self.bucket.clone(),
            key,
        }
    }
}

/// The plan, as the worker that took the request made it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanRecord {
    pub request: OptimizeRequest,
    /// The source version the plan is for: a unit that finds another fails (`source_changed`).
    pub source_etag: String,
    pub source_size: u64,
    pub units: Vec<Unit>,
    /// The source's bytes the audio reads (`[start, end)`, see `media::video::reads`); empty:
    /// the whole file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub audio_reads: Vec<[u64; 2]>,
    /// The audio's opening, made for the early stream (none without audio, for a short
    /// program, or a profile without early playback).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opening: Option<Opening>,
    /// The source's analysis (no poster, no loudness yet: the audio's record has it).
    pub analysis: VideoAnalysis,
    pub fingerprint: String,
}

/// The audio's opening, landed (its files in the early stream, not among the pieces).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpeningRecord {
    pub track: Track,
}

/// The whole video's audio, made by a task of its own beside the units.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AudioRecord {
    /// None: the video has no audio.
    pub track: Option<Track>,
    /// Its pieces, stored beside the plan.
    pub pieces: Vec<String>,
    /// The loudness over the whole program, when the profile measures it.
    pub loudness: Option<Box<Loudness>>,
    pub warnings: Vec<Warning>,
}

/// Who answers a plan (`records/answered`): written where nothing is (`Storage::create`) by
/// the task that is to publish the response, before it publishes; rewritten `published` once
/// it has (see `crate::units`, "Stitch").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answered {
    /// The task's record on the unit topic, in its group ([`Answered::by`]).
    pub by: String,
    /// The worker that claimed it (read by people and tests).
    pub worker: String,
    pub published: bool,
}

impl Answered {
    /// A task's name as a claimant: `{group}/{topic}/{partition}@{offset}`. The same record
    /// delivered again in its group (its consumer gone) has the same name; its copy in another
    /// group, or another stitch task of the plan, has another.
    pub fn by(group: &str, topic: &str, partition: i32, offset: i64) -> String {
        format!("{group}/{topic}/{partition}@{offset}")
    }

    /// The mark an earlier release wrote after it published (`true`), or anything else that
    /// is not a claim: answered.
    fn earlier() -> Answered {
        Answered {
            by: String::new(),
            worker: String::new(),
            published: true,
        }
    }

    /// Whether the task named `by` claimed the answer and has not published it: its record is
    /// delivered again, so the task that claimed it is gone, and the answer is this one's.
    pub fn unpublished_by(&self, by: &str) -> bool {
        !self.published && self.by == by
    }
}

/// What claiming a plan's answer found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// This task publishes the answer: claimed now, or by this same record before.
    Mine,
    /// Another task claimed it (it publishes, or its record comes again until one has), or
    /// it is published.
    Taken,
}

/// Claims the answer of the plan `at` for the task named `by` (see [`Answered`]).
pub async fn claim_answer(
    storage: &dyn Storage,
    at: &PlanRef,
    by: &str,
    worker: &str,
) -> Result<Claim, StorageError> {
    let claim = Answered {
        by: by.to_owned(),
        worker: worker.to_owned(),
        published: false,
    };
    let json = serde_json::to_vec(&claim).expect("records serialise");
    match storage
        .create(&at.bucket, &at.answered_key(), &json, &JSON)
        .await?
    {
        Created::New => Ok(Claim::Mine),
        Created::Exists => match answered(storage, at).await? {
            Some(a) if a.unpublished_by(by) => Ok(Claim::Mine),
            _ => Ok(Claim::Taken),
        },
    }
}

/// The plan's claim, if anyone made one (a mark an earlier release wrote counts as published).
pub async fn answered(
    storage: &dyn Storage,
    at: &PlanRef,
) -> Result<Option<Answered>, StorageError> {
    match storage
        .read(&at.source(at.answered_key()), MAX_RECORD_BYTES)
        .await
    {
        Ok(bytes) => Ok(Some(
            serde_json::from_slice(&bytes).unwrap_or_else(|_| Answered::earlier()),
        )),
        Err(StorageError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// What became of one unit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnitRecord {
    /// Its pieces are stored: each rung's segments (numbered from the unit's first) and the
    /// storyboard tiles and poster candidates in its range.
    Landed {
        tracks: Vec<Track>,
        pieces: Vec<String>,
        /// The worker that encoded it (the fleet tests read it).
        worker: String,
    },
    /// It (or the audio: no index) failed for good: the request is answered with this, and no
    /// other unit is encoded.
    Failed {
        index: Option<u32>,
        code: ErrorCode,
        stage: Stage,
        message: String,
        /// Where in the video the unit starts, in seconds.
        at_secs: f64,
    },
}

pub async fn read<T: DeserializeOwned>(
    storage: &dyn Storage,
    at: &PlanRef,
    key: String,
) -> Result<Option<T>, StorageError> {
    match storage.read(&at.source(key), MAX_RECORD_BYTES).await {
        Ok(bytes) => Ok(serde_json::from_slice(&bytes).ok()),
        Err(StorageError::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Writes a record through a file in `scratch` (uploads take files).
pub async fn write<T: Serialize>(
    storage: &dyn Storage,
    at: &PlanRef,
    key: String,
    record: &T,
    scratch: &Path,
) -> Result<(), StorageError> {
    let path = scratch.join(format!("record-{}", crate::stages::manifest::fnv1a(&key)));
    let json = serde_json::to_vec(record).expect("records serialise");
    crate::scratch::write_record(&path, &json).await?;
    let r = storage.upload(&at.bucket, &key, &path, &JSON).await;
    let _ = tokio::fs::remove_file(&path).await;
    r
}

/// The keys of a plan's records (units, `failed`, `answered`).
pub async fn records(storage: &dyn Storage, at: &PlanRef) -> Result<Vec<String>, StorageError> {
    storage.list(&at.bucket, &at.records()).await
}

/// The indexes of the units with a record among a plan's record `keys`.
pub fn units_in(at: &PlanRef, keys: &[String]) -> Vec<u32> {
    let prefix = at.records();
    let mut indexes: Vec<u32> = keys
        .iter()
        .filter_map(|k| k.strip_prefix(&prefix)?.strip_prefix("unit-"))
        .filter_map(|n| n.strip_suffix(".json")?.parse().ok())
        .collect();
    indexes.sort_unstable();
    indexes.dedup();
    indexes
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The claim's rule on a store whose `create` is atomic (local files): the first task
    /// claims; another finds it taken; the claimant's record delivered again (the same name)
    /// finds it its own until it is published; an earlier release's mark (`true`) is taken.
    #[tokio::test]
    async fn the_answer_is_the_first_claimants_and_its_records_next_delivery_s() {
        let dir = tempfile::tempdir().unwrap();
        let storage = crate::storage::LocalStorage::new(dir.path());
        let at = PlanRef {
            bucket: "media".into(),
            prefix: "u/videos/m/units/0123456789abcdef/".into(),
        };
        let a = Answered::by("g.units", "units", 3, 17);
        let b = Answered::by("g.units", "units", 3, 18);
        let in_another_group = Answered::by("g", "units", 3, 17);
        let claim = |by: String| {
            let (storage, at) = (&storage, &at);
            async move { claim_answer(storage, at, &by, "w").await }
        };
        assert_eq!(claim(a.clone()).await.unwrap(), Claim::Mine);
        assert_eq!(claim(b.clone()).await.unwrap(), Claim::Taken);
        assert_eq!(claim(in_another_group.clone()).await.unwrap(), Claim::Taken);
        assert_eq!(
            claim(a.clone()).await.unwrap(),
            Claim::Mine,
            "delivered again"
        );
        let published = Answered {
            by: a.clone(),
            worker: "w".into(),
            published: true,
        };
        let scratch = dir.path().join("scratch");
        std::fs::create_dir_all(&scratch).unwrap();
        write(&storage, &at, at.answered_key(), &published, &scratch)
            .await
            .unwrap();
        assert_eq!(claim(a.clone()).await.unwrap(), Claim::Taken, "published");
        write(&storage, &at, at.answered_key(), &true, &scratch)
            .await
            .unwrap();
        assert_eq!(
            answered(&storage, &at).await.unwrap(),
            Some(Answered::earlier())
        );
        assert_eq!(
            claim(a.clone()).await.unwrap(),
            Claim::Taken,
            "an earlier release's mark"
        );
    }

    #[test]
    fn a_plan_is_named_by_source_version_and_profile() {
        let req = OptimizeRequest::new("r".into(), "m".into(), "u", "uploads", "a.mp4".into());
        let a = PlanRef::new("media", &req, "\"e1\"", "f");
        assert_eq!(a, PlanRef::new("media", &req, "\"e1\"", "f"));
        assert!(a.prefix.starts_with("u/videos/m/units/") && a.prefix.ends_with('/'));
        assert_eq!(a.id().len(), 16);
        assert_ne!(a, PlanRef::new("media", &req, "\"e2\"", "f"));
        assert_ne!(a, PlanRef::new("media", &req, "\"e1\"", "g"));
        assert_eq!(
            a.unit_key(3),
            format!("{}records/unit-00003.json", a.prefix)
        );
    }
}
