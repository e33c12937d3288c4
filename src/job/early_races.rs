//! The early stream's races (`early`, `units::land_part`), each interleaving played out
//! explicitly: a store whose chosen write waits until the test lets it go, the parts' own
//! functions on a local store, no sleeps.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tokio::sync::oneshot;

use super::role::As;
use super::runner::JobRunner;
use crate::config::Settings;
use crate::contract::{MediaType, OptimizeRequest, SourceRef, VideoAnalysis};
use crate::media::MediaOutput;
use crate::media::output::{FileFormat, ProducedFile, Role, names};
use crate::media::part::{Opening, Unit};
use crate::media::track::{Segment, Track, TrackId};
use crate::storage::{
    Created, Head, LocalStorage, ObjectMeta, SourceObject, Storage, StorageError,
};
use crate::units::PlanRef;
use crate::units::store::{self, AudioRecord, OpeningRecord, PlanRecord, UnitRecord};

/// A write held at the gate: said when reached, let go when told.
struct Gate {
    key: String,
    /// Which upload of `key` (1: the first).
    nth: usize,
    reached: Option<oneshot::Sender<()>>,
    release: Option<oneshot::Receiver<()>>,
}

/// A local store whose gated uploads wait, before they write, until released.
struct Gated {
    inner: LocalStorage,
    gates: Mutex<Vec<Gate>>,
    uploads: Mutex<HashMap<String, usize>>,
}

impl Gated {
    /// The `nth` upload of `key` waits: the first receiver says it got there, the sender lets
    /// it go.
    fn gate(&self, key: String, nth: usize) -> (oneshot::Receiver<()>, oneshot::Sender<()>) {
        let (reached, at) = oneshot::channel();
        let (go, release) = oneshot::channel();
        self.gates.lock().unwrap().push(Gate {
            key,
            nth,
            reached: Some(reached),
            release: Some(release),
        });
        (at, go)
    }
}

#[async_trait]
impl Storage for Gated {
    async fn download(
        &self,
        src: &SourceRef,
        dest: &Path,
        max_bytes: u64,
    ) -> Result<SourceObject, StorageError> {
        self.inner.download(src, dest, max_bytes).await
    }

    async fn download_range(
        &self,
        src: &SourceRef,
        dest: &Path,
        range: [u64; 2],
        etag: &str,
    ) -> Result<(), StorageError> {
        self.inner.download_range(src, dest, range, etag).await
    }

    async fn upload(
        &self,
        bucket: &str,
        key: &str,
        path: &Path,
        meta: &ObjectMeta<'_>,
    ) -> Result<(), StorageError> {
        let n = {
            let mut uploads = self.uploads.lock().unwrap();
            let n = uploads.entry(key.to_owned()).or_default();
            *n += 1;
            *n
        };
        let held = {
            let mut gates = self.gates.lock().unwrap();
            gates
                .iter_mut()
                .find(|g| g.key == key && g.nth == n)
                .map(|g| (g.reached.take().unwrap(), g.release.take().unwrap()))
        };
        if let Some((reached, release)) = held {
            reached.send(()).unwrap();
            release.await.unwrap();
        }
        self.inner.upload(bucket, key, path, meta).await
    }

    async fn head(&self, src: &SourceRef) -> Result<Head, StorageError> {
        self.inner.head(src).await
    }

    async fn read(&self, src: &SourceRef, max_bytes: u64) -> Result<Vec<u8>, StorageError> {
        self.inner.read(src, max_bytes).await
    }

    async fn check(&self, bucket: &str) -> Result<(), StorageError> {
        self.inner.check(bucket).await
    }

    async fn list(&self, bucket: &str, prefix: &str) -> Result<Vec<String>, StorageError> {
        self.inner.list(bucket, prefix).await
    }

    async fn create(
        &self,
        bucket: &str,
        key: &str,
        body: &[u8],
        meta: &ObjectMeta<'_>,
    ) -> Result<Created, StorageError> {
        self.inner.create(bucket, key, body, meta).await
    }

    async fn delete(&self, bucket: &str, key: &str) -> Result<(), StorageError> {
        self.inner.delete(bucket, key).await
    }
}

/// A runner on a gated local store, and a planned video of two units under `streaming`
/// (early playback), with an opening of two segments and a whole audio of four.
struct Video {
    _dir: tempfile::TempDir,
    scratch: std::path::PathBuf,
    storage: Arc<Gated>,
    runner: JobRunner,
    plan: PlanRef,
    record: PlanRecord,
}

const BUCKET: &str = "media";

fn audio(segments: usize) -> Track {
    Track {
        id: TrackId::Audio,
        codecs: "mp4a.40.2".into(),
        width: 0,
        height: 0,
        frame_rate: None,
        segments: vec![
            Segment {
                seconds: 4.0,
                bytes: 100
            };
            segments
        ],
    }
}

