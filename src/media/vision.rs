//! Computer vision on decoded pixels with OpenCV: faces (Haar cascades), sharpness, perceptual
//! hash and an attention estimate. Input is always an upright 8-bit RGB buffer handed over as a
//! borrowed `Mat`: nothing is encoded or decoded again.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use opencv::core::{Mat, Rect, Size, Vector};
use opencv::objdetect::CascadeClassifier;
use opencv::prelude::*;
use opencv::{img_hash, imgproc};

use super::settings::AnalysisSettings;

pub type CvResult<T> = opencv::Result<T>;

/// An RGB image (3 bytes per pixel, rows packed).
pub struct Rgb<'a> {
    pub width: u32,
    pub height: u32,
    pub data: &'a [u8],
}

impl Rgb<'_> {
    fn mat(&self) -> CvResult<opencv::boxed_ref::BoxedRef<'_, Mat>> {
        Mat::new_rows_cols_with_bytes::<opencv::core::Vec3b>(
            self.height as i32,
            self.width as i32,
            self.data,
        )
    }

    /// The grey version every detector below works on (computed once per image).
    pub fn gray(&self) -> CvResult<Mat> {
        let mut gray = Mat::default();
        imgproc::cvt_color_def(&self.mat()?, &mut gray, imgproc::COLOR_RGB2GRAY)?;
        Ok(gray)
    }
}

/// An owned RGB image (see [`opaque_fit`]).
pub struct RgbBuf {
    pub width: u32,
    pub height: u32,
    pub data: Vec<u8>,
}

impl RgbBuf {
    pub fn rgb(&self) -> Rgb<'_> {
        Rgb {
            width: self.width,
            height: self.height,
            data: &self.data,
        }
    }
}

/// An RGB or RGBA image (3 or 4 bytes per pixel, rows packed) fitted into `side` x `side` px
/// by area averaging (never enlarged), with its alpha flattened onto white.
pub fn opaque_fit(width: u32, height: u32, data: &[u8], side: i32) -> CvResult<RgbBuf> {
    let (rows, cols) = (height as i32, width as i32);
    let small = match data.len() / (width as usize * height as usize).max(1) {
        3 => fit(
            &Mat::new_rows_cols_with_bytes::<opencv::core::Vec3b>(rows, cols, data)?,
            side,
        )?,
        4 => fit(
            &Mat::new_rows_cols_with_bytes::<opencv::core::Vec4b>(rows, cols, data)?,
            side,
        )?,
        n => {
            return Err(opencv::Error::new(
                opencv::core::StsBadArg,
                format!("{n} bytes per pixel: RGB or RGBA expected"),
            ));
        }
    };
    let bytes = small.data_bytes()?;
    let data = if small.channels() == 4 {
        let over_white =
            |c: u8, a: u8| ((c as u32 * a as u32 + 255 * (255 - a as u32) + 127) / 255) as u8;
        (bytes.chunks_exact(4))
            .flat_map(|p| [0, 1, 2].map(|c| over_white(p[c], p[3])))
            .collect()
    } else {
        bytes.to_vec()
    };
    Ok(RgbBuf {
        width: small.cols() as u32,
        height: small.rows() as u32,
        data,
    })
}

/// Resizes so that the longest side is `side` (never enlarges).
fn fit(src: &(impl MatTraitConst + opencv::core::ToInputArray), side: i32) -> CvResult<Mat> {
    let (w, h) = (src.cols(), src.rows());
    let long = w.max(h);
    if long <= side {
        return src.try_clone();
    }
    let s = side as f64 / long as f64;
    let size = Size::new(
        ((w as f64 * s).round() as i32).max(1),
        ((h as f64 * s).round() as i32).max(1),
    );
    let mut out = Mat::default();
    imgproc::resize(src, &mut out, size, 0.0, 0.0, imgproc::INTER_AREA)?;
    Ok(out)
}

