//! The stream form: a Redis Stream read through a consumer group. Reading (own pending entries
//! first, then new ones, with periodic reclaim of idle entries), the flush plan of a read
//! (kept segments, durable retry copies, one XACK), and the promoter of the delay set.

use std::time::Duration;

use bytes::Bytes;
use fred::prelude::*;
use tokio::time::Instant;

use super::delay;
use super::entry::{Entry, into_bytes, parse_entries};
use super::flush::{FlushPlan, Planned, Role};
use super::plan::Settling;
use super::{RedisError, Replication, ReplicationWatch, arg, call_at, companion_key, str_arg};

pub use super::plan::Mode;

/// A stream subscription's identity in Redis.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamSource {
    pub key: String,
    pub group: String,
    pub consumer: String,
    /// Where a newly created group starts.
    pub start_id: String,
    /// Pending entries idle longer than this are claimed and delivered again.
    pub min_idle: Duration,
}

/// The Redis names a stream subscription uses.
#[derive(Clone, Debug)]
pub struct StreamKeys {
    pub key: Bytes,
    pub group: Bytes,
    pub consumer: Bytes,
    /// The sorted set of entries waiting for their retry_after delay.
    pub delayed: Bytes,
    /// The stream key's hash slot: where its commands go on a cluster.
    pub slot: u16,
    /// Where entries past the delivery cap go.
    pub dead_letter: Option<Bytes>,
    /// `key/group`, as dead letters record it.
    pub subscription: String,
}

impl StreamKeys {
    pub fn new(source: &StreamSource) -> Self {
        let bytes = |s: &str| Bytes::copy_from_slice(s.as_bytes());
        Self {
            key: bytes(&source.key),
            group: bytes(&source.group),
            consumer: bytes(&source.consumer),
            delayed: Bytes::from(companion_key(&source.key, "window:delayed")),
            slot: fred::util::redis_keyslot(source.key.as_bytes()),
            dead_letter: None,
            subscription: format!("{}/{}", source.key, source.group),
        }
    }
}

/// Creates the consumer group (and the stream) unless it exists.
pub async fn ensure_group(client: &Client, source: &StreamSource) -> Result<(), RedisError> {
    let start = if source.start_id.is_empty() {
        "0"
    } else {
        &source.start_id
    };
    let args = vec![
        str_arg("CREATE"),
        str_arg(&source.key),
        str_arg(&source.group),
        str_arg(start),
        str_arg("MKSTREAM"),
    ];
    let slot = Some(fred::util::redis_keyslot(source.key.as_bytes()));
    match call_at(client, "XGROUP", args, false, slot).await {
        Ok(_) => Ok(()),
        Err(RedisError::Refused { message, .. }) if message.starts_with("BUSYGROUP") => Ok(()),
        Err(err) => Err(err),
    }
}

impl Settling for StreamKeys {
    fn slot(&self) -> Option<u16> {
        Some(self.slot)
    }

    fn settles_in_redis(&self) -> bool {
        true
    }

    /// One XACK for all of them.
    fn settle(&self, entries: &[&Entry], plan: &mut FlushPlan) {
        let mut args = vec![self.key.clone(), self.group.clone()];
        args.extend(entries.iter().map(|e| e.id.clone()));
        plan.push("XACK", args, Role::Settle, Some(self.slot));
    }

    /// A copy at the end of the stream.
    fn retry(&self, entry: &Entry, reason: Option<&str>, plan: &mut FlushPlan) {
        let mut args = vec![self.key.clone(), Bytes::from_static(b"*")];
        args.extend(
            entry
                .retry_fields(reason)
                .into_iter()
                .flat_map(|(f, v)| [f, v]),
        );
        plan.push("XADD", args, Role::Requeue, Some(self.slot));
    }