fn rung() -> Track {
    Track {
        id: TrackId::Video(360),
        codecs: "avc1.64001e".into(),
        width: 640,
        height: 360,
        frame_rate: Some(30.0),
        segments: vec![
            Segment {
                seconds: 4.0,
                bytes: 1000
            };
            2
        ],
    }
}

impl Video {
    fn new() -> Video {
        let dir = tempfile::tempdir().unwrap();
        let scratch = dir.path().join("scratch");
        std::fs::create_dir_all(&scratch).unwrap();
        let env = [
            ("TMP_DIR", scratch.display().to_string()),
            ("OUTPUT_BUCKET", BUCKET.to_owned()),
            ("MEDIA_ISOLATION", "inline".to_owned()),
        ];
        let settings = Settings::load_from(None, env.map(|(k, v)| (k.to_owned(), v))).unwrap();
        let storage = Arc::new(Gated {
            inner: LocalStorage::new(dir.path().join("store")),
            gates: Default::default(),
            uploads: Default::default(),
        });
        let svc = super::services(Arc::new(settings), storage.clone()).unwrap();
        let runner = JobRunner::new(svc, crate::shutdown::Shutdown::new());
        let mut request =
            OptimizeRequest::new("r".into(), "m".into(), "u", "uploads", "long.mp4".into());
        request.profile = Some("streaming".into());
        request.media_type = Some(MediaType::Video);
        let unit = |index: u32| Unit {
            index,
            first_slot: i64::from(index) * 240,
            end_slot: (index == 0).then_some(240),
            first_segment: index * 2,
            segments: 2,
            reads: Vec::new(),
        };
        let record = PlanRecord {
            request,
            source_etag: "e".into(),
            source_size: 1,
            units: vec![unit(0), unit(1)],
            audio_reads: Vec::new(),
            opening: Some(Opening {
                secs: 8,
                reads: Vec::new(),
            }),
            analysis: VideoAnalysis {
                duration_ms: Some(16_000),
                width: 640,
                height: 360,
                fps: Some(30.0),
                video_codec: "h264".into(),
                audio_codec: Some("aac".into()),
                has_audio: true,
                bitrate: None,
                rotation: 0,
                hdr: false,
                poster_time_ms: None,
                loudness: None,
                scan: None,
            },
            fingerprint: "f".into(),
        };
        let plan = PlanRef {
            bucket: BUCKET.into(),
            prefix: "u/videos/m/units/0123456789abcdef/".into(),
        };
        Video {
            _dir: dir,
            scratch,
            storage,
            runner,
            plan,
            record,
        }
    }

    /// An audio's init and `segments` segments, each file saying `whose` it is.
    fn audio_output(&self, whose: &str, segments: usize) -> MediaOutput {
        let out = self.scratch.join(whose);
        let track = audio(segments);
        let names = std::iter::once((names::init_segment(TrackId::Audio), None))
            .chain((0..segments as u32).map(|n| (names::segment(TrackId::Audio, n), Some(n))));
        let files = names
            .map(|(name, n)| {
                let name = names::in_stream(&name);
                let path = out.join(&name);
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(&path, format!("{whose} {name}")).unwrap();
                ProducedFile {
                    name,
                    path,
                    role: Role::Segment,
                    format: FileFormat::Cmaf(TrackId::Audio, n),
                    width: 0,
                    height: 0,
                    size_bytes: 1,
                    duration_ms: None,
                    frames: None,
                    crop: None,
                    quality: None,
                }
            })
            .collect();
        MediaOutput {
            media_type: MediaType::Video,
            files,
            analysis: None,
            warnings: Vec::new(),
            tracks: vec![track],
            plan: None,
            reads: Vec::new(),
            opening: None,
        }
    }

    fn role(&self, opening: bool) -> As {
        let (plan, record) = (self.plan.clone(), Box::new(self.record.clone()));
        match opening {
            true => As::Opening { plan, record },
            false => As::Audio { plan, record },
        }
    }

    /// The opening (or the whole audio) made: its files landed as `land_part` lands them.
    async fn land(&self, opening: bool) {
        let media = match opening {
            true => self.audio_output("opening", 2),
            false => self.audio_output("whole", 4),
        };
        let role = self.role(opening);
        let req = &self.record.request;
        let landed = self
            .runner
            .land_part(req, &role, media, &self.scratch)
            .await;
        assert!(landed.is_ok(), "{:?}", landed.err().map(|e| e.0.error));
    }

    async fn early(&self, name: &str) -> String {
        let at = SourceRef {
            bucket: BUCKET.into(),
            key: self.plan.early_key(name),
        };
        let bytes = self.storage.read(&at, 1 << 20).await.unwrap();
        String::from_utf8(bytes).unwrap()
    }

