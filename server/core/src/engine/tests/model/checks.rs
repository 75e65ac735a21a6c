//! The invariants checked between steps and at the end, and the run to the end.

use std::collections::HashSet;
use std::time::Duration;

use super::super::super::state::Phase;
use super::super::super::*;
use super::{E, RENEW, World, config};

impl World {
    /// On an ordered subscription, a delivery of a key never overtakes an earlier entry of
    /// that key still to be settled, and never goes out beside another delivery of its key
    /// that is out or being flushed (one read past the cap aside: it goes to the dead letter
    /// unread, and takes no part in its key's deliveries).
    pub(in crate::engine::tests) fn check_key_order(&self, entries: &[E]) {
        let dead_lettering = &self.past_cap;
        let busy: HashSet<u64> = self
            .holding
            .values()
            .map(|h| h.id)
            .chain(self.flushing.values().flatten().copied())
            .filter(|id| !dead_lettering.contains(id))
            .collect();
        for (i, e) in entries.iter().enumerate() {
            let Some(key) = e.key else { continue };
            let same_key = |id: &u64| self.keys[id] == Some(key);
            if let Some(other) = busy.iter().find(|id| same_key(id)) {
                panic!(
                    "entry {} of key {key} handed out while {other} is out or flushing",
                    e.id
                );
            }
            if let Some(other) = entries[..i].iter().find(|o| o.key == Some(key)) {
                panic!(
                    "entries {} and {} of key {key} handed out together",
                    other.id, e.id
                );
            }
            let earlier = self
                .pending
                .iter()
                .chain(self.backlog.iter())
                .find(|id| **id < e.id && same_key(id) && !dead_lettering.contains(id));
            if let Some(earlier) = earlier {
                panic!(
                    "entry {} of key {key} handed out before the earlier {earlier}, still unsettled",
                    e.id
                );
            }
        }
    }

    /// A live subscription renews its lease on time, whatever else it does.
    pub(in crate::engine::tests) fn check_lease(&self) {
        if config(self.kind).lease_renewal.is_some() && !self.done && !self.lease_asked {
            assert!(
                self.now < self.last_renewal + RENEW,
                "the lease was not renewed for {:?}",
                self.now - self.last_renewal
            );
        }
    }

    /// While the subscription is open and its client still there: with Redis healthy and a
    /// client that acks whatever it gets, every entry is eventually delivered and settled (the
    /// engine never stalls, a hot key's waiting entries and a failed flush's keys included).
    /// A fenced subscription may still stop at its fence, its lease confirmed too late by a
    /// renewal answered before the check began.
    pub(in crate::engine::tests) fn check_progress(&mut self) {
        if self.client_done || self.ended || self.engine.phase != Phase::Open {
            return;
        }
        for _ in 0..2_000 {
            if self.engine.fenced {
                return;
            }
            if self.backlog.is_empty()
                && self.pending.is_empty()
                && self.holding.is_empty()
                && self.stale.is_empty()
                && self.flusher.is_empty()
                && self.lane.is_empty()
            {
                return;
            }
            self.settle_stale(true);
            self.run_read(false);
            if let Some(answer) = self.reader_answer.take() {
                self.engine
                    .read_returned(self.now, ReadFrom::Reader, answer);
                self.collect();
            }
            self.run_flush(0);
            self.answer_flush(0);
            self.run_flush(64);
            self.answer_flush(64);
            self.answer_fetch(true);
            self.answer_count(true);
            self.client_acks_all();
            if self.lease_asked {
                self.renewal_held();
            }
            self.now += Duration::from_millis(100);
            self.engine.tick(self.now);
            self.collect();
        }
        panic!(
            "the subscription stalled: backlog {:?}, pending {:?}, held by the client {:?}",
            self.backlog,
            self.pending,
            self.holding.values().map(|e| e.id).collect::<Vec<_>>()
        );
    }

    /// Lets everything under way finish, the client gone, until the engine is done.
    pub(in crate::engine::tests) fn finish(&mut self) {
        self.engine.client_closed(self.now);
        self.collect();
        for _ in 0..10_000 {
            if self.done {
                return;
            }
            self.run_read(false);
            if let Some(answer) = self.reader_answer.take() {
                self.engine
                    .read_returned(self.now, ReadFrom::Reader, answer);
                self.collect();
            }
            self.run_flush(0);
            self.answer_flush(0);
            self.run_flush(64);
            self.answer_flush(64);
            self.answer_fetch(true);
            self.answer_count(true);
            self.settle_stale(false);
            if self.lease_asked {
                self.renewal_held();
            }
            self.now += Duration::from_millis(100);
            self.engine.tick(self.now);
            self.collect();
        }
        panic!("the engine never finished");
    }

    /// Every entry ended settled with its side effects, or is still in Redis to be delivered
    /// again; no side effect ran twice, and none of an entry that was not acked.
    pub(in crate::engine::tests) fn check_end(&self) {
        for (id, n) in &self.effects {
            assert_eq!(*n, 1, "the side effects of entry {id} ran {n} times");
            assert!(self.settled.contains(id));
        }
        if self.kind == Kind::PubSub {
            return;
        }
        for id in (1..self.next_id).filter(|id| !self.may_lose.contains(id)) {
            let waiting = self.backlog.contains(&id) || self.pending.contains(&id);
            assert!(
                self.settled.contains(&id) ^ waiting,
                "entry {id} is lost (settled: {}, waiting: {waiting}); backlog {:?}, pending {:?}, settled {:?}",
                self.settled.contains(&id),
                self.backlog,
                self.pending,
                self.settled,
            );
        }
        assert!(self.originals > 0);
    }
}
