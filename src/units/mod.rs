//! A long video through the whole fleet: a plan of units, each unit a short job of its own on
//! any worker, and one stitch. The media side (what a plan, a unit and the stitch make) is
//! `media::video::units`; this room is the protocol, which rides on storage records and a Kafka
//! topic of its own (`kafka.unit_topic`), consumed by the same workers in the same group.
//!
//! 1. **Plan.** The worker that takes a request for a video longer than the profile's
//!    `units_after_secs` runs its media job as `Part::Plan`: probe, plan (the units, the bytes
//!    each reads and the bytes the audio reads, from the index: seconds for an hour). For an
//!    MP4/MOV it reads only what the plan takes: the header and index first, from which
//!    `Part::Index` names the rest (the first packets; `media::video::reads`). It stores the
//!    plan ([`store`], under a key derived from the source version and the profile's
//!    fingerprint), then sends to the unit topic a task for the audio and one per unit that has
//!    no record yet, keyed `{plan_id}/audio` and `{plan_id}/{index}` so that they spread over
//!    the partitions. Then its request is done: its offset commits with no response yet. The
//!    plan and the tasks are durable before that commit, so a crash before it redelivers the
//!    request, which finds the same plan and re-issues only the parts without a record.
//! 2. **Audio.** A task like a unit (below), sent first: loudness measured over the whole
//!    program, then the audio encoded and normalised once (`Part::Audio`, from the audio's
//!    packets alone), its pieces stored and its record (`records/audio.json`). Made beside the
//!    first units, on another core, so that the stream plays once the first unit is done
//!    (the early master names the audio), whatever the video's length: not after the whole
//!    program's audio and then a unit. A task of its own, not the request's work, so that a
//!    drain or a crash redoes the audio alone, never the plan with its units re-sent.
//! 3. **Units.** A unit task (and the audio's) is a job like any other (a pool permit, the
//!    sandbox, retries, held while the pod is sick): it downloads its part of the source (the
//!    byte ranges the plan found for it, `media::video::reads`, each read only from the planned
//!    version; the whole file for other containers, and once more whole if its work fails on
//!    the part), encodes its range (`Part::Unit`), stores its pieces, then its record, then
//!    publishes a progress event of the request (units landed of the plan's; with
//!    `early_playback`, the growing playlist extended first: `job::early`). At most one less
//!    than the pool's permits of a pod's in-flight places go to unit-topic tasks (a one-permit
//!    pod runs its one on a lane of its own beside its permit), and parts run at a lower CPU
//!    priority, so requests keep flowing beside a long video (`kafka::flow`,
//!    `Settings::parts_lane`). A part with a record is not made again
//!    (checked before it starts and once it holds its permit). A part that fails for good
//!    records the failure, and parts not started yet are skipped; a request sent again after
//!    that failure forgets it and keeps the landed parts.
//! 4. **Stitch.** The worker that records a plan's last missing part (the last unit, or the
//!    audio after every unit; or a part's failure) sends the stitch task, keyed by the plan:
//!    each part writes its record before it lists the others', so of two landing at once at
//!    least one sees both. The stitch reads the records, downloads the pieces, makes
//!    every output (`Part::Stitch`: playlists, MPD, MP4s assembled without encoding, storyboard,
//!    poster), uploads them under the keys a one-run encode uses, writes the manifest and
//!    publishes the request's one response; then it marks the plan answered, so a later stitch
//!    task (two last units recorded at once) publishes nothing, ends the early stream (closed,
//!    or deleted after a failure), and, the video done, deletes the pieces. Two stitch tasks
//!    running at the same moment can both answer: at least once, like every response of this
//!    worker.
//!
//! **Who waits: nobody.** No task waits for another: the request ends once its tasks are
//! sent, a unit or the audio once it is recorded, and the stitch only starts when every record is there.
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
    /// The unit's index; none for the audio and the stitch.
    pub unit: Option<u32>,
    /// The whole video's audio.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub audio: bool,
}

impl Task {
    pub fn unit(plan: &PlanRef, index: u32) -> Task {
        Task {
            plan: plan.clone(),
            unit: Some(index),
            audio: false,
        }
    }

    pub fn audio(plan: &PlanRef) -> Task {
        Task {
            plan: plan.clone(),
            unit: None,
            audio: true,
        }
    }

    pub fn stitch(plan: &PlanRef) -> Task {
        Task {
            plan: plan.clone(),
            unit: None,
            audio: false,
        }
    }

    /// `{plan_id}/{index}`: one video's units over many partitions; `{plan_id}/audio`; the
    /// stitch `{plan_id}`.
    pub fn key(&self) -> String {
        match (self.unit, self.audio) {
            (Some(i), _) => format!("{}/{i}", self.plan.id()),
            (None, true) => format!("{}/audio", self.plan.id()),
            (None, false) => self.plan.id().to_owned(),
        }
    }
}

/// Sends tasks to the unit topic, each durably (acknowledged by the broker) before it returns.
#[async_trait]
pub trait Dispatch: Send + Sync {
    async fn send(&self, task: &Task) -> Result<(), String>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_part_has_a_key_of_its_own_and_a_task_without_the_audio_field_is_the_stitch() {
        let plan = PlanRef {
            bucket: "media".into(),
            prefix: "u/videos/m/units/0123456789abcdef/".into(),
        };
        let keys = [
            Task::unit(&plan, 3),
            Task::audio(&plan),
            Task::stitch(&plan),
        ]
        .map(|t| t.key());
        assert_eq!(
            keys,
            [
                "0123456789abcdef/3",
                "0123456789abcdef/audio",
                "0123456789abcdef"
            ]
        );
        for t in [
            Task::unit(&plan, 3),
            Task::audio(&plan),
            Task::stitch(&plan),
        ] {
            let json = serde_json::to_string(&t).unwrap();
            assert_eq!(serde_json::from_str::<Task>(&json).unwrap(), t);
        }
        let stitch = r#"{"plan":{"bucket":"media","prefix":"u/videos/m/units/0123456789abcdef/"},"unit":null}"#;
        assert_eq!(
            serde_json::from_str::<Task>(stitch).unwrap(),
            Task::stitch(&plan)
        );
    }
}
