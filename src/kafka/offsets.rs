//! Which offsets may be committed: per partition, the lowest offset not yet finished.
//!
//! Jobs finish out of order. Kafka stores one position per partition, meaning "everything
//! below this is done", so we may commit only up to the first unfinished offset: committing a
//! later job's offset would skip an earlier, slower one after a crash. Messages arrive in
//! offset order within a partition, so `next` (one past the highest dispatched or held) is the position
//! once nothing is in flight.
//!
//! Each assignment of a partition gets a new generation: a job that finishes after its
//! partition was revoked (and perhaps assigned again) carries the old generation and is ignored,
//! so it never commits for a partition this worker no longer owns. Such a job still runs, so it
//! still counts in [`OffsetTracker::in_flight`] (against `MAX_IN_FLIGHT`) until it ends.
//!
//! A message can be held before it is dispatched (`kafka::ahead`: fetched, waiting while an
//! urgent one later in its partition goes first): it holds the position back as one in flight
//! does, but does not count in flight.
//!
//! A message below the partition's committed position is finished work (a commit covers only
//! finished offsets): one fetched before a rebalance split the partition's queue can still
//! arrive, and is not dispatched again.
//!
//! A position counts as committed when the broker says so, not when the commit is sent: a
//! commit the broker rejects is sent again on the next turn, though nothing new finishes on the
//! partition (an idle partition would otherwise keep its finished work uncommitted until a
//! revoke, and a crash would redo it). Each partition counts its rejected commits in a row:
//! one that keeps failing makes the pod not ready even while the others commit.

use std::collections::{BTreeSet, HashMap};

/// (topic, partition)
pub type Tp = (String, i32);

/// Identifies a dispatched message for [`OffsetTracker::finished`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetToken {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub generation: u64,
}

#[derive(Debug, Default)]
struct PartitionState {
    generation: u64,
    in_flight: BTreeSet<i64>,
    /// Fetched and held for a job, not dispatched yet (`kafka::ahead`): unfinished, not in
    /// flight.
    held: BTreeSet<i64>,
    /// One past the highest dispatched or held offset.
    next: Option<i64>,
    /// Last position sent in a commit not known to have failed.
    sent: Option<i64>,
    /// Last position the broker acknowledged.
    committed: Option<i64>,
    /// Commits rejected in a row.
    failures: u32,
}

impl PartitionState {
    fn position(&self) -> Option<i64> {
        let unfinished = [self.in_flight.first(), self.held.first()];
        unfinished
            .into_iter()
            .flatten()
            .min()
            .copied()
            .or(self.next)
    }
}

#[derive(Debug, Default)]
pub struct OffsetTracker {
    parts: HashMap<Tp, PartitionState>,
    generations: u64,
    /// Jobs still running for revoked partitions, by generation.
    orphans: HashMap<u64, usize>,
}

impl OffsetTracker {
    /// Starts tracking a newly assigned partition.
    pub fn assign(&mut self, tp: Tp) {
        self.generations += 1;
        self.parts.insert(
            tp,
            PartitionState {
                generation: self.generations,
                ..Default::default()
            },
        );
    }

    /// Stops tracking a revoked partition; its running jobs still count until they end.
    pub fn revoke(&mut self, tp: &Tp) {
        if let Some(st) = self.parts.remove(tp)
            && !st.in_flight.is_empty()
        {
            *self.orphans.entry(st.generation).or_default() += st.in_flight.len();
        }
    }

    /// The partitions assigned now.
    pub fn partitions(&self) -> impl Iterator<Item = &Tp> {
        self.parts.keys()
    }

    /// Records a message fetched and held for a job (`kafka::ahead`): unfinished, so no
    /// position passes it until it is dispatched and finished, but not in flight. Its
    /// partition's generation; `None` as for [`OffsetTracker::dispatched`].
    pub fn held(&mut self, topic: &str, partition: i32, offset: i64) -> Option<u64> {
        let st = self.parts.get_mut(&(topic.to_owned(), partition))?;
        if st.sent.max(st.committed).is_some_and(|c| offset < c) {
            return None;
        }
        st.held.insert(offset);
        st.next = Some(st.next.map_or(offset + 1, |n| n.max(offset + 1)));
        Some(st.generation)
    }

    /// The generation of `tp`'s assignment, if it is assigned.
    pub fn generation(&self, tp: &Tp) -> Option<u64> {
        self.parts.get(tp).map(|st| st.generation)
    }

    /// Records a message handed to a job (held before, or not); `None` if its partition is not
    /// assigned, or if the offset is below the position already committed (finished work: not
    /// done twice).
    pub fn dispatched(&mut self, topic: &str, partition: i32, offset: i64) -> Option<OffsetToken> {
        let st = self.parts.get_mut(&(topic.to_owned(), partition))?;
        // Sent positions cover finished work only, whether or not the broker has taken them.
        if st.sent.max(st.committed).is_some_and(|c| offset < c) {
            return None;
        }
        st.held.remove(&offset);
        st.in_flight.insert(offset);
        st.next = Some(st.next.map_or(offset + 1, |n| n.max(offset + 1)));
        Some(OffsetToken {
            topic: topic.to_owned(),
            partition,
            offset,
            generation: st.generation,
        })
    }

