//! The history's vocabulary: what the campaign's tasks record (a worker's reads, deliveries,
//! decisions and flush reports, the nemesis's faults, the dead-letter service's redrives, the
//! audit group's reads), each stamped with when.

/// What a worker decided for one delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Decision {
    /// Its side effect queued and the entry acked.
    Ack,
    /// Acked after handling longer than `min_idle` (or after a slow one of the same read):
    /// another consumer may take it meanwhile.
    SlowAck,
    /// Dropped: its queued side effect must never run.
    Drop,
    /// Retried at once: its queued side effect must never run.
    Retry,
    /// Retried after a delay: its queued side effect must never run.
    RetryAfter,
    /// No outcome: the worker closed its stream; the entry is delivered again.
    Abandon,
}

impl Decision {
    /// Whether the decision keeps the delivery's side effect.
    pub(crate) fn keeps(self) -> bool {
        matches!(self, Decision::Ack | Decision::SlowAck)
    }
}

/// One event of the history, in the order the campaign recorded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Event {
    /// A worker received a delivery of `entry` with the sidecar's count.
    Delivered {
        worker: u32,
        entry: String,
        count: u32,
    },
    /// A worker decided what to do with a delivery.
    Decided {
        worker: u32,
        entry: String,
        decision: Decision,
    },
    /// A delivery of a read that was handled past `min_idle` (one of its deliveries was
    /// slow, and a read settles as a whole): another consumer may have taken it meanwhile.
    Late { entry: String },
    /// A read a worker received on subscription stream `stream` (numbered across the run).
    Read {
        worker: u32,
        stream: u32,
        read_id: u64,
    },
    /// A flush report a worker received on subscription stream `stream`, for read `read_id`;
    /// `ok`: the flush succeeded (else it failed, or its outcome is unknown).
    Flushed {
        worker: u32,
        stream: u32,
        read_id: u64,
        ok: bool,
    },
    /// A delivery on an ordered subscription stream, logged after its `Delivered`: the read it
    /// came in and its ordering key (none logged for an entry without a key).
    InOrder {
        worker: u32,
        stream: u32,
        read_id: u64,
        entry: String,
        key: String,
        count: u32,
    },
    /// A fault the nemesis injected (its name and target).
    Fault(String),
    /// The nemesis undid a refusal it injected (its kind): Redis takes writes again.
    Undone(String),
    /// A read came on ordered subscription stream `stream` (logged as it came, before its
    /// `Read`, which is logged when the worker takes it up): its deliveries with a key, each
    /// (entry, key, count).
    Came {
        worker: u32,
        stream: u32,
        read_id: u64,
        deliveries: Vec<(String, String, u32)>,
    },
    /// Worker `worker`'s subscription stream `stream` ended: the sidecar ended or broke it, or
    /// the worker dropped it (a killed worker logs none: its next stream's first read says it).
    Ended { worker: u32, stream: u32 },
    /// The faults are over: from here every delivery is acked until the run is quiet.
    Settling,
    /// A flush report on subscription stream `stream` that failed (logged after its
    /// `Flushed`): the class of its first error (`oom`, `noperm`, `wrongtype`, ..., `other`),
    /// the class of each requeue Redis refused (`requeue_refused`), and the acked entries
    /// whose side effect Redis refused while their settle stood (`side_effect_failures`
    /// marked `settled`, pipeline mode: Redis has no rollback, the report is all the client
    /// gets).
    Refused {
        worker: u32,
        stream: u32,
        read_id: u64,
        error: String,
        requeues: Vec<String>,
        kept_unwritten: Vec<String>,
    },
    /// The dead-letter service said it redrove dead letter `dead`, a dead letter of `origin`
    /// after `deliveries` deliveries: back into its own group with its id (`copy` empty or
    /// `origin` itself), or as the fresh stream entry `copy`. Stamped when the call was sent:
    /// the entry may come back before the answer.
    Redriven {
        dead: String,
        origin: String,
        deliveries: u32,
        copy: String,
    },
    /// A worker's `retry_after` of `entry` asked for `delay_ms` (logged after its `Decided`).
    Delayed {
        worker: u32,
        entry: String,
        delay_ms: u64,
    },
    /// The audit group's reader read `entry`: from its own pending entries (`own`, `XREADGROUP
    /// … 0`: a read whose reply or ack a fault took) or as new (`>`). `copy`: the entry is a
    /// copy (it carries `h:x-window-original-id`), which no producer published.
    Audited {
        entry: String,
        own: bool,
        copy: Option<Copied>,
    },
    /// Redis counted every one of these entries in the audit reader's `XACK`: acknowledged.
    AuditAcked { entries: Vec<String> },
    /// A sidecar's log line about entries of worker `worker`'s consumer. Read from the
    /// sidecars' logs once the workers stopped, so stamped then.
    Said {
        worker: u32,
        said: Said,
        entries: Vec<String>,
    },
}

/// What a sidecar logs about entries that its client may not have been told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Said {
    /// Settled without the side effect Redis refused (pipeline mode), as a failed flush's log
    /// line names them: its report says the same, but a worker that left before the report
    /// came never read it.
    EffectsRefused,
    /// Retries kept in place that another consumer claimed before they were delivered again
    /// here (this sidecar could not make them idle again in time): that consumer delivers
    /// them, and their keys moved on here.
    ClaimedAway,
}

/// What marks a stream entry as a copy: the id it names as its original, and its copy fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Copied {
    pub of: String,
    /// Its `h:x-window-*` fields, as `name value` pairs.
    pub marks: String,
}

impl Event {
    /// Whether it is a redrive that put `origin`'s entry back into its own group with its id.
    pub(crate) fn in_place_redrive(&self) -> Option<&str> {
        match self {
            Event::Redriven { origin, copy, .. } if copy.is_empty() || copy == origin => {
                Some(origin)
            }
            _ => None,
        }
    }
}

/// Where a partition's reading numbers its reads and slots from: the sidecar's `NUMBER_SHIFT`.
/// Each reading of a partition (from taking its lease until it ends: handed over, fenced, its
/// replica gone) gets a range of its own on its replica's stream, numbered upwards.
const READING_SHIFT: u32 = 36;

/// The reading of a partitioned stream's partition that read `read_id` came from (0 for every
/// read of an unpartitioned stream). A later reading of the same partition on the same stream
/// starts only once the earlier one ended: what it still had out can no longer be settled.
pub(crate) fn reading(read_id: u64) -> u64 {
    read_id >> READING_SHIFT
}

/// A stream id's parts, for its order (None for what is not one).
pub(crate) fn id_order(entry: &str) -> Option<(u64, u64)> {
    let id = entry.rsplit('/').next()?;
    let (ms, seq) = id.split_once('-')?;
    Some((ms.parse().ok()?, seq.parse().ok()?))
}

/// Whether `entry` sits before `other` in their partition. A reading takes its consumer's
/// pending entries in that order, so such an entry may precede one that is due or unsettled:
/// an entry a redrive put back with its id, or one whose fate the workers could not know.
pub(crate) fn before(entry: &str, other: &str) -> bool {
    matches!((id_order(entry), id_order(other)), (Some(a), Some(b)) if a < b)
}

/// A timestamped event (milliseconds since the campaign started).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Stamped {
    pub at_ms: u64,
    pub event: Event,
}
