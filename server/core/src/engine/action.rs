//! The actions the engine asks of the I/O task.

use std::time::Duration;

use super::report::FlushReport;
use super::types::{FetchId, FlushId, Item, Lane, Stop};
use crate::window::{FlushBatch, OpenedRead};

/// What the I/O task must do, in order.
#[derive(Debug, PartialEq)]
pub enum Action<E: Item> {
    /// Read up to `count` entries on `lane`. Answer with [`Engine::read_returned`]; a read on
    /// the read lane whose reply never came may still run: say when it no longer can with
    /// [`Engine::read_settled`].
    Read { count: u32, lane: Lane },
    /// Fetch these parked entries by id, in order, without counting a delivery; settle those
    /// gone from the stream. Answer with [`Engine::fetched`]. Runs beside everything else:
    /// the entries are this consumer's pending ones already.
    Fetch {
        fetch: FetchId,
        parked: Vec<E::Parked>,
    },
    /// Count the next delivery of these retries kept in place, now due, in Redis, while each
    /// is still this consumer's pending entry (a stream's `retry_after` waits uncounted). Answer
    /// with [`Engine::counted`]: they go out only once counted. Runs beside everything else.
    Count { count: FetchId, entries: Vec<E> },
    /// Cut the reader's read under way short, as if its block had run out: it takes nothing
    /// and returns at once (a read that is not blocked, or has already taken entries, is not
    /// touched and returns them as usual).
    InterruptRead,
    /// Send a read to the client. `report`: the flush report that rides inside it.
    Deliver {
        read: OpenedRead,
        entries: Vec<E>,
        redelivery: bool,
        lost: u64,
        report: Option<FlushReport>,
    },
    /// Nothing to deliver, but the client must learn that pub/sub messages were lost.
    Lost(u64),
    /// Flush a read's batch. `read_ahead`: append a read of that many new entries.
    Flush {
        flush: FlushId,
        batch: FlushBatch<E>,
        read_ahead: Option<u32>,
    },
    /// Move entries past the delivery cap to the dead letter with their settle, unread.
    DeadLetter { flush: FlushId, entries: Vec<E> },
    /// Send a flush's report to the client.
    Report(FlushReport),
    /// Give entries back to Redis as if this subscription had not taken them. `seen`: the
    /// client got them (their delivery counts), else nobody did (uncount that read).
    GiveBack { entries: Vec<E>, seen: bool },
    /// Renew the consumer lease; answer with [`Engine::lease_renewed`].
    RenewLease,
    /// Make these outstanding stream entries idle again, still this consumer's, their
    /// delivery counts untouched (the client is still working on them).
    Extend(Vec<E>),
    /// Tell the client shutdown began.
    Draining { grace: Duration, outstanding: usize },
    /// End the client's stream: with the reason, or as the session decided (`None`).
    EndStream(Option<Stop>),
    /// Nothing is left to do: release the consumer and stop.
    Done,
}
