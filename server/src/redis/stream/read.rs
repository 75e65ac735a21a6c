//! How a stream subscription reads: new entries, its own pending history after a failure,
//! entries claimed from idle consumers, the read-ahead a flush carries, and what it gives
//! back or extends of its pending entries.

use std::sync::LazyLock;
use std::time::Duration;

use bytes::Bytes;
use fred::prelude::*;
use fred::types::Resp3Frame;
use fred::types::scripts::Script;

use crate::redis::call::{call_frame_at, eval_script};
use crate::redis::entry::{Reply, into_bytes, parse_entries};
use crate::redis::flush::{Planned, Role};
use crate::redis::read_connection::ReadConnection;
use crate::redis::{RedisError, Replication, ReplicationWatch, arg, call_at, str_arg};

use super::{StreamKeys, create_group, group_start, pending_count};
use crate::domain::entry::Parked;
use crate::domain::{Entry, ReadBatch, StreamSource};

/// For each pair `id, n` in ARGV[3..], `{count, wait}`: its delivery count while it is pending on
/// consumer ARGV[2] of group ARGV[1] on the stream KEYS[1], else 0 (settled meanwhile, or
/// another consumer's); and the ms left until the `retry_after` due time the group's delay set
/// KEYS[2] holds for it, 0 when none is left (a re-read or a reclaim must not deliver it
/// before then). Nobody sees such an entry before it is due, so the count this read added is
/// taken back: it is counted when due ([`count_due`]), and a sidecar that crashes again and
/// again before then counts no deliveries nobody saw, up to the dead letter. `n` (`-` for no
/// cap) is the deliveries this entry may have in the group (`max_deliveries` less those its
/// copy carries from earlier attempts): one this read counts past `n` goes to the dead letter
/// without being delivered, so Redis keeps the count it had before the read, while the reply
/// still says the read's (past the cap is how the subscription knows, and its dead letter says
/// one less: see [`crate::redis::flush::plan_dead_letters`]). While Redis refuses the dead
/// letter (`OOM`, a key of the wrong type) each re-read after the refused flush, by whichever
/// reader of the group, would otherwise count one more, and the dead letter once written would
/// carry a count hundreds past the deliveries any client saw. Only this read's one is taken
/// back: a count raised by another consumer's deliveries stays. Each entry of this consumer is
/// also claimed again by it, its
/// count and idle time as they are (`XCLAIM … RETRYCOUNT n JUSTID`): a re-read of pending entries
/// (`XREADGROUP … 0`) renews both in memory only, Redis writing it to neither its AOF nor its
/// replicas, and a restart or failover would otherwise hand back an entry just delivered
/// again as idle since its first read, for another consumer to claim while it is being
/// handled. An `XCLAIM` is written to both.
///
/// When the group's delay set KEYS[2] is not a sorted set (a key of the wrong type) nobody can
/// tell which entries are due: the script takes back the count the read added to each entry and
/// replies with the type the key holds (a status reply, where a read's is an array), the read
/// fails with [`RedisError::DelaySetWrongType`], and its entries stay pending on this consumer
/// for the read tried again after a backoff. Without the take-back each read tried again would
/// count one more delivery nobody got, and a few seconds of the wrong type would send entries
/// to the dead letter unseen.
///
/// When Redis refuses the `XCLAIM` (`NOPERM`, `READONLY`; not `OOM`, which `XCLAIM` is not
/// subject to) the script fails and the read with it: the entries stay pending on this
/// consumer and are read again, the count that read added left as it is.
static RENEW_COUNTS: LazyLock<Script> = LazyLock::new(|| Script::from_lua(RENEW_COUNTS_LUA));