    /// Records a finished job (its response is published). Returns false for a stale token
    /// (its partition was revoked meanwhile): nothing to commit, one orphan fewer.
    pub fn finished(&mut self, t: &OffsetToken) -> bool {
        match self.parts.get_mut(&(t.topic.clone(), t.partition)) {
            Some(st) if st.generation == t.generation => st.in_flight.remove(&t.offset),
            _ => {
                if let Some(n) = self.orphans.get_mut(&t.generation) {
                    *n -= 1;
                    if *n == 0 {
                        self.orphans.remove(&t.generation);
                    }
                }
                false
            }
        }
    }

    /// Messages dispatched and not finished, over all partitions, revoked ones included.
    pub fn in_flight(&self) -> usize {
        let assigned: usize = self.parts.values().map(|s| s.in_flight.len()).sum();
        assigned + self.orphans.values().sum::<usize>()
    }

    pub fn in_flight_on(&self, tp: &Tp) -> usize {
        self.parts.get(tp).map_or(0, |s| s.in_flight.len())
    }

    /// Positions that moved since the last commit sent, or whose commit failed (`all`: every
    /// known position, for the commits on revoke and shutdown).
    pub fn committable(&self, all: bool) -> Vec<(Tp, i64)> {
        let mut v: Vec<(Tp, i64)> = self
            .parts
            .iter()
            .filter_map(|(tp, st)| {
                let pos = st.position()?;
                (all || st.sent.is_none_or(|c| pos > c)).then(|| (tp.clone(), pos))
            })
            .collect();
        v.sort();
        v
    }

    /// A commit of `position` was sent: not sent again unless it fails.
    pub fn commit_sent(&mut self, tp: &Tp, position: i64) {
        if let Some(st) = self.parts.get_mut(tp) {
            st.sent = Some(st.sent.map_or(position, |c| c.max(position)));
        }
    }

    /// The broker's answer to a commit of `position` (of a partition still assigned).
    pub fn commit_result(&mut self, tp: &Tp, position: i64, ok: bool) {
        let Some(st) = self.parts.get_mut(tp) else {
            return;
        };
        if ok {
            st.committed = Some(st.committed.map_or(position, |c| c.max(position)));
            st.failures = 0;
        } else if st.sent == Some(position) {
            // Sent again on the next turn. (An older commit that failed after a newer one was
            // sent changes nothing: the newer one covers it.)
            st.sent = st.committed;
            st.failures += 1;
        }
    }

