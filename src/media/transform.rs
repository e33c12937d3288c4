//! Stage 5: web variants from one decode. The source is decoded once ([`decode`]), shrunk on
//! load to the largest width needed, made upright and sRGB; every variant, the thumbnail and
//! the analysis copy are derived from that in memory.

use std::collections::BTreeMap;
use std::path::Path;

use super::animation::Animation;
use super::error::MediaError;
use super::output::{FileFormat, ProducedFile, Role, names};
use super::probe::Colour;
use super::probe::Probe;
use super::quality;
use super::rights::Rights;
use super::settings::{FormatSpec, Profile, Quality, ThumbnailSpec};
use super::sniff::ImageFormat;
use super::vips::{Image, VipsError};
use crate::contract::{OutputFormat, Point, QualityUsed, Rect, Warning, WarningCode};

const WHITE: [f64; 3] = [255.0, 255.0, 255.0];

/// The widths to produce: never upscaled. Profile widths at or above the source width are
/// replaced by one variant at the source width (600 px source, [320, 640, 1280]: 320 and 600).
pub fn plan_widths(profile: &[u32], source_width: u32) -> Vec<u32> {
    let mut widths: Vec<u32> = profile
        .iter()
        .copied()
        .filter(|w| *w < source_width)
        .collect();
    if profile.iter().any(|w| *w >= source_width) {
        widths.push(source_width);
    }
    widths.sort_unstable();
    widths.dedup();
    widths
}

/// A libvips failure in the transform stage: a fault of this pod when the scratch disk or the
/// process ran out (libvips reports the OS error in its text), else the transform's.
fn transform_err(e: VipsError) -> MediaError {
    const LOCAL: [&str; 4] = [
        "No space left on device",
        "Too many open files",
        "Input/output error",
        "Disk quota exceeded",
    ];
    if LOCAL.iter().any(|l| e.0.contains(l)) {
        MediaError::Io(e.0)
    } else {
        MediaError::Transform(e.0)
    }
}

/// The width to decode at: enough for the largest variant, the thumbnail (cover) and the
/// analysis copy, never more than the source.
pub fn decode_width(probe: &Probe, profile: &Profile, analysis_side: Option<u32>) -> u32 {
    let (w, h) = (probe.width as f64, probe.height as f64);
    let mut need = *plan_widths(&profile.widths, probe.width)
        .last()
        .expect("widths") as f64;
    if let Some(t) = profile.thumbnail {
        need = need.max((t.width as f64 / w).max(t.height as f64 / h) * w);
    }
    if let Some(side) = analysis_side {
        need = need.max(side as f64 / w.max(h) * w);
    }
    (need.ceil() as u32).clamp(1, probe.width)
}

/// Decodes once: shrunk on load to `width`, upright, 8-bit sRGB (see [`Colour`]), in memory,
/// and without any of the source's metadata, so that no output can carry it. Decoder failures
/// mean the input is corrupt.
pub fn decode(
    input: &Path,
    format: ImageFormat,
    width: u32,
    colour: Colour,
) -> Result<Image, MediaError> {
    let heif = matches!(format, ImageFormat::Heif | ImageFormat::Avif);
    match colour {
        Colour::Untagged => Image::thumbnail(input, width, false, heif),
        Colour::Profile => Image::thumbnail(input, width, true, heif),
        Colour::CmykProfile => Image::thumbnail_cmyk(input, width),
    }
    .and_then(|i| i.to_srgb8())
    .and_then(|i| i.without_metadata())
    .and_then(Image::into_memory)
    .map_err(|e| MediaError::Corrupt(e.0))
}

/// A variant made ahead of the transform stage, for the analysis to read.
pub struct Variant {
    pub width: u32,
    pub image: Image,
}

/// The variant `width` x `height` made from `source` (the decoded image or a wider variant):
/// a resized copy, or `None` when that is `source`'s size.
fn resized(source: &Image, (width, height): (u32, u32)) -> Result<Option<Image>, MediaError> {
    if (width, height) == (source.width(), source.height()) {
        return Ok(None);
    }
    source
        .resize_to(width, height)
        .and_then(Image::into_memory)
        .map(Some)
        .map_err(transform_err)
}

