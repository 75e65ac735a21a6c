//! Flow control: how much room the window has, when the reader reads and how many, when a
//! read rides on a flush or goes on the read lane instead, when this consumer's own entries
//! are read again, and the flushes under way that all of it depends on, each with the report
//! it will hand the client.

use std::time::{Duration, Instant};

use super::action::Action;
use super::counts;
use super::report::FlushReport;
use super::state::{Engine, Flushing, Phase, ReaderRead};
use super::types::{FlushId, Item, Kind, Lane};
use crate::window::{FlushBatch, Outcome, SlotId};

/// The reads an ordered stream keeps out at once on its read lane: Redis runs the next while
/// the sidecar takes the last apart. More went no faster (see Performance in development.md).
const READS_IN_ORDER: usize = 2;

impl<E: Item> Engine<E> {
    /// How many more deliveries the window may take.
    pub(super) fn room(&self) -> usize {
        // One read's worth of deliveries waiting for their flush is free, so the next read
        // overlaps the flush; beyond that they count, so a slow Redis backs up in Redis. Not
        // those of a flush with a read riding on it: that read counts in their stead.
        let riding: usize = self
            .ahead
            .keys()
            .filter_map(|flush| self.flushes.get(flush))
            .filter(|f| !f.reported)
            .map(|f| f.deliveries)
            .sum();
        let waiting = self
            .flushing_deliveries
            .saturating_sub(riding)
            .saturating_sub(self.config.count as usize);
        // Every delivery of a read not yet flushed is in flight, settled or not: what a crash
        // can lose on a simple list, and what the window holds in memory. Reads under way
        // count with their COUNT: what they hand out fits (a read that asks for more hands
        // out no more than the room it finds, the rest waits).
        let most = self.config.count;
        let reading = self.reader.map_or(0, |r| r.count.min(most) as usize)
            + self
                .ahead
                .values()
                .chain(self.lane_reads.values())
                .map(|&c| c.min(most) as usize)
                .sum::<usize>();
        let max = self.config.max_in_flight as usize;
        let room = max.saturating_sub(self.window.held() + waiting + reading);
        if self.config.ordered && !self.lanes.rereading() {
            // Entries waiting for their key have a bound of their own, the same size: a hot
            // key stops the reads once it fills it, not before, and never takes the room of
            // the deliveries out. Not while keys wait for a re-read, which only reads free:
            // the bound may be passed by those reads. On a stream that parks a hot key's
            // entries, the reads stop at the bound of parked ones, or when the keys that do
            // not park (each busy with few entries waiting) fill the bound in memory. Reads
            // under way count against the parked bound only: beside a hot key, whose part of
            // them parks, counting them in memory too would stop the reads for the others
            // while the hot key's own entries fill half the bound; what they bring past it
            // is bounded by them.
            let memory = self.lanes.waiting();
            let (waiting, bound, waiting_room) = match self.lanes.parking() {
                Some(parking) => {
                    let parked = self.lanes.parked();
                    let room = parking.max_parked.saturating_sub(parked + reading);
                    (
                        memory + parked,
                        max.min(parking.max_parked),
                        room.min(max.saturating_sub(memory)),
                    )
                }
                None => (memory, max, max.saturating_sub(memory + reading)),
            };
            if waiting > 0 && waiting_room < (self.config.count as usize).min(bound) {
                // A hot key frees its bound one entry at a time: a read per freed place would
                // cost a round trip each for no more pace. Wait for a whole read's worth.
                0
            } else {
                room.min(waiting_room)
            }
        } else {
            room
        }
    }

    /// Whether a read may start now at all, as far as the subscription goes.
    fn may_read(&self) -> bool {
        self.phase == Phase::Open && self.client_here && self.retry_read_at.is_none()
    }

    /// A re-read of this consumer's own entries can go now. A stream's re-read skips entries
    /// the window holds or flushes by id; it waits only until no flush of unknown outcome can
    /// still run (its transactions would race the entries' second delivery). A list's re-read
    /// cannot tell its values from outstanding ones: it waits for an empty window and no flush
    /// under way.
    fn reread_ready(&self) -> bool {
        match self.config.kind {
            Kind::Stream => !self.flushes.values().any(|f| f.unknown) && self.lost_reads.is_empty(),
            _ => self.flushes.is_empty() && self.window.held() == 0,
        }
    }

