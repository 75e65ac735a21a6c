//! Retention by acknowledgement on streams: entries leave a stream once every consumer group of
//! it has acknowledged them, whoever consumes the other groups.
//!
//! Two ways, chosen by what the server offers (see [`super::server`]): where `XACKDEL` exists
//! (Redis 8.2, Valkey 9.2) a settle is `XACKDEL … ACKED`, which deletes an entry the moment the
//! last group that references it acknowledges it; everywhere, a background trim
//! ([`trim_acknowledged`]) cuts the stream's head below the lowest position any group still
//! needs, which also catches entries whose last acknowledgement came from a consumer that only
//! sends `XACK`. The trim reads the groups and trims in one script, so no group can be created
//! or move between what it reads and what it cuts.

use std::sync::LazyLock;

use bytes::Bytes;
use fred::prelude::*;
use fred::types::scripts::Script;

use super::RedisError;

/// Reads every group's position and trims below the lowest one, atomically.
///
/// A group needs its pending entries (the smallest pending id) and everything after its
/// last-delivered id (the trim keeps that entry itself, to compare ids as strings of two
/// numbers without carrying a sequence past 2^53). A group whose `lag` is absent (a Redis
/// that cannot tell how far it has read, or one older than 7.0) stops the trim altogether.
/// Replies `{"trimmed", n, floor}`, `{"unknown", group}` or `{"none"}` (no groups: nobody has
/// acknowledged anything, so nothing leaves).
static TRIM: LazyLock<Script> = LazyLock::new(|| {
    Script::from_lua(
        r#"
local function parse(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local function lower(a, b)
  if a == nil then return b end
  local am, as = parse(a)
  local bm, bs = parse(b)
  if bm < am or (bm == am and bs < as) then return b end
  return a
end
local groups = redis.call('XINFO', 'GROUPS', KEYS[1])
if #groups == 0 then return {'none'} end
local floor = nil
for _, g in ipairs(groups) do
  local f = {}
  for i = 1, #g, 2 do f[g[i]] = g[i + 1] end
  if not f['lag'] then return {'unknown', f['name']} end
  floor = lower(floor, f['last-delivered-id'])
  if tonumber(f['pending']) > 0 then
    floor = lower(floor, redis.call('XPENDING', KEYS[1], f['name'])[2])
  end
end
local n = redis.call('XTRIM', KEYS[1], 'MINID', floor)
return {'trimmed', n, floor}
"#,
    )
});

/// What one trim did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Trim {
    /// `entries` left the stream; every entry from `floor` on is still needed by some group.
    Trimmed { entries: u64, floor: String },
    /// This group's position is unknown (`XINFO GROUPS` has no `lag`): nothing was trimmed.
    Unknown { group: String },
    /// The stream has no group (or does not exist).
    NoGroups,
}

/// Trims `key` below what its groups still need.
pub(crate) async fn trim_acknowledged(client: &Client, key: &Bytes) -> Result<Trim, RedisError> {
    let reply: Value = TRIM
        .evalsha_with_reload(client, vec![Key::from(key.clone())], Vec::<String>::new())
        .await
        .map_err(|e| RedisError::from_fred("EVALSHA", &e))?;
    parse_trim(reply)
}

fn parse_trim(reply: Value) -> Result<Trim, RedisError> {
    let protocol = |detail: &str| RedisError::Protocol {
        command: "EVALSHA",
        detail: format!("retention trim: {detail}"),
    };
    let Value::Array(parts) = reply else {
        return Err(protocol("not an array"));
    };
    let text = |v: Option<&Value>| v.and_then(Value::as_string);
    match text(parts.first()).as_deref() {
        Some("none") => Ok(Trim::NoGroups),
        Some("unknown") => Ok(Trim::Unknown {
            group: text(parts.get(1)).unwrap_or_default(),
        }),
        Some("trimmed") => Ok(Trim::Trimmed {
            entries: parts
                .get(1)
                .and_then(Value::as_u64)
                .ok_or_else(|| protocol("no count"))?,
            floor: text(parts.get(2)).ok_or_else(|| protocol("no floor"))?,
        }),
        _ => Err(protocol("unknown reply")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(text: &str) -> Value {
        Value::String(text.into())
    }

    #[test]
    fn replies_parse() {
        assert_eq!(
            parse_trim(Value::Array(vec![
                s("trimmed"),
                Value::Integer(3),
                s("5-0")
            ]))
            .unwrap(),
            Trim::Trimmed {
                entries: 3,
                floor: "5-0".into()
            }
        );
        assert_eq!(
            parse_trim(Value::Array(vec![s("unknown"), s("late")])).unwrap(),
            Trim::Unknown {
                group: "late".into()
            }
        );
        assert_eq!(
            parse_trim(Value::Array(vec![s("none")])).unwrap(),
            Trim::NoGroups
        );
        assert!(parse_trim(Value::Integer(1)).is_err());
    }
}
