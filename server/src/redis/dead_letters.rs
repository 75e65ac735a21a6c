//! Dead letters as Redis keeps them: a dead-letter stream's entries or a dead-letter list's
//! values, read oldest first and decoded (as [`Letter`]s), and the scripts that redrive or purge
//! one. A redrive puts the dead letter back and removes it in one script, so a crash leaves
//! each dead letter either still there or redriven once, and two redrives of the same one put
//! it back once.
//!
//! A stream dead letter sent back to its own origin re-enters only the consumer group it came
//! from ([`REENTER_STREAM`]): its original entry, still in the stream, is made pending in that
//! group again (`XCLAIM … FORCE`), so no other group of the stream sees it a second time. A
//! redrive to a target the caller names writes a copy instead ([`REDRIVE_STREAM`],
//! [`REDRIVE_LIST`]).
//!
//! Redis runs a script's commands without rolling back those before one it refuses, so a
//! script that removed the dead letter first and then had its write refused destroyed it. The
//! scripts therefore look the dead letter up without removing it, write, and remove the dead
//! letter last, after checking that they may. Each says `#!lua` (no `allow-oom`) so that under
//! `maxmemory` Redis refuses it whole before it runs, rather than letting a non-shebang
//! script's first write through; such a script must name in KEYS every key it touches, as it
//! does.

use std::sync::LazyLock;

use fred::prelude::*;
use fred::types::scripts::Script;

use super::entry::parse_entries;
use super::{RedisError, call, str_arg};
use crate::domain::letter::{Choice, Destination, Letter, Redrive, Selection, Store};

/// Dead letters read per round trip while scanning.
const PAGE: usize = 1_000;

/// The consumer a redriven entry is pending on in its group. No subscription reads under this
/// name (theirs are their pod's, host's or client's), so the entry is no live consumer's own:
/// the next reclaim (`XAUTOCLAIM`) of any live subscriber of the group takes it, as it takes
/// the entries of a consumer that went away, and until then `XINFO CONSUMERS` and `XPENDING`
/// show what waits here.
pub(crate) const REDRIVEN_CONSUMER: &str = "window:redriven";

/// How idle a redriven entry is made: ten years, past any subscription's `min_idle`, so the
/// group's first reclaim takes it; and short of the time since 1970, since Redis takes an idle
/// time reaching back before it for a mistake and makes the entry idle from now instead.
pub(crate) const REDRIVEN_IDLE_MS: u64 = 10 * 365 * 24 * 60 * 60 * 1000;

/// How many dead letters the store holds.
pub(crate) async fn count(client: &Client, store: &Store) -> Result<u64, RedisError> {
    let (name, key) = match store {
        Store::Stream(key) => ("XLEN", key),
        Store::List(key) => ("LLEN", key),
    };
    let reply = call(client, name, vec![str_arg(key)], false).await?;
    Ok(reply.as_u64().unwrap_or(0))
}

/// The dead letters `selection` chooses, oldest first, at most `limit` (one per id asked).
pub(crate) async fn select(
    client: &Client,
    store: &Store,
    selection: &Selection,
    now_ms: u64,
    limit: usize,
) -> Result<Vec<Letter>, RedisError> {
    let mut choice = Choice::new(selection, now_ms, limit);
    match store {
        Store::Stream(key) => {
            let (mut start, end) = id_range(&selection.ids);
            loop {
                let args = vec![
                    str_arg(key),
                    str_arg(&start),
                    str_arg(&end),
                    str_arg("COUNT"),
                    str_arg(&PAGE.to_string()),
                ];
                let reply = call(client, "XRANGE", args, false).await?;
                let page = parse_entries("XRANGE", reply, &mut Vec::new())?;
                let full = page.len() == PAGE;
                let Some(last) = page.last() else { break };
                start = format!("({}", String::from_utf8_lossy(&last.id));
                for entry in page {
                    if choice.offer(Letter::from_entry(entry)) {
                        return Ok(choice.into_letters());
                    }
                }
                if !full {
                    break;
                }
            }
        }
        Store::List(key) => {
            // Dead letters are pushed at the head: the oldest is the last. Index 0 is the
            // oldest, so an index stays put while new dead letters arrive.
            let mut from_tail = 0usize;
            loop {
                let end = -1 - from_tail as i64;
                let start = end - PAGE as i64 + 1;
                let args = vec![
                    str_arg(key),
                    str_arg(&start.to_string()),
                    str_arg(&end.to_string()),
                ];
                let reply = call(client, "LRANGE", args, false).await?;
                let Value::Array(values) = reply else { break };
                let full = values.len() == PAGE;
                for value in values.into_iter().rev() {
                    let Some(value) = super::entry::into_bytes(value) else {
                        continue;
                    };
                    let letter = Letter::from_value(from_tail, value);
                    from_tail += 1;
                    if choice.offer(letter) {
                        return Ok(choice.into_letters());
                    }
                }
                if !full {
                    break;
                }
            }
        }
    }
    Ok(choice.into_letters())
}

