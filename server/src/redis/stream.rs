//! The stream form: a Redis Stream read through a consumer group. Reading (own pending entries
//! first, then new ones, with periodic reclaim of idle entries), the flush plan of a read
//! (kept segments, durable retry copies, one XACK), and the promoter of the delay set.

use std::borrow::Borrow;
use std::sync::LazyLock;
use std::time::Duration;

use bytes::Bytes;
use fred::prelude::*;
use fred::types::scripts::Script;
use tokio::time::Instant;

use super::entry::{Entry, into_bytes, parse_entries};
use super::flush::{FlushPlan, Role};
use super::{RedisError, arg, call_at, companion_key, str_arg};
use crate::window::{FlushBatch, Outcome};

/// How kept segments are sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Kept segments in commit order, then the settles, in one pipeline.
    Pipeline,
    /// Each kept segment as MULTI, its commands, its own settle, EXEC.
    Atomic,
}

impl Mode {
    pub fn as_str(&self) -> &'static str {
        match self {
            Mode::Pipeline => "pipeline",
            Mode::Atomic => "atomic",
        }
    }
}

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

/// Builds the exact commands of one flush.
///
/// Pipeline mode: the kept segments in commit order; then, when the read has retries, one
/// MULTI holding the copies (XADD), the delay-set members (ZADD) and the XACK, so an entry is
/// never acknowledged without its copy; else the XACK alone. One XACK per read either way.
///
/// Atomic mode: each kept segment with commands becomes MULTI, its commands, the XACK of its
/// own entry, EXEC; the rest of the read settles as in pipeline mode.
pub fn plan_flush<E: Borrow<Entry>>(
    keys: &StreamKeys,
    batch: &FlushBatch<E>,
    mode: Mode,
    now_ms: u64,
) -> FlushPlan {
    let mut plan = FlushPlan::default();
    // Settles, copies and transactions all go to the node of the stream's slot.
    let slot = Some(keys.slot);
    let mut settled_inside = vec![false; batch.settles.len()];
    for segment in &batch.kept {
        let wrap = mode == Mode::Atomic && !segment.commands.is_empty();
        if wrap {
            plan.push("MULTI", vec![], Role::Begin, slot);
        }
        for command in &segment.commands {
            let hash_slot = if wrap { slot } else { command.hash_slot };
            plan.push(
                command.name.clone(),
                command.args.clone(),
                Role::SideEffect,
                hash_slot,
            );
        }
        if wrap {
            let entry: &Entry = batch.settles[segment.settle].entry.borrow();
            plan.push("XACK", xack_args(keys, [&entry.id]), Role::Settle, slot);
            plan.push("EXEC", vec![], Role::Commit { settles: true }, slot);
            settled_inside[segment.settle] = true;
        }
    }

    let rest: Vec<_> = batch
        .settles
        .iter()
        .zip(&settled_inside)
        .filter(|(_, inside)| !**inside)
        .map(|(settle, _)| settle)
        .collect();
    let requeues = rest
        .iter()
        .any(|s| matches!(s.outcome, Outcome::Retry | Outcome::RetryAfter(_)));
    if requeues {
        plan.push("MULTI", vec![], Role::Begin, slot);
    }
    for settle in rest
        .iter()
        .filter(|s| s.outcome != Outcome::Ack && s.outcome != Outcome::Drop)
    {
        let entry: &Entry = settle.entry.borrow();
        let fields = entry.retry_fields(settle.reason.as_deref());
        match settle.outcome {
            Outcome::Retry => {
                let mut args = vec![keys.key.clone(), Bytes::from_static(b"*")];
                args.extend(fields.into_iter().flat_map(|(f, v)| [f, v]));
                plan.push("XADD", args, Role::Requeue, slot);
            }
            Outcome::RetryAfter(delay) => {
                let due = now_ms.saturating_add(delay.as_millis() as u64);
                let member = encode_delayed(&entry.id, &fields);
                let args = vec![keys.delayed.clone(), Bytes::from(due.to_string()), member];
                plan.push("ZADD", args, Role::Requeue, slot);
            }
            Outcome::Ack | Outcome::Drop => unreachable!("filtered above"),
        }
    }
    if !rest.is_empty() {
        let ids = rest.iter().map(|s| &s.entry.borrow().id);
        plan.push("XACK", xack_args(keys, ids), Role::Settle, slot);
    }
    if requeues {
        plan.push("EXEC", vec![], Role::Commit { settles: true }, slot);
    }
    plan.settles = batch.settles.len();
    plan
}

fn xack_args<'a>(keys: &StreamKeys, ids: impl IntoIterator<Item = &'a Bytes>) -> Vec<Bytes> {
    let mut args = vec![keys.key.clone(), keys.group.clone()];
    args.extend(ids.into_iter().cloned());
    args
}

