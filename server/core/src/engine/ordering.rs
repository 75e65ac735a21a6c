//! Ordering keys: entries that share a key are handed out one at a time, in the order the
//! subscription read them, while entries of other keys flow beside them.
//!
//! Each key with something in flight has a lane. A lane is busy while its delivery is out,
//! while the flush that settles it runs, and, after a flush that failed or whose outcome is
//! unknown, until the re-read of this consumer's own entries has brought back what that flush
//! may not have settled. Entries of a busy key wait in its lane, oldest first; a retry is kept
//! in place at the front of its lane (delivered again before any later entry of its key), not
//! copied to the end of the stream. When a lane frees, its first entry is handed out, once
//! due. Entries without a key take no lane.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{FlushId, Item};
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
}

impl<E: Item> Lane<E> {
    fn new() -> Self {
        Self {
            busy: Busy::Free,
            queue: VecDeque::new(),
            unsettled: None,
            out_slot: None,
        }
    }
}

/// Every lane of one subscription.
#[derive(Debug)]
pub(super) struct Lanes<E: Item> {
    lanes: HashMap<Bytes, Lane<E>>,
    /// Keys settled by each flush under way, with the entry settled.
    by_flush: HashMap<FlushId, Vec<(Bytes, E::Id)>>,
    /// Entries waiting in lanes.
    waiting: usize,
    /// How often waiting entries are made idle again, so that no other consumer reclaims
    /// them (a stream's pending entries); `None` where the consumer's lease keeps them.
    extend_every: Option<Duration>,
    /// When the waiting entries are next made idle again, while any wait.
    extend_at: Option<Instant>,
}

impl<E: Item> Lanes<E> {
    pub(super) fn new(extend_every: Option<Duration>) -> Self {
        Self {
            lanes: HashMap::new(),
            by_flush: HashMap::new(),
            waiting: 0,
            extend_every,
            extend_at: None,
        }
    }

    /// Entries waiting for their key.
    pub(super) fn waiting(&self) -> usize {
        self.waiting
    }

    /// Whether a key waits for a re-read to come back (which takes reads, whatever waits).
    pub(super) fn rereading(&self) -> bool {
        self.lanes
            .values()
            .any(|lane| matches!(lane.busy, Busy::Reread(_)))
    }

    /// The entries waiting, in no particular order.
    pub(super) fn waiting_entries(&self) -> impl Iterator<Item = &E> {
        self.lanes
            .values()
            .flat_map(|lane| lane.queue.iter().map(|w| &w.entry))
    }

    /// Splits a read into the entries to hand out now and those that wait for their key, and
    /// names the slots out that something now waits behind. `walk`: the read is a page of a
    /// re-read of this consumer's own entries that began with reader request `walk`; its
    /// entries of a key whose failed flush came before are that key's oldest.
    pub(super) fn admit(
        &mut self,
        entries: Vec<E>,
        walk: Option<u64>,
        now: Instant,
    ) -> (Vec<E>, Vec<SlotId>) {
        let mut out = Vec::with_capacity(entries.len());
        let mut behind = Vec::new();
        for entry in entries {
            let Some(key) = entry.ordering_key() else {
                out.push(entry);
                continue;
            };
            let lane = self.lanes.entry(key).or_insert_with(Lane::new);
            let free = lane.busy == Busy::Free && lane.queue.is_empty();
            let reread = matches!((lane.busy, walk), (Busy::Reread(failed), Some(walk)) if failed < walk)
                && lane.unsettled.as_ref().is_none_or(|id| *id == entry.id());
            if free || reread {
                lane.busy = Busy::Out;
                lane.unsettled = None;
                out.push(entry);
            } else {
                if lane.busy == Busy::Out && lane.queue.is_empty() {
                    behind.extend(lane.out_slot);
                }
                lane.queue.push_back(Waiting {
                    entry,
                    seen: false,
                    not_before: None,
                });
                self.waiting += 1;
            }
        }
        if self.waiting > 0 && self.extend_at.is_none() {
            self.extend_at = self.extend_every.map(|every| now + every);
        }
        (out, behind)
    }

    /// The entries of a read handed out from `first_slot` on: their lanes know their slots.
    pub(super) fn handed_out(&mut self, entries: &[E], first_slot: SlotId) {
        for (i, entry) in entries.iter().enumerate() {
            if let Some(lane) = entry.ordering_key().and_then(|k| self.lanes.get_mut(&k)) {
                lane.out_slot = Some(first_slot + i as u64);
            }
        }
    }