/// The part of a stream that holds every entry `ids` names (`-` to `+` when no ids are asked
/// or one is no stream id): a selection by ids, such as each batch of the command's redrive,
/// reads only that part instead of the stream from its start.
fn id_range(ids: &[String]) -> (String, String) {
    let parse = |id: &String| -> Option<(u64, u64)> {
        let (ms, seq) = id.split_once('-')?;
        Some((ms.parse().ok()?, seq.parse().ok()?))
    };
    let parsed: Option<Vec<(u64, u64)>> = ids.iter().map(parse).collect();
    match parsed.as_deref().map(|p| (p.iter().min(), p.iter().max())) {
        Some((Some((ms, seq)), Some((last_ms, last_seq)))) => {
            (format!("{ms}-{seq}"), format!("{last_ms}-{last_seq}"))
        }
        _ => ("-".to_owned(), "+".to_owned()),
    }
}

/// Puts a stream dead letter's original entry back into the consumer group it came from and
/// then deletes the dead letter, if it is still there: `KEYS[1]` the dead letter, `KEYS[2]` the
/// origin stream, `ARGV[1]` the dead letter's id, `ARGV[2]` the group, `ARGV[3]` the original
/// entry's id, `ARGV[4]` the consumer ([`REDRIVEN_CONSUMER`]), `ARGV[5]` the idle time
/// ([`REDRIVEN_IDLE_MS`]). `XCLAIM … 0 <id> IDLE … RETRYCOUNT 0 FORCE JUSTID` makes the entry
/// pending in that group alone, under its own id, its delivery count reset, idle so that a live
/// subscriber of the group reclaims it; the stream gets no new entry, so no other group reads
/// it again. Replies the entry's id; nil when the dead letter was gone; 0 when the entry is no
/// longer in the stream (trimmed by retention, or deleted): it cannot re-enter one group
/// alone, and the dead letter stays.
///
/// When Redis refuses a write, the dead letter stays and the group is as it was:
/// - OOM (`maxmemory`, `noeviction`): the script, which does not say `allow-oom`, is refused
///   whole before it runs.
/// - READONLY (a replica): refused whole before it runs, as a script that may write.
/// - NOPERM: keys the user may not write are refused whole (EVALSHA declares its keys
///   read-write); a user denied XCLAIM or XDEL gets the script's own NOPERM before anything
///   was written (checked first: Redis 7.0 words a command denied inside a script as a bare
///   ERR, and a refused XDEL after the XCLAIM would leave the dead letter and the entry
///   pending both).
/// - WRONGTYPE: a dead letter or an origin that is no stream fails its XRANGE, before anything
///   was written. The XCLAIM and XDEL cannot meet it: the XRANGEs just read both keys as
///   streams.
/// - NOGROUP (the group was deleted, or never created): the XCLAIM writes nothing; the script
///   replies its own NOGROUP naming the stream and the group.
///
/// The XDEL runs only once the XCLAIM claimed the entry.
static REENTER_STREAM: LazyLock<Script> = LazyLock::new(|| {
    Script::from_lua(
        r#"#!lua
if #redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1]) == 0 then return false end
if not redis.acl_check_cmd('XDEL', KEYS[1], ARGV[1]) then
  return redis.error_reply("NOPERM the sidecar's Redis user may not run XDEL on " .. KEYS[1])
end
if not redis.acl_check_cmd('XCLAIM', KEYS[2], ARGV[2], ARGV[4], '0', ARGV[3]) then
  return redis.error_reply("NOPERM the sidecar's Redis user may not run XCLAIM on " .. KEYS[2])
end
if #redis.call('XRANGE', KEYS[2], ARGV[3], ARGV[3]) == 0 then return 0 end
local claimed = redis.pcall('XCLAIM', KEYS[2], ARGV[2], ARGV[4], 0, ARGV[3],
  'IDLE', ARGV[5], 'RETRYCOUNT', 0, 'FORCE', 'JUSTID')
if type(claimed) == 'table' and claimed.err then
  if string.sub(claimed.err, 1, 8) == 'NOGROUP ' then
    return redis.error_reply('NOGROUP stream ' .. KEYS[2] .. ' has no consumer group ' ..
      ARGV[2] .. ' (deleted, or never created)')
  end
  return claimed
end
if #claimed == 0 then return 0 end
redis.call('XDEL', KEYS[1], ARGV[1])
return ARGV[3]
"#,
    )
});

