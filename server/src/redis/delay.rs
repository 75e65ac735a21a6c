//! The durable delay set behind `retry_after`: a sorted set scored by due time (Unix ms) whose
//! members carry what to write back, and the script that writes due members back. The script
//! runs alone on the server, so with several sidecars each due member is promoted exactly once,
//! and a crash leaves it either still in the set or already back in its source.

use std::sync::LazyLock;

use bytes::Bytes;
use fred::prelude::*;
use fred::types::scripts::Script;

use super::RedisError;

/// Where a promoted member is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// XADD to the stream (member: field, value, field, value, …).
    Stream,
    /// LPUSH to the list (member: the value), the end producers push to.
    List,
    /// PUBLISH (member: channel, message).
    Publish,
}

impl Target {
    fn as_str(self) -> &'static str {
        match self {
            Target::Stream => "stream",
            Target::List => "list",
            Target::Publish => "publish",
        }
    }
}

/// A delay-set member: a unique token (an entry id, or a random one where values repeat), a
/// newline, then each part as `<length>:<bytes>`, which the promoter decodes. Binary-safe.
pub fn encode(token: &[u8], parts: impl IntoIterator<Item = Bytes>) -> Bytes {
    let mut member = Vec::with_capacity(token.len() + 64);
    member.extend_from_slice(token);
    member.push(b'\n');
    for part in parts {
        member.extend_from_slice(part.len().to_string().as_bytes());
        member.push(b':');
        member.extend_from_slice(&part);
    }
    Bytes::from(member)
}

/// A token no other member has, for values that may repeat (list values, messages).
pub fn unique_token() -> Bytes {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    Bytes::from(format!("{:016x}", hasher.finish()))
}

/// Writes each due member of the delay set KEYS[1] back to KEYS[2] (ARGV[3] says how), then
/// removes it: at most ARGV[2] members due by ARGV[1] (Unix ms).
///
/// When Redis refuses: declared with a shebang, the script is refused whole when Redis is out
/// of memory or a replica (nothing moves). A copy refused inside it (`NOPERM`, `WRONGTYPE` on
/// the target) raises before that member's `ZREM`: the member stays in the set and is tried
/// again at the next promotion, and the members before it are promoted.
static PROMOTE: LazyLock<Script> = LazyLock::new(|| {
    Script::from_lua(
        r#"#!lua
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, member in ipairs(due) do
  local parts = {}
  local i = string.find(member, '\n', 1, true) + 1
  while i <= #member do
    local colon = string.find(member, ':', i, true)
    local len = tonumber(string.sub(member, i, colon - 1))
    parts[#parts + 1] = string.sub(member, colon + 1, colon + len)
    i = colon + len + 1
  end
  if ARGV[3] == 'stream' then
    redis.call('XADD', KEYS[2], '*', unpack(parts))
  elseif ARGV[3] == 'list' then
    redis.call('LPUSH', KEYS[2], parts[1])
  else
    redis.call('PUBLISH', parts[1], parts[2])
  end
  redis.call('ZREM', KEYS[1], member)
end
return #due
"#,
    )
});

/// Moves up to `limit` members due by `now_ms` from `delayed` back to `target_key`. Returns how
/// many.
pub async fn promote_due(
    client: &Client,
    delayed: &Bytes,
    target_key: &Bytes,
    target: Target,
    now_ms: u64,
    limit: u32,
) -> Result<u64, RedisError> {
    PROMOTE
        .evalsha_with_reload::<u64, _, _>(
            client,
            vec![Key::from(delayed.clone()), Key::from(target_key.clone())],
            vec![
                now_ms.to_string(),
                limit.to_string(),
                target.as_str().to_owned(),
            ],
        )
        .await
        .map_err(|e| RedisError::from_fred("EVALSHA", &e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_encode_binary_parts() {
        let member = encode(
            b"5-1",
            [Bytes::from_static(b"a:b"), Bytes::from_static(b"\n\x00x")],
        );
        assert_eq!(member.as_ref(), b"5-1\n3:a:b3:\n\x00x");
        assert_ne!(unique_token(), unique_token());
    }
}
