//! Animated GIF and WebP inputs: their WebP variants stay animated. Every frame is kept with
//! its delay, zero-duration frames included, and the animation plays as many times as the
//! source does; the other formats, the thumbnail and the analysis take the first frame.
//!
//! The frames are assembled with libwebpmux ([`webpmux::animate`]), not libvips' saver:
//! libwebp's animation encoder turns a 0 ms frame into 100 ms and merges identical frames.
//! One frame at a time is in memory: the decoder's strip of frames stays lazy.

use std::path::Path;

use super::error::MediaError;
use super::probe::Probe;
use super::vips::{Image, VipsError};
use super::webpmux::{self, Frame};

/// A decoder's view of every frame, and how they play.
pub struct Animation {
    /// The frames one under the other, as stored (orientation not applied), not decoded yet.
    strip: Image,
    orientation: u8,
    /// Upright size of one frame.
    width: u32,
    delays: Vec<u32>,
    loop_count: u32,
}

/// A GIF frame that says nothing of its delay shows for 100 ms, as browsers show it.
const DEFAULT_DELAY_MS: u32 = 100;

impl Animation {
    /// Opens every frame of `input` (an image `probe` found more than one frame in).
    pub fn open(input: &Path, probe: &Probe) -> Result<Animation, MediaError> {
        let strip = Image::open_frames(input).map_err(|e| MediaError::Corrupt(e.0))?;
        let frames = probe.frames;
        let stored = if probe.orientation >= 5 {
            probe.height
        } else {
            probe.width
        };
        if strip.width() != stored || strip.height() != strip.page_height() * frames {
            return Err(MediaError::Corrupt(format!(
                "{frames} frames do not make a {}x{} strip",
                strip.width(),
                strip.height()
            )));
        }
        let mut delays = strip.delays();
        delays.resize(frames as usize, DEFAULT_DELAY_MS);
        Ok(Animation {
            loop_count: strip.loop_count(),
            strip,
            orientation: probe.orientation,
            width: probe.width,
            delays,
        })
    }

    pub fn frames(&self) -> u32 {
        self.delays.len() as u32
    }

    /// How long one play lasts.
    pub fn duration_ms(&self) -> u64 {
        self.delays.iter().map(|d| *d as u64).sum()
    }

    /// Each frame's delay, in milliseconds.
    pub fn delays(&self) -> &[u32] {
        &self.delays
    }

    /// Writes the animation `width` px wide (never wider than the source) as animated WebP at
    /// `quality`, without metadata; returns its size.
    pub fn save_webp(&self, width: u32, quality: u8, path: &Path) -> Result<(u32, u32), VipsError> {
        let page = self.strip.page_height();
        let scale = width.min(self.width) as f64 / self.width as f64;
        let mut frames = Vec::with_capacity(self.delays.len());
        let mut size = (0, 0);
        for (i, delay) in self.delays.iter().enumerate() {
            let mut frame = self
                .strip
                .extract(0, i as u32 * page, self.strip.width(), page)?;
            if self.orientation != 1 {
                frame = frame.autorot()?;
            }
            if scale < 1.0 {
                frame = frame.resize(scale)?;
            }
            let frame = frame.to_srgb8()?.without_metadata()?;
            size = (frame.width(), frame.height());
            frames.push(Frame {
                webp: frame.encode_webp(quality, |b| Ok(b.to_vec()))?,
                duration_ms: *delay,
            });
        }
        let bytes = webpmux::animate(&frames, size, self.loop_count).map_err(VipsError)?;
        std::fs::write(path, bytes).map_err(|e| VipsError(format!("webpsave: {e}")))?;
        Ok(size)
    }
}
