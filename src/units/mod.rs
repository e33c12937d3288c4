//! A long video through the whole fleet: a plan of units, each unit a short job of its own on
//! any worker, and one stitch. The media side (what a plan, a unit and the stitch make) is
//! `media::video::units`; this room is the protocol, which rides on storage records and a Kafka
//! topic of its own (`kafka.unit_topic`), consumed by the same workers in a group of its own
//! (`kafka.unit_group_id`: every member gets a share of the units whatever the assignor; new,
//! it starts where the request group left the topic: `kafka::handover`).
//!
//! 1. **Plan.** The worker that takes a request for a video longer than the profile's
//!    `units_after_secs` runs its media job as `Part::Plan`: probe, plan (the units, the bytes
//!    each reads and the bytes the audio reads, from the index: seconds for an hour). For an
//!    MP4/MOV it reads only what the plan takes: the header and index first, from which
//!    `Part::Index` names the rest (the first packets; `media::video::reads`). It stores the
//!    plan ([`store`], under a key derived from the source version and the profile's
//!    fingerprint), then sends to the unit topic a task for the audio and one per unit that has
//!    no record yet, keyed `{plan_id}/audio` and `{plan_id}/{index}` and sent to the partitions
//!    in turn from one drawn from the plan id ([`Task::place`]), so that one video's units
//!    spread evenly over the group's members, and several videos' first units and audios do
//!    too. Then its request is done: its offset commits with no response yet. The plan and
//!    the tasks are durable before that commit, so a crash before it redelivers the request,
//!    which finds the same plan and re-issues only the parts without a record.
//! 2. **Audio.** A task like a unit (below), sent first: loudness measured over the whole
//!    program, then the audio encoded and normalised once (`Part::Audio`, from the audio's
//!    packets alone), its pieces stored and its record (`records/audio.json`). Made beside the
//!    first units, on another core. A task of its own, not the request's work, so that a
//!    drain or a crash redoes the audio alone, never the plan with its units re-sent. With
//!    `early_playback`, the audio's **opening** goes first, a task of its own
//!    (`Part::Opening`, `{plan_id}/opening`): its first seconds (a tenth of the program, at
//!    most two minutes), measured and encoded on their own in a few seconds, into the early
//!    stream only (`records/opening.json`). The stream plays once the first unit and the
//!    opening are done, whatever the video's length: 20 minutes of audio take a core a minute.
//!    Its failure fails nothing: the early stream then waits for the whole audio.
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
//!    least one sees both. When the unit topic cannot take it (its metadata counts no
//!    partition, or the send fails within its bound: the topic deleted or recreated, an ACL
//!    answer), that part's task runs the stitch itself and answers: the request was committed
//!    at hand-off, and nothing else would answer it. The stitch reads the records, downloads
//!    the pieces, makes every output (`Part::Stitch`: playlists, MPD, MP4s assembled without
//!    encoding, storyboard, poster), uploads them under the keys a one-run encode uses and
//!    writes the manifest.
//! 5. **One answer.** Before that work, once the records say the stitch can answer (every
//!    part landed, or one failed for good), the task claims the answer: `records/answered`, written only where
//!    nothing is (`Storage::create`: S3's `If-None-Match: *`, decided atomically by S3 and on
//!    local files; s3s-fs checks, then writes), naming the task (its record on
//!    the unit topic, in its group: [`store::Answered`]). The task whose claim it is publishes
//!    the response, marks its claim published, ends the early stream (closed, or deleted
//!    after a failure) and, the video done, deletes the pieces. A task that finds the answer
//!    another's stitches nothing and publishes nothing; so two pods that take one plan's stitch at once (a rebalance whose
//!    drain ran out, two parts landing at once on two pods, a stitch task taken in two groups
//!    while a new unit group replays the topic: docs/operations.md, "Upgrading") answer once.
//!    A claimant that dies before it publishes leaves its claim, not the request unanswered:
//!    its record is delivered again in its group, and that delivery (the same name) takes the
//!    claim as its own, whatever task it is, stitches again (replayed from the manifest once
//!    the outputs are written) and publishes. Only a claimant that dies between its publish
//!    and its mark answers twice, on its record's redelivery: the gap between publishing and
//!    committing that every response of this worker has (at least once). A plan's stitch tasks
//!    share its key, so its partition and its pod, which takes them one at a time
//!    ([`Stitches`]): the second finds the plan answered rather than stitching it again.
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

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

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
    /// The audio's opening, for the early stream (`media::part::Opening`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub opening: bool,
}

impl Task {
    pub fn unit(plan: &PlanRef, index: u32) -> Task {
        Task {
            plan: plan.clone(),
            unit: Some(index),
            audio: false,
            opening: false,
        }
    }

    pub fn audio(plan: &PlanRef) -> Task {
        Task {
            plan: plan.clone(),
            unit: None,
            audio: true,
            opening: false,
        }
    }