const RENEW_COUNTS_LUA: &str = r#"
local delays = redis.call('TYPE', KEYS[2])['ok']
if delays ~= 'zset' and delays ~= 'none' then
  for i = 3, #ARGV, 2 do
    local id = ARGV[i]
    local row = redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1, ARGV[2])[1]
    if row then
      local count = math.max(row[4] - 1, 1)
      redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, id, 'RETRYCOUNT', count, 'JUSTID')
    end
  end
  return redis.status_reply(delays)
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local counts = {}
for i = 3, #ARGV, 2 do
  local id = ARGV[i]
  local row = redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1, ARGV[2])[1]
  local wait, count = 0, 0
  if row then
    count = row[4]
    local kept = count
    if ARGV[i + 1] ~= '-' and count > tonumber(ARGV[i + 1]) then
      kept = count - 1
    end
    local due = redis.call('ZSCORE', KEYS[2], id)
    if due and tonumber(due) > now then
      wait = tonumber(due) - now
      count = math.max(count - 1, 1)
      kept = math.min(kept, count)
    end
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, id, 'RETRYCOUNT', kept, 'JUSTID')
  end
  counts[#counts + 1] = {count, wait}
end
return counts
"#;

/// Counts the next delivery of `retry_after`s kept in place now due: for each pair `id, n` in
/// ARGV[3..] (`n` the deliveries the subscription knows of), while the entry is pending on
/// consumer ARGV[2] of group ARGV[1] on the stream KEYS[1], `XCLAIM … RETRYCOUNT c JUSTID` with
/// `c` one past `n` or past the count Redis has if higher (a re-read under way counted it
/// meanwhile, and gives its own count back only while Redis still has it: the count may run
/// one ahead, never behind), and its due time leaves the group's delay set KEYS[2]. Replies
/// `c` per id, or 0 where the entry is no longer this consumer's (settled, or claimed by
/// another consumer): not delivered here.
///
/// When Redis refuses: the `XCLAIM` (`NOPERM`, `READONLY`; not `OOM`, which `XCLAIM` is not
/// subject to) fails the script, and nothing of it stays: the entries wait uncounted and ask
/// again after a backoff, pending on this consumer all the while. The `ZREM` is a `pcall`: a
/// due time left behind has passed, and holds nothing back.
static COUNT_DUE: LazyLock<Script> = LazyLock::new(|| {
    Script::from_lua(
        r#"
local counts = {}
for i = 3, #ARGV, 2 do
  local id = ARGV[i]
  local row = redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1, ARGV[2])[1]
  local count = 0
  if row then
    count = math.max(row[4], tonumber(ARGV[i + 1])) + 1
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, id, 'RETRYCOUNT', count, 'JUSTID')
    redis.pcall('ZREM', KEYS[2], id)
  end
  counts[#counts + 1] = count
end
return counts
"#,
    )
});

/// Each id in ARGV[3..] of the stream KEYS[1], in order: the entry `[id, fields]` while it is
/// pending on consumer ARGV[2] of group ARGV[1], else `[id, false]`: another consumer claimed
/// it (theirs now), or it is gone from the stream (acknowledged then: a pending entry deleted
/// cannot be delivered). XRANGE counts no delivery.
static FETCH: LazyLock<Script> = LazyLock::new(|| {
    Script::from_lua(
        r#"
local entries = {}
for i = 3, #ARGV do
  local id = ARGV[i]
  local entry = false
  if redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1, ARGV[2])[1] then
    entry = redis.call('XRANGE', KEYS[1], id, id)[1]
    if not entry then
      redis.call('XACK', KEYS[1], ARGV[1], id)
    end
  end
  entries[#entries + 1] = entry or {id, false}
end
return entries
"#,
    )
});

/// Where the next read comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Cursor {
    /// This consumer's own pending entries after this id.
    Pending(Bytes),
    /// New entries (`>`).
    New,
}

/// The entries of an XREADGROUP reply; ids of deleted entries (pending history only) go to
/// `deleted`.
fn parse_read(reply: Resp3Frame, deleted: &mut Vec<Bytes>) -> Result<Vec<Entry>, RedisError> {
    let Ok(streams) = reply.into_array() else {
        return Ok(Vec::new()); // nil: BLOCK timed out, or nothing new
    };
    let mut entries = Vec::new();
    for stream in streams {
        let Ok(pair) = stream.into_array() else {
            continue;
        };
        if let Some(list) = pair.into_iter().nth(1) {
            entries.extend(parse_entries("XREADGROUP", list, deleted)?);
        }
    }
    Ok(entries)
}

