//! What a job is, and what it ended with: a request, or a part of a long video spread over the
//! fleet (see `crate::units`), answered or handed on.

use super::response::Done;
use crate::contract::{MediaType, OptimizeRequest, OptimizeResponse, SourceInfo};
use crate::media::part::Unit;
use crate::stages::manifest::Produced;
use crate::units::PlanRef;
use crate::units::store::{PlanRecord, UnitRecord};

/// What a job ended with.
pub enum Answer {
    Respond(Box<OptimizeResponse>),
    /// Nothing to publish: handed on (see `crate::units`).
    HandedOff,
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
    Stitch {
        plan: PlanRef,
        record: Box<PlanRecord>,
        units: Vec<UnitRecord>,
    },
}

/// A request whose media job came back planned.
pub struct Handing<'a> {
    pub req: &'a OptimizeRequest,
    pub source: &'a SourceInfo,
    pub fingerprint: &'a str,
    pub units: Vec<Unit>,
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
