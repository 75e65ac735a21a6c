//! Ordering keys: entries that share a key are handed out one at a time, in the order the
//! subscription read them, while entries of other keys flow beside them.
//!
//! Each key with something in flight has a lane. A lane is busy while its delivery is out,
//! while the flush that settles it runs, and, after a flush that failed or whose outcome is
//! unknown, until the re-read of this consumer's own entries has brought back what that flush
//! may not have settled. Entries of a busy key wait in its lane, oldest first; a retry is kept
//! in place at the front of its lane (delivered again before any later entry of its key), not
//! copied to the end of the stream. When a lane frees, its first entry is handed out, once
//! due. Entries without a key take no lane: their retries kept in place (every retry on a
//! stream, ordered or not) wait in one queue by due time, handed out before anything else.
//!
//! On a stream, a hot key's entries past a fetch's worth waiting in memory are parked
//! instead: its lane keeps only what it needs to fetch them again by id ([`Item::Parked`]),
//! after its waiting entries, and fetches the first of them back while it runs short. Redis
//! keeps them pending meanwhile, so a hot key's backlog costs the sidecar a few bytes an entry
//! and the reads run on past it for the other keys.
//!
//! A stream's `retry_after` waits uncounted: its next delivery is counted in Redis only once it
//! is due ([`Lanes::count_due`], answered by [`Lanes::counted`]), so that a sidecar that stops
//! before then leaves the entry counted as often as it was delivered, and whoever reads it
//! after the due time counts that delivery once.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque, hash_map};
use std::time::{Duration, Instant};

use super::backoff::backoff;
use super::types::{FetchId, FlushId, Item};
use crate::domain::Key;
use crate::window::SlotId;

/// Why a lane holds its next entry back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Busy {
    Free,
    /// Its delivery is out, or settled and waiting for its read's flush.
    Out,
    /// The flush that settles its delivery is under way.
    Flushing,
    /// A flush of it failed while reader request `n` was the last asked: wait until a re-read
    /// asked after it has returned what that flush may not have settled.
    Reread(u64),
}

/// An entry waiting in its lane.
#[derive(Clone, Debug)]
pub(super) struct Waiting<E> {
    pub(super) entry: E,
    /// Retried in place: the client had it before.
    pub(super) seen: bool,
    /// A retry_after in place: not handed out before then.
    pub(super) not_before: Option<Instant>,
    pub(super) counting: Counting,
}

impl<E> Waiting<E> {
    /// Whether it may go out now: counted, and due.
    fn ready(&self, now: Instant) -> bool {
        self.counting == Counting::Counted && self.not_before.is_none_or(|at| at <= now)
    }
}

/// Whether Redis has counted a waiting entry's next delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Counting {
    /// Counted (a read counted it, or the flush that kept it in place did): it goes out as is.
    Counted,
    /// A stream's `retry_after`: counted once due, handed out after.
    Due,
    /// Its count is under way.
    Asked,
}

#[derive(Debug)]
struct Lane<E: Item> {
    busy: Busy,
    queue: VecDeque<Waiting<E>>,
    /// While waiting for a re-read: the entry the failed flush settled, the key's oldest. A
    /// re-read may also return a later entry that a read whose reply was lost took: that one
    /// queues behind the waiting ones.
    unsettled: Option<E::Id>,
    /// The slot of its delivery out.
    out_slot: Option<SlotId>,
    /// Entries parked past a fetch's worth waiting, oldest first, all after those in `queue`;
    /// the first `fetching` of them are being fetched (by one fetch at most).
    parked: VecDeque<E::Parked>,
    fetching: usize,
}

impl<E: Item> Lane<E> {
    fn new() -> Self {
        Self {
            busy: Busy::Free,
            queue: VecDeque::new(),
            unsettled: None,
            out_slot: None,
            parked: VecDeque::new(),
            fetching: 0,
        }
    }

    /// An entry read (or fetched) waits behind those of its key already waiting.
    fn wait(&mut self, entry: E) {
        self.queue.push_back(Waiting {
            entry,
            seen: false,
            not_before: None,
            counting: Counting::Counted,
        });
    }

