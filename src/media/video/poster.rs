//! The poster frame. A few frames spread over the video come out of the ladder's ffmpeg run
//! (upright, SDR; see `transcode::filter_graph`) and are scored here; the best (not black or
//! flat, with faces when analysis is on, sharpest) goes through the image pipeline. Every
//! failure here degrades the job.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::transcode;
use crate::media::analyze::{self, FrameScore};
use crate::media::error::unwind;
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

/// Scores the candidate frames in time order as the ladder's run writes them (each file
/// appears whole: ffmpeg writes it atomically), so that most are scored while ffmpeg still
/// encodes; [`Chooser::finish`] scores the rest and picks.
pub struct Chooser<'a> {
    job: &'a MediaJob,
    /// The candidates' times (see `transcode::frame_file`).
    frames: &'a [Duration],
    dir: &'a Path,
    /// The first candidate not scored yet.
    next: usize,
    best: Option<Poster>,
    last_error: Option<String>,
}

impl<'a> Chooser<'a> {
    pub fn new(job: &'a MediaJob, frames: &'a [Duration], dir: &'a Path) -> Self {
        Chooser {
            job,
            frames,
            dir,
            next: 0,
            best: None,
            last_error: None,
        }
    }

    /// Scores the candidates written so far.
    pub fn poll(&mut self) {
        while self.next < self.frames.len() {
            if !transcode::frame_file(self.dir, self.next).exists() {
                return;
            }
            self.score_next();
        }
    }

    /// Once the run has ended: the best frame (a time past the end gives none), or why there
    /// is none.
    pub fn finish(mut self) -> Result<Poster, String> {
        while self.next < self.frames.len() {
            self.score_next();
        }
        let no_frame = || "no frame could be extracted".to_owned();
        self.best
            .ok_or_else(|| self.last_error.unwrap_or_else(no_frame))
    }

    fn score_next(&mut self) {
        let time = self.frames[self.next];
        let path = transcode::frame_file(self.dir, self.next);
        self.next += 1;
        if std::fs::metadata(&path).map_or(true, |m| m.len() == 0) {
            return;
        }
        // Native code: a panic costs the poster only.
        match unwind(|| score(self.job, &path)) {
            Ok(score) => {
                let better = |b: &Poster| score.rank(&b.score).is_gt();
                if self.best.as_ref().is_none_or(better) {
                    self.best = Some(Poster { path, time, score });
                }
            }
            Err(e) => self.last_error = Some(e),
        }
    }
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
