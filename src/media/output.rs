//! What media work produces: files in the scratch output directory, and the outcome.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::contract::{Analysis, MediaType, OutputFormat, Rect, Warning};

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
}

/// What a produced file is encoded as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileFormat {
    Image(OutputFormat),
    /// H.264 + AAC in MP4.
    Mp4,
}

impl FileFormat {
    pub fn name(self) -> &'static str {
        match self {
            Self::Image(f) => f.name(),
            Self::Mp4 => "mp4",
        }
    }
    pub fn content_type(self) -> &'static str {
        match self {
            Self::Image(f) => f.content_type(),
            Self::Mp4 => "video/mp4",
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub struct MediaOutput {
    pub media_type: MediaType,
    pub files: Vec<ProducedFile>,
    pub analysis: Option<Analysis>,
    pub warnings: Vec<Warning>,
}

/// What a produced file is for (the response's `role`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Variant,
    Thumbnail,
    Rendition,
    Poster,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Variant => "variant",
            Self::Thumbnail => "thumbnail",
            Self::Rendition => "rendition",
            Self::Poster => "poster",
        }
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
    match (f.role, f.format) {
        (Role::Variant, _) => image(false),
        (Role::Thumbnail, _) => image(true),
        (Role::Poster, _) => image(f.crop.is_some()).map(|n| names::poster(&n)),
        (Role::Rendition, FileFormat::Mp4) => Some(names::rendition(f.width.min(f.height))),
        (Role::Rendition, _) => None,
    }
}
