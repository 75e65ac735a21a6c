//! The members of a partitioned stream's group: a sorted set beside the stream
//! (`{key}:window:members:<group>`) of the replicas reading it, each scored with the time its
//! membership expires by Redis's clock. A member renews itself while it lives, leaves when it
//! closes, and drops out by itself when its sidecar dies. Every call answers with the live
//! members, from which each replica computes who reads which partition.
//!
//! When Redis refuses the write (OOM, ACL, the key holding another type), the script fails
//! before it changes anything and the caller keeps its last view; what a replica reads is still
//! guarded by the partitions' own consumer leases, so a stale view only delays a hand-over.

use std::sync::LazyLock;
use std::time::Duration;

use bytes::Bytes;
use fred::prelude::*;
use fred::types::scripts::Script;

use super::RedisError;
use super::keys::companion_key;

/// Drops the members of KEYS[1] whose time ran out; then renews ARGV[1] for ARGV[2] ms, or
/// removes it when ARGV[2] is 0. Answers the live members. `TIME` is Redis's clock, the same
/// for every replica, so no replica's clock skew decides who is alive.
static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::from_lua(
        r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if ttl > 0 then
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
  redis.call('PEXPIRE', KEYS[1], ttl * 2)
else
  redis.call('ZREM', KEYS[1], ARGV[1])
end
return redis.call('ZRANGE', KEYS[1], 0, -1)
"#,
    )
});

/// One replica's membership of a partitioned stream's group.
#[derive(Clone, Debug)]
pub(crate) struct Membership {
    pub(crate) key: Bytes,
    pub(crate) member: Bytes,
    pub(crate) ttl: Duration,
}

impl Membership {
    /// The membership of `member` in `group` of the partitioned stream `stream`.
    pub(crate) fn new(stream: &str, group: &str, member: &str, ttl: Duration) -> Self {
        Self {
            key: Bytes::from(companion_key(stream, &format!("window:members:{group}"))),
            member: Bytes::from(member.to_owned()),
            ttl,
        }
    }

    /// Joins or stays: the live members, this one among them.
    pub(crate) async fn renew(&self, client: &Client) -> Result<Vec<String>, RedisError> {
        self.call(client, self.ttl.as_millis().max(1) as i64).await
    }

    /// Leaves: the others read on without waiting for this membership to expire.
    pub(crate) async fn leave(&self, client: &Client) -> Result<(), RedisError> {
        self.call(client, 0).await.map(drop)
    }

    async fn call(&self, client: &Client, ttl: i64) -> Result<Vec<String>, RedisError> {
        let members: Vec<Bytes> = RENEW
            .evalsha_with_reload(
                client,
                vec![Key::from(self.key.clone())],
                vec![Value::Bytes(self.member.clone()), Value::Integer(ttl)],
            )
            .await
            .map_err(|e| RedisError::from_fred("EVALSHA", &e))?;
        Ok(members
            .iter()
            .map(|m| String::from_utf8_lossy(m).into_owned())
            .collect())
    }
}
