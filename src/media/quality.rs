//! Auto quality (`quality = "auto"`): every output scores at least the format's target on
//! SSIMULACRA2 (`fast-ssim2`; 100 = identical, 90 visually lossless at 1:1, 70 high, 50
//! medium), at the lowest encoder quality that does so and is not under its width's base.
//!
//! **WebP and JPEG: each output checked, from its width's base ([`base`]).** An output is
//! encoded at the quality its width bucket takes for the target, scored against its own pixels,
//! and searched upward only when it misses. The base is the rule that buys the most score per
//! byte: each output at its own lowest quality for one score spends bytes where they buy least
//! (a busy photo's wide variant climbs many steps for a point, an easy photo's loses many for
//! few bytes), so for sharp's mean score it needs more bytes than one fixed quality does
//! (`cargo bench --bench quality -- --ceiling`: WebP 1.02x sharp's bytes against 0.94x, JPEG
//! 0.88x against 0.83x); one quality per width bucket, every output still raised to the
//! target, needs far fewer ([`BASE`]). Scoring costs 70-100 ns a
//! pixel (4.5 ms for a 320 px variant, 235 ms for a 1920 px one), once per output that meets
//! its base.
//!
//! **AVIF: one search on a proxy, carried to the wider variants ([`carry`]).** An AVIF encode
//! of a wide variant costs seconds, so the search runs on one small image, the proxy: the
//! narrowest variant, whose winning encoding ships as is. The wider variants take the proxy's
//! quality with a per-width correction measured on the corpus (`cargo bench --bench quality --
//! --calibrate` finds each width's own lowest quality): steps above the proxy's quality
//! ([`CARRY`]).

use fast_ssim2::{PixelDescriptor, PixelSlice, Ssimulacra2Reference};

use super::vips::{Image, VipsError, WEBP_EFFORT};
use crate::contract::OutputFormat;

/// The proxy: the narrowest variant when it is at most this wide, else a downscale to
/// [`PROXY_WIDTH`].
pub const MAX_PROXY_WIDTH: u32 = 640;
pub const PROXY_WIDTH: u32 = 320;

/// At most this many encodes and scores per image and format.
const MAX_STEPS: usize = 6;
/// Score gained per quality step near SSIMULACRA2 70, roughly (0.35-0.5 on the corpus photos):
/// a search's first step; later steps follow the slope between the last two tries (a secant),
/// or interpolate once the target is bracketed.
const SLOPE: f64 = 0.45;
/// A quality that meets the target by at most this much is taken: a step lower would save
/// about 1 % of the bytes, for another encode and score.
const CLOSE_ENOUGH: f64 = 1.0;

/// The qualities searched, and the first tried: the corpus photos' mean for SSIMULACRA2 70.
/// JPEG (jpegli, 4:4:4): 59.0 on the 31 corpus photos 320 px wide, where libjpeg-turbo needed
/// 64.1 (issue 57's sweep, scored by ssimu2-lite); its score gains 0.44 a step near 70, as
/// [`SLOPE`] says.
fn range(format: OutputFormat) -> (u8, u8, u8) {
    match format {
        OutputFormat::Jpeg => (30, 95, 59),
        OutputFormat::Webp => (30, 95, 64),
        OutputFormat::Avif => (20, 90, 50),
    }
}

/// What the search settled on for one format.
pub struct Found {
    pub quality: u8,
    /// The proxy's score at that quality (below the target only when even the top of the range
    /// missed it).
    pub score: f64,
    /// The proxy encoded at that quality: it ships as the proxy's output.
    pub bytes: Vec<u8>,
}

/// The scorer of one proxy: its reference computed once for every candidate.
pub struct Scorer {
    reference: Ssimulacra2Reference,
}

impl Scorer {
    pub fn new(proxy: &Image) -> Result<Scorer, VipsError> {
        let reference = with_slice(proxy, Ssimulacra2Reference::new)?;
        Ok(Scorer { reference })
    }

    /// SSIMULACRA2 of `encoded` (decoded again) against the proxy.
    pub fn score(&self, encoded: &[u8]) -> Result<f64, VipsError> {
        let decoded = Image::from_buffer(encoded)?;
        with_slice(&decoded, |s| self.reference.compare(s))
    }