    /// Whether a later entry of its key waits, in memory or parked.
    fn waits(&self) -> bool {
        !self.queue.is_empty() || !self.parked.is_empty()
    }

    /// Whether the lane is needed still: something of its key is out, in flush or waiting.
    fn holds(&self) -> bool {
        self.busy != Busy::Free || self.waits()
    }
}

/// Parking on an ordered stream: a key's entries past `batch` waiting in memory are parked; a
/// lane fetches `batch` at a time once fewer than `batch` of its entries wait in memory, while
/// fewer than `bound` entries of all keys do.
#[derive(Clone, Copy, Debug)]
pub(super) struct Parking {
    pub(super) bound: usize,
    pub(super) batch: usize,
    /// The most entries parked at once: reads stop there.
    pub(super) max_parked: usize,
}

/// What [`Lanes::admit`] made of a read.
pub(super) struct Admitted<E> {
    /// To hand out now.
    pub(super) out: Vec<E>,
    /// The slots out that a later entry of their key now waits behind.
    pub(super) behind: Vec<SlotId>,
    /// How many of the read's entries were free to go (no key, or a free key), room or not.
    pub(super) free: usize,
}

/// A fetch of parked entries under way: how many it asked of each lane, in order.
type Fetch = Vec<(Key, usize)>;

/// A count of due entries under way: each entry's key (`None`: a kept retry) and id, in order.
type Count<Id> = Vec<(Option<Key>, Id)>;

/// Every lane of one subscription.
#[derive(Debug)]
pub(super) struct Lanes<E: Item> {
    /// Keyed entries wait in lanes (an ordered subscription).
    keyed: bool,
    /// A `retry_after` kept in place waits uncounted until due (a stream; a list's keep counts
    /// its next delivery at once).
    count_when_due: bool,
    lanes: HashMap<Key, Lane<E>>,
    /// Entries without a key that a read brought past the room the window had for them
    /// (see [`Lanes::admit`]): handed out first as room frees.
    loose: VecDeque<E>,
    /// Retries kept in place that wait for no key (no ordering key, or an unordered
    /// subscription), by when they are due and then in the order they came: each goes out
    /// once due, before the loose entries and the lanes.
    kept: BTreeMap<(Instant, u64), Waiting<E>>,
    kept_seq: u64,
    /// When the first kept retry not yet due falls due, as of the last release.
    kept_wake: Option<Instant>,
    /// The keys whose lanes have entries waiting in memory, and how many lanes wait for a
    /// re-read: what is asked on every engine event looks at these, never at every key in
    /// flight (a hot key's run has hundreds).
    queued: HashSet<Key>,
    rereads: usize,
    /// Keys settled by each flush under way, with the entry settled.
    by_flush: HashMap<FlushId, Vec<(Key, E::Id)>>,
    /// Entries waiting in lanes.
    waiting: usize,
    /// How often waiting entries are made idle again, so that no other consumer reclaims
    /// them (a stream's pending entries); `None` where the consumer's lease keeps them.
    extend_every: Option<Duration>,
    /// When the waiting entries are next made idle again, while any wait.
    extend_at: Option<Instant>,
    parking: Option<Parking>,
    /// Entries parked, those being fetched among them.
    parked: usize,
    /// The keys whose lanes hold parked entries: a fetch looks at these lanes only, so a
    /// hot key's backlog costs no walk over every key in flight.
    parked_keys: HashSet<Key>,
    /// Entries asked by the fetches under way.
    fetching: usize,
    fetches: HashMap<FetchId, Fetch>,
    next_fetch: FetchId,
    /// Fetches that failed in a row, and when the next may go.
    fetch_failures: u32,
    fetch_at: Option<Instant>,
    /// Entries waiting uncounted with no count asked ([`Counting::Due`]).
    uncounted: usize,
    counts: HashMap<FetchId, Count<E::Id>>,
    /// Counts that failed in a row.
    count_failures: u32,
    /// When the engine last looked: what was due by then is handled by events (room, a key
    /// freed), not by a wake-up.
    looked: Option<Instant>,
}