/// A reduce costs in proportion to the pixels it reads, so a variant is made from the
/// narrowest variant made before that is at least this many times as wide, when there is one
/// (320 from 640 from 1280). In `make bench-quality` a cascade took the CPU of the JPEG
/// variants from 60.5 to 48.5 ms a photo, and WebP's from 124.6 to 112.4. Each variant is
/// resized to its exact planned size, so a cascade never stretches it by a rounded height.
const CASCADE_RATIO: f64 = 2.0;

/// The image to make a variant `width` px wide from, of the `wider` ones made before (in
/// descending width): see [`CASCADE_RATIO`].
fn cascade_source(wider: &[Image], width: u32) -> Option<&Image> {
    wider
        .iter()
        .rev()
        .find(|i| i.width() as f64 >= CASCADE_RATIO * width as f64)
}

/// The variant the analysis can read instead of a copy of its own (see [`analysis_width`]).
pub fn variant_for(
    decoded: &Image,
    probe: &Probe,
    profile: &Profile,
    side: u32,
) -> Result<Option<Variant>, MediaError> {
    let aspect = decoded.height() as f64 / decoded.width() as f64;
    let widths = plan_widths(&profile.widths, probe.width);
    match analysis_width(&widths, aspect, side) {
        Some(width) => {
            let size = (width, height_at(width, (decoded.width(), decoded.height())));
            Ok(resized(decoded, size)?.map(|image| Variant { width, image }))
        }
        None => Ok(None),
    }
}

/// Of the planned `widths` (height = width x `aspect`), the narrowest whose longest side is at
/// least `side`, if that is at most twice `side`: analysis costs grow with the pixels.
pub fn analysis_width(widths: &[u32], aspect: f64, side: u32) -> Option<u32> {
    let long = |w: u32| w.max((w as f64 * aspect).round() as u32);
    let width = widths.iter().copied().find(|w| long(*w) >= side)?;
    (long(width) <= 2 * side).then_some(width)
}

/// The size a planned variant is made at in one format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fit {
    /// As planned.
    Fits,
    /// Over the format's side limit: this narrower width keeps the long side within it.
    Refitted { width: u32, height: u32 },
    /// Over the limit, and a narrower variant of the format already covers it (or none can).
    Skipped,
}

/// The height of a variant `width` px wide of an image `w` x `h` (as `vips_resize` rounds).
fn height_at(width: u32, (w, h): (u32, u32)) -> u32 {
    ((width as f64 * h as f64 / w as f64).round() as u32).max(1)
}

/// For each planned width (ascending), what a format with sides up to `max_side` can hold of a
/// variant of an image `size` (upright): the variant, a refitted narrower one, or nothing.
pub fn fit_widths(widths: &[u32], size: (u32, u32), max_side: u32) -> Vec<(u32, Fit)> {
    let mut widest = 0;
    widths
        .iter()
        .map(|&w| {
            let h = height_at(w, size);
            let fit = if w.max(h) <= max_side {
                Fit::Fits
            } else {
                let mut width = (max_side as f64 * size.0 as f64 / size.1 as f64) as u32;
                width = width.min(max_side);
                while width > 0 && height_at(width, size) > max_side {
                    width -= 1;
                }
                if width > widest {
                    Fit::Refitted {
                        width,
                        height: height_at(width, size),
                    }
                } else {
                    Fit::Skipped
                }
            };
            widest = match fit {
                Fit::Fits => w,
                Fit::Refitted { width, .. } => width,
                Fit::Skipped => widest,
            };
            (w, fit)
        })
        .collect()
}

