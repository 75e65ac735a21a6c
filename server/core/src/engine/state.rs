//! The engine's state: the [`Engine`] of one subscription and its fields (the window, where
//! the subscription is in its life, the reads and flushes under way, the parts it holds), how
//! it starts, and what the I/O task asks of it between events (the actions decided, the next
//! deadline, the admin view). The handlers implement it from the files above this one, an
//! `impl` block each: they share this file beneath them rather than the engine's root, which
//! declares them. The fields are `pub(super)` for those files: the engine's own, seen by
//! nothing outside it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use super::action::Action;
use super::liveness::{Lease, Recovery};
use super::ordering;
use super::report::FlushReport;
use super::types::{ClosedCounts, Config, FlushId, Item, Kind, LaneReadId, Stop, View};
use crate::window::{SlotId, Window};

/// A flush handed out and not yet over.
#[derive(Debug)]
pub(super) struct Flushing<E: Item> {
    /// Deliveries it settles: they count against the in-flight limit until it is reported.
    pub(super) deliveries: usize,
    /// Ids it settles (streams), which a re-read must not hand out again.
    pub(super) ids: Vec<E::Id>,
    /// Reported with an unknown outcome: still able to run.
    pub(super) unknown: bool,
    pub(super) reported: bool,
    /// Retries it keeps in place, with their delay: back in their lanes once it succeeded.
    pub(super) in_place: Vec<(E, Option<Duration>)>,
    /// Its retries Redis refused to keep in place: read again.
    pub(super) not_kept: Vec<E::Id>,
    /// Its report, filled when it is reported and then handed to the client.
    pub(super) report: Option<FlushReport>,
}

/// Where a subscription is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    Open,
    /// Shutdown began: no more reads; outcomes count until `until`.
    Draining {
        until: Instant,
    },
    /// Waiting for the read under way before giving back (simple lists).
    ClosingAfterRead {
        stop: Option<Stop>,
    },
    /// Flushing what is owed.
    Closing {
        stop: Option<Stop>,
    },
    /// The client's stream ended; the last read is still under way.
    Ended,
    Done,
}

/// The reader's read under way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ReaderRead {
    pub(super) count: u32,
    /// It reads new entries only (no re-read, no recovery): reads riding on flushes may go
    /// beside it, since Redis hands each new entry to one read. Beside a re-read they may not:
    /// a re-read returns whatever a read ahead claimed first, and its reply can come first.
    pub(super) fresh: bool,
}

/// The engine of one subscription.
#[derive(Debug)]
pub struct Engine<E: Item> {
    pub(super) config: Config,
    pub(super) window: Window<E>,
    pub(super) phase: Phase,
    pub(super) client_here: bool,
    pub(super) reader: Option<ReaderRead>,
    /// Reads riding at the end of flushes under way, by flush, with their COUNT.
    pub(super) ahead: BTreeMap<FlushId, u32>,
    /// Reads on an ordered stream's read lane under way, with their COUNT.
    pub(super) lane_reads: BTreeMap<LaneReadId, u32>,
    /// Reads on the read lane whose reply never came: they may still run, until
    /// [`Engine::read_settled`] says they cannot. A re-read waits for them, and so does the end.
    pub(super) lost_reads: BTreeSet<LaneReadId>,
    pub(super) next_lane_read: LaneReadId,
    /// The last read of new entries came back full: more are waiting.
    pub(super) backlog: bool,
    /// How many more entries than COUNT a read of new entries asks for, to make up for those
    /// its busy keys will hold back (an ordered stream that parks; see [`Engine::size_reads`]).
    pub(super) read_extra: u32,
    /// Reads asked of the reader and answers received: it answers in order.
    pub(super) reader_asked: u64,
    /// The reader request that began the last re-read of this consumer's own entries.
    pub(super) reread_asked: u64,
    /// The read under way was asked to return at once, for a retry that is due.
    pub(super) read_interrupted: bool,
    pub(super) reader_answered: u64,
    /// Ids of flushes that ended while reader request `n` (and those before) was under way:
    /// that request may have read them before their settle ran.
    pub(super) settled_during_reads: Vec<(u64, Vec<E::Id>)>,
    pub(super) flushes: BTreeMap<FlushId, Flushing<E>>,
    pub(super) next_flush: FlushId,
    /// Deliveries in flushes not yet reported.
    pub(super) flushing_deliveries: usize,
    /// This consumer's own entries must be read again (a settle or a read failed).
    pub(super) reread_owed: bool,
    pub(super) read_failures: u32,
    /// Flushes in a row whose settle Redis refused (out of memory, an ACL, a key of the wrong
    /// type): the reads after each wait longer, as after failed reads. A refusal that lasts
    /// would otherwise have every re-read bring the same entries back at once and try the same
    /// writes again, round trip after round trip, against a Redis already refusing them.
    pub(super) refused_settles: u32,
    pub(super) retry_read_at: Option<Instant>,
    pub(super) lease: Option<Lease>,
    pub(super) recovery: Option<Recovery>,
    /// When each delivery still outstanding was last extended.
    pub(super) extended: HashMap<SlotId, Instant>,
    pub(super) lease_extended: Option<Instant>,
    /// What closing found, for the closing log line.
    pub(super) closed: ClosedCounts,
    pub(super) lanes: ordering::Lanes<E>,
    /// The lease may have expired (see [`Config::fence_after`]): nothing more is written.
    pub(super) fenced: bool,
    pub(super) actions: Vec<Action<E>>,
}

