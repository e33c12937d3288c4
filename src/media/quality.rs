//! Auto quality (`quality = "auto"`): every output scores at least the format's target on
//! SSIMULACRA2 (`fast-ssim2`; 100 = identical, 90 visually lossless at 1:1, 70 high, 50
//! medium), at the lowest encoder quality that does so and is not under its width's base.
//!
//! **Each output checked, from its width's base ([`base`]).** An output is encoded at the
//! quality its width bucket takes for the target, scored against its own pixels, and searched
//! upward only when it misses. The base is the rule that buys the most score per byte: each
//! output at its own lowest quality for one score spends bytes where they buy least (a busy
//! photo's wide variant climbs many steps for a point, an easy photo's loses many for few
//! bytes), so for sharp's mean score it needs more bytes than one fixed quality does (`cargo
//! bench --bench quality -- --ceiling`: WebP 1.02x sharp's bytes against 0.94x, JPEG 0.88x
//! against 0.83x); one quality per width bucket, every output still raised to the target,
//! needs far fewer ([`Curve::base`]). Scoring a WebP or JPEG costs 70-100 ns a pixel (4.5 ms
//! for a 320 px variant, 235 ms for a 1920 px one); an AVIF's decode adds to that. An animated
//! WebP variant is searched the same way ([`search`] takes any encoding and its score), every
//! frame at one quality, its score the worst of up to 8 sampled frames as shown
//! (`media::animation`).

use fast_ssim2::{PixelDescriptor, PixelSlice, Ssimulacra2Reference};

use super::vips::{Image, VipsError, WEBP_EFFORT};
use crate::contract::OutputFormat;

/// At most this many encodes and scores per output.
const MAX_STEPS: usize = 6;

/// How one format's score moves with its quality, and where its outputs start.
struct Curve {
    /// The qualities searched.
    lo: u8,
    hi: u8,
    /// The first quality tried for SSIMULACRA2 70: the corpus photos' mean.
    first: f64,
    /// Score gained per quality step near 70, roughly: a search's first step, and how far a
    /// target other than 70 moves [`Curve::first`] and [`Curve::base`]; later steps follow
    /// the slope between the last two tries (a secant), or interpolate once the target is
    /// bracketed.
    slope: f64,
    /// A quality that meets the target by at most this much is taken, rather than another
    /// encode and score for a step lower.
    close_enough: f64,
    /// The fewest quality steps that surely change the encoding: libheif gives libaom one
    /// quantiser per 1.6 of AVIF's (q28 and q29 are both 45).
    step: u8,
    /// The least quality at a target of 70 for outputs 320 px wide or less, 640 or less, and
    /// wider ([`base`]): one quality per width bucket buys the most score per byte, each output
    /// still raised to the target by the search.
    base: [f64; 3],
}

impl Curve {
    fn of(format: OutputFormat) -> Curve {
        match format {
            // jpegli, 4:4:4: 59.0 for SSIMULACRA2 70 on the 31 corpus photos 320 px wide, where
            // libjpeg-turbo needed 64.1 (issue 57's sweep, scored by ssimu2-lite), 0.44 a step.
            // Bases from `make bench-quality`'s `--ceiling` (70 outputs, each raised to 70):
            // the fewest bytes reaching sharp's mean were at q88/q63/q50, 0.734x its q82's,
            // where each output at its own lowest quality for one score needed 0.88x.
            OutputFormat::Jpeg => Curve {
                lo: 30,
                hi: 95,
                first: 59.0,
                slope: 0.45,
                // A step lower saves about 1 % of the bytes.
                close_enough: 1.0,
                step: 1,
                base: [88.0, 66.0, 50.0],
            },
            // libwebp 1.2.4, method 5. The ceiling's best: q84/q56/q50, 0.881x sharp's q80
            // bytes, against 1.02x for each output at its own quality for one score.
            OutputFormat::Webp => Curve {
                lo: 30,
                hi: 95,
                first: 64.0,
                slope: 0.45,
                close_enough: 1.0,
                step: 1,
                base: [86.0, 58.0, 50.0],
            },
            // libaom 3.6 through libheif, 4:4:4 ([`effort`]). `--ceiling avif` (70 outputs,
            // q35-q80, speed 5): one quality for all reaches sharp's mean near q46, at about its
            // bytes; one per width bucket with every output raised to a floor of 55 needed
            // 0.930x (q55/q35/q35; floor 50: 0.909x, 60: 0.991x, 70: 1.35x at a mean of 73.9).
            // So the narrow bucket carries the mean and the wider ones sit at the target. Scores
            // climb about 1.2 a step near it; each bucket's own quality for 70: 51, 54, 55. The
            // narrow base was then set on `make bench-quality` at target 56, where the mean
            // meets sharp's: 0.986x its bytes at 69.2 against 68.9, for 0.61x its CPU.
            OutputFormat::Avif => Curve {
                lo: 20,
                hi: 90,
                first: 53.0,
                slope: 1.2,
                // Two steps, about 6 % of the bytes: a wide AVIF encode costs seconds.
                close_enough: 2.5,
                step: 2,
                base: [70.0, 20.0, 20.0],
            },
        }
    }
}

