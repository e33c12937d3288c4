//! What media work produces: files in the scratch output directory, and the outcome.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::contract::{Analysis, MediaType, OutputFormat, QualityUsed, Rect, Warning};
use crate::media::settings::StreamingFormat;
pub use crate::media::track::{Track, TrackId};

/// One file written to the scratch output directory.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProducedFile {
    /// File name, which is also the last part of its object key (e.g. `640w.webp`).
    pub name: String,
    pub path: PathBuf,
    pub role: Role,
    pub format: FileFormat,
    pub width: u32,
    pub height: u32,
    pub size_bytes: u64,
    /// Video renditions and animations (one play).
    pub duration_ms: Option<u64>,
    /// Animations: how many frames.
    pub frames: Option<u32>,
    /// Thumbnails: the region of the upright source shown.
    pub crop: Option<Rect>,
    /// Images: how they were encoded.
    #[serde(default)]
    pub quality: Option<QualityUsed>,
}

/// What a produced file is encoded as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileFormat {
    Image(OutputFormat),
    /// H.264 + AAC in MP4.
    Mp4,
    /// A CMAF piece of one track of a stream: its init segment (`None`) or media segment `n`.
    Cmaf(TrackId, Option<u32>),
    /// An HLS playlist: one track's media playlist, or the master (`None`).
    Hls(Option<TrackId>),
    /// A DASH MPD.
    Dash,
    WebVtt,
    /// A picture a unit of a long video keeps for the stitch: stored beside its plan, never
    /// an output.
    Piece(Piece),
}

/// See [`FileFormat::Piece`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Piece {
    /// Storyboard tile `k`.
    Tile(u32),
    /// Poster candidate `i`.
    Candidate(u32),
}

impl FileFormat {
    pub fn name(self) -> &'static str {
        match self {
            Self::Image(f) => f.name(),
            Self::Mp4 => "mp4",
            Self::Cmaf(..) => "cmaf",
            Self::Hls(_) => "hls",
            Self::Dash => "dash",
            Self::WebVtt => "vtt",
            Self::Piece(_) => "png",
        }
    }
    pub fn content_type(self) -> &'static str {
        match self {
            Self::Image(f) => f.content_type(),
            Self::Mp4 | Self::Cmaf(TrackId::Video(_), _) => "video/mp4",
            Self::Cmaf(TrackId::Audio, _) => "audio/mp4",
            Self::Hls(_) => "application/vnd.apple.mpegurl",
            Self::Dash => "application/dash+xml",
            Self::WebVtt => "text/vtt",
            Self::Piece(_) => "image/png",
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub struct MediaOutput {
    pub media_type: MediaType,
    pub files: Vec<ProducedFile>,
    pub analysis: Option<Analysis>,
    pub warnings: Vec<Warning>,
    /// The video tracks of a stream made by this run, as the resume record keeps them.
    #[serde(default)]
    pub tracks: Vec<Track>,
    /// A video planned as units (`Part::Plan`): the units to encode (made by `Part::Audio`,
    /// the `tracks` hold the audio's, the files its pieces).
    #[serde(default)]
    pub plan: Option<Vec<crate::media::part::Unit>>,
    /// The bytes of the source to read (`[start, end)`): `Part::Index`'s, what the plan reads;
    /// `Part::Plan`'s, what the audio reads. Empty: the whole file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reads: Vec<[u64; 2]>,
    /// `Part::Plan`'s: the audio's opening, for the early stream (none without audio).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opening: Option<crate::media::part::Opening>,
}

impl MediaOutput {
    /// `Part::Index`'s answer: nothing made, the bytes `reads` to download (empty: the whole
    /// file).
    pub fn reads(reads: Vec<[u64; 2]>) -> Self {
        MediaOutput {
            media_type: MediaType::Video,
            files: Vec::new(),
            analysis: None,
            warnings: Vec::new(),
            tracks: Vec::new(),
            plan: None,
            reads,
            opening: None,
        }
    }
}

/// What a produced file is for (the response's `role`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Variant,
    Thumbnail,
    Rendition,
    Poster,
    /// An entry point of a stream: the HLS master playlist or the DASH MPD.
    Stream,
    /// The pieces a stream's entry points lead to (init and media segments, media
    /// playlists): uploaded before them, never listed in a response.
    Segment,
    /// The trick-play sprite and its WebVTT.
    Storyboard,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Variant => "variant",
            Self::Thumbnail => "thumbnail",
            Self::Rendition => "rendition",
            Self::Poster => "poster",
            Self::Stream => "stream",
            Self::Segment => "segment",
            Self::Storyboard => "storyboard",
        }
    }

    /// Whether a response lists outputs of this role (a stream's segments are reached through
    /// its entry points).
    pub fn listed(self) -> bool {
        self != Self::Segment
    }
}

impl PartialEq<&str> for Role {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// Output names, also the last part of their keys: one place for the media code that writes
/// the files and for the worker, which uploads what a sandbox reports only under the name
/// [`expected_name`] gives it.
pub mod names {
    use super::TrackId;
    use crate::contract::OutputFormat;

    use crate::media::settings::ThumbnailSpec;

    /// `640w`
    pub fn variant_stem(width: u32) -> String {
        format!("{width}w")
    }
    /// `thumb_320x320`
    pub fn thumbnail_stem(spec: ThumbnailSpec) -> String {
        format!("thumb_{}x{}", spec.width, spec.height)
    }
    /// `640w.webp`
    pub fn image(stem: &str, format: OutputFormat) -> String {
        format!("{stem}.{}", format.ext())
    }
    /// `mp4/720p.mp4`
    pub fn rendition(height: u32) -> String {
        format!("mp4/{height}p.mp4")
    }
    /// `poster/640w.webp`
    pub fn poster(name: &str) -> String {
        format!("poster/{name}")
    }