/// A delay-set member: the entry id (which keeps members unique), a newline, then each field
/// name and value as `<length>:<bytes>`, which the promoter script decodes.
fn encode_delayed(id: &Bytes, fields: &[(Bytes, Bytes)]) -> Bytes {
    let mut member = Vec::with_capacity(id.len() + 1 + fields.len() * 32);
    member.extend_from_slice(id);
    member.push(b'\n');
    for (name, value) in fields {
        for part in [name, value] {
            member.extend_from_slice(part.len().to_string().as_bytes());
            member.push(b':');
            member.extend_from_slice(part);
        }
    }
    Bytes::from(member)
}

/// Moves due members of the delay set back into the stream, atomically per call: a script
/// runs alone on the server, so with several sidecars each due entry is promoted exactly once,
/// and a crash leaves it either still in the set or already in the stream.
static PROMOTE: LazyLock<Script> = LazyLock::new(|| {
    Script::from_lua(
        r#"
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, member in ipairs(due) do
  local args = {}
  local i = string.find(member, '\n', 1, true) + 1
  while i <= #member do
    local colon = string.find(member, ':', i, true)
    local len = tonumber(string.sub(member, i, colon - 1))
    args[#args + 1] = string.sub(member, colon + 1, colon + len)
    i = colon + len + 1
  end
  redis.call('XADD', KEYS[2], '*', unpack(args))
  redis.call('ZREM', KEYS[1], member)
end
return #due
"#,
    )
});

/// Promotes up to `limit` entries whose delay has passed by `now_ms`. Returns how many.
pub async fn promote_due(
    client: &Client,
    keys: &StreamKeys,
    now_ms: u64,
    limit: u32,
) -> Result<u64, RedisError> {
    PROMOTE
        .evalsha_with_reload::<u64, _, _>(
            client,
            vec![Key::from(keys.delayed.clone()), Key::from(keys.key.clone())],
            vec![now_ms.to_string(), limit.to_string()],
        )
        .await
        .map_err(|e| RedisError::from_fred("EVALSHA", &e))
}

/// Appends entries to a stream in one pipeline; returns their ids.
pub async fn publish(
    client: &Client,
    key: &str,
    entries: Vec<Vec<(Bytes, Bytes)>>,
    max_len: Option<u64>,
) -> Result<Vec<Bytes>, RedisError> {
    let pipeline = client.pipeline();
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
    /// Entries claimed from idle consumers.
    pub claimed: usize,
    /// Round trips this read made: XREADGROUP calls, XAUTOCLAIM calls, XPENDING look-ups.
    pub reads: u32,
    pub claims: u32,
    pub count_lookups: u32,
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
}

impl StreamReader {
    /// A reader that first delivers the consumer's own pending entries.
    pub fn new(
        client: Client,
        source: &StreamSource,
        block: Duration,
        reclaim_interval: Duration,
    ) -> Self {
        Self {
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
        let mut batch = ReadBatch::default();
        if Instant::now() >= self.next_reclaim {
            self.next_reclaim = Instant::now() + self.reclaim_interval;
            batch.claims += 1;
            let claimed = self.autoclaim(count).await?;
            if !claimed.is_empty() {
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
        for entry in &mut batch.entries {
            entry.delivery_count = 1 + entry.earlier_attempts();
        }
        Ok(batch)
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
        let Value::Array(streams) = reply else {
            return Ok(Vec::new()); // nil: BLOCK timed out
        };
        let mut deleted = Vec::new();
        let mut entries = Vec::new();
        for stream in streams {
            let Value::Array(pair) = stream else { continue };
            if let Some(list) = pair.into_iter().nth(1) {
                entries.extend(parse_entries("XREADGROUP", list, &mut deleted)?);
            }
        }
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
    use crate::window::{Command, Limits, Window};

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
    fn pipeline_mode_is_the_kept_segments_then_one_xack() {
        let plan = plan_flush(&keys(), &diagram(), Mode::Pipeline, 0);
        assert_eq!(
            plan.render(),
            vec!["INCR k1", "INCR k3", "XACK orders g 1-0 2-0 3-0"]
        );
        assert_eq!(plan.side_effects, 2);
        assert_eq!(plan.settles, 3);
    }

    #[test]
    fn atomic_mode_wraps_each_kept_segment_with_its_own_settle() {
        let plan = plan_flush(&keys(), &diagram(), Mode::Atomic, 0);
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
        let plan = plan_flush(&keys(), &batch, Mode::Pipeline, 1_000);
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
    fn delayed_members_encode_binary_fields() {
        let member = encode_delayed(
            &Bytes::from_static(b"5-1"),
            &[(Bytes::from_static(b"a:b"), Bytes::from_static(b"\n\x00x"))],
        );
        assert_eq!(member.as_ref(), b"5-1\n3:a:b3:\n\x00x");
    }
}
