//! Liveness: the consumer lease a subscription renews for as long as it is open, whatever it
//! is doing (a full window and a long block included), and when it recovers the entries of
//! idle or dead consumers.

use std::time::{Duration, Instant};

use super::types::{Kind, LeaseRenewal};

/// The most a failed renewal waits before the next try.
const RETRY_FAILED_RENEWAL: Duration = Duration::from_millis(250);

/// The renewal schedule of a consumer lease.
#[derive(Debug)]
pub(super) struct Lease {
    every: Duration,
    next: Instant,
    renewing: bool,
    /// When the renewal under way was asked for.
    sent: Instant,
    /// When the last renewal Redis answered held was asked for (the take, at first): the
    /// lease runs its whole lifetime from then at least.
    confirmed: Instant,
}

impl Lease {
    /// Just taken: renewed first after `every`.
    pub(super) fn new(every: Duration, now: Instant) -> Self {
        Self {
            every,
            next: now + every,
            renewing: false,
            sent: now,
            confirmed: now,
        }
    }

    /// Since when the lease is known to run its lifetime.
    pub(super) fn confirmed(&self) -> Instant {
        self.confirmed
    }

    /// When the next renewal is due, unless one is under way.
    pub(super) fn due(&self) -> Option<Instant> {
        (!self.renewing).then_some(self.next)
    }

    /// Whether to renew now; if so, a renewal is under way until [`Lease::renewed`].
    pub(super) fn renew_now(&mut self, now: Instant) -> bool {
        if self.renewing || now < self.next {
            return false;
        }
        self.renewing = true;
        self.sent = now;
        true
    }

    /// Renews at once (unless a renewal is under way): the client asked for more time.
    pub(super) fn hurry(&mut self, now: Instant) {
        self.next = self.next.min(now);
    }

    pub(super) fn renewed(&mut self, now: Instant, renewal: LeaseRenewal) {
        self.renewing = false;
        if renewal == LeaseRenewal::Held {
            self.confirmed = self.sent;
        }
        self.next = match renewal {
            LeaseRenewal::Held | LeaseRenewal::Lost => now + self.every,
            LeaseRenewal::Failed => now + self.every.min(RETRY_FAILED_RENEWAL),
        };
    }
}

/// When the reader recovers idle (streams) or dead (reliable lists) consumers' entries.
#[derive(Debug)]
pub(super) struct Recovery {
    every: Duration,
    next: Instant,
}

impl Recovery {
    /// A reliable list recovers on its first read (its consumers may have died while nothing
    /// read the list); a stream first after one interval (its own pending entries come first).
    pub(super) fn new(kind: Kind, every: Duration, now: Instant) -> Self {
        let next = match kind {
            Kind::ReliableList => now,
            _ => now + every,
        };
        Self { every, next }
    }

    pub(super) fn due(&self, now: Instant) -> bool {
        now >= self.next
    }

    /// Whether the read starting now recovers first, and how long it may block: never past
    /// the next recovery, so that an idle subscription still recovers every interval.
    pub(super) fn for_read(&mut self, now: Instant, block: Duration) -> (bool, Duration) {
        let recover = self.due(now);
        if recover {
            self.next = now + self.every;
        }
        let until_next = self.next.saturating_duration_since(now);
        (recover, block.min(until_next).max(Duration::from_millis(1)))
    }
}
