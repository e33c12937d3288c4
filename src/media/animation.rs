//! Animated GIF and WebP inputs: their WebP variants stay animated. Every frame is kept with
//! its delay, zero-duration frames included, and the animation plays as many times as the
//! source does; the other formats, the thumbnail and the analysis take the first frame.
//!
//! The frames are assembled with libwebpmux ([`webpmux::animate`]), not libvips' saver:
//! libwebp's animation encoder turns a 0 ms frame into 100 ms and merges identical frames.
//! After the first, a frame only holds the rectangle where it differs from the frame before
//! (the rest of the canvas stays), so a mostly still animation costs little more than a still.
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

    /// Frame `i` upright, `scale`d (below 1: smaller), 8-bit sRGB without metadata, in memory:
    /// the pixels its WebP frame is encoded from.
    fn frame(&self, i: usize, scale: f64) -> Result<Image, VipsError> {
        let page = self.strip.page_height();
        let mut frame = self
            .strip
            .extract(0, i as u32 * page, self.strip.width(), page)?;
        if self.orientation != 1 {
            frame = frame.autorot()?;
        }
        if scale < 1.0 {
            frame = frame.resize(scale)?;
        }
        frame.to_srgb8()?.without_metadata()?.into_memory()
    }

    /// The scale of a variant `width` px wide (never wider than the source).
    fn scale(&self, width: u32) -> f64 {
        width.min(self.width) as f64 / self.width as f64
    }

    /// Visits each frame of the variant `width` px wide as it is encoded from (for tools that
    /// score the variant against them).
    pub fn frames_at(
        &self,
        width: u32,
        mut visit: impl FnMut(usize, &Image),
    ) -> Result<(), VipsError> {
        for i in 0..self.delays.len() {
            visit(i, &self.frame(i, self.scale(width))?);
        }
        Ok(())
    }

    /// Writes the animation `width` px wide (never wider than the source) as animated WebP at
    /// `quality`, without metadata; returns its size.
    pub fn save_webp(&self, width: u32, quality: u8, path: &Path) -> Result<(u32, u32), VipsError> {
        let scale = self.scale(width);
        let mut frames = Vec::with_capacity(self.delays.len());
        let mut size = (0, 0);
        let mut before: Vec<u8> = Vec::new();
        for (i, delay) in self.delays.iter().enumerate() {
            let frame = self.frame(i, scale)?;
            size = (frame.width(), frame.height());
            let pixels = frame.pixels()?;
            let bands = frame.bands() as usize;
            let rect = match i {
                0 => Rect::whole(size),
                // An unchanged frame still counts, for its delay: one pixel, as it was.
                _ => changed(&before, pixels, size.0, bands).unwrap_or(Rect::PIXEL),
            };
            let webp = if rect == Rect::whole(size) {
                frame.encode_webp(quality, super::vips::WEBP_EFFORT, |b| Ok(b.to_vec()))?
            } else {
                frame
                    .extract(rect.x, rect.y, rect.width, rect.height)?
                    .encode_webp(quality, super::vips::WEBP_EFFORT, |b| Ok(b.to_vec()))?
            };
            before.clear();
            before.extend_from_slice(pixels);
            frames.push(Frame {
                webp,
                x: rect.x,
                y: rect.y,
                duration_ms: *delay,
            });
        }
        let bytes = webpmux::animate(&frames, size, self.loop_count).map_err(VipsError)?;
        std::fs::write(path, bytes).map_err(|e| VipsError(format!("webpsave: {e}")))?;
        Ok(size)
    }
}

/// A rectangle of a frame, in pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rect {
    pub x: u32,
    pub y: u32,
    pub width: u32,
    pub height: u32,
}

impl Rect {
    const PIXEL: Rect = Rect {
        x: 0,
        y: 0,
        width: 1,
        height: 1,
    };

    fn whole((width, height): (u32, u32)) -> Rect {
        Rect {
            x: 0,
            y: 0,
            width,
            height,
        }
    }
}

/// The smallest rectangle holding every pixel where frames `a` and `b` (`width` px wide,
/// `bands` bytes a pixel) differ, its left and top moved to even coordinates (WebP stores frame
/// offsets halved); `None` when they are equal.
pub fn changed(a: &[u8], b: &[u8], width: u32, bands: usize) -> Option<Rect> {
    let row = width as usize * bands;
    let (mut left, mut right, mut top, mut bottom) = (usize::MAX, 0, usize::MAX, 0);
    for (y, (ra, rb)) in a.chunks_exact(row).zip(b.chunks_exact(row)).enumerate() {
        if ra == rb {
            continue;
        }
        let first = ra.iter().zip(rb).position(|(p, q)| p != q)? / bands;
        let last = row / bands
            - 1
            - ra.iter()
                .rev()
                .zip(rb.iter().rev())
                .position(|(p, q)| p != q)?
                / bands;
        (top, bottom) = (top.min(y), y);
        (left, right) = (left.min(first), right.max(last));
    }
    if top == usize::MAX {
        return None;
    }
    let (x, y) = (left as u32 & !1, top as u32 & !1);
    Some(Rect {
        x,
        y,
        width: right as u32 + 1 - x,
        height: bottom as u32 + 1 - y,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_keeps_only_what_changed_from_an_even_corner() {
        // 5 x 4, one byte a pixel.
        let a = vec![0u8; 20];
        assert_eq!(changed(&a, &a, 5, 1), None);
        let mut b = a.clone();
        b[2 * 5 + 3] = 9; // (3, 2)
        assert_eq!(
            changed(&a, &b, 5, 1),
            Some(Rect {
                x: 2,
                y: 2,
                width: 2,
                height: 1
            })
        );
        b[3 * 5 + 4] = 9; // (4, 3)
        b[5 + 1] = 9; // (1, 1)
        assert_eq!(
            changed(&a, &b, 5, 1),
            Some(Rect {
                x: 0,
                y: 0,
                width: 5,
                height: 4
            })
        );
        // Two bytes a pixel: the second byte of pixel (2, 0) alone.
        let (a, mut b) = (vec![0u8; 8], vec![0u8; 8]);
        b[5] = 1;
        assert_eq!(
            changed(&a, &b, 4, 2),
            Some(Rect {
                x: 2,
                y: 0,
                width: 1,
                height: 1
            })
        );
    }
}
