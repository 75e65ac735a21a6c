//! A model of Redis, the reader, the flusher and a client around one engine: it executes the
//! engine's actions the way the real tasks would (with reads and flushes that run in Redis
//! apart from their replies, replies lost, flushes that run late), and checks every action
//! against the invariants as it goes.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use super::super::*;

mod checks;
mod client;
use crate::window::{Limits, Outcome, ReadId, SlotId};

#[derive(Clone, Debug, PartialEq)]
pub(super) struct E {
    pub(super) id: u64,
    pub(super) count: u32,
    /// Its ordering key, on an ordered subscription.
    pub(super) key: Option<u8>,
}

impl Item for E {
    type Id = u64;
    /// Its id and count.
    type Parked = (u64, u32);
    fn park(&self) -> (u64, u32) {
        (self.id, self.count)
    }
    fn stub(&(id, count): &(u64, u32)) -> Self {
        E {
            id,
            count,
            key: None,
        }
    }
    fn id(&self) -> u64 {
        self.id
    }
    fn delivery_count(&self) -> u32 {
        self.count
    }
    fn ordering_key(&self) -> Option<&crate::domain::Key> {
        static KEYS: std::sync::OnceLock<Vec<crate::domain::Key>> = std::sync::OnceLock::new();
        let keys = KEYS.get_or_init(|| {
            (0..=u8::MAX)
                .map(|k| crate::domain::Key::from(&[k][..]))
                .collect()
        });
        self.key.map(|k| &keys[usize::from(k)])
    }
    fn redelivered(&self) -> Self {
        E {
            count: self.count + 1,
            ..self.clone()
        }
    }
}

pub(super) const COUNT: u32 = 3;
pub(super) const MAX_IN_FLIGHT: u32 = 5;
pub(super) const CAP: u32 = 3;
pub(super) const RENEW: Duration = Duration::from_millis(300);
/// A fenced subscription's `fence_after`: a few renewals' worth, as a lease's lifetime is.
pub(super) const FENCE: Duration = Duration::from_millis(800);
pub(super) const EXTEND_EVERY: Duration = Duration::from_millis(200);
/// Ordering keys on an ordered subscription: few, so that they collide.
const KEYS: u64 = 3;
const EXTEND_WAITING_EVERY: Duration = Duration::from_millis(500);
/// Entries parked past the waiting bound on an ordered stream: few, so that reads stop there.
const MAX_PARKED: u32 = 6;

/// An original entry's ordering key on an ordered subscription: one in seven has none.
fn key_of(id: u64) -> Option<u8> {
    (!id.is_multiple_of(7)).then_some((id % KEYS) as u8)
}

pub(super) fn ordered_config(kind: Kind) -> Config {
    Config {
        ordered: true,
        extend_waiting_every: (kind == Kind::Stream).then_some(EXTEND_WAITING_EVERY),
        max_parked: MAX_PARKED,
        ..config(kind)
    }
}

pub(super) fn config(kind: Kind) -> Config {
    Config {
        kind,
        count: COUNT,
        max_in_flight: MAX_IN_FLIGHT,
        max_deliveries: CAP,
        block: Duration::from_secs(5),
        recovery_interval: Duration::from_secs(1),
        lease_renewal: matches!(kind, Kind::Stream | Kind::ReliableList).then_some(RENEW),
        read_ahead: true,
        reports_in_reads: true,
        shutdown_grace: Duration::from_secs(2),
        limits: Limits {
            max_commands_per_slot: 4,
        },
        extend_every: EXTEND_EVERY,
        ordered: false,
        extend_waiting_every: None,
        max_parked: 0,
        fence_after: None,
        numbered_from: 0,
    }
}

/// A flush handed to the model flusher, and what running it in Redis answered.
pub(super) struct FlushOp {
    id: FlushId,
    /// Each settled entry, its outcome and whether its segment is kept.
    settles: Vec<(E, Outcome, bool)>,
    /// Entries it retries in place: no settle, their delivery counted.
    in_place: Vec<u64>,
    dead_letter: bool,
    read_ahead: Option<u32>,
    ran: Option<Ran>,
}