/// Loaded cascades not in use. A `CascadeClassifier` must not be used by two threads at once,
/// and loading one parses a large XML file (tens of ms), so each detection borrows one from
/// here and puts it back: as many copies are loaded as detections ever ran at once, whichever
/// (blocking-pool) threads run them.
static CASCADES: Mutex<Vec<(PathBuf, CascadeClassifier)>> = Mutex::new(Vec::new());

fn with_cascade<T>(
    path: &Path,
    f: impl FnOnce(&mut CascadeClassifier) -> CvResult<T>,
) -> CvResult<T> {
    let idle = {
        let mut idle = CASCADES.lock().unwrap_or_else(|e| e.into_inner());
        let i = idle.iter().position(|(p, _)| p == path);
        i.map(|i| idle.swap_remove(i).1)
    };
    let mut cascade = match idle {
        Some(c) => c,
        None => load_cascade(path)?,
    };
    let result = f(&mut cascade);
    CASCADES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((path.to_owned(), cascade));
    result
}

/// Loads the cascades of `settings` once, ahead of the jobs that use them (a fork server, so
/// that each job process starts with them parsed). A cascade that fails to load is left to the
/// job to report. Whether one was loaded now.
pub fn preload(settings: &AnalysisSettings) -> bool {
    let mut loaded = false;
    let paths = [
        Some(&settings.face_cascade),
        settings.profile_cascade.as_ref(),
    ];
    for path in paths.into_iter().flatten() {
        let mut idle = CASCADES.lock().unwrap_or_else(|e| e.into_inner());
        if idle.iter().any(|(p, _)| p == path) {
            continue;
        }
        if let Ok(c) = load_cascade(path) {
            idle.push((path.clone(), c));
            loaded = true;
        }
    }
    loaded
}

/// Runs OpenCV's per-process set-up once, on a blank image of our own (the face search, the
/// resize, the Laplacian and the hash a job uses), so that job processes forked from a fork
/// server start with it done. Single-threaded (`init` set one thread).
pub fn warm(settings: &AnalysisSettings) {
    let run = || -> CvResult<()> {
        let grey = Mat::new_rows_cols_with_default(
            96,
            96,
            opencv::core::CV_8UC1,
            opencv::core::Scalar::all(128.0),
        )?;
        with_cascade(&settings.face_cascade, |c| {
            let mut found = Vector::<Rect>::new();
            c.detect_multi_scale(
                &grey,
                &mut found,
                1.1,
                3,
                0,
                Size::new(24, 24),
                Size::new(0, 0),
            )
        })?;
        blur_score(&grey, 48)?;
        let mut rgb = Mat::default();
        imgproc::cvt_color_def(&grey, &mut rgb, imgproc::COLOR_GRAY2RGB)?;
        let mut hash = Mat::default();
        img_hash::PHash::create()?.compute(&rgb, &mut hash)
    };
    if let Err(e) = run() {
        tracing::debug!(error = %e, "OpenCV warm-up");
    }
}

/// Loads a cascade, failing clearly when the file is missing or not a cascade.
pub fn load_cascade(path: &Path) -> CvResult<CascadeClassifier> {
    let c = CascadeClassifier::new(path)?;
    if c.empty()? {
        return Err(opencv::Error::new(
            opencv::core::StsError,
            format!("cannot load cascade {}", path.display()),
        ));
    }
    Ok(c)
}

fn area(r: &Rect) -> i64 {
    r.width as i64 * r.height as i64
}

fn overlap(a: &Rect, b: &Rect) -> f64 {
    let x = (a.x + a.width).min(b.x + b.width) - a.x.max(b.x);
    let y = (a.y + a.height).min(b.y + b.height) - a.y.max(b.y);
    if x <= 0 || y <= 0 {
        return 0.0;
    }
    // Intersection over the smaller box: a face nested in a larger detection is the same face.
    (x as i64 * y as i64) as f64 / area(a).min(area(b)) as f64
}

/// Merges detections of the same face (from several cascades or scales), keeping the larger.
fn merge(mut boxes: Vec<Rect>) -> Vec<Rect> {
    boxes.sort_by_key(|r| std::cmp::Reverse(area(r)));
    let mut kept: Vec<Rect> = Vec::new();
    for b in boxes {
        if kept.iter().all(|k| overlap(k, &b) < 0.3) {
            kept.push(b);
        }
    }
    kept.sort_by_key(|r| (r.y, r.x));
    kept
}