/// What the search settled on for one output.
pub struct Found {
    pub quality: u8,
    /// The output's score at that quality (below the target only when even the top of the
    /// range missed it).
    pub score: f64,
    /// The output encoded at that quality.
    pub bytes: Vec<u8>,
}

/// The scorer of one image: its reference computed once for every candidate encoding.
pub struct Scorer {
    reference: Ssimulacra2Reference,
}

impl Scorer {
    pub fn new(image: &Image) -> Result<Scorer, VipsError> {
        let reference = with_slice(image, Ssimulacra2Reference::new)?;
        Ok(Scorer { reference })
    }

    /// SSIMULACRA2 of `encoded` (decoded again) against the image.
    pub fn score(&self, encoded: &[u8]) -> Result<f64, VipsError> {
        let decoded = Image::from_buffer(encoded)?;
        with_slice(&decoded, |s| self.reference.compare(s))
    }

    /// The lowest quality of `format` (within its range, and not under the base for
    /// `image`'s width and `target`) whose encoding of `image` scores at least `target`
    /// ([`search`]).
    pub fn search(
        &self,
        image: &Image,
        format: OutputFormat,
        target: f64,
    ) -> Result<Found, VipsError> {
        let effort = effort(format, image.width());
        search(format, image.width(), target, |q| {
            let bytes = image.encode(format, q, effort)?;
            let score = self.score(&bytes)?;
            Ok((bytes, score))
        })
    }

    /// SSIMULACRA2 of 8-bit sRGB `pixels` (RGB, or RGBA), `width` x `height`, against the image.
    pub fn score_pixels(
        &self,
        pixels: &[u8],
        width: u32,
        height: u32,
        bands: u32,
    ) -> Result<f64, VipsError> {
        with_pixels(pixels, width, height, bands, |s| self.reference.compare(s))
    }
}

/// The lowest quality of `format` (within its range, and not under the base for an output
/// `width` px wide and `target`) at which `attempt` (an encoding at that quality and its
/// score) scores at least `target`: a bracketing search that interpolates between the
/// qualities it tried, from the format's first guess, or its base when higher.
pub fn search(
    format: OutputFormat,
    width: u32,
    target: f64,
    mut attempt: impl FnMut(u8) -> Result<(Vec<u8>, f64), VipsError>,
) -> Result<Found, VipsError> {
    let curve = Curve::of(format);
    let (lo, hi) = (base(format, width, target), curve.hi);
    let start = (curve.first + (target - 70.0) / curve.slope).clamp(lo as f64, hi as f64) as u8;
    // The highest quality known to miss and the lowest known to meet, with their scores.
    let mut miss: Option<(u8, f64)> = None;
    let mut met: Option<(u8, f64, Vec<u8>)> = None;
    // The top of the range, once tried and missed: what ships when nothing meets.
    let mut top: Option<Found> = None;
    // Steps aim at the middle of the accepted window: a step that lands a little off still
    // meets the target by at most `close_enough`.
    let aim = target + curve.close_enough / 2.0;
    let mut last: Option<(u8, f64)> = None;
    let mut q = start;
    for _ in 0..MAX_STEPS {
        let (bytes, score) = attempt(q)?;
        let slope = match last {
            Some((q0, s0)) if q0 != q => {
                let s = (score - s0) / (q as f64 - q0 as f64);
                s.clamp(curve.slope * 4.0 / 9.0, curve.slope * 20.0 / 9.0)
            }
            _ => curve.slope,
        };
        last = Some((q, score));
        if score >= target {
            met = Some((q, score, bytes));
            if score - target <= curve.close_enough {
                break;
            }
        } else {
            miss = Some((q, score));
            if q == hi {
                top = Some(Found {
                    quality: q,
                    score,
                    bytes,
                });
            }
        }
        let next = match (&miss, &met) {
            (Some((a, _)), Some((b, ..))) if b - a <= curve.step => break,
            (Some((a, sa)), Some((b, sb, _))) => {
                // Linear between the two, kept strictly inside.
                let t = ((aim - sa) / (sb - sa).max(1e-6)).clamp(0.0, 1.0);
                let q = *a as f64 + t * (b - a) as f64;
                (q.round() as u8).clamp(a + curve.step.min(b - a - 1), b - 1)
            }
            (None, Some((b, ..))) if *b == lo => break,
            (None, Some((b, sb, _))) => {
                let down = ((sb - aim) / slope).floor().max(curve.step as f64) as u8;
                b.saturating_sub(down).max(lo)
            }
            (Some((a, _)), None) if *a == hi => break,
            (Some((a, sa)), None) => {
                let up = ((aim - sa) / slope).ceil().max(curve.step as f64) as u8;
                a.saturating_add(up).min(hi)
            }
            (None, None) => unreachable!("one was just set"),
        };
        q = next;
    }
    if let Some((quality, score, bytes)) = met {
        return Ok(Found {
            quality,
            score,
            bytes,
        });
    }
    // Not met even at the top of the range (or not within the steps): the top.
    if let Some(top) = top {
        return Ok(top);
    }
    let (bytes, score) = attempt(hi)?;
    Ok(Found {
        quality: hi,
        score,
        bytes,
    })
}

