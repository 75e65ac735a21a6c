//! The stream form: a Redis Stream read through a consumer group. Here, its names in Redis
//! ([`StreamKeys`]) and its group; [`read`] how it reads (own pending entries first, then new
//! ones, with periodic reclaim of idle entries, and the read-ahead a flush carries); [`settle`]
//! its part of a flush plan (XACK or XACKDEL, retries kept pending in the group, dead letters);
//! [`groups`] what XINFO GROUPS says of a group.

use std::sync::LazyLock;

use bytes::Bytes;
use fred::prelude::*;
use fred::types::scripts::Script;

use super::{RedisError, arg, call_at, companion_key, str_arg};
use crate::domain::StreamSource;

/// The Redis names a stream subscription uses.
#[derive(Clone, Debug)]
pub struct StreamKeys {
    pub key: Bytes,
    pub group: Bytes,
    pub consumer: Bytes,
    /// The delay set of copies an earlier version wrote for `retry_after`, still promoted
    /// (appended to the stream) when due, so that they are delivered once after an upgrade.
    pub delayed: Bytes,
    /// The group's delay set: the ids of its entries kept pending until their `retry_after`
    /// is due, scored by that time (Unix ms). Per group, so that no other group waits on it.
    pub due: Bytes,
    /// The name of a consumer's lease in the group, but for the consumer's name.
    pub lease_prefix: Bytes,
    /// The stream key's hash slot: where its commands go on a cluster.
    pub slot: u16,
    /// Where entries past the delivery cap go.
    pub dead_letter: Option<Bytes>,
    /// `key/group`, as dead letters record it.
    pub subscription: String,
    /// Retention by acknowledgement on a server with `XACKDEL`: a settle deletes what no
    /// other group still references.
    pub ack_delete: bool,
}

impl StreamKeys {
    pub fn new(source: &StreamSource) -> Self {
        let bytes = |s: &str| Bytes::copy_from_slice(s.as_bytes());
        Self {
            key: bytes(&source.key),
            group: bytes(&source.group),
            consumer: bytes(&source.consumer),
            delayed: Bytes::from(companion_key(&source.key, "window:delayed")),
            due: Bytes::from(due_key(&source.key, &source.group)),
            lease_prefix: Bytes::from(lease_key(&source.key, &source.group, "")),
            slot: fred::util::redis_keyslot(source.key.as_bytes()),
            dead_letter: None,
            subscription: format!("{}/{}", source.key, source.group),
            ack_delete: false,
        }
    }
}

/// The lease on a stream group's consumer name (see [`crate::redis::lease`]).
pub(crate) fn lease_key(key: &str, group: &str, consumer: &str) -> String {
    companion_key(key, &format!("window:lease:{group}:{consumer}"))
}

/// The delay set of a stream group's entries kept pending until their `retry_after` is due.
pub(crate) fn due_key(key: &str, group: &str) -> String {
    companion_key(key, &format!("window:delayed:{group}"))
}

/// Makes the entries of group ARGV[1] of the stream KEYS[1] whose `retry_after` is due in the
/// group's delay set KEYS[2] deliverable by whoever reclaims next, when the consumer holding
/// them is gone: at most ARGV[3] members due by Redis's clock, each looked up in the pending
/// entries list (`XPENDING`). An entry no longer pending (settled, or deleted) leaves the set.
/// One whose consumer holds no lease (ARGV[2] followed by the consumer's name: its sidecar
/// stopped, crashed or scaled to zero) is made idle for ARGV[4] ms (`XCLAIM … IDLE n JUSTID`,
/// to the same consumer, its count untouched), past any reclaim's `min_idle`, and leaves the
/// set: the next `XAUTOCLAIM` of the group takes it, and the work gauges count it at once. One
/// whose consumer lives is that sidecar's to deliver, from memory, when due; its member stays
/// a minute past its due time (a restart of that sidecar may still be reading it) and then
/// leaves. Replies how many it made deliverable.
///
/// When Redis refuses: `READONLY` (a replica) or `NOPERM` fails it at its first write, the
/// entries stay pending and their members in the set, tried again at the next promotion; a
/// refused `XCLAIM` leaves that member too. Out of memory stops nothing: `XCLAIM`, `ZREM`
/// and the reads are not `denyoom` (no shebang: the lease keys it reads are named from the
/// consumers it finds, which a `#!lua` script could not read undeclared; they share the
/// stream's slot).
static PROMOTE_IN_GROUP: LazyLock<Script> = LazyLock::new(|| {
    Script::from_lua(
        r#"
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[3]))
local moved = 0
for i = 1, #due, 2 do
  local id, at = due[i], tonumber(due[i + 1])
  local row = redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1)[1]
  if not row then
    redis.call('ZREM', KEYS[2], id)
  elseif redis.call('EXISTS', ARGV[2] .. row[2]) == 0 then
    redis.call('XCLAIM', KEYS[1], ARGV[1], row[2], 0, id, 'IDLE', ARGV[4], 'JUSTID')
    redis.call('ZREM', KEYS[2], id)
    moved = moved + 1
  elseif at < now - 60000 then
    redis.call('ZREM', KEYS[2], id)
  end
