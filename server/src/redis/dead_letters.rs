//! Dead letters as Redis keeps them: a dead-letter stream's entries or a dead-letter list's
//! values, read oldest first and decoded (as [`Letter`]s), and the scripts that redrive or purge
//! one. A redrive writes the copy and removes the dead letter in one script, so a crash
//! leaves each dead letter either still there or redriven once, and two redrives of the same
//! one write one copy.
//!
//! Redis runs a script's commands without rolling back those before one it refuses, so a
//! script that removed the dead letter first and then had its copy refused destroyed it. The
//! scripts therefore look the dead letter up without removing it, write the copy, and remove
//! the dead letter last, after checking that they may. Each says `#!lua` (no `allow-oom`) so
//! that under `maxmemory` Redis refuses it whole before it runs, rather than letting a
//! non-shebang script's first write through; such a script must name in KEYS every key it
//! touches, as it does.

use std::sync::LazyLock;

use fred::prelude::*;
use fred::types::scripts::Script;

use super::entry::parse_entries;
use super::{RedisError, call, str_arg};
use crate::domain::letter::{Choice, Letter, Redrive, Selection, Store};

/// Dead letters read per round trip while scanning.
const PAGE: usize = 1_000;

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

/// Appends a dead-letter stream entry's copy to the origin stream and then deletes the entry,
/// if it is still there: `KEYS[1]` the dead letter, `KEYS[2]` the origin, `ARGV[1]` the id,
/// then the copy's fields. Replies the copy's id, or nil when the dead letter was gone.
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

/// Pushes a dead-letter list value's copy where producers push and then removes one
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

/// Redrives one dead letter to `to`, atomically.
pub(crate) async fn redrive(
    client: &Client,
    store: &Store,
    letter: &Letter,
    to: &str,
    now_ms: u64,
) -> Result<Redrive, RedisError> {
    let keys = vec![Key::from(store.key()), Key::from(to)];
    let failed = |e: fred::error::Error| RedisError::from_fred("EVALSHA", &e);
    match store {
        Store::Stream(_) => {
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
        Store::List(_) => {
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
