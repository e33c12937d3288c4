//! The poll thread's intake decisions, free of librdkafka so that they can be unit-tested:
//! whether the assigned partitions should be paused or resumed, whether the periodic commit is
//! due and how many messages may be taken this turn (which of those fetched goes next is
//! `kafka::ahead`'s; see the protocol in `consumer`). Each consumer of a worker (the request lane, the unit lane) has a
//! [`Flow`] of its own.
//!
//! Fairness between a long video's units and everything else ([`Places`]): `MAX_IN_FLIGHT`
//! bounds all of a pod's work, requests and unit-topic tasks together (the operator lowers it
//! to bound the scratch volume's use), and the unit lane may hold at most [`unit_slots`] tasks
//! unfinished, one less than the pool (at least one) and one less than that bound, so a
//! request always finds a place and a permit. A fanned-out video queues dozens of units on
//! every member; taken like requests, they would fill every permit and the permit queue, and
//! an image sent meanwhile would wait behind minutes of units. Capped, a pod with two or more
//! permits always has one free for a request, and a one-permit pod's one unit-topic task runs
//! on a lane of its own beside that permit (`Settings::parts_lane`): an image never waits for
//! a unit (with one permit, it waited for the unit in hand, 15-30 s at 1080p: 38x its idle
//! p95). Those tasks run at a lower CPU priority (`job::runner::PART_NICE`), so a request
//! beside one gets most of a contended core. Each lane counts the other's unfinished messages:
//! the request lane every unit, the unit lane the requests past the places left to them, so
//! that units keep their slots while requests hold no more than those places (a lane's own
//! acks wake it first, so a place freed goes back to the lane that freed it as a rule).

use std::time::{Duration, Instant};

/// How long the in-flight bound must hold before the partitions are paused.
pub const PAUSE_AFTER: Duration = Duration::from_secs(1);

/// The intake state of one consumer.
#[derive(Debug)]
pub struct Flow {
    max_in_flight: usize,
    commit_interval: Duration,
    /// Since when `max_in_flight` messages have been unfinished.
    saturated_since: Option<Instant>,
    last_commit: Instant,
}

/// The consumer's state a turn decides from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Intake {
    /// Fetching was stopped for shutdown.
    pub stopping: bool,
    /// The pod cannot take work now (`Health::intake_blocker`).
    pub sick: bool,
    /// The partitions are paused now.
    pub paused: bool,
}

/// What one turn of the poll loop does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Turn {
    /// Pause (`Some(true)`) or resume (`Some(false)`) the assigned partitions.
    pub pause: Option<bool>,
    /// Commit the finished offsets now.
    pub commit: bool,
    /// How many messages may be taken from the partition queues.
    pub room: usize,
}

/// The unit lane's bound for a pool of `pool` permits: one less (at least one), so that a
/// request always finds a permit (a one-permit pod runs its unit beside it).
pub fn unit_slots(pool: usize) -> usize {
    pool.saturating_sub(1).max(1)
}

/// A pod's in-flight places, shared by its two lanes: `all` for requests and unit-topic tasks
/// together (`MAX_IN_FLIGHT`), of which the unit lane may hold `units`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Places {
    pub all: usize,
    pub units: usize,
}

impl Places {
    /// `max_in_flight` for a pool of `pool` permits: the units get [`unit_slots`], and at most
    /// one less than `max_in_flight` (none of 1: `kafka::settings` wants 2 with a unit topic).
    pub fn new(max_in_flight: usize, pool: usize) -> Places {
        Places {
            all: max_in_flight,
            units: unit_slots(pool).min(max_in_flight.saturating_sub(1)),
        }
    }

    /// The unit lane's count against its bound (`units`): its own tasks, and the requests past
    /// the places left to them (`all - units`).
    pub fn units_in_flight(self, units: usize, requests: usize) -> usize {
        units + requests.saturating_sub(self.all - self.units)
    }

    /// The request lane's count against its bound (`all`): its own and every unit task.
    pub fn requests_in_flight(self, requests: usize, units: usize) -> usize {
        requests + units
    }
}

