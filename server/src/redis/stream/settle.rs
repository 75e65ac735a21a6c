//! How a stream subscription settles, retries and dead-letters: its part of every flush
//! plan (XACK or XACKDEL; a retry kept pending in its group, its due time in the group's delay
//! set; the dead-letter stream). Nothing it does appends to the stream, which every other group
//! of it reads.

use std::time::Duration;

use bytes::Bytes;

use crate::redis::flush::{FlushPlan, Requeued, Role, Settling, owned_step, owned_step_lua};

use super::{StreamKeys, pending_count};
use crate::domain::Entry;

/// Keeps entry ARGV[3] pending in group ARGV[1] of the stream KEYS[1], on consumer ARGV[2],
/// idle from now: `XCLAIM … RETRYCOUNT n JUSTID` (which alone counts nothing), `n` ARGV[4] or
/// the count Redis has if higher. Never lower: a higher count is a delivery made since by
/// whoever holds the consumer name now (this subscription's lease lapsed while Redis was
/// away), and a later delivery must not count below it. A `retry` passes its next delivery's
/// count (handed out again at once, from memory). With ARGV[5], a `retry_after`'s delay in
/// ms, it passes the count so far instead (its next delivery is counted once due, by
/// [`super::read::count_due`]: a sidecar that stops before then leaves nothing counted that
/// nobody saw) and the entry's id goes into the group's delay set KEYS[2] scored by its due
/// time (Redis's clock, which every reader of the set shares, plus the delay), which re-reads
/// and reclaims consult so that nobody delivers it early. Without, an earlier due time of it
/// is removed (refused, as for a delay set of the wrong type, the retry goes on: a due time
/// left behind only holds the entry back until then). An entry no longer pending on this
/// consumer (another consumer claimed it while this one could not reach Redis) is theirs,
/// and left alone: the reply is 0, else 1.
///
/// When Redis refuses: under `OOM`, `READONLY`, `NOPERM` for `EVAL` or a key, `BUSY` or a
/// slot that moved, the whole script (`#!lua`, every key declared) is refused before it
/// runs: the entry stays pending, its count and idle time as its delivery left them; the
/// flush names it as a refused requeue, and the subscription reads it again (a re-read of its
/// own pending entries, which counts that delivery), without the delay: its due time was not
/// written. Should the sidecar stop first, whoever reclaims it after `min_idle` delivers it. A
/// `ZADD` refused inside it (`WRONGTYPE`: the delay set's key holds something else; `NOPERM`
/// for `ZADD`) fails it before the `XCLAIM`, with the same result. A refused `XCLAIM` after
/// the `ZADD` (`NOPERM` for `XCLAIM` alone) leaves the due time written and the count as it
/// was: the re-read holds the entry until due.
pub(crate) const KEEP_IN_PLACE: &str = r#"#!lua
local row = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1, ARGV[2])[1]
if not row then return 0 end
if ARGV[5] then
  local now = redis.call('TIME')
  local due = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) + tonumber(ARGV[5])
  redis.call('ZADD', KEYS[2], due, ARGV[3])
else
  redis.pcall('ZREM', KEYS[2], ARGV[3])
end
local n = math.max(row[4], tonumber(ARGV[4]))
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'RETRYCOUNT', n, 'JUSTID')
return 1
"#;

impl Settling for StreamKeys {
    fn slot(&self) -> Option<u16> {
        Some(self.slot)
    }

    fn settles_in_redis(&self) -> bool {
        true
    }

    /// One XACK for all of them; under retention with `XACKDEL`, one `XACKDEL … ACKED`, which
    /// also deletes each entry no other group still needs.
    fn settle(&self, entries: &[&Entry], plan: &mut FlushPlan) {
        let mut args = vec![self.key.clone(), self.group.clone()];
        let name = if self.ack_delete {
            args.extend([
                Bytes::from_static(b"ACKED"),
                Bytes::from_static(b"IDS"),
                Bytes::from(entries.len().to_string()),
            ]);
            "XACKDEL"
        } else {
            "XACK"
        };
        args.extend(entries.iter().map(|e| e.id.clone()));
        plan.push(name, args, Role::Settle, Some(self.slot));
    }