    /// The folder of a stream's files.
    pub const STREAM_DIR: &str = "hls";
    /// `hls/master.m3u8`
    pub const HLS_MASTER: &str = "hls/master.m3u8";
    /// `hls/manifest.mpd`, beside the master: the same segments.
    pub const DASH_MPD: &str = "hls/manifest.mpd";
    /// `720p/index.m3u8`, relative to [`STREAM_DIR`] (as the entry points name it).
    pub fn media_playlist(track: TrackId) -> String {
        format!("{track}/index.m3u8")
    }
    /// `720p/init.mp4`, relative to [`STREAM_DIR`].
    pub fn init_segment(track: TrackId) -> String {
        format!("{track}/init.mp4")
    }
    /// The media segments' names relative to [`STREAM_DIR`] in ffmpeg's (`%05d`) and DASH's
    /// (`$Number%05d$`) template syntax; the first is number 0.
    pub fn segment_template(track: TrackId, number: &str) -> String {
        format!("{track}/seg-{number}.m4s")
    }
    /// `720p/seg-00003.m4s`, relative to [`STREAM_DIR`].
    pub fn segment(track: TrackId, n: u32) -> String {
        segment_template(track, &format!("{n:05}"))
    }
    /// `hls/{name}`
    pub fn in_stream(name: &str) -> String {
        format!("{STREAM_DIR}/{name}")
    }
    /// `storyboard.webp`
    pub fn storyboard(format: OutputFormat) -> String {
        image("storyboard", format)
    }
    pub const STORYBOARD_VTT: &str = "storyboard.vtt";
    /// Where a unit of a long video writes its pictures for the stitch.
    pub const PIECES: &str = "pieces";
    /// `pieces/tile-00012.png`, `pieces/frame-3.png`
    pub fn piece(p: super::Piece) -> String {
        match p {
            super::Piece::Tile(k) => format!("{PIECES}/tile-{k:05}.png"),
            super::Piece::Candidate(i) => format!("{PIECES}/frame-{i}.png"),
        }
    }
}

/// The name a file `f` of `job` has, from its role, format and size alone (never from the name
/// or path its producer gave it); `None` when `job` makes no such file.
pub fn expected_name(job: &super::MediaJob, f: &ProducedFile) -> Option<String> {
    let profile = &job.profile;
    let image = |thumbnail: bool| {
        let FileFormat::Image(format) = f.format else {
            return None;
        };
        if !profile.formats.iter().any(|s| s.format == format) {
            return None;
        }
        let stem = match (thumbnail, profile.thumbnail) {
            (false, _) => names::variant_stem(f.width),
            (true, Some(spec)) => names::thumbnail_stem(spec),
            (true, None) => return None,
        };
        Some(names::image(&stem, format))
    };
    let streams = |format| profile.streaming.contains(&format);
    let streaming = !profile.streaming.is_empty();
    let track = |t: TrackId| match t {
        TrackId::Video(h) => h % 2 == 0 && (2..=4320).contains(&h),
        TrackId::Audio => true,
    };
    match (f.role, f.format) {
        (Role::Variant, _) => image(false),
        (Role::Thumbnail, _) => image(true),
        (Role::Poster, _) => image(f.crop.is_some()).map(|n| names::poster(&n)),
        // An animated GIF's renditions are MP4s whatever the video setting.
        (Role::Rendition, FileFormat::Mp4) if profile.progressive || profile.animation_mp4 => {
            Some(names::rendition(f.width.min(f.height)))
        }
        (Role::Stream, FileFormat::Hls(None)) if streams(StreamingFormat::Hls) => {
            Some(names::HLS_MASTER.to_owned())
        }
        (Role::Stream, FileFormat::Dash) if streams(StreamingFormat::Dash) => {
            Some(names::DASH_MPD.to_owned())
        }
        (Role::Segment, FileFormat::Hls(Some(t))) if streams(StreamingFormat::Hls) && track(t) => {
            Some(names::in_stream(&names::media_playlist(t)))
        }
        (Role::Segment, FileFormat::Cmaf(t, None)) if streaming && track(t) => {
            Some(names::in_stream(&names::init_segment(t)))
        }
        (Role::Segment, FileFormat::Cmaf(t, Some(n)))
            if streaming && track(t) && n < max_segments(job) =>
        {
            Some(names::in_stream(&names::segment(t, n)))
        }
        (Role::Storyboard, FileFormat::Image(format))
            if profile.storyboard.is_some_and(|s| s.format == format) =>
        {
            Some(names::storyboard(format))
        }
        (Role::Storyboard, FileFormat::WebVtt) if profile.storyboard.is_some() => {
            Some(names::STORYBOARD_VTT.to_owned())
        }
        // A unit's pictures for the stitch.
        (Role::Segment, FileFormat::Piece(p)) if matches!(job.part, super::part::Part::Unit(_)) => {
            match p {
                Piece::Tile(k) if profile.storyboard.is_some_and(|s| k < s.max_tiles) => {
                    Some(names::piece(p))
                }
                Piece::Candidate(i) if profile.poster && i < job.video.poster_candidates => {
                    Some(names::piece(p))
                }
                _ => None,
            }
        }
        _ => None,
    }
}

/// The most media segments one track of `job` can have: the longest video the limits accept
/// cut at the target duration, with room for a short last segment.
pub fn max_segments(job: &super::MediaJob) -> u32 {
    let secs = job.limits.max_video_seconds as u32;
    secs.div_ceil(job.profile.segment_secs.max(1)) + 2
}
