//! Stage 3: what the input is, read from its header only, and the limits checked before any
//! pixel is decoded (a 522 KB PNG can claim 4 gigapixels).

use std::io::Read;
use std::path::Path;

use super::error::MediaError;
use super::settings::Limits;
use super::sniff::ImageFormat;
use super::vips::{self, Image};

/// An image's header facts.
#[derive(Debug, Clone, PartialEq)]
pub struct Probe {
    pub format: ImageFormat,
    /// Upright size (after EXIF orientation).
    pub width: u32,
    pub height: u32,
    pub orientation: u8,
    pub has_alpha: bool,
    pub frames: u32,
    pub colour: Colour,
}

/// How the source's pixel values become sRGB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Colour {
    /// No embedded profile: sRGB by the web's convention, values kept (grey, Lab and CMYK
    /// without a profile through libvips' own conversions).
    Untagged,
    /// Converted through the embedded ICC profile.
    Profile,
    /// CMYK converted through the embedded profile (decoded on a path of its own).
    CmykProfile,
}

/// Header facts of an image whose bytes look like `format` (see `sniff`).
pub fn run(input: &Path, format: ImageFormat, limits: &Limits) -> Result<Probe, MediaError> {
    // The declared size, read by a small parser of headers alone before any decoder runs: a
    // pixel bomb is `limits_exceeded` even when the decoder would refuse (or choke on) it.
    if let Some((w, h)) = declared_size(input, format) {
        check_pixels(w, h, limits)?;
    }
    // libvips sniffs too; both must agree, so a file crafted to look like one format cannot
    // reach another decoder.
    let loader = vips::find_loader(input).map_err(|e| MediaError::Corrupt(e.0))?;
    if !format.matches_vips_loader(&loader) {
        return Err(MediaError::Unsupported(format!(
            "{} signature but libvips would use {loader}",
            format.name()
        )));
    }
    if format == ImageFormat::Gif {
        super::gif::check_whole(input)?;
    }
    let img = Image::open_header(input).map_err(|e| MediaError::Corrupt(e.0))?;
    let (w, h) = (img.width(), img.height());
    if w == 0 || h == 0 {
        return Err(MediaError::Corrupt("zero-sized image".into()));
    }
    check_pixels(w as u64, h as u64, limits)?;
    let frames = img.pages();
    if frames > limits.max_frames {
        return Err(MediaError::LimitsExceeded(format!(
            "{frames} frames, over the {} limit",
            limits.max_frames
        )));
    }
    let all = w as u64 * h as u64 * frames as u64;
    if all > limits.max_animation_pixels {
        return Err(MediaError::LimitsExceeded(format!(
            "{frames} frames of {w}x{h} are {all} pixels, over the {} limit",
            limits.max_animation_pixels
        )));
    }
    let orientation = img.orientation();
    let (width, height) = if orientation >= 5 { (h, w) } else { (w, h) };
    Ok(Probe {
        format,
        width,
        height,
        orientation,
        has_alpha: img.has_alpha(),
        frames,
        colour: match (img.has_icc_profile(), img.is_cmyk()) {
            (false, _) => Colour::Untagged,
            (true, false) => Colour::Profile,
            (true, true) => Colour::CmykProfile,
        },
    })
}

/// The size a header declares, when it is a real header: `imagesize` reads a PNG's size from
/// fixed offsets, so the first chunk must be IHDR.
fn declared_size(input: &Path, format: ImageFormat) -> Option<(u64, u64)> {
    if format == ImageFormat::Png {
        let mut head = [0u8; 16];
        std::fs::File::open(input)
            .ok()?
            .read_exact(&mut head)
            .ok()?;
        if &head[12..16] != b"IHDR" {
            return None;
        }
    }
    let size = imagesize::size(input).ok()?;
    Some((size.width as u64, size.height as u64))
}

fn check_pixels(w: u64, h: u64, limits: &Limits) -> Result<(), MediaError> {
    let pixels = w * h;
    if pixels > limits.max_image_pixels {
        return Err(MediaError::LimitsExceeded(format!(
            "{w}x{h} is {pixels} pixels, over the {} limit",
            limits.max_image_pixels
        )));
    }
    Ok(())
}