/// OpenCV's own thread pool stays off: the job pool already runs one job per core.
pub fn init() {
    let _ = opencv::core::set_num_threads(1);
}

/// A cascade's detection window (20 px for Haar, 24 or 45 for LBP): nothing smaller is found.
fn window(path: &Path) -> CvResult<Size> {
    with_cascade(path, |c| c.get_original_window_size())
}

/// The shorter side of the image the face search runs on: the cascade's window over
/// `min_face_ratio`. A larger input is shrunk to it, a smaller one enlarged.
pub fn face_search_side(cfg: &AnalysisSettings) -> CvResult<f64> {
    let win = window(&cfg.face_cascade)?;
    Ok(win.width.max(win.height) as f64 / cfg.min_face_ratio)
}

/// Face boxes in the image's own pixel coordinates.
///
/// One scale pyramid, searched in two parts. Every image is searched for faces of at least
/// `first_pass_face_ratio` of its shorter side ([`FirstPart`], the smaller of them at every
/// other position). A group ([`Group`]) is searched again over the whole pyramid below the
/// large faces, down to `min_face_ratio`, so it gets what one `detectMultiScale` would find,
/// and, when the frontal cascade hardly sees it, with the profile cascade for turned heads.
/// The smallest scales hold most of the windows, and other images skip them.
pub fn faces(gray: &Mat, cfg: &AnalysisSettings) -> CvResult<Vec<Rect>> {
    let frontal = Detection::new(gray, &cfg.face_cascade, cfg)?;
    let first = FirstPart::search(&frontal)?;
    let mut found = group(first.candidates.clone(), cfg.min_neighbors)?;
    let group_of = Group::of(&first.candidates, found.len(), frontal.short, cfg)?;
    if !group_of.smaller_faces {
        return Ok(merge(found));
    }
    // A group: the pyramid below the large faces again, whole and at OpenCV's density.
    let mut candidates = first.large;
    candidates.extend(frontal.run(frontal.win, Some(first.dense))?);
    found = group(candidates, cfg.min_neighbors)?;
    let profile = cfg.profile_cascade.as_deref();
    if let Some(profile) = profile.filter(|_| group_of.turned_heads) {
        // Turned heads in a group are about as large as the frontal faces: searched up to
        // PROFILE_SIZE_SPAN times the largest one (all sizes when none was found).
        let profile = Detection::new(gray, profile, cfg)?;
        let split = profile.window_for(cfg.first_pass_face_ratio.max(cfg.min_face_ratio));
        let largest = found.iter().map(|r| r.width.max(r.height)).max();
        let below = largest.map(|px| {
            let px = (px as f64 * profile.scale * PROFILE_SIZE_SPAN).ceil() as i32;
            Size::new(px.max(split.width + 1), px.max(split.height + 1))
        });
        found.extend(group(profile.run(split, below)?, cfg.min_neighbors)?);
    }
    Ok(merge(found))
}

const PROFILE_SIZE_SPAN: f64 = 1.6;

/// The first part of the search: faces of at least `first_pass_face_ratio`. OpenCV scans every
/// position of its levels at factor 2 and above, every other one below. Here the faces under
/// twice the first part's smallest are searched on its smallest level (made as OpenCV makes
/// it), where they are below factor 2: a quarter of their windows.
struct FirstPart {
    /// Ungrouped, all sizes.
    candidates: Vec<Rect>,
    /// Those from `dense` up, scanned at OpenCV's density.
    large: Vec<Rect>,
    /// The frontal search's window from which faces are large.
    dense: Size,
}