/// New entries are on their first delivery, unless they are retry copies.
fn first_deliveries(entries: &mut [Entry]) {
    for entry in entries {
        entry.delivery_count = 1 + entry.earlier_attempts();
    }
}

/// A read of new entries to send at the end of a flush's pipeline, so that under a backlog a
/// read costs no round trip of its own. Without BLOCK: it never holds the pool connection.
pub(crate) fn read_ahead(keys: &StreamKeys, count: u32) -> Planned {
    Planned {
        hash_slot: Some(keys.slot),
        ..Planned::new(
            "XREADGROUP",
            vec![
                Bytes::from_static(b"GROUP"),
                keys.group.clone(),
                keys.consumer.clone(),
                Bytes::from_static(b"COUNT"),
                Bytes::from(count.to_string()),
                Bytes::from_static(b"STREAMS"),
                keys.key.clone(),
                Bytes::from_static(b">"),
            ],
            Role::ReadAhead,
        )
    }
}

/// The reply of a [`read_ahead`] as a read.
pub(crate) fn read_ahead_batch(reply: Resp3Frame) -> Result<ReadBatch, RedisError> {
    // `>` delivers entries that exist: deleted ones show only in pending history.
    let mut deleted = Vec::new();
    let mut entries = parse_read(reply, &mut deleted)?;
    first_deliveries(&mut entries);
    Ok(ReadBatch {
        entries,
        ..Default::default()
    })
}

/// The reply of a [`read_ahead`] as a read; `Err` with whether Redis may have delivered
/// entries no reply named (no reply came).
pub(crate) fn read_ahead_reply(
    reply: Result<Resp3Frame, fred::error::Error>,
) -> Result<ReadBatch, (RedisError, bool)> {
    match reply {
        Ok(reply) => read_ahead_batch(reply).map_err(|err| (err, false)),
        Err(err) => Err((
            RedisError::from_fred("XREADGROUP", &err),
            crate::redis::flush::unanswered(&err),
        )),
    }
}

/// Redelivered entries with their counts from the group's pending entries list, and apart
/// from them those whose `retry_after` is not due yet, with the time left ([`RENEW_COUNTS`]'s
/// reply). An entry gone from this consumer's part of that list between the read and the
/// look-up was settled meanwhile (acked by a flush of an earlier delivery), or another
/// consumer claimed it: it is not delivered again, where it would otherwise come back with a
/// count of 1, lower than the count of the delivery that settled it, or be handled by two
/// consumers at once.
pub(super) fn counted(
    entries: Vec<Entry>,
    counts: Vec<Value>,
) -> (Vec<Entry>, Vec<(Entry, Duration)>) {
    let mut due = Vec::with_capacity(entries.len());
    let mut delayed = Vec::new();
    for (mut entry, reply) in entries.into_iter().zip(counts) {
        let (count, wait) = match reply {
            Value::Array(pair) => (
                pair.first().and_then(Value::as_u64).unwrap_or(0),
                pair.get(1).and_then(Value::as_u64).unwrap_or(0),
            ),
            _ => (0, 0),
        };
        if count == 0 {
            continue;
        }
        entry.delivery_count = count as u32 + entry.earlier_attempts();
        if wait > 0 {
            delayed.push((entry, Duration::from_millis(wait)));
        } else {
            due.push(entry);
        }
    }
    (due, delayed)
}

/// Claims to consumer ARGV[2] of group ARGV[1] on the stream KEYS[1] each id of the pairs
/// `id, retry count` in ARGV[3..] (`-`: the count untouched), idle from now, but only those
/// still pending on that consumer: an entry another consumer claimed meanwhile is theirs, and
/// a bare `XCLAIM … 0` would take it back from under them. A retry count `n` is set only
/// while Redis counts `n + 1`, the delivery it takes back: a higher count is a delivery made
/// since (a re-read of the consumer's pending entries by whoever holds its name now), which
/// taking back would let a later delivery count lower than one a client already saw. Returns
/// how many it claimed.
static CLAIM_OWN: LazyLock<Script> = LazyLock::new(|| {
    Script::from_lua(
        r#"
local claimed = 0
for i = 3, #ARGV, 2 do
  local id = ARGV[i]
  local row = redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1, ARGV[2])[1]
  if row then
    if ARGV[i + 1] == '-' then
      redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, id, 'JUSTID')
      claimed = claimed + 1
    elseif row[4] == tonumber(ARGV[i + 1]) + 1 then
      redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, id, 'RETRYCOUNT', ARGV[i + 1], 'JUSTID')
      claimed = claimed + 1
    end
  end