    /// Whether a later entry of `entry`'s key waits.
    pub(super) fn waits_behind(&self, entry: &E) -> bool {
        entry
            .ordering_key()
            .and_then(|k| self.lanes.get(&k))
            .is_some_and(|lane| !lane.queue.is_empty())
    }

    /// A flush settles these keys' deliveries: each stays busy until it is reported.
    pub(super) fn flushing(&mut self, flush: FlushId, keys: Vec<(Bytes, E::Id)>) {
        for (key, _) in &keys {
            if let Some(lane) = self.lanes.get_mut(key) {
                lane.busy = Busy::Flushing;
            }
        }
        if !keys.is_empty() {
            self.by_flush.insert(flush, keys);
        }
    }

    /// A flush was reported: its keys are free again (`ok`), or wait for the re-read. Its
    /// retries kept in place go to the front of their lanes, due at `not_before`.
    pub(super) fn flushed(
        &mut self,
        flush: FlushId,
        ok: bool,
        in_place: Vec<(E, Option<Instant>)>,
        (now, asked): (Instant, u64),
    ) {
        for (key, id) in self.by_flush.remove(&flush).unwrap_or_default() {
            if let Some(lane) = self.lanes.get_mut(&key) {
                lane.busy = if ok { Busy::Free } else { Busy::Reread(asked) };
                lane.unsettled = (!ok).then_some(id);
                if lane.busy == Busy::Free && lane.queue.is_empty() {
                    self.lanes.remove(&key);
                }
            }
        }
        if !ok {
            // Still pending in Redis, counted or not: the re-read brings them back.
            return;
        }
        for (entry, not_before) in in_place {
            let Some(key) = entry.ordering_key() else {
                continue;
            };
            let lane = self.lanes.entry(key).or_insert_with(Lane::new);
            lane.queue.push_front(Waiting {
                entry: entry.redelivered(),
                seen: true,
                not_before,
            });
            self.waiting += 1;
        }
        if self.waiting > 0 && self.extend_at.is_none() {
            self.extend_at = self.extend_every.map(|every| now + every);
        }
    }

    /// The re-read that began with reader request `walk` is over: what a flush that failed
    /// before it left pending has come back, so the keys waiting for it are free.
    pub(super) fn reread_done(&mut self, walk: u64) {
        self.lanes.retain(|_, lane| {
            if matches!(lane.busy, Busy::Reread(failed) if failed < walk) {
                lane.busy = Busy::Free;
                lane.unsettled = None;
            }
            lane.busy != Busy::Free || !lane.queue.is_empty()
        });
    }

    /// Up to `room` entries whose keys are free and whose time has come, taken from their
    /// lanes (now busy), with whether each was seen before.
    pub(super) fn release(&mut self, room: usize, now: Instant) -> Vec<(E, bool)> {
        let mut out = Vec::new();
        if self.waiting == 0 || room == 0 {
            return out;
        }
        self.lanes.retain(|_, lane| {
            if out.len() < room
                && lane.busy == Busy::Free
                && lane
                    .queue
                    .front()
                    .is_some_and(|w| w.not_before.is_none_or(|at| at <= now))
            {
                let next = lane.queue.pop_front().expect("a front");
                out.push((next.entry, next.seen));
                lane.busy = Busy::Out;
            }
            lane.busy != Busy::Free || !lane.queue.is_empty()
        });
        self.waiting -= out.len();
        if self.waiting == 0 {
            self.extend_at = None;
        }
        out
    }

    /// When a waiting retry falls due, if one waits on a free lane.
    pub(super) fn next_due(&self) -> Option<Instant> {
        self.lanes
            .values()
            .filter(|lane| lane.busy == Busy::Free)
            .filter_map(|lane| lane.queue.front()?.not_before)
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
        Some(self.waiting_entries().cloned().collect())
    }

    /// Takes every waiting entry out of its lane, each key's in order (a retry kept in place
    /// first), to be given back as if never read: a retry kept in place counted its next
    /// delivery when its flush ran, and that delivery will not happen here. Lanes keep only
    /// what is out, in flush or waiting for a re-read.
    pub(super) fn take_waiting(&mut self) -> Vec<E> {
        let mut taken = Vec::with_capacity(self.waiting);
        self.lanes.retain(|_, lane| {
            taken.extend(lane.queue.drain(..).map(|w| w.entry));
            lane.busy != Busy::Free
        });
        self.waiting = 0;
        self.extend_at = None;
        taken
    }
}
