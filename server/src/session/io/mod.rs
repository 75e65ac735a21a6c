//! The tasks that do a subscription's I/O beside it, one file per seam: the [`reader`]
//! (blocking reads on the subscription's own connection), the [`flusher`] (flushes in order
//! over the pool, those that queued going together in one round trip), an ordered stream's
//! read [`lane`] (its reads under a backlog, in order on one connection) and the [`promoter`]
//! of due `retry_after` entries. The subscription hands each its work over a channel and hears
//! back on another; none of them decides anything the engine decides.

use std::time::Duration;

use crate::domain::ReadBatch;
use crate::engine::{FlushId, FlushResult, LaneReadId, PlanCounts};
use crate::redis::RedisError;

pub(super) mod flusher;
pub(super) mod lane;
pub(super) mod promoter;
pub(super) mod reader;

/// What a read that rode at the end of a flush, or went on the read lane, read; `Err` with
/// whether no reply came.
pub(super) type ReadAhead = Result<ReadBatch, (RedisError, bool)>;

/// What the flusher and the read lane tell their subscription.
pub(super) enum Flushed {
    /// A flush is done: what its plan held, what Redis answered (boxed: a result is several
    /// times the size of the other messages), and what its read-ahead read.
    Report(FlushId, Box<(PlanCounts, FlushResult)>, Option<ReadAhead>),
    /// A flush reported with an unknown outcome can no longer run (see
    /// [`crate::redis::flush::FlushConnection::settle_unknown`]).
    Settled(FlushId),
    /// A read on the read lane is done. One whose reply never came (`Err` with `true`) stays
    /// able to run until [`Flushed::ReadSettled`].
    Read(LaneReadId, ReadAhead),
    /// A read on the read lane whose reply never came can no longer run.
    ReadSettled(LaneReadId),
}

/// How long a flush with an unknown outcome waits for its connection to come back, so that
/// nothing of it can still run after its entries are read again.
const UNKNOWN_FLUSH_BARRIER: Duration = Duration::from_secs(60);
