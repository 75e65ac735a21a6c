//! What the sidecar samples of a watched stream group or list, as plain numbers:
//!
//! - for the backlog gauges: a stream group's pending count and lag (XINFO
//!   GROUPS), a list's length and what its consumers hold on their processing lists (LLEN),
//!   and the delay set's depth (ZCARD);
//! - for the work-waiting gauge, the work waiting on a stream group: its lag
//!   (entries not yet read; XINFO GROUPS), its pending entries idle longer than min_idle
//!   (another consumer can reclaim them; XPENDING … IDLE) but for those whose `retry_after` is
//!   not due (the group's delay set, ZMSCORE), and the due entries of the delay set of copies an
//!   earlier version wrote (ZCOUNT up to now). When Redis does not report the lag (after XDEL
//!   or trimming past the group, or on a group created at an arbitrary id) the sidecar counts
//!   the entries after the group's last delivered id itself, at most [`COUNT_CAP`], and says so
//!   ([`Work::counted`]). A group that does not exist yet counts the whole stream (a worker's
//!   group reads it from the start). On a list: its length (LLEN) and the due entries of its
//!   delay set.
//!
//! The sampler asks both at once ([`sample`]: one XINFO GROUPS serves both); a subscription
//! that opens, its backlog alone ([`backlog_of`]).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use fred::prelude::*;

use super::entry::into_bytes;
use super::form::Form;
use super::list::{self, ListKeys};
use super::stream::{self, GroupInfo, StreamKeys};
use super::{RedisError, arg, call, call_at, str_arg};

/// The most entries counted one by one (unread entries when the lag is unknown, reclaimable
/// pending entries): a sample stays one bounded round trip per command.
pub(crate) const COUNT_CAP: i64 = 10_000;

/// One sample for the backlog gauges; `None` where Redis did not say.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Backlog {
    /// Streams: the group, if it exists.
    pub group: Option<Group>,
    /// Lists: entries waiting in the list, and entries on consumers' processing lists.
    pub list: Option<(i64, i64)>,
    pub delayed: Option<i64>,
}

/// What XINFO GROUPS says of one group, for the backlog gauges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Group {
    /// The stream has no such group (or no longer).
    Missing,
    /// Its pending entries and its lag (nil when Redis cannot tell).
    Found { pending: i64, lag: Option<i64> },
}

/// What one sample of the work waiting found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Work {
    /// Unread entries (lists: the list's length).
    pub unread: i64,
    /// Whether `unread` was counted because Redis did not say.
    pub counted: bool,
    /// Pending entries idle longer than min_idle.
    pub reclaimable: i64,
    /// Delayed entries already due.
    pub due: i64,
    /// Age of the oldest pending entry, in seconds (0 when none).
    pub oldest_pending_secs: i64,
}

impl Work {
    pub(crate) fn total(&self) -> i64 {
        self.unread + self.reclaimable + self.due
    }
}

/// Samples a watched key for the backlog gauges alone (a subscription that opens shows its
/// backlog at once); what fails is left out (and logged at debug).
pub(crate) async fn backlog_of(client: &Client, form: &Form) -> Backlog {
    match form {
        Form::Stream(keys) => stream_backlog(client, form, &group_info(client, keys).await).await,
        _ => list_backlog(client, form).await,
    }
}

/// Samples a watched key for the backlog gauges and the work-waiting gauge, `min_idle`
/// deciding which pending entries can be reclaimed: one XINFO GROUPS serves both. What fails
/// is left out of the backlog (and logged at debug); the work is all or nothing.
pub(crate) async fn sample(
    client: &Client,
    form: &Form,
    min_idle: Duration,
) -> (Backlog, Result<Work, RedisError>) {
    let now = now_ms();
    match form {
        Form::Stream(keys) => {
            let group = group_info(client, keys).await;
            let backlog = stream_backlog(client, form, &group).await;
            let work = stream_work(client, keys, min_idle, group, now).await;
            (backlog, work)
        }
        Form::List(keys) => (
            list_backlog(client, form).await,
            list_work(client, keys, now).await,
        ),
        Form::PubSub(_) => (list_backlog(client, form).await, Ok(Work::default())),
    }
}