/// A flush, or a read on the lane, whose reply was lost: it may still run.
struct Stale {
    /// The flush's id, or the read's.
    id: u64,
    lane: bool,
    settles: Vec<(E, Outcome, bool)>,
    dead_letter: bool,
    in_place: Vec<u64>,
}
/// What running a flush answered, and its read-ahead.
type Ran = (FlushStatus, Option<Result<Read<E>, ReadError>>);

/// Redis, the reader, the flusher and the client around one engine.
pub(super) struct World {
    kind: Kind,
    ordered: bool,
    /// Each entry's ordering key (a copy has its original's).
    keys: HashMap<u64, Option<u8>>,
    /// Entries being moved to the dead letter unread, by flush.
    dead_lettering: HashMap<FlushId, Vec<u64>>,
    /// Entries read past the cap: never delivered again, whether or not their move to the
    /// dead letter has run yet.
    past_cap: HashSet<u64>,
    engine: Engine<E>,
    now: Instant,
    /// Entries not yet taken (a stream's `>`, a list's values), oldest first.
    backlog: VecDeque<u64>,
    /// Taken and not settled: a stream's pending entries, a reliable list's processing list.
    pending: BTreeSet<u64>,
    /// Deliveries Redis has recorded per entry (a stream's PEL counter, a list's counts hash,
    /// with the earlier attempts a retried copy carries).
    counts: HashMap<u64, u32>,
    /// Reads re-deliver this consumer's own entries first (a fresh reader does).
    own_first: bool,
    /// A reliable list's processing list as its reader took it to deliver again, page by page.
    own_list: VecDeque<u64>,
    /// A stream's re-read goes on after the last pending entry it returned (`XREADGROUP … <id>`).
    own_after: u64,
    reader: Option<(u32, bool)>,
    reader_answer: Option<Result<Read<E>, ReadError>>,
    flusher: VecDeque<FlushOp>,
    /// An ordered stream's read lane: its reads run and answer in the order asked, in any
    /// order with the flusher's flushes. Each is a flush of only a read, by the read's id.
    lane: VecDeque<FlushOp>,
    /// Fetches of parked entries under way, by id with the entries asked (id and count).
    fetcher: VecDeque<(FetchId, Vec<(u64, u32)>)>,
    /// Counts of due retries under way, by id with the entries asked.
    counter: VecDeque<(FetchId, Vec<E>)>,
    /// Flushes whose reply was lost, which may still run.
    stale: Vec<Stale>,
    /// Stale flushes and reads on the lane (`true`) that can no longer run, to be said so
    /// once reported.
    settle_after_report: Vec<(bool, u64)>,
    lease_asked: bool,
    last_renewal: Instant,
    /// The engine's `fence_after`, if it is fenced.
    fence: Option<Duration>,
    /// When the renewal under way was asked for, and when the last one answered held was.
    renewal_asked: Instant,
    confirmed: Instant,
    /// Side effects that ran, per entry.
    effects: HashMap<u64, u32>,
    settled: BTreeSet<u64>,
    dead: BTreeSet<u64>,
    next_id: u64,
    originals: u64,
    /// The client: what it holds by slot, deliveries it got per entry.
    holding: BTreeMap<SlotId, E>,
    seen: HashMap<u64, u32>,
    /// Entries whose deliveries Redis counted without the client getting them (a read whose
    /// reply was lost): their counts may run ahead of what the client saw.
    lost_replies: HashSet<u64>,
    /// Simple-list entries whose flush failed: lost, as that form allows.
    may_lose: HashSet<u64>,
    /// Entries in flushes that have not ended.
    flushing: HashMap<FlushId, Vec<u64>>,
    /// Slots flushed, with their read; a read flushes whole, or (ordered) its settled part
    /// ahead and the rest after, never a slot twice.
    flushed_slots: HashMap<SlotId, ReadId>,
    /// When each entry was last extended in Redis.
    extended: HashMap<u64, Instant>,
    /// The flush reports the client got, alone or riding in a read: the last one's status.
    reports: Vec<FlushStatus>,
    /// The client closed its stream: it settles nothing more.
    client_done: bool,
    ended: bool,
    pub(super) done: bool,
}

impl World {
    pub(super) fn new(kind: Kind, entries: u64) -> Self {
        Self::with(kind, entries, false, None)
    }

    /// An ordered subscription (streams and reliable lists).
    pub(super) fn ordered(kind: Kind, entries: u64) -> Self {
        Self::with(kind, entries, true, None)
    }

