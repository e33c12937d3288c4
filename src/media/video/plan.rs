//! The plan of units: which frames each unit encodes. Pure and exact: integer timestamps in
//! the stream's time base, no floating point, so the same frames, segment duration and unit
//! length give the same plan on every worker.
//!
//! The segment grid is the one a one-run encode cuts: segment `k` holds the frames presented
//! in `[t0 + k·S, t0 + (k+1)·S)`, `t0` the first frame's time and `S` `segment_secs` (the
//! ladder forces a keyframe on the first frame at or after each multiple of `S`, and ffmpeg's
//! HLS muxer cuts there). A cell without a frame (a variable-rate source pausing longer than
//! `S`) makes no segment, as it makes none in a one-run encode, so segment numbers count the
//! cells that have frames. A unit is `segments_per_unit` consecutive segments (the last one
//! what remains): the units' frame ranges are consecutive and cover every frame once.

use std::fmt;

/// One unit of a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unit {
    /// Its position in the plan, from 0.
    pub index: u32,
    /// Index of its first frame among the video's frames in presentation order.
    pub first_frame: u64,
    /// Presentation time of its first frame, in the stream's time base: the unit decodes from
    /// here and encodes an IDR (closed GOP) on this frame.
    pub first_pts: i64,
    /// How many frames it encodes, exactly.
    pub frames: u64,
    /// Global number of its first segment: its segments keep the names a one-run encode gives
    /// them (`seg-{first_segment + i}`).
    pub first_segment: u32,
    pub segments: u32,
}

/// Why no plan can be made of these frames.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanError {
    NoFrames,
    /// Timestamps must strictly increase (presentation order, no duplicate).
    NotIncreasing {
        frame: u64,
    },
    /// A zero segment duration, unit length or time base.
    Invalid(&'static str),
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::NoFrames => write!(f, "the video has no frame"),
            PlanError::NotIncreasing { frame } => {
                write!(f, "frame {frame} is not presented after the one before it")
            }
            PlanError::Invalid(what) => write!(f, "{what} must be positive"),
        }
    }
}

impl std::error::Error for PlanError {}

/// A stream's time base: a timestamp `t` is `t · num / den` seconds (ffprobe's `time_base`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeBase {
    pub num: u32,
    pub den: u32,
}