/// What XINFO GROUPS said of a stream's group: `Ok(None)` when the stream has no such group.
/// XINFO GROUPS of a key that does not exist is an error (`ERR no such key`).
type GroupReply = Result<Option<GroupInfo>, RedisError>;

/// XINFO GROUPS of the stream, its group picked out.
async fn group_info(client: &Client, keys: &StreamKeys) -> GroupReply {
    // Routed by the key's slot: the first argument is "GROUPS", not the key.
    let reply = call_at(
        client,
        "XINFO",
        vec![Value::from("GROUPS"), arg(&keys.key)],
        false,
        Some(keys.slot),
    )
    .await?;
    Ok(stream::find_group(reply, &keys.group))
}

/// A stream's backlog: its group as `group` found it, and its delay set's depth.
async fn stream_backlog(client: &Client, form: &Form, group: &GroupReply) -> Backlog {
    let group = match group {
        Ok(Some(GroupInfo { pending, lag, .. })) => Some(Group::Found {
            pending: *pending,
            lag: *lag,
        }),
        Ok(None) => Some(Group::Missing),
        Err(err) => {
            tracing::debug!(error = %err, "sampling XINFO GROUPS failed");
            None
        }
    };
    Backlog {
        group,
        delayed: delay_depth(client, form).await,
        ..Backlog::default()
    }
}

/// A list's backlog (its length and what its consumers hold) and its delay set's depth; of a
/// pub/sub form, which has no backlog in Redis, only the latter.
async fn list_backlog(client: &Client, form: &Form) -> Backlog {
    let mut backlog = Backlog::default();
    if let Form::List(keys) = form {
        match list::depth(client, keys).await {
            Ok(depth) => backlog.list = Some(depth),
            Err(err) => tracing::debug!(error = %err, "sampling a list's length failed"),
        }
    }
    backlog.delayed = delay_depth(client, form).await;
    backlog
}

/// The delay set's depth (ZCARD); `None` when Redis did not say.
async fn delay_depth(client: &Client, form: &Form) -> Option<i64> {
    match call(client, "ZCARD", vec![arg(form.delayed())], false).await {
        Ok(Value::Integer(depth)) => Some(depth),
        _ => None,
    }
}