    /// A subscription fenced by its lease (a partition's): it writes nothing once `FENCE` has
    /// passed since the last renewal Redis confirmed was asked for.
    pub(super) fn fenced(kind: Kind, entries: u64, ordered: bool) -> Self {
        Self::with(kind, entries, ordered, Some(FENCE))
    }

    fn with(kind: Kind, entries: u64, ordered: bool, fence: Option<Duration>) -> Self {
        let now = Instant::now();
        let config = Config {
            fence_after: fence,
            ..if ordered {
                ordered_config(kind)
            } else {
                config(kind)
            }
        };
        let keys = (1..=entries)
            .map(|id| (id, key_of(id).filter(|_| ordered)))
            .collect();
        let mut world = Self {
            kind,
            ordered,
            keys,
            dead_lettering: HashMap::new(),
            past_cap: HashSet::new(),
            engine: Engine::new(config, now),
            now,
            backlog: (1..=entries).collect(),
            pending: BTreeSet::new(),
            counts: HashMap::new(),
            own_first: true,
            own_list: VecDeque::new(),
            own_after: 0,
            reader: None,
            reader_answer: None,
            flusher: VecDeque::new(),
            lane: VecDeque::new(),
            fetcher: VecDeque::new(),
            counter: VecDeque::new(),
            stale: Vec::new(),
            settle_after_report: Vec::new(),
            lease_asked: false,
            last_renewal: now,
            fence,
            renewal_asked: now,
            confirmed: now,
            effects: HashMap::new(),
            settled: BTreeSet::new(),
            dead: BTreeSet::new(),
            next_id: entries + 1,
            originals: entries,
            holding: BTreeMap::new(),
            seen: HashMap::new(),
            lost_replies: HashSet::new(),
            may_lose: HashSet::new(),
            flushing: HashMap::new(),
            flushed_slots: HashMap::new(),
            extended: HashMap::new(),
            reports: Vec::new(),
            client_done: false,
            ended: false,
            done: false,
        };
        world.collect();
        world
    }

    pub(super) fn keeps_pending(&self) -> bool {
        matches!(self.kind, Kind::Stream | Kind::ReliableList)
    }

    /// The most a read of new entries asks for: COUNT, or up to twice that on an ordered
    /// stream that parks, to make up for what its busy keys hold back.
    fn most_read(&self) -> u32 {
        if self.ordered && self.kind == Kind::Stream {
            2 * COUNT
        } else {
            COUNT
        }
    }

