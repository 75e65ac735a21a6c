//! The window of a pipelined subscription, as a pure state machine.
//!
//! It owns slots, segments and outcomes: reads go in (each delivery takes a new slot), queued
//! commands and outcomes go in, and [`FlushBatch`]es come out when a read has nothing
//! outstanding. It decides what is kept and what is settled; it never talks to Redis, the
//! network or a clock, so every rule of the contract is tested here without I/O. The entry type
//! `E` is whatever the form needs to settle an entry (a stream id, a list value).

mod command;
mod reason;

use std::collections::BTreeMap;
use std::time::Duration;

use thiserror::Error;

pub use command::{Arity, Command, CommandError};
pub use reason::Reason;

/// A delivery's slot id. Unique within a subscription and never reused; 0 is never a slot.
pub type SlotId = u64;
/// A read's id, increasing within a subscription from 1.
pub type ReadId = u64;

/// How a delivery was settled by the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Keep the segment, settle the entry.
    Ack,
    /// Discard the segment, settle the entry for good.
    Drop,
    /// Discard the segment; the entry comes back as soon as possible.
    Retry,
    /// Discard the segment; the entry comes back after the delay.
    RetryAfter(Duration),
    /// Discard the segment, write the entry to the dead-letter target and settle it.
    DeadLetter,
}

impl Outcome {
    /// The name used in logs, metrics and trace attributes.
    pub fn as_str(&self) -> &'static str {
        match self {
            Outcome::Ack => "ack",
            Outcome::Drop => "drop",
            Outcome::Retry => "retry",
            Outcome::RetryAfter(_) => "retry_after",
            Outcome::DeadLetter => "dead_letter",
        }
    }
}

/// A refused command or outcome. The slot is left as it was (or, for a refused command, marked
/// incomplete so it cannot be acked).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SlotError {
    #[error("slot {0} was never delivered on this subscription")]
    UnknownSlot(SlotId),
    #[error(
        "slot {0} already has an outcome or was abandoned; nothing more can be queued or settled for it"
    )]
    AlreadySettled(SlotId),
    #[error("slot {slot}: {source}")]
    InvalidCommand {
        slot: SlotId,
        #[source]
        source: CommandError,
    },
    #[error("slot {slot} already has {limit} queued commands, the most a segment may hold")]
    TooManyCommands { slot: SlotId, limit: usize },
    #[error(
        "slot {0} cannot be acked: one of its commands was refused, so its segment is incomplete; settle it with drop, retry or retry_after"
    )]
    IncompleteSegment(SlotId),
    #[error("slot {slot}: {reason}")]
    InvalidOutcome { slot: SlotId, reason: String },
}

impl SlotError {
    /// The slot the error is about.
    pub fn slot(&self) -> SlotId {
        match self {
            SlotError::UnknownSlot(slot)
            | SlotError::AlreadySettled(slot)
            | SlotError::IncompleteSegment(slot)
            | SlotError::InvalidCommand { slot, .. }
            | SlotError::InvalidOutcome { slot, .. }
            | SlotError::TooManyCommands { slot, .. } => *slot,
        }
    }
}

/// Limits that keep one window's memory bounded.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// The most commands one segment may hold.
    pub max_commands_per_slot: usize,
}

/// A read that was added to the window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenedRead {
    pub read_id: ReadId,
    /// The slot of the read's first delivery; the others follow consecutively.
    pub first_slot: SlotId,
}

/// What one flush must send for one read: the kept segments in commit order, then the settles.
#[derive(Clone, Debug, PartialEq)]
pub struct FlushBatch<E> {
    pub read_id: ReadId,
    /// Deliveries in the read.
    pub deliveries: usize,
    /// Acked segments in the order of their acks. Each names its settle.
    pub kept: Vec<KeptSegment>,
    /// Every settled entry of the read, in delivery order. Abandoned entries are not here.
    pub settles: Vec<Settle<E>>,
    /// Deliveries abandoned without an outcome: no settle, they stay pending.
    pub abandoned: usize,
    /// Indexes into `settles` of retries kept in place (an ordered subscription's: see the
    /// engine): no settle, no copy; the entry stays pending and its delivery is counted.
    pub in_place: Vec<usize>,
    /// Flushed ahead of the rest of its read ([`Window::flush_settled`]): another batch of
    /// the read follows.
    pub early: bool,
}

impl<E> FlushBatch<E> {
    /// Side-effect commands the batch sends.
    pub fn command_count(&self) -> usize {
        self.kept.iter().map(|s| s.commands.len()).sum()
    }

