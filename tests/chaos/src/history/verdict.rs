//! What a run promised (by its form and mode) and what breaking a promise looks like: an
//! anomaly, about one entry or about the run.

use std::fmt;

/// What the campaign promised for the run being checked.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Promise {
    /// Atomic mode: a kept side effect runs at most once.
    pub exactly_once: bool,
    /// `max_deliveries`: no delivery past it, and a dead letter for what reaches it.
    pub max_deliveries: u32,
    /// A simple list or pub/sub: what was in flight at a crash may be lost, and a kept side
    /// effect runs at most once.
    pub at_most_once: bool,
    /// Entries are known by their payload (lists, pub/sub), and a publish retried after a
    /// reconnect may have written one twice (Publish is at least once): each delivery with
    /// count 1 is a copy of its own, which may be kept once more.
    pub by_payload: bool,
    /// A partitioned stream whose workers are all ordered replicas of one group: per-key
    /// order holds across them.
    pub across_group: bool,
}

/// Something the history shows that the README does not allow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Anomaly {
    pub root: Option<String>,
    pub what: String,
}

impl fmt::Display for Anomaly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.root {
            Some(root) => write!(f, "entry {root}: {}", self.what),
            None => f.write_str(&self.what),
        }
    }
}

pub(super) fn anomaly(root: Option<String>, what: String) -> Anomaly {
    Anomaly { root, what }
}