end
return claimed
"#,
    )
});

/// Ids a [`CLAIM_OWN`] call takes at most: one script call holds Redis for all of them.
const CLAIM_BATCH: usize = 1024;

/// Claims these ids back to this consumer with their retry counts (see [`CLAIM_OWN`]).
async fn claim_own(
    client: &Client,
    keys: &StreamKeys,
    ids: Vec<(Bytes, Option<u32>)>,
) -> Result<(), RedisError> {
    for batch in ids.chunks(CLAIM_BATCH) {
        let mut args = vec![
            Value::Bytes(keys.group.clone()),
            Value::Bytes(keys.consumer.clone()),
        ];
        for (id, retry_count) in batch {
            args.push(Value::Bytes(id.clone()));
            args.push(match retry_count {
                Some(n) => Value::Integer((*n).into()),
                None => str_arg("-"),
            });
        }
        let _: Value = CLAIM_OWN
            .evalsha_with_reload(client, vec![Key::from(keys.key.clone())], args)
            .await
            .map_err(|e| RedisError::from_fred("EVALSHA", &e))?;
    }
    Ok(())
}

/// Takes back the delivery a read made of entries nobody got: each stays pending on this
/// consumer with its count one lower (`XCLAIM … RETRYCOUNT n JUSTID`), so its next delivery
/// counts as if that read had not happened. An entry settled meanwhile, claimed by another
/// consumer, or delivered again since (its count past the entry's) is left alone: a count may
/// run ahead of the deliveries a client saw, never behind.
pub(crate) async fn uncount(
    client: &Client,
    keys: &StreamKeys,
    entries: &[&Entry],
) -> Result<(), RedisError> {
    let ids = entries
        .iter()
        .map(|entry| {
            (
                entry.id.clone(),
                Some(pending_count(entry).saturating_sub(1)),
            )
        })
        .collect();
    claim_own(client, keys, ids).await
}

/// Counts the next delivery of these `retry_after`s, now due ([`COUNT_DUE`]): each as that
/// delivery sees it, or `None` where it is no longer this consumer's.
pub(crate) async fn count_due(
    client: &Client,
    keys: &StreamKeys,
    entries: &[&Entry],
) -> Result<Vec<Option<Entry>>, RedisError> {
    let mut args = vec![
        Value::Bytes(keys.group.clone()),
        Value::Bytes(keys.consumer.clone()),
    ];
    for entry in entries {
        args.push(Value::Bytes(entry.id.clone()));
        args.push(Value::Integer(pending_count(entry).into()));
    }
    let stream_keys = vec![Key::from(keys.key.clone()), Key::from(keys.due.clone())];
    let counts: Vec<u64> = COUNT_DUE
        .evalsha_with_reload(client, stream_keys, args)
        .await
        .map_err(|e| RedisError::from_fred("EVALSHA", &e))?;
    Ok(entries
        .iter()
        .zip(counts)
        .map(|(entry, count)| {
            (count > 0).then(|| Entry {
                delivery_count: count as u32 + entry.earlier_attempts(),
                ..Entry::clone(entry)
            })
        })
        .collect())
}

/// Makes pending entries of this consumer idle again, without a delivery counted (`JUSTID`):
/// another consumer's `XAUTOCLAIM` waits a whole `min_idle` from now. An entry another
/// consumer claimed meanwhile stays theirs.
pub(crate) async fn extend(
    client: &Client,
    keys: &StreamKeys,
    entries: &[&Entry],
) -> Result<(), RedisError> {
    let ids = entries.iter().map(|e| (e.id.clone(), None)).collect();
    claim_own(client, keys, ids).await
}

