//! Stage 5: web variants from one decode. The source is decoded once, shrunk on load to the
//! largest width needed, made upright and sRGB; every variant is derived from that in memory.

use std::path::Path;

use super::vips::{Image, VipsError};
use super::{MediaError, Probe, ProducedFile};
use crate::config::{OutputFormat, Profile};

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

fn transform_err(e: VipsError) -> MediaError {
    MediaError::Transform(e.0)
}

pub fn run(
    input: &Path,
    probe: &Probe,
    profile: &Profile,
    out_dir: &Path,
) -> Result<Vec<ProducedFile>, MediaError> {
    let widths = plan_widths(&profile.widths, probe.width);
    let largest = *widths.last().expect("profiles have at least one width");
    // Pixels are decoded here (into_memory): decoder failures mean the input is corrupt.
    let decoded = Image::thumbnail(input, largest)
        .and_then(|i| i.to_srgb8())
        .and_then(Image::into_memory)
        .map_err(|e| MediaError::Corrupt(e.0))?;
    let needs_opaque = profile
        .formats
        .iter()
        .any(|f| f.format == OutputFormat::Jpeg);

    let mut files = Vec::with_capacity(widths.len() * profile.formats.len());
    for &w in &widths {
        let variant = if w == decoded.width() {
            None
        } else {
            let scale = w as f64 / decoded.width() as f64;
            Some(
                decoded
                    .resize(scale)
                    .and_then(Image::into_memory)
                    .map_err(transform_err)?,
            )
        };
        let variant = variant.as_ref().unwrap_or(&decoded);
        let opaque = if needs_opaque && variant.has_alpha() {
            Some(
                variant
                    .flatten(WHITE)
                    .and_then(Image::into_memory)
                    .map_err(transform_err)?,
            )
        } else {
            None
        };
        for spec in &profile.formats {
            let name = format!("{w}w.{}", spec.format.ext());
            let path = out_dir.join(&name);
            let img = match spec.format {
                OutputFormat::Jpeg => opaque.as_ref().unwrap_or(variant),
                _ => variant,
            };
            match spec.format {
                OutputFormat::Jpeg => img.save_jpeg(&path, spec.quality),
                OutputFormat::Webp => img.save_webp(&path, spec.quality),
                OutputFormat::Avif => img.save_avif(&path, spec.quality),
            }
            .map_err(transform_err)?;
            files.push(ProducedFile {
                size_bytes: std::fs::metadata(&path)?.len(),
                name,
                path,
                role: "variant",
                format: spec.format,
                width: img.width(),
                height: img.height(),
            });
        }
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

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