impl FirstPart {
    fn search(frontal: &Detection) -> CvResult<FirstPart> {
        let cfg = frontal.cfg;
        let split = frontal.window_for(cfg.first_pass_face_ratio.max(cfg.min_face_ratio));
        let k = frontal.first_level(split);
        let small = frontal.level(k)?;
        let twice = small.levels_below(2.0);
        let dense = frontal.level_window(k + twice);
        let large = frontal.run(dense, None)?;
        let mut candidates = small.run(small.win, Some(small.level_window(twice)))?;
        candidates.extend_from_slice(&large);
        Ok(FirstPart {
            candidates,
            large,
            dense,
        })
    }
}

/// What the clusters of the first part's candidates (two or more similar windows each) say
/// about the searches beyond it.
#[derive(Debug, PartialEq)]
struct Group {
    /// A group (`group_min_faces` clusters: faces, or candidates that may become faces with
    /// the neighbours the smaller scales add) with a cluster near the bottom of the first
    /// part. Faces in a group are of similar size: two people filling the frame are not a
    /// crowd with smaller faces.
    smaller_faces: bool,
    /// A group the frontal cascade hardly sees (fewer than `group_min_faces` faces in the
    /// first part): turned heads, worth the profile cascade, the costliest search and the one
    /// with more false positives.
    turned_heads: bool,
}

/// A cluster below this many times the first part's smallest face is near its bottom.
const GROUP_SIZE_SPAN: f64 = 1.5;

impl Group {
    /// From the first part's `candidates` in `gray` px (shorter side `short`) and how many
    /// faces they made (`confirmed`).
    fn of(
        candidates: &[Rect],
        confirmed: usize,
        short: f64,
        cfg: &AnalysisSettings,
    ) -> CvResult<Group> {
        let clusters = group(candidates.to_vec(), 1)?;
        let min = cfg.group_min_faces.max(1) as usize;
        let near_bottom = GROUP_SIZE_SPAN * cfg.first_pass_face_ratio * short;
        let smaller_faces =
            clusters.len() >= min && clusters.iter().any(|r| (r.width as f64) < near_bottom);
        Ok(Group {
            smaller_faces,
            turned_heads: smaller_faces && confirmed < min,
        })
    }
}

/// A cascade over an equalised grey copy scaled so that the smallest face of interest
/// (`min_face_ratio` of the shorter side) just fills the cascade's window: small images are
/// enlarged as much as their small faces need (at most 3x), large ones shrunk, so the cost is
/// set by the ratios and `scale_factor`, not by the image size.
struct Detection<'a> {
    cascade: &'a Path,
    cfg: &'a AnalysisSettings,
    eq: Mat,
    /// Detection image px per `gray` px.
    scale: f64,
    short: f64,
    win: Size,
}

impl<'a> Detection<'a> {
    fn new(gray: &Mat, cascade: &'a Path, cfg: &'a AnalysisSettings) -> CvResult<Self> {
        let short = gray.cols().min(gray.rows()) as f64;
        let win = window(cascade)?;
        let scale = (win.width.max(win.height) as f64 / (cfg.min_face_ratio * short)).min(3.0);
        let mut eq = Mat::default();
        if (scale - 1.0).abs() < 0.01 {
            imgproc::equalize_hist(gray, &mut eq)?;
        } else {
            let interp = if scale > 1.0 {
                imgproc::INTER_LINEAR
            } else {
                imgproc::INTER_AREA
            };
            let mut sized = Mat::default();
            imgproc::resize(gray, &mut sized, Size::new(0, 0), scale, scale, interp)?;
            imgproc::equalize_hist(&sized, &mut eq)?;
        }
        Ok(Detection {
            cascade,
            cfg,
            eq,
            scale,
            short,
            win,
        })
    }

    /// The window of pyramid level `k` (factor `scale_factor`^k), rounded as OpenCV does.
    fn level_window(&self, k: u32) -> Size {
        let f = self.factor(k);
        let px = |n: i32| (n as f64 * f).round() as i32;
        Size::new(px(self.win.width), px(self.win.height))
    }

    fn factor(&self, k: u32) -> f64 {
        (0..k).fold(1.0, |f, _| f * self.cfg.scale_factor)
    }

    /// The first level whose window holds `min`.
    fn first_level(&self, min: Size) -> u32 {
        (0..)
            .find(|k| {
                let w = self.level_window(*k);
                w.width >= min.width && w.height >= min.height
            })
            .expect("windows grow with the level")
    }

