//! Storyboard (trick-play) images from the ladder's run: one branch of its filter graph takes
//! a frame every `interval` seconds, shrinks it to a tile and lays the tiles out in one sprite
//! sheet; a WebVTT file gives each interval a cue pointing at its tile with a `#xywh=` media
//! fragment, as players' preview thumbnails read them.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use super::ffprobe::VideoProbe;
use crate::contract::OutputFormat;
use crate::media::output::{FileFormat, ProducedFile, Role, names};
use crate::media::settings::StoryboardSpec;

/// WebP's largest side (14-bit), also inside JPEG's.
const MAX_SIDE: u32 = 16383;

/// What the sprite will hold.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Tile `k` is the frame at `k x interval` and stands for `[k, k+1) x interval`.
    pub interval: Duration,
    pub count: u32,
    pub columns: u32,
    pub rows: u32,
    pub tile: (u32, u32),
    pub format: OutputFormat,
    pub quality: u8,
    /// The video's duration: the last cue ends there.
    pub duration: Duration,
}

/// The plan for `probe`: `None` without a known duration (no interval can be chosen).
pub fn plan(spec: &StoryboardSpec, probe: &VideoProbe) -> Option<Plan> {
    let duration = probe.duration.filter(|d| !d.is_zero())?;
    let w = spec.tile_width.min(probe.width.max(2)) & !1;
    let h = ((w as u64 * probe.height as u64 / probe.width.max(1) as u64) as u32 & !1).max(2);
    let columns = spec.columns;
    let max_rows = (MAX_SIDE / h).max(1);
    let max_count = spec.max_tiles.min(max_rows * columns);
    // The last frame starts a frame before the end: no tile past it.
    let frame = Duration::from_secs_f64(1.0 / probe.fps.unwrap_or(25.0).max(1.0));
    let span = duration.saturating_sub(frame).as_secs_f64();
    let mut interval = spec.interval_secs.max(span / max_count as f64);
    // Whole milliseconds: the filter's rate and the cues say the same times.
    interval = (interval * 1000.0).ceil() / 1000.0;
    let count = ((span / interval).floor() as u32 + 1).min(max_count);
    let columns = columns.min(count);
    Some(Plan {
        interval: Duration::from_secs_f64(interval),
        count,
        columns,
        rows: count.div_ceil(columns),
        tile: (w, h),
        format: spec.format,
        quality: spec.quality,
        duration,
    })
}

impl Plan {
    /// The filter chain from the upright source to the sprite (`sdr`: see
    /// `transcode::to_sdr`). `round=up` makes tile `k` the frame at `k x interval` (rounding
    /// down would keep the last frame before the next tile's time).
    pub fn filter(&self, sdr: &str) -> String {
        format!(
            "{},tile={}x{}",
            self.tiles_filter(sdr, None),
            self.columns,
            self.rows
        )
    }

    /// The tiles one by one, before they are laid out (a unit of a long video writes its own
    /// from tile `first` on, whose time may come just before the unit's first frame: that
    /// frame is the tile's; the stitch lays them out with [`Plan::sprite_args`]).
    pub fn tiles_filter(&self, sdr: &str, first: Option<u32>) -> String {
        let (w, h) = self.tile;
        let ms = self.interval.as_millis();
        let start = first
            .map(|k| format!(":start_time={:.3}", (k as u128 * ms) as f64 / 1000.0))
            .unwrap_or_default();
        format!("fps=1000/{ms}:round=up{start},scale={w}:{h},{sdr}")
    }

    /// The tiles whose times fall in `[start, end)` seconds (`end` None: to the end).
    pub fn tiles_in(&self, start: f64, end: Option<f64>) -> std::ops::Range<u32> {
        let ms = self.interval.as_millis() as f64;
        let tile = |t: f64| ((t * 1000.0 / ms).ceil().max(0.0) as u32).min(self.count);
        tile(start)..end.map_or(self.count, tile)
    }

    /// ffmpeg's arguments laying out tiles `tile-00000.png`... of `dir` as the sprite.
    pub fn sprite_args(&self, dir: &Path) -> Vec<OsString> {
        let mut a: Vec<OsString> = ["-framerate", "1", "-start_number", "0", "-i"]
            .map(OsString::from)
            .into();
        a.push(tile_file(dir, "%05d").into());
        a.push("-vf".into());
        a.push(format!("tile={}x{}", self.columns, self.rows).into());
        a.extend(self.output_args());
        a
    }

    /// The sprite's encoder and file, for ffmpeg.
    pub fn output_args(&self) -> Vec<OsString> {
        let q = self.quality.to_string();
        // mjpeg's -q:v runs 2 (best) to 31.
        let jpeg_q = (2 + (100 - self.quality.min(100) as u32) * 29 / 100).to_string();
        let codec: &[&str] = match self.format {
            OutputFormat::Jpeg => &["-c:v", "mjpeg", "-q:v", &jpeg_q, "-pix_fmt", "yuvj420p"],
            _ => &["-c:v", "libwebp", "-quality", &q],
        };
        let mut a: Vec<OsString> = ["-frames:v", "1"].map(OsString::from).into();
        a.extend(codec.iter().map(OsString::from));
        a.extend(["-f", "image2", "-update", "1"].map(OsString::from));
        a.push(names::storyboard(self.format).into());
        a
    }

