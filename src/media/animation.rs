//! Animated GIF and WebP inputs: their WebP variants stay animated. Every frame is kept with
//! its delay, zero-duration frames included, and the animation plays as many times as the
//! source does; the other formats, the thumbnail and the analysis take the first frame.
//!
//! The frames are assembled with libwebpmux ([`webpmux::animate`]), not libvips' saver:
//! libwebp's animation encoder turns a 0 ms frame into 100 ms and merges identical frames.
//! After the first, a frame only holds the rectangle where it differs from the frame before
//! (the rest of the canvas stays), so a mostly still animation costs little more than a still.
//! One frame at a time is decoded: the decoder's strip of frames stays lazy.
//!
//! **Auto quality ([`Animation::webp_for`]).** An animated variant is checked against its
//! target as a still is, and searched upward from its width's base when it misses
//! ([`quality::search`]); each try encodes every frame at one quality. Its score is the
//! **worst of up to [`SAMPLES`] frames**, taken at evenly spaced moments of one play
//! ([`sampled`]), each scored as a viewer sees it (the canvas after that frame, its unchanged
//! parts still those of earlier frames) against the pixels it was encoded from. The worst,
//! not a mean or a percentile: the target is a floor each output promises, a mean would let a
//! hard frame (a cut, a flash of detail) hide under easy ones, and of 8 samples any low
//! percentile is the worst or the next. Sampling by time, not by number, never scores a frame
//! nobody sees (0 ms) and weighs frames as long as they show. Frames are sampled rather than
//! all scored because a long animation has hundreds; each try decodes each frame once and its
//! score reuses that decode, and each sampled frame's reference is made once per variant.

use std::path::Path;

use super::error::MediaError;
use super::probe::Probe;
use super::quality::{self, Found, Scorer};
use super::vips::{Image, VipsError};
use super::webpmux::{self, Frame};
use crate::contract::OutputFormat;

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

    /// The animation `width` px wide (never wider than the source) as animated WebP at
    /// `quality`, without metadata; with `check`, also its score ([`Check`]).
    pub fn webp(
        &self,
        width: u32,
        quality: u8,
        mut check: Option<&mut Check>,
    ) -> Result<Webp, VipsError> {
        let scale = self.scale(width);
        let mut frames = Vec::with_capacity(self.delays.len());
        let mut size = (0, 0);
        let mut before: Vec<u8> = Vec::new();
        let mut shown = Shown::default();
        for (i, delay) in self.delays.iter().enumerate() {
            let frame = self.frame(i, scale)?;
            size = (frame.width(), frame.height());
            let pixels = frame.pixels()?;
            let bands = frame.bands();
            let rect = match i {
                0 => Rect::whole(size),
                // An unchanged frame still counts, for its delay: one pixel, as it was.
                _ => changed(&before, pixels, size.0, bands as usize).unwrap_or(Rect::PIXEL),
            };
            let webp = if rect == Rect::whole(size) {
                frame.encode_webp(quality, super::vips::WEBP_EFFORT, |b| Ok(b.to_vec()))?
            } else {
                frame
                    .extract(rect.x, rect.y, rect.width, rect.height)?
                    .encode_webp(quality, super::vips::WEBP_EFFORT, |b| Ok(b.to_vec()))?
            };
            if let Some(check) = check.as_deref_mut().filter(|c| i <= c.last()) {
                shown.paint(&Image::from_buffer(&webp)?, rect, size, bands)?;
                check.frame(i, &frame, &shown)?;
            }
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
        let score = check.map(|c| c.score());
        Ok(Webp { bytes, size, score })
    }

    /// The animation `width` px wide as animated WebP at the lowest quality whose score
    /// ([`Check`]) meets `target`, searched as a still's is ([`quality::search`]).
    pub fn webp_for(&self, width: u32, target: f64) -> Result<(Found, (u32, u32)), VipsError> {
        let mut check = Check::new(sampled(&self.delays));
        let mut size = (0, 0);
        let found = quality::search(OutputFormat::Webp, width, target, |q| {
            let webp = self.webp(width, q, Some(&mut check))?;
            size = webp.size;
            Ok((webp.bytes, webp.score.expect("checked")))
        })?;
        Ok((found, size))
    }
}

/// An animated WebP.
pub struct Webp {
    pub bytes: Vec<u8>,
    /// One frame's size.
    pub size: (u32, u32),
    /// The animation's score ([`Check`]), when it was checked.
    pub score: Option<f64>,
}

/// At most this many frames of an animation are scored ([`sampled`]).
pub const SAMPLES: usize = 8;