    /// Executes the engine's actions against the model, checking each.
    pub(super) fn collect(&mut self) {
        self.engine.lanes.check_books();
        let fenced = self.fence.is_some_and(|f| self.now >= self.confirmed + f);
        for action in self.engine.take_actions() {
            assert!(!self.done, "an action after Done: {action:?}");
            assert!(
                !fenced
                    || matches!(
                        action,
                        Action::EndStream(_)
                            | Action::Done
                            | Action::Report(_)
                            | Action::RenewLease
                            | Action::InterruptRead
                            | Action::Lost(_)
                            | Action::Draining { .. }
                    ),
                "a write {:?} after the lease was last confirmed: {action:?}",
                self.now - self.confirmed
            );
            match action {
                Action::Read {
                    count,
                    lane: Lane::Reader { reread, .. },
                } => {
                    assert!(
                        self.reader.is_none() && self.reader_answer.is_none(),
                        "one read at a time"
                    );
                    let most = if reread { COUNT } else { self.most_read() };
                    assert!((1..=most).contains(&count), "a read of {count}");
                    self.reader = Some((count, reread));
                    if reread && self.ordered && self.kind == Kind::ReliableList {
                        // The engine forgot the entries waiting for their key (the window is
                        // empty now): the re-read counts them once more, never delivered.
                        self.lost_replies.extend(self.pending.iter().copied());
                    }
                }
                Action::Read {
                    count,
                    lane: Lane::InOrder(read),
                } => {
                    assert!(
                        self.ordered && self.kind == Kind::Stream,
                        "a read on the lane unordered or off a stream"
                    );
                    assert!((1..=self.most_read()).contains(&count), "a read of {count}");
                    assert!(
                        self.reader.is_none() && self.reader_answer.is_none(),
                        "a read on the lane beside the reader's"
                    );
                    assert!(self.lane.len() < 2, "more than two reads out on the lane");
                    self.lane.push_back(FlushOp {
                        id: read,
                        settles: Vec::new(),
                        in_place: Vec::new(),
                        dead_letter: false,
                        read_ahead: Some(count),
                        ran: None,
                    });
                }
                Action::Fetch { fetch, parked } => {
                    assert!(
                        self.ordered && self.kind == Kind::Stream,
                        "a fetch unordered or off a stream"
                    );
                    for &(id, _) in &parked {
                        assert!(
                            self.pending.contains(&id),
                            "fetched entry {id} is not pending"
                        );
                        assert!(
                            !self.holding.values().any(|h| h.id == id),
                            "fetched entry {id} is out"
                        );
                    }
                    self.fetcher.push_back((fetch, parked));
                }
                Action::Count { count, entries } => {
                    assert_eq!(self.kind, Kind::Stream, "a count off a stream");
                    for e in &entries {
                        assert!(
                            !self.holding.values().any(|h| h.id == e.id),
                            "counted entry {} is out",
                            e.id
                        );
                    }
                    self.counter.push_back((count, entries));
                }
                Action::Deliver {
                    read,
                    entries,
                    report,
                    ..
                } => {
                    assert!(!self.ended, "a delivery after the stream ended");
                    self.reports.extend(report.map(|r| r.result.status()));
                    if self.ordered {
                        self.check_key_order(&entries);
                    }
                    let flushing: HashSet<u64> =
                        self.flushing.values().flatten().copied().collect();
                    for (i, e) in entries.iter().enumerate() {
                        assert!(
                            !self.holding.values().any(|h| h.id == e.id),
                            "entry {} handed out while outstanding",
                            e.id
                        );
                        assert!(
                            !flushing.contains(&e.id),
                            "entry {} handed out while being flushed",
                            e.id
                        );
                        assert!(e.count <= CAP, "entry {} delivered past the cap", e.id);
                        let seen = self.seen.entry(e.id).or_default();
                        *seen += 1;
                        assert!(
                            e.count >= *seen,
                            "entry {} counts {} deliveries, the client got {}",
                            e.id,
                            e.count,
                            seen
                        );
                        if !self.lost_replies.contains(&e.id) {
                            assert_eq!(
                                e.count, *seen,
                                "entry {} counts a delivery the client did not get",
                                e.id
                            );
                        }
                        // A new delivery may be extended at once.
                        self.extended.remove(&e.id);
                        self.holding.insert(read.first_slot + i as u64, e.clone());
                    }
                    assert!(
                        self.holding.len() <= MAX_IN_FLIGHT as usize,
                        "more than max_in_flight out"
                    );
                }
                Action::Lost(_) => {}
                Action::InterruptRead => {
                    // Only a read under way is cut short; it answers when the model says.
                    assert!(
                        self.reader.is_some() || self.reader_answer.is_some(),
                        "an interrupt without a read under way"
                    );
                }
                Action::Flush {
                    flush,
                    batch,
                    read_ahead,
                } => {
                    for s in &batch.settles {
                        let earlier = self.flushed_slots.insert(s.slot, batch.read_id);
                        assert!(earlier.is_none(), "slot {} flushed twice", s.slot);
                    }
                    assert!(
                        read_ahead.is_none() || !matches!(self.reader, Some((_, true))),
                        "a read ahead beside a re-read that has not run"
                    );
                    assert!(
                        read_ahead.is_none() || !self.ordered,
                        "an ordered read riding on a flush, beside the lane's"
                    );
                    let settles = batch
                        .settles
                        .iter()
                        .map(|s| {
                            let kept = batch.kept.iter().any(|k| k.slot == s.slot);
                            (s.entry.clone(), s.outcome, kept)
                        })
                        .collect::<Vec<_>>();
                    let in_place: Vec<u64> =
                        batch.in_place.iter().map(|&i| settles[i].0.id).collect();
                    for &i in &batch.in_place {
                        let (e, outcome, _) = &settles[i];
                        assert!(
                            self.kind == Kind::Stream || (self.ordered && e.key.is_some()),
                            "entry {} kept in place unordered off a stream",
                            e.id
                        );
                        assert!(
                            matches!(outcome, Outcome::Retry | Outcome::RetryAfter(_))
                                && !exhausted(e.count, CAP),
                            "entry {} kept in place for {outcome:?} at count {}",
                            e.id,
                            e.count
                        );
                    }
                    if self.kind == Kind::Stream {
                        for (e, outcome, _) in &settles {
                            let retry = matches!(outcome, Outcome::Retry | Outcome::RetryAfter(_));
                            assert!(
                                !retry || exhausted(e.count, CAP) || in_place.contains(&e.id),
                                "a stream's retry of entry {} copied, not kept in place",
                                e.id
                            );
                        }
                    }
                    self.flushing
                        .insert(flush, settles.iter().map(|(e, ..)| e.id).collect());
                    self.flusher.push_back(FlushOp {
                        id: flush,
                        settles,
                        in_place,
                        dead_letter: false,
                        read_ahead,
                        ran: None,
                    });
                }
                Action::DeadLetter { flush, entries } => {
                    for e in &entries {
                        assert!(e.count > CAP);
                    }
                    let settles: Vec<_> = entries
                        .into_iter()
                        .map(|e| (e, Outcome::Drop, false))
                        .collect();
                    self.flushing
                        .insert(flush, settles.iter().map(|(e, ..)| e.id).collect());
                    self.dead_lettering
                        .insert(flush, settles.iter().map(|(e, ..)| e.id).collect());
                    self.past_cap.extend(settles.iter().map(|(e, ..)| e.id));
                    self.flusher.push_back(FlushOp {
                        id: flush,
                        settles,
                        in_place: Vec::new(),
                        dead_letter: true,
                        read_ahead: None,
                        ran: None,
                    });
                }
                Action::Report(report) => self.reports.push(report.result.status()),
                Action::GiveBack { entries, seen } => self.give_back(entries, seen),
                Action::RenewLease => {
                    assert!(!self.lease_asked, "two renewals at once");
                    self.lease_asked = true;
                    self.renewal_asked = self.now;
                }
                Action::Extend(entries) => self.extended_in_redis(entries),
                Action::Draining { .. } => {}
                Action::EndStream(_) => {
                    assert!(!self.ended);
                    assert!(
                        self.flushing.is_empty(),
                        "the stream ended before its flushes"
                    );
                    assert!(
                        self.lane.is_empty() && !self.stale.iter().any(|s| s.lane),
                        "the stream ended before its reads on the lane"
                    );
                    self.ended = true;
                    self.holding.clear();
                }
                Action::Done => {
                    assert!(self.ended);
                    assert!(
                        self.reader.is_none() && self.reader_answer.is_none(),
                        "done with a read under way"
                    );
                    self.done = true;
                }
            }
        }
    }
}