impl<E: Item> Lanes<E> {
    pub(super) fn new(
        (keyed, count_when_due): (bool, bool),
        extend_every: Option<Duration>,
        parking: Option<Parking>,
    ) -> Self {
        Self {
            keyed,
            count_when_due,
            lanes: HashMap::new(),
            loose: VecDeque::new(),
            kept: BTreeMap::new(),
            kept_seq: 0,
            kept_wake: None,
            queued: HashSet::new(),
            rereads: 0,
            by_flush: HashMap::new(),
            waiting: 0,
            extend_every,
            extend_at: None,
            parking,
            parked: 0,
            parked_keys: HashSet::new(),
            fetching: 0,
            fetches: HashMap::new(),
            next_fetch: 1,
            fetch_failures: 0,
            fetch_at: None,
            uncounted: 0,
            counts: HashMap::new(),
            count_failures: 0,
            looked: None,
        }
    }

    /// Entries waiting for their key in memory.
    pub(super) fn waiting(&self) -> usize {
        self.waiting
    }

    /// Entries waiting for their key parked as ids.
    pub(super) fn parked(&self) -> usize {
        self.parked
    }

    pub(super) fn parking(&self) -> Option<Parking> {
        self.parking
    }

    /// Whether a key waits for a re-read to come back (which takes reads, whatever waits).
    pub(super) fn rereading(&self) -> bool {
        self.rereads > 0
    }