/// The variants to make: each width with the formats made at it, and a warning for every
/// variant a format could not hold as planned (`variant_refitted`, `variant_skipped`).
pub fn plan_variants(
    widths: &[u32],
    size: (u32, u32),
    formats: &[FormatSpec],
) -> (BTreeMap<u32, Vec<FormatSpec>>, Vec<Warning>) {
    let mut plan: BTreeMap<u32, Vec<FormatSpec>> = BTreeMap::new();
    let mut warnings = Vec::new();
    for spec in formats {
        let f = spec.format;
        for (w, fit) in fit_widths(widths, size, f.max_side()) {
            let asked = format!(
                "{w}w.{} would be {w}x{} px, over {}'s {} px limit",
                f.ext(),
                height_at(w, size),
                f.label(),
                f.max_side()
            );
            let made = match fit {
                Fit::Fits => w,
                Fit::Refitted { width, height } => {
                    warnings.push(Warning {
                        code: WarningCode::VariantRefitted,
                        message: format!(
                            "{asked}: made at {width}x{height} as {width}w.{}",
                            f.ext()
                        ),
                    });
                    width
                }
                Fit::Skipped => {
                    warnings.push(Warning {
                        code: WarningCode::VariantSkipped,
                        message: format!("{asked}: not made (a narrower {} covers it)", f.label()),
                    });
                    continue;
                }
            };
            plan.entry(made).or_default().push(*spec);
        }
    }
    (plan, warnings)
}

/// What the transform stage wrote, and what it could not make as the profile asked.
pub struct Transformed {
    pub files: Vec<ProducedFile>,
    pub warnings: Vec<Warning>,
}

/// What the transform stage knows of the source besides its decoded pixels.
pub struct Source<'a> {
    pub probe: &'a Probe,
    /// Where the thumbnail is centred (upright source pixels); the middle without one.
    pub focal: Option<Point>,
    /// The fields the profile keeps (`keep_metadata`), read from the source.
    pub rights: Option<&'a Rights>,
}

/// Writes every variant (and the thumbnail) of the decoded image in every profile format that
/// can hold it; `made` is one made earlier ([`variant_for`]). With an `animation`, the WebP
/// variants are animated and the rest show its first frame, `decoded`.
pub fn run(
    decoded: &Image,
    made: Option<Variant>,
    animation: Option<&Animation>,
    source: &Source,
    profile: &Profile,
    out_dir: &Path,
) -> Result<Transformed, MediaError> {
    let Source {
        probe,
        focal,
        rights,
    } = *source;
    let size = (decoded.width(), decoded.height());
    let widths = plan_widths(&profile.widths, probe.width);
    let (plan, warnings) = plan_variants(&widths, size, &profile.formats);
    let stills = Stills::make(decoded, made, &plan, animation)?;

    // Listed narrowest first.
    let mut by_width = Vec::new();
    for (w, formats) in plan.into_iter().rev() {
        let stem = names::variant_stem(w);
        let mut made_here = Vec::new();
        let (moving, still): (Vec<FormatSpec>, Vec<FormatSpec>) =
            formats.iter().partition(|f| moving(f, animation));
        if let Some(animation) = animation {
            for spec in moving {
                made_here.push(animated_webp(animation, w, &spec, &stem, out_dir)?);
            }
        }
        if let Some(pixels) = stills.at(w) {
            let out = Outputs {
                stem: &stem,
                role: Role::Variant,
                crop: None,
                dir: out_dir,
                rights,
            };
            encode_all(pixels, &still, &out, &mut made_here)?;
        }
        by_width.push(made_here);
    }
    let mut files: Vec<ProducedFile> = by_width.into_iter().rev().flatten().collect();
    if let Some(spec) = profile.thumbnail {
        let focal = focal.unwrap_or(Point {
            x: probe.width / 2,
            y: probe.height / 2,
        });
        let (thumb, crop) = cover_crop(decoded, probe, spec, focal).map_err(transform_err)?;
        let out = Outputs {
            stem: &names::thumbnail_stem(spec),
            role: Role::Thumbnail,
            crop: Some(crop),
            dir: out_dir,
            rights,
        };
        encode_all(&thumb, &profile.formats, &out, &mut files)?;
    }
    Ok(Transformed { files, warnings })
}

