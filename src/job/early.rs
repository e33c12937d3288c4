//! A long video playable before it is done (a profile's `early_playback`, units through the
//! fleet): its lowest rung is published as a growing HLS playlist (`EXT-X-PLAYLIST-TYPE:EVENT`)
//! as its units land in order, and closed (`EXT-X-ENDLIST`) when the video is answered.
//!
//! The early stream lives beside the plan, under `{user}/videos/{media}/units/{plan_id}/early/`
//! (`hls/master.m3u8` and the files it names), never under the finished video's keys: those may
//! hold an earlier version's outputs until the stitch replaces them, and a video that fails must
//! leave them as they were.
//!
//! - The audio's worker uploads the audio (encoded whole, a task beside the units) there,
//!   before the audio's record. Before it, the audio's opening (its first seconds, a task of
//!   its own: `media::part::Opening`) is uploaded there under the same names, then its record:
//!   the stream plays on it until the whole program's audio lands, whose files replace its
//!   own (the same segments, cut at the same times; an opening that finds the whole audio's
//!   record uploads nothing). The two may upload at once: each writes its record, then looks
//!   for the other's, so at least one of them sees both and puts the whole audio's files back
//!   over the opening's range (the audio's worker from its files, the opening's from the
//!   audio's pieces): the whole program's files are the last written.
//! - A unit's worker uploads its lowest rung's init and segments there before its record, so
//!   every segment a playlist names exists before the playlist does.
//! - After its record, the lander extends the playlist over the units landed in order from the
//!   first: it reads `early.json` beside the plan (the units it covers, the rung's track so
//!   far), adds the units landed after them, writes the playlist, then `early.json`. Once the
//!   first unit and the audio (or its opening) have both landed, whichever lands last also
//!   writes the audio's playlist and, last, the master (that rung and the audio): the stream
//!   is playable from then, and that part's progress event names the master. The audio's
//!   playlist is an EVENT playlist too: the opening's, without an end; written again over the
//!   whole program's, with its end, once that lands. A lander that wrote the opening's looks
//!   for the whole audio's record after its own `early.json` and, finding it, writes the whole
//!   program's playlist again: a lander that read the records before the audio's landed
//!   cannot leave its opening's playlist over the whole one's (the audio's lander, which wrote
//!   its record before reading the others', writes the whole one after it otherwise).
//!   Playlists are written `no-cache` (a CDN must not keep a growing one).
//! - Once every unit has landed nobody extends it (the stitch is on its way); when the video is
//!   answered, completed, the playlist is written once more over every unit with its end (the
//!   same EVENT playlist, appended to, as RFC 8216 requires of an EVENT playlist); answered with
//!   a failure, its playlists are deleted (its segments are kept with the pieces, for the
//!   request sent again).
//! - Two landers at the same moment may write the playlist in either order: each reads
//!   `early.json` again just before writing and gives way to one that covers more, which leaves
//!   a window of a few milliseconds in which the playlist can lose its last unit until the next
//!   write (the store has no conditional write to close it).

use std::path::Path;

use super::runner::JobRunner;
use crate::contract::{OptimizeRequest, SourceRef};
use crate::media::MediaOutput;
use crate::media::output::{FileFormat, ProducedFile, Track, names};
use crate::media::video::units::{EarlyAudio, early_stream};
use crate::stages::manifest::profile_of;
use crate::storage::{ObjectMeta, StorageError};
use crate::units::PlanRef;
use crate::units::store::{self, AudioRecord, OpeningRecord, PlanRecord, UnitRecord};

/// What the growing playlist covers so far.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Published {
    /// Units `0..units` are in it.
    units: u32,
    /// The lowest rung over them.
    track: Track,
    /// The master (and the audio's playlist) is written: the stream is playable.
    #[serde(default)]
    master: bool,
    /// The audio's playlist is the whole program's (not its opening's).
    #[serde(default)]
    audio_whole: bool,
}

/// The audio the early stream can name: the whole program's, or its opening's.
struct Heard {
    /// None: the video has no audio.
    track: Option<Track>,
    whole: bool,
}

impl JobRunner {
    /// Whether `req`'s profile publishes its long videos before they are done.
    pub(super) fn early(&self, req: &OptimizeRequest) -> bool {
        self.services().settings.profiles[profile_of(req)].early_playback
    }

    /// Uploads `files` into the plan's early stream (in order, one at a time: a playlist after
    /// what it names).
    pub(super) async fn publish_early(
        &self,
        plan: &PlanRef,
        req: &OptimizeRequest,
        files: Vec<&ProducedFile>,
    ) -> Result<(), StorageError> {
        let svc = self.services();
        let segments = &svc.settings.profiles[profile_of(req)].cache_control;
        for f in files {
            let cache_control = match f.format {
                FileFormat::Hls(_) => "no-cache",
                _ => segments,
            };
            let meta = ObjectMeta {
                content_type: f.format.content_type(),
                cache_control,
            };
            let key = plan.early_key(&f.name);
            svc.storage
                .upload(&plan.bucket, &key, &f.path, &meta)
                .await?;
            svc.metrics.bytes_uploaded.inc_by(f.size_bytes);
        }
        Ok(())
    }