    /// Segments discarded: settled deliveries that were not acked, plus abandoned ones.
    pub fn dropped_segments(&self) -> usize {
        self.deliveries - self.kept.len()
    }

    /// How many settles have the given outcome kind.
    pub fn count_outcome(&self, kind: fn(&Outcome) -> bool) -> usize {
        self.settles.iter().filter(|s| kind(&s.outcome)).count()
    }
}

/// An acked segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeptSegment {
    pub slot: SlotId,
    /// Index of this delivery's settle in [`FlushBatch::settles`].
    pub settle: usize,
    pub commands: Vec<Command>,
}

/// A settled entry.
#[derive(Clone, Debug, PartialEq)]
pub struct Settle<E> {
    pub slot: SlotId,
    pub entry: E,
    pub outcome: Outcome,
    /// The client's reason, if it gave one.
    pub reason: Option<String>,
}

#[derive(Debug)]
enum State {
    /// Waiting for an outcome. `incomplete` once one of its commands was refused.
    Open {
        incomplete: bool,
    },
    Settled {
        outcome: Outcome,
        reason: Option<String>,
    },
    Abandoned,
    /// Settled and handed to a flush of its own before its read was complete.
    Flushed,
}

#[derive(Debug)]
struct Delivery<E> {
    entry: E,
    segment: Vec<Command>,
    state: State,
}

#[derive(Debug)]
struct Read<E> {
    read_id: ReadId,
    deliveries: Vec<Delivery<E>>,
    /// Indices of acked deliveries not yet flushed, in the order of their acks.
    commit_order: Vec<usize>,
    outstanding: usize,
    /// Deliveries flushed ahead of the read (see [`Window::flush_settled`]).
    flushed: usize,
}

/// The window of one subscription.
#[derive(Debug)]
pub struct Window<E> {
    limits: Limits,
    /// The first slot this window hands out; any below it was never its own.
    first_slot: SlotId,
    next_slot: SlotId,
    next_read: ReadId,
    /// Open reads by their first slot, so a slot finds its read with one range lookup and no
    /// per-delivery index.
    reads: BTreeMap<SlotId, Read<E>>,
    outstanding: usize,
}

impl<E: Clone> Window<E> {
    pub fn new(limits: Limits) -> Self {
        Self::numbered_from(limits, 0)
    }

    /// A window whose slot and read ids begin after `base` rather than at 1: windows given
    /// disjoint ranges can share one client stream (a partitioned stream's subscriptions) and
    /// be told apart by their ids alone.
    pub fn numbered_from(limits: Limits, base: u64) -> Self {
        Self {
            limits,
            first_slot: base + 1,
            next_slot: base + 1,
            next_read: base + 1,
            reads: BTreeMap::new(),
            outstanding: 0,
        }
    }

    /// Deliveries handed out and not yet settled or abandoned.
    pub fn outstanding(&self) -> usize {
        self.outstanding
    }

    /// Reads that still have deliveries outstanding.
    pub fn open_reads(&self) -> usize {
        self.reads.len()
    }

    /// Deliveries of reads not yet complete, settled or not: what the window holds until
    /// their read is flushed.
    pub fn held(&self) -> usize {
        self.reads
            .values()
            .map(|read| read.deliveries.len() - read.flushed)
            .sum()
    }

    /// Entries of every delivery the window holds, settled or not (to avoid delivering an
    /// entry again while its first delivery is not flushed).
    pub fn held_entries(&self) -> impl Iterator<Item = &E> {
        self.reads.values().flat_map(|read| {
            read.deliveries
                .iter()
                .filter(|d| !matches!(d.state, State::Flushed))
                .map(|d| &d.entry)
        })
    }

    /// Acked segments waiting for their read's flush.
    pub fn kept_segments(&self) -> usize {
        self.reads
            .values()
            .map(|read| read.commit_order.len())
            .sum()
    }

    /// Entries of outstanding deliveries (to avoid delivering an entry twice at once).
    pub fn outstanding_entries(&self) -> impl Iterator<Item = &E> {
        self.reads.values().flat_map(|read| {
            read.deliveries
                .iter()
                .filter(|d| matches!(d.state, State::Open { .. }))
                .map(|d| &d.entry)
        })
    }