/// Fetches entries parked by an ordered subscription by id, in one round trip, as they were
/// when parked (their counts untouched): `None` where one is no longer this consumer's (gone
/// from the stream, which settles it, or claimed by another consumer).
pub(crate) async fn fetch(
    client: &Client,
    keys: &StreamKeys,
    parked: &[Parked],
) -> Result<Vec<Option<Entry>>, RedisError> {
    let mut args = vec![
        Value::Bytes(keys.group.clone()),
        Value::Bytes(keys.consumer.clone()),
    ];
    args.extend(parked.iter().map(|p| Value::Bytes(p.id())));
    let reply: Value = FETCH
        .evalsha_with_reload(client, vec![Key::from(keys.key.clone())], args)
        .await
        .map_err(|e| RedisError::from_fred("EVALSHA", &e))?;
    let mut deleted = Vec::new();
    let mut entries = parse_entries("XRANGE", reply, &mut deleted)?
        .into_iter()
        .peekable();
    Ok(parked
        .iter()
        .map(|p| {
            let mut entry = entries.next_if(|e| e.id == p.id())?;
            entry.delivery_count = p.delivery_count;
            Some(entry)
        })
        .collect())
}

/// Reads one stream subscription on its dedicated connection.
pub(crate) struct StreamReader {
    connection: ReadConnection,
    keys: StreamKeys,
    /// Where a group lost in a failover is created again: the open's start id.
    start: Bytes,
    /// A read failed since the last that succeeded (the connection or its node went away).
    interrupted: bool,
    /// The dedicated connection's reconnections (fred retries a read on the new connection).
    reconnects: tokio::sync::broadcast::Receiver<fred::types::config::Server>,
    min_idle: Duration,
    /// The subscription's `max_deliveries` (0: none).
    max_deliveries: u32,
    cursor: Cursor,
    claim_cursor: Bytes,
    replication: Option<Replication>,
    replication_watch: ReplicationWatch,
}

impl StreamReader {
    /// The dedicated connection the reads block on.
    pub(crate) fn connection(&self) -> &ReadConnection {
        &self.connection
    }

    /// A reader that first delivers the consumer's own pending entries.
    pub(crate) fn new(
        connection: ReadConnection,
        source: &StreamSource,
        max_deliveries: u32,
        replication: Option<Replication>,
    ) -> Self {
        Self {
            replication,
            replication_watch: ReplicationWatch::default(),
            reconnects: connection.client().reconnect_rx(),
            connection,
            keys: StreamKeys::new(source),
            start: Bytes::copy_from_slice(group_start(source).as_bytes()),
            interrupted: false,
            min_idle: source.min_idle,
            max_deliveries,
            cursor: Cursor::Pending(Bytes::from_static(b"0")),
            claim_cursor: Bytes::from_static(b"0-0"),
        }
    }

    /// Makes the next reads go through this consumer's pending entries again (after a
    /// settle failed, so its entries come back).
    pub(crate) fn reread_pending(&mut self) {
        self.cursor = Cursor::Pending(Bytes::from_static(b"0"));
    }

    /// One read of up to `count` entries: claimed idle entries first when `reclaim`, then this
    /// consumer's own pending entries, then new ones, blocking up to `block` when none are
    /// there.
    pub(crate) async fn read(
        &mut self,
        count: u32,
        block: Duration,
        reclaim: bool,
    ) -> Result<ReadBatch, RedisError> {
        let read = match self.read_once(count, block, reclaim).await {
            Err(RedisError::Refused { message, .. })
                if message.starts_with("NOGROUP") && (self.reconnected() || self.interrupted) =>
            {
                // Missing after this reader lost its node: created so shortly before a
                // failover that the new primary never got it, with the history since. Created
                // again at the start id, that history is delivered again (at least once); on a
                // node that never went away, the group was deleted, and the read fails.
                tracing::warn!(
                    start = %String::from_utf8_lossy(&self.start),
                    "the consumer group was lost with the node that had it; creating it again"
                );
                create_group(&self.connection.commands(None), &self.keys, &self.start).await?;
                self.reread_pending();
                self.read_once(count, block, reclaim).await
            }
            read => read,
        };
        self.interrupted = matches!(
            read,
            Err(RedisError::Unavailable(_) | RedisError::Timeout(_))
        );
        if let Err(err) = &read
            && self.connection.follow(err).await
        {
            // A node the slot left may have lost the group with it (a failover).
            self.reconnects = self.connection.client().reconnect_rx();
            self.interrupted = true;
        }
        if read.is_ok() {
            self.reconnected();
        }
        read
    }