/// The units of a video whose frames are presented at `pts` (in `time_base`, presentation
/// order), cut on the grid of `segment_secs` into units of `segments_per_unit` segments.
pub fn plan(
    pts: &[i64],
    time_base: TimeBase,
    segment_secs: u32,
    segments_per_unit: u32,
) -> Result<Vec<Unit>, PlanError> {
    if segment_secs == 0 {
        return Err(PlanError::Invalid("segment_secs"));
    }
    if segments_per_unit == 0 {
        return Err(PlanError::Invalid("segments_per_unit"));
    }
    if time_base.num == 0 || time_base.den == 0 {
        return Err(PlanError::Invalid("the time base"));
    }
    let &t0 = pts.first().ok_or(PlanError::NoFrames)?;
    // The grid cell of `t`: floor((t - t0) · num / (S · den)), exact in i128.
    let cell_width = segment_secs as i128 * time_base.den as i128;
    let cell = |t: i64| (t as i128 - t0 as i128) * time_base.num as i128 / cell_width;

    let mut units: Vec<Unit> = Vec::new();
    // Segment number (cells with frames so far) and the current segment's cell.
    let mut segment = 0u32;
    let mut current_cell = 0i128;
    for (i, &t) in pts.iter().enumerate() {
        let i = i as u64;
        if i > 0 && t <= pts[i as usize - 1] {
            return Err(PlanError::NotIncreasing { frame: i });
        }
        let c = cell(t);
        let new_segment = i == 0 || c != current_cell;
        if new_segment && i > 0 {
            segment += 1;
        }
        current_cell = c;
        match units.last_mut() {
            Some(u) if !(new_segment && segment.is_multiple_of(segments_per_unit)) => {
                u.frames += 1;
                if new_segment {
                    u.segments += 1;
                }
            }
            _ => units.push(Unit {
                index: units.len() as u32,
                first_frame: i,
                first_pts: t,
                frames: 1,
                first_segment: segment,
                segments: 1,
            }),
        }
    }
    Ok(units)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Milliseconds.
    const MS: TimeBase = TimeBase { num: 1, den: 1000 };

    /// Constant-rate timestamps: `n` frames at `fps`, in a 1/90000 time base from `start`.
    fn cfr(n: u64, fps: (i64, i64), start: i64) -> Vec<i64> {
        (0..n as i64)
            .map(|i| start + i * 90_000 * fps.1 / fps.0)
            .collect()
    }

    const TB90K: TimeBase = TimeBase {
        num: 1,
        den: 90_000,
    };

    /// The plan's invariants: consecutive units covering every frame once, consecutive
    /// segment numbers, each unit's first frame where the grid puts it.
    fn check_tiling(units: &[Unit], pts: &[i64]) {
        let mut frame = 0;
        let mut segment = 0;
        for (i, u) in units.iter().enumerate() {
            assert_eq!(u.index as usize, i);
            assert_eq!((u.first_frame, u.first_segment), (frame, segment), "{u:?}");
            assert_eq!(u.first_pts, pts[u.first_frame as usize]);
            assert!(u.frames > 0 && u.segments > 0, "{u:?}");
            frame += u.frames;
            segment += u.segments;
        }
        assert_eq!(frame, pts.len() as u64, "every frame in one unit");
    }

    #[test]
    fn units_are_whole_segments_and_the_last_one_is_what_remains() {
        // 10.5 s at 30 fps, 2 s segments, 2 segments a unit: units at 0, 4 and 8 s, the last
        // one 2.5 s long (a full segment and a half one).
        let pts = cfr(315, (30, 1), 0);
        let units = plan(&pts, TB90K, 2, 2).unwrap();
        check_tiling(&units, &pts);
        let summary: Vec<(u64, u64, u32, u32)> = units
            .iter()
            .map(|u| (u.first_frame, u.frames, u.first_segment, u.segments))
            .collect();
        assert_eq!(summary, [(0, 120, 0, 2), (120, 120, 2, 2), (240, 75, 4, 2)]);
        assert_eq!(units[1].first_pts, 4 * 90_000);
    }

    #[test]
    fn a_video_shorter_than_a_unit_is_one_unit() {
        let pts = cfr(45, (30, 1), 0);
        let units = plan(&pts, TB90K, 4, 3).unwrap();
        assert_eq!(
            units,
            [Unit {
                index: 0,
                first_frame: 0,
                first_pts: 0,
                frames: 45,
                first_segment: 0,
                segments: 1,
            }]
        );
        // A single frame too.
        assert_eq!(plan(&[7], MS, 4, 1).unwrap()[0].frames, 1);
    }

    #[test]
    fn ntsc_rates_cut_on_the_first_frame_at_or_after_each_boundary() {
        // 29.97 fps from a non-zero start (an edit list, a stream that starts late): the grid
        // is from the first frame. 4 s is 119.88 frames: the boundary frame is 120 (4.004 s),
        // never 119 (3.970 s); 8 s is 239.76 frames: frame 240.
        let pts = cfr(600, (30_000, 1001), 1234);
        let units = plan(&pts, TB90K, 4, 1).unwrap();
        check_tiling(&units, &pts);
        let firsts: Vec<u64> = units.iter().map(|u| u.first_frame).collect();
        assert_eq!(firsts, [0, 120, 240, 360, 480]);
        // Exactly on a boundary counts as after it.
        let exact = [0, 3999, 4000, 7999, 8000];
        let firsts: Vec<u64> = plan(&exact, MS, 4, 1)
            .unwrap()
            .iter()
            .map(|u| u.first_frame)
            .collect();
        assert_eq!(firsts, [0, 2, 4]);
    }

    #[test]
    fn variable_frame_rates_and_gaps_keep_the_grid() {
        // Frames 1/30 s and 1/10 s apart by turns, then a 9 s pause (two empty 4 s cells: no
        // segment for them, as a one-run encode makes none), then 2 s more.
        let mut pts = Vec::new();
        let mut t = 0;
        while t < 10_000 {
            pts.push(t);
            t += if pts.len() % 2 == 0 { 100 } else { 33 };
        }
        let before_gap = pts.len();
        for i in 0..60 {
            pts.push(19_000 + i * 33);
        }
        let units = plan(&pts, MS, 4, 2).unwrap();
        check_tiling(&units, &pts);
        // Cells 0, 1 | 2, 4 (after the gap: cell 4 at 19 s and cell 5 from 20 s) | 5.
        let summary: Vec<(i64, u32, u32)> = units
            .iter()
            .map(|u| (u.first_pts, u.first_segment, u.segments))
            .collect();
        assert_eq!(summary[0], (0, 0, 2));
        assert_eq!(summary[1].1, 2);
        assert!(summary[1].0 >= 8_000 && summary[1].0 < 8_133, "{summary:?}");
        // Unit 1 is cell 2 (8-10 s) and cell 4 (19-20 s): the empty cell 3 is skipped.
        assert_eq!(
            units[1].frames as usize,
            before_gap - units[0].frames as usize + 31
        );
        assert_eq!(summary[2], (20_023, 4, 1));
    }

    #[test]
    fn the_plan_is_deterministic_and_refuses_what_it_cannot_tile() {
        let pts = cfr(1000, (25, 1), 0);
        assert_eq!(plan(&pts, TB90K, 4, 3), plan(&pts, TB90K, 4, 3));
        assert_eq!(plan(&[], MS, 4, 1), Err(PlanError::NoFrames));
        assert_eq!(
            plan(&[0, 40, 40], MS, 4, 1),
            Err(PlanError::NotIncreasing { frame: 2 })
        );
        assert_eq!(
            plan(&[0, 40, 20], MS, 4, 1),
            Err(PlanError::NotIncreasing { frame: 2 })
        );
        assert!(matches!(plan(&pts, MS, 0, 1), Err(PlanError::Invalid(_))));
        assert!(matches!(plan(&pts, MS, 4, 0), Err(PlanError::Invalid(_))));
        let zero = TimeBase { num: 0, den: 1 };
        assert!(matches!(plan(&pts, zero, 4, 1), Err(PlanError::Invalid(_))));
    }
}
