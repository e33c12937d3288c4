//! Which offsets may be committed: per partition, the lowest offset not yet finished.
//!
//! Jobs finish out of order. Kafka stores one position per partition, meaning "everything
//! below this is done", so we may commit only up to the first unfinished offset: committing a
//! later job's offset would skip an earlier, slower one after a crash. Messages arrive in
//! offset order within a partition, so `next` (one past the highest dispatched) is the position
//! once nothing is in flight.
//!
//! Each assignment of a partition gets a new generation: a job that finishes after its
//! partition was revoked (and perhaps assigned again) carries the old generation and is ignored,
//! so it never commits for a partition this worker no longer owns.

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
    /// One past the highest dispatched offset.
    next: Option<i64>,
    /// Last position sent in a commit.
    committed: Option<i64>,
}

impl PartitionState {
    fn position(&self) -> Option<i64> {
        self.in_flight.first().copied().or(self.next)
    }
}

#[derive(Debug, Default)]
pub struct OffsetTracker {
    parts: HashMap<Tp, PartitionState>,
    generations: u64,
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

    /// Stops tracking a revoked partition.
    pub fn revoke(&mut self, tp: &Tp) {
        self.parts.remove(tp);
    }

    /// The partitions assigned now.
    pub fn partitions(&self) -> impl Iterator<Item = &Tp> {
        self.parts.keys()
    }

    /// Records a message handed to a job; `None` if its partition is not assigned.
    pub fn dispatched(&mut self, topic: &str, partition: i32, offset: i64) -> Option<OffsetToken> {
        let st = self.parts.get_mut(&(topic.to_owned(), partition))?;
        st.in_flight.insert(offset);
        st.next = Some(st.next.map_or(offset + 1, |n| n.max(offset + 1)));
        Some(OffsetToken {
            topic: topic.to_owned(),
            partition,
            offset,
            generation: st.generation,
        })
    }

    /// Records a finished job (its response is published). Returns false for a stale token.
    pub fn finished(&mut self, t: &OffsetToken) -> bool {
        match self.parts.get_mut(&(t.topic.clone(), t.partition)) {
            Some(st) if st.generation == t.generation => st.in_flight.remove(&t.offset),
            _ => false,
        }
    }

    /// Messages dispatched and not finished, over all partitions.
    pub fn in_flight(&self) -> usize {
        self.parts.values().map(|s| s.in_flight.len()).sum()
    }

    pub fn in_flight_on(&self, tp: &Tp) -> usize {
        self.parts.get(tp).map_or(0, |s| s.in_flight.len())
    }

    /// Positions that moved since the last commit (`all`: every known position, for the
    /// synchronous commits on revoke and shutdown).
    pub fn committable(&self, all: bool) -> Vec<(Tp, i64)> {
        let mut v: Vec<(Tp, i64)> = self
            .parts
            .iter()
            .filter_map(|(tp, st)| {
                let pos = st.position()?;
                (all || st.committed.is_none_or(|c| pos > c)).then(|| (tp.clone(), pos))
            })
            .collect();
        v.sort();
        v
    }

    pub fn mark_committed(&mut self, tp: &Tp, position: i64) {
        if let Some(st) = self.parts.get_mut(tp) {
            st.committed = Some(st.committed.map_or(position, |c| c.max(position)));
        }
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
        t.mark_committed(&tp(0), 10);
        assert!(
            t.committable(false).is_empty(),
            "nothing new until the slow one ends"
        );
        assert!(t.finished(&a));
        assert_eq!(t.committable(false), vec![(tp(0), 13)]);
        assert_eq!(t.in_flight(), 0);
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
}
