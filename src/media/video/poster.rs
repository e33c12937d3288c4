//! Stage 4 for video: a poster frame. A few frames spread over the video are extracted
//! (upright, SDR) and scored; the best (not black or flat, with faces when analysis is on,
//! sharpest) goes through the image pipeline. Every failure here degrades the job.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::child;
use super::ffprobe::VideoProbe;
use super::transcode;
use crate::media::analyze::{self, FrameScore};
use crate::media::probe::Colour;
use crate::media::settings::MediaJob;
use crate::media::sniff::ImageFormat;
use crate::media::transform;

/// The chosen frame.
#[derive(Debug)]
pub struct Poster {
    pub path: PathBuf,
    pub time: Duration,
    pub score: FrameScore,
}

/// Where to look: the middles of `n` equal parts of the video (the first seconds without a
/// known duration).
pub fn candidate_times(duration: Option<Duration>, n: u32) -> Vec<Duration> {
    (0..n)
        .map(|i| match duration {
            Some(d) => d.mul_f64((i as f64 + 0.5) / n as f64),
            None => Duration::from_secs(i as u64),
        })
        .collect()
}

/// Extracts and scores the candidates in `dir`; the best one, or why there is none.
pub fn choose(
    job: &MediaJob,
    probe: &VideoProbe,
    input: &Path,
    dir: &Path,
    cancel: &CancellationToken,
) -> Result<Poster, String> {
    let limit = Duration::from_secs(job.video.timeout_base_secs);
    let mut best: Option<Poster> = None;
    let mut last_error = None;
    for (i, time) in candidate_times(probe.duration, job.video.poster_candidates)
        .into_iter()
        .enumerate()
    {
        let path = dir.join(format!("frame-{i}.png"));
        let cmd = extract(job, probe, input, time, &path);
        let log = dir.join(format!("frame-{i}.log"));
        if let Err(e) = child::run(cmd, &log, limit, cancel, &mut |_| {}) {
            last_error = Some(e.to_string());
            continue;
        }
        // A seek past the end writes nothing.
        if std::fs::metadata(&path).map_or(true, |m| m.len() == 0) {
            continue;
        }
        let score = transform::decode(
            &path,
            ImageFormat::Png,
            job.analysis.max_side,
            Colour::Untagged,
        )
        .map_err(|e| e.to_string())
        .and_then(|img| analyze::frame_score(&img, &job.analysis, job.profile.analysis));
        match score {
            Ok(score) => {
                if best.as_ref().is_none_or(|b| score.rank(&b.score).is_gt()) {
                    best = Some(Poster { path, time, score });
                }
            }
            Err(e) => last_error = Some(e),
        }
    }
    best.ok_or_else(|| last_error.unwrap_or_else(|| "no frame could be extracted".to_owned()))
}

/// One frame at `time`, upright and SDR, as PNG.
fn extract(
    job: &MediaJob,
    probe: &VideoProbe,
    input: &Path,
    time: Duration,
    out: &Path,
) -> Command {
    let mut cmd = Command::new(&job.video.ffmpeg);
    cmd.current_dir(out.parent().unwrap_or(Path::new(".")))
        .args(["-hide_banner", "-nostdin", "-v", "error", "-y"])
        .args(["-threads", &job.ffmpeg_threads.to_string()])
        .args(["-ss", &format!("{:.3}", time.as_secs_f64())])
        .args(super::ffprobe::input_args(probe.demuxer, input))
        .args(["-map", "0:v:0", "-frames:v", "1", "-an", "-sn", "-dn"])
        .args(["-vf", transcode::to_sdr(probe), "-pix_fmt", "rgb24"])
        .args(["-c:v", "png", "-compression_level", "1", "-f", "image2"])
        .arg(out);
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_are_spread_over_the_video() {
        let t = candidate_times(Some(Duration::from_secs(10)), 5);
        assert_eq!(t, [1, 3, 5, 7, 9].map(Duration::from_secs));
        assert_eq!(candidate_times(None, 2), [0, 1].map(Duration::from_secs));
    }
}
