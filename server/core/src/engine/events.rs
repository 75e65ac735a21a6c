//! The events a subscription's I/O task reports, one handler each: a read came back, a client
//! batch, a flush's report and what Redis did with its retries, a fetch or a count, a lease
//! renewal, a timer, shutdown, the client closing or gone; and after every event, `advance`:
//! what follows from the new state. They tie the parts together; the rules are the parts'.

use std::time::Instant;

use super::action::Action;
use super::backoff::backoff;
use super::report::{FlushReport, FlushResult, PlanCounts};
use super::state::{Engine, Phase};
use super::types::{
    Applied, FetchId, FlushId, FlushStatus, Item, Kind, LaneReadId, LeaseRenewal, Read, ReadError,
    ReadFrom, SettleRequest, Stop,
};
use crate::window::{Command, CommandError, Outcome, SlotError, SlotId};

impl<E: Item> Engine<E> {
    /// A read answered: the reader's, or one on the read lane (see [`super::Lane`]).
    pub fn read_returned(
        &mut self,
        now: Instant,
        from: ReadFrom,
        result: Result<Read<E>, ReadError>,
    ) {
        self.fence(now);
        match from {
            ReadFrom::Reader => self.reader_returned(now, result),
            ReadFrom::Lane(read) => {
                let Some(count) = self.lane_reads.remove(&read) else {
                    return;
                };
                if matches!(result, Err(ReadError::Retry { unknown: true })) {
                    // No reply came: it may still run, and take entries a re-read must not
                    // pass.
                    self.lost_reads.insert(read);
                }
                if let Some(report) = self.read_ahead_returned(now, count, result, None) {
                    self.actions.push(Action::Report(report));
                }
                self.advance(now);
            }
        }
    }

    /// A read on the read lane whose reply never came can no longer run.
    pub fn read_settled(&mut self, now: Instant, read: LaneReadId) {
        self.fence(now);
        self.lost_reads.remove(&read);
        self.advance(now);
    }

    fn reader_returned(&mut self, now: Instant, result: Result<Read<E>, ReadError>) {
        let count = self.reader.take().map_or(u32::MAX, |r| r.count);
        self.read_interrupted = false;
        self.reader_answered += 1;
        let answered = self.reader_answered;
        match result {
            Ok(read) if self.phase == Phase::Open && self.client_here => {
                self.read_failures = 0;
                self.deliver(now, read, count, None, Some(answered));
            }
            // Nobody will see what a read returns once the subscription stops reading: give
            // it back uncounted, so its next delivery is its first.
            Ok(read) => self.give_back_read(read),
            Err(ReadError::Fatal(stop)) => self.close(Some(stop)),
            Err(ReadError::Retry { .. }) => {
                // A failed read may have claimed entries it never returned: they are pending
                // on this consumer, so read those again.
                self.reread_owed = true;
                self.read_failures += 1;
                self.retry_read_at = Some(now + backoff(self.read_failures));
            }
        }
        self.settled_during_reads
            .retain(|(asked, _)| *asked > answered);
        if let Phase::ClosingAfterRead { stop } = self.phase {
            self.close_now(stop);
        }
        self.advance(now);
    }

    /// The client's commands (admitted or refused by the session) and outcomes. Returns the
    /// rejections, and for each outcome whether the window took it.
    pub fn apply(
        &mut self,
        now: Instant,
        commands: Vec<(SlotId, Result<Command, CommandError>)>,
        outcomes: Vec<Result<SettleRequest, SlotError>>,
        refuses: impl Fn(&E, &Outcome) -> Option<&'static str>,
    ) -> Applied {
        self.fence(now);
        let mut applied = Applied::default();
        for (slot, command) in commands {
            if let Err(err) = self.window.queue(slot, command) {
                applied.rejected.push(err);
            }
        }
        // Settled deliveries a later entry of their key waits on.
        let mut early = Vec::new();
        for outcome in outcomes {
            let result = outcome.and_then(|settle| {
                if let Some(entry) = self.window.outstanding_entry(settle.slot) {
                    if let Some(why) = refuses(entry, &settle.outcome) {
                        return Err(SlotError::InvalidOutcome {
                            slot: settle.slot,
                            reason: why.to_owned(),
                        });
                    }
                    if self.config.ordered && self.lanes.waits_behind(entry) {
                        early.push(settle.slot);
                    }
                }
                let batch = self
                    .window
                    .settle(settle.slot, settle.outcome, settle.reason)?;
                applied.settled.push((settle.slot, settle.outcome));
                Ok(batch)
            });
            match result {
                Ok(Some(batch)) => self.flush(now, batch),
                Ok(None) => {}
                Err(err) => applied.rejected.push(err),
            }
        }
        self.flush_early(now, early);
        self.advance(now);
        applied
    }

    /// Entries that flush `flush` was to keep in place and another consumer holds now (it
    /// reclaimed them while this one could not reach Redis): theirs to deliver, not to be
    /// delivered again here. Said before the flush is reported.
    pub fn left_to_others(&mut self, flush: FlushId, ids: &[E::Id]) {
        if let Some(flushing) = self.flushes.get_mut(&flush) {
            flushing
                .in_place
                .retain(|(entry, _)| !ids.contains(&entry.id()));
        }
    }

