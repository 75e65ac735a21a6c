//! Consumer leases: a consumer name is held in Redis by one subscription at a time, whichever
//! sidecar it runs in. The lease is a key beside the subscription's key holding its holder's
//! token, with a TTL: taken when a subscription opens, renewed while it lives, freed at close,
//! and expiring by itself when its holder dies. A reliable list's lease is its consumer's
//! heartbeat key, so the same key says "this name is taken" and "this consumer is alive".

use std::sync::LazyLock;
use std::time::Duration;

use bytes::Bytes;
use fred::prelude::*;
use fred::types::scripts::Script;

use super::RedisError;

/// Takes or renews the lease in KEYS[1] for token ARGV[1] for ARGV[2] ms, when it is free
/// (absent, or freed: empty), already this token's, or held by an earlier run of the same
/// sidecar (its token starts with ARGV[3]); adds ARGV[4] to the set KEYS[2] when given (a
/// reliable list's consumers). 1: held; 0: another holder has it.
static TAKE: LazyLock<Script> = LazyLock::new(|| {
    Script::from_lua(
        r#"
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= '' and holder ~= ARGV[1]
    and string.sub(holder, 1, #ARGV[3]) ~= ARGV[3] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
if KEYS[2] then
  redis.call('SADD', KEYS[2], ARGV[4])
end
return 1
"#,
    )
});

/// Frees the lease in KEYS[1] if token ARGV[1] holds it. With ARGV[2] = 'keep' the key stays
/// until its TTL, empty: free to take, yet still a heartbeat (a reliable list's consumer that
/// closed keeps its processing list for a reopen until `dead_after`).
static FREE: LazyLock<Script> = LazyLock::new(|| {
    Script::from_lua(
        r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if ARGV[2] == 'keep' then
  redis.call('SET', KEYS[1], '', 'KEEPTTL')
else
  redis.call('DEL', KEYS[1])
end
return 1
"#,
    )
});

/// Who holds a lease: one subscription of one sidecar. A sidecar is known by an identity that
/// stays the same when it restarts (its host and listener), so a restarted sidecar takes back
/// the leases its previous run left at once, while any other waits for them to expire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseHolder {
    /// `<sidecar>|`: what every token of this sidecar starts with.
    pub sidecar: Bytes,
    /// `<sidecar>|<subscription>`.
    pub token: Bytes,
}

impl LeaseHolder {
    pub fn new(sidecar: &str, subscription: &str) -> Self {
        Self {
            sidecar: Bytes::from(format!("{sidecar}|")),
            token: Bytes::from(format!("{sidecar}|{subscription}")),
        }
    }
}

/// One subscription's lease on a consumer name.
#[derive(Clone, Debug)]
pub struct ConsumerLease {
    pub key: Bytes,
    /// A reliable list's set of consumers, which recovery walks.
    pub members: Option<(Bytes, Bytes)>,
    pub holder: LeaseHolder,
    pub ttl: Duration,
    /// Freed, the key stays as a heartbeat until its TTL.
    pub keep_when_freed: bool,
}

impl ConsumerLease {
    /// Takes the lease, or renews it: `true` while this holder has it.
    pub async fn take(&self, client: &Client) -> Result<bool, RedisError> {
        let mut keys = vec![Key::from(self.key.clone())];
        let mut args = vec![
            Value::Bytes(self.holder.token.clone()),
            Value::Integer(self.ttl.as_millis().max(1) as i64),
            Value::Bytes(self.holder.sidecar.clone()),
        ];
        if let Some((set, member)) = &self.members {
            keys.push(Key::from(set.clone()));
            args.push(Value::Bytes(member.clone()));
        }
        let held: i64 = TAKE
            .evalsha_with_reload(client, keys, args)
            .await
            .map_err(|e| RedisError::from_fred("EVALSHA", &e))?;
        Ok(held == 1)
    }

    /// Frees the lease if this holder still has it.
    pub async fn free(&self, client: &Client) -> Result<(), RedisError> {
        let keep = if self.keep_when_freed { "keep" } else { "" };
        let _: i64 = FREE
            .evalsha_with_reload(
                client,
                vec![Key::from(self.key.clone())],
                vec![Value::Bytes(self.holder.token.clone()), Value::from(keep)],
            )
            .await
            .map_err(|e| RedisError::from_fred("EVALSHA", &e))?;
        Ok(())
    }
}
