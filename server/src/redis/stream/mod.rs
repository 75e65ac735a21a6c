//! The stream form: a Redis Stream read through a consumer group. Here, its names in Redis
//! ([`StreamKeys`]) and its group; [`read`] how it reads (own pending entries first, then new
//! ones, with periodic reclaim of idle entries, and the read-ahead a flush carries); [`settle`]
//! its part of a flush plan (XACK or XACKDEL, durable retry copies, dead letters).

use bytes::Bytes;
use fred::prelude::*;

use super::{RedisError, arg, call_at, companion_key, str_arg};
use crate::domain::StreamSource;

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
            slot: fred::util::redis_keyslot(source.key.as_bytes()),
            dead_letter: None,
            subscription: format!("{}/{}", source.key, source.group),
            ack_delete: false,
        }
    }
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

mod read;
mod settle;

/// The deliveries the group's pending entries list counts for an entry: its own, not its
/// earlier copies' (which its delivery count adds, and a re-read's look-up adds back).
fn pending_count(entry: &crate::domain::Entry) -> u32 {
    entry
        .delivery_count
        .saturating_sub(entry.earlier_attempts())
}

pub(crate) use read::{StreamReader, extend, fetch, read_ahead, read_ahead_reply, uncount};

#[cfg(test)]
mod tests;
