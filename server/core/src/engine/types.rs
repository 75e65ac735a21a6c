//! The engine's vocabulary, as plain data: what it needs of an entry ([`Item`]), a
//! subscription's form and settings, the ids it hands out, and what its handlers take and
//! return besides [`super::Action`]s. Everything else in the engine builds on these and they on
//! nothing of it, so that a part (the lanes, the lease) can name them without naming the
//! engine that holds it.

use std::hash::Hash;
use std::time::Duration;

use crate::window::{Limits, Outcome, SlotError, SlotId};

/// What the engine needs of an entry.
pub trait Item: Clone {
    /// What identifies an entry in Redis across reads (a stream entry id).
    type Id: Clone + Eq + Hash + std::fmt::Debug;
    fn id(&self) -> Self::Id;
    /// Deliveries of this entry including the one that returned it, as Redis counts them.
    fn delivery_count(&self) -> u32;
    /// The entry's ordering key on an ordered subscription (see [`Config::ordered`]); `None`:
    /// it is handed out whatever else is out.
    /// Borrowed: the engine looks a key up several times per delivery and keeps a copy only
    /// where it stores one (a long key still shares its read's buffer; see
    /// [`crate::domain::Key`]).
    fn ordering_key(&self) -> Option<&crate::domain::Key>;
    /// The entry as its next delivery sees it after a retry kept in place (whose flush counted
    /// that delivery in Redis): one delivery more.
    fn redelivered(&self) -> Self;
    /// What a hot key's entry parked as an id keeps of itself (see
    /// [`Config::max_parked`]): enough to fetch it by id, and to extend it or give it back.
    type Parked: Clone + std::fmt::Debug + PartialEq;
    fn park(&self) -> Self::Parked;
    /// A parked entry as an entry without its body, to extend or give back: never delivered.
    fn stub(parked: &Self::Parked) -> Self;
}

/// The subscription's form, as far as its decisions differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Stream,
    ReliableList,
    SimpleList,
    PubSub,
}

impl Kind {
    /// A re-read returns entries by id that this window may hold (a stream's pending entries).
    pub(super) fn rereads_by_id(self) -> bool {
        self == Kind::Stream
    }

    /// Dead consumers' entries are recovered by live ones (claims, processing lists).
    pub(super) fn recovers(self) -> bool {
        matches!(self, Kind::Stream | Kind::ReliableList)
    }

    /// Every retry stays where it is, pending in its group, delivered again by this consumer
    /// (a stream: a copy appended to it would reach every other group of the stream). Other
    /// forms keep in place only an ordered subscription's retries of keyed entries.
    pub(super) fn keeps_every_retry_in_place(self) -> bool {
        self == Kind::Stream
    }

    /// A read of new entries can ride at the end of a flush's pipeline (XREADGROUP `>`).
    pub(super) fn reads_ahead(self) -> bool {
        self == Kind::Stream
    }

    /// What keeps an entry from being taken by another consumer while its handler works past
    /// `min_idle` / `dead_after`: the entry's own idle time (a stream's pending entry), or the
    /// consumer's lease (a reliable list recovers whole processing lists). Nothing else can take
    /// a popped or published entry.
    pub(super) fn extends_by(self) -> Option<Extension> {
        match self {
            Kind::Stream => Some(Extension::Entries),
            Kind::ReliableList => Some(Extension::Lease),
            Kind::SimpleList | Kind::PubSub => None,
        }
    }

    /// Popped entries exist nowhere else: at close, the read under way is waited for and its
    /// entries go back first, so that pushed back the list keeps its order.
    pub(super) fn waits_for_read_at_close(self) -> bool {
        self == Kind::SimpleList
    }
}

/// How a form keeps a delivery from other consumers while its handler works on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Extension {
    Entries,
    Lease,
}

/// A subscription's settings.
#[derive(Clone, Debug)]
pub struct Config {
    pub kind: Kind,
    /// The most entries one read asks for.
    pub count: u32,
    pub max_in_flight: u32,
    /// Deliveries after which an entry goes to the dead letter; 0: no cap.
    pub max_deliveries: u32,
    /// How long a read waits for entries.
    pub block: Duration,
    /// How often idle or dead consumers' entries are recovered.
    pub recovery_interval: Duration,
    /// How often the consumer lease is renewed; `None` for forms without one.
    pub lease_renewal: Option<Duration>,
    /// Reads may ride on flushes (off while reads must wait for replicas).
    pub read_ahead: bool,
    /// A flush report whose flush carried the next read goes out inside that read.
    pub reports_in_reads: bool,
    pub shutdown_grace: Duration,
    pub limits: Limits,
    /// The least time between two extensions of one delivery (or of the lease): more often
    /// is taken and does nothing.
    pub extend_every: Duration,
    /// Entries with an ordering key are handed out one per key at a time, in the order read,
    /// and their retries are kept in place (streams and reliable lists only).
    pub ordered: bool,
    /// On a stream, how often entries waiting in memory (for their key, or retries kept in
    /// place until due) are made idle again (other consumers reclaim entries idle past their
    /// `min_idle`).
    pub extend_waiting_every: Option<Duration>,
    /// On an ordered stream, how many entries waiting for their key may be parked as ids (a
    /// key's past `count` waiting in memory), to be fetched by id when their turn comes; reads
    /// stop once this many are parked, or once `max_in_flight` wait in memory. 0: none are.
    pub max_parked: u32,
    /// How long the lease may go unconfirmed (since the last renewal Redis answered held was
    /// asked for) before the subscription writes nothing more: it abandons what it holds, left
    /// pending in Redis as it is, and ends as if the lease were lost. Shorter than the lease's
    /// lifetime, so that it stops before another holder can take the name. `None`: it reads and
    /// flushes on through an outage, its lease renewed once Redis is back.
    pub fence_after: Option<Duration>,
    /// Slot and read ids begin after this (see [`crate::window::Window::numbered_from`]); 0 for a
    /// subscription alone on its client stream.
    pub numbered_from: u64,
}