/// Appends a dead-letter stream entry's copy to the stream a redrive names and then deletes the
/// entry, if it is still there: `KEYS[1]` the dead letter, `KEYS[2]` the target, `ARGV[1]` the
/// id, then the copy's fields. Replies the copy's id, or nil when the dead letter was gone.
/// Every group of the target reads the copy.
///
/// When Redis refuses a write, the dead letter stays and no copy is written:
/// - OOM (`maxmemory`, `noeviction`): the script, which does not say `allow-oom`, is refused
///   whole before it runs.
/// - READONLY (a replica): refused whole before it runs, as a script that may write.
/// - NOPERM: keys the user may not write are refused whole (EVALSHA declares its keys
///   read-write); a user denied XDEL gets the script's own NOPERM before the XADD, since a
///   refused XDEL after it would leave the dead letter and its copy both.
/// - WRONGTYPE: a dead letter that is no stream fails the XRANGE, an origin that is no stream
///   the XADD, both before anything was written. The XDEL cannot meet it: the XRANGE just read
///   that key as a stream.
static REDRIVE_STREAM: LazyLock<Script> = LazyLock::new(|| {
    Script::from_lua(
        r#"#!lua
if #redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1]) == 0 then return false end
if not redis.acl_check_cmd('XDEL', KEYS[1], ARGV[1]) then
  return redis.error_reply("NOPERM the sidecar's Redis user may not run XDEL on " .. KEYS[1])
end
local id = redis.call('XADD', KEYS[2], '*', unpack(ARGV, 2))
redis.call('XDEL', KEYS[1], ARGV[1])
return id
"#,
    )
});

/// Pushes a dead-letter list value's copy where producers push (on its origin list or the
/// target a redrive names) and then removes one
/// occurrence of the value (from the oldest end), if there is one: `KEYS[1]` the dead letter,
/// `KEYS[2]` the origin, `ARGV[1]` the value as stored, `ARGV[2]` the copy. Replies 1, or 0
/// when it was gone.
///
/// When Redis refuses a write, the dead letter stays and no copy is written:
/// - OOM (`maxmemory`, `noeviction`): the script, which does not say `allow-oom`, is refused
///   whole before it runs.
/// - READONLY (a replica): refused whole before it runs, as a script that may write.
/// - NOPERM: keys the user may not write are refused whole (EVALSHA declares its keys
///   read-write); a user denied LREM gets the script's own NOPERM before the LPUSH, since a
///   refused LREM after it would leave the dead letter and its copy both.
/// - WRONGTYPE: a dead letter that is no list fails the LPOS, an origin that is no list the
///   LPUSH, both before anything was written. The LREM cannot meet it: the LPOS just read that
///   key as a list.
static REDRIVE_LIST: LazyLock<Script> = LazyLock::new(|| {
    Script::from_lua(
        r#"#!lua
if not redis.call('LPOS', KEYS[1], ARGV[1], 'RANK', -1) then return 0 end
if not redis.acl_check_cmd('LREM', KEYS[1], '-1', ARGV[1]) then
  return redis.error_reply("NOPERM the sidecar's Redis user may not run LREM on " .. KEYS[1])
end
redis.call('LPUSH', KEYS[2], ARGV[2])
redis.call('LREM', KEYS[1], -1, ARGV[1])
return 1
"#,
    )
});

