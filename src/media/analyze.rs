//! Stage 4: what the response's `analysis` says about an image. Runs on a copy (at most
//! `max_side` px, see [`working_side`]) of the upright sRGB image the transform stage decoded:
//! no second decode.

use super::probe::Probe;
use super::settings::AnalysisSettings;
use super::vips::Image;
use super::vision::{self, Rgb};
use crate::contract::{ImageAnalysis, Point, Rect, Vision};

/// Header facts only (the `vision` part is absent).
pub fn basic(probe: &Probe) -> ImageAnalysis {
    ImageAnalysis {
        width: probe.width,
        height: probe.height,
        format: probe.format.name().to_owned(),
        has_alpha: probe.has_alpha,
        animated: probe.frames > 1,
        frames: probe.frames,
        orientation: probe.orientation,
        vision: None,
        scan: None,
    }
}

/// Full analysis. An error here degrades the job; it never fails it.
pub fn run(
    probe: &Probe,
    decoded: &Image,
    cfg: &AnalysisSettings,
) -> Result<ImageAnalysis, String> {
    let start = std::time::Instant::now();
    let vision = on_working_copy(decoded, cfg, |rgb| see(probe, rgb, cfg))?;
    tracing::debug!(total_ms = ms(start.elapsed()), "analysis");
    Ok(ImageAnalysis {
        vision: Some(vision),
        ..basic(probe)
    })
}

/// Runs `f` on the working copy of `decoded`: opaque RGB, at most [`working_side`] px (OpenCV
/// resizes faster than a libvips pipeline started for one small copy).
fn on_working_copy<T>(
    decoded: &Image,
    cfg: &AnalysisSettings,
    f: impl FnOnce(&Rgb) -> vision::CvResult<T>,
) -> Result<T, String> {
    let side = working_side(decoded.width(), decoded.height(), cfg);
    let pixels = decoded.pixels().map_err(|e| e.to_string())?;
    let opencv = |e| format!("opencv: {e}");
    let work = vision::opaque_fit(decoded.width(), decoded.height(), pixels, side as i32)
        .map_err(opencv)?;
    f(&work.rgb()).map_err(opencv)
}

/// The longest side of the analysed copy of a `width` x `height` image: as small as the face
/// search (its detection image, see `vision::faces`) and `blur_side` allow, at most `max_side`.
/// Every pixel more costs in each step of the analysis.
pub fn working_side(width: u32, height: u32, cfg: &AnalysisSettings) -> u32 {
    let (long, short) = (width.max(height) as f64, width.min(height).max(1) as f64);
    let faces = vision::face_search_side(cfg).unwrap_or(f64::INFINITY) * long / short;
    (faces.max(cfg.blur_side as f64).ceil() as u32).min(cfg.max_side)
}

fn see(probe: &Probe, rgb: &Rgb, cfg: &AnalysisSettings) -> vision::CvResult<Vision> {
    // Working pixels → upright source pixels.
    let t = std::time::Instant::now();
    let sx = probe.width as f64 / rgb.width as f64;
    let sy = probe.height as f64 / rgb.height as f64;
    let gray = rgb.gray()?;
    let faces: Vec<Rect> = vision::faces(&gray, cfg)?
        .iter()
        .map(|r| Rect {
            x: (r.x as f64 * sx).round() as u32,
            y: (r.y as f64 * sy).round() as u32,
            width: (r.width as f64 * sx).round() as u32,
            height: (r.height as f64 * sy).round() as u32,
        })
        .collect();
    let t_faces = t.elapsed();
    let focal_point = match focal_of_faces(&faces) {
        Some(p) => p,
        None => {
            let (fx, fy) = vision::attention(&gray)?;
            Point {
                x: (fx * probe.width as f64) as u32,
                y: (fy * probe.height as f64) as u32,
            }
        }
    };
    let t_focal = t.elapsed();
    let blur_score = vision::blur_score(&gray, cfg.blur_side as i32)?;
    let t_blur = t.elapsed();
    let phash = vision::phash(rgb)?;
    let t_phash = t.elapsed();
    let dominant_color = dominant_color(rgb.data);
    let blurhash = blurhash_of(rgb)?;
    tracing::debug!(
        faces_ms = ms(t_faces),
        focal_ms = ms(t_focal - t_faces),
        blur_ms = ms(t_blur - t_focal),
        phash_ms = ms(t_phash - t_blur),
        colour_hash_ms = ms(t.elapsed() - t_phash),
        "analysis timings"
    );
    Ok(Vision {
        face_count: faces.len() as u32,
        faces,
        focal_point,
        blur_score: (blur_score * 100.0).round() / 100.0,
        is_blurry: blur_score < cfg.blur_threshold,
        phash,
        dominant_color,
        blurhash,
    })
}

/// A duration in ms, to 0.01 ms (debug timings).
fn ms(d: std::time::Duration) -> f64 {
    (d.as_secs_f64() * 1e5).round() / 100.0
}

/// How good a video frame is as a poster.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FrameScore {
    /// Mean and spread of the grey levels: low for black, fade-out and flat frames.
    pub brightness: f64,
    pub contrast: f64,
    pub sharpness: f64,
    pub faces: u32,
    /// Where a crop should centre, as fractions of the width and height: the faces, else the
    /// most detailed region (as `see` finds it). Only when faces are looked for.
    pub focal: Option<(f64, f64)>,
}