    /// Whether the connection was made again since this was last asked.
    fn reconnected(&mut self) -> bool {
        use tokio::sync::broadcast::error::TryRecvError;
        let mut any = false;
        loop {
            match self.reconnects.try_recv() {
                Ok(_) | Err(TryRecvError::Lagged(_)) => any = true,
                Err(TryRecvError::Empty | TryRecvError::Closed) => return any,
            }
        }
    }

    async fn read_once(
        &mut self,
        count: u32,
        block: Duration,
        reclaim: bool,
    ) -> Result<ReadBatch, RedisError> {
        let mut batch = ReadBatch::default();
        if reclaim {
            batch.claims += 1;
            let claimed = self.autoclaim(count).await?;
            if !claimed.is_empty() {
                batch.claimed = claimed.len();
                batch.count_lookups += 1;
                (batch.entries, batch.delayed) = self.with_delivery_counts(claimed).await?;
                self.replicate().await?;
                batch.redelivery = true;
                return Ok(batch);
            }
        }
        if let Cursor::Pending(after) = &self.cursor {
            let after = after.clone();
            batch.reads += 1;
            let entries = self.xreadgroup(count, None, after).await?;
            match entries.last() {
                Some(last) => {
                    self.cursor = Cursor::Pending(last.id.clone());
                    batch.count_lookups += 1;
                    (batch.entries, batch.delayed) = self.with_delivery_counts(entries).await?;
                    self.replicate().await?;
                    batch.redelivery = true;
                    return Ok(batch);
                }
                None => self.cursor = Cursor::New,
            }
        }
        batch.reads += 1;
        batch.entries = self
            .xreadgroup(count, Some(block), Bytes::from_static(b">"))
            .await?;
        if !batch.entries.is_empty() {
            self.replicate().await?;
        }
        first_deliveries(&mut batch.entries);
        Ok(batch)
    }

    /// Waits until the configured replicas have this reader's claims.
    async fn replicate(&mut self) -> Result<(), RedisError> {
        match &self.replication {
            Some(replication) => {
                self.replication_watch
                    .wait(
                        self.connection.client(),
                        self.keys.slot,
                        replication,
                        self.connection.give_up_after(replication.timeout),
                    )
                    .await
            }
            None => Ok(()),
        }
    }

    async fn xreadgroup(
        &self,
        count: u32,
        block: Option<Duration>,
        id: Bytes,
    ) -> Result<Vec<Entry>, RedisError> {
        let mut args = vec![
            str_arg("GROUP"),
            arg(&self.keys.group),
            arg(&self.keys.consumer),
            str_arg("COUNT"),
            Value::Integer(count.into()),
        ];
        if let Some(block) = block {
            args.push(str_arg("BLOCK"));
            args.push(Value::Integer(block.as_millis().max(1) as i64));
        }
        args.extend([str_arg("STREAMS"), arg(&self.keys.key), Value::Bytes(id)]);
        let slot = Some(self.keys.slot);
        let reply = call_frame_at(
            &self.connection.commands(block),
            "XREADGROUP",
            args,
            block.is_some(),
            slot,
        )
        .await?;
        let mut deleted = Vec::new();
        let entries = parse_read(reply, &mut deleted)?;
        self.ack_deleted(deleted).await?;
        Ok(entries)
    }

