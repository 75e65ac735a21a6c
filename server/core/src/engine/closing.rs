//! A subscription's end: draining at shutdown, closing (what is outstanding is abandoned,
//! what is owed is flushed, a simple list's entries go back), the end of the client's stream
//! and the wait for the last read; and the fence, which ends a subscription whose lease may
//! have run out without writing anything more.

use std::time::Instant;

use super::action::Action;
use super::state::{Engine, Phase};
use super::types::{Item, Kind, Read, Stop};

impl<E: Item> Engine<E> {
    /// Starts closing, once.
    pub(super) fn close(&mut self, stop: Option<Stop>) {
        if !matches!(self.phase, Phase::Open | Phase::Draining { .. }) {
            return;
        }
        if self.reader.is_some() {
            // The close waits for the read under way (a simple list's before anything else,
            // every form's before Done), which may block for all of its BLOCK, up to a
            // minute: cut it short, as if its block had run out.
            self.actions.push(Action::InterruptRead);
        }
        if self.config.kind.waits_for_read_at_close() && self.reader.is_some() {
            self.phase = Phase::ClosingAfterRead { stop };
            return;
        }
        self.close_now(stop);
    }

    /// When the lease may run out unless a renewal confirms it first (see
    /// [`super::Config::fence_after`]).
    pub(super) fn fence_at(&self) -> Option<Instant> {
        let (after, lease) = (self.config.fence_after?, self.lease.as_ref()?);
        (!self.fenced && self.phase != Phase::Done).then(|| lease.confirmed() + after)
    }

    /// Before anything an event leads to: a subscription whose lease may have run out (a
    /// process paused past it, Redis out of reach) stops writing, for another holder may have
    /// the consumer name and be delivering its entries. What it holds stays pending in Redis
    /// as it is, nothing it owes is flushed, and it ends as if the lease were lost. One already
    /// closing writes nothing more either (what its last read returns stays pending).
    pub(super) fn fence(&mut self, now: Instant) {
        if self.fence_at().is_some_and(|at| at <= now) {
            self.fenced = true;
            self.close(Some(Stop::LeaseLost));
        }
    }

    /// Abandons what is outstanding and flushes what is owed.
    pub(super) fn close_now(&mut self, stop: Option<Stop>) {
        self.phase = Phase::Closing { stop };
        self.closed.left_pending = self.window.outstanding();
        if self.fenced {
            // Every entry stays pending as it is, for whoever holds the name now: waiting
            // entries, retries and the settled but unflushed alike.
            let _ = self.lanes.take_waiting(self.config.kind == Kind::Stream);
            let _ = self.window.abandon_all();
            return;
        }
        // Entries waiting for their key go back as if never read; on a stream, a retry_after
        // still waiting uncounted stays as it is (see `Lanes::take_waiting`).
        let (waiting, delayed) = self.lanes.take_waiting(self.config.kind == Kind::Stream);
        self.give_back(delayed, true);
        self.give_back(waiting, false);
        if self.config.kind == Kind::SimpleList {
            // A simple list's entries left without an outcome exist nowhere else: back they
            // go, counted (the client had them).
            let outstanding: Vec<E> = self.window.outstanding_entries().cloned().collect();
            self.give_back(outstanding, true);
        }
        let owed = self.window.abandon_all();
        self.closed.flushed_at_close = owed.len();
        for batch in owed {
            self.flush_batch(batch, None);
        }
    }

    /// Gives back what a read returned that nobody will see: its entries uncounted; its
    /// entries not yet due as they are, since the read's count of those was taken back with
    /// it (taken back twice, a count would run behind the deliveries a client saw).
    pub(super) fn give_back_read(&mut self, read: Read<E>) {
        self.give_back(read.entries, false);
        let delayed = read.delayed.into_iter().map(|(entry, _)| entry).collect();
        self.give_back(delayed, true);
    }

    pub(super) fn give_back(&mut self, entries: Vec<E>, seen: bool) {
        // Fenced: they stay pending as they are (see `fence`).
        if !entries.is_empty() && !self.fenced {
            self.actions.push(Action::GiveBack { entries, seen });
        }
    }
}