/// The pixels of every still variant: each resized from a wider one made before when one is
/// wide enough (a cascade, see `cascade_source`), else from the decoded image.
pub struct Stills<'a> {
    decoded: &'a Image,
    resized: Vec<Image>,
    /// Widest first: each width and its image in `resized` (`None`: `decoded` itself).
    widths: Vec<(u32, Option<usize>)>,
}

impl<'a> Stills<'a> {
    /// Makes the still variants of `plan` (`made` is one made earlier, [`variant_for`]).
    pub fn make(
        decoded: &'a Image,
        mut made: Option<Variant>,
        plan: &BTreeMap<u32, Vec<FormatSpec>>,
        animation: Option<&Animation>,
    ) -> Result<Stills<'a>, MediaError> {
        let size = (decoded.width(), decoded.height());
        let mut stills = Stills {
            decoded,
            resized: Vec::new(),
            widths: Vec::new(),
        };
        for (&w, formats) in plan.iter().rev() {
            if formats.iter().all(|f| moving(f, animation)) {
                continue;
            }
            let source = cascade_source(&stills.resized, w).unwrap_or(decoded);
            let resized = match made.take_if(|v| v.width == w) {
                Some(v) => Some(v.image),
                // The height a resize of the decoded image would give, whatever the source.
                None => resized(source, (w, height_at(w, size)))?,
            };
            let index = resized.is_some().then_some(stills.resized.len());
            stills.widths.push((w, index));
            stills.resized.extend(resized);
        }
        Ok(stills)
    }

    /// The variant `width` px wide, if it is a still one.
    pub fn at(&self, width: u32) -> Option<&Image> {
        let (_, i) = self.widths.iter().find(|(w, _)| *w == width)?;
        Some(i.map_or(self.decoded, |i| &self.resized[i]))
    }

    /// Each still variant, widest first.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &Image)> {
        self.widths
            .iter()
            .map(|(w, i)| (*w, i.map_or(self.decoded, |i| &self.resized[i])))
    }
}

/// Whether a format's variants of this image are animated (only WebP's are).
fn moving(spec: &FormatSpec, animation: Option<&Animation>) -> bool {
    animation.is_some() && spec.format == OutputFormat::Webp
}

/// The quality of `spec`, a fixed one: as the profile says (an auto one is searched per
/// output, [`quality::search`]).
fn fixed(spec: &FormatSpec) -> QualityUsed {
    let value = match spec.quality {
        Quality::Fixed(value) => value,
        Quality::Auto(_) => unreachable!("an auto quality is searched"),
    };
    QualityUsed {
        value,
        target: None,
        score: None,
    }
}

/// `img` flattened onto white when it has alpha and `needed` (JPEG has no alpha).
fn opaque_if(img: &Image, needed: bool) -> Result<Option<Image>, MediaError> {
    if !(needed && img.has_alpha()) {
        return Ok(None);
    }
    img.flatten(WHITE)
        .and_then(Image::into_memory)
        .map(Some)
        .map_err(transform_err)
}

/// The animated WebP variant `width` px wide: at an auto quality, searched on its frames from
/// its width's base ([`Animation::webp_for`]); at a fixed one, as it is.
fn animated_webp(
    animation: &Animation,
    width: u32,
    spec: &FormatSpec,
    stem: &str,
    dir: &Path,
) -> Result<ProducedFile, MediaError> {
    let name = names::image(stem, OutputFormat::Webp);
    let path = dir.join(&name);
    let (bytes, (width, height), used) = match spec.auto_target() {
        None => {
            let used = fixed(spec);
            let webp = animation.webp(width, used.value, None);
            let webp = webp.map_err(transform_err)?;
            (webp.bytes, webp.size, used)
        }
        Some(target) => {
            let (found, size) = animation.webp_for(width, target).map_err(transform_err)?;
            let used = QualityUsed {
                value: found.quality,
                target: Some(target),
                score: Some(rounded(found.score)),
            };
            (found.bytes, size, used)
        }
    };
    std::fs::write(&path, &bytes)?;
    Ok(ProducedFile {
        size_bytes: bytes.len() as u64,
        name,
        path,
        role: Role::Variant,
        format: FileFormat::Image(OutputFormat::Webp),
        width,
        height,
        duration_ms: Some(animation.duration_ms()),
        frames: Some(animation.frames()),
        crop: None,
        quality: Some(used),
    })
}

