//! How a list subscription reads: values taken onto its processing list (reliable) or
//! popped (simple), a dead consumer's processing list recovered, and values given back.

use std::collections::VecDeque;
use std::sync::LazyLock;
use std::time::Duration;

use bytes::Bytes;
use fred::prelude::*;
use fred::types::scripts::Script;

use super::{ListKeys, entry, value};
use crate::domain::{Entry, ReadBatch};
use crate::redis::call::eval_script;
use crate::redis::entry::into_bytes;
use crate::redis::read_connection::ReadConnection;
use crate::redis::{RedisError, Replication, ReplicationWatch, arg, call_at};

/// Moves (reliable) or pops (simple) up to ARGV[1] entries and returns each value with its
/// earlier deliveries: one round trip per read.
static TAKE: LazyLock<Script> = LazyLock::new(|| {
    Script::from_lua(
        r#"
local out = {}
for _ = 1, tonumber(ARGV[1]) do
  local v
  if ARGV[2] == '1' then
    v = redis.call('LMOVE', KEYS[1], KEYS[2], 'RIGHT', 'LEFT')
  else
    v = redis.call('RPOP', KEYS[1])
  end
  if not v then break end
  out[#out + 1] = v
  out[#out + 1] = redis.call('HGET', KEYS[3], v) or '0'
end
return out
"#,
    )
});

/// Moves a dead consumer's processing list back to the consumer end of the list, oldest
/// first, one atomic LMOVE each, counting a delivery for each; forgets the consumer once its
/// list is empty.
static RECOVER: LazyLock<Script> = LazyLock::new(|| {
    Script::from_lua(
        r#"
local moved = 0
for _ = 1, tonumber(ARGV[2]) do
  local v = redis.call('LMOVE', KEYS[1], KEYS[2], 'RIGHT', 'RIGHT')
  if not v then break end
  redis.call('HINCRBY', KEYS[3], v, 1)
  moved = moved + 1
end
if redis.call('LLEN', KEYS[1]) == 0 then
  redis.call('SREM', KEYS[4], ARGV[1])
end
return moved
"#,
    )
});

/// Moves values of a reliable list that a read took but nobody got from the processing list
/// KEYS[1] back to the consumer end of the list KEYS[2], newest first, so the oldest is read
/// first again; their counts are untouched (taking them counted nothing).
///
/// When Redis refuses: the whole script under `OOM` or on a replica (it says `#!lua`, no
/// flags), every value stays on the processing list; a value's `RPUSH` refused (`NOPERM`,
/// `WRONGTYPE`) ends the script before that value's `LREM`: it and the values after it stay on
/// the processing list, this consumer's, and are read again, the ones before it moved. A value
/// is taken off the processing list only once its copy is back in the list (a refused `LREM`
/// after it leaves it in both: a duplicate, never a loss).
static UNTAKE: LazyLock<Script> = LazyLock::new(|| {
    Script::from_lua(
        r#"#!lua
for i = 1, #ARGV do
  if redis.call('LPOS', KEYS[1], ARGV[i]) then
    redis.call('RPUSH', KEYS[2], ARGV[i])
    redis.call('LREM', KEYS[1], 1, ARGV[i])
  end
end
return #ARGV
"#,
    )
});

/// Gives entries back to the list as if they had not been taken. A simple list's popped
/// entries go back to its consumer end in their order, counted when the client had them
/// (`seen`: abandoned, not settled). A reliable list's entries that nobody got leave the
/// processing list the same way; seen ones stay there, pending on this consumer.
pub(crate) async fn give_back(
    client: &Client,
    keys: &ListKeys,
    entries: &[&Entry],
    seen: bool,
) -> Result<(), RedisError> {
    if entries.is_empty() || (keys.reliable && seen) {
        return Ok(());
    }
    // The first entry read was the rightmost: pushed back last, it is rightmost again.
    let newest_first = entries.iter().rev().map(|e| arg(value(e)));
    if keys.reliable {
        let _: Value = UNTAKE
            .evalsha_with_reload(
                client,
                vec![
                    Key::from(keys.processing.clone()),
                    Key::from(keys.key.clone()),
                ],
                newest_first.collect::<Vec<_>>(),
            )
            .await
            .map_err(|e| RedisError::from_fred("EVALSHA", &e))?;
        return Ok(());
    }
    // The delivery each seen one had is recorded with it, so a client that keeps crashing on
    // an entry sees its count rise and the cap catches it.
    let mut args = vec![Value::from(if seen { "1" } else { "0" })];
    args.extend(newest_first);
    let _: Value = GIVE_BACK_POPPED
        .evalsha_with_reload(
            client,
            vec![Key::from(keys.key.clone()), Key::from(keys.counts.clone())],
            args,
        )
        .await
        .map_err(|e| RedisError::from_fred("EVALSHA", &e))?;
    Ok(())
}

/// Pushes a simple list's popped values ARGV[2..] (newest first) back to the consumer end of
/// the list KEYS[1] and, when ARGV[1] is `1` (the client had them), counts the delivery each
/// had in the counts hash KEYS[2].
///
/// When Redis refuses: the whole script under `OOM` or on a replica (`#!lua`, no flags), and a
/// refused `RPUSH` (`NOPERM`, `WRONGTYPE`) before anything else: nothing is pushed or counted,
/// and the sidecar, which alone has the values, holds them and tries again; its tries count
/// nothing until one succeeds. A count refused after the push loses that count, not a value.
static GIVE_BACK_POPPED: LazyLock<Script> = LazyLock::new(|| {
    Script::from_lua(
        r#"#!lua
for i = 2, #ARGV do
  redis.call('RPUSH', KEYS[1], ARGV[i])
end
if ARGV[1] == '1' then
  for i = 2, #ARGV do
    redis.call('HINCRBY', KEYS[2], ARGV[i], 1)
  end
end
return #ARGV - 1
"#,
    )
});

/// Records the delivery of a value ARGV[1] re-read from this consumer's processing list in the
/// counts hash KEYS[1] and replies the count it now has, unless the count is ARGV[2] already
/// (-1: no cap): the count at which the value is past the subscription's `max_deliveries`, so
/// the value goes to the dead letter without being delivered and a further re-read delivers
/// nothing either. While Redis refuses the dead letter (`OOM`, a key of the wrong type) each
/// re-read after the refused flush would otherwise count one more, and the dead letter once
/// written would carry a count far past the deliveries any client saw.
///
/// When Redis refuses the `HINCRBY` (`OOM`, `NOPERM`, `READONLY`) the script fails and the
/// read with it: the values stay on the processing list and are read again.
static COUNT_REREAD: LazyLock<Script> = LazyLock::new(|| {
    Script::from_lua(
        r#"
local limit = tonumber(ARGV[2])
local n = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
if limit >= 0 and n >= limit then
  return n
end
return redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
"#,
    )
});

/// Reads one list subscription on its dedicated connection.
pub(crate) struct ListReader {
    connection: ReadConnection,
    keys: ListKeys,
    /// Entries of this consumer's processing list left by its previous run, oldest first,
    /// delivered before anything new.
    own: Option<VecDeque<Entry>>,
    /// The subscription's `max_deliveries` (0: none), past which a re-read counts no more.
    max_deliveries: u32,
    replication: Option<Replication>,
    replication_watch: ReplicationWatch,
}

impl ListReader {
    /// The dedicated connection the reads block on.
    pub(crate) fn connection(&self) -> &ReadConnection {
        &self.connection
    }

    pub(crate) fn new(
        connection: ReadConnection,
        keys: ListKeys,
        max_deliveries: u32,
        replication: Option<Replication>,
    ) -> Self {
        Self {
            replication,
            replication_watch: ReplicationWatch::default(),
            connection,
            keys,
            own: None,
            max_deliveries,
        }
    }

    /// One command on the list's slot; `block`: how long it may wait in Redis, if blocking.
    async fn call(
        &self,
        name: &'static str,
        args: Vec<Value>,
        block: Option<Duration>,
    ) -> Result<Value, RedisError> {
        call_at(
            &self.connection.commands(block),
            name,
            args,
            block.is_some(),
            Some(self.keys.slot),
        )
        .await
    }

    /// Makes the next read deliver this consumer's processing list again.
    pub(crate) fn reread_own(&mut self) {
        if self.keys.reliable {
            self.own = None;
        }
    }

    /// One read of up to `count` entries: a reliable list's own processing list first, then
    /// (when `recover`) dead consumers' entries are moved back, then new entries, blocking up
    /// to `block` when the list is empty.
    pub(crate) async fn read(
        &mut self,
        count: u32,
        block: Duration,
        recover: bool,
    ) -> Result<ReadBatch, RedisError> {
        let read = self.read_once(count, block, recover).await;
        if let Err(err) = &read {
            self.connection.follow(err).await;
        }
        read
    }

    async fn read_once(
        &mut self,
        count: u32,
        block: Duration,
        recover: bool,
    ) -> Result<ReadBatch, RedisError> {
        let mut batch = ReadBatch::default();
        if self.keys.reliable {
            if self.own.is_none() {
                batch.reads += 1;
                self.own = Some(self.own_entries().await?);
            }
            if let Some(own) = self.own.as_mut().filter(|own| !own.is_empty()) {
                let n = (count as usize).min(own.len());
                batch.entries = own.drain(..n).collect();
                batch.redelivery = true;
                return Ok(batch);
            }
            if recover {
                batch.claims += 1;
                batch.claimed = self.recover_dead().await?;
            }
        }
        batch.reads += 1;
        batch.entries = self.take(count).await?;
        if batch.entries.is_empty() {
            batch.reads += 1;
            batch.entries = self.take_blocking(block).await?;
        }
        if !batch.entries.is_empty()
            && let Some(replication) = &self.replication
        {
            self.replication_watch
                .wait(
                    self.connection.client(),
                    self.keys.slot,
                    replication,
                    self.connection.give_up_after(replication.timeout),
                )
                .await?;
        }
        Ok(batch)
    }

    async fn own_entries(&self) -> Result<VecDeque<Entry>, RedisError> {
        let reply = self
            .call(
                "LRANGE",
                vec![
                    arg(&self.keys.processing),
                    Value::Integer(0),
                    Value::Integer(-1),
                ],
                None,
            )
            .await?;
        let Value::Array(values) = reply else {
            return Ok(VecDeque::new());
        };
        // The processing list's right end holds the oldest entry.
        let values: Vec<Bytes> = values.into_iter().rev().filter_map(into_bytes).collect();
        let mut entries = VecDeque::with_capacity(values.len());
        for value in values {
            // The delivery that moved it here was not recorded (that would cost a write per
            // delivery): record it now, so a consumer that keeps crashing on an entry sees its
            // count rise and the cap can catch it.
            let attempts = Entry::of_value(value.clone(), self.keys.framing).earlier_attempts();
            // Past the cap at `max_deliveries - attempts` recorded (see `entry`).
            let limit = match self.max_deliveries {
                0 => -1,
                cap => i64::from(cap.saturating_sub(attempts)),
            };
            let keys = vec![arg(&self.keys.counts)];
            let args = vec![arg(&value), Value::Integer(limit)];
            let commands = self.connection.commands(None);
            let earlier = eval_script(&commands, &COUNT_REREAD, self.keys.slot, keys, args)
                .await?
                .as_u64()
                .unwrap_or(1) as u32;
            entries.push_back(entry(value, earlier, self.keys.framing));
        }
        Ok(entries)
    }

    async fn counts(&self, values: &[Bytes]) -> Result<Vec<u32>, RedisError> {
        if values.is_empty() {
            return Ok(Vec::new());
        }
        let mut args = vec![arg(&self.keys.counts)];
        args.extend(values.iter().map(arg));
        let Value::Array(counts) = self.call("HMGET", args, None).await? else {
            return Ok(vec![0; values.len()]);
        };
        Ok(counts
            .into_iter()
            .map(|c| c.as_u64().unwrap_or(0) as u32)
            .collect())
    }

    async fn take(&self, count: u32) -> Result<Vec<Entry>, RedisError> {
        let keys = vec![
            arg(&self.keys.key),
            arg(&self.keys.processing),
            arg(&self.keys.counts),
        ];
        let reliable = if self.keys.reliable { "1" } else { "0" };
        let args = vec![Value::from(count), Value::from(reliable)];
        let commands = self.connection.commands(None);
        let reply = eval_script(&commands, &TAKE, self.keys.slot, keys, args).await?;
        let Value::Array(flat) = reply else {
            return Ok(Vec::new());
        };
        let mut entries = Vec::with_capacity(flat.len() / 2);
        let mut flat = flat.into_iter();
        while let (Some(v), Some(c)) = (flat.next(), flat.next()) {
            let earlier = c.as_u64().unwrap_or(0) as u32;
            if let Some(v) = into_bytes(v) {
                entries.push(entry(v, earlier, self.keys.framing));
            }
        }
        Ok(entries)
    }

    /// One blocking move or pop, when the list is empty.
    async fn take_blocking(&self, block: Duration) -> Result<Vec<Entry>, RedisError> {
        let timeout = Value::Double(block.as_secs_f64().max(0.001));
        let value = if self.keys.reliable {
            let args = vec![
                arg(&self.keys.key),
                arg(&self.keys.processing),
                Value::from("RIGHT"),
                Value::from("LEFT"),
                timeout,
            ];
            into_bytes(self.call("BLMOVE", args, Some(block)).await?)
        } else {
            match self
                .call("BRPOP", vec![arg(&self.keys.key), timeout], Some(block))
                .await?
            {
                Value::Array(pair) => pair.into_iter().nth(1).and_then(into_bytes),
                _ => None,
            }
        };
        let Some(value) = value else {
            return Ok(Vec::new());
        };
        let earlier = self.counts(std::slice::from_ref(&value)).await?;
        let earlier = earlier.first().copied().unwrap_or(0);
        Ok(vec![entry(value, earlier, self.keys.framing)])
    }

    /// Moves the processing lists of dead consumers back to the list. Returns how many
    /// entries it moved.
    async fn recover_dead(&self) -> Result<usize, RedisError> {
        let Value::Array(members) = self
            .call("SMEMBERS", vec![arg(&self.keys.consumers)], None)
            .await?
        else {
            return Ok(0);
        };
        let mut moved = 0;
        for consumer in members.into_iter().filter_map(into_bytes) {
            if consumer == self.keys.consumer {
                continue;
            }
            let alive = self
                .call(
                    "EXISTS",
                    vec![arg(&self.keys.heartbeat_of(&consumer))],
                    None,
                )
                .await?;
            if alive.as_u64().unwrap_or(0) > 0 {
                continue;
            }
            let keys = vec![
                Value::Bytes(self.keys.processing_of(&consumer)),
                arg(&self.keys.key),
                arg(&self.keys.counts),
                arg(&self.keys.consumers),
            ];
            loop {
                let args = vec![Value::Bytes(consumer.clone()), Value::from("1000")];
                let commands = self.connection.commands(None);
                let n = eval_script(&commands, &RECOVER, self.keys.slot, keys.clone(), args)
                    .await?
                    .as_u64()
                    .unwrap_or(0);
                moved += n as usize;
                if n < 1000 {
                    break;
                }
            }
        }
        if moved > 0 {
            tracing::info!(moved, "moved entries of dead consumers back to the list");
        }
        Ok(moved)
    }

    /// Closes the dedicated connection.
    pub(crate) async fn close(self) {
        self.connection.close().await;
    }
}