    /// One [`SETTLE_OWNED`] script: an entry is requeued and settled only while it is pending
    /// on this consumer.
    fn settle_owned(&self, requeues: &[Requeued<'_>], plan: &mut FlushPlan) -> bool {
        let settle: &'static [u8] = if self.ack_delete { b"XACKDEL" } else { b"XACK" };
        let header = vec![
            self.group.clone(),
            self.consumer.clone(),
            Bytes::from_static(settle),
        ];
        let entries = requeues
            .iter()
            .map(|r| (r.entry.id.clone(), r.dead_letter, r.writes.clone()))
            .collect();
        plan.commands.push(owned_step(
            SETTLE_OWNED,
            self.slot,
            vec![self.key.clone()],
            header,
            entries,
        ));
        true
    }

    /// The entry stays pending on this consumer, its idle time reset: a `retry` with its next
    /// delivery counted, a `retry_after` with its due time kept in the group's delay set and
    /// counted once due ([`KEEP_IN_PLACE`]).
    fn keep_in_place(&self, entry: &Entry, delay: Option<Duration>, plan: &mut FlushPlan) {
        let count = pending_count(entry) + u32::from(delay.is_none());
        let mut args = vec![
            Bytes::from_static(KEEP_IN_PLACE.as_bytes()),
            Bytes::from_static(b"2"),
            self.key.clone(),
            self.due.clone(),
            self.group.clone(),
            self.consumer.clone(),
            entry.id.clone(),
            Bytes::from(count.to_string()),
        ];
        args.extend(delay.map(|d| Bytes::from(d.as_millis().to_string())));
        plan.push("EVAL", args, Role::KeepInPlace, Some(self.slot));
    }

    /// Never asked: the engine keeps every retry of a stream in place ([`Self::keep_in_place`]),
    /// since a copy appended to the stream would reach every other group of it.
    fn retry(&self, _entry: &Entry, _reason: Option<&str>, _plan: &mut FlushPlan) {
        unreachable!("a stream's retries are kept in place")
    }

    /// Never asked, as [`Self::retry`].
    fn retry_after(&self, _: &Entry, _: Option<&str>, _due_ms: u64, _plan: &mut FlushPlan) {
        unreachable!("a stream's retries are kept in place")
    }

    /// The entry's fields with where it came from, appended to the dead-letter stream.
    fn dead_letter(&self, entry: &Entry, reason: Option<&str>, plan: &mut FlushPlan) {
        let Some(target) = &self.dead_letter else {
            return;
        };
        let mut args = vec![target.clone(), Bytes::from_static(b"*")];
        let fields = entry.dead_letter_fields(&self.subscription, reason);
        args.extend(fields.into_iter().flat_map(|(f, v)| [f, v]));
        plan.push("XADD", args, Role::Requeue, Some(self.slot));
    }
}

/// The requeue step of a stream's flush, atomic as a `MULTI` would be, but for the entries
/// still pending on this consumer only. A sidecar that could not extend a delivery in time
/// (Redis out of its reach for `min_idle`) may flush it after another consumer claimed it:
/// that consumer now holds it, and a dead letter written here too would be a second one. Such
/// an entry is left alone, neither dead-lettered nor settled. (Retries never come here: they
/// stay pending, see [`KEEP_IN_PLACE`].)
///
/// KEYS[1] is the stream; ARGV as [`owned_step`] lays it out, with the group, the consumer and
/// the settle (`XACK` or `XACKDEL`) as its header; the entries still pending on this consumer
/// (`XPENDING`) are written ([`owned_step_lua`]), and those whose writes took effect are then
/// settled together.
///
/// When Redis refuses: the whole step under `OOM`, `READONLY`, `NOPERM` for `EVAL`, `BUSY` or
/// a slot that moved (nothing runs; every entry stays pending and is read again); a dead
/// letter refused inside it (`NOPERM` for `XADD`, `WRONGTYPE`) leaves that entry and every
/// later one pending, unsettled, and the entries before it settled with their writes. A
/// settle refused after the writes (an ACL without `XACK`) fails the script: the dead letters
/// written stand, the entries stay pending and come again beside them, a duplicate rather
/// than a loss.
pub(crate) const SETTLE_OWNED: &str = concat!(
    owned_step_lua!(),
    r#"
local key, group, consumer, settle = KEYS[1], ARGV[2], ARGV[3], ARGV[4]
local ours = {}
local reply = owned_step(function(id)
  return redis.call('XPENDING', key, group, id, id, 1, consumer)[1] ~= nil
end, function(id)
  ours[#ours + 1] = id
end)
for j = 1, #ours, 512 do
  local ids = {unpack(ours, j, math.min(j + 511, #ours))}
  if settle == 'XACKDEL' then
    redis.call('XACKDEL', key, group, 'ACKED', 'IDS', #ids, unpack(ids))
  else
    redis.call('XACK', key, group, unpack(ids))
  end
end
return reply
"#
);