/// The least quality of an output of `format` `width` px wide at `target`: its width bucket's
/// base ([`Curve::base`]), moved by the format's slope for targets other than 70. The narrower
/// buckets sit a little above the ceiling study's best, for a margin on the mean: the worker
/// scores against its own pixels, the bench against a Pillow downscale of the source.
pub fn base(format: OutputFormat, width: u32, target: f64) -> u8 {
    let curve = Curve::of(format);
    let bucket = match width {
        0..=320 => 0,
        321..=640 => 1,
        _ => 2,
    };
    let q = (curve.base[bucket] + (target - 70.0) / curve.slope).round();
    q.clamp(curve.lo as f64, curve.hi as f64) as u8
}

/// The encoder effort of `format` at `width` (libvips' scale). AVIF: libaom's speed 5 (sharp's)
/// up to 320 px, where the outputs sit at their base, and 6 wider, where they are searched: on
/// 29 corpus outputs at sharp's mean SSIMULACRA2, speed 6 took 1.11x speed 5's bytes for 0.29x
/// its CPU (speed 7: 1.19x, 0.18x). WebP keeps method 5 ([`WEBP_EFFORT`]) at every width: 4
/// above 640 px saved 3 % of the CPU of the `variants` profile on the corpus photos for 1.8 %
/// more bytes of those variants, the bulk of the bytes. JPEG has none.
pub fn effort(format: OutputFormat, width: u32) -> u8 {
    match (format, width) {
        (OutputFormat::Webp, _) => WEBP_EFFORT,
        (OutputFormat::Avif, 0..=320) => 4,
        (OutputFormat::Avif, _) => 3,
        (OutputFormat::Jpeg, _) => 0,
    }
}

/// Runs `f` over the 8-bit sRGB pixels of an image in memory (RGB, or RGBA with alpha).
fn with_slice<T>(
    image: &Image,
    f: impl FnOnce(&PixelSlice<'_>) -> Result<T, fast_ssim2::Ssimulacra2Error>,
) -> Result<T, VipsError> {
    let pixels = image.pixels()?;
    with_pixels(pixels, image.width(), image.height(), image.bands(), f)
}

/// Runs `f` over 8-bit sRGB `pixels`, `width` x `height`, of `bands` (3, or 4 with alpha, which
/// fast-ssim2 composites onto a dark and a light grey, taking the worse score, as the reference
/// ssimulacra2 tool does).
fn with_pixels<T>(
    pixels: &[u8],
    width: u32,
    height: u32,
    bands: u32,
    f: impl FnOnce(&PixelSlice<'_>) -> Result<T, fast_ssim2::Ssimulacra2Error>,
) -> Result<T, VipsError> {
    let descriptor = match bands {
        3 => PixelDescriptor::RGB8_SRGB,
        4 => PixelDescriptor::RGBA8_SRGB,
        n => return Err(VipsError(format!("scoring: {n} bands"))),
    };
    let stride = width as usize * bands as usize;
    let slice = PixelSlice::new(pixels, width, height, stride, descriptor)
        .map_err(|e| VipsError(format!("scoring: {e}")))?;
    f(&slice).map_err(|e| VipsError(format!("scoring: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bases_are_per_width_bucket_and_move_with_the_target() {
        let webp = |w, t| base(OutputFormat::Webp, w, t);
        let (narrow, mid, wide) = (webp(320, 70.0), webp(640, 70.0), webp(1920, 70.0));
        assert_eq!(webp(100, 70.0), narrow);
        assert_eq!(webp(321, 70.0), mid);
        assert_eq!(webp(641, 70.0), wide);
        // 4.5 points of score: 10 steps.
        assert_eq!(webp(1920, 74.5), wide + 10);
        // Never outside the format's range.
        assert_eq!(base(OutputFormat::Jpeg, 320, 30.0), 30);
        assert_eq!(base(OutputFormat::Avif, 320, 95.0), 90);
    }
}