impl FrameScore {
    /// Not black, not flat.
    pub fn usable(&self) -> bool {
        self.brightness >= 24.0 && self.contrast >= 12.0
    }

    /// Usable first, then frames with faces (up to three), then the sharpest.
    pub fn rank(&self, other: &FrameScore) -> std::cmp::Ordering {
        (self.usable(), self.faces.min(3))
            .cmp(&(other.usable(), other.faces.min(3)))
            .then(self.sharpness.total_cmp(&other.sharpness))
    }
}

/// Scores a decoded frame; faces are looked for only when `faces` is set.
pub fn frame_score(
    decoded: &Image,
    cfg: &AnalysisSettings,
    faces: bool,
) -> Result<FrameScore, String> {
    on_working_copy(decoded, cfg, |rgb| {
        let gray = rgb.gray()?;
        let (brightness, contrast) = vision::brightness(&gray)?;
        let sharpness = vision::blur_score(&gray, cfg.blur_side as i32)?;
        if !faces {
            return Ok(FrameScore {
                brightness,
                contrast,
                sharpness,
                faces: 0,
                focal: None,
            });
        }
        let found: Vec<Rect> = vision::faces(&gray, cfg)?
            .iter()
            .map(|r| Rect {
                x: r.x as u32,
                y: r.y as u32,
                width: r.width as u32,
                height: r.height as u32,
            })
            .collect();
        let focal = match focal_of_faces(&found) {
            Some(p) => (
                p.x as f64 / rgb.width as f64,
                p.y as f64 / rgb.height as f64,
            ),
            None => vision::attention(&gray)?,
        };
        Ok(FrameScore {
            brightness,
            contrast,
            sharpness,
            faces: found.len() as u32,
            focal: Some(focal),
        })
    })
}

/// Centre of the faces, weighted by area.
pub fn focal_of_faces(faces: &[Rect]) -> Option<Point> {
    let total: f64 = faces.iter().map(|f| f.width as f64 * f.height as f64).sum();
    if total <= 0.0 {
        return None;
    }
    let (mut x, mut y) = (0.0, 0.0);
    for f in faces {
        let a = f.width as f64 * f.height as f64 / total;
        x += (f.x as f64 + f.width as f64 / 2.0) * a;
        y += (f.y as f64 + f.height as f64 / 2.0) * a;
    }
    Some(Point {
        x: x.round() as u32,
        y: y.round() as u32,
    })
}

/// The most populated bin of a 4-bit-per-channel histogram, as the mean colour of its pixels.
pub fn dominant_color(rgb: &[u8]) -> String {
    let mut count = vec![0u32; 4096];
    let mut sum = vec![[0u64; 3]; 4096];
    for p in rgb.chunks_exact(3) {
        let bin = ((p[0] as usize >> 4) << 8) | ((p[1] as usize >> 4) << 4) | (p[2] as usize >> 4);
        count[bin] += 1;
        for c in 0..3 {
            sum[bin][c] += p[c] as u64;
        }
    }
    let (bin, n) = count
        .iter()
        .enumerate()
        .max_by_key(|(i, n)| (**n, std::cmp::Reverse(*i)))
        .unwrap();
    if *n == 0 {
        return "#000000".to_owned();
    }
    let m = |c: usize| (sum[bin][c] / *n as u64) as u8;
    format!("#{:02x}{:02x}{:02x}", m(0), m(1), m(2))
}

/// A 4x3-component BlurHash of a copy at most 32 px wide and high.
fn blurhash_of(rgb: &Rgb) -> vision::CvResult<String> {
    let small = vision::opaque_fit(rgb.width, rgb.height, rgb.data, 32)?;
    let rgba: Vec<u8> = small
        .data
        .chunks_exact(3)
        .flat_map(|p| [p[0], p[1], p[2], 255])
        .collect();
    // Only fails for component counts outside 1-9.
    Ok(blurhash::encode(4, 3, small.width, small.height, &rgba).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn focal_point_is_the_area_weighted_centre() {
        let big = Rect {
            x: 0,
            y: 0,
            width: 100,
            height: 100,
        };
        let small = Rect {
            x: 300,
            y: 0,
            width: 10,
            height: 10,
        };
        let p = focal_of_faces(&[big, small]).unwrap();
        assert!(
            p.x < 60 && p.x > 50,
            "pulled slightly towards the small face: {p:?}"
        );
        assert!(focal_of_faces(&[]).is_none());
    }

    #[test]
    fn the_analysis_copy_is_as_small_as_faces_and_blur_allow() {
        let cfg: AnalysisSettings = crate::media::settings::defaults::section("analysis");
        // Faces are searched on a 286 px short side (20 px window / 0.07); blur on 512 px.
        assert_eq!(working_side(3000, 2000, &cfg), 512);
        assert_eq!(working_side(2000, 3000, &cfg), 512);
        // A 3:1 panorama keeps its short side for the face search.
        assert_eq!(working_side(3000, 1000, &cfg), 858);
        // Never more than max_side.
        assert_eq!(working_side(8000, 1000, &cfg), cfg.max_side);
    }

    #[test]
    fn dominant_colour_is_the_biggest_bin() {
        let mut px = [10u8, 200, 30].repeat(90);
        px.extend([250u8, 250, 250].repeat(10));
        assert_eq!(dominant_color(&px), "#0ac81e");
    }
}