    /// The early stream's audio files whose bytes are not the whole program's.
    async fn not_whole(&self) -> Vec<String> {
        let mut left = Vec::new();
        for name in [
            names::init_segment(TrackId::Audio),
            names::segment(TrackId::Audio, 0),
            names::segment(TrackId::Audio, 1),
        ] {
            let name = names::in_stream(&name);
            if self.early(&name).await != format!("whole {name}") {
                left.push(name);
            }
        }
        left
    }

    async fn write<T: serde::Serialize>(&self, key: String, value: &T) {
        let storage = &*self.storage;
        store::write(storage, &self.plan, key, value, &self.scratch)
            .await
            .unwrap();
    }

    fn key(&self, name: &str) -> String {
        self.plan.early_key(name)
    }
}

/// Runs `first` until its gated write is reached, then `meanwhile` to its end, then lets
/// `first` go and runs it to its end.
async fn around<A, B>(
    first: A,
    reached: oneshot::Receiver<()>,
    meanwhile: B,
    release: oneshot::Sender<()>,
) where
    A: std::future::Future<Output = ()>,
    B: std::future::Future<Output = ()>,
{
    tokio::pin!(first);
    tokio::select! {
        _ = &mut first => panic!("the first ended before its gate"),
        r = reached => r.unwrap(),
    }
    meanwhile.await;
    release.send(()).unwrap();
    first.await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_opening_that_checked_before_the_whole_audio_landed_leaves_the_whole_audios_files() {
    let v = Video::new();
    // The opening found no audio record, then the whole audio landed before its uploads.
    let init = names::in_stream(&names::init_segment(TrackId::Audio));
    let (reached, release) = v.storage.gate(v.key(&init), 1);
    around(v.land(true), reached, v.land(false), release).await;
    assert_eq!(
        v.not_whole().await,
        Vec::<String>::new(),
        "the early stream's audio files overwritten by the opening"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_opening_that_landed_while_the_whole_audio_was_recorded_leaves_the_whole_audios_files() {
    let v = Video::new();
    // The whole audio's files uploaded, its record not yet written: the opening lands whole
    // meanwhile, over the same names.
    let (reached, release) = v.storage.gate(v.plan.audio_key(), 1);
    around(v.land(false), reached, v.land(true), release).await;
    assert_eq!(
        v.not_whole().await,
        Vec::<String>::new(),
        "the early stream's audio files overwritten by the opening"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn unit_zero_and_the_whole_audio_landing_together_leave_the_whole_audios_playlist() {
    let v = Video::new();
    let rec = &v.record;
    v.write(v.plan.opening_key(), &OpeningRecord { track: audio(2) })
        .await;
    v.write(
        v.plan.unit_key(0),
        &UnitRecord::Landed {
            tracks: vec![rung()],
            pieces: Vec::new(),
            worker: "w".into(),
        },
    )
    .await;
    let playlist = names::in_stream(&names::media_playlist(TrackId::Audio));
    // Unit 0's lander read the records before the audio's: it writes the opening's playlist,
    // held back until the audio's lander has written the whole program's; the audio's lander
    // then writes early.json (saying the audio is whole) after unit 0's.
    let (unit_at, unit_go) = v.storage.gate(v.key(&playlist), 1);
    let (audio_at, audio_go) = v.storage.gate(v.plan.early_state_key(), 1);
    let unit_zero = v.runner.extended(&v.plan, rec);
    tokio::pin!(unit_zero);
    tokio::select! {
        _ = &mut unit_zero => panic!("unit 0's lander passed its gate"),
        r = unit_at => r.unwrap(),
    }
    let whole = AudioRecord {
        track: Some(audio(4)),
        pieces: Vec::new(),
        loudness: None,
        warnings: Vec::new(),
    };
    v.write(v.plan.audio_key(), &whole).await;
    let audio_lander = v.runner.extended(&v.plan, rec);
    tokio::pin!(audio_lander);
    tokio::select! {
        _ = &mut audio_lander => panic!("the audio's lander passed its gate"),
        r = audio_at => r.unwrap(),
    }
    // Unit 0's lander goes on (its playlist, the master, early.json) to its end, then the
    // audio's writes early.json.
    unit_go.send(()).unwrap();
    unit_zero.await;
    audio_go.send(()).unwrap();
    audio_lander.await;
    let written = v.early(&playlist).await;
    let segments = written.matches(".m4s").count();
    let state: serde_json::Value = store::read(&*v.storage, &v.plan, v.plan.early_state_key())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(state["audio_whole"], true, "{state}");
    assert_eq!(
        (segments, written.contains("#EXT-X-ENDLIST")),
        (4, true),
        "early.json says the audio is whole; its playlist:\n{written}"
    );
}
