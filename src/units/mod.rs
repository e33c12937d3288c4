//! A long video through the whole fleet: a plan of units, each unit a short job of its own on
//! any worker, and one stitch. The media side (what a plan, a unit and the stitch make) is
//! `media::video::units`; this room is the protocol, which rides on storage records and a Kafka
//! topic of its own (`kafka.unit_topic`), consumed by the same workers in the same group.
//!
//! 1. **Plan.** The worker that takes a request for a video longer than the profile's
//!    `units_after_secs` runs its media job as `Part::Plan`: probe, plan, loudness over the
//!    whole program and the audio, encoded once. For an MP4/MOV it reads only what that takes:
//!    the header and index first, from which `Part::Index` names the rest (the audio and the
//!    first packets; `media::video::reads`). It stores the audio's pieces and the plan
//!    ([`store`], under a key derived from the source version and the profile's fingerprint),
//!    then sends one task per unit that has no record yet to the unit topic, keyed
//!    `{plan_id}/{index}` so that a video's units spread over the partitions. Then its request
//!    is done: its offset commits with no response yet. The plan and the tasks are durable
//!    before that commit, so a crash before it redelivers the request, which finds the same
//!    plan and re-issues only the units without a record.
//! 2. **Units.** A unit task is a job like any other (a pool permit, the sandbox, retries, held
//!    while the pod is sick): it downloads its part of the source (the byte ranges the plan
//!    found for it, `media::video::reads`, each read only from the planned version; the whole
//!    file for other containers, and once more whole if its encode fails on the part), encodes
//!    its range (`Part::Unit`), stores its pieces, then its record, then publishes a progress
//!    event of the request (units landed of the plan's; with `early_playback`, the growing
//!    playlist extended first: `job::early`). At most one less than the pool's permits of a
//!    pod's in-flight places go to unit tasks, so requests keep flowing beside a long video
//!    (`kafka::flow`). A unit
//!    with a record is not encoded again (checked before it starts and once it holds its
//!    permit). A unit that fails for good records the failure, and units not started yet are
//!    skipped; a request sent again after that failure forgets it and keeps the landed units.
//! 3. **Stitch.** The worker that records a plan's last missing unit (or a failure) sends the
//!    stitch task, keyed by the plan. The stitch reads the records, downloads the pieces, makes
//!    every output (`Part::Stitch`: playlists, MPD, MP4s assembled without encoding, storyboard,
//!    poster), uploads them under the keys a one-run encode uses, writes the manifest and
//!    publishes the request's one response; then it marks the plan answered, so a later stitch
//!    task (two last units recorded at once) publishes nothing, ends the early stream (closed,
//!    or deleted after a failure), and, the video done, deletes the pieces. Two stitch tasks running at the same moment can both answer: at least once,
//!    like every response of this worker.
//!
//! **Who waits: nobody.** No task waits for another: the request ends once its units are
//! sent, a unit once it is recorded, and the stitch only starts when every record is there.
//! So no permit and no place in `MAX_IN_FLIGHT` is held by waiting, and no offset is held
//! for the length of a video (a crash redoes one unit, not the partition behind a long job).
//! Nothing is lost: every task is a Kafka record acknowledged only after its record (or its
//! response) is stored, so a worker that dies mid-unit has the task redelivered to another.
//! A unit stuck in native code is killed at its time limit (`timeout`, like any job: a failure
//! for good, which answers the request).

pub mod store;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

pub use store::PlanRef;

/// A record on the unit topic: one unit of a plan, or its stitch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    pub plan: PlanRef,
    /// The unit's index; none for the stitch.
    pub unit: Option<u32>,
}

impl Task {
    /// `{plan_id}/{index}`: one video's units over many partitions; the stitch `{plan_id}`.
    pub fn key(&self) -> String {
        match self.unit {
            Some(i) => format!("{}/{i}", self.plan.id()),
            None => self.plan.id().to_owned(),
        }
    }
}

/// Sends tasks to the unit topic, each durably (acknowledged by the broker) before it returns.
#[async_trait]
pub trait Dispatch: Send + Sync {
    async fn send(&self, task: &Task) -> Result<(), String>;
}
