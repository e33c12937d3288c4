//! What a job is, and what it ended with: a request, or a part of a long video spread over the
//! fleet (see `crate::units`), answered or handed on.

use super::response::Done;
use crate::contract::{MediaType, OptimizeRequest, OptimizeResponse, SourceInfo};
use crate::media::part::Unit;
use crate::stages::manifest::Produced;
use crate::units::PlanRef;
use crate::units::store::{AudioRecord, PlanRecord, UnitRecord};

/// What a job ended with.
pub enum Answer {
    Respond(Box<OptimizeResponse>),
    /// Nothing to publish: handed on (see `crate::units`).
    HandedOff,
}

/// A part of a long video landed: `landed` units of the plan's `of`; `playable`: the master
/// playlist's key, when this part made the early stream playable.
#[derive(Debug, Clone, PartialEq)]
pub struct Progressed {
    pub landed: usize,
    pub of: usize,
    pub playable: Option<String>,
}

/// What a job is to a long video.
pub enum As {
    /// A request (planned, and handed on when the runner has a dispatch).
    Request,
    Unit {
        plan: PlanRef,
        record: Box<PlanRecord>,
        unit: Unit,
    },
    /// The whole video's audio.
    Audio {
        plan: PlanRef,
        record: Box<PlanRecord>,
    },
    /// The audio's opening, for the early stream (`media::part::Opening`).
    Opening {
        plan: PlanRef,
        record: Box<PlanRecord>,
    },
    Stitch {
        plan: PlanRef,
        record: Box<PlanRecord>,
        audio: Box<AudioRecord>,
        units: Vec<UnitRecord>,
    },
}

impl As {
    /// A task of the unit topic (a part or the stitch), not a request.
    pub fn is_task(&self) -> bool {
        !matches!(self, As::Request)
    }

    /// A part of a planned video (a unit, the audio or its opening): its plan, the plan's
    /// record, the bytes of the source it reads (empty: the whole file) and the key of its
    /// record.
    pub fn part(&self) -> Option<(&PlanRef, &PlanRecord, &[[u64; 2]], String)> {
        match self {
            As::Unit { plan, record, unit } => {
                Some((plan, record, &unit.reads, plan.unit_key(unit.index)))
            }
            As::Audio { plan, record } => {
                Some((plan, record, &record.audio_reads, plan.audio_key()))
            }
            As::Opening { plan, record } => {
                let reads = record.opening.as_ref().map_or(&[][..], |o| &o.reads);
                Some((plan, record, reads, plan.opening_key()))
            }
            As::Request | As::Stitch { .. } => None,
        }
    }
}

/// A request whose media job came back planned.
pub struct Handing<'a> {
    pub req: &'a OptimizeRequest,
    pub source: &'a SourceInfo,
    pub fingerprint: &'a str,
    pub units: Vec<Unit>,
    /// The bytes of the source the audio reads (empty: the whole file).
    pub audio_reads: Vec<[u64; 2]>,
    pub opening: Option<crate::media::part::Opening>,
}

/// What a job handed on reports: nothing to publish.
pub(super) fn handed_off(source: &SourceInfo) -> Done {
    Done {
        produced: Produced {
            media_type: MediaType::Video,
            source: source.clone(),
            outputs: Vec::new(),
            analysis: None,
            warnings: Vec::new(),
        },
        replayed: false,
        source_missing: false,
        handed_off: true,
    }
}
