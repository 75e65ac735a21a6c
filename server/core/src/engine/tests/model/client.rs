//! The model's client: what it settles, and the deliveries it says it is still working on.

use std::time::Duration;

use super::super::super::state::Phase;
use super::super::super::*;
use super::{E, EXTEND_EVERY, World};
use crate::window::{Command, Outcome, SlotError, SlotId};

impl World {
    /// The client settles one or more held slots, with a command for each.
    pub(super) fn client_settles(&mut self, pick: u8) {
        if self.holding.is_empty() || self.ended || self.client_done {
            return;
        }
        let n = 1 + (pick as usize % self.holding.len());
        let slots: Vec<SlotId> = self.holding.keys().copied().take(n).collect();
        let commands = slots
            .iter()
            .map(|&slot| {
                (
                    slot,
                    Command::new("INCR", vec![bytes::Bytes::from_static(b"k")]),
                )
            })
            .collect();
        let outcomes = slots
            .iter()
            .enumerate()
            .map(|(i, &slot)| {
                let outcome = match (pick as usize + i) % 6 {
                    0 | 1 => Outcome::Ack,
                    2 => Outcome::Drop,
                    3 => Outcome::Retry,
                    4 => Outcome::RetryAfter(Duration::from_millis(10)),
                    _ => Outcome::DeadLetter,
                };
                Ok(SettleRequest {
                    slot,
                    outcome,
                    reason: None,
                })
            })
            .collect();
        for slot in &slots {
            self.holding.remove(slot);
        }
        let open =
            self.engine.phase == Phase::Open || matches!(self.engine.phase, Phase::Draining { .. });
        let applied = self.engine.apply(self.now, commands, outcomes, |_, _| None);
        // Once closing, the window has abandoned what the client still held.
        assert!(
            applied.rejected.is_empty() || !open,
            "{:?}",
            applied.rejected
        );
        self.collect();
    }

    /// The client acks every slot it holds.
    pub(super) fn client_acks_all(&mut self) {
        if self.holding.is_empty() || self.ended || self.client_done {
            return;
        }
        let outcomes = std::mem::take(&mut self.holding)
            .into_keys()
            .map(|slot| {
                Ok(SettleRequest {
                    slot,
                    outcome: Outcome::Ack,
                    reason: None,
                })
            })
            .collect();
        let applied = self
            .engine
            .apply(self.now, Vec::new(), outcomes, |_, _| None);
        assert!(applied.rejected.is_empty(), "{:?}", applied.rejected);
        self.collect();
    }

    /// The client says it is still working on some held slots, and names one it never had.
    pub(super) fn client_extends(&mut self, pick: u8) {
        if self.ended || self.client_done {
            return;
        }
        let n = pick as usize % (self.holding.len() + 1);
        let mut slots: Vec<SlotId> = self.holding.keys().copied().take(n).collect();
        slots.push(u64::MAX);
        let open =
            self.engine.phase == Phase::Open || matches!(self.engine.phase, Phase::Draining { .. });
        let rejected = self.engine.extend(self.now, &slots);
        assert!(
            matches!(rejected.last(), Some(SlotError::UnknownSlot(u64::MAX))),
            "{rejected:?}"
        );
        // Once closing, the window has abandoned what the client still held.
        assert!(rejected.len() == 1 || !open, "{rejected:?}");
        self.collect();
    }

    /// An extension reaches Redis only for entries the client holds, at most once per
    /// `extend_every` for each delivery, and only where something could take them.
    pub(super) fn extended_in_redis(&mut self, entries: Vec<E>) {
        assert_eq!(
            self.kind,
            Kind::Stream,
            "only stream entries are extended one by one"
        );
        for e in entries {
            let held = self.holding.values().any(|h| h.id == e.id);
            // An ordered subscription keeps the entries waiting for their key as well, on a
            // schedule of its own (a third of min_idle), whatever the client asked before.
            let waiting = self.ordered
                && self.pending.contains(&e.id)
                && !self.flushing.values().flatten().any(|id| *id == e.id);
            assert!(held || waiting, "entry {} extended while not held", e.id);
            if !held {
                continue;
            }
            if let Some(at) = self.extended.insert(e.id, self.now) {
                assert!(
                    self.now.duration_since(at) >= EXTEND_EVERY,
                    "entry {} extended twice within {EXTEND_EVERY:?}",
                    e.id
                );
            }
        }
    }
}
