//! The list forms. A reliable list moves each entry it reads to the consumer's own processing
//! list and settles it with `LREM <processing> 1 <value>`; entries stranded on the processing
//! list of a dead consumer (its heartbeat key expired) are moved back, one atomic LMOVE each.
//! A simple list pops (at most once). Producers LPUSH; reads take from the right (FIFO).
//!
//! Delivery counts of list values live in a hash beside the list (`{key}:window:deliveries`,
//! value -> earlier deliveries), written only when an entry is retried or recovered and removed
//! when it is settled for good; identical values share a count.

use std::collections::VecDeque;
use std::sync::LazyLock;
use std::time::Duration;

use bytes::Bytes;
use fred::prelude::*;
use fred::types::scripts::Script;
use tokio::time::Instant;

use super::delay;
use super::entry::{Entry, PAYLOAD_FIELD, into_bytes};
use super::flush::{FlushPlan, Role};
use super::plan::Settling;
use super::stream::ReadBatch;
use super::{RedisError, Replication, ReplicationWatch, arg, call_at, companion_key};

/// A list subscription's identity in Redis.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListSource {
    pub key: String,
    /// Reliable lists only: the consumer whose processing list this is.
    pub consumer: String,
    /// Reliable lists only: a consumer whose heartbeat is older than this is dead.
    pub dead_after: Duration,
    /// Whether entries move to a processing list (at least once) or are popped (at most once).
    pub reliable: bool,
}

/// The Redis names a list subscription uses; all share the list's hash slot.
#[derive(Clone, Debug)]
pub struct ListKeys {
    pub key: Bytes,
    pub reliable: bool,
    pub processing: Bytes,
    /// The prefix of every consumer's processing list.
    processing_prefix: String,
    pub counts: Bytes,
    pub heartbeat: Bytes,
    heartbeat_prefix: String,
    /// The set of consumers that have a processing list.
    pub consumers: Bytes,
    pub consumer: Bytes,
    pub delayed: Bytes,
    pub slot: u16,
    pub dead_letter: Option<Bytes>,
}

impl ListKeys {
    pub fn new(source: &ListSource) -> Self {
        let processing_prefix = companion_key(&source.key, "window:processing:");
        let heartbeat_prefix = companion_key(&source.key, "window:heartbeat:");
        Self {
            key: Bytes::copy_from_slice(source.key.as_bytes()),
            reliable: source.reliable,
            processing: Bytes::from(format!("{processing_prefix}{}", source.consumer)),
            counts: Bytes::from(companion_key(&source.key, "window:deliveries")),
            heartbeat: Bytes::from(format!("{heartbeat_prefix}{}", source.consumer)),
            consumers: Bytes::from(companion_key(&source.key, "window:consumers")),
            consumer: Bytes::copy_from_slice(source.consumer.as_bytes()),
            delayed: Bytes::from(companion_key(&source.key, "window:delayed")),
            slot: fred::util::redis_keyslot(source.key.as_bytes()),
            dead_letter: None,
            processing_prefix,
            heartbeat_prefix,
        }
    }

    /// The keys that must share the list's slot on a cluster, with their names.
    pub fn companions(&self) -> Vec<&Bytes> {
        vec![
            &self.processing,
            &self.counts,
            &self.heartbeat,
            &self.consumers,
            &self.delayed,
        ]
    }

    fn processing_of(&self, consumer: &[u8]) -> Bytes {
        let mut key = self.processing_prefix.clone().into_bytes();
        key.extend_from_slice(consumer);
        Bytes::from(key)
    }

    fn heartbeat_of(&self, consumer: &[u8]) -> Bytes {
        let mut key = self.heartbeat_prefix.clone().into_bytes();
        key.extend_from_slice(consumer);
        Bytes::from(key)
    }

    /// Bookkeeping after a settle for good: forget the delivery counts of retried values.
    fn forget_counts(&self, entries: &[&Entry], plan: &mut FlushPlan) {
        let mut args = vec![self.counts.clone()];
        args.extend(
            entries
                .iter()
                .filter(|e| e.delivery_count > 1)
                .map(|e| value(e).clone()),
        );
        if args.len() > 1 {
            plan.push("HDEL", args, Role::Bookkeeping, Some(self.slot));
        }
    }

