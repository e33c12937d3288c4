//! What the media code is asked to do with one input ([`MediaJob`]) and the settings it takes:
//! the profile, the limits, the analysis and video sections (loaded by `config`), each
//! checking itself here ([`Section`]).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::contract::{MediaType, OutputFormat};
use crate::section::{Invalid, Section, ensure};

/// What to do with one input.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MediaJob {
    pub profile: Profile,
    pub limits: Limits,
    pub analysis: AnalysisSettings,
    pub video: VideoSettings,
    /// ffmpeg `-threads` (see `Settings::ffmpeg_threads`).
    pub ffmpeg_threads: usize,
    /// The producer's hint; the type is always detected from the bytes.
    pub hint: Option<MediaType>,
    /// Heights of the video rungs an earlier attempt already uploaded: not made again.
    #[serde(default)]
    pub resume: Vec<u32>,
    /// The streams of those rungs, as the playlists list them (a streaming profile).
    #[serde(default)]
    pub resumed_tracks: Vec<crate::media::track::Track>,
    /// The part of a long video's work this job is (see `video::units`).
    #[serde(default)]
    pub part: crate::media::part::Part,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    pub max_input_bytes: u64,
    pub max_image_pixels: u64,
    /// Longer videos are rejected (`limits_exceeded`) before transcoding.
    pub max_video_seconds: u64,
    /// Larger frames (width x height as displayed) are rejected before transcoding.
    pub max_video_pixels: u64,
    /// Animated images: more frames, or more pixels over all frames, are rejected.
    pub max_frames: u32,
    pub max_animation_pixels: u64,
    /// No file written by media work may be larger (`RLIMIT_FSIZE` in a sandbox).
    pub max_output_file_bytes: u64,
    /// Videos with a higher frame rate, more frames or more streams are rejected.
    pub max_video_fps: f64,
    pub max_video_frames: u64,
    pub max_video_streams: u32,
}

/// FFmpeg (see `media::video`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VideoSettings {
    pub ffmpeg: PathBuf,
    pub ffprobe: PathBuf,
    /// ffmpeg threads per job; 0 = cores / pool size (at least 1), so that pool x threads is
    /// about the core count. A video job holds one pool permit, like an image job.
    pub threads: usize,
    /// libx264 preset.
    pub preset: String,
    pub audio_bitrate_kbps: u32,
    /// Each ffmpeg run may take `timeout_base_secs + timeout_per_second x duration` (the
    /// duration is `limits.max_video_seconds` when the container does not say).
    pub timeout_base_secs: u64,
    pub timeout_per_second: f64,
    /// Frames considered for the poster, spread over the video.
    pub poster_candidates: u32,
}

/// OpenCV analysis (see `media::vision`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnalysisSettings {
    /// Upper bound on the longest side of the copy analysed (see `analyze::working_side`).
    pub max_side: u32,
    pub face_cascade: PathBuf,
    /// A second cascade for faces in profile.
    #[serde(default)]
    pub profile_cascade: Option<PathBuf>,
    pub scale_factor: f64,
    pub min_neighbors: i32,
    /// Smallest face searched (in groups), as a fraction of the shorter image side.
    pub min_face_ratio: f64,
    /// Smallest face searched in every image.
    pub first_pass_face_ratio: f64,
    /// An image with at least this many clusters of face candidates (two or more each), one
    /// near `first_pass_face_ratio`, is a group: searched again for faces down to
    /// `min_face_ratio`, and with the profile cascade when fewer frontal faces were found.
    pub group_min_faces: u32,
    /// Longest side of the grey copy whose Laplacian variance is `blur_score`.
    pub blur_side: u32,
    /// `is_blurry` when `blur_score` is below this.
    pub blur_threshold: f64,
}