    /// A unit's lowest rung (its init and segments), uploaded into the early stream.
    pub(super) async fn publish_lowest(
        &self,
        plan: &PlanRef,
        req: &OptimizeRequest,
        tracks: &[Track],
        files: &[ProducedFile],
    ) -> Result<(), StorageError> {
        let Some(lowest) = tracks.iter().map(|t| t.id).min() else {
            return Ok(());
        };
        let of_it = files
            .iter()
            .filter(|f| matches!(f.format, FileFormat::Cmaf(id, _) if id == lowest))
            .collect();
        self.publish_early(plan, req, of_it).await
    }

    /// [`Self::extend_playlist`], a failure logged: the playlist stays as it was until the
    /// next unit lands (or the video is answered).
    pub(super) async fn extended(&self, plan: &PlanRef, record: &PlanRecord) -> Option<String> {
        self.extend_playlist(plan, record, false)
            .await
            .unwrap_or_else(|e| {
                tracing::warn!(plan = plan.id(), error = %e, "the early playlist was not extended");
                None
            })
    }

    /// The playlist extended over the units landed in order (`done`: over every unit, with its
    /// end); the master's key when this call made the stream playable.
    async fn extend_playlist(
        &self,
        plan: &PlanRef,
        record: &PlanRecord,
        done: bool,
    ) -> Result<Option<String>, StorageError> {
        let storage = &*self.services().storage;
        let state = plan.early_state_key();
        let mut published = store::read::<Published>(storage, plan, state.clone()).await?;
        let from = published.as_ref().map_or(0, |p| p.units);
        let keys = store::records(storage, plan).await?;
        let landed = store::units_in(plan, &keys);
        // The master names the audio's playlist too: written once both the first unit and the
        // audio (or its opening) have landed, by whichever lands last. The audio's playlist is
        // the opening's until the whole program's lands, and is written again then.
        let audio = match keys.contains(&plan.audio_key()) {
            true => store::read::<AudioRecord>(storage, plan, plan.audio_key())
                .await?
                .map(|a| Heard {
                    track: a.track,
                    whole: true,
                }),
            false => None,
        };
        let audio = match (audio, keys.contains(&plan.opening_key())) {
            (None, true) => store::read::<OpeningRecord>(storage, plan, plan.opening_key())
                .await?
                .map(|o| Heard {
                    track: Some(o.track),
                    whole: false,
                }),
            (audio, _) => audio,
        };
        let master_written = published.as_ref().is_some_and(|p| p.master);
        // The stream plays on the opening, and the whole program's audio is here.
        let whole_now = master_written
            && !published.as_ref().is_some_and(|p| p.audio_whole)
            && audio.as_ref().is_some_and(|a| a.whole && a.track.is_some());
        // Every part landed: the stitch is on its way, and closes it (the master and the
        // whole audio still written when the audio came last: the stream plays meanwhile).
        if !done
            && landed.len() >= record.units.len()
            && (audio.is_none() || (master_written && !whole_now))
        {
            return Ok(None);
        }
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
                        master: false,
                        audio_whole: false,
                    })
                }
            }
            added += 1;
        }
        let mut master = audio.is_some() && published.as_ref().is_some_and(|p| !p.master);
        let Some(mut published) = published.filter(|_| added > 0 || done || master || whole_now)
        else {
            return Ok(None);
        };
        published.units = from + added;
        // Another lander wrote meanwhile: the playlist never shrinks and the master is written
        // (and announced) once. What it covers as far as this one's goes, only a master or a
        // whole audio it lacks is left to add, over what it wrote.
        if !done && let Some(newer) = store::read::<Published>(storage, plan, state.clone()).await?
        {
            master &= !newer.master;
            let (written, whole_written) = (newer.master, newer.audio_whole);
            if newer.units >= published.units {
                // Nothing left to add: no master, and the whole audio written or not here.
                let whole_left = whole_now && !whole_written;
                if !master && !whole_left {
                    return Ok(None);
                }
                published = newer;
            }
            published.master |= written;
            published.audio_whole |= whole_written;
        }
        published.master |= master;
        let job = self
            .services()
            .settings
            .media_job(profile_of(&record.request), None);
        let tmp = tempfile::tempdir_in(&self.services().settings.worker.tmp_dir)?;
        // The audio's playlist with the master, and again over the whole program's audio.
        let heard = audio
            .as_ref()
            .filter(|_| master || whole_now)
            .and_then(|a| {
                Some(EarlyAudio {
                    track: a.track.as_ref()?,
                    whole: a.whole,
                })
            });
        published.audio_whole |= heard.as_ref().is_some_and(|a| a.whole);
        let opening = heard.as_ref().is_some_and(|a| !a.whole);
        let files = early_stream(&job, &published.track, heard, master, done, tmp.path())
            .map_err(|e| StorageError::Scratch(format!("the early playlist: {e}")))?;
        self.publish_early(plan, &record.request, files.iter().collect())
            .await?;
        store::write(storage, plan, state.clone(), &published, tmp.path()).await?;
        // The whole audio landed since the records were read: its lander may have written its
        // playlist before this one's (the module doc).
        if opening
            && let Some(AudioRecord {
                track: Some(track), ..
            }) = store::read::<AudioRecord>(storage, plan, plan.audio_key()).await?
        {
            let whole = EarlyAudio {
                track: &track,
                whole: true,
            };
            let files = early_stream(&job, &published.track, Some(whole), false, done, tmp.path())
                .map_err(|e| StorageError::Scratch(format!("the early playlist: {e}")))?;
            let of_audio = files
                .iter()
                .filter(|f| f.format == FileFormat::Hls(Some(track.id)))
                .collect();
            self.publish_early(plan, &record.request, of_audio).await?;
            let mut newest = store::read::<Published>(storage, plan, state.clone())
                .await?
                .unwrap_or_else(|| published.clone());
            newest.audio_whole = true;
            store::write(storage, plan, state, &newest, tmp.path()).await?;
            tracing::info!(
                plan = plan.id(),
                "the whole audio landed meanwhile: its playlist written"
            );
        }
        tracing::info!(
            plan = plan.id(),
            units = published.units,
            done,
            "early playlist written"
        );
        Ok(master.then(|| plan.early_key(names::HLS_MASTER)))
    }

    /// The audio's opening landed into the early stream (its files, then its record), unless
    /// the whole program's audio landed first; `false`: nothing landed. If the whole audio's
    /// record is there once the opening's is written, its files may have been uploaded before
    /// the opening's: put back from its pieces (the module doc).
    pub(super) async fn land_opening(
        &self,
        plan: &PlanRef,
        req: &OptimizeRequest,
        media: MediaOutput,
        key: String,
        scratch: &Path,
    ) -> Result<bool, StorageError> {
        let storage = &*self.services().storage;
        let Some(track) = media.tracks.into_iter().next() else {
            return Ok(false);
        };
        if self.part_landed(plan, plan.audio_key()).await {
            return Ok(false);
        }
        self.publish_early(plan, req, media.files.iter().collect())
            .await?;
        store::write(storage, plan, key, &OpeningRecord { track }, scratch).await?;
        if !self.part_landed(plan, plan.audio_key()).await {
            return Ok(true);
        }
        let tmp = tempfile::tempdir_in(scratch)?;
        let mut whole = Vec::with_capacity(media.files.len());
        for (i, f) in media.files.iter().enumerate() {
            let path = tmp.path().join(i.to_string());
            let piece = SourceRef {
                bucket: plan.bucket.clone(),
                key: plan.piece_key(&f.name),
            };
            match storage.download(&piece, &path, u64::MAX).await {
                Ok(_) => whole.push(ProducedFile { path, ..f.clone() }),
                // Not among the whole audio's files: nothing of it to put back.
                Err(StorageError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        self.publish_early(plan, req, whole.iter().collect())
            .await?;
        tracing::info!(
            plan = plan.id(),
            "the whole audio landed meanwhile: its files put back over the opening's"
        );
        Ok(true)
    }

    /// After the whole audio's record: its `files` uploaded again over those of an opening
    /// that has landed, which may have been uploaded after them (the module doc).
    pub(super) async fn over_opening(
        &self,
        plan: &PlanRef,
        req: &OptimizeRequest,
        files: &[ProducedFile],
    ) -> Result<(), StorageError> {
        let storage = &*self.services().storage;
        let Some(opening) = store::read::<OpeningRecord>(storage, plan, plan.opening_key()).await?
        else {
            return Ok(());
        };
        let id = opening.track.id;
        let segments = opening.track.segments.len() as u32;
        let named: Vec<String> = std::iter::once(names::init_segment(id))
            .chain((0..segments).map(|n| names::segment(id, n)))
            .map(|n| names::in_stream(&n))
            .collect();
        let again = files.iter().filter(|f| named.contains(&f.name)).collect();
        self.publish_early(plan, req, again).await
    }

    /// The video answered: its early stream closed over every unit (`completed`), or its
    /// playlists deleted.
    pub(super) async fn end_early(&self, plan: &PlanRef, completed: bool) {
        let storage = &*self.services().storage;
        let ended = async {
            if store::read::<Published>(storage, plan, plan.early_state_key())
                .await?
                .is_none()
                && completed
            {
                return Ok(());
            }
            if completed {
                let Some(record) =
                    store::read::<PlanRecord>(storage, plan, plan.plan_key()).await?
                else {
                    return Ok(());
                };
                self.extend_playlist(plan, &record, true).await.map(|_| ())
            } else {
                // Nothing playable is left. The segments stay, as the pieces do: the request
                // sent again keeps its landed units, and its playlist names their segments.
                for key in storage.list(&plan.bucket, &plan.early_key("")).await? {
                    if key.ends_with(".m3u8") {
                        storage.delete(&plan.bucket, &key).await?;
                    }
                }
                storage.delete(&plan.bucket, &plan.early_state_key()).await
            }
        };
        match ended.await {
            Ok(()) => {}
            Err(e) => tracing::warn!(plan = plan.id(), completed, error = %e,
                "the early stream could not be ended"),
        }
    }
}