    fn remember_count(&self, entry: &Entry, plan: &mut FlushPlan) {
        let args = vec![
            self.counts.clone(),
            value(entry).clone(),
            Bytes::from(entry.delivery_count.to_string()),
        ];
        plan.push("HSET", args, Role::Bookkeeping, Some(self.slot));
    }
}

/// The list value an entry carries.
pub fn value(entry: &Entry) -> &Bytes {
    &entry.fields[0].1
}

/// A list value as an entry: its payload is the value.
fn entry(value: Bytes, delivery_count: u32) -> Entry {
    Entry {
        id: Bytes::new(),
        fields: vec![(Bytes::from_static(PAYLOAD_FIELD), value)],
        delivery_count,
        channel: None,
    }
}

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

    /// The value pushed back where producers push, before its LREM.
    fn retry(&self, entry: &Entry, _reason: Option<&str>, plan: &mut FlushPlan) {
        plan.push(
            "LPUSH",
            vec![self.key.clone(), value(entry).clone()],
            Role::Requeue,
            Some(self.slot),
        );
        self.remember_count(entry, plan);
    }

    fn retry_after(&self, entry: &Entry, _reason: Option<&str>, due_ms: u64, plan: &mut FlushPlan) {
        let member = delay::encode(&delay::unique_token(), [value(entry).clone()]);
        let args = vec![
            self.delayed.clone(),
            Bytes::from(due_ms.to_string()),
            member,
        ];
        plan.push("ZADD", args, Role::Requeue, Some(self.slot));
        self.remember_count(entry, plan);
    }

    fn dead_letter(&self, entry: &Entry, _reason: Option<&str>, plan: &mut FlushPlan) {
        if let Some(target) = &self.dead_letter {
            plan.push(
                "LPUSH",
                vec![target.clone(), value(entry).clone()],
                Role::Requeue,
                Some(self.slot),
            );
        }
    }
}

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

/// Pushes entries popped from a simple list back to its consumer end, in their order, when
/// nobody can take them any more (the subscription closed while they were read).
pub async fn give_back(client: &Client, keys: &ListKeys, entries: &[Entry]) {
    if entries.is_empty() {
        return;
    }
    let mut args = vec![arg(&keys.key)];
    // The first entry read was the rightmost: push it back last so it is rightmost again.
    args.extend(entries.iter().rev().map(|e| arg(value(e))));
    if let Err(err) = call_at(client, "RPUSH", args, false, Some(keys.slot)).await {
        tracing::warn!(error = %err, lost = entries.len(), "could not push popped entries back to the simple list");
    }
}

/// Reads one list subscription on its dedicated connection.
pub struct ListReader {
    client: Client,
    keys: ListKeys,
    block: Duration,
    dead_after: Duration,
    /// Entries of this consumer's processing list left by its previous run, oldest first,
    /// delivered before anything new.
    own: Option<VecDeque<Entry>>,
    recovery_interval: Duration,
    next_recovery: Instant,
    next_heartbeat: Instant,
    replication: Option<Replication>,
    replication_watch: ReplicationWatch,
}

impl ListReader {
    pub fn new(
        client: Client,
        source: &ListSource,
        keys: ListKeys,
        block: Duration,
        recovery_interval: Duration,
        replication: Option<Replication>,
    ) -> Self {
        Self {
            replication,
            replication_watch: ReplicationWatch::default(),
            client,
            keys,
            block,
            dead_after: source.dead_after,
            own: None,
            recovery_interval,
            next_recovery: Instant::now(),
            next_heartbeat: Instant::now(),
        }
    }

    async fn call(
        &self,
        name: &'static str,
        args: Vec<Value>,
        blocking: bool,
    ) -> Result<Value, RedisError> {
        call_at(&self.client, name, args, blocking, Some(self.keys.slot)).await
    }

    /// Makes the next read deliver this consumer's processing list again.
    pub fn reread_own(&mut self) {
        if self.keys.reliable {
            self.own = None;
        }
    }