    /// The entry of a slot still waiting for its outcome, or why there is none.
    pub fn open_entry(&self, slot: SlotId) -> Result<&E, SlotError> {
        let (first_slot, index) = self.locate(slot)?;
        let delivery = &self.reads[&first_slot].deliveries[index];
        match delivery.state {
            State::Open { .. } => Ok(&delivery.entry),
            _ => Err(SlotError::AlreadySettled(slot)),
        }
    }

    /// The entry of a slot still waiting for its outcome.
    pub fn outstanding_entry(&self, slot: SlotId) -> Option<&E> {
        let (first_slot, index) = self.locate(slot).ok()?;
        let delivery = &self.reads.get(&first_slot)?.deliveries[index];
        matches!(delivery.state, State::Open { .. }).then_some(&delivery.entry)
    }

    /// Adds a read; each entry takes the next slot. An empty read is not added.
    pub fn open_read(&mut self, entries: Vec<E>) -> Option<OpenedRead> {
        if entries.is_empty() {
            return None;
        }
        let read_id = self.next_read;
        self.next_read += 1;
        let first_slot = self.next_slot;
        self.next_slot += entries.len() as u64;
        self.outstanding += entries.len();
        let deliveries: Vec<_> = entries
            .into_iter()
            .map(|entry| Delivery {
                entry,
                segment: Vec::new(),
                state: State::Open { incomplete: false },
            })
            .collect();
        let outstanding = deliveries.len();
        self.reads.insert(
            first_slot,
            Read {
                read_id,
                deliveries,
                commit_order: Vec::new(),
                outstanding,
                flushed: 0,
            },
        );
        Some(OpenedRead {
            read_id,
            first_slot,
        })
    }

    /// Queues a command into a slot's segment. A refused command marks the slot incomplete.
    pub fn queue(
        &mut self,
        slot: SlotId,
        command: Result<Command, CommandError>,
    ) -> Result<(), SlotError> {
        let limit = self.limits.max_commands_per_slot;
        let delivery = self.open_delivery(slot)?;
        let State::Open { incomplete } = &mut delivery.state else {
            unreachable!("open_delivery returns open deliveries only")
        };
        let refused = match command {
            Ok(_) if delivery.segment.len() >= limit => SlotError::TooManyCommands { slot, limit },
            Ok(command) => {
                delivery.segment.push(command);
                return Ok(());
            }
            Err(source) => SlotError::InvalidCommand { slot, source },
        };
        *incomplete = true;
        Err(refused)
    }

    /// Settles a slot. Returns the read's flush batch when this was its last outstanding
    /// delivery.
    pub fn settle(
        &mut self,
        slot: SlotId,
        outcome: Outcome,
        reason: Option<String>,
    ) -> Result<Option<FlushBatch<E>>, SlotError> {
        let (first_slot, index) = self.locate(slot)?;
        let read = self
            .reads
            .get_mut(&first_slot)
            .expect("located read exists");
        let delivery = &mut read.deliveries[index];
        match delivery.state {
            State::Open { incomplete: true } if outcome == Outcome::Ack => {
                return Err(SlotError::IncompleteSegment(slot));
            }
            State::Open { .. } => {}
            _ => return Err(SlotError::AlreadySettled(slot)),
        }
        delivery.state = State::Settled { outcome, reason };
        if outcome == Outcome::Ack {
            read.commit_order.push(index);
        } else {
            // A discarded segment is never sent: free it now.
            delivery.segment = Vec::new();
        }
        read.outstanding -= 1;
        self.outstanding -= 1;
        Ok(self.finish_if_done(first_slot))
    }

    /// Abandons every outstanding delivery (the client went away, or shutdown's grace period
    /// ran out). Their entries are not settled and stay pending. Returns the batches of the
    /// reads that still have settled deliveries to flush.
    pub fn abandon_all(&mut self) -> Vec<FlushBatch<E>> {
        let firsts: Vec<SlotId> = self.reads.keys().copied().collect();
        let mut batches = Vec::new();
        for first_slot in firsts {
            let read = self.reads.get_mut(&first_slot).expect("key from the map");
            for delivery in &mut read.deliveries {
                if matches!(delivery.state, State::Open { .. }) {
                    delivery.state = State::Abandoned;
                    delivery.segment = Vec::new();
                }
            }
            self.outstanding -= read.outstanding;
            read.outstanding = 0;
            batches.extend(self.finish_if_done(first_slot));
        }
        debug_assert_eq!(self.outstanding, 0);
        batches
    }