/// A score as the response gives it: to two decimals.
fn rounded(score: f64) -> f64 {
    (score * 100.0).round() / 100.0
}

/// Scales to cover `spec` (never enlarging) and cuts a window centred on `focal` (upright
/// source pixels), clamped inside the image. Also returns the window in source pixels.
fn cover_crop(
    decoded: &Image,
    probe: &Probe,
    spec: ThumbnailSpec,
    focal: Point,
) -> Result<(Image, Rect), VipsError> {
    let (dw, dh) = (decoded.width() as f64, decoded.height() as f64);
    let s = (spec.width as f64 / dw)
        .max(spec.height as f64 / dh)
        .min(1.0);
    let scaled = decoded.resize(s)?.into_memory()?;
    let (rw, rh) = (scaled.width(), scaled.height());
    let (cw, ch) = (spec.width.min(rw), spec.height.min(rh));
    let to_scaled = rw as f64 / probe.width as f64;
    let centre = |f: u32, c: u32, max: u32| {
        let v = (f as f64 * to_scaled - c as f64 / 2.0).round().max(0.0) as u32;
        v.min(max - c)
    };
    let left = centre(focal.x, cw, rw);
    let top = centre(focal.y, ch, rh);
    let src = |v: u32| (v as f64 / to_scaled).round() as u32;
    let crop = Rect {
        x: src(left),
        y: src(top),
        width: src(cw),
        height: src(ch),
    };
    Ok((scaled.extract(left, top, cw, ch)?.into_memory()?, crop))
}

/// Where and as what one image's encodings are written.
struct Outputs<'a> {
    stem: &'a str,
    role: Role,
    crop: Option<Rect>,
    dir: &'a Path,
    /// The source's fields a profile keeps (`keep_metadata`).
    rights: Option<&'a Rights>,
}

fn encode_all(
    img: &Image,
    formats: &[FormatSpec],
    out: &Outputs,
    files: &mut Vec<ProducedFile>,
) -> Result<(), MediaError> {
    let opaque = opaque_if(img, formats.iter().any(|f| f.format == OutputFormat::Jpeg))?;
    // The scorers of `img` and of `opaque`, made once for every format checked on them.
    let mut scorers = [None, None];
    for spec in formats {
        let name = names::image(out.stem, spec.format);
        let path = out.dir.join(&name);
        let (src, scorer) = match (spec.format, &opaque) {
            (OutputFormat::Jpeg, Some(o)) => (o, &mut scorers[1]),
            _ => (img, &mut scorers[0]),
        };
        let (bytes, quality) = encode_one(src, spec, scorer)?;
        let bytes = match out.rights {
            Some(r) => r.write(spec.format, bytes).map_err(MediaError::Transform)?,
            None => bytes,
        };
        std::fs::write(&path, &bytes)?;
        files.push(ProducedFile {
            size_bytes: bytes.len() as u64,
            name,
            path,
            role: out.role,
            format: FileFormat::Image(spec.format),
            duration_ms: None,
            frames: None,
            width: src.width(),
            height: src.height(),
            crop: out.crop,
            quality: Some(quality),
        });
    }
    Ok(())
}

