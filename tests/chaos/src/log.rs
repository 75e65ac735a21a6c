//! The history as the campaign's tasks write it: one log per run, every event stamped with the
//! milliseconds since the run started.

use parking_lot::Mutex;
use tokio::time::Instant;

use crate::history::{Event, Stamped};

/// What every task appends to.
pub(crate) struct Log {
    pub(crate) started: Instant,
    pub(crate) events: Mutex<Vec<Stamped>>,
}

impl Log {
    pub(crate) fn push(&self, event: Event) {
        let at_ms = self.now_ms();
        self.events.lock().push(Stamped { at_ms, event });
    }

    /// Milliseconds since the campaign started.
    pub(crate) fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Logs `event` at `at_ms`, a moment that has passed: after the events logged by then.
    pub(crate) fn push_at(&self, at_ms: u64, event: Event) {
        let mut events = self.events.lock();
        let at = events
            .iter()
            .rposition(|s| s.at_ms <= at_ms)
            .map_or(0, |i| i + 1);
        events.insert(at, Stamped { at_ms, event });
    }
}