impl World {
    pub(super) fn give_back(&mut self, entries: Vec<E>, seen: bool) {
        match self.kind {
            // Retries kept uncounted for a due time: they stay pending as they are.
            Kind::Stream if seen => {}
            Kind::Stream => {
                for e in entries {
                    // XCLAIM without FORCE: only entries still pending.
                    if self.pending.contains(&e.id) {
                        *self.counts.get_mut(&e.id).expect("counted") -= 1;
                    }
                }
            }
            Kind::ReliableList => {
                assert!(
                    !seen,
                    "a reliable list's seen entries stay in its processing list"
                );
                for e in entries.iter().rev() {
                    if self.pending.remove(&e.id) {
                        self.backlog.push_front(e.id);
                    }
                }
            }
            Kind::SimpleList => {
                for e in entries.iter().rev() {
                    if seen {
                        *self.counts.entry(e.id).or_default() += 1;
                    }
                    self.backlog.push_front(e.id);
                }
            }
            Kind::PubSub => {}
        }
    }

    /// Takes up to `count` new entries, as a read of `>` or a list's move or pop does.
    pub(super) fn take_new(&mut self, count: u32) -> Vec<E> {
        let mut entries = Vec::new();
        while entries.len() < count as usize {
            let Some(id) = self.backlog.pop_front() else {
                break;
            };
            let earlier = self.counts.entry(id).or_default();
            let count = *earlier + 1;
            if self.kind == Kind::Stream {
                *earlier = count;
            }
            if self.keeps_pending() {
                self.pending.insert(id);
            }
            entries.push(E {
                id,
                count,
                key: self.keys[&id],
            });
        }
        entries
    }