end
return moved
"#,
    )
});

/// The idle time [`PROMOTE_IN_GROUP`] gives a due entry of a consumer that is gone: a year,
/// past any `min_idle`, and well below the Unix time in ms (which Redis would take for a
/// delivery time before 1970 and replace with now).
const IDLE_WHEN_DUE_MS: u64 = 365 * 24 * 3600 * 1000;

/// The due `retry_after` entries of the group whose consumer is gone, made deliverable by the
/// next reclaim ([`PROMOTE_IN_GROUP`]). Returns how many.
pub(crate) async fn promote_in_group(
    client: &Client,
    keys: &StreamKeys,
    limit: u32,
) -> Result<u64, RedisError> {
    let due: u64 = PROMOTE_IN_GROUP
        .evalsha_with_reload(
            client,
            vec![Key::from(keys.key.clone()), Key::from(keys.due.clone())],
            vec![
                Value::Bytes(keys.group.clone()),
                Value::Bytes(keys.lease_prefix.clone()),
                Value::from(limit),
                Value::from(IDLE_WHEN_DUE_MS as i64),
            ],
        )
        .await
        .map_err(|e| RedisError::from_fred("EVALSHA", &e))?;
    Ok(due)
}

/// Where a newly created group starts.
pub(super) fn group_start(source: &StreamSource) -> &str {
    if source.start_id.is_empty() {
        "0"
    } else {
        &source.start_id
    }
}

/// Creates the consumer group (and the stream) unless it exists.
pub(crate) async fn ensure_group(client: &Client, source: &StreamSource) -> Result<(), RedisError> {
    let keys = StreamKeys::new(source);
    create_group(client, &keys, group_start(source).as_bytes()).await
}

/// `XGROUP CREATE … <start> MKSTREAM`; a group that exists already is fine.
pub(super) async fn create_group<C: ClientLike>(
    client: &C,
    keys: &StreamKeys,
    start: &[u8],
) -> Result<(), RedisError> {
    let args = vec![
        str_arg("CREATE"),
        arg(&keys.key),
        arg(&keys.group),
        Value::Bytes(Bytes::copy_from_slice(start)),
        str_arg("MKSTREAM"),
    ];
    match call_at(client, "XGROUP", args, false, Some(keys.slot)).await {
        Ok(_) => Ok(()),
        Err(RedisError::Refused { message, .. }) if message.starts_with("BUSYGROUP") => Ok(()),
        Err(err) => Err(err),
    }
}

mod groups;
mod read;
mod settle;

/// The deliveries the group's pending entries list counts for an entry: its own, not its
/// earlier copies' (which its delivery count adds, and a re-read's look-up adds back).
fn pending_count(entry: &crate::domain::Entry) -> u32 {
    entry
        .delivery_count
        .saturating_sub(entry.earlier_attempts())
}

pub(crate) use groups::{GroupInfo, find_group};
pub(crate) use read::{
    StreamReader, count_due, extend, fetch, read_ahead, read_ahead_reply, uncount,
};

#[cfg(test)]
mod tests;