    /// The most commits rejected in a row on any partition.
    pub fn commit_failures(&self) -> u32 {
        self.parts.values().map(|s| s.failures).max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(p: i32) -> Tp {
        ("req".to_owned(), p)
    }

    #[test]
    fn out_of_order_completion_never_skips_an_unfinished_offset() {
        let mut t = OffsetTracker::default();
        t.assign(tp(0));
        let a = t.dispatched("req", 0, 10).unwrap(); // slow
        let b = t.dispatched("req", 0, 11).unwrap();
        let c = t.dispatched("req", 0, 12).unwrap();
        assert!(t.finished(&c));
        assert!(t.finished(&b));
        assert_eq!(t.committable(false), vec![(tp(0), 10)]);
        t.commit_sent(&tp(0), 10);
        t.commit_result(&tp(0), 10, true);
        assert!(
            t.committable(false).is_empty(),
            "nothing new until the slow one ends"
        );
        assert!(t.finished(&a));
        assert_eq!(t.committable(false), vec![(tp(0), 13)]);
        assert_eq!(t.in_flight(), 0);
    }

    /// A held message (fetched, not yet given to a job: `kafka::ahead`) holds the position
    /// back like one in flight, without counting in flight; a later one dispatched before it
    /// and finished moves nothing past it; once it is dispatched and finished, the position
    /// goes past both.
    #[test]
    fn a_held_message_is_never_committed_past_and_is_not_in_flight() {
        let mut t = OffsetTracker::default();
        t.assign(tp(0));
        let generation = t.held("req", 0, 10).unwrap();
        assert_eq!(t.generation(&tp(0)), Some(generation));
        t.held("req", 0, 11).unwrap();
        assert_eq!(t.in_flight(), 0);
        let later = t.dispatched("req", 0, 11).unwrap();
        assert_eq!(t.in_flight(), 1);
        assert!(t.finished(&later));
        assert_eq!(t.committable(false), vec![(tp(0), 10)]);
        let first = t.dispatched("req", 0, 10).unwrap();
        assert!(t.finished(&first));
        assert_eq!(t.committable(false), vec![(tp(0), 12)]);
        // Revoked while held: its generation is gone, as its partition.
        t.held("req", 0, 12).unwrap();
        t.revoke(&tp(0));
        assert_eq!((t.generation(&tp(0)), t.in_flight()), (None, 0));
    }

    #[test]
    fn partitions_are_independent() {
        let mut t = OffsetTracker::default();
        t.assign(tp(0));
        t.assign(tp(1));
        let _slow = t.dispatched("req", 0, 0).unwrap();
        let fast = t.dispatched("req", 1, 5).unwrap();
        t.finished(&fast);
        assert_eq!(t.committable(false), vec![(tp(0), 0), (tp(1), 6)]);
    }

    #[test]
    fn a_token_from_a_previous_assignment_is_ignored() {
        let mut t = OffsetTracker::default();
        t.assign(tp(0));
        let old = t.dispatched("req", 0, 3).unwrap();
        t.revoke(&tp(0));
        assert!(!t.finished(&old), "partition not owned");
        t.assign(tp(0));
        let new = t.dispatched("req", 0, 3).unwrap();
        assert!(!t.finished(&old), "stale generation");
        assert_eq!(t.in_flight(), 1);
        assert!(t.finished(&new));
        assert!(t.dispatched("req", 7, 0).is_none(), "unassigned partition");
    }

    #[test]
    fn jobs_of_a_revoked_partition_count_until_they_end() {
        let mut t = OffsetTracker::default();
        t.assign(tp(0));
        t.assign(tp(1));
        let a = t.dispatched("req", 0, 0).unwrap();
        let b = t.dispatched("req", 0, 1).unwrap();
        t.dispatched("req", 1, 0).unwrap();
        t.revoke(&tp(0));
        assert_eq!(
            t.in_flight(),
            3,
            "the revoked partition's two jobs still run"
        );
        assert!(
            !t.finished(&a),
            "nothing to commit for a partition not owned"
        );
        assert_eq!(t.in_flight(), 2);
        assert!(!t.finished(&b));
        assert_eq!(t.in_flight(), 1);
        assert!(!t.finished(&b), "a second report changes nothing");
        assert_eq!(t.in_flight(), 1);
    }

    #[test]
    fn nothing_below_a_committed_position_is_dispatched_again() {
        // The queue-split window: a message fetched into the consumer's own queue before its
        // partition's queue was split arrives after later offsets were done and committed.
        let mut t = OffsetTracker::default();
        t.assign(tp(0));
        for o in [4, 5] {
            let done = t.dispatched("req", 0, o).unwrap();
            assert!(t.finished(&done));
        }
        assert_eq!(t.committable(false), vec![(tp(0), 6)]);
        t.commit_sent(&tp(0), 6);
        t.commit_result(&tp(0), 6, true);
        assert!(
            t.dispatched("req", 0, 4).is_none(),
            "finished and committed"
        );
        assert!(t.dispatched("req", 0, 5).is_none());
        assert!(
            t.dispatched("req", 0, 6).is_some(),
            "the next one is new work"
        );
        assert_eq!(
            t.committable(false),
            Vec::new(),
            "and the position never goes back"
        );
    }

    #[test]
    fn a_rejected_commit_is_sent_again_and_counted_per_partition() {
        let mut t = OffsetTracker::default();
        t.assign(tp(0));
        t.assign(tp(1));
        let done = t.dispatched("req", 0, 0).unwrap();
        assert!(t.finished(&done));
        let other = t.dispatched("req", 1, 0).unwrap();
        assert!(t.finished(&other));
        assert_eq!(t.committable(false), vec![(tp(0), 1), (tp(1), 1)]);
        for (p, _) in t.committable(false) {
            t.commit_sent(&p, 1);
        }
        assert!(t.committable(false).is_empty(), "in flight: not sent twice");
        t.commit_result(&tp(0), 1, false);
        t.commit_result(&tp(1), 1, true);
        assert_eq!(
            t.committable(false),
            vec![(tp(0), 1)],
            "the rejected one again, though nothing new finished"
        );
        assert_eq!(t.commit_failures(), 1);
        t.commit_sent(&tp(0), 1);
        t.commit_result(&tp(0), 1, false);
        assert_eq!(t.commit_failures(), 2, "counted per partition, in a row");
        t.commit_sent(&tp(0), 1);
        t.commit_result(&tp(0), 1, true);
        assert_eq!(t.commit_failures(), 0);
        assert!(t.committable(false).is_empty());
        // An older commit failing after a newer one was sent: the newer one covers it.
        let later = t.dispatched("req", 0, 1).unwrap();
        assert!(t.finished(&later));
        t.commit_sent(&tp(0), 2);
        t.commit_result(&tp(0), 1, false);
        assert!(t.committable(false).is_empty(), "not sent again");
        assert_eq!(t.commit_failures(), 0);
    }
}
