//! Dead letters as Redis keeps them: a dead-letter stream's entries or a dead-letter list's
//! values, read oldest first and decoded (as [`Letter`]s), and the scripts that redrive or purge
//! one. A redrive removes the dead letter and writes its copy in one script, so a crash
//! leaves each dead letter either still there or redriven once, and two redrives of the same
//! one write one copy.

use std::sync::LazyLock;

use fred::prelude::*;
use fred::types::scripts::Script;

use super::entry::parse_entries;
use super::{RedisError, call, str_arg};
use crate::domain::letter::{Letter, Redrive, Selection, Store};

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

/// The dead letters `selection` chooses, oldest first, at most `limit`.
pub(crate) async fn select(
    client: &Client,
    store: &Store,
    selection: &Selection,
    now_ms: u64,
    limit: usize,
) -> Result<Vec<Letter>, RedisError> {
    let mut chosen = Vec::new();
    match store {
        Store::Stream(key) => {
            let mut start = "-".to_owned();
            loop {
                let args = vec![
                    str_arg(key),
                    str_arg(&start),
                    str_arg("+"),
                    str_arg("COUNT"),
                    str_arg(&PAGE.to_string()),
                ];
                let reply = call(client, "XRANGE", args, false).await?;
                let page = parse_entries("XRANGE", reply, &mut Vec::new())?;
                let full = page.len() == PAGE;
                let Some(last) = page.last() else { break };
                start = format!("({}", String::from_utf8_lossy(&last.id));
                for entry in page {
                    let letter = Letter::from_entry(entry);
                    if selection.chooses(&letter, now_ms) {
                        chosen.push(letter);
                        if chosen.len() == limit {
                            return Ok(chosen);
                        }
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
                    if selection.chooses(&letter, now_ms) {
                        chosen.push(letter);
                        if chosen.len() == limit {
                            return Ok(chosen);
                        }
                    }
                }
                if !full {
                    break;
                }
            }
        }
    }
    Ok(chosen)
}

/// Deletes a dead-letter stream entry and, if it was still there, appends its copy to the
/// origin stream: `KEYS[1]` the dead letter, `KEYS[2]` the origin, `ARGV[1]` the id, then the
/// copy's fields. Replies the copy's id, or nil when the dead letter was gone.
static REDRIVE_STREAM: LazyLock<Script> = LazyLock::new(|| {
    Script::from_lua(
        r#"
if redis.call('XDEL', KEYS[1], ARGV[1]) == 0 then return false end
return redis.call('XADD', KEYS[2], '*', unpack(ARGV, 2))
"#,
    )
});

/// Removes one occurrence of a dead-letter list value (from the oldest end) and, if there was
/// one, pushes its copy where producers push: `KEYS[1]` the dead letter, `KEYS[2]` the origin,
/// `ARGV[1]` the value as stored, `ARGV[2]` the copy. Replies 1, or 0 when it was gone.
static REDRIVE_LIST: LazyLock<Script> = LazyLock::new(|| {
    Script::from_lua(
        r#"
if redis.call('LREM', KEYS[1], -1, ARGV[1]) == 0 then return 0 end
redis.call('LPUSH', KEYS[2], ARGV[2])
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

/// Removes one dead letter; returns whether it was still there.
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
