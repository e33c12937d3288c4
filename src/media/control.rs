//! How the caller follows and stops media work while it runs.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::contract::{MediaType, Stage};

/// What the caller hears while media work runs, and how it stops it.
pub struct Control<'a> {
    /// Cancelled when the job's time is up or the worker gives up on it: a running ffmpeg is
    /// killed at once (libvips calls cannot be interrupted and run to their end).
    pub cancel: CancellationToken,
    pub on_event: &'a mut dyn FnMut(Event),
}

impl<'a> Control<'a> {
    pub fn new(on_event: &'a mut dyn FnMut(Event)) -> Self {
        Control {
            cancel: CancellationToken::new(),
            on_event,
        }
    }
    pub(crate) fn emit(&mut self, e: Event) {
        (self.on_event)(e)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Event {
    /// A stage starts.
    Stage(Stage),
    /// What the input is, detected from its bytes.
    Detected(MediaType),
    /// Fraction of the current stage done (video transcodes).
    Progress(f32),
    /// Media time encoded since the last report.
    Encoded(Duration),
    /// The native work may take this long in all (known for a video once it is probed).
    TimeLimit(Duration),
}