/// What to produce for a request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Include the `analysis` block in the response.
    pub analysis: bool,
    /// Target widths; never upscaled (see `media::transform::plan_widths`).
    pub widths: Vec<u32>,
    pub formats: Vec<FormatSpec>,
    /// A `thumbnail` output cropped around the focal point (cover), in every format.
    #[serde(default)]
    pub thumbnail: Option<ThumbnailSpec>,
    /// Video renditions, only those not taller than the source (see `media::video`).
    #[serde(default = "default_renditions")]
    pub renditions: Vec<Rendition>,
    /// A poster frame sent through the image outputs above.
    #[serde(default = "yes")]
    pub poster: bool,
    /// The renditions as progressive MP4 files (download links). With `streaming`, the same
    /// encoded streams are also cut into segments: nothing is encoded twice.
    #[serde(default = "yes")]
    pub progressive: bool,
    /// Adaptive streaming from the ladder's run: CMAF segments of every rung and of the audio
    /// under `hls/`, with an HLS master playlist and/or a DASH MPD over the same segments.
    #[serde(default)]
    pub streaming: Vec<StreamingFormat>,
    /// Target segment duration in seconds: every rung has a keyframe (closed GOP) at each
    /// multiple of it, so a player can switch rungs at any segment.
    #[serde(default = "default_segment_secs")]
    pub segment_secs: u32,
    /// A streaming profile's video longer than this is encoded as units of `unit_segments`
    /// segments (`media::video::units`), each a job of its own spread over the fleet; shorter
    /// ones in one run.
    #[serde(default = "default_units_after_secs")]
    pub units_after_secs: u32,
    /// Segments per unit of a long video.
    #[serde(default = "default_unit_segments")]
    pub unit_segments: u32,
    /// A long video spread over the fleet is playable before it is done: its lowest rung as a
    /// growing HLS playlist (EVENT) as its units land in order, closed as VOD at the end
    /// (`job::early`).
    #[serde(default)]
    pub early_playback: bool,
    /// Trick-play images of the ladder's run: a sprite sheet and a WebVTT file pointing into it.
    #[serde(default)]
    pub storyboard: Option<StoryboardSpec>,
    /// Measure the source's loudness (EBU R128) and, with a target, normalise the outputs'
    /// audio to it in the ladder's run.
    #[serde(default)]
    pub loudness: Option<LoudnessSpec>,
    /// Animated GIFs also get the video renditions (H.264 MP4, no poster), usually a fraction
    /// of the GIF's size.
    #[serde(default)]
    pub animation_mp4: bool,
    /// `Cache-Control` of the uploaded outputs (used by the upload stage).
    #[serde(default = "default_cache_control")]
    pub cache_control: String,
    /// Metadata of the source the image outputs keep; none by default (only pixels leave).
    /// `copyright`: EXIF Copyright and Artist, XMP dc:rights and dc:creator, IPTC copyright
    /// notice and by-line (see `media::rights`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keep_metadata: Vec<KeptMetadata>,
    /// Scan the downloaded source with clamd before anything decodes it (the job runner's
    /// scan stage; a hit fails the job `malware_detected`).
    #[serde(default)]
    pub scan: bool,
}

/// Output keys are stable but not immutable: `force: true` and a new version of the source
/// overwrite them. A cache serves an overwritten output for at most an hour (a day while it
/// revalidates in the background). A profile whose keys never change may say `immutable`.
pub const DEFAULT_CACHE_CONTROL: &str = "public, max-age=3600, stale-while-revalidate=86400";

fn default_cache_control() -> String {
    DEFAULT_CACHE_CONTROL.to_owned()
}

/// One rung of the video ladder: `height` is the shorter displayed side (720 = 720p, also for
/// a portrait video, which becomes 720x1280). Encoded at its CRF under a peak bitrate cap (a
/// VBV of `bufsize_kbps` filled at `maxrate_kbps`), so that no stretch of `d` seconds takes
/// more than `maxrate x d + bufsize` bits: what a player reads in `BANDWIDTH` holds, and a
/// rendition's bytes are bounded per second of video whatever the content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rendition {
    pub height: u32,
    pub crf: u8,
    /// Peak bitrate; default [`guideline_kbps`] of the height.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maxrate_kbps: Option<u32>,
    /// The rate control's buffer; default twice the peak bitrate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bufsize_kbps: Option<u32>,
}

impl Rendition {
    /// A rung with the guideline's cap for its height.
    pub fn new(height: u32, crf: u8) -> Rendition {
        Rendition {
            height,
            crf,
            maxrate_kbps: None,
            bufsize_kbps: None,
        }
    }

    /// The peak bitrate the encoder keeps to, in kbit/s.
    pub fn maxrate(&self) -> u32 {
        self.maxrate_kbps
            .unwrap_or_else(|| guideline_kbps(self.height))
    }

    /// The VBV buffer, in kbit: a segment of `d` seconds has at most `maxrate x d + bufsize`.
    pub fn bufsize(&self) -> u32 {
        self.bufsize_kbps.unwrap_or(2 * self.maxrate())
    }
}