    /// Retries of flush `flush` that Redis refused to keep in place: pending as their
    /// delivery left them, their next delivery not counted. Handed out from memory they would
    /// count ahead of Redis, and a later read would count lower: they are read again instead.
    /// Said before the flush is reported.
    pub fn not_kept(&mut self, flush: FlushId, ids: &[E::Id]) {
        if ids.is_empty() {
            return;
        }
        self.left_to_others(flush, ids);
        if let Some(flushing) = self.flushes.get_mut(&flush) {
            flushing.not_kept.extend_from_slice(ids);
        }
        self.reread_owed = true;
    }

    /// A flush was reported: what its plan held, what Redis answered, and what its
    /// read-ahead read. Its report goes to the client, riding in that read when it can.
    pub fn flushed(
        &mut self,
        now: Instant,
        flush: FlushId,
        (counts, result): (PlanCounts, FlushResult),
        read_ahead: Option<Result<Read<E>, ReadError>>,
    ) {
        self.fence(now);
        let Some(flushing) = self.flushes.get_mut(&flush) else {
            return;
        };
        let status = result.status();
        let report = flushing
            .report
            .take()
            .map(|report| report.answered(counts, result));
        flushing.reported = true;
        let in_place = std::mem::take(&mut flushing.in_place);
        let not_kept = std::mem::take(&mut flushing.not_kept);
        self.flushing_deliveries -= flushing.deliveries;
        // What a failed flush may not have settled is still pending: its keys wait for the
        // re-read that brings it back.
        let settled = !matches!(
            status,
            FlushStatus::Unknown
                | FlushStatus::Failed {
                    settle_failed: true
                }
        );
        let mut in_place: Vec<_> = in_place
            .into_iter()
            .map(|(entry, delay)| (entry, delay.map(|d| now + d)))
            .collect();
        if !matches!(self.phase, Phase::Open | Phase::Draining { .. }) && settled {
            // Closing: their next delivery, counted by the flush, will not happen here. A
            // stream's retry_after was kept uncounted: it stays as it is.
            let stream = self.config.kind == Kind::Stream;
            let (uncounted, counted): (Vec<_>, Vec<_>) = in_place
                .drain(..)
                .partition(|(_, due)| stream && due.is_some());
            self.give_back(
                uncounted.into_iter().map(|(entry, _)| entry).collect(),
                true,
            );
            self.give_back(counted.into_iter().map(|(entry, _)| entry).collect(), false);
        }
        self.lanes.flushed(
            flush,
            (settled, &not_kept),
            in_place,
            (now, self.reader_asked),
        );
        match status {
            FlushStatus::Ok => {
                self.refused_settles = 0;
                self.flush_ended(flush);
            }
            FlushStatus::Failed { settle_failed } => {
                // The read's entries are still pending on this consumer: read them again,
                // after a wait that grows while Redis keeps refusing.
                if settle_failed {
                    self.reread_owed = true;
                    self.refused_settles += 1;
                    let at = now + backoff(self.refused_settles);
                    self.retry_read_at = Some(self.retry_read_at.map_or(at, |t| t.max(at)));
                }
                self.flush_ended(flush);
            }
            // It stays under way until nothing of it can still run: its entries are read
            // again only then.
            FlushStatus::Unknown => {
                if let Some(flushing) = self.flushes.get_mut(&flush) {
                    flushing.unknown = true;
                }
                self.reread_owed = true;
            }
        }
        let rides = self.config.reports_in_reads && matches!(read_ahead, Some(Ok(_)));
        let mut report = report;
        if !rides && let Some(report) = report.take() {
            self.actions.push(Action::Report(report));
        }
        let count = self.ahead.remove(&flush).unwrap_or(u32::MAX);
        if let Some(result) = read_ahead {
            report = self.read_ahead_returned(now, count, result, report);
        }
        if let Some(report) = report {
            self.actions.push(Action::Report(report));
        }
        self.advance(now);
    }

    /// A read of `count` new entries ahead of the reader answered (riding on a flush, or on
    /// the read lane), with `report` to ride in it. Returns the report if it did not ride.
    fn read_ahead_returned(
        &mut self,
        now: Instant,
        count: u32,
        result: Result<Read<E>, ReadError>,
        report: Option<FlushReport>,
    ) -> Option<FlushReport> {
        match result {
            Ok(read) if self.config.ordered && self.reread_owed => {
                // An earlier read may have taken entries no reply named, or a flush left its
                // entries pending: these later ones could pass them. Left pending, uncounted,
                // they come back in their place with the re-read.
                self.give_back_read(read);
                report
            }
            Ok(read) if self.phase == Phase::Open && self.client_here => {
                self.deliver(now, read, count, report, None)
            }
            Ok(read) => {
                self.give_back_read(read);
                report
            }
            Err(ReadError::Retry { unknown }) => {
                // The reader reads next; Redis may have delivered entries no reply named.
                self.backlog = false;
                self.reread_owed |= unknown;
                report
            }
            Err(ReadError::Fatal(stop)) => {
                self.close(Some(stop));
                report
            }
        }
    }