    /// Asks the reader for more when the window has room and no read is under way: while a
    /// read rides on a flush, the flush's reply brings the next entries, and a read of the
    /// reader's own would only cost a round trip of its own. An ordered stream under a backlog
    /// reads on its read lane instead, up to [`READS_IN_ORDER`] at once.
    pub(super) fn maybe_read(&mut self, now: Instant) {
        while self.read_once(now) {}
    }

    /// Asks for one read if one is due; whether it went on the read lane (another may follow).
    fn read_once(&mut self, now: Instant) -> bool {
        let room = self.room();
        if !self.may_read() || self.reader.is_some() || room == 0 {
            return false;
        }
        if self.reading_ahead() && !self.another_read_in_order(now) {
            return false;
        }
        let reread = self.reread_owed && self.reread_ready();
        if self.config.ordered && self.reread_owed && !reread {
            // A read past this consumer's own pending entries could hand out a key's later
            // entry before the earlier one the re-read brings back.
            return false;
        }
        if reread {
            self.reread_owed = false;
            if self.config.ordered && self.config.kind != Kind::Stream {
                // A list's re-read returns its whole processing list in the order it was
                // read, the waiting entries among it (a list cannot tell them apart from
                // the others): forgotten here, they come back in their place, each counted
                // once more than it was delivered (a count may run ahead, never behind).
                let _ = self.lanes.take_waiting(false);
            }
        }
        let (recover, block) = match &mut self.recovery {
            Some(recovery) => recovery.for_read(now, self.config.block),
            None => (false, self.config.block),
        };
        let count = room.min(self.config.count as usize) as u32;
        let count = if reread || recover {
            count
        } else {
            count + self.read_extra
        };
        if self.config.ordered && self.reads_ahead_now() && !reread && !recover {
            // The lane runs its reads in the order asked, so their entries come in the order
            // Redis handed them out. A read of the reader's own could pass them.
            let read = self.next_lane_read;
            self.next_lane_read += 1;
            self.lane_reads.insert(read, count);
            self.actions.push(Action::Read {
                count,
                lane: Lane::InOrder(read),
            });
            return true;
        }
        self.reader = Some(ReaderRead {
            count,
            fresh: !reread && !recover,
        });
        self.reader_asked += 1;
        if reread {
            self.reread_asked = self.reader_asked;
        }
        self.actions.push(Action::Read {
            count,
            lane: Lane::Reader {
                block,
                reread,
                recover,
            },
        });
        false
    }

    /// Reads of new entries under way ahead of the reader: riding on flushes, or on the read
    /// lane.
    pub(super) fn reading_ahead(&self) -> bool {
        !self.ahead.is_empty() || !self.lane_reads.is_empty()
    }

    /// Whether a read may go on the read lane beside the ones out there: only reads of new
    /// entries go there, never while this consumer's own entries wait to be read again or a
    /// recovery is due (the reader does those, alone).
    fn another_read_in_order(&self, now: Instant) -> bool {
        self.config.ordered
            && self.lane_reads.len() < READS_IN_ORDER
            && self.reads_ahead_now()
            && !self.reread_owed
            && !self.recovery.as_ref().is_some_and(|r| r.due(now))
    }

    /// Reads of new entries may go ahead of the reader (riding on flushes, or on an ordered
    /// stream's read lane): the form reads ahead, nothing waits for replicas, and the stream
    /// has a backlog (so no read need block).
    fn reads_ahead_now(&self) -> bool {
        self.config.kind.reads_ahead() && self.config.read_ahead && self.backlog
    }