    /// The lowest quality (within the format's range, and not under `from`) whose encoding of
    /// `proxy` scores at least `target`: a bracketing search that interpolates between the
    /// qualities it tried, from the format's first guess (or `from`, when higher).
    pub fn search(
        &self,
        proxy: &Image,
        format: OutputFormat,
        effort: u8,
        target: f64,
        from: Option<u8>,
    ) -> Result<Found, VipsError> {
        let (lo, hi, start) = range(format);
        let lo = from.map_or(lo, |from| from.clamp(lo, hi));
        let start = (start as f64 + (target - 70.0) / SLOPE).clamp(lo as f64, hi as f64) as u8;
        // The highest quality known to miss and the lowest known to meet, with their scores.
        let mut miss: Option<(u8, f64)> = None;
        let mut met: Option<(u8, f64, Vec<u8>)> = None;
        // The top of the range, once tried and missed: what ships when nothing meets.
        let mut top: Option<Found> = None;
        // Steps aim at the middle of the accepted window: a step that lands a little off still
        // meets the target by at most CLOSE_ENOUGH.
        let aim = target + CLOSE_ENOUGH / 2.0;
        let mut last: Option<(u8, f64)> = None;
        let mut q = start;
        for _ in 0..MAX_STEPS {
            let bytes = proxy.encode(format, q, effort)?;
            let score = self.score(&bytes)?;
            let slope = match last {
                Some((q0, s0)) if q0 != q => {
                    ((score - s0) / (q as f64 - q0 as f64)).clamp(0.2, 1.0)
                }
                _ => SLOPE,
            };
            last = Some((q, score));
            if score >= target {
                met = Some((q, score, bytes));
                if score - target <= CLOSE_ENOUGH {
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
                (Some((a, _)), Some((b, ..))) if b - a <= 1 => break,
                (Some((a, sa)), Some((b, sb, _))) => {
                    // Linear between the two, kept strictly inside.
                    let t = ((aim - sa) / (sb - sa).max(1e-6)).clamp(0.0, 1.0);
                    let q = *a as f64 + t * (b - a) as f64;
                    (q.round() as u8).clamp(a + 1, b - 1)
                }
                (None, Some((b, ..))) if *b == lo => break,
                (None, Some((b, sb, _))) => {
                    let down = ((sb - aim) / slope).floor().max(1.0) as u8;
                    b.saturating_sub(down).max(lo)
                }
                (Some((a, _)), None) if *a == hi => break,
                (Some((a, sa)), None) => {
                    let up = ((aim - sa) / slope).ceil().max(1.0) as u8;
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
        let bytes = proxy.encode(format, hi, effort)?;
        Ok(Found {
            quality: hi,
            score: self.score(&bytes)?,
            bytes,
        })
    }
}

/// Widths (as multiples of the proxy's) at which [`CARRY`] was measured.
const RATIOS: [f64; 5] = [1.0, 1.6, 2.5, 4.5, 6.0];

/// AVIF's quality steps above its proxy's at each of [`RATIOS`], fitted to the 36 corpus
/// images at SSIMULACRA2 70 (`cargo bench --bench quality -- --calibrate`) so that every
/// variant of those meets its target.
const CARRY: [f64; 5] = [0.0, 3.0, 6.0, 14.0, 19.0];

/// The base qualities of WebP and JPEG at a target of 70, for outputs 320 px wide or less, 640
/// or less, and wider ([`base`]). From `make bench-quality`'s `--ceiling` on the corpus photos
/// (70 outputs per format, libwebp 1.2.4, jpegli), each output raised to SSIMULACRA2 70: the
/// fewest bytes reaching sharp's mean score were at q84/q56/q50 for WebP (0.881x sharp's q80
/// bytes) and q88/q63/q50 for JPEG (0.734x its q82), where each output at its own lowest
/// quality for one score needed 1.02x and 0.88x. The narrower buckets are a little higher here,
/// for a margin on the mean: the worker scores against its own pixels, the bench against a
/// Pillow downscale of the source. A wide base of 50 leaves the wide outputs to the target.
const BASE: [(OutputFormat, [f64; 3]); 2] = [
    (OutputFormat::Webp, [86.0, 58.0, 50.0]),
    (OutputFormat::Jpeg, [88.0, 66.0, 50.0]),
];

/// Whether `format` is searched on the proxy and carried to the wider variants (AVIF), rather
/// than checked on every output from a [`BASE`].
pub fn on_proxy(format: OutputFormat) -> bool {
    !BASE.iter().any(|(f, _)| *f == format)
}

/// The least quality of an output of `format` `width` px wide at `target`: [`BASE`], moved by
/// [`SLOPE`] for other targets (a step per 0.45 of score). `None` for a format searched on a
/// proxy (AVIF).
pub fn base(format: OutputFormat, width: u32, target: f64) -> Option<u8> {
    let (_, base) = BASE.iter().find(|(f, _)| *f == format)?;
    let bucket = match width {
        0..=320 => 0,
        321..=640 => 1,
        _ => 2,
    };
    let (lo, hi, _) = range(format);
    let q = (base[bucket] + (target - 70.0) / SLOPE).round();
    Some(q.clamp(lo as f64, hi as f64) as u8)
}

/// The AVIF quality of a variant `width` px wide whose proxy, `proxy_width` px wide, needed
/// `quality` ([`CARRY`]), within the format's range.
pub fn carry(quality: u8, proxy_width: u32, width: u32) -> u8 {
    let (lo, hi, _) = range(OutputFormat::Avif);
    let ratio = width as f64 / proxy_width as f64;
    let q = quality as f64 + at_ratio(&CARRY, ratio);
    (q.ceil() as i32).clamp(lo as i32, hi as i32) as u8
}

/// `values` (measured at [`RATIOS`]) at `ratio`: the value of the first measured ratio at or
/// above it (each was fitted to every width up to it), the last beyond them.
fn at_ratio(values: &[f64; 5], ratio: f64) -> f64 {
    let i = RATIOS.iter().position(|r| ratio <= *r + 1e-9);
    values[i.unwrap_or(RATIOS.len() - 1)]
}

/// The encoder effort of `format` at `width` (libvips' scale). AVIF's falls as the width grows
/// (libaom's speed 5 to 7). WebP keeps method 5 ([`WEBP_EFFORT`]) at every width: 4 above 640 px
/// saved 3 % of the CPU of the `variants` profile on the corpus photos for 1.8 % more bytes of
/// those variants, the bulk of the bytes. JPEG has none.
pub fn effort(format: OutputFormat, width: u32) -> u8 {
    match (format, width) {
        (OutputFormat::Webp, _) => WEBP_EFFORT,
        (OutputFormat::Avif, 0..=640) => 4,
        (OutputFormat::Avif, 641..=1280) => 3,
        (OutputFormat::Avif, _) => 2,
        (OutputFormat::Jpeg, _) => 0,
    }
}

/// Runs `f` over the 8-bit sRGB pixels of an image in memory (RGB, or RGBA with alpha).
fn with_slice<T>(
    image: &Image,
    f: impl FnOnce(&PixelSlice<'_>) -> Result<T, fast_ssim2::Ssimulacra2Error>,
) -> Result<T, VipsError> {
    let descriptor = match image.bands() {
        3 => PixelDescriptor::RGB8_SRGB,
        4 => PixelDescriptor::RGBA8_SRGB,
        n => return Err(VipsError(format!("scoring: {n} bands"))),
    };
    let pixels = image.pixels()?;
    let stride = image.width() as usize * image.bands() as usize;
    let slice = PixelSlice::new(pixels, image.width(), image.height(), stride, descriptor)
        .map_err(|e| VipsError(format!("scoring: {e}")))?;
    f(&slice).map_err(|e| VipsError(format!("scoring: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wider_avif_variants_get_more_steps() {
        assert_eq!(carry(50, 320, 320), 50);
        assert_eq!(carry(50, 320, 240), 50);
        // Up to 2.5x: 6 steps more; past 4.5x, 19.
        assert_eq!(carry(50, 320, 800), 56);
        assert_eq!(carry(50, 320, 1920), 69);
        assert_eq!(carry(80, 320, 6400), 90);
    }

    #[test]
    fn bases_are_per_width_bucket_and_move_with_the_target() {
        let webp = |w, t| base(OutputFormat::Webp, w, t).unwrap();
        let (narrow, mid, wide) = (webp(320, 70.0), webp(640, 70.0), webp(1920, 70.0));
        assert_eq!(webp(100, 70.0), narrow);
        assert_eq!(webp(321, 70.0), mid);
        assert_eq!(webp(641, 70.0), wide);
        // 4.5 points of score: 10 steps.
        assert_eq!(webp(1920, 74.5), wide + 10);
        assert_eq!(base(OutputFormat::Jpeg, 320, 30.0), Some(30));
        assert_eq!(base(OutputFormat::Avif, 320, 70.0), None);
        assert!(on_proxy(OutputFormat::Avif) && !on_proxy(OutputFormat::Jpeg));
    }
}