    /// Runs the read under way in Redis; `lose_reply`: Redis did it but no reply came.
    pub(super) fn run_read(&mut self, lose_reply: bool) {
        let Some((count, reread)) = self.reader.take() else {
            return;
        };
        if reread {
            self.own_first = true;
            self.own_after = 0;
            // Taken again before these were delivered: counted twice.
            self.lost_replies.extend(self.own_list.drain(..));
        }
        let mut read = Read::new(Vec::new());
        if self.kind == Kind::ReliableList {
            if self.own_first {
                // LRANGE of the processing list, each entry's last delivery recorded at once.
                self.own_first = false;
                self.own_list = self.pending.iter().copied().collect();
                for id in &self.own_list {
                    *self.counts.entry(*id).or_default() += 1;
                }
            }
            let n = (count as usize).min(self.own_list.len());
            for id in self.own_list.drain(..n) {
                read.redelivery = true;
                read.entries.push(E {
                    id,
                    count: self.counts[&id] + 1,
                    key: self.keys[&id],
                });
            }
        } else if self.own_first && self.keeps_pending() {
            let own: Vec<u64> = self
                .pending
                .range(self.own_after + 1..)
                .copied()
                .take(count as usize)
                .collect();
            match own.last() {
                Some(last) => self.own_after = *last,
                None => {
                    self.own_first = false;
                    self.own_after = 0;
                }
            }
            if !own.is_empty() {
                read.redelivery = true;
                for id in own {
                    // A stream's counter counts this delivery.
                    let c = self.counts.entry(id).or_default();
                    *c += 1;
                    let count = *c;
                    read.entries.push(E {
                        id,
                        count,
                        key: self.keys[&id],
                    });
                }
            }
        }
        if read.entries.is_empty() {
            read.entries = self.take_new(count);
        }
        let answer = if lose_reply && self.keeps_pending() {
            for e in &read.entries {
                self.lost_replies.insert(e.id);
            }
            Err(ReadError::Retry { unknown: true })
        } else if lose_reply {
            // A list or pub/sub read that failed took nothing.
            for e in read.entries.iter().rev() {
                self.backlog.push_front(e.id);
                if let Some(c) = self
                    .counts
                    .get_mut(&e.id)
                    .filter(|_| self.kind == Kind::Stream)
                {
                    *c -= 1;
                }
            }
            Err(ReadError::Retry { unknown: false })
        } else {
            Ok(read)
        };
        self.reader_answer = Some(answer);
    }

    /// Runs the next flush in Redis: `ok`, not sent, or sent with the reply lost (then it may
    /// still run until [`Engine::flush_settled`]).
    pub(super) fn run_flush(&mut self, how: u8) {
        let lane = self.on_lane(how);
        let queue = if lane {
            &mut self.lane
        } else {
            &mut self.flusher
        };
        let Some(op) = queue.iter_mut().find(|op| op.ran.is_none()) else {
            return;
        };
        let status = match how % 4 {
            0 | 1 => FlushStatus::Ok,
            // A read on the lane settles nothing: it fails unsent (below), never its settles.
            2 if lane => FlushStatus::Ok,
            2 => FlushStatus::Failed {
                settle_failed: true,
            },
            _ => FlushStatus::Unknown,
        };
        let (id, settles, dead_letter, read_ahead) =
            (op.id, op.settles.clone(), op.dead_letter, op.read_ahead);
        let in_place = op.in_place.clone();
        match status {
            FlushStatus::Ok => self.apply_flush(&settles, dead_letter, &in_place),
            FlushStatus::Unknown => self.stale.push(Stale {
                id,
                lane,
                settles,
                dead_letter,
                in_place,
            }),
            FlushStatus::Failed { .. } => {
                if self.kind == Kind::SimpleList {
                    // A popped entry exists only in the flush that settles it: at most once.
                    self.may_lose.extend(settles.iter().map(|(e, ..)| e.id));
                }
            }
        }
        let read = read_ahead.map(|count| match status {
            FlushStatus::Ok if lane && how % 4 == 2 => Err(ReadError::Retry { unknown: false }),
            FlushStatus::Ok => Ok(Read::new(self.take_new(count))),
            FlushStatus::Failed { .. } => Err(ReadError::Retry { unknown: false }),
            FlushStatus::Unknown => {
                if how % 8 >= 4 {
                    // The read at its end ran; its reply was lost with the flush's.
                    for e in self.take_new(count) {
                        self.lost_replies.insert(e.id);
                    }
                }
                Err(ReadError::Retry { unknown: true })
            }
        });
        let queue = if lane {
            &mut self.lane
        } else {
            &mut self.flusher
        };
        let op = queue
            .iter_mut()
            .find(|op| op.id == id)
            .expect("found above");
        op.ran = Some((status, read));
    }