    /// The read to send at the end of the flush about to go, when the window has room for it
    /// and the stream a backlog, and the reader has no work of its own (re-reading its
    /// entries, recovering). Every flush may carry one, beside other reads under way: under a
    /// backlog each read then costs one round trip, the flush's, however many reads the window
    /// holds. Call with the flush's deliveries already counted as flushing.
    pub(super) fn read_ahead(&mut self, now: Instant, flush: FlushId) -> Option<u32> {
        let recovery_due = self.recovery.as_ref().is_some_and(|r| r.due(now));
        let room = self.room();
        if !self.reads_ahead_now()
            || self.reread_owed
            || recovery_due
            || room == 0
            || !self.may_read()
            || self.reader.is_some_and(|r| !r.fresh)
            || self.config.ordered
        {
            // An ordered subscription admits entries in the order Redis handed them out: its
            // reads go on its read lane, which runs them in the order asked. A read riding on
            // a flush could pass them.
            return None;
        }
        let count = room.min(self.config.count as usize) as u32 + self.read_extra;
        self.ahead.insert(flush, count);
        Some(count)
    }

    /// Sizes the next reads of new entries after one of `read` entries of which `free` were
    /// free to go: on an ordered stream that parks, a hot key's entries take their share of
    /// every read and are parked, so a read of COUNT would hand out only the other keys'
    /// share. While the backlog lasts the next reads ask for enough that about COUNT go out,
    /// at most twice COUNT; once a read comes back short, for COUNT again (a blocking read of
    /// a quiet stream has no hot key's share to make up for). What goes out stays within the
    /// room the window has (see [`super::ordering::Lanes::admit`]).
    pub(super) fn size_reads(&mut self, read: usize, free: usize) {
        if !self.backlog {
            self.read_extra = 0;
            return;
        }
        if self.lanes.parking().is_none() || read == 0 {
            return;
        }
        let count = self.config.count as usize;
        let wanted = (count * read).div_ceil(free.max(1)).clamp(count, 2 * count);
        self.read_extra = (wanted - count) as u32;
    }

    /// A read's batch is complete: flush it, with a read-ahead when one is due.
    pub(super) fn flush(&mut self, now: Instant, batch: FlushBatch<E>) {
        let deliveries = batch.deliveries;
        let flush = self.next_flush;
        // Counted before deciding the read-ahead: its room must include this flush.
        self.flushing_deliveries += deliveries;
        let read_ahead = self.read_ahead(now, flush);
        self.flushing_deliveries -= deliveries;
        self.flush_batch(batch, read_ahead);
    }

    pub(super) fn flush_batch(&mut self, mut batch: FlushBatch<E>, read_ahead: Option<u32>) {
        if self.fenced {
            // Its entries stay pending, their outcomes unwritten (see `fence`).
            return;
        }
        let flush = self.next_flush;
        self.next_flush += 1;
        let ids = if self.config.kind.rereads_by_id() {
            batch.settles.iter().map(|s| s.entry.id()).collect()
        } else {
            Vec::new()
        };
        let in_place = self.keep_in_place(flush, &mut batch);
        let report =
            FlushReport::of_batch(batch.read_id, batch.kept.len(), batch.dropped_segments());
        self.track_flush(flush, batch.deliveries, ids, report);
        if let Some(flushing) = self.flushes.get_mut(&flush) {
            flushing.in_place = in_place;
        }
        self.actions.push(Action::Flush {
            flush,
            batch,
            read_ahead,
        });
    }

    fn track_flush(
        &mut self,
        flush: FlushId,
        deliveries: usize,
        ids: Vec<E::Id>,
        report: FlushReport,
    ) {
        self.flushing_deliveries += deliveries;
        self.flushes.insert(
            flush,
            Flushing {
                deliveries,
                ids,
                unknown: false,
                reported: false,
                in_place: Vec::new(),
                not_kept: Vec::new(),
                report: Some(report),
            },
        );
    }

    /// Marks the batch's retries to be kept in place (unless the cap makes them dead
    /// letters): every retry on a stream, a keyed entry's on an ordered subscription; and puts
    /// an ordered subscription's keys in flush. Returns the retries, for their lanes (or the
    /// queue of kept retries) once the flush succeeded.
    fn keep_in_place(
        &mut self,
        flush: FlushId,
        batch: &mut FlushBatch<E>,
    ) -> Vec<(E, Option<Duration>)> {
        let every = self.config.kind.keeps_every_retry_in_place();
        if !self.config.ordered && !every {
            return Vec::new();
        }
        let mut keys = Vec::new();
        let mut in_place = Vec::new();
        for (index, settle) in batch.settles.iter().enumerate() {
            let key = settle.entry.ordering_key().filter(|_| self.config.ordered);
            if let Some(key) = key {
                keys.push((key.clone(), settle.entry.id()));
            } else if !every {
                continue;
            }
            let delay = match settle.outcome {
                Outcome::Retry => None,
                Outcome::RetryAfter(delay) => Some(delay),
                _ => continue,
            };
            if counts::exhausted(settle.entry.delivery_count(), self.config.max_deliveries) {
                continue;
            }
            batch.in_place.push(index);
            in_place.push((settle.entry.clone(), delay));
        }
        if self.config.ordered {
            self.lanes.flushing(flush, keys);
        }
        in_place
    }