    /// One read of up to `count` entries. Blocks up to the BLOCK time when the list is empty.
    pub async fn read(&mut self, count: u32) -> Result<ReadBatch, RedisError> {
        let mut batch = ReadBatch::default();
        if self.keys.reliable {
            self.heartbeat().await?;
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
            if Instant::now() >= self.next_recovery {
                self.next_recovery = Instant::now() + self.recovery_interval;
                batch.claims += 1;
                batch.claimed = self.recover_dead().await?;
            }
        }
        batch.reads += 1;
        batch.entries = self.take(count).await?;
        if batch.entries.is_empty() {
            batch.reads += 1;
            batch.entries = self.take_blocking().await?;
        }
        if !batch.entries.is_empty()
            && let Some(replication) = &self.replication
        {
            self.replication_watch
                .wait(&self.client, self.keys.slot, replication)
                .await?;
        }
        Ok(batch)
    }

    async fn heartbeat(&mut self) -> Result<(), RedisError> {
        if Instant::now() < self.next_heartbeat {
            return Ok(());
        }
        self.next_heartbeat = Instant::now() + self.dead_after / 3;
        let ttl = Value::Integer(self.dead_after.as_millis().max(1) as i64);
        self.call(
            "SET",
            vec![
                arg(&self.keys.heartbeat),
                Value::from("1"),
                Value::from("PX"),
                ttl,
            ],
            false,
        )
        .await?;
        self.call(
            "SADD",
            vec![arg(&self.keys.consumers), arg(&self.keys.consumer)],
            false,
        )
        .await?;
        Ok(())
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
                false,
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
            let args = vec![arg(&self.keys.counts), arg(&value), Value::Integer(1)];
            let earlier = self
                .call("HINCRBY", args, false)
                .await?
                .as_u64()
                .unwrap_or(1) as u32;
            entries.push_back(entry(value, earlier + 1));
        }
        Ok(entries)
    }

    async fn counts(&self, values: &[Bytes]) -> Result<Vec<u32>, RedisError> {
        if values.is_empty() {
            return Ok(Vec::new());
        }
        let mut args = vec![arg(&self.keys.counts)];
        args.extend(values.iter().map(arg));
        let Value::Array(counts) = self.call("HMGET", args, false).await? else {
            return Ok(vec![0; values.len()]);
        };
        Ok(counts
            .into_iter()
            .map(|c| c.as_u64().unwrap_or(0) as u32)
            .collect())
    }

    async fn take(&self, count: u32) -> Result<Vec<Entry>, RedisError> {
        let keys = vec![
            Key::from(self.keys.key.clone()),
            Key::from(self.keys.processing.clone()),
            Key::from(self.keys.counts.clone()),
        ];
        let reliable = if self.keys.reliable { "1" } else { "0" };
        let reply: Value = TAKE
            .evalsha_with_reload(
                &self.client,
                keys,
                vec![count.to_string(), reliable.to_owned()],
            )
            .await
            .map_err(|e| RedisError::from_fred("EVALSHA", &e))?;
        let Value::Array(flat) = reply else {
            return Ok(Vec::new());
        };
        let mut entries = Vec::with_capacity(flat.len() / 2);
        let mut flat = flat.into_iter();
        while let (Some(v), Some(c)) = (flat.next(), flat.next()) {
            let earlier = c.as_u64().unwrap_or(0) as u32;
            if let Some(v) = into_bytes(v) {
                entries.push(entry(v, earlier + 1));
            }
        }
        Ok(entries)
    }

    /// One blocking move or pop, when the list is empty.
    async fn take_blocking(&self) -> Result<Vec<Entry>, RedisError> {
        let timeout = Value::Double(self.block.as_secs_f64().max(0.001));
        let value = if self.keys.reliable {
            let args = vec![
                arg(&self.keys.key),
                arg(&self.keys.processing),
                Value::from("RIGHT"),
                Value::from("LEFT"),
                timeout,
            ];
            into_bytes(self.call("BLMOVE", args, true).await?)
        } else {
            match self
                .call("BRPOP", vec![arg(&self.keys.key), timeout], true)
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
        Ok(vec![entry(
            value,
            earlier.first().copied().unwrap_or(0) + 1,
        )])
    }

    /// Moves the processing lists of dead consumers back to the list. Returns how many
    /// entries it moved.
    async fn recover_dead(&self) -> Result<usize, RedisError> {
        let Value::Array(members) = self
            .call("SMEMBERS", vec![arg(&self.keys.consumers)], false)
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
                    false,
                )
                .await?;
            if alive.as_u64().unwrap_or(0) > 0 {
                continue;
            }
            let keys = vec![
                Key::from(self.keys.processing_of(&consumer)),
                Key::from(self.keys.key.clone()),
                Key::from(self.keys.counts.clone()),
                Key::from(self.keys.consumers.clone()),
            ];
            loop {
                let n: u64 = RECOVER
                    .evalsha_with_reload(
                        &self.client,
                        keys.clone(),
                        vec![Value::Bytes(consumer.clone()), Value::from("1000")],
                    )
                    .await
                    .map_err(|e| RedisError::from_fred("EVALSHA", &e))?;
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
    pub async fn close(self) {
        let _ = self.client.quit().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::plan::{Mode, PlanContext, plan_flush};
    use crate::window::{Command, Limits, Outcome, Window};

    fn keys(reliable: bool) -> ListKeys {
        ListKeys::new(&ListSource {
            key: "jobs".into(),
            consumer: "c1".into(),
            dead_after: Duration::from_secs(30),
            reliable,
        })
    }

    fn plan(keys: &ListKeys, outcomes: &[Outcome], mode: Mode) -> Vec<String> {
        let mut w = Window::new(Limits {
            max_commands_per_slot: 8,
        });
        let entries = (0..outcomes.len())
            .map(|i| entry(Bytes::from(format!("v{i}")), 1))
            .collect();
        let read = w.open_read(entries).unwrap();
        let mut batch = None;
        for (i, outcome) in outcomes.iter().enumerate() {
            let slot = read.first_slot + i as u64;
            w.queue(
                slot,
                Command::new("INCR", vec![Bytes::from(format!("k{i}"))]),
            )
            .unwrap();
            batch = w.settle(slot, *outcome, None).unwrap();
        }
        let ctx = PlanContext {
            mode,
            now_ms: 0,
            max_deliveries: 0,
        };
        plan_flush(keys, &batch.unwrap(), &ctx).render()
    }

    #[test]
    fn a_reliable_list_settles_with_one_lrem_per_entry_after_the_kept_segments() {
        let rendered = plan(
            &keys(true),
            &[Outcome::Ack, Outcome::Drop, Outcome::Ack],
            Mode::Pipeline,
        );
        assert_eq!(
            rendered,
            vec![
                "INCR k0",
                "INCR k2",
                "LREM {jobs}:window:processing:c1 1 v0",
                "LREM {jobs}:window:processing:c1 1 v1",
                "LREM {jobs}:window:processing:c1 1 v2",
            ]
        );
    }

    #[test]
    fn a_retry_pushes_the_value_back_before_its_lrem_in_one_transaction() {
        let rendered = plan(&keys(true), &[Outcome::Retry], Mode::Pipeline);
        assert_eq!(
            rendered,
            vec![
                "MULTI",
                "LPUSH jobs v0",
                "HSET {jobs}:window:deliveries v0 1",
                "LREM {jobs}:window:processing:c1 1 v0",
                "EXEC",
            ]
        );
    }

    #[test]
    fn atomic_mode_wraps_each_segment_with_its_lrem_and_a_simple_list_settles_nothing() {
        let rendered = plan(&keys(true), &[Outcome::Ack], Mode::Atomic);
        assert_eq!(
            rendered,
            vec![
                "MULTI",
                "INCR k0",
                "LREM {jobs}:window:processing:c1 1 v0",
                "EXEC"
            ]
        );
        let rendered = plan(&keys(false), &[Outcome::Ack, Outcome::Drop], Mode::Atomic);
        assert_eq!(rendered, vec!["MULTI", "INCR k0", "EXEC"]);
    }

    #[test]
    fn companion_keys_share_the_list_slot() {
        let keys = keys(true);
        for key in keys.companions() {
            assert_eq!(fred::util::redis_keyslot(key), keys.slot, "{key:?}");
        }
    }
}