    /// The ids of the entries waiting, parked or not, in no particular order.
    pub(super) fn waiting_ids(&self) -> impl Iterator<Item = E::Id> + '_ {
        let kept = self.kept.values().map(|w| &w.entry);
        let loose = self.loose.iter().chain(kept).map(Item::id);
        loose.chain(self.lanes.values().flat_map(|lane| {
            let parked = lane.parked.iter().map(|p| E::stub(p).id());
            lane.queue.iter().map(|w| w.entry.id()).chain(parked)
        }))
    }

    /// The entries waiting, the parked ones as stubs, each key's in order.
    fn waiting_entries(&self) -> Vec<E> {
        let mut entries = Vec::with_capacity(self.waiting + self.parked);
        entries.extend(self.kept.values().map(|w| w.entry.clone()));
        entries.extend(self.loose.iter().cloned());
        for lane in self.lanes.values() {
            entries.extend(lane.queue.iter().map(|w| w.entry.clone()));
            entries.extend(lane.parked.iter().map(E::stub));
        }
        entries
    }

    /// Splits a read into the entries to hand out now and those that wait for their key, and
    /// names the slots out that something now waits behind. `walk`: the read is a page of a
    /// re-read of this consumer's own entries that began with reader request `walk`; its
    /// entries of a key whose failed flush came before are that key's oldest.
    ///
    /// At most `room` go out: a read that asked for more than the window had room for (to make
    /// up for the entries its busy keys hold back) leaves the rest waiting, each key's in its
    /// free lane, those without a key in the loose queue, handed out as room frees.
    pub(super) fn admit(
        &mut self,
        entries: Vec<E>,
        walk: Option<u64>,
        room: usize,
        now: Instant,
    ) -> Admitted<E> {
        let mut out = Vec::with_capacity(entries.len().min(room));
        let mut behind = Vec::new();
        let mut free_entries = 0;
        for entry in entries {
            let Some(key) = entry.ordering_key() else {
                free_entries += 1;
                if out.len() < room {
                    out.push(entry);
                } else {
                    self.loose.push_back(entry);
                    self.waiting += 1;
                }
                continue;
            };
            let lane = self.lanes.entry(key.clone()).or_insert_with(Lane::new);
            let free = lane.busy == Busy::Free && !lane.waits();
            let reread = matches!((lane.busy, walk), (Busy::Reread(failed), Some(walk)) if failed < walk)
                && lane.unsettled.as_ref().is_none_or(|id| *id == entry.id());
            if free || reread {
                free_entries += 1;
            }
            if (free || reread) && out.len() < room {
                if reread {
                    self.rereads -= 1;
                }
                lane.busy = Busy::Out;
                lane.unsettled = None;
                out.push(entry);
                continue;
            }
            if !free && lane.busy == Busy::Out && !lane.waits() {
                behind.extend(lane.out_slot);
            }
            // A free key's entry past the room waits in memory: it goes out as soon as there
            // is room. Only a hot key parks: a busy key's entry parks once its key has a
            // fetch's worth waiting in memory. Where many keys are busy with an entry or two
            // waiting each, parking them would cost a fetch, a round trip, for nearly every
            // entry; in memory each goes out as its key frees, and the reads stop at the
            // waiting bound (see `room`), passed at most by the reads under way when it filled.
            let park = !free
                && self
                    .parking
                    .is_some_and(|p| !lane.parked.is_empty() || lane.queue.len() >= p.batch);
            if park {
                if lane.parked.is_empty() {
                    self.parked_keys.insert(key.clone());
                }
                lane.parked.push_back(entry.park());
                self.parked += 1;
            } else {
                if !self.queued.contains(key) {
                    self.queued.insert(key.clone());
                }
                lane.wait(entry);
                self.waiting += 1;
            }
        }
        self.extend_soon(now);
        Admitted {
            out,
            behind,
            free: free_entries,
        }
    }

    /// The entries of a read handed out from `first_slot` on: their lanes know their slots.
    pub(super) fn handed_out(&mut self, entries: &[E], first_slot: SlotId) {
        for (i, entry) in entries.iter().enumerate() {
            if let Some(lane) = entry.ordering_key().and_then(|k| self.lanes.get_mut(k)) {
                lane.out_slot = Some(first_slot + i as u64);
            }
        }
    }

    /// Whether a later entry of `entry`'s key waits.
    pub(super) fn waits_behind(&self, entry: &E) -> bool {
        entry
            .ordering_key()
            .and_then(|k| self.lanes.get(k))
            .is_some_and(Lane::waits)
    }

    /// A flush settles these keys' deliveries: each stays busy until it is reported.
    pub(super) fn flushing(&mut self, flush: FlushId, keys: Vec<(Key, E::Id)>) {
        for (key, _) in &keys {
            if let Some(lane) = self.lanes.get_mut(key) {
                lane.busy = Busy::Flushing;
            }
        }
        if !keys.is_empty() {
            self.by_flush.insert(flush, keys);
        }
    }

    /// A flush was reported: its keys are free again (`ok`), or wait for the re-read, as do the
    /// keys of its retries Redis refused to keep (`not_kept`). Its retries kept in place go to
    /// the front of their lanes, due at `not_before`.
    pub(super) fn flushed(
        &mut self,
        flush: FlushId,
        (ok, not_kept): (bool, &[E::Id]),
        in_place: Vec<(E, Option<Instant>)>,
        (now, asked): (Instant, u64),
    ) {
        for (key, id) in self.by_flush.remove(&flush).unwrap_or_default() {
            // A retry Redis refused to keep in place is pending unkept: its key waits for the
            // re-read that brings it back, as after a failed flush.
            let ok = ok && !not_kept.contains(&id);
            // One lookup for the lane and its removal: on a stream of many keys every
            // delivery's lane ends here.
            if let hash_map::Entry::Occupied(mut found) = self.lanes.entry(key) {
                let lane = found.get_mut();
                if matches!(lane.busy, Busy::Reread(_)) {
                    self.rereads -= 1;
                }
                if !ok {
                    self.rereads += 1;
                }
                lane.busy = if ok { Busy::Free } else { Busy::Reread(asked) };
                lane.unsettled = (!ok).then_some(id);
                if !lane.holds() {
                    found.remove();
                }
            }
        }
        if !ok {
            // Still pending in Redis, counted or not: the re-read brings them back.
            return;
        }
        for (entry, not_before) in in_place {
            match not_before {
                // Kept uncounted: counted once due.
                Some(due) if self.count_when_due => self.hold(entry, due, false, now),
                // The flush counted its next delivery.
                _ => self.hold(entry.redelivered(), not_before.unwrap_or(now), true, now),
            }
        }
        self.extend_soon(now);
    }

    /// Holds an entry this consumer keeps pending until `due`: a retry kept in place, or an
    /// entry a re-read or reclaim returned before its `retry_after` is due. A keyed entry
    /// goes to the front of its lane; the others to the kept retries. `counted`: Redis has
    /// counted its next delivery; else it is counted once due, before it goes out.
    pub(super) fn hold(&mut self, entry: E, due: Instant, counted: bool, now: Instant) {
        let not_before = (due > now || !counted).then_some(due);
        let counting = if counted {
            Counting::Counted
        } else {
            self.uncounted += 1;
            Counting::Due
        };
        let waiting = Waiting {
            entry,
            seen: true,
            not_before,
            counting,
        };
        match waiting.entry.ordering_key().cloned() {
            Some(key) if self.keyed => {
                let lane = self.lanes.entry(key.clone()).or_insert_with(Lane::new);
                lane.queue.push_front(waiting);
                self.queued.insert(key);
            }
            _ => {
                self.kept_seq += 1;
                self.kept.insert((due, self.kept_seq), waiting);
                if not_before.is_some() && self.kept_wake.is_none_or(|at| at > due) {
                    self.kept_wake = Some(due);
                }
            }
        }
        self.waiting += 1;
        self.extend_soon(now);
    }

    /// Something waits: make sure its extension is planned.
    fn extend_soon(&mut self, now: Instant) {
        if self.waiting + self.parked > 0 && self.extend_at.is_none() {
            self.extend_at = self.extend_every.map(|every| now + every);
        }
    }

    /// The re-read that began with reader request `walk` is over: what a flush that failed
    /// before it left pending has come back, so the keys waiting for it are free.
    pub(super) fn reread_done(&mut self, walk: u64) {
        if self.rereads == 0 {
            return;
        }
        let rereads = &mut self.rereads;
        self.lanes.retain(|_, lane| {
            if matches!(lane.busy, Busy::Reread(failed) if failed < walk) {
                *rereads -= 1;
                lane.busy = Busy::Free;
                lane.unsettled = None;
            }
            lane.holds()
        });
    }

    /// Up to `room` entries whose keys are free and whose time has come, taken from their
    /// lanes (now busy), with whether each was seen before.
    pub(super) fn release(&mut self, room: usize, now: Instant) -> Vec<(E, bool)> {
        let mut out = Vec::new();
        if self.waiting == 0 || room == 0 {
            return out;
        }
        let ready: Vec<(Instant, u64)> = self
            .kept
            .iter()
            .take_while(|(at, _)| at.0 <= now)
            .filter(|(_, waiting)| waiting.ready(now))
            .map(|(at, _)| *at)
            .take(room)
            .collect();
        for at in ready {
            out.push((
                self.kept.remove(&at).expect("a ready kept retry").entry,
                true,
            ));
        }
        self.kept_wake = self.kept_wake(now);
        while out.len() < room {
            let Some(entry) = self.loose.pop_front() else {
                break;
            };
            out.push((entry, false));
        }
        let mut emptied = Vec::new();
        for key in &self.queued {
            if out.len() >= room {
                break;
            }
            let lane = self
                .lanes
                .get_mut(key)
                .expect("a key with a queue has a lane");
            if lane.busy == Busy::Free && lane.queue.front().is_some_and(|w| w.ready(now)) {
                let next = lane.queue.pop_front().expect("a front");
                out.push((next.entry, next.seen));
                lane.busy = Busy::Out;
                if lane.queue.is_empty() {
                    emptied.push(key.clone());
                }
            }
        }
        for key in emptied {
            self.queued.remove(&key);
        }
        self.waiting -= out.len();
        if self.waiting + self.parked == 0 {
            self.extend_at = None;
        }
        out
    }

    /// The parked entries to fetch now, if any: the next of each lane running short of entries
    /// in memory, while the waiting bound has room for them. Returns the fetch and its
    /// entries, lane by lane, each lane's in order.
    pub(super) fn fetch(&mut self, now: Instant) -> Option<(FetchId, Vec<E::Parked>)> {
        let parking = self.parking?;
        if self.parked == 0 || self.fetch_at.is_some_and(|at| at > now) {
            return None;
        }
        self.fetch_at = None;
        let mut room = parking.bound.saturating_sub(self.waiting + self.fetching);
        let mut asked = Vec::new();
        let mut parked = Vec::new();
        for key in &self.parked_keys {
            if room == 0 {
                break;
            }
            let lane = self
                .lanes
                .get_mut(key)
                .expect("a key with parked entries has a lane");
            // One fetch per lane at a time: its answer goes in front of what is parked after.
            let short = lane.fetching == 0 && lane.queue.len() < parking.batch;
            let n = lane.parked.len().min(parking.batch).min(room);
            if !short || n == 0 {
                continue;
            }
            parked.extend(lane.parked.range(..n).cloned());
            lane.fetching = n;
            room -= n;
            asked.push((key.clone(), n));
        }
        self.fetching += parked.len();
        if asked.is_empty() {
            return None;
        }
        let fetch = self.next_fetch;
        self.next_fetch += 1;
        self.fetches.insert(fetch, asked);
        Some((fetch, parked))
    }

    /// A fetch came back: for each entry asked, in order, the entry, or `None` where it is
    /// gone from the stream (settled by the fetch). `None` for the whole: it failed, and the
    /// lanes fetch again after a backoff.
    pub(super) fn fetched(&mut self, fetch: FetchId, found: Option<Vec<Option<E>>>, now: Instant) {
        let Some(asked) = self.fetches.remove(&fetch) else {
            // Asked before the lanes were emptied (the subscription is closing): what it
            // fetched was given back with them.
            return;
        };
        self.fetching -= asked.iter().map(|(_, n)| n).sum::<usize>();
        let Some(found) = found else {
            self.fetch_failures += 1;
            self.fetch_at = Some(now + backoff(self.fetch_failures));
            for (key, _) in asked {
                if let Some(lane) = self.lanes.get_mut(&key) {
                    lane.fetching = 0;
                }
            }
            return;
        };
        self.fetch_failures = 0;
        let mut found = found.into_iter();
        for (key, n) in asked {
            let lane = self.lanes.get_mut(&key).expect("a lane fetching is kept");
            lane.parked.drain(..n);
            lane.fetching = 0;
            self.parked -= n;
            if lane.parked.is_empty() {
                self.parked_keys.remove(&key);
            }
            for entry in found.by_ref().take(n).flatten() {
                lane.wait(entry);
                self.waiting += 1;
            }
            if !lane.queue.is_empty() {
                self.queued.insert(key.clone());
            }
            if !lane.holds() {
                self.lanes.remove(&key);
            }
        }
        if self.waiting + self.parked == 0 {
            self.extend_at = None;
        }
    }

    /// When a failed fetch may be tried again, while entries stay parked.
    pub(super) fn fetch_due(&self) -> Option<Instant> {
        self.fetch_at.filter(|_| self.parked > 0)
    }

    /// Whether a retry kept without a key is due and waits for room.
    pub(super) fn kept_due(&self, now: Instant) -> bool {
        self.kept
            .iter()
            .take_while(|(at, _)| at.0 <= now)
            .any(|(_, waiting)| waiting.ready(now))
    }

    /// When the next kept retry falls due or may ask for its count again: the first not yet
    /// due, or one due whose count failed (the map keeps it where it was due first).
    fn kept_wake(&self, now: Instant) -> Option<Instant> {
        let mut wake = None;
        for ((due, _), waiting) in &self.kept {
            let at = if *due > now {
                Some(*due)
            } else {
                waiting
                    .not_before
                    .filter(|at| *at > now && waiting.counting != Counting::Asked)
            };
            wake = wake.into_iter().chain(at).min();
            if *due > now {
                break;
            }
        }
        wake
    }

    /// The entries waiting uncounted whose due time has come, to count now (a keyed one once
    /// its lane is free, as it would go out), if any: they wait on until [`Lanes::counted`].
    pub(super) fn count_due(&mut self, now: Instant) -> Option<(FetchId, Vec<E>)> {
        if self.uncounted == 0 {
            return None;
        }
        let due =
            |w: &Waiting<E>| w.counting == Counting::Due && w.not_before.is_none_or(|at| at <= now);
        let mut asked = Vec::new();
        let mut entries = Vec::new();
        for ((at, _), waiting) in self.kept.iter_mut() {
            if *at > now {
                break;
            }
            if due(waiting) {
                waiting.counting = Counting::Asked;
                asked.push((None, waiting.entry.id()));
                entries.push(waiting.entry.clone());
            }
        }
        for key in &self.queued {
            let lane = self
                .lanes
                .get_mut(key)
                .expect("a key with a queue has a lane");
            if lane.busy != Busy::Free {
                continue;
            }
            if let Some(waiting) = lane.queue.front_mut().filter(|w| due(w)) {
                waiting.counting = Counting::Asked;
                asked.push((Some(key.clone()), waiting.entry.id()));
                entries.push(waiting.entry.clone());
            }
        }
        if entries.is_empty() {
            return None;
        }
        self.uncounted -= entries.len();
        let count = self.next_fetch;
        self.next_fetch += 1;
        self.counts.insert(count, asked);
        Some((count, entries))
    }

    /// A count came back: for each entry asked, in order, the entry as its next delivery (its
    /// count as Redis now has it), or `None` where it is no longer this consumer's (settled,
    /// or claimed by another consumer): forgotten here. `None` for the whole: it failed, and
    /// those entries ask again after a backoff. Returns the counted entries past `max_deliveries`
    /// (0: no cap), taken out, for the dead letter.
    pub(super) fn counted(
        &mut self,
        count: FetchId,
        found: Option<Vec<Option<E>>>,
        max_deliveries: u32,
        now: Instant,
    ) -> Vec<E> {
        let Some(asked) = self.counts.remove(&count) else {
            // Asked before the lanes were emptied (the subscription is closing): what it
            // counted was given back with them.
            return Vec::new();
        };
        let retry_at = found.is_none().then(|| {
            self.count_failures += 1;
            now + backoff(self.count_failures)
        });
        if found.is_some() {
            self.count_failures = 0;
        }
        let mut found = found.map(Vec::into_iter);
        let mut past_cap = Vec::new();
        for (key, id) in asked {
            let answer = found.as_mut().map(|f| f.next().flatten());
            let Some(waiting) = self.waiting_mut(key.as_ref(), &id) else {
                continue;
            };
            match answer {
                None => {
                    waiting.counting = Counting::Due;
                    waiting.not_before = retry_at;
                    self.uncounted += 1;
                }
                Some(Some(entry)) if !super::counts::past_the_cap(&entry, max_deliveries) => {
                    waiting.entry = entry;
                    waiting.counting = Counting::Counted;
                    waiting.not_before = None;
                }
                Some(entry) => {
                    self.forget(key.as_ref(), &id);
                    past_cap.extend(entry);
                }
            }
        }
        self.kept_wake = self.kept_wake(now);
        past_cap
    }

    /// The waiting entry `id`, in its lane or among the kept retries.
    fn waiting_mut(&mut self, key: Option<&Key>, id: &E::Id) -> Option<&mut Waiting<E>> {
        match key {
            Some(key) => self
                .lanes
                .get_mut(key)?
                .queue
                .iter_mut()
                .find(|w| w.entry.id() == *id),
            None => self.kept.values_mut().find(|w| w.entry.id() == *id),
        }
    }

    /// Takes the waiting entry `id` out, with its lane if nothing else holds that.
    fn forget(&mut self, key: Option<&Key>, id: &E::Id) {
        match key {
            Some(key) => {
                let Some(lane) = self.lanes.get_mut(key) else {
                    return;
                };
                let Some(at) = lane.queue.iter().position(|w| w.entry.id() == *id) else {
                    return;
                };
                lane.queue.remove(at);
                if lane.queue.is_empty() {
                    self.queued.remove(key);
                }
                if !lane.holds() {
                    self.lanes.remove(key);
                }
            }
            None => {
                let Some(at) = self.kept.iter().find(|(_, w)| w.entry.id() == *id) else {
                    return;
                };
                let at = *at.0;
                self.kept.remove(&at);
            }
        }
        self.waiting -= 1;
    }

    /// The engine looks at the lanes at `now`.
    pub(super) fn look(&mut self, now: Instant) {
        self.looked = Some(now);
    }

    /// When a waiting retry falls due (or may ask for its count again), if one waits on a
    /// free lane, after the engine last looked: one due by then waits for room or for its
    /// count, and a wake-up would find nothing to do.
    pub(super) fn next_due(&self) -> Option<Instant> {
        self.queued
            .iter()
            .filter_map(|key| self.lanes.get(key))
            .filter(|lane| lane.busy == Busy::Free)
            .filter_map(|lane| lane.queue.front())
            .filter(|w| w.counting != Counting::Asked)
            .filter_map(|w| w.not_before)
            .chain(self.kept_wake)
            .filter(|at| self.looked.is_none_or(|looked| *at > looked))
            .min()
    }

    /// When the waiting entries are next to be made idle again.
    pub(super) fn extend_due(&self) -> Option<Instant> {
        self.extend_at
    }

    /// The waiting entries to make idle again now, if that is due.
    pub(super) fn extend(&mut self, now: Instant) -> Option<Vec<E>> {
        let every = self.extend_every?;
        if self.extend_at.is_none_or(|at| at > now) {
            return None;
        }
        self.extend_at = Some(now + every);
        Some(self.waiting_entries())
    }

    /// Takes every waiting entry out of its lane, each key's in order (a retry kept in place
    /// first, the parked ones last, as stubs), to be given back as if never read: a counted
    /// retry kept in place counted its next delivery when its flush ran (or when it fell due),
    /// and that delivery will not happen here. Lanes keep only what is out, in flush or
    /// waiting for a re-read; fetches and counts under way are forgotten. With `split` (a
    /// stream), returns apart the retries still uncounted (a `retry_after` not yet counted),
    /// whose count is left as it is: whoever reads them next counts that delivery.
    pub(super) fn take_waiting(&mut self, split: bool) -> (Vec<E>, Vec<E>) {
        let mut delayed = Vec::new();
        let mut rest = Vec::with_capacity(self.waiting + self.parked);
        for waiting in std::mem::take(&mut self.kept).into_values() {
            if split && waiting.counting != Counting::Counted {
                delayed.push(waiting.entry);
            } else {
                rest.push(waiting.entry);
            }
        }
        rest.extend(self.loose.drain(..));
        for lane in self.lanes.values_mut() {
            for waiting in lane.queue.drain(..) {
                if split && waiting.counting != Counting::Counted {
                    delayed.push(waiting.entry);
                } else {
                    rest.push(waiting.entry);
                }
            }
            rest.extend(lane.parked.drain(..).map(|p| E::stub(&p)));
        }
        self.kept_wake = None;
        self.lanes.retain(|_, lane| {
            lane.fetching = 0;
            lane.busy != Busy::Free
        });
        self.fetches.clear();
        self.fetching = 0;
        self.parked_keys.clear();
        self.queued.clear();
        self.waiting = 0;
        self.parked = 0;
        self.extend_at = None;
        self.uncounted = 0;
        self.counts.clear();
        (rest, delayed)
    }

    /// The counts and key sets kept beside the lanes agree with the lanes.
    #[cfg(test)]
    pub(super) fn check_books(&self) {
        let keys_where = |has: fn(&Lane<E>) -> bool| -> HashSet<&Key> {
            self.lanes
                .iter()
                .filter(|(_, lane)| has(lane))
                .map(|(key, _)| key)
                .collect()
        };
        let queued = keys_where(|lane| !lane.queue.is_empty());
        assert_eq!(queued, self.queued.iter().collect(), "keys with a queue");
        let parked = keys_where(|lane| !lane.parked.is_empty());
        assert_eq!(parked, self.parked_keys.iter().collect(), "keys parked");
        let rereads = self
            .lanes
            .values()
            .filter(|lane| matches!(lane.busy, Busy::Reread(_)))
            .count();
        assert_eq!(rereads, self.rereads, "lanes waiting for a re-read");
        let fetching: usize = self.lanes.values().map(|lane| lane.fetching).sum();
        assert_eq!(fetching, self.fetching, "entries being fetched");
        let waiting: usize = self.loose.len()
            + self.kept.len()
            + self.lanes.values().map(|l| l.queue.len()).sum::<usize>();
        assert_eq!(waiting, self.waiting, "entries waiting in memory");
        let due = |w: &&Waiting<E>| w.counting == Counting::Due;
        let uncounted = self.kept.values().filter(due).count()
            + self
                .lanes
                .values()
                .map(|l| l.queue.iter().filter(due).count())
                .sum::<usize>();
        assert_eq!(uncounted, self.uncounted, "entries waiting uncounted");
    }
}