/// Apple's "HLS Authoring Specification for Apple Devices", table "Video average bit rate"
/// for H.264 at 16:9 (https://developer.apple.com/documentation/http_live_streaming/
/// hls_authoring_specification_for_apple_devices): (height, kbit/s), the first row of each
/// size (416x234 145, 640x360 365, 768x432 730, 960x540 2000, 1280x720 3000, 1920x1080 6000;
/// the table's second rows, 432p 1100, 720p 4500 and 1080p 7800, are its higher-quality
/// variants).
pub const HLS_AUTHORING_H264: [(u32, u32); 6] = [
    (234, 145),
    (360, 365),
    (432, 730),
    (540, 2000),
    (720, 3000),
    (1080, 6000),
];

/// The guideline's bitrate for a rung of this height (the shorter side): the table's row of
/// that height, between two rows linear in the pixel count, outside the table in proportion to
/// the pixels of the nearest row (a 2160p rung gets 4 x 1080p's).
pub fn guideline_kbps(height: u32) -> u32 {
    let pixels = |h: u32| (h as f64).powi(2);
    let rows = &HLS_AUTHORING_H264;
    let (first, last) = (rows[0], rows[rows.len() - 1]);
    let kbps = if height <= first.0 {
        first.1 as f64 * pixels(height) / pixels(first.0)
    } else if height >= last.0 {
        last.1 as f64 * pixels(height) / pixels(last.0)
    } else {
        let i = rows
            .iter()
            .position(|r| r.0 >= height)
            .expect("inside the table");
        let ((h0, r0), (h1, r1)) = (rows[i - 1], rows[i]);
        let at = (pixels(height) - pixels(h0)) / (pixels(h1) - pixels(h0));
        r0 as f64 + at * (r1 as f64 - r0 as f64)
    };
    (kbps.round() as u32).max(16)
}

fn default_renditions() -> Vec<Rendition> {
    vec![Rendition::new(720, 23), Rendition::new(480, 26)]
}

fn yes() -> bool {
    true
}

fn default_segment_secs() -> u32 {
    4
}

fn default_units_after_secs() -> u32 {
    120
}

fn default_unit_segments() -> u32 {
    2
}

/// Source metadata a profile may keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeptMetadata {
    Copyright,
}

/// A streaming entry point over the one set of CMAF segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StreamingFormat {
    /// `hls/master.m3u8`
    Hls,
    /// `hls/manifest.mpd`
    Dash,
}

/// The storyboard: a tile every `interval_secs` (more apart for long videos, so that there
/// are at most `max_tiles`), `tile_width` px wide, `columns` to a row of one sprite.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoryboardSpec {
    pub interval_secs: f64,
    pub max_tiles: u32,
    pub tile_width: u32,
    pub columns: u32,
    /// `webp` or `jpeg`.
    pub format: OutputFormat,
    pub quality: u8,
}

/// Loudness measurement, and normalisation when `target_lufs` is set: the integrated loudness
/// brought to it, the true peak kept under `max_true_peak_dbtp`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoudnessSpec {
    #[serde(default)]
    pub target_lufs: Option<f64>,
    #[serde(default = "default_true_peak")]
    pub max_true_peak_dbtp: f64,
}

fn default_true_peak() -> f64 {
    -1.0
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThumbnailSpec {
    pub width: u32,
    pub height: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FormatSpec {
    pub format: OutputFormat,
    pub quality: Quality,
    /// With `quality = "auto"`: what the search aims at (default `high`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<Target>,
}

impl FormatSpec {
    pub fn fixed(format: OutputFormat, quality: u8) -> FormatSpec {
        FormatSpec {
            format,
            quality: Quality::Fixed(quality),
            target: None,
        }
    }

    /// The SSIMULACRA2 score an auto quality aims at; `None` for a fixed quality.
    pub fn auto_target(&self) -> Option<f64> {
        match self.quality {
            Quality::Fixed(_) => None,
            Quality::Auto(_) => Some(self.target.unwrap_or_default().score()),
        }
    }
}

/// An encoder quality: fixed (1-100), or `"auto"`: per image, the lowest that meets the
/// format's [`Target`] (see `media::quality`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Quality {
    Fixed(u8),
    Auto(AutoQuality),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AutoQuality {
    Auto,
}

/// An auto quality's aim: a named level or a SSIMULACRA2 score (30-95).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Target {
    Level(Level),
    Score(f64),
}

/// Named SSIMULACRA2 levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// 60: artefacts visible on a close look, for previews.
    Medium,
    /// 70: no artefact at normal viewing distance (libjxl's "high quality").
    #[default]
    High,
    /// 80: artefacts hard to find even side by side.
    Higher,
}