    /// Flushes the settled deliveries of these slots' reads ahead of the rest of their reads:
    /// a later entry of their key waits on them, and a slow delivery beside them in the read
    /// must not hold that key back.
    pub(super) fn flush_early(&mut self, now: Instant, slots: Vec<SlotId>) {
        for slot in slots {
            if self.window.outstanding_entry(slot).is_some() {
                continue;
            }
            if let Some(batch) = self.window.flush_settled(slot) {
                self.flush(now, batch);
            }
        }
    }

    /// Fetches parked entries back by id as their lanes run short.
    pub(super) fn fetch_parked(&mut self, now: Instant) {
        if self.phase != Phase::Open || !self.client_here {
            return;
        }
        if let Some((fetch, parked)) = self.lanes.fetch(now) {
            self.actions.push(Action::Fetch { fetch, parked });
        }
    }

    /// Asks Redis to count the retries that fell due uncounted, while the client is here to
    /// get them.
    pub(super) fn count_due(&mut self, now: Instant) {
        if self.phase != Phase::Open || !self.client_here {
            return;
        }
        if let Some((count, entries)) = self.lanes.count_due(now) {
            self.actions.push(Action::Count { count, entries });
        }
    }

    /// Hands out the entries whose keys came free, as one read, while the window has room.
    pub(super) fn release_waiting(&mut self, now: Instant) {
        if self.phase != Phase::Open || !self.client_here {
            return;
        }
        // An ordered read hands out no more than the room it finds (the rest waits); an
        // unordered one hands out all it read, so the reads under way keep their room.
        let room = if self.config.ordered {
            (self.config.max_in_flight as usize).saturating_sub(self.window.held())
        } else {
            self.room()
        };
        let released = self.lanes.release(room, now);
        if !self.config.ordered
            && self.lanes.kept_due(now)
            && self.reader.is_some_and(|r| r.fresh)
            && !self.read_interrupted
        {
            // A retry that is due waits for room a read of new entries holds, which may block
            // for all of its BLOCK on a quiet stream: cut it short (it takes nothing then).
            self.read_interrupted = true;
            self.actions.push(Action::InterruptRead);
        }
        if released.is_empty() {
            return;
        }
        let redelivery = released.iter().any(|(_, seen)| *seen);
        let entries: Vec<E> = released.into_iter().map(|(entry, _)| entry).collect();
        if let Some(read) = self.window.open_read(entries.clone()) {
            self.lanes.handed_out(&entries, read.first_slot);
            self.actions.push(Action::Deliver {
                read,
                entries,
                redelivery,
                lost: 0,
                report: None,
            });
        }
    }

    pub(super) fn flush_ended(&mut self, flush: FlushId) {
        let Some(flushing) = self.flushes.remove(&flush) else {
            return;
        };
        debug_assert!(flushing.reported);
        if !flushing.ids.is_empty() && self.reader.is_some() {
            // The reader's read under way may have run before this flush's settle; those
            // asked after it cannot return these entries.
            self.settled_during_reads
                .push((self.reader_asked, flushing.ids));
        }
    }

    pub(super) fn dead_letter(&mut self, entries: Vec<E>) {
        if self.fenced {
            return;
        }
        let flush = self.next_flush;
        self.next_flush += 1;
        let ids = if self.config.kind.rereads_by_id() {
            entries.iter().map(Item::id).collect()
        } else {
            Vec::new()
        };
        // Undelivered: they take no room in the window, and belong to no read.
        self.track_flush(flush, 0, ids, FlushReport::of_batch(0, 0, 0));
        self.actions.push(Action::DeadLetter { flush, entries });
    }
}
