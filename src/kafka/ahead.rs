//! Which fetched message of a lane goes to a job next: an urgent one first, looked for up to a
//! depth into each partition, else each partition's next in turn.
//!
//! The rule: a lane holds up to `depth` messages of each partition, taken from librdkafka's
//! partition queues in order as they come. When a place is free, the first urgent message held
//! (the partitions searched in turn) goes; when none is urgent, the next partition's first
//! held message, the partitions in turn. The request lane looks one deep and calls nothing
//! urgent: the partitions in turn, as the poll loop took them before.
//!
//! The reason: a partition is a queue, and the unit topic's queues hold every plan's tasks in
//! the order the plans sent them. A video's first unit and its audio's opening (what makes its
//! stream playable) and its stitch (what answers it) waited behind every unit that other videos
//! had sent to the same partition, whatever partition each plan starts at: four 4-minute
//! videos sent at once to two one-core workers (`benches/fanout.rs`) were first playable at
//! 18, 25, 268 and 277 s with every plan starting at partition 0, and at 18, 392, 130 and
//! 266 s spread over the partitions by plan. The unit lane calls those three tasks urgent
//! (`units::Task::is_urgent_key`).
//!
//! Taking a message out of its partition's order is safe: offsets are committed only up to
//! the lowest unfinished one, and a held message counts as unfinished
//! ([`OffsetTracker::held`](super::offsets::OffsetTracker::held)), so no commit passes it, and
//! one that never goes to a job (the pod stops, the partition is revoked) is redelivered.
//! What is held for a partition revoked, or assigned again since (a new generation), is
//! dropped ([`Ahead::retain`]).

use std::collections::{BTreeMap, VecDeque};

use super::offsets::Tp;

/// A fetched message held for a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held<T> {
    pub offset: i64,
    /// Its partition's assignment when fetched (`OffsetTracker::held`).
    pub generation: u64,
    pub urgent: bool,
    pub message: T,
}

/// The messages a lane holds, by partition, each partition's in offset order.
#[derive(Debug)]
pub struct Ahead<T> {
    depth: usize,
    held: BTreeMap<Tp, VecDeque<Held<T>>>,
    /// Where the next search over the partitions starts.
    turn: usize,
}

impl<T> Ahead<T> {
    /// Holding up to `depth` (> 0) messages per partition.
    pub fn new(depth: usize) -> Ahead<T> {
        assert!(depth > 0, "a lane looks at least one message ahead");
        Ahead {
            depth,
            held: BTreeMap::new(),
            turn: 0,
        }
    }

    /// How many more messages `tp` may hold.
    pub fn room(&self, tp: &Tp) -> usize {
        self.depth
            .saturating_sub(self.held.get(tp).map_or(0, VecDeque::len))
    }

    /// Holds `held` after the messages `tp` holds already (fetched after them).
    pub fn hold(&mut self, tp: Tp, held: Held<T>) {
        self.held.entry(tp).or_default().push_back(held);
    }

    /// The message to hand to a job next: the first urgent one, the partitions searched in
    /// turn, else the next partition's first; `None` when nothing is held.
    pub fn pick(&mut self) -> Option<(Tp, Held<T>)> {
        let holding: Vec<Tp> = self
            .held
            .iter()
            .filter(|(_, q)| !q.is_empty())
            .map(|(tp, _)| tp.clone())
            .collect();
        if holding.is_empty() {
            return None;
        }
        self.turn = (self.turn + 1) % holding.len();
        let order = (0..holding.len()).map(|k| &holding[(self.turn + k) % holding.len()]);
        let urgent = order
            .clone()
            .find_map(|tp| Some((tp, self.held[tp].iter().position(|h| h.urgent)?)));
        let (tp, at) = urgent.unwrap_or((&holding[self.turn], 0));
        let tp = tp.clone();
        let held = self.held.get_mut(&tp)?.remove(at)?;
        Some((tp, held))
    }