    /// The WebVTT: one cue per tile, up to the end of the video.
    pub fn vtt(&self) -> String {
        let sprite = names::storyboard(self.format);
        let (w, h) = self.tile;
        let mut v = String::from("WEBVTT\n");
        for k in 0..self.count {
            let start = self.interval * k;
            let end = if k + 1 == self.count {
                self.duration
            } else {
                (self.interval * (k + 1)).min(self.duration)
            };
            let (x, y) = ((k % self.columns) * w, (k / self.columns) * h);
            let _ = write!(
                v,
                "\n{} --> {}\n{sprite}#xywh={x},{y},{w},{h}\n",
                timestamp(start),
                timestamp(end)
            );
        }
        v
    }

    /// The sprite and the WebVTT, once the run wrote the sprite.
    pub fn files(&self, out_dir: &Path) -> std::io::Result<Vec<ProducedFile>> {
        let sprite = out_dir.join(names::storyboard(self.format));
        let sprite_size = std::fs::metadata(&sprite)?.len();
        let vtt = out_dir.join(names::STORYBOARD_VTT);
        let text = self.vtt();
        std::fs::write(&vtt, &text)?;
        let (w, h) = self.tile;
        let file = |name: String, path, format, size: (u32, u32), bytes| ProducedFile {
            name,
            path,
            role: Role::Storyboard,
            format,
            width: size.0,
            height: size.1,
            size_bytes: bytes,
            duration_ms: Some(self.duration.as_millis() as u64),
            frames: Some(self.count),
            crop: None,
            quality: None,
        };
        Ok(vec![
            file(
                names::storyboard(self.format),
                sprite,
                FileFormat::Image(self.format),
                (w * self.columns, h * self.rows),
                sprite_size,
            ),
            file(
                names::STORYBOARD_VTT.to_owned(),
                vtt,
                FileFormat::WebVtt,
                (w, h),
                text.len() as u64,
            ),
        ])
    }
}

/// Where a unit writes tile `k` (`%05d` for ffmpeg).
pub fn tile_file(dir: &Path, k: impl std::fmt::Display) -> std::path::PathBuf {
    dir.join(format!("tile-{k}.png"))
}

/// `00:01:02.345`
fn timestamp(t: Duration) -> String {
    let ms = t.as_millis();
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        ms / 3_600_000,
        ms / 60_000 % 60,
        ms / 1000 % 60,
        ms % 1000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(seconds: f64, w: u32, h: u32) -> VideoProbe {
        VideoProbe {
            duration: Some(Duration::from_secs_f64(seconds)),
            width: w,
            height: h,
            rotation: 0,
            fps: Some(25.0),
            video_codec: "h264".into(),
            pix_fmt: "yuv420p".into(),
            audio_codec: None,
            bitrate: None,
            hdr: false,
            frames: None,
            streams: 1,
            demuxer: "mov",
        }
    }

    fn spec() -> StoryboardSpec {
        StoryboardSpec {
            interval_secs: 2.0,
            max_tiles: 100,
            tile_width: 160,
            columns: 10,
            format: OutputFormat::Webp,
            quality: 70,
        }
    }

    #[test]
    fn short_videos_get_a_tile_every_interval_long_ones_at_most_max_tiles() {
        let p = plan(&spec(), &probe(10.0, 640, 360)).unwrap();
        assert_eq!((p.count, p.columns, p.rows, p.tile), (5, 5, 1, (160, 90)));
        let p = plan(&spec(), &probe(600.0, 1920, 1080)).unwrap();
        assert_eq!(p.count, 100);
        assert!(p.interval.as_secs_f64() * 99.0 < 600.0);
        assert_eq!((p.columns, p.rows), (10, 10));
        // Portrait: the tile keeps the shape.
        let p = plan(&spec(), &probe(3.0, 1080, 1920)).unwrap();
        assert_eq!((p.count, p.tile), (2, (160, 284)));
        assert!(plan(&spec(), &probe(0.0, 640, 360)).is_none());
    }

    #[test]
    fn cues_cover_the_video_and_point_inside_the_sprite() {
        let mut s = spec();
        s.columns = 2;
        let p = plan(&s, &probe(5.0, 640, 360)).unwrap();
        assert_eq!((p.count, p.columns, p.rows), (3, 2, 2));
        assert_eq!(
            p.vtt(),
            "WEBVTT\n\n00:00:00.000 --> 00:00:02.000\nstoryboard.webp#xywh=0,0,160,90\n\
             \n00:00:02.000 --> 00:00:04.000\nstoryboard.webp#xywh=160,0,160,90\n\
             \n00:00:04.000 --> 00:00:05.000\nstoryboard.webp#xywh=0,90,160,90\n"
        );
        assert_eq!(
            p.filter("format=yuv420p"),
            "fps=1000/2000:round=up,scale=160:90,format=yuv420p,tile=2x2"
        );
    }
}