    /// How many levels have a factor below `factor`.
    fn levels_below(&self, factor: f64) -> u32 {
        (0..)
            .find(|k| self.factor(*k) >= factor)
            .expect("factors grow with the level")
    }

    /// The same search on pyramid level `k`: the detection image resized by the level's
    /// factor, as OpenCV makes its levels.
    fn level(&self, k: u32) -> CvResult<Detection<'a>> {
        let factor = self.factor(k);
        let f = factor as f32;
        let size = Size::new(
            (self.eq.cols() as f32 / f).round() as i32,
            (self.eq.rows() as f32 / f).round() as i32,
        );
        let mut eq = Mat::default();
        imgproc::resize(
            &self.eq,
            &mut eq,
            size,
            0.0,
            0.0,
            imgproc::INTER_LINEAR_EXACT,
        )?;
        Ok(Detection {
            eq,
            scale: self.scale / factor,
            ..*self
        })
    }

    /// The smallest window that holds a face of `ratio` of the shorter side.
    fn window_for(&self, ratio: f64) -> Size {
        let k = ratio * self.short * self.scale / self.win.width.max(self.win.height) as f64;
        let px = |n: i32| ((n as f64 * k).ceil() as i32).max(n);
        Size::new(px(self.win.width), px(self.win.height))
    }

    /// Ungrouped detections (in `gray`'s pixels) with windows from `min` to below `below`.
    /// OpenCV's pyramid is anchored at the cascade's window whatever `min` is, so runs with
    /// adjacent ranges are parts of one pyramid.
    fn run(&self, min: Size, below: Option<Size>) -> CvResult<Vec<Rect>> {
        let max = below.map_or(Size::new(0, 0), |b| Size::new(b.width - 1, b.height - 1));
        let mut v = Vector::<Rect>::new();
        with_cascade(self.cascade, |c| {
            c.detect_multi_scale(&self.eq, &mut v, self.cfg.scale_factor, 0, 0, min, max)
        })?;
        let back = |x: i32| (x as f64 / self.scale).round() as i32;
        Ok(v.iter()
            .map(|r| Rect::new(back(r.x), back(r.y), back(r.width), back(r.height)))
            .collect())
    }
}

/// OpenCV's grouping of raw detections: clusters of similar boxes (eps 0.2) with more than
/// `min_neighbors` members, averaged.
fn group(candidates: Vec<Rect>, min_neighbors: i32) -> CvResult<Vec<Rect>> {
    let mut v = Vector::<Rect>::from(candidates);
    opencv::objdetect::group_rectangles(&mut v, min_neighbors, 0.2)?;
    Ok(v.to_vec())
}

/// Variance of the Laplacian of the grey image fitted to `side` px: higher is sharper.
pub fn blur_score(gray: &Mat, side: i32) -> CvResult<f64> {
    let gray = fit(gray, side)?;
    let mut lap = Mat::default();
    imgproc::laplacian_def(&gray, &mut lap, opencv::core::CV_64F)?;
    let (mut mean, mut dev) = (Mat::default(), Mat::default());
    opencv::core::mean_std_dev_def(&lap, &mut mean, &mut dev)?;
    let sd = *dev.at_2d::<f64>(0, 0)?;
    Ok(sd * sd)
}

/// Mean and standard deviation of the grey levels (0-255).
pub fn brightness(gray: &Mat) -> CvResult<(f64, f64)> {
    let (mut mean, mut dev) = (Mat::default(), Mat::default());
    opencv::core::mean_std_dev_def(gray, &mut mean, &mut dev)?;
    Ok((*mean.at_2d::<f64>(0, 0)?, *dev.at_2d::<f64>(0, 0)?))
}