impl Default for Target {
    fn default() -> Self {
        Target::Level(Level::default())
    }
}

impl Target {
    pub fn score(self) -> f64 {
        match self {
            Target::Level(Level::Medium) => 60.0,
            Target::Level(Level::High) => 70.0,
            Target::Level(Level::Higher) => 80.0,
            Target::Score(s) => s,
        }
    }
}

impl Section for Limits {
    fn validate(&self) -> Result<(), Invalid> {
        ensure(
            self.max_video_seconds > 0
                && self.max_video_pixels > 0
                && self.max_input_bytes > 0
                && self.max_image_pixels > 0,
            "",
            "limits must be positive",
        )
    }
}

impl Section for VideoSettings {
    fn validate(&self) -> Result<(), Invalid> {
        ensure(
            self.timeout_base_secs > 0
                && self.timeout_per_second > 0.0
                && self.poster_candidates > 0,
            "",
            "timeout_base_secs, timeout_per_second and poster_candidates must be positive",
        )
    }
}

impl Section for AnalysisSettings {
    fn validate(&self) -> Result<(), Invalid> {
        let cascades = std::iter::once(("face_cascade", &self.face_cascade))
            .chain(self.profile_cascade.iter().map(|p| ("profile_cascade", p)));
        for (key, path) in cascades {
            ensure(
                path.is_file(),
                key,
                format!(
                    "cascade file {} not found (apt-get install opencv-data)",
                    path.display()
                ),
            )?;
        }
        let ratio = |r: f64| r > 0.0 && r <= 1.0;
        ensure(
            ratio(self.min_face_ratio) && ratio(self.first_pass_face_ratio),
            "",
            "min_face_ratio and first_pass_face_ratio must be in (0, 1]",
        )?;
        ensure(
            self.scale_factor > 1.0 && self.min_neighbors >= 1 && self.max_side >= 64,
            "",
            "need scale_factor > 1, min_neighbors >= 1, max_side >= 64",
        )
    }
}

/// The largest thumbnail side: a thumbnail is made in every format of its profile, and 4,096
/// px is far beyond what a thumbnail is for while well inside every format's limit.
pub const MAX_THUMBNAIL_SIDE: u32 = 4096;

impl Section for Profile {
    fn validate(&self) -> Result<(), Invalid> {
        ensure(
            !self.widths.is_empty() && self.widths.iter().all(|w| (1..=16384).contains(w)),
            "widths",
            "need 1 to 16384 px each, at least one",
        )?;
        ensure(
            !self.formats.is_empty(),
            "formats",
            "need at least one format",
        )?;
        for f in &self.formats {
            match f.quality {
                Quality::Fixed(q) => ensure(
                    (1..=100).contains(&q) && f.target.is_none(),
                    "formats",
                    "quality must be 1-100 or \"auto\", and only \"auto\" takes a target",
                )?,
                Quality::Auto(_) => ensure(
                    f.target.is_none_or(|t| (30.0..=95.0).contains(&t.score())),
                    "formats",
                    "a target is \"medium\", \"high\", \"higher\" or a SSIMULACRA2 score 30-95",
                )?,
            }
        }
        if let Some(t) = self.thumbnail {
            let side = 1..=MAX_THUMBNAIL_SIDE;
            ensure(
                side.contains(&t.width) && side.contains(&t.height),
                "thumbnail",
                format!("need 1 to {MAX_THUMBNAIL_SIDE} px"),
            )?;
        }
        ensure(
            !self.renditions.is_empty()
                && self
                    .renditions
                    .iter()
                    .all(|r| (16..=4320).contains(&r.height) && r.crf <= 51),
            "renditions",
            "need at least one, height 16-4320, crf 0-51",
        )?;
        ensure(
            self.renditions
                .iter()
                .all(|r| r.maxrate() >= 16 && r.bufsize() >= r.maxrate() / 4),
            "renditions",
            "need maxrate_kbps at least 16 and bufsize_kbps at least a quarter of it",
        )?;
        ensure(
            self.progressive || !self.streaming.is_empty(),
            "progressive",
            "a profile without progressive renditions needs `streaming`",
        )?;
        ensure(
            (1..=30).contains(&self.segment_secs),
            "segment_secs",
            "need 1 to 30 s",
        )?;
        ensure(
            (1..=75).contains(&self.unit_segments),
            "unit_segments",
            "need 1 to 75 segments",
        )?;
        if let Some(s) = &self.storyboard {
            ensure(
                s.interval_secs >= 0.5
                    && (1..=1000).contains(&s.max_tiles)
                    && (32..=640).contains(&s.tile_width)
                    && (1..=25).contains(&s.columns)
                    && matches!(s.format, OutputFormat::Webp | OutputFormat::Jpeg)
                    && (1..=100).contains(&s.quality),
                "storyboard",
                "need interval_secs >= 0.5, max_tiles 1-1000, tile_width 32-640, columns 1-25, \
                 format webp or jpeg, quality 1-100",
            )?;
        }
        if let Some(l) = &self.loudness {
            ensure(
                l.target_lufs.is_none_or(|t| (-70.0..=-5.0).contains(&t))
                    && (-9.0..=0.0).contains(&l.max_true_peak_dbtp),
                "loudness",
                "need target_lufs -70 to -5 and max_true_peak_dbtp -9 to 0",
            )?;
        }
        Ok(())
    }
}

