//! The poster frame. A few frames spread over the video come out of the ladder's ffmpeg run
//! (upright, SDR; see `transcode::filter_graph`) and are scored here; the best (not black or
//! flat, with faces when analysis is on, sharpest) goes through the image pipeline. Every
//! failure here degrades the job.

use std::path::{Path, PathBuf};
use std::time::Duration;

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

/// Scores the candidate frames (those the run wrote); the best one, or why there is none.
pub fn choose(job: &MediaJob, frames: &[(Duration, PathBuf)]) -> Result<Poster, String> {
    let mut best: Option<Poster> = None;
    let mut last_error = None;
    for (time, path) in frames {
        // A time past the end gives no frame.
        if std::fs::metadata(path).map_or(true, |m| m.len() == 0) {
            continue;
        }
        match score(job, path) {
            Ok(score) => {
                if best.as_ref().is_none_or(|b| score.rank(&b.score).is_gt()) {
                    best = Some(Poster {
                        path: path.clone(),
                        time: *time,
                        score,
                    });
                }
            }
            Err(e) => last_error = Some(e),
        }
    }
    best.ok_or_else(|| last_error.unwrap_or_else(|| "no frame could be extracted".to_owned()))
}

fn score(job: &MediaJob, frame: &Path) -> Result<FrameScore, String> {
    let img = transform::decode(
        frame,
        ImageFormat::Png,
        job.analysis.max_side,
        Colour::Untagged,
    )
    .map_err(|e| e.to_string())?;
    analyze::frame_score(&img, &job.analysis, job.profile.analysis)
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