/// OpenCV img_hash PHash: 64 bits as 16 hex digits.
pub fn phash(img: &Rgb) -> CvResult<String> {
    let mut hasher = img_hash::PHash::create()?;
    let mut out = Mat::default();
    hasher.compute(&img.mat()?, &mut out)?;
    Ok(out
        .data_bytes()?
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// Where the eye goes when there are no faces: the centroid of the strongest edges (top 10 %
/// of Sobel gradient energy on a 256 px grey copy), as fractions of width and height.
pub fn attention(gray: &Mat) -> CvResult<(f64, f64)> {
    let gray = fit(gray, 256)?;
    let mut smooth = Mat::default();
    imgproc::gaussian_blur_def(&gray, &mut smooth, Size::new(5, 5), 0.0)?;
    let (mut gx, mut gy) = (Mat::default(), Mat::default());
    imgproc::sobel_def(&smooth, &mut gx, opencv::core::CV_32F, 1, 0)?;
    imgproc::sobel_def(&smooth, &mut gy, opencv::core::CV_32F, 0, 1)?;
    let (w, h) = (gray.cols() as usize, gray.rows() as usize);
    let energy: Vec<f32> = (gx.data_typed::<f32>()?.iter())
        .zip(gy.data_typed::<f32>()?)
        .map(|(a, b)| a * a + b * b)
        .collect();
    let mut order = energy.clone();
    let cut = *order
        .select_nth_unstable_by(energy.len() * 9 / 10, f32::total_cmp)
        .1;
    let (mut sx, mut sy, mut sw) = (0.0f64, 0.0f64, 0.0f64);
    for (i, e) in energy.iter().enumerate() {
        if *e >= cut && *e > 0.0 {
            let e = *e as f64;
            sx += (i % w) as f64 * e;
            sy += (i / w) as f64 * e;
            sw += e;
        }
    }
    if sw == 0.0 {
        return Ok((0.5, 0.5));
    }
    Ok(((sx / sw + 0.5) / w as f64, (sy / sw + 0.5) / h as f64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::settings::defaults;

    /// Settings without the profile cascade, and a corpus photo in grey.
    fn frontal_only(name: &str) -> (AnalysisSettings, Mat) {
        let mut cfg: AnalysisSettings = defaults::section("analysis");
        cfg.profile_cascade = None;
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../shared/corpus")
            .join(name);
        // Decoded by libvips and made grey as a job does (`opaque_fit`, `Rgb::gray`), at full
        // size. Not OpenCV's `imread(IMREAD_GRAYSCALE)`: libpng's grey (PNG) truncates where
        // `cvtColor` rounds, and libjpeg's is the luma plane.
        crate::media::vips::init(1);
        init();
        let img = crate::media::vips::Image::open(&path)
            .and_then(|i| i.to_srgb8()?.into_memory())
            .unwrap();
        let side = img.width().max(img.height()) as i32;
        let rgb = opaque_fit(img.width(), img.height(), img.pixels().unwrap(), side).unwrap();
        let gray = rgb.rgb().gray().unwrap();
        (cfg, gray)
    }

    #[test]
    fn a_group_gets_what_one_search_over_the_whole_pyramid_finds() {
        // Six people: a group, so the smaller scales are searched too.
        let (cfg, gray) = frontal_only("dlib_2008_002470.jpg");
        let d = Detection::new(&gray, &cfg.face_cascade, &cfg).unwrap();
        let whole = merge(group(d.run(d.win, None).unwrap(), cfg.min_neighbors).unwrap());
        assert!(whole.len() >= 4, "{whole:?}");
        assert_eq!(faces(&gray, &cfg).unwrap(), whole);
    }

    #[test]
    fn the_working_copy_is_fitted_and_opaque() {
        // 4x2 RGBA: the left half opaque red, the right half transparent.
        let rgba: Vec<u8> = (0..8)
            .flat_map(|i| if i % 4 < 2 { [255, 0, 0, 255] } else { [0; 4] })
            .collect();
        let out = opaque_fit(4, 2, &rgba, 2).unwrap();
        assert_eq!((out.width, out.height), (2, 1));
        assert_eq!(out.data, [255, 0, 0, 255, 255, 255]);
        // RGB that already fits is kept as it is.
        let rgb = [1, 2, 3, 4, 5, 6];
        assert_eq!(opaque_fit(2, 1, &rgb, 8).unwrap().data, rgb);
        assert!(opaque_fit(3, 1, &rgb, 8).is_err(), "2 bytes per pixel");
    }

    /// What the first part says about a corpus photo, as `faces` reads it.
    fn first_part(name: &str) -> Group {
        let (cfg, gray) = frontal_only(name);
        let d = Detection::new(&gray, &cfg.face_cascade, &cfg).unwrap();
        let first = FirstPart::search(&d).unwrap();
        let found = group(first.candidates.clone(), cfg.min_neighbors).unwrap();
        Group::of(&first.candidates, found.len(), d.short, &cfg).unwrap()
    }

    #[test]
    fn only_groups_with_small_faces_go_on_and_only_unseen_heads_get_the_profile_cascade() {
        // A family, heads turned: clusters of candidates, hardly a frontal face among them.
        let family = first_part("dlib_2007_007763.jpg");
        assert_eq!(
            family,
            Group {
                smaller_faces: true,
                turned_heads: true
            }
        );
        // People at a table facing the camera: the frontal cascade sees the group.
        let table = first_part("dlib_2008_002470.jpg");
        assert_eq!(
            table,
            Group {
                smaller_faces: true,
                turned_heads: false
            }
        );
        // Two people filling the frame.
        let couple = first_part("face_recognition_two_people.jpg");
        assert_eq!(
            couple,
            Group {
                smaller_faces: false,
                turned_heads: false
            }
        );

        // And the profile cascade is what finds the family's turned heads.
        let (frontal, gray) = frontal_only("dlib_2007_007763.jpg");
        let with_profile: AnalysisSettings = defaults::section("analysis");
        assert!(with_profile.profile_cascade.is_some());
        let (a, b) = (
            faces(&gray, &frontal).unwrap(),
            faces(&gray, &with_profile).unwrap(),
        );
        assert!(b.len() > a.len(), "{a:?} {b:?}");
    }

    #[test]
    fn other_images_skip_the_smallest_scales() {
        // One face (MANIFEST.tsv), and the smallest scales hold candidates of their own, which
        // move the face's box when they are grouped with the rest.
        let (cfg, gray) = frontal_only("imageio_astronaut.png");
        let d = Detection::new(&gray, &cfg.face_cascade, &cfg).unwrap();
        let first = FirstPart::search(&d).unwrap();
        let whole = d.run(d.win, None).unwrap();
        assert!(
            whole.len() > first.candidates.len(),
            "{} {}",
            whole.len(),
            first.candidates.len()
        );
        let from_first = merge(group(first.candidates, cfg.min_neighbors).unwrap());
        let from_whole = merge(group(whole, cfg.min_neighbors).unwrap());
        assert_ne!(from_first, from_whole);
        // Not a group: the faces are the first part's, the smallest scales never searched.
        let found = faces(&gray, &cfg).unwrap();
        assert_eq!(found, from_first);
        assert_eq!(found.len(), 1, "{found:?}");
    }

    #[test]
    fn the_first_part_reads_its_smallest_level_as_opencv_makes_it() {
        let (cfg, gray) = frontal_only("dlib_2007_007763.jpg");
        let d = Detection::new(&gray, &cfg.face_cascade, &cfg).unwrap();
        let k = d.first_level(d.window_for(cfg.first_pass_face_ratio));
        let level = d.level(k).unwrap();
        // That level searched by OpenCV within the pyramid, and on its own.
        let within = d
            .run(d.level_window(k), Some(d.level_window(k + 1)))
            .unwrap();
        let alone = level.run(level.win, Some(level.level_window(1))).unwrap();
        assert!(!within.is_empty());
        assert_eq!(alone.len(), within.len(), "{alone:?} {within:?}");
        // The same windows (up to rounding on the way back to the image's pixels).
        let near = |a: &Rect, b: &Rect| (a.x - b.x).abs() <= 1 && (a.y - b.y).abs() <= 1;
        assert!(alone.iter().all(|a| within.iter().any(|b| near(a, b))));
    }
}