    pub fn opening(plan: &PlanRef) -> Task {
        Task {
            plan: plan.clone(),
            unit: None,
            audio: false,
            opening: true,
        }
    }

    pub fn stitch(plan: &PlanRef) -> Task {
        Task {
            plan: plan.clone(),
            unit: None,
            audio: false,
            opening: false,
        }
    }

    /// The stitch: neither a unit nor the audio nor its opening.
    pub fn is_stitch(&self) -> bool {
        self.unit.is_none() && !self.audio && !self.opening
    }

    /// Where the task goes among the unit topic's partitions. Units in turn from the plan's
    /// own first partition (unit `i` to the `(first + i)`th, modulo their count, `first` from
    /// the plan id): a key's hash put 30 units 18 and 12 on two members as often as not, and
    /// the one with 18 set the video's time; and with every plan starting at partition 0, one
    /// member held every video's unit 0 and another every audio, so that under several long
    /// videos each stream's first unit and its audio queued behind the other videos'. The
    /// audio goes across from its unit 0 (partition `count - 1 - first`): the two make the
    /// stream playable, and a group of two splits four partitions 0-1 / 2-3 (measured under
    /// the consumer protocol) or 0-2 / 1-3, so they run on two members at once rather than one
    /// after the other, whatever `first`; the audio's opening before it there (sent first,
    /// taken first). The stitch goes by its key (all of a plan's stitches to one partition,
    /// see [`Stitches`]).
    pub fn place(&self) -> Option<Place> {
        let first = self.plan.first();
        match (self.unit, self.audio || self.opening) {
            (Some(i), _) => Some(Place::Nth { first, n: i }),
            (None, true) => Some(Place::Across { first }),
            (None, false) => None,
        }
    }

    /// Whether a unit-topic task, by its key ([`Task::key`]), goes before the other tasks a
    /// member holds (`kafka::ahead`): a plan's first unit and its audio's opening (what makes
    /// its stream playable) and its stitch (what answers it); not the other units, nor the
    /// whole audio (the opening plays until it lands).
    pub fn is_urgent_key(key: Option<&[u8]>) -> bool {
        let Some(key) = key.and_then(|k| std::str::from_utf8(k).ok()) else {
            return false;
        };
        match key.split_once('/') {
            None => true,
            Some((_, part)) => part == "0" || part == "opening",
        }
    }

    /// `{plan_id}/{index}`: one video's units over many partitions; `{plan_id}/audio`,
    /// `{plan_id}/opening`; the stitch `{plan_id}`.
    pub fn key(&self) -> String {
        match (self.unit, self.audio, self.opening) {
            (Some(i), _, _) => format!("{}/{i}", self.plan.id()),
            (None, true, _) => format!("{}/audio", self.plan.id()),
            (None, false, true) => format!("{}/opening", self.plan.id()),
            (None, false, false) => self.plan.id().to_owned(),
        }
    }
}

/// A task's partition of the unit topic ([`Task::place`]), from its plan's first (a number
/// drawn from the plan id, taken modulo the partitions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// The `n`th after the plan's first, modulo the partitions.
    Nth { first: u64, n: u32 },
    /// Across from the plan's first: the partitions counted back from the last.
    Across { first: u64 },
}

impl Place {
    /// The partition among `partitions` (> 0).
    pub fn among(self, partitions: u32) -> u32 {
        let first = |f: u64| (f % u64::from(partitions)) as u32;
        match self {
            Place::Nth { first: f, n } => (first(f) + n % partitions) % partitions,
            Place::Across { first: f } => partitions - 1 - first(f),
        }
    }
}

/// The stitches in hand on this pod, by plan: a plan's stitch tasks share its key, so its
/// partition, so its pod (but across a rebalance); taken one at a time there, each after the
/// first finds the plan answered, rather than stitching it again for nothing (the answer is
/// once per plan whatever pods stitch it: `crate::units`, "One answer"). Two parts landing at once, or a part's task redelivered
/// after its record, send a plan's stitch more than once, and a pod of three or more permits
/// takes two unit-topic tasks at once.
#[derive(Default)]
pub struct Stitches(Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

/// A plan's stitch held on this pod (see [`Stitches`]), let go when dropped.
pub struct Stitching<'a> {
    stitches: &'a Stitches,
    plan: String,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Stitches {
    /// Holds `plan`'s stitch, once the one in hand (if any) is done.
    pub async fn hold(&self, plan: &str) -> Stitching<'_> {
        let lock = {
            let mut held = self.0.lock().expect("not poisoned");
            held.entry(plan.to_owned()).or_default().clone()
        };
        // Made before the wait, so that a wait given up (at shutdown) forgets the plan too.
        let mut held = Stitching {
            stitches: self,
            plan: plan.to_owned(),
            guard: None,
        };
        held.guard = Some(match lock.clone().try_lock_owned() {
            Ok(g) => g,
            Err(_) => {
                tracing::info!(
                    plan,
                    "a stitch of this plan is in hand here: taken after it"
                );
                lock.lock_owned().await
            }
        });
        held
    }
}