    /// Claims entries idle longer than `min_idle` from any consumer of the group.
    async fn autoclaim(&mut self, count: u32) -> Result<Vec<Entry>, RedisError> {
        let args = vec![
            arg(&self.keys.key),
            arg(&self.keys.group),
            arg(&self.keys.consumer),
            Value::Integer(self.min_idle.as_millis() as i64),
            Value::Bytes(self.claim_cursor.clone()),
            str_arg("COUNT"),
            Value::Integer(count.into()),
        ];
        let reply = call_at(
            &self.connection.commands(None),
            "XAUTOCLAIM",
            args,
            false,
            Some(self.keys.slot),
        )
        .await?;
        let Value::Array(parts) = reply else {
            return Err(RedisError::Protocol {
                command: "XAUTOCLAIM",
                detail: "reply is not an array".into(),
            });
        };
        let mut parts = parts.into_iter();
        self.claim_cursor = parts
            .next()
            .and_then(into_bytes)
            .unwrap_or_else(|| Bytes::from_static(b"0-0"));
        let mut deleted = Vec::new();
        let entries = match parts.next() {
            Some(list) => parse_entries("XAUTOCLAIM", list, &mut deleted)?,
            None => Vec::new(),
        };
        // Redis 7 removes deleted entries from the pending list itself and lists them third.
        Ok(entries)
    }

    /// Fills in the delivery counts of redelivered entries from the group's pending entries
    /// list, each looked up by its own id (one script, one round trip: a range look-up would
    /// also return this consumer's other pending entries between them and miss some), and
    /// makes their renewal durable ([`RENEW_COUNTS`]). Entries no longer this consumer's are
    /// not delivered; those whose `retry_after` is not due yet come apart, with the time left.
    async fn with_delivery_counts(
        &self,
        entries: Vec<Entry>,
    ) -> Result<(Vec<Entry>, Vec<(Entry, Duration)>), RedisError> {
        if entries.is_empty() {
            return Ok((entries, Vec::new()));
        }
        let keys = vec![arg(&self.keys.key), arg(&self.keys.due)];
        let mut args = vec![
            Value::Bytes(self.keys.group.clone()),
            Value::Bytes(self.keys.consumer.clone()),
        ];
        for entry in &entries {
            args.push(Value::Bytes(entry.id.clone()));
            args.push(match self.max_deliveries {
                0 => str_arg("-"),
                max => Value::Integer(i64::from(max.saturating_sub(entry.earlier_attempts()))),
            });
        }
        let commands = self.connection.commands(None);
        let reply = eval_script(&commands, &RENEW_COUNTS, self.keys.slot, keys, args).await?;
        match reply {
            Value::Array(counts) => Ok(counted(entries, counts)),
            Value::String(holds) => Err(RedisError::DelaySetWrongType {
                key: String::from_utf8_lossy(&self.keys.due).into_owned(),
                holds: holds.to_string(),
            }),
            _ => Err(RedisError::Protocol {
                command: "XPENDING",
                detail: "the counts are not an array".into(),
            }),
        }
    }

    /// Entries deleted from the stream while pending cannot be delivered: settle them.
    async fn ack_deleted(&self, deleted: Vec<Bytes>) -> Result<(), RedisError> {
        if deleted.is_empty() {
            return Ok(());
        }
        let mut args = vec![arg(&self.keys.key), arg(&self.keys.group)];
        args.extend(deleted.into_iter().map(Value::Bytes));
        call_at(
            &self.connection.commands(None),
            "XACK",
            args,
            false,
            Some(self.keys.slot),
        )
        .await
        .map(|_| ())
    }

    /// Closes the dedicated connection.
    pub(crate) async fn close(self) {
        self.connection.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::ReadError;
    use crate::redis::form::read_error;

    /// The delay set of the wrong type is the sidecar's own key: the subscription tries the read
    /// again. Redis's own `WRONGTYPE` on the stream ends it.
    #[test]
    fn a_delay_set_of_the_wrong_type_is_tried_again_the_stream_of_the_wrong_type_is_not() {
        let delays = RedisError::DelaySetWrongType {
            key: "{s}:window:delayed:g".into(),
            holds: "string".into(),
        };
        assert!(matches!(read_error(&delays), ReadError::Retry { .. }));
        let stream = RedisError::Refused {
            command: "EVALSHA".into(),
            message: "WRONGTYPE Operation against a key holding the wrong kind of value".into(),
        };
        assert!(matches!(read_error(&stream), ReadError::Fatal(_)));
    }
}
