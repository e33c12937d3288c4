//! The consumer's two lanes (the request topic in the worker's group, the unit topic in its
//! own) and the one [`Bound`] they share: `MAX_IN_FLIGHT` bounds every message a pod holds
//! unfinished, requests and unit tasks together, as [`Places`] decides (units at most one
//! less, so that a request always finds a place). Each lane counts the other's messages
//! under one lock, checking and counting each message it takes at once: the other lane may
//! take one at the same moment.

use std::sync::{Arc, Mutex};

use super::flow::Places;
use super::settings::KafkaSettings;

/// Which topic a consumer takes, in which group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// The request topic, in `kafka.group_id`.
    Requests,
    /// The unit topic, in its own group (`KafkaSettings::unit_group`).
    Units,
}

impl Lane {
    /// The lane's (topic, group); `None` for the unit lane without a unit topic.
    pub fn subscription(self, settings: &KafkaSettings) -> Option<(String, String)> {
        match self {
            Lane::Requests => Some((settings.request_topic.clone(), settings.group_id.clone())),
            Lane::Units => settings
                .unit_topic()
                .map(|t| (t.to_owned(), settings.unit_group())),
        }
    }

    pub(super) fn index(self) -> usize {
        self as usize
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Lane::Requests => "requests",
            Lane::Units => "units",
        }
    }
}

/// How many messages each lane may hold unfinished, each counting the other's too
/// ([`Places`] decides); shared by a pod's two lanes.
#[derive(Debug, Clone)]
pub struct Bound {
    pub places: Places,
    /// Both lanes' unfinished messages (by lane), each lane's kept current by it, one message
    /// at a time as it takes them, for the other to count.
    counts: Arc<Mutex<[usize; 2]>>,
}

impl Bound {
    pub fn new(places: Places) -> Bound {
        Bound {
            places,
            counts: Default::default(),
        }
    }

    /// `lane`'s bound.
    pub fn max(&self, lane: Lane) -> usize {
        match lane {
            Lane::Requests => self.places.all,
            Lane::Units => self.places.units,
        }
    }

    /// What counts against `lane`'s bound.
    fn in_flight(&self, lane: Lane, counts: &[usize; 2]) -> usize {
        let [requests, units] = *counts;
        match lane {
            Lane::Requests => self.places.requests_in_flight(requests, units),
            Lane::Units => self.places.units_in_flight(units, requests),
        }
    }

    /// `lane` holds `own` messages unfinished: what counts against its bound now.
    pub fn set(&self, lane: Lane, own: usize) -> usize {
        let mut counts = self.counts.lock().expect("not poisoned");
        counts[lane.index()] = own;
        self.in_flight(lane, &counts)
    }

    /// One more message for `lane`, if its bound has room now: checked and counted at once,
    /// as the other lane may take one at the same moment. `false`: none may be taken.
    pub fn take(&self, lane: Lane) -> bool {
        let mut counts = self.counts.lock().expect("not poisoned");
        let room = self.in_flight(lane, &counts) < self.max(lane);
        if room {
            counts[lane.index()] += 1;
        }
        room
    }

    /// A place [`Bound::take`]n for a message that did not come.
    pub fn give_back(&self, lane: Lane) {
        let mut counts = self.counts.lock().expect("not poisoned");
        counts[lane.index()] = counts[lane.index()].saturating_sub(1);
    }
}
