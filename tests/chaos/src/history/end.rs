//! What Redis holds once the campaign has quiesced, as the checker takes it: the roots, the
//! side effects that ran, the dead letters, what is still unsettled and where it sits.

use std::collections::HashMap;
use std::fmt;

/// What Redis holds once the campaign has quiesced.
#[derive(Clone, Debug, Default)]
pub(crate) struct EndState {
    /// Every entry the stream held (every value, for the other forms): the roots.
    pub entries: Vec<String>,
    /// How many times each root's kept side effect ran (`HINCRBY` per ack).
    pub kept_effects: HashMap<String, i64>,
    /// How many times a discarded side effect ran (must stay empty).
    pub discarded_effects: HashMap<String, i64>,
    /// The dead letters: the root each is a dead letter of and its delivery count (those a
    /// redrive put back into their group are in the history's `Redriven` events).
    pub dead_letters: Vec<(String, u32)>,
    /// Entries not settled at the end: pending in the group or on processing lists, unread,
    /// or waiting in the delay set ([`crate::form::Form::unsettled`]); `held` says where.
    pub pending: u64,
    /// Retention by acknowledgement (streams): published numbers the second group, which
    /// reads every entry behind the workers, never read: gone before every group had them.
    pub unread_by_every_group: Vec<u64>,
    /// Retention: the stream's length once every group had acknowledged everything and the
    /// trim had time to run (None: not measured, or a group's position was unknown to Redis).
    pub retained_after_settling: Option<u64>,
    /// Redrives whose generation (the root and the times redriven) has more than one copy in
    /// the stream: a dead letter redriven twice.
    pub redriven_twice: Vec<(String, u32)>,
    /// Where each entry Redis still holds sits (read with the end state; it may miss one that
    /// moved meanwhile).
    pub held: Vec<Held>,
    /// The audit group's pending entries once its reader drained the stream: each entry's id,
    /// consumer and deliveries (must be none: the reader acknowledges all it reads, and nothing
    /// else may put an entry there).
    pub audit_pending: Vec<(String, String, u64)>,
}

/// An entry Redis still holds at the end, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Held {
    /// As the history names it: a stream id, a list value's or a message's number.
    pub entry: String,
    pub place: Place,
}

/// Where an entry still held at the end sits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Place {
    /// On the list, with `ahead` entries to be read before it (0: it is read next).
    List { ahead: usize },
    /// In the delay set, due `due_in_ms` after the end state was read (negative: overdue,
    /// which only a promoter that does not run explains).
    Delayed { due_in_ms: i64 },
    /// On a reliable-list consumer's processing list.
    Processing { consumer: String },
    /// Pending in the stream's group on `consumer`: idle that long, delivered that often.
    Pending {
        consumer: String,
        idle_ms: u64,
        deliveries: u64,
    },
    /// In the stream after the group's last-delivered id.
    Unread,
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Place::List { ahead: 0 } => f.write_str("on the list, read next"),
            Place::List { ahead: 1 } => f.write_str("on the list, 1 entry read before it"),
            Place::List { ahead } => write!(f, "on the list, {ahead} entries read before it"),
            Place::Delayed { due_in_ms } if *due_in_ms < 0 => {
                write!(f, "in the delay set, overdue by {} ms", -due_in_ms)
            }
            Place::Delayed { due_in_ms } => write!(f, "in the delay set, due in {due_in_ms} ms"),
            Place::Processing { consumer } => write!(f, "on {consumer}'s processing list"),
            Place::Pending {
                consumer,
                idle_ms,
                deliveries,
            } => write!(
                f,
                "pending on {consumer}, idle {idle_ms} ms, delivered {deliveries} times"
            ),
            Place::Unread => f.write_str("unread in the stream"),
        }
    }
}