    /// What a flush does in Redis. Side effects and copies are written whether or not the
    /// entry is still pending (neither a pipeline nor MULTI asks); the settle finds it or not.
    pub(super) fn apply_flush(
        &mut self,
        settles: &[(E, Outcome, bool)],
        dead_letter: bool,
        in_place: &[u64],
    ) {
        for (e, outcome, kept) in settles {
            if *kept {
                *self.effects.entry(e.id).or_default() += 1;
            }
            if in_place.contains(&e.id) {
                // XCLAIM to this consumer (a stream), HINCRBY of the counts hash (a reliable
                // list): the entry stays pending with the delivery counted; a stream's
                // retry_after uncounted, until it is due.
                let uncounted =
                    self.kind == Kind::Stream && matches!(outcome, Outcome::RetryAfter(_));
                if self.pending.contains(&e.id) && !uncounted {
                    *self.counts.entry(e.id).or_default() += 1;
                }
                continue;
            }
            if self.keeps_pending() && !self.pending.remove(&e.id) {
                continue;
            }
            self.settled.insert(e.id);
            let retry = matches!(outcome, Outcome::Retry | Outcome::RetryAfter(_));
            let dead = *outcome == Outcome::DeadLetter || (retry && exhausted(e.count, CAP));
            if dead_letter || dead {
                self.dead.insert(e.id);
            } else if retry {
                // A copy that carries the deliveries so far.
                let copy = self.next_id;
                self.next_id += 1;
                self.keys.insert(copy, e.key);
                self.counts.insert(copy, e.count);
                self.seen
                    .insert(copy, self.seen.get(&e.id).copied().unwrap_or(0));
                if self.lost_replies.contains(&e.id) {
                    self.lost_replies.insert(copy);
                }
                self.backlog.push_back(copy);
            }
        }
    }

    /// A flush whose reply was lost runs late, or never; then it can no longer run.
    pub(super) fn settle_stale(&mut self, runs: bool) {
        let Some(Stale {
            id,
            lane,
            settles,
            dead_letter,
            in_place,
        }) = self.stale.pop()
        else {
            return;
        };
        if runs {
            // Its reply was lost: the deliveries it counted for its retries in place may
            // never happen (the re-read delivers them, counted again).
            self.lost_replies.extend(in_place.iter().copied());
            self.apply_flush(&settles, dead_letter, &in_place);
        } else if self.kind == Kind::SimpleList {
            self.may_lose.extend(settles.iter().map(|(e, ..)| e.id));
        }
        let queue = if lane { &self.lane } else { &self.flusher };
        if queue.iter().any(|op| op.id == id) {
            // Reported later: settled right after its report.
            self.settle_after_report.push((lane, id));
        } else {
            self.settled(lane, id);
        }
    }

    /// A stale flush or read on the lane can no longer run: the engine is told so.
    fn settled(&mut self, lane: bool, id: u64) {
        if lane {
            self.engine.read_settled(self.now, id);
        } else {
            self.flushing.remove(&id);
            self.dead_lettering.remove(&id);
            self.engine.flush_settled(self.now, id);
        }
        self.collect();
    }

    /// Answers the oldest fetch of parked entries: with the entries (XRANGE counts no
    /// delivery), or failed.
    pub(super) fn answer_fetch(&mut self, ok: bool) {
        let Some((fetch, parked)) = self.fetcher.pop_front() else {
            return;
        };
        let result = if ok {
            Ok(parked
                .into_iter()
                .map(|(id, count)| {
                    Some(E {
                        id,
                        count,
                        key: self.keys[&id],
                    })
                })
                .collect())
        } else {
            Err(ReadError::Retry { unknown: false })
        };
        self.engine.fetched(self.now, fetch, result);
        self.collect();
    }

