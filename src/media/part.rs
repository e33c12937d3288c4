//! Which part of a long video's work a media job is (see `video::units`): the whole job (every
//! image, every short video, and a long one on a worker that cannot spread it), or one of the
//! parts a long video is spread as: its plan, its audio (made once), the audio's opening (for
//! its early stream), a unit, the stitch.

use serde::{Deserialize, Serialize};

use crate::contract::VideoAnalysis;
use crate::media::track::Track;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub enum Part {
    /// Everything, here (a long video's units one after another).
    #[default]
    Whole,
    /// Probe and plan: a video planned as units gets its plan only (the output's `plan` says
    /// which units to encode); any other input is done whole.
    Plan,
    /// A planned video's audio, once for the whole program (its loudness measured first).
    Audio,
    /// The first seconds of a planned video's audio, measured and encoded on their own, for
    /// its early stream alone (see [`Opening`]).
    Opening(u32),
    /// Before the plan, on a worker that spreads long videos: what of the source the plan
    /// reads, decided from the source's header and index alone (`video::reads`). The output's
    /// `reads`, empty when the file is read whole (a short video, an image, a container not
    /// read in ranges, any doubt).
    Index,
    Unit(Unit),
    /// Everything made of the landed units, whose pieces are in the output directory.
    Stitch(Box<StitchInput>),
}

/// One unit of a plan: its frames on the constant-rate timeline the rungs are encoded at (the
/// frame in slot `n` shown at `n / rate`) and its segments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unit {
    pub index: u32,
    /// Its first frame's slot.
    pub first_slot: i64,
    /// The slot after its last frame; none for the last unit, which takes the video's end
    /// whatever a container says of its duration.
    pub end_slot: Option<i64>,
    pub first_segment: u32,
    pub segments: u32,
    /// The source's bytes it reads (`[start, end)`, see `media::video::reads`); empty: the
    /// whole file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reads: Vec<[u64; 2]>,
}

/// What the stitch is given: the plan's analysis of the source (no poster yet), each unit's
/// tracks (tallest first, segments numbered from the unit's first) and the audio's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StitchInput {
    pub analysis: VideoAnalysis,
    pub units: Vec<Vec<Track>>,
    pub audio: Option<Track>,
}

/// The opening of a planned video's audio: its first `secs` (whole segments), made by a task
/// of its own so that the early stream plays once the first unit is done, not once the whole
/// program's audio is (20 minutes of AAC take a core a minute or more; the opening, a few
/// seconds). Measured and normalised over itself, so its loudness can differ a little from
/// the whole program's, whose segments replace its own in the early stream when they land.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Opening {
    pub secs: u32,
    /// The source's bytes it reads (its audio packets and the container's); empty: the whole
    /// file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reads: Vec<[u64; 2]>,
}