    /// A copy in the delay set, keyed by the entry id.
    fn retry_after(&self, entry: &Entry, reason: Option<&str>, due_ms: u64, plan: &mut FlushPlan) {
        let parts = entry
            .retry_fields(reason)
            .into_iter()
            .flat_map(|(f, v)| [f, v]);
        let member = delay::encode(&entry.id, parts);
        let args = vec![
            self.delayed.clone(),
            Bytes::from(due_ms.to_string()),
            member,
        ];
        plan.push("ZADD", args, Role::Requeue, Some(self.slot));
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

/// Appends entries to a stream in one pipeline; returns their ids.
pub async fn publish(
    client: &Client,
    key: &str,
    entries: Vec<Vec<(Bytes, Bytes)>>,
    max_len: Option<u64>,
) -> Result<Vec<Bytes>, RedisError> {
    // Publish waits for a connection, follows MOVED and retries after a reconnect (a retried
    // XADD may append an entry twice: publishing is at least once, as with any client).
    let options = fred::types::config::Options {
        max_attempts: Some(3),
        ..Default::default()
    };
    let pipeline = fred::clients::Pipeline::from(client.with_options(&options));
    let key = Bytes::copy_from_slice(key.as_bytes());
    for fields in entries {
        let mut args = vec![Value::Bytes(key.clone())];
        if let Some(max_len) = max_len {
            args.extend([
                str_arg("MAXLEN"),
                str_arg("~"),
                Value::Integer(max_len as i64),
            ]);
        }
        args.push(str_arg("*"));
        args.extend(
            fields
                .into_iter()
                .flat_map(|(f, v)| [Value::Bytes(f), Value::Bytes(v)]),
        );
        let command = fred::types::CustomCommand::new_static(
            "XADD",
            fred::types::ClusterHash::FirstKey,
            false,
        );
        // Buffering a command in a pipeline only stores it; it cannot fail.
        let _: Result<Value, _> = pipeline.custom(command, args).await;
    }
    pipeline
        .try_all::<Value>()
        .await
        .into_iter()
        .map(|reply| {
            let reply = reply.map_err(|e| RedisError::from_fred("XADD", &e))?;
            into_bytes(reply).ok_or_else(|| RedisError::Protocol {
                command: "XADD",
                detail: "the reply is not an id".into(),
            })
        })
        .collect()
}

/// Where the next read comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Cursor {
    /// This consumer's own pending entries after this id.
    Pending(Bytes),
    /// New entries (`>`).
    New,
}

/// What a read returned and where it came from.
#[derive(Debug, Default)]
pub struct ReadBatch {
    pub entries: Vec<Entry>,
    /// Whether the entries may already be outstanding in this window (pending or claimed).
    pub redelivery: bool,
    /// Entries claimed from idle consumers (or recovered from dead ones).
    pub claimed: usize,
    /// Pub/sub: messages dropped for a slow client since the previous read.
    pub lost: u64,
    /// Round trips this read made: XREADGROUP calls, XAUTOCLAIM calls, XPENDING look-ups.
    pub reads: u32,
    pub claims: u32,
    pub count_lookups: u32,
    /// A stream reader's next XAUTOCLAIM: reads that ride on flushes (see [`read_ahead`]) stop
    /// then, so the reader gets to reclaim.
    pub next_reclaim: Option<Instant>,
}

/// The entries of an XREADGROUP reply; ids of deleted entries (pending history only) go to
/// `deleted`.
fn parse_read(reply: Value, deleted: &mut Vec<Bytes>) -> Result<Vec<Entry>, RedisError> {
    let Value::Array(streams) = reply else {
        return Ok(Vec::new()); // nil: BLOCK timed out, or nothing new
    };
    let mut entries = Vec::new();
    for stream in streams {
        let Value::Array(pair) = stream else { continue };
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
pub fn read_ahead(keys: &StreamKeys, count: u32) -> Planned {
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
pub fn read_ahead_batch(reply: Value) -> Result<ReadBatch, RedisError> {
    // `>` delivers entries that exist: deleted ones show only in pending history.
    let mut deleted = Vec::new();
    let mut entries = parse_read(reply, &mut deleted)?;
    first_deliveries(&mut entries);
    Ok(ReadBatch {
        entries,
        ..Default::default()
    })
}

/// Reads one stream subscription on its dedicated connection.
pub struct StreamReader {
    client: Client,
    keys: StreamKeys,
    min_idle: Duration,
    block: Duration,
    cursor: Cursor,
    claim_cursor: Bytes,
    reclaim_interval: Duration,
    next_reclaim: Instant,
    replication: Option<Replication>,
    replication_watch: ReplicationWatch,
}

impl StreamReader {
    /// A reader that first delivers the consumer's own pending entries.
    pub fn new(
        client: Client,
        source: &StreamSource,
        block: Duration,
        reclaim_interval: Duration,
        replication: Option<Replication>,
    ) -> Self {
        Self {
            replication,
            replication_watch: ReplicationWatch::default(),
            client,
            keys: StreamKeys::new(source),
            min_idle: source.min_idle,
            block,
            cursor: Cursor::Pending(Bytes::from_static(b"0")),
            claim_cursor: Bytes::from_static(b"0-0"),
            reclaim_interval,
            next_reclaim: Instant::now() + reclaim_interval,
        }
    }

    /// Makes the next reads go through this consumer's pending entries again (after a
    /// settle failed, so its entries come back).
    pub fn reread_pending(&mut self) {
        self.cursor = Cursor::Pending(Bytes::from_static(b"0"));
    }

    /// One read of up to `count` entries. Blocks up to the BLOCK time when nothing is there.
    pub async fn read(&mut self, count: u32) -> Result<ReadBatch, RedisError> {
        let mut batch = self.read_inner(count).await?;
        batch.next_reclaim = Some(self.next_reclaim);
        Ok(batch)
    }

    async fn read_inner(&mut self, count: u32) -> Result<ReadBatch, RedisError> {
        let mut batch = ReadBatch::default();
        if Instant::now() >= self.next_reclaim {
            self.next_reclaim = Instant::now() + self.reclaim_interval;
            batch.claims += 1;
            let claimed = self.autoclaim(count).await?;
            if !claimed.is_empty() {
                self.replicate().await?;
                batch.claimed = claimed.len();
                batch.count_lookups += 1;
                batch.entries = self.with_delivery_counts(claimed).await?;
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
                    batch.entries = self.with_delivery_counts(entries).await?;
                    batch.redelivery = true;
                    return Ok(batch);
                }
                None => self.cursor = Cursor::New,
            }
        }
        batch.reads += 1;
        batch.entries = self
            .xreadgroup(count, Some(self.block), Bytes::from_static(b">"))
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
                    .wait(&self.client, self.keys.slot, replication)
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
        let reply = call_at(&self.client, "XREADGROUP", args, block.is_some(), slot).await?;
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
            &self.client,
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

    /// Fills in the delivery counts of redelivered entries from the pending entries list.
    async fn with_delivery_counts(
        &self,
        mut entries: Vec<Entry>,
    ) -> Result<Vec<Entry>, RedisError> {
        let (Some(first), Some(last)) = (entries.first(), entries.last()) else {
            return Ok(entries);
        };
        let args = vec![
            arg(&self.keys.key),
            arg(&self.keys.group),
            arg(&first.id),
            arg(&last.id),
            Value::Integer(entries.len() as i64),
            arg(&self.keys.consumer),
        ];
        let reply = call_at(&self.client, "XPENDING", args, false, Some(self.keys.slot)).await?;
        let Value::Array(rows) = reply else {
            return Ok(entries);
        };
        let mut counts = std::collections::HashMap::with_capacity(rows.len());
        for row in rows {
            let Value::Array(row) = row else { continue };
            let mut row = row.into_iter();
            let id = row.next().and_then(into_bytes);
            let count = row.nth(2).and_then(|v| v.as_i64());
            if let (Some(id), Some(count)) = (id, count) {
                counts.insert(id, count as u32);
            }
        }
        for entry in &mut entries {
            let pel = counts.get(&entry.id).copied().unwrap_or(1);
            entry.delivery_count = pel + entry.earlier_attempts();
        }
        Ok(entries)
    }

    /// Entries deleted from the stream while pending cannot be delivered: settle them.
    async fn ack_deleted(&self, deleted: Vec<Bytes>) -> Result<(), RedisError> {
        if deleted.is_empty() {
            return Ok(());
        }
        let mut args = vec![arg(&self.keys.key), arg(&self.keys.group)];
        args.extend(deleted.into_iter().map(Value::Bytes));
        call_at(&self.client, "XACK", args, false, Some(self.keys.slot))
            .await
            .map(|_| ())
    }

    /// Closes the dedicated connection.
    pub async fn close(self) {
        let _ = self.client.quit().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::plan::{PlanContext, plan_flush};
    use crate::window::{Command, FlushBatch, Limits, Outcome, Window};

    fn plan(keys: &StreamKeys, batch: &FlushBatch<Entry>, mode: Mode, now_ms: u64) -> FlushPlan {
        let ctx = PlanContext {
            mode,
            now_ms,
            max_deliveries: 3,
        };
        plan_flush(keys, batch, &ctx)
    }

    fn keys() -> StreamKeys {
        StreamKeys::new(&StreamSource {
            key: "orders".into(),
            group: "g".into(),
            consumer: "c".into(),
            start_id: "0".into(),
            min_idle: Duration::from_secs(60),
        })
    }

    fn entry(id: &str) -> Entry {
        Entry {
            id: Bytes::copy_from_slice(id.as_bytes()),
            fields: vec![(Bytes::from_static(b"f"), Bytes::from_static(b"v"))],
            delivery_count: 1,
            channel: None,
        }
    }

    fn incr(key: &str) -> Result<Command, crate::window::CommandError> {
        Command::new("INCR", vec![Bytes::copy_from_slice(key.as_bytes())])
    }

    /// The seed's diagram: 1-0 and 3-0 acked, 2-0 dropped.
    fn diagram() -> FlushBatch<Entry> {
        let mut w = Window::new(Limits {
            max_commands_per_slot: 8,
        });
        let read = w
            .open_read(vec![entry("1-0"), entry("2-0"), entry("3-0")])
            .unwrap();
        let s = read.first_slot;
        for i in 0..3 {
            w.queue(s + i, incr(&format!("k{}", i + 1))).unwrap();
        }
        w.settle(s, Outcome::Ack, None).unwrap();
        w.settle(s + 1, Outcome::Drop, None).unwrap();
        w.settle(s + 2, Outcome::Ack, None).unwrap().unwrap()
    }

    #[test]
    fn a_read_ahead_reads_new_entries_without_block_on_the_stream_slot() {
        let keys = keys();
        let read = read_ahead(&keys, 64);
        assert_eq!(read.role, Role::ReadAhead);
        assert_eq!(read.hash_slot, Some(keys.slot));
        let plan = FlushPlan {
            commands: vec![read],
            ..Default::default()
        };
        assert_eq!(
            plan.render(),
            ["XREADGROUP GROUP g c COUNT 64 STREAMS orders >"]
        );
    }

    #[test]
    fn a_read_ahead_reply_is_a_read_of_first_deliveries() {
        let b = |s: &str| Value::Bytes(Bytes::copy_from_slice(s.as_bytes()));
        let entry = |id: &str, fields: Vec<Value>| Value::Array(vec![b(id), Value::Array(fields)]);
        let reply = Value::Array(vec![Value::Array(vec![
            b("orders"),
            Value::Array(vec![
                entry("1-0", vec![b("_payload"), b("{}")]),
                // A retry copy carries its earlier attempts.
                entry(
                    "2-0",
                    vec![b("_payload"), b("{}"), b("h:x-window-attempts"), b("2")],
                ),
            ]),
        ])]);
        let batch = read_ahead_batch(reply).unwrap();
        let ids: Vec<_> = batch.entries.iter().map(|e| e.id.clone()).collect();
        assert_eq!(
            ids,
            [Bytes::from_static(b"1-0"), Bytes::from_static(b"2-0")]
        );
        let counts: Vec<_> = batch.entries.iter().map(|e| e.delivery_count).collect();
        assert_eq!(counts, [1, 3]);
        assert!(!batch.redelivery);
        assert_eq!(batch.reads, 0, "it made no round trip of its own");
        // Nothing new: nil.
        assert!(read_ahead_batch(Value::Null).unwrap().entries.is_empty());
    }

    #[test]
    fn pipeline_mode_is_the_kept_segments_then_one_xack() {
        let plan = plan(&keys(), &diagram(), Mode::Pipeline, 0);
        assert_eq!(
            plan.render(),
            vec!["INCR k1", "INCR k3", "XACK orders g 1-0 2-0 3-0"]
        );
        assert_eq!(plan.side_effects, 2);
        assert_eq!(plan.settles, 3);
    }

    #[test]
    fn atomic_mode_wraps_each_kept_segment_with_its_own_settle() {
        let plan = plan(&keys(), &diagram(), Mode::Atomic, 0);
        assert_eq!(
            plan.render(),
            vec![
                "MULTI",
                "INCR k1",
                "XACK orders g 1-0",
                "EXEC",
                "MULTI",
                "INCR k3",
                "XACK orders g 3-0",
                "EXEC",
                "XACK orders g 2-0",
            ]
        );
    }

    #[test]
    fn retries_are_written_in_the_same_transaction_as_the_xack() {
        let mut w = Window::new(Limits {
            max_commands_per_slot: 8,
        });
        let read = w
            .open_read(vec![entry("1-0"), entry("2-0"), entry("3-0")])
            .unwrap();
        let s = read.first_slot;
        w.queue(s, incr("k1")).unwrap();
        w.settle(s, Outcome::Ack, None).unwrap();
        w.settle(s + 1, Outcome::Retry, Some("busy".into()))
            .unwrap();
        let batch = w
            .settle(s + 2, Outcome::RetryAfter(Duration::from_millis(250)), None)
            .unwrap()
            .unwrap();
        let plan = plan(&keys(), &batch, Mode::Pipeline, 1_000);
        let rendered = plan.render();
        assert_eq!(rendered[0], "INCR k1");
        assert_eq!(rendered[1], "MULTI");
        assert_eq!(
            rendered[2],
            "XADD orders * f v h:x-window-attempts 1 h:x-window-original-id 2-0 h:x-window-reason busy"
        );
        assert!(rendered[3].starts_with("ZADD {orders}:window:delayed 1250 3-0\n1:f1:v"));
        assert_eq!(rendered[4], "XACK orders g 1-0 2-0 3-0");
        assert_eq!(rendered[5], "EXEC");
        assert_eq!(plan.commands.len(), 6);
    }

    #[test]
    fn at_the_delivery_cap_a_retry_becomes_a_dead_letter_with_the_settle() {
        let mut keys = keys();
        keys.dead_letter = Some(Bytes::from_static(b"orders:dead"));
        let mut w = Window::new(Limits {
            max_commands_per_slot: 8,
        });
        let tired = Entry {
            delivery_count: 3,
            ..entry("1-0")
        };
        let read = w.open_read(vec![tired, entry("2-0")]).unwrap();
        w.settle(read.first_slot, Outcome::Retry, Some("boom".into()))
            .unwrap();
        let batch = w
            .settle(read.first_slot + 1, Outcome::Retry, None)
            .unwrap()
            .unwrap();
        let plan = plan(&keys, &batch, Mode::Pipeline, 0);
        assert_eq!(plan.dead_lettered, 1);
        let rendered = plan.render();
        assert_eq!(rendered[0], "MULTI");
        assert_eq!(
            rendered[1],
            "XADD orders:dead * f v h:x-window-original-id 1-0 h:x-window-subscription orders/g h:x-window-deliveries 3 h:x-window-reason boom"
        );
        assert!(rendered[2].starts_with("XADD orders * f v h:x-window-attempts 1"));
        assert_eq!(rendered[3], "XACK orders g 1-0 2-0");
        assert_eq!(rendered[4], "EXEC");
    }
}