/// The due entries of a delay set (ZCOUNT up to `now`).
async fn due(client: &Client, delayed: &Bytes, slot: u16, now: u64) -> Result<i64, RedisError> {
    let args = vec![arg(delayed), str_arg("-inf"), str_arg(&now.to_string())];
    Ok(integer(
        call_at(client, "ZCOUNT", args, false, Some(slot)).await?,
    ))
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

fn integer(value: Value) -> i64 {
    value.as_i64().unwrap_or(0)
}

/// The work waiting on a list: its length and the due entries of its delay set (due at
/// `now`).
async fn list_work(client: &Client, keys: &ListKeys, now: u64) -> Result<Work, RedisError> {
    let length = call_at(client, "LLEN", vec![arg(&keys.key)], false, Some(keys.slot)).await?;
    Ok(Work {
        unread: integer(length),
        due: due(client, &keys.delayed, keys.slot, now).await?,
        ..Work::default()
    })
}

/// The work waiting on a stream group at `now`, from what XINFO GROUPS said of it (`group`).
async fn stream_work(
    client: &Client,
    keys: &StreamKeys,
    min_idle: Duration,
    group: GroupReply,
    now: u64,
) -> Result<Work, RedisError> {
    let info = match group {
        Ok(info) => info,
        // No stream yet: no group either.
        Err(RedisError::Refused { message, .. }) if message.contains("no such key") => None,
        Err(err) => return Err(err),
    };
    let mut work = match info {
        // No group yet: everything in the stream waits for the first worker's group.
        None => {
            let length = call_at(client, "XLEN", vec![arg(&keys.key)], false, Some(keys.slot));
            Work {
                unread: integer(length.await?),
                counted: true,
                ..Work::default()
            }
        }
        Some(info) => group_work(client, keys, min_idle, info, now).await?,
    };
    work.due = due(client, &keys.delayed, keys.slot, now).await?;
    Ok(work)
}

/// The work waiting on a group that exists: its unread entries (the lag, or counted), and its
/// reclaimable pending entries and the age of the oldest.
async fn group_work(
    client: &Client,
    keys: &StreamKeys,
    min_idle: Duration,
    info: GroupInfo,
    now: u64,
) -> Result<Work, RedisError> {
    let at = |name, args| call_at(client, name, args, false, Some(keys.slot));
    let mut work = Work::default();
    match (info.lag, &info.last_delivered) {
        (Some(lag), _) => work.unread = lag,
        (None, Some(last)) => {
            let mut after = b"(".to_vec();
            after.extend_from_slice(last);
            let reply = at(
                "XRANGE",
                vec![
                    arg(&keys.key),
                    Value::Bytes(Bytes::from(after)),
                    str_arg("+"),
                    str_arg("COUNT"),
                    str_arg(&COUNT_CAP.to_string()),
                ],
            )
            .await?;
            work.unread = array_len(&reply);
            work.counted = true;
        }
        (None, None) => work.counted = true,
    }
    if info.pending > 0 {
        let reply = at(
            "XPENDING",
            vec![
                arg(&keys.key),
                arg(&keys.group),
                str_arg("IDLE"),
                str_arg(&min_idle.as_millis().to_string()),
                str_arg("-"),
                str_arg("+"),
                str_arg(&COUNT_CAP.to_string()),
            ],
        )
        .await?;
        work.reclaimable = array_len(&reply) - not_due(client, keys, &reply, now).await?;
        // The summary form: [count, smallest id, greatest id, consumers].
        let summary = at("XPENDING", vec![arg(&keys.key), arg(&keys.group)]).await?;
        if let Value::Array(fields) = summary
            && let Some(oldest) = fields.into_iter().nth(1).and_then(into_bytes)
        {
            work.oldest_pending_secs = id_age_secs(&oldest, now);
        }
    }
    Ok(work)
}

/// How many of the pending entries an `XPENDING … IDLE` reply lists wait for a `retry_after`
/// not due yet (the group's delay set scores them later than `now_ms`): a reclaim holds them
/// until then, so they are no work yet, and a worker woken for them would only wait.
async fn not_due(
    client: &Client,
    keys: &StreamKeys,
    rows: &Value,
    now_ms: u64,
) -> Result<i64, RedisError> {
    let Value::Array(rows) = rows else {
        return Ok(0);
    };
    let ids: Vec<Value> = rows
        .iter()
        .filter_map(|row| match row {
            Value::Array(fields) => fields.first().cloned(),
            _ => None,
        })
        .collect();
    if ids.is_empty() {
        return Ok(0);
    }
    let mut args = vec![arg(&keys.due)];
    args.extend(ids);
    let scores = call_at(client, "ZMSCORE", args, false, Some(keys.slot)).await?;
    let Value::Array(scores) = scores else {
        return Ok(0);
    };
    Ok(scores
        .iter()
        .filter(|score| score.as_f64().is_some_and(|due| due > now_ms as f64))
        .count() as i64)
}

fn array_len(reply: &Value) -> i64 {
    match reply {
        Value::Array(items) => items.len() as i64,
        _ => 0,
    }
}

/// Seconds from an entry id's time part (`<ms>-<seq>`) to `now_ms`; 0 when it is not one.
fn id_age_secs(id: &[u8], now_ms: u64) -> i64 {
    std::str::from_utf8(id)
        .ok()
        .and_then(|id| id.split('-').next())
        .and_then(|ms| ms.parse::<u64>().ok())
        .map_or(0, |ms| (now_ms.saturating_sub(ms) / 1000) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_age_of_an_entry_comes_from_its_id() {
        assert_eq!(id_age_secs(b"1000-0", 61_000), 60);
        assert_eq!(id_age_secs(b"1000-7", 1_500), 0);
        assert_eq!(id_age_secs(b"not-an-id", 61_000), 0);
        assert_eq!(id_age_secs(b"9000-0", 1_000), 0);
    }

    #[test]
    fn the_work_is_unread_plus_reclaimable_plus_due() {
        let work = Work {
            unread: 5,
            counted: false,
            reclaimable: 2,
            due: 3,
            oldest_pending_secs: 0,
        };
        assert_eq!(work.total(), 10);
    }
}