/// The embedded defaults' media sections, for unit tests: the media code does not import
/// `config`, which imports it.
#[cfg(test)]
pub(crate) mod defaults {
    use figment::Figment;
    use figment::providers::{Format, Toml};

    use super::*;

    const TOML: &str = include_str!("../../config/default.toml");

    pub fn section<T: serde::de::DeserializeOwned>(key: &str) -> T {
        Figment::from(Toml::string(TOML))
            .extract_inner(key)
            .unwrap_or_else(|e| panic!("{key}: {e}"))
    }

    /// What the default settings ask of one input with `profile`.
    pub fn job(profile: &str) -> MediaJob {
        MediaJob {
            profile: section(&format!("profiles.{profile}")),
            limits: section("limits"),
            analysis: section("analysis"),
            video: section("video"),
            ffmpeg_threads: 1,
            hint: None,
            resume: Vec::new(),
            resumed_tracks: Vec::new(),
            part: Default::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thumbnail_is_refused_past_its_largest_side_and_at_zero() {
        let mut p: Profile = defaults::section("profiles.default");
        let mut with = |width, height| {
            p.thumbnail = Some(ThumbnailSpec { width, height });
            p.validate().map_err(|e| e.key)
        };
        assert_eq!(with(MAX_THUMBNAIL_SIDE, MAX_THUMBNAIL_SIDE), Ok(()));
        assert_eq!(with(MAX_THUMBNAIL_SIDE + 1, 100), Err("thumbnail".into()));
        assert_eq!(with(100, MAX_THUMBNAIL_SIDE + 1), Err("thumbnail".into()));
        assert_eq!(with(0, 100), Err("thumbnail".into()));
    }

    #[test]
    fn rungs_are_capped_at_the_guideline_unless_set() {
        for (height, kbps) in HLS_AUTHORING_H264 {
            assert_eq!(guideline_kbps(height), kbps);
        }
        // Between rows by the pixel count; outside in proportion to the nearest row's pixels.
        assert_eq!(guideline_kbps(480), 1260);
        assert_eq!(guideline_kbps(240), 153);
        assert_eq!(guideline_kbps(2160), 24000);
        assert_eq!(guideline_kbps(16), 16);
        let r = Rendition::new(720, 23);
        assert_eq!((r.maxrate(), r.bufsize()), (3000, 6000));
        let set = Rendition {
            maxrate_kbps: Some(4500),
            ..r
        };
        assert_eq!((set.maxrate(), set.bufsize()), (4500, 9000));
        let mut p: Profile = defaults::section("profiles.streaming");
        assert_eq!(p.validate().map_err(|e| e.key), Ok(()));
        p.renditions[0].bufsize_kbps = Some(1);
        assert_eq!(p.validate().map_err(|e| e.key), Err("renditions".into()));
        let unknown: Result<Rendition, _> =
            serde_json::from_str(r#"{"height": 720, "crf": 23, "maxrate": 1}"#);
        assert!(unknown.is_err(), "a misspelt cap is refused, not ignored");
    }
}