    /// Answers the oldest count of due retries: each still pending counted once more (a
    /// guarded `XCLAIM … RETRYCOUNT`), or failed. A re-read under way may have counted one
    /// since (it gives its own count back only while Redis has it): counted past that, it may
    /// run one ahead of the deliveries seen, never behind.
    pub(super) fn answer_count(&mut self, ok: bool) {
        let Some((count, entries)) = self.counter.pop_front() else {
            return;
        };
        let result = if ok {
            Ok(entries
                .into_iter()
                .map(|e| {
                    self.pending.contains(&e.id).then(|| {
                        let c = self.counts.get_mut(&e.id).expect("counted");
                        if *c > e.count {
                            self.lost_replies.insert(e.id);
                        }
                        *c += 1;
                        E { count: *c, ..e }
                    })
                })
                .collect())
        } else {
            Err(ReadError::Retry { unknown: false })
        };
        self.engine.counted(self.now, count, result);
        self.collect();
    }

    /// Whether `pick` runs or answers the lane rather than the flusher: the one it names, or
    /// the other when that one is empty.
    fn on_lane(&self, pick: u8) -> bool {
        if self.lane.is_empty() {
            return false;
        }
        pick & 64 != 0 || self.flusher.is_empty()
    }

    pub(super) fn answer_flush(&mut self, pick: u8) {
        let lane = self.on_lane(pick);
        let queue = if lane {
            &mut self.lane
        } else {
            &mut self.flusher
        };
        if queue.front().is_none_or(|op| op.ran.is_none()) {
            return;
        }
        let op = queue.pop_front().expect("front");
        let (status, read) = op.ran.expect("ran");
        let reports = self.reports.len();
        if lane {
            let read = read.expect("a read on the lane answers its read");
            self.engine
                .read_returned(self.now, ReadFrom::Lane(op.id), read);
        } else {
            if status != FlushStatus::Unknown {
                self.flushing.remove(&op.id);
                self.dead_lettering.remove(&op.id);
            }
            self.engine
                .flushed(self.now, op.id, super::answered(status), read);
        }
        self.collect();
        // Every flush reported hands the client its report once, with its status; a read on
        // the lane has none.
        let handed: Vec<FlushStatus> = self.reports.drain(reports..).collect();
        let expected = if lane { vec![] } else { vec![status] };
        assert_eq!(handed, expected, "the reports handed out for {}", op.id);
        if let Some(i) = self
            .settle_after_report
            .iter()
            .position(|&f| f == (lane, op.id))
        {
            self.settle_after_report.remove(i);
            self.settled(lane, op.id);
        }
    }

    /// Redis answers the renewal under way: held.
    pub(super) fn renewal_held(&mut self) {
        self.lease_asked = false;
        self.last_renewal = self.now;
        self.confirmed = self.renewal_asked;
        self.engine.lease_renewed(self.now, LeaseRenewal::Held);
        self.collect();
    }

    pub(super) fn step(&mut self, choice: u8, pick: u8) {
        match choice % 14 {
            0 => self.run_read(false),
            1 => self.run_read(pick.is_multiple_of(8)),
            2 => {
                if let Some(answer) = self.reader_answer.take() {
                    self.engine
                        .read_returned(self.now, ReadFrom::Reader, answer);
                    self.collect();
                }
            }
            3 => self.run_flush(pick),
            4 => self.answer_flush(pick),
            5 => self.settle_stale(pick.is_multiple_of(2)),
            6 | 7 => self.client_settles(pick),
            8 => {
                self.now += Duration::from_millis(u64::from(pick) * 10);
                self.engine.tick(self.now);
                self.collect();
                self.check_lease();
            }
            9 if self.lease_asked => self.renewal_held(),
            10 if pick.is_multiple_of(16) => {
                self.engine.shutdown(self.now);
                self.collect();
            }
            12 => self.client_extends(pick),
            13 if pick & 128 != 0 => self.answer_count(!pick.is_multiple_of(4)),
            13 => self.answer_fetch(!pick.is_multiple_of(4)),
            11 if pick.is_multiple_of(16) => {
                self.client_done = true;
                if pick.is_multiple_of(32) {
                    self.engine.client_gone(self.now);
                } else {
                    self.engine.client_closed(self.now);
                }
                self.collect();
            }
            _ => {}
        }
    }
}
