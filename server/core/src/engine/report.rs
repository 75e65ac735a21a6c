//! A flush's report, as the client reads it: what the flush's plan held, counted when it was
//! planned ([`PlanCounts`]), and what Redis's replies said ([`FlushResult`]). The engine owns
//! each report from the flush to its delivery: it makes one when it hands out a flush, fills it
//! when the flush is reported, and hands it to the client in an [`super::Action`], on its own
//! or riding in the next read. How replies become a result is the Redis adapter's business.

use bytes::Bytes;

use super::types::FlushStatus;
use crate::window::ReadId;

/// The report of one flush, for the client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlushReport {
    /// The read whose deliveries it settles; 0 for entries dead-lettered unread.
    pub read_id: ReadId,
    pub segments_kept: usize,
    pub segments_dropped: usize,
    pub commands: usize,
    pub settles: usize,
    pub dead_lettered: usize,
    pub result: FlushResult,
}

impl FlushReport {
    /// A flush's report as its batch knows it: its counts and result come with its answer.
    pub(super) fn of_batch(read_id: ReadId, kept: usize, dropped: usize) -> Self {
        Self {
            read_id,
            segments_kept: kept,
            segments_dropped: dropped,
            commands: 0,
            settles: 0,
            dead_lettered: 0,
            result: FlushResult::default(),
        }
    }

    /// The report with what its plan held and what Redis answered.
    pub(super) fn answered(self, counts: PlanCounts, result: FlushResult) -> Self {
        Self {
            commands: counts.commands,
            settles: counts.settles,
            dead_lettered: counts.dead_lettered,
            result,
            ..self
        }
    }
}

/// What a flush's plan holds, counted when it was planned.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlanCounts {
    /// The client's side-effect commands.
    pub commands: usize,
    /// Entries it settles.
    pub settles: usize,
    /// Entries it moves to the dead letter.
    pub dead_lettered: usize,
}

/// What the replies of a flush said.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlushResult {
    /// Replies that were errors.
    pub failed: usize,
    /// The first error, as Redis worded it.
    pub first_error: Option<String>,
    /// A settle did not take effect: the read's entries stay pending.
    pub settle_failed: bool,
    /// Transactions refused while queuing (EXECABORT): none of their commands ran.
    pub aborted: usize,
    /// A reply never came (timeout, broken connection): Redis may have applied the flush, or
    /// may still apply it.
    pub unknown: bool,
    /// Nothing of it reached Redis (no connection in time): none of it ran.
    pub not_sent: bool,
    /// Entries neither settled nor requeued because another consumer had claimed them (this
    /// sidecar held them past `min_idle` without extending them): theirs now.
    pub skipped: usize,
    /// Of those, the ones that were to be dead letters.
    pub skipped_dead_letters: usize,
    /// Of those, the ids of retries to be kept in place (counted in `skipped` too): not to be
    /// delivered again here.
    pub left_to_others: Vec<Bytes>,
    /// The ids of retries Redis refused to keep in place (also in `requeue_refused`): pending
    /// as their delivery left them, their next delivery not counted, to be read again.
    pub not_kept: Vec<Bytes>,
    /// Entries whose retry, delay or dead letter Redis refused to write: neither requeued nor
    /// settled, they stay pending and are delivered again.
    pub requeue_refused: Vec<RequeueRefused>,
    /// Side-effect commands Redis answered with an error when they ran.
    pub side_effect_failures: Vec<SideEffectFailure>,
}

/// A side-effect command Redis answered with an error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SideEffectFailure {
    /// The slot whose segment held it.
    pub slot: u64,
    /// Its entry's stream id; empty for a list value or a message.
    pub entry_id: Bytes,
    /// The command's name, as queued.
    pub command: String,
    /// Redis's error, as Redis worded it.
    pub error: String,
    /// The entry was settled all the same (pipeline mode), not left pending (atomic mode).
    pub settled: bool,
    /// What the entry is known by when it comes back (its id, or a list value as stored).
    pub entry_key: Bytes,
}

/// An entry whose requeue write Redis refused, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequeueRefused {
    /// The slot it was delivered in; 0 for an entry dead-lettered unread.
    pub slot: u64,
    /// Its stream entry id; empty for a list value.
    pub entry_id: Bytes,
    /// Redis's error, as Redis worded it.
    pub error: String,
    /// Its place among the entries of the flush's requeue step, from 0: how the sidecar finds
    /// a simple list's entry, which only it still has, to hold and give back (`usize::MAX`
    /// for a stream's retry kept in place, which is no part of that step).
    pub step: usize,
}

impl FlushResult {
    pub fn ok(&self) -> bool {
        self.failed == 0
    }

    /// How the flush ended, as far as the engine decides on it.
    pub fn status(&self) -> FlushStatus {
        if self.ok() {
            FlushStatus::Ok
        } else if self.unknown {
            FlushStatus::Unknown
        } else {
            FlushStatus::Failed {
                settle_failed: self.settle_failed,
            }
        }
    }
}