    /// Keeps what is held for the partitions `keep(partition, generation)` accepts; drops the
    /// others' (revoked, or assigned again since they were fetched).
    pub fn retain(&mut self, keep: impl Fn(&Tp, u64) -> bool) {
        for (tp, q) in self.held.iter_mut() {
            q.retain(|h| keep(tp, h.generation));
        }
        self.held.retain(|_, q| !q.is_empty());
    }

    /// Messages held over every partition.
    pub fn len(&self) -> usize {
        self.held.values().map(VecDeque::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(p: i32) -> Tp {
        ("units".to_owned(), p)
    }

    fn held(offset: i64, urgent: bool) -> Held<&'static str> {
        Held {
            offset,
            generation: 1,
            urgent,
            message: "",
        }
    }

    fn drain(a: &mut Ahead<&'static str>) -> Vec<(i32, i64)> {
        std::iter::from_fn(|| a.pick().map(|(tp, h)| (tp.1, h.offset))).collect()
    }

    /// With nothing urgent, the partitions' heads in turn, each partition in its order: the
    /// request lane's behaviour (one deep) and the unit lane's with no urgent task held.
    #[test]
    fn without_urgent_messages_the_partitions_go_in_turn_each_in_order() {
        let mut a = Ahead::new(8);
        for o in 0..3 {
            a.hold(tp(0), held(o, false));
            a.hold(tp(1), held(10 + o, false));
        }
        let got = drain(&mut a);
        assert_eq!(got.len(), 6);
        for p in [0, 1] {
            let offsets: Vec<i64> = got.iter().filter(|g| g.0 == p).map(|g| g.1).collect();
            assert!(offsets.is_sorted(), "{got:?}");
        }
        // Alternating while both hold some.
        assert_ne!(got[0].0, got[1].0, "{got:?}");
        assert_ne!(got[2].0, got[3].0, "{got:?}");
        assert!(a.is_empty());
    }

    /// An urgent message deep in a partition goes before the bulk ahead of it, in that
    /// partition and in the others; urgent ones in offset order within their partition.
    #[test]
    fn urgent_messages_go_first_from_however_deep_they_are_held() {
        let mut a = Ahead::new(64);
        for o in 0..20 {
            a.hold(tp(0), held(o, o == 17 || o == 12));
            a.hold(tp(1), held(100 + o, false));
        }
        let first: Vec<(i32, i64)> = (0..2)
            .filter_map(|_| a.pick())
            .map(|(t, h)| (t.1, h.offset))
            .collect();
        assert_eq!(first, [(0, 12), (0, 17)]);
        assert_eq!(a.len(), 38);
    }

    /// The depth bounds what a partition holds; room comes back as messages go.
    #[test]
    fn a_partition_holds_up_to_the_depth() {
        let mut a = Ahead::new(2);
        assert_eq!(a.room(&tp(0)), 2);
        a.hold(tp(0), held(0, false));
        a.hold(tp(0), held(1, false));
        assert_eq!((a.room(&tp(0)), a.room(&tp(1))), (0, 2));
        a.pick();
        assert_eq!(a.room(&tp(0)), 1);
    }

    /// What is held for a partition revoked, or assigned again since, is dropped; the rest
    /// stays in order.
    #[test]
    fn retain_drops_what_is_held_for_partitions_no_longer_held_as_fetched() {
        let mut a = Ahead::new(8);
        a.hold(tp(0), held(0, false));
        a.hold(tp(1), held(5, true));
        a.hold(
            tp(2),
            Held {
                generation: 2,
                ..held(7, false)
            },
        );
        a.hold(
            tp(2),
            Held {
                generation: 3,
                ..held(8, false)
            },
        );
        // Partition 1 revoked; partition 2 assigned again (generation 3).
        a.retain(|tp, g| match tp.1 {
            0 => g == 1,
            2 => g == 3,
            _ => false,
        });
        let mut got = drain(&mut a);
        got.sort();
        assert_eq!(got, [(0, 0), (2, 8)]);
    }
}