/// Redrives one dead letter to `destination`, atomically.
pub(crate) async fn redrive(
    client: &Client,
    store: &Store,
    letter: &Letter,
    destination: &Destination,
    now_ms: u64,
) -> Result<Redrive, RedisError> {
    let keys = vec![Key::from(store.key()), Key::from(destination.key())];
    let failed = |e: fred::error::Error| RedisError::from_fred("EVALSHA", &e);
    match (store, destination) {
        (
            Store::Stream(_),
            Destination::Group {
                group, entry_id, ..
            },
        ) => {
            let args = vec![
                Value::from(letter.id.as_str()),
                Value::from(group.as_str()),
                Value::from(entry_id.as_str()),
                Value::from(REDRIVEN_CONSUMER),
                Value::from(REDRIVEN_IDLE_MS.to_string()),
            ];
            let reply: Value = REENTER_STREAM
                .evalsha_with_reload(client, keys, args)
                .await
                .map_err(failed)?;
            Ok(match reply {
                Value::Null => Redrive::Gone,
                Value::Integer(_) => Redrive::NotInStream,
                id => Redrive::Reentered(id.as_string().unwrap_or_default()),
            })
        }
        (Store::Stream(_), Destination::Copy(_)) => {
            let mut args = vec![Value::from(letter.id.as_str())];
            for (field, value) in letter.redriven_fields(now_ms) {
                args.extend([Value::Bytes(field), Value::Bytes(value)]);
            }
            let reply: Value = REDRIVE_STREAM
                .evalsha_with_reload(client, keys, args)
                .await
                .map_err(failed)?;
            Ok(match reply.as_string() {
                Some(id) => Redrive::Written(Some(id)),
                None => Redrive::Gone,
            })
        }
        (Store::List(_), _) => {
            let args = vec![
                Value::Bytes(letter.stored.clone()),
                Value::Bytes(letter.redriven_value(now_ms)),
            ];
            let moved: u64 = REDRIVE_LIST
                .evalsha_with_reload(client, keys, args)
                .await
                .map_err(failed)?;
            Ok(if moved == 1 {
                Redrive::Written(None)
            } else {
                Redrive::Gone
            })
        }
    }
}

/// Removes one dead letter (one occurrence of a list value: of identical values the caller
/// chose as many as it means to remove); returns whether it was still there.
///
/// One command, no script: it writes nothing, so it runs under `maxmemory` too (XDEL and LREM
/// are allowed there, and purging is how an operator frees that memory). When Redis refuses
/// it (READONLY, NOPERM, WRONGTYPE if the key changed type since it was read) the dead letter
/// stays; the error is the caller's to report.
pub(crate) async fn purge(
    client: &Client,
    store: &Store,
    letter: &Letter,
) -> Result<bool, RedisError> {
    let (name, args) = match store {
        Store::Stream(key) => ("XDEL", vec![str_arg(key), str_arg(&letter.id)]),
        Store::List(key) => (
            "LREM",
            vec![
                str_arg(key),
                str_arg("-1"),
                Value::Bytes(letter.stored.clone()),
            ],
        ),
    };
    let reply = call(client, name, args, false).await?;
    Ok(reply.as_u64().unwrap_or(0) > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_bound_the_part_of_the_stream_read() {
        let ids = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let range = |from: &str, to: &str| (from.to_owned(), to.to_owned());
        assert_eq!(id_range(&ids(&["5-1", "3-9", "5-0"])), range("3-9", "5-1"));
        assert_eq!(id_range(&[]), range("-", "+"));
        assert_eq!(id_range(&ids(&["3-9", "0:00ff"])), range("-", "+"));
    }
}