impl<E: Item> Engine<E> {
    /// A subscription that just opened (its lease taken, if it has one).
    pub fn new(config: Config, now: Instant) -> Self {
        let lease = config.lease_renewal.map(|every| Lease::new(every, now));
        let parking = (config.ordered && config.kind == Kind::Stream && config.max_parked > 0)
            .then_some(ordering::Parking {
                bound: config.max_in_flight as usize,
                batch: config.count as usize,
                max_parked: config.max_parked as usize,
            });
        let lanes = ordering::Lanes::new(
            (config.ordered, config.kind == Kind::Stream),
            config.extend_waiting_every,
            parking,
        );
        let recovery = config
            .kind
            .recovers()
            .then(|| Recovery::new(config.kind, config.recovery_interval, now));
        let mut engine = Self {
            window: Window::numbered_from(config.limits, config.numbered_from),
            config,
            phase: Phase::Open,
            client_here: true,
            reader: None,
            ahead: BTreeMap::new(),
            lane_reads: BTreeMap::new(),
            lost_reads: BTreeSet::new(),
            next_lane_read: 1,
            backlog: false,
            read_extra: 0,
            reader_asked: 0,
            reread_asked: 0,
            read_interrupted: false,
            reader_answered: 0,
            settled_during_reads: Vec::new(),
            flushes: BTreeMap::new(),
            next_flush: 1,
            flushing_deliveries: 0,
            reread_owed: false,
            read_failures: 0,
            refused_settles: 0,
            retry_read_at: None,
            lease,
            recovery,
            extended: HashMap::new(),
            lease_extended: None,
            closed: ClosedCounts::default(),
            lanes,
            fenced: false,
            actions: Vec::new(),
        };
        engine.advance(now);
        engine
    }

    /// The actions decided since the last call, in the order to execute them.
    pub fn take_actions(&mut self) -> Vec<Action<E>> {
        std::mem::take(&mut self.actions)
    }

    /// When [`Engine::tick`] has something to do next, if ever.
    pub fn next_deadline(&self) -> Option<Instant> {
        let draining = match self.phase {
            Phase::Draining { until } => Some(until),
            _ => None,
        };
        [
            self.retry_read_at,
            draining,
            self.lease.as_ref().and_then(Lease::due),
            self.lanes.next_due(),
            self.lanes.extend_due(),
            self.lanes.fetch_due(),
            self.fence_at(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// A snapshot for the admin view.
    pub fn view(&self) -> View {
        View {
            reading: self.reader.is_some() || self.reading_ahead(),
            open_reads: self.window.open_reads(),
            outstanding: self.window.outstanding(),
            kept_segments: self.window.kept_segments(),
            flushes: self.flushes.len(),
            waiting_for_key: self.lanes.waiting() + self.lanes.parked(),
            draining: !matches!(self.phase, Phase::Open),
            closed: self.closed,
        }
    }

    /// Whether the engine has stopped.
    pub fn is_done(&self) -> bool {
        self.phase == Phase::Done
    }
}