/// The frames an animation's score is taken on: the frame showing at the middle of each of
/// [`SAMPLES`] equal spans of one play, each once (a frame shown for 0 ms is never seen, so
/// never sampled); evenly by number when no frame has a duration.
pub fn sampled(delays: &[u32]) -> Vec<usize> {
    let total: u64 = delays.iter().map(|d| *d as u64).sum();
    let n = SAMPLES.min(delays.len());
    let mut picked: Vec<usize> = if total == 0 {
        (0..n).map(|k| k * delays.len() / n).collect()
    } else {
        let mut ends = delays.iter().scan(0u64, |t, d| {
            *t += *d as u64;
            Some(*t)
        });
        let mut frame = 0;
        let mut end = ends.next().unwrap_or(0);
        (0..n as u64)
            .map(|k| {
                // The middle of span k, in units of 1 / (2 n) of the play.
                let at = (2 * k + 1) * total;
                while end.saturating_mul(2 * n as u64) <= at {
                    end = ends.next().unwrap_or(u64::MAX);
                    frame += 1;
                }
                frame
            })
            .collect()
    };
    picked.dedup();
    picked
}

/// The scoring of an animation: each sampled frame ([`sampled`]) as a viewer sees it (the
/// canvas after that frame is drawn) against the pixels it was encoded from, and the worst of
/// those ([`Check::score`]). Each sampled frame's reference is computed once, on the first
/// encoding, and kept for the search's next ones.
pub struct Check {
    samples: Vec<usize>,
    scorers: Vec<Option<Scorer>>,
    scores: Vec<f64>,
}

impl Check {
    pub fn new(samples: Vec<usize>) -> Check {
        let n = samples.len();
        Check {
            samples,
            scorers: (0..n).map(|_| None).collect(),
            scores: Vec::with_capacity(n),
        }
    }

    /// The last frame scored.
    fn last(&self) -> usize {
        self.samples.last().copied().unwrap_or(0)
    }

    /// Scores `shown` (the canvas after frame `i`) against `frame`, when `i` is sampled.
    fn frame(&mut self, i: usize, frame: &Image, shown: &Shown) -> Result<(), VipsError> {
        let Some(k) = self.samples.iter().position(|s| *s == i) else {
            return Ok(());
        };
        let scorer = match &mut self.scorers[k] {
            Some(s) => s,
            slot => slot.insert(Scorer::new(frame)?),
        };
        let (w, h) = (frame.width(), frame.height());
        self.scores
            .push(scorer.score_pixels(&shown.pixels, w, h, shown.bands)?);
        Ok(())
    }

    /// The worst score of this encoding's sampled frames, and ready for the next encoding.
    fn score(&mut self) -> f64 {
        let worst = self.scores.iter().copied().fold(f64::INFINITY, f64::min);
        self.scores.clear();
        worst
    }
}

/// The canvas a viewer sees, painted frame by frame as the muxed animation draws it: each
/// frame's rectangle replaces what was under it ([`webpmux::animate`]: no blending, no
/// disposal).
#[derive(Default)]
struct Shown {
    pixels: Vec<u8>,
    bands: u32,
}

impl Shown {
    /// Paints `decoded` (a frame's rectangle `rect`, as decoded) on a canvas of `size` and
    /// `bands` (a decoded rectangle without alpha is opaque).
    fn paint(
        &mut self,
        decoded: &Image,
        rect: Rect,
        size: (u32, u32),
        bands: u32,
    ) -> Result<(), VipsError> {
        let len = size.0 as usize * size.1 as usize * bands as usize;
        if self.pixels.len() != len || self.bands != bands {
            (self.pixels, self.bands) = (vec![0; len], bands);
        }
        let (from, db) = (decoded.pixels()?, decoded.bands() as usize);
        if (decoded.width(), decoded.height()) != (rect.width, rect.height) {
            return Err(VipsError(format!(
                "a {}x{} frame decoded as {}x{}",
                rect.width,
                rect.height,
                decoded.width(),
                decoded.height()
            )));
        }
        let b = bands as usize;
        for y in 0..rect.height as usize {
            let row = &from[y * rect.width as usize * db..][..rect.width as usize * db];
            let at = ((rect.y as usize + y) * size.0 as usize + rect.x as usize) * b;
            let to = &mut self.pixels[at..at + rect.width as usize * b];
            for (p, q) in to.chunks_exact_mut(b).zip(row.chunks_exact(db)) {
                let n = b.min(db);
                p[..n].copy_from_slice(&q[..n]);
                if b > db {
                    p[db..].fill(u8::MAX);
                }
            }
        }
        Ok(())
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
    fn frames_are_sampled_at_even_moments_of_one_play_never_at_0_ms() {
        // sharp's animated-loop-3.webp: nine frames of 3 s, the last of 15 s.
        let mut delays = vec![3000; 9];
        delays.push(15000);
        assert_eq!(sampled(&delays), [0, 2, 4, 6, 7, 9]);
        // A frame shown for 0 ms is never what a moment shows.
        assert_eq!(sampled(&[0, 100, 0, 100]), [1, 3]);
        // Without any duration: evenly by number.
        assert_eq!(sampled(&[0; 20]), [0, 2, 5, 7, 10, 12, 15, 17]);
        // Fewer frames than samples: each once.
        assert_eq!(sampled(&[10, 10]), [0, 1]);
        // Many frames: SAMPLES of them, the middle of each span.
        assert_eq!(sampled(&[50; 800]), [50, 150, 250, 350, 450, 550, 650, 750]);
    }

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