impl Drop for Stitching<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut held = self.stitches.0.lock().expect("not poisoned");
        // The last holder or waiter gone (only the map's handle left): forgotten.
        if held
            .get(&self.plan)
            .is_some_and(|l| Arc::strong_count(l) == 1)
        {
            held.remove(&self.plan);
        }
    }
}

/// Sends tasks to the unit topic, each durably (acknowledged by the broker) before it returns.
#[async_trait]
pub trait Dispatch: Send + Sync {
    async fn send(&self, task: &Task) -> Result<(), String>;

    /// Whether tasks can be sent now (the unit topic exists); when not, a long video is
    /// encoded by the worker that takes it, as without a unit topic.
    fn available(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(id: &str) -> PlanRef {
        PlanRef {
            bucket: "media".into(),
            prefix: format!("u/videos/m/units/{id}/"),
        }
    }

    /// What makes a video playable (its first unit, its audio's opening) and what answers it
    /// (its stitch) go first; the other units and the whole audio in their turn.
    #[test]
    fn a_plans_first_unit_opening_and_stitch_are_urgent_by_their_keys() {
        let p = plan("00000000deadbeef");
        let urgent = |t: Task| Task::is_urgent_key(Some(t.key().as_bytes()));
        assert!(urgent(Task::unit(&p, 0)));
        assert!(urgent(Task::opening(&p)));
        assert!(urgent(Task::stitch(&p)));
        assert!(!urgent(Task::unit(&p, 1)));
        assert!(!urgent(Task::unit(&p, 10)));
        assert!(!urgent(Task::audio(&p)));
        assert!(!Task::is_urgent_key(None));
    }

    #[test]
    fn units_go_to_the_partitions_in_turn_from_the_plans_first_and_the_audio_across() {
        let on = |t: Task, n| t.place().map(|p| p.among(n));
        // Every first partition of four, and where a two-member group puts each partition
        // (0-1 / 2-3, and 0-2 / 1-3).
        let firsts: Vec<PlanRef> = (0..4u64)
            .map(|f| plan(&format!("{:016x}", f << 32)))
            .collect();
        for (f, plan) in firsts.iter().enumerate() {
            let f = f as u32;
            let units: Vec<_> = (0..9).map(|i| on(Task::unit(plan, i), 4)).collect();
            let turn: Vec<_> = (0..9).map(|i| Some((f + i) % 4)).collect();
            assert_eq!(units, turn, "from partition {f}");
            let audio = on(Task::audio(plan), 4).unwrap();
            for member in [|p: u32| p / 2, |p: u32| p % 2] {
                assert_ne!(
                    member(audio),
                    member(f),
                    "unit 0 on {f}, the audio on {audio}"
                );
            }
            assert_eq!(on(Task::opening(plan), 4), Some(audio), "beside the audio");
            assert_eq!(on(Task::audio(plan), 1), Some(0));
            assert_eq!(on(Task::stitch(plan), 4), None, "by its key");
        }
        // Plans' ids are hashes: over many, each partition holds a fair share of unit 0s.
        let mut zeros = [0; 4];
        for v in 0..400 {
            let id = crate::stages::manifest::fnv1a(&format!("uploads|v/{v}.mp4|etag|fp"));
            zeros[on(Task::unit(&plan(&id), 0), 4).unwrap() as usize] += 1;
        }
        assert!(zeros.iter().all(|&n| (70..=130).contains(&n)), "{zeros:?}");
        // An id that is no hash (none is made so) starts at the first.
        assert_eq!(on(Task::unit(&plan("not-hex"), 1), 4), Some(1));
    }

    #[test]
    fn each_part_has_a_key_of_its_own_and_a_task_without_the_audio_field_is_the_stitch() {
        let plan = plan("0123456789abcdef");
        let keys = [
            Task::unit(&plan, 3),
            Task::audio(&plan),
            Task::opening(&plan),
            Task::stitch(&plan),
        ]
        .map(|t| t.key());
        assert_eq!(
            keys,
            [
                "0123456789abcdef/3",
                "0123456789abcdef/audio",
                "0123456789abcdef/opening",
                "0123456789abcdef"
            ]
        );
        for t in [
            Task::unit(&plan, 3),
            Task::audio(&plan),
            Task::opening(&plan),
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
        assert!(Task::stitch(&plan).is_stitch() && !Task::opening(&plan).is_stitch());
    }

    #[tokio::test]
    async fn a_plans_stitches_are_held_one_at_a_time_and_then_forgotten() {
        let stitches = Stitches::default();
        let first = stitches.hold("a").await;
        // Another plan's stitch is not held up.
        drop(stitches.hold("b").await);
        let mut second = Box::pin(stitches.hold("a"));
        tokio::select! {
            biased;
            _ = &mut second => panic!("a plan's stitch held twice at once"),
            _ = async {} => {}
        }
        drop(first);
        drop(second.await);
        assert!(stitches.0.lock().unwrap().is_empty());
    }
}