    /// A fetch of parked entries came back: each entry asked, in order, or `None` where it was
    /// gone from the stream (and the fetch settled it); `Err`: try again later.
    pub fn fetched(
        &mut self,
        now: Instant,
        fetch: FetchId,
        result: Result<Vec<Option<E>>, ReadError>,
    ) {
        self.fence(now);
        match result {
            Err(ReadError::Fatal(stop)) => {
                self.lanes.fetched(fetch, None, now);
                self.close(Some(stop));
            }
            result => self.lanes.fetched(fetch, result.ok(), now),
        }
        self.advance(now);
    }

    /// A count of due retries came back (see [`Action::Count`]): each entry asked, in order,
    /// counted, or `None` where it is no longer this consumer's; `Err`: try again later.
    pub fn counted(
        &mut self,
        now: Instant,
        count: FetchId,
        result: Result<Vec<Option<E>>, ReadError>,
    ) {
        self.fence(now);
        let cap = self.config.max_deliveries;
        let past_cap = match result {
            Err(ReadError::Fatal(stop)) => {
                self.lanes.counted(count, None, cap, now);
                self.close(Some(stop));
                Vec::new()
            }
            result => self.lanes.counted(count, result.ok(), cap, now),
        };
        if !past_cap.is_empty() {
            self.dead_letter(past_cap);
        }
        self.advance(now);
    }

    /// A flush reported with an unknown outcome can no longer run.
    pub fn flush_settled(&mut self, now: Instant, flush: FlushId) {
        self.fence(now);
        if self.flushes.get(&flush).is_some_and(|f| f.unknown) {
            self.flush_ended(flush);
        }
        self.advance(now);
    }

    /// Timers: a read's backoff, the drain deadline, the lease.
    pub fn tick(&mut self, now: Instant) {
        self.fence(now);
        if self.retry_read_at.is_some_and(|at| at <= now) {
            self.retry_read_at = None;
        }
        if let Phase::Draining { until } = self.phase
            && until <= now
        {
            self.close(Some(Stop::Shutdown));
        }
        if let Some(waiting) = self.lanes.extend(now)
            && !waiting.is_empty()
        {
            self.actions.push(Action::Extend(waiting));
        }
        self.advance(now);
    }

    /// What renewing the lease found.
    pub fn lease_renewed(&mut self, now: Instant, renewal: LeaseRenewal) {
        self.fence(now);
        if let Some(lease) = &mut self.lease {
            lease.renewed(now, renewal);
        }
        if renewal == LeaseRenewal::Lost {
            self.close(Some(Stop::LeaseLost));
        }
        self.advance(now);
    }

    /// Shutdown began.
    pub fn shutdown(&mut self, now: Instant) {
        self.fence(now);
        if self.phase == Phase::Open {
            let grace = self.config.shutdown_grace;
            self.phase = Phase::Draining { until: now + grace };
            let outstanding = self.window.outstanding();
            if outstanding > 0 && self.client_here {
                self.actions.push(Action::Draining { grace, outstanding });
            }
        }
        self.advance(now);
    }

    /// The client half-closed its stream, or sent something that ends it: it gets the reports
    /// of what it settled, then the end. While draining, the end says shutdown, as the drain
    /// promised: the client resubscribes elsewhere.
    pub fn client_closed(&mut self, now: Instant) {
        self.fence(now);
        let stop = matches!(self.phase, Phase::Draining { .. }).then_some(Stop::Shutdown);
        self.close(stop);
        self.advance(now);
    }

    /// The client is gone: nothing more can be sent to it.
    pub fn client_gone(&mut self, now: Instant) {
        self.fence(now);
        self.client_here = false;
        self.close(None);
        self.advance(now);
    }

    /// After every event: what follows from the new state.
    pub(super) fn advance(&mut self, now: Instant) {
        if let Phase::Draining { .. } = self.phase
            && self.window.outstanding() == 0
        {
            self.close(Some(Stop::Shutdown));
        }
        if let Phase::Closing { stop } = self.phase
            && self.flushes.is_empty()
            && self.lane_reads.is_empty()
            && self.lost_reads.is_empty()
        {
            self.phase = Phase::Ended;
            self.actions.push(Action::EndStream(stop));
        }
        if self.phase == Phase::Ended && self.reader.is_none() {
            self.phase = Phase::Done;
            self.actions.push(Action::Done);
        }
        if self.phase == Phase::Done {
            return;
        }
        if let Some(lease) = &mut self.lease
            && lease.renew_now(now)
        {
            self.actions.push(Action::RenewLease);
        }
        self.lanes.look(now);
        self.fetch_parked(now);
        self.count_due(now);
        self.release_waiting(now);
        self.maybe_read(now);
    }
}