/// Identifies one flush handed out by [`super::Action::Flush`] or
/// [`super::Action::DeadLetter`].
pub type FlushId = u64;

/// Identifies a fetch of parked entries handed out by [`super::Action::Fetch`].
pub type FetchId = u64;

/// Identifies a read on an ordered stream's read lane ([`Lane::InOrder`]).
pub type LaneReadId = u64;

/// Where a read goes, and how it reads there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    /// The reader, one read at a time on the subscription's own connection, blocking at most
    /// `block`. `reread`: go through this consumer's own pending entries first; `recover`:
    /// first recover entries of idle or dead consumers.
    Reader {
        block: Duration,
        reread: bool,
        recover: bool,
    },
    /// An ordered stream's read lane: new entries only, no block (there is a backlog), behind
    /// the reads handed to it before. The lane runs its reads one after another on one
    /// connection and answers them in the order asked, so their entries come in the order
    /// Redis handed them out.
    InOrder(LaneReadId),
}

/// Which read answered (see [`super::Engine::read_returned`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadFrom {
    /// The reader: it answers its reads in the order asked.
    Reader,
    /// A read on the read lane.
    Lane(LaneReadId),
}

/// What a read returned.
#[derive(Clone, Debug)]
pub struct Read<E> {
    pub entries: Vec<E>,
    /// The entries may already be held by this window (pending, claimed or own entries).
    pub redelivery: bool,
    /// Pub/sub: messages dropped for a slow client since the previous read.
    pub lost: u64,
    /// Entries of a re-read or a reclaim whose `retry_after` is not due yet, with the time
    /// left: held until then, not handed out now, and counted when due. The read's count of
    /// them was taken back with it (nobody saw that delivery).
    pub delayed: Vec<(E, Duration)>,
}

impl<E> Read<E> {
    #[cfg(test)]
    pub fn new(entries: Vec<E>) -> Self {
        Self {
            entries,
            redelivery: false,
            lost: 0,
            delayed: Vec::new(),
        }
    }
}

/// Why a read failed, as far as the engine cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadError {
    /// Try again later. `unknown`: no reply came, so Redis may have handed entries to this
    /// consumer that only its own pending entries still name.
    Retry { unknown: bool },
    /// The subscription cannot go on.
    Fatal(Stop),
}

/// How a flush ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlushStatus {
    Ok,
    /// Some commands failed. `settle_failed`: the read's entries are still pending.
    Failed {
        settle_failed: bool,
    },
    /// No reply came: it may still run, until [`super::Engine::flush_settled`] says it cannot.
    Unknown,
}

/// Why the engine ended a subscription.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Shutdown: its grace period ran out, or nothing was outstanding.
    Shutdown,
    /// The stream's consumer group was deleted under the subscription.
    GroupDeleted,
    /// The key holds another type than the form reads.
    WrongType,
    /// Another holder took the consumer name after this subscription's lease expired.
    LeaseLost,
}

/// An outcome for a slot, as the client sent it.
#[derive(Clone, Debug, PartialEq)]
pub struct SettleRequest {
    pub slot: SlotId,
    pub outcome: Outcome,
    pub reason: Option<String>,
}

/// What renewing the lease found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseRenewal {
    Held,
    /// Another holder has it.
    Lost,
    /// Redis did not answer: try again soon.
    Failed,
}

/// What [`super::Engine::apply`] did with a client batch.
#[derive(Debug, Default)]
pub struct Applied {
    /// The outcomes the window took, in order.
    pub settled: Vec<(SlotId, Outcome)>,
    pub rejected: Vec<SlotError>,
}

/// What the admin view shows of an engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct View {
    pub reading: bool,
    pub open_reads: usize,
    pub outstanding: usize,
    pub kept_segments: usize,
    pub flushes: usize,
    /// Entries waiting for an earlier entry of their ordering key.
    pub waiting_for_key: usize,
    pub draining: bool,
    pub closed: ClosedCounts,
}

/// What a subscription's close did with what it held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClosedCounts {
    /// Reads flushed by the close itself (what was owed once outstanding deliveries were
    /// abandoned).
    pub flushed_at_close: usize,
    /// Deliveries still outstanding at the close: left pending in Redis (a simple list's are
    /// pushed back), to be delivered again.
    pub left_pending: usize,
}
