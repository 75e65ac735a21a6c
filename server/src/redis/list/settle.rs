//! How a list subscription settles, requeues and dead-letters: its part of every flush plan
//! (LREM from the processing list, retry copies, the delay set, the dead-letter list).

use std::time::Duration;

use bytes::Bytes;

use super::{ListKeys, value};
use crate::domain::{Entry, Framing, frame};
use crate::redis::delay;
use crate::redis::flush::{FlushPlan, Requeued, Role, Settling, owned_step, owned_step_lua};

impl Settling for ListKeys {
    fn slot(&self) -> Option<u16> {
        Some(self.slot)
    }

    fn settles_in_redis(&self) -> bool {
        self.reliable
    }

    /// One `LREM <processing> 1 <value>` per entry (reliable lists); identical values are
    /// interchangeable, so removing one occurrence per entry is exact.
    fn settle(&self, entries: &[&Entry], plan: &mut FlushPlan) {
        if self.reliable {
            for entry in entries {
                let args = vec![
                    self.processing.clone(),
                    Bytes::from_static(b"1"),
                    value(entry).clone(),
                ];
                plan.push("LREM", args, Role::Settle, Some(self.slot));
            }
        }
    }

    fn finished(&self, entries: &[&Entry], plan: &mut FlushPlan) {
        self.forget_counts(entries, plan);
    }

    /// One [`SETTLE_OWNED`] script on a reliable list: an entry is requeued only while its
    /// value is on this consumer's processing list, and taken off it only once its writes took
    /// effect. A simple list keeps no processing list, so nobody else can hold its entries:
    /// [`REQUEUE_POPPED`] writes them, and reports those it could not write, which the sidecar
    /// holds and gives back.
    fn settle_owned(&self, requeues: &[Requeued<'_>], plan: &mut FlushPlan) -> bool {
        let entries = requeues
            .iter()
            .map(|r| {
                let mut writes = r.writes.clone();
                if r.writes.is_empty() || r.dead_letter {
                    // What `finished` does for an entry settled for good, for this one alone.
                    let mut forget = FlushPlan::default();
                    self.forget_counts(&[r.entry], &mut forget);
                    writes.append(&mut forget.commands);
                }
                (value(r.entry).clone(), r.dead_letter, writes)
            })
            .collect();
        let (script, key) = if self.reliable {
            (SETTLE_OWNED, &self.processing)
        } else {
            (REQUEUE_POPPED, &self.key)
        };
        plan.commands.push(owned_step(
            script,
            self.slot,
            vec![key.clone()],
            vec![],
            entries,
        ));
        true
    }

    /// The value stays on the processing list; the delivery that ends is recorded in the
    /// counts hash, as a re-read would.
    fn keep_in_place(&self, entry: &Entry, _delay: Option<Duration>, plan: &mut FlushPlan) {
        plan.push(
            "HINCRBY",
            vec![
                self.counts.clone(),
                value(entry).clone(),
                Bytes::from_static(b"1"),
            ],
            Role::Bookkeeping,
            Some(self.slot),
        );
    }

    /// The value pushed back where producers push, before its LREM.
    fn retry(&self, entry: &Entry, reason: Option<&str>, plan: &mut FlushPlan) {
        plan.push(
            "LPUSH",
            vec![self.key.clone(), self.copy(entry, reason)],
            Role::Requeue,
            Some(self.slot),
        );
        self.recount(entry, plan);
    }

    fn retry_after(&self, entry: &Entry, reason: Option<&str>, due_ms: u64, plan: &mut FlushPlan) {
        let member = delay::encode(&delay::unique_token(), [self.copy(entry, reason)]);
        let args = vec![
            self.delayed.clone(),
            Bytes::from(due_ms.to_string()),
            member,
        ];
        plan.push("ZADD", args, Role::Requeue, Some(self.slot));
        self.recount(entry, plan);
    }

    /// A frame of the entry's payload and headers with where it came from, its deliveries and
    /// the reason, which ruststream-fred and the sidecar both read; the value as it was when
    /// the subscription reads values raw.
    fn dead_letter(&self, entry: &Entry, reason: Option<&str>, plan: &mut FlushPlan) {
        if let Some(target) = &self.dead_letter {
            let letter = match self.framing {
                Framing::Frames => {
                    frame::encode(&entry.dead_letter_fields(&self.subscription(), reason))
                }
                Framing::Raw => value(entry).clone(),
            };
            plan.push(
                "LPUSH",
                vec![target.clone(), letter],
                Role::Requeue,
                Some(self.slot),
            );
        }
    }
}

/// The requeue step of a reliable list's flush, atomic as a `MULTI` would be, but for the
/// entries still on this consumer's processing list only. A sidecar whose lease lapsed (Redis
/// out of its reach) may flush after another consumer recovered its processing list: the value
/// is back in the list or with that consumer, and a copy or dead letter written here too
/// would be a second one. Such an entry is left alone.
///
/// KEYS[1] is the processing list; ARGV as [`owned_step`] lays it out, with each entry's value
/// as its id and no header; an entry is this consumer's while its value is on the processing
/// list (`LPOS`), and its `LREM` runs only once its writes took effect ([`owned_step_lua`]).
///
/// When Redis refuses: the whole step under `OOM`, `READONLY`, `NOPERM` for `EVAL`, `BUSY` or
/// a slot that moved (nothing runs; every value stays on the processing list and is read
/// again); a copy, delay-set member or dead letter refused inside it (`NOPERM` for
/// `LPUSH`/`ZADD`, `WRONGTYPE`) leaves that value and every later requeued one on the
/// processing list, and the values before it settled with their writes.
pub(crate) const SETTLE_OWNED: &str = concat!(
    owned_step_lua!(),
    r#"
local reply = owned_step(function(value)
  return redis.call('LPOS', KEYS[1], value) ~= false
end, function(value)
  redis.call('LREM', KEYS[1], 1, value)
end)
return reply
"#
);

/// The requeue step of a simple list's flush: its entries left Redis when they were popped, so
/// every one is this subscription's and settling it needs nothing in Redis. KEYS[1] is the
/// list (for its slot); ARGV as [`owned_step`] lays it out.
///
/// When Redis refuses: the whole step under `OOM`, `READONLY`, `NOPERM` for `EVAL`, `BUSY` or
/// a slot that moved; a copy, delay-set member or dead letter refused inside it (`NOPERM` for
/// `LPUSH`/`ZADD`, `WRONGTYPE`) stops it there, as on a reliable list. Either way the reply
/// names the entries not written, and the sidecar holds them and pushes them back where they
/// were read (`RPUSH`, counted one delivery more) as soon as Redis takes that write: they are
/// delivered again, and their retry, delay or dead letter is written as asked once Redis
/// accepts it. Only a sidecar that stops while Redis still refuses loses them, as a crash
/// would (a simple list is at most once).
pub(crate) const REQUEUE_POPPED: &str = concat!(
    owned_step_lua!(),
    r#"
return owned_step(function() return true end, function() end)
"#
);
