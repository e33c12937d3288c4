//! A long video playable before it is done (a profile's `early_playback`, units through the
//! fleet): its lowest rung is published as a growing HLS playlist (`EXT-X-PLAYLIST-TYPE:EVENT`)
//! as its units land in order, under the keys the finished video has, and closed as VOD when
//! the stitch writes every output.
//!
//! - The plan's worker also uploads the audio (encoded whole) under its own keys.
//! - A unit's worker also uploads its lowest rung's init and segments under theirs before its
//!   record, so every segment a playlist names exists before the playlist does.
//! - After its record, the lander extends the playlist over the units landed in order from
//!   the first: it reads `early.json` beside the plan (the units it covers, the rung's track so
//!   far), adds the units landed after them, writes the playlist, then `early.json`. With the
//!   first unit it also writes the master playlist (that rung and the audio) and the audio's
//!   playlist: the stream is playable from then, and the unit's progress event names the
//!   master.
//! - Two landers at the same moment may write the playlist in either order: it can stay a unit
//!   short until the next lander (or the stitch) writes it again; it never names a segment
//!   that is not there. The stitch's VOD playlists and full master replace all of it, entry
//!   points last as for any video.

use std::path::Path;

use super::runner::JobRunner;
use crate::contract::{MediaType, OptimizeRequest};
use crate::media::output::Track;
use crate::media::output::{FileFormat, ProducedFile, names};
use crate::media::video::units::early_stream;
use crate::stages::upload::{self, Destination};
use crate::storage::StorageError;
use crate::units::PlanRef;
use crate::units::store::{self, PlanRecord, UnitRecord};

/// What the growing playlist covers so far.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Published {
    /// Units `0..units` are in it.
    units: u32,
    /// The lowest rung over them.
    track: Track,
}

impl JobRunner {
    /// Whether `req`'s profile publishes its long videos before they are done.
    pub(super) fn early(&self, req: &OptimizeRequest) -> bool {
        let settings = &self.services().settings;
        settings.profiles[crate::stages::manifest::profile_of(req)].early_playback
    }

    /// Uploads `files` under the request's own keys (the finished video's).
    pub(super) async fn publish_files<'f>(
        &self,
        req: &OptimizeRequest,
        files: impl IntoIterator<Item = &'f ProducedFile>,
    ) -> Result<(), StorageError> {
        let svc = self.services();
        let to = Destination {
            storage: &*svc.storage,
            metrics: &svc.metrics,
            bucket: &svc.settings.storage.output_bucket,
            req,
            media_type: MediaType::Video,
            cache_control: &svc.settings.profiles[crate::stages::manifest::profile_of(req)]
                .cache_control,
        };
        upload::run(&to, files).await.map(|_| ())
    }

    /// A unit's lowest rung (its init and segments), uploaded under the video's keys.
    pub(super) async fn publish_lowest(
        &self,
        req: &OptimizeRequest,
        tracks: &[Track],
        files: &[ProducedFile],
    ) -> Result<(), StorageError> {
        let Some(lowest) = tracks.iter().map(|t| t.id).min() else {
            return Ok(());
        };
        let of_it = files
            .iter()
            .filter(|f| matches!(f.format, FileFormat::Cmaf(id, _) if id == lowest));
        self.publish_files(req, of_it).await
    }

    /// [`Self::extend_playlist`] in a scratch folder of its own, a failure logged: the
    /// playlist stays as it was until the next unit lands (the stitch writes it whole).
    pub(super) async fn extended(&self, plan: &PlanRef, record: &PlanRecord) -> Option<String> {
        let tmp = &self.services().settings.worker.tmp_dir;
        let extended = match tempfile::tempdir_in(tmp) {
            Ok(dir) => self.extend_playlist(plan, record, dir.path()).await,
            Err(e) => Err(e.into()),
        };
        extended.unwrap_or_else(|e| {
            tracing::warn!(plan = plan.id(), error = %e, "the early playlist was not extended");
            None
        })
    }

    /// A video answered with a failure: what was published early is deleted (the entry points
    /// first), so that no stream of it stays playable, never closed.
    pub(super) async fn withdraw(
        &self,
        plan: &PlanRef,
        record: &PlanRecord,
    ) -> Result<(), StorageError> {
        let storage = &*self.services().storage;
        let Some(published) = store::read::<Published>(storage, plan, plan.early_key()).await?
        else {
            return Ok(());
        };
        let id = published.track.id;
        let mut names = vec![
            names::HLS_MASTER.to_owned(),
            names::in_stream(&names::media_playlist(id)),
            names::in_stream(&names::init_segment(id)),
        ];
        names.extend(
            (0..published.track.segments.len() as u32)
                .map(|n| names::in_stream(&names::segment(id, n))),
        );
        if let Some(a) = &record.audio {
            names.push(names::in_stream(&names::media_playlist(a.id)));
        }
        names.extend(record.pieces.iter().cloned());
        let req = &record.request;
        for name in names {
            let key = upload::key(&req.user_id, MediaType::Video, &req.media_id, &name);
            storage.delete(&plan.bucket, &key).await?;
        }
        storage.delete(&plan.bucket, &plan.early_key()).await?;
        tracing::info!(plan = plan.id(), "the early stream withdrawn");
        Ok(())
    }

    /// The playlist extended over the units landed in order; the master's key when this call
    /// made the stream playable.
    pub(super) async fn extend_playlist(
        &self,
        plan: &PlanRef,
        record: &PlanRecord,
        scratch: &Path,
    ) -> Result<Option<String>, StorageError> {
        let storage = &*self.services().storage;
        let early_key = plan.early_key();
        let mut published = store::read::<Published>(storage, plan, early_key.clone()).await?;
        let from = published.as_ref().map_or(0, |p| p.units);
        let landed = store::recorded(storage, plan).await?;
        let mut added = 0;
        for i in from..record.units.len() as u32 {
            if !landed.contains(&i) {
                break;
            }
            let Some(UnitRecord::Landed { tracks, .. }) =
                store::read::<UnitRecord>(storage, plan, plan.unit_key(i)).await?
            else {
                break;
            };
            let Some(lowest) = tracks.into_iter().min_by_key(|t| t.id) else {
                break;
            };
            match published.as_mut() {
                Some(p) => p.track.segments.extend(lowest.segments),
                None => {
                    published = Some(Published {
                        units: 0,
                        track: lowest,
                    })
                }
            }
            added += 1;
        }
        let Some(mut published) = published.filter(|_| added > 0) else {
            return Ok(None);
        };
        published.units = from + added;
        let job = self
            .services()
            .settings
            .media_job(crate::stages::manifest::profile_of(&record.request), None);
        let first = from == 0;
        let dir = scratch.join("early");
        tokio::fs::create_dir_all(&dir).await?;
        let files: Vec<ProducedFile> =
            early_stream(&job, &published.track, record.audio.as_ref(), first, &dir)
                .map_err(|e| StorageError::Scratch(format!("the early playlist: {e}")))?;
        // The media playlists first, the master (with the first unit) last.
        self.publish_files(&record.request, &files).await?;
        store::write(storage, plan, early_key, &published, scratch).await?;
        tracing::info!(
            plan = plan.id(),
            units = published.units,
            "early playlist extended"
        );
        let master = upload::key(
            &record.request.user_id,
            MediaType::Video,
            &record.request.media_id,
            names::HLS_MASTER,
        );
        Ok(first.then_some(master))
    }
}
