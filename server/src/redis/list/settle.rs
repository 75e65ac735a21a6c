//! How a list subscription settles, requeues and dead-letters: its part of every flush plan
//! (LREM from the processing list, retry copies, the delay set, the dead-letter list).

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
    /// effect. A simple list keeps no processing list, so nobody else can hold its entries: its
    /// writes go in a MULTI.
    fn settle_owned(&self, requeues: &[Requeued<'_>], plan: &mut FlushPlan) -> bool {
        if !self.reliable {
            return false;
        }
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
        plan.commands.push(owned_step(
            SETTLE_OWNED,
            self.slot,
            vec![self.processing.clone()],
            vec![],
            entries,
        ));
        true
    }

    /// The value stays on the processing list; the delivery that ends is recorded in the
    /// counts hash, as a re-read would.
    fn keep_in_place(&self, entry: &Entry, plan: &mut FlushPlan) {
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