    /// The settled deliveries of `slot`'s read, flushed now, ahead of the rest of the read
    /// (an ordered subscription's key whose next entry waits on one of them): their batch,
    /// kept segments in commit order. The read's own batch later carries what is settled
    /// after. `None` when nothing of the read is settled and unflushed, or the read is gone.
    pub fn flush_settled(&mut self, slot: SlotId) -> Option<FlushBatch<E>> {
        let (first_slot, _) = self.locate(slot).ok()?;
        let read = self.reads.get_mut(&first_slot)?;
        let settled: Vec<usize> = (0..read.deliveries.len())
            .filter(|&i| matches!(read.deliveries[i].state, State::Settled { .. }))
            .collect();
        if settled.is_empty() {
            return None;
        }
        let mut batch = FlushBatch {
            read_id: read.read_id,
            deliveries: settled.len(),
            kept: Vec::new(),
            settles: Vec::with_capacity(settled.len()),
            abandoned: 0,
            in_place: Vec::new(),
            early: true,
        };
        let mut settle_index = vec![usize::MAX; read.deliveries.len()];
        for index in settled {
            let delivery = &mut read.deliveries[index];
            let State::Settled { outcome, reason } =
                std::mem::replace(&mut delivery.state, State::Flushed)
            else {
                unreachable!("picked settled deliveries")
            };
            settle_index[index] = batch.settles.len();
            batch.settles.push(Settle {
                slot: first_slot + index as u64,
                entry: delivery.entry.clone(),
                outcome,
                reason,
            });
        }
        read.flushed += batch.settles.len();
        for index in std::mem::take(&mut read.commit_order) {
            batch.kept.push(KeptSegment {
                slot: first_slot + index as u64,
                settle: settle_index[index],
                commands: std::mem::take(&mut read.deliveries[index].segment),
            });
        }
        Some(batch)
    }

    fn locate(&self, slot: SlotId) -> Result<(SlotId, usize), SlotError> {
        if slot < self.first_slot || slot >= self.next_slot {
            return Err(SlotError::UnknownSlot(slot));
        }
        let Some((&first_slot, read)) = self.reads.range(..=slot).next_back() else {
            return Err(SlotError::AlreadySettled(slot));
        };
        let index = (slot - first_slot) as usize;
        if index >= read.deliveries.len() {
            // The slot belonged to a read that has been flushed and removed.
            return Err(SlotError::AlreadySettled(slot));
        }
        Ok((first_slot, index))
    }

    fn open_delivery(&mut self, slot: SlotId) -> Result<&mut Delivery<E>, SlotError> {
        let (first_slot, index) = self.locate(slot)?;
        let delivery = &mut self.reads.get_mut(&first_slot).expect("located").deliveries[index];
        match delivery.state {
            State::Open { .. } => Ok(delivery),
            _ => Err(SlotError::AlreadySettled(slot)),
        }
    }

    /// Removes a read with nothing outstanding and turns it into a batch, unless nothing in it
    /// was settled (then there is nothing to send).
    fn finish_if_done(&mut self, first_slot: SlotId) -> Option<FlushBatch<E>> {
        if self.reads.get(&first_slot)?.outstanding > 0 {
            return None;
        }
        let read = self.reads.remove(&first_slot)?;
        let deliveries = read.deliveries.len() - read.flushed;
        let mut settle_index = vec![usize::MAX; read.deliveries.len()];
        let mut settles = Vec::new();
        let mut abandoned = 0;
        let mut segments: Vec<Vec<Command>> = Vec::with_capacity(read.deliveries.len());
        for (index, delivery) in read.deliveries.into_iter().enumerate() {
            segments.push(delivery.segment);
            match delivery.state {
                State::Settled { outcome, reason } => {
                    settle_index[index] = settles.len();
                    settles.push(Settle {
                        slot: first_slot + index as u64,
                        entry: delivery.entry,
                        outcome,
                        reason,
                    });
                }
                State::Abandoned => abandoned += 1,
                State::Flushed => {}
                State::Open { .. } => unreachable!("a finished read has no open delivery"),
            }
        }
        if settles.is_empty() {
            return None;
        }
        let kept = read
            .commit_order
            .into_iter()
            .map(|index| KeptSegment {
                slot: first_slot + index as u64,
                settle: settle_index[index],
                commands: std::mem::take(&mut segments[index]),
            })
            .collect();
        Some(FlushBatch {
            read_id: read.read_id,
            deliveries,
            kept,
            settles,
            abandoned,
            in_place: Vec::new(),
            early: false,
        })
    }
}

#[cfg(test)]
mod tests;