/// `src` encoded as `spec` says: an auto quality searched on `src` itself from its width's
/// base (scored against `scorer`, made on first use), a fixed one as it is.
fn encode_one(
    src: &Image,
    spec: &FormatSpec,
    scorer: &mut Option<quality::Scorer>,
) -> Result<(Vec<u8>, QualityUsed), MediaError> {
    let Some(target) = spec.auto_target() else {
        let used = fixed(spec);
        let bytes = src
            .encode(
                spec.format,
                used.value,
                quality::effort(spec.format, src.width()),
            )
            .map_err(transform_err)?;
        return Ok((bytes, used));
    };
    let scorer = match scorer {
        Some(s) => s,
        None => scorer.insert(quality::Scorer::new(src).map_err(transform_err)?),
    };
    let found = scorer
        .search(src, spec.format, target)
        .map_err(transform_err)?;
    let used = QualityUsed {
        value: found.quality,
        target: Some(target),
        score: Some(rounded(found.score)),
    };
    Ok((found.bytes, used))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn analysis_reads_the_narrowest_variant_that_is_large_enough() {
        let planned = [320, 640, 1280, 1920];
        // 3:2 landscape, 512 px wanted: 640x427.
        assert_eq!(analysis_width(&planned, 2.0 / 3.0, 512), Some(640));
        // 2:3 portrait: 320x480 is too small, 640x960 will do.
        assert_eq!(analysis_width(&planned, 1.5, 512), Some(640));
        // A 1:4 strip: 320x1280 is more than twice 512; the analysis makes its own copy.
        assert_eq!(analysis_width(&planned, 4.0, 512), None);
        // Nothing large enough.
        assert_eq!(analysis_width(&[200], 1.0, 512), None);
    }

    #[test]
    fn variants_over_a_format_limit_are_refitted_once_then_skipped() {
        let widths = [320, 640, 1280, 1920];
        // 1:20 strip of 2000 x 40000: 320 (6400 tall) and 640 (12800) fit; 1280 is refitted to
        // 819 x 16380; 1920 would be refitted to the same width and is skipped.
        assert_eq!(
            fit_widths(&widths, (2000, 40000), 16_383),
            vec![
                (320, Fit::Fits),
                (640, Fit::Fits),
                (
                    1280,
                    Fit::Refitted {
                        width: 819,
                        height: 16380
                    }
                ),
                (1920, Fit::Skipped),
            ]
        );
        // Too thin for any width: skipped, never a zero-width variant.
        assert_eq!(
            fit_widths(&[320], (1, 20000), 100),
            vec![(320, Fit::Skipped)]
        );
        // A wide panorama fits every format as planned.
        let spec = |format| FormatSpec::fixed(format, 80);
        let formats = [spec(OutputFormat::Webp), spec(OutputFormat::Jpeg)];
        let (plan, warnings) = plan_variants(&widths, (20000, 1080), &formats);
        assert!(warnings.is_empty());
        assert_eq!(plan.keys().copied().collect::<Vec<_>>(), widths);
        // The tall screenshot: WebP's 1080 becomes 884, JPEG keeps 1080.
        let (plan, warnings) = plan_variants(&[320, 640, 1080], (1080, 20000), &formats);
        assert_eq!(
            plan.keys().copied().collect::<Vec<_>>(),
            [320, 640, 884, 1080]
        );
        assert_eq!(plan[&884], [formats[0]]);
        assert_eq!(plan[&1080], [formats[1]]);
        assert_eq!(warnings.len(), 1);
        assert_eq!(warnings[0].code, WarningCode::VariantRefitted);
        assert_eq!(
            warnings[0].message,
            "1080w.webp would be 1080x20000 px, over WebP's 16383 px limit: made at 884x16370 \
             as 884w.webp"
        );
    }

    #[test]
    fn widths_are_never_upscaled() {
        let p = [320, 640, 1280, 1920];
        assert_eq!(plan_widths(&p, 600), vec![320, 600]);
        assert_eq!(plan_widths(&p, 200), vec![200]);
        assert_eq!(plan_widths(&p, 640), vec![320, 640]);
        assert_eq!(plan_widths(&p, 4000), vec![320, 640, 1280, 1920]);
        assert_eq!(plan_widths(&p, 1920), vec![320, 640, 1280, 1920]);
    }
}