impl Flow {
    /// At most `max_in_flight` messages unfinished (counted by the caller, with whatever else
    /// counts against this bound).
    pub fn new(max_in_flight: usize, commit_interval: Duration, now: Instant) -> Flow {
        Flow {
            max_in_flight,
            commit_interval,
            saturated_since: None,
            last_commit: now,
        }
    }

    /// The decisions at `now`, with `in_flight` messages unfinished. `stopping`: fetching was
    /// stopped for shutdown; `sick`: the pod cannot take work now (its readiness checks fail);
    /// `paused`: the partitions are paused now.
    ///
    /// The partitions pause at once when stopping or sick, and once the bound has held for
    /// [`PAUSE_AFTER`]; they resume only once half the bound is free: pausing drops librdkafka's
    /// prefetch, so it is kept for pools busy with long jobs.
    pub fn turn(&mut self, now: Instant, in_flight: usize, state: Intake) -> Turn {
        let Intake {
            stopping,
            sick,
            paused,
        } = state;
        if in_flight < self.max_in_flight {
            self.saturated_since = None;
        } else {
            self.saturated_since.get_or_insert(now);
        }
        let stuck = self
            .saturated_since
            .is_some_and(|t| now.duration_since(t) >= PAUSE_AFTER);
        let want = stopping || sick || stuck;
        let pause =
            (want != paused && (want || in_flight <= self.max_in_flight / 2)).then_some(want);
        let commit = now.duration_since(self.last_commit) >= self.commit_interval;
        if commit {
            self.last_commit = now;
        }
        let room = if stopping || sick || pause.unwrap_or(paused) {
            0
        } else {
            self.max_in_flight.saturating_sub(in_flight)
        };
        Turn {
            pause,
            commit,
            room,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COMMIT: Duration = Duration::from_secs(1);

    fn at_state(stopping: bool, paused: bool) -> Intake {
        Intake {
            stopping,
            sick: false,
            paused,
        }
    }

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn the_bound_stops_intake_at_once_and_pauses_only_if_it_holds() {
        let t0 = Instant::now();
        let mut f = Flow::new(4, COMMIT, t0);
        let free = f.turn(t0, 1, at_state(false, false));
        assert_eq!((free.pause, free.room), (None, 3));
        // At the bound: nothing taken, not paused yet (the prefetch is kept).
        let full = f.turn(at(t0, 10), 4, at_state(false, false));
        assert_eq!((full.pause, full.room), (None, 0));
        let still = f.turn(at(t0, 900), 4, at_state(false, false));
        assert_eq!((still.pause, still.room), (None, 0));
        // Held for PAUSE_AFTER: paused.
        let stuck = f.turn(at(t0, 1010), 4, at_state(false, false));
        assert_eq!((stuck.pause, stuck.room), (Some(true), 0));
        // A dip below the bound restarts the clock.
        let mut f = Flow::new(4, COMMIT, t0);
        f.turn(t0, 4, at_state(false, false));
        f.turn(at(t0, 600), 3, at_state(false, false));
        assert_eq!(f.turn(at(t0, 1100), 4, at_state(false, false)).pause, None);
    }

    #[test]
    fn paused_partitions_resume_once_half_the_bound_is_free() {
        let t0 = Instant::now();
        let mut f = Flow::new(4, COMMIT, t0);
        f.turn(t0, 4, at_state(false, false));
        assert_eq!(
            f.turn(at(t0, 1000), 4, at_state(false, false)).pause,
            Some(true)
        );
        // One finished: still paused, nothing taken.
        let one = f.turn(at(t0, 1100), 3, at_state(false, true));
        assert_eq!((one.pause, one.room), (None, 0));
        // Half free: resumed, and the room is taken in the same turn.
        let half = f.turn(at(t0, 1200), 2, at_state(false, true));
        assert_eq!((half.pause, half.room), (Some(false), 2));
    }

    #[test]
    fn stopping_pauses_and_takes_nothing_whatever_the_count() {
        let t0 = Instant::now();
        let mut f = Flow::new(4, COMMIT, t0);
        let stop = f.turn(t0, 0, at_state(true, false));
        assert_eq!((stop.pause, stop.room), (Some(true), 0));
        let after = f.turn(at(t0, 10), 0, at_state(true, true));
        assert_eq!((after.pause, after.room), (None, 0));
    }

    #[test]
    fn a_sick_pod_stops_intake_at_once_and_resumes_when_well() {
        let t0 = Instant::now();
        let mut f = Flow::new(4, COMMIT, t0);
        let sick = Intake {
            sick: true,
            ..Intake::default()
        };
        let t = f.turn(t0, 0, sick);
        assert_eq!(
            (t.pause, t.room),
            (Some(true), 0),
            "paused with room to spare"
        );
        let paused_sick = Intake {
            paused: true,
            ..sick
        };
        assert_eq!(f.turn(at(t0, 50), 1, paused_sick).room, 0);
        let well = f.turn(at(t0, 100), 1, at_state(false, true));
        assert_eq!((well.pause, well.room), (Some(false), 3));
    }

    #[test]
    fn commits_come_once_per_interval() {
        let t0 = Instant::now();
        let mut f = Flow::new(4, COMMIT, t0);
        assert!(!f.turn(at(t0, 500), 0, at_state(false, false)).commit);
        assert!(f.turn(at(t0, 1000), 0, at_state(false, false)).commit);
        assert!(!f.turn(at(t0, 1500), 0, at_state(false, false)).commit);
        assert!(f.turn(at(t0, 2000), 0, at_state(false, false)).commit);
    }

    #[test]
    fn units_leave_a_permit_to_requests() {
        // A pool of 3: two units at most; of one or two, one (a one-permit pod runs it on its
        // parts lane, beside the permit).
        assert_eq!([1, 2, 3, 8].map(unit_slots), [1, 1, 2, 7]);
        // The unit lane is a Flow of that bound: at it, it takes nothing more.
        let t0 = Instant::now();
        let mut units = Flow::new(unit_slots(3), COMMIT, t0);
        assert_eq!(units.turn(t0, 0, Intake::default()).room, 2);
        assert_eq!(units.turn(t0, 2, Intake::default()).room, 0);
    }

    #[test]
    fn all_work_stays_within_max_in_flight_and_a_request_always_finds_a_place() {
        // The disk-pressure runbook's `MAX_IN_FLIGHT=2` on a pool of 4: one unit at most.
        let p = Places::new(2, 4);
        assert_eq!(p, Places { all: 2, units: 1 });
        // Every split of the places that a lane's count allows: within `all`, the units
        // within theirs, and a place left for a request whatever the units hold.
        for (max, pool) in [(2, 4), (2, 1), (3, 4), (8, 4), (4, 2), (6, 3)] {
            let p = Places::new(max, pool);
            for units in 0..=max {
                for requests in 0..=max {
                    let (u, r) = (units, requests);
                    let units_may_take = p.units_in_flight(u, r) < p.units;
                    let requests_may_take = p.requests_in_flight(r, u) < p.all;
                    if units_may_take {
                        assert!(u + 1 + r <= max && u < p.units, "{p:?}, {u} + {r}");
                    }
                    if requests_may_take {
                        assert!(u + r < max, "{p:?}, {u} + {r}");
                    }
                    // With no request held, a request finds a place whatever the units took.
                    if r == 0 && u <= p.units {
                        assert!(requests_may_take, "{p:?}: {u} units leave no place");
                    }
                }
            }
            // Units keep their slots while requests hold no more than what is left to them.
            assert_eq!(p.units_in_flight(0, p.all - p.units), 0);
        }
        // Without an operator's bound (2 x the pool), the pool's.
        assert_eq!(Places::new(8, 4), Places { all: 8, units: 3 });
        assert_eq!(Places::new(2, 1), Places { all: 2, units: 1 });
        assert_eq!(Places::new(1, 4).units, 0, "refused with a unit topic");
    }
}
