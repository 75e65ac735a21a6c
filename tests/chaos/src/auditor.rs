//! The audit group's reader: the campaign's own consumer of a second group on the stream (on a
//! partitioned stream, on every partition),
//! behind the workers, whose reads are the record of every entry the stream held (retention
//! deletes what both groups acknowledged); and the stream's length once both are done.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use fred::prelude::*;
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::form::{self, AUDIT_GROUP, AUDIT_READER, Fields, Form};
use crate::history::Event;
use crate::log::Log;

/// The audit group's reader: it reads every entry of the stream behind the workers (a few
/// every half second while the run goes on), records and logs it and acknowledges it (logged
/// when Redis counted every entry acknowledged); once `drain` is set it reads the rest and
/// ends. Its own pending entries first: a read whose reply or ack a fault took stays pending on
/// its consumer.
pub(crate) async fn audit(
    form: Form,
    redis: Client,
    drain: Arc<AtomicBool>,
    record: Arc<Mutex<Vec<(String, Fields)>>>,
    log: Arc<Log>,
) {
    loop {
        let draining = drain.load(Ordering::Relaxed);
        let count = if draining { 500 } else { 10 };
        let mut read = 0;
        for (p, stream) in form.stream_keys().iter().enumerate() {
            read += audit_stream(&redis, (stream, p), count, &record, &log).await;
        }
        if draining && read == 0 {
            return;
        }
        let pause = if draining { 50 } else { 500 };
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}

/// One round of the audit reader on `stream` (the form's stream number `p`): its own pending
/// entries, then new ones, `count` of each at most. Returns how many it read.
async fn audit_stream(
    redis: &Client,
    (stream, p): (&str, usize),
    count: u64,
    record: &Mutex<Vec<(String, Fields)>>,
    log: &Log,
) -> usize {
    let mut read = 0;
    let name = |id: &str| {
        if stream == form::STREAM {
            id.to_owned()
        } else {
            format!("{p}/{id}")
        }
    };
    for from in ["0", ">"] {
        let reply: Result<Value, _> = redis
            .xreadgroup(
                AUDIT_GROUP,
                AUDIT_READER,
                Some(count),
                None,
                false,
                stream,
                from,
            )
            .await;
        let Ok(reply) = reply else { break };
        let entries = stream_entries(reply);
        read += entries.len();
        if entries.is_empty() {
            continue;
        }
        let named: Vec<(String, Fields)> = entries
            .iter()
            .map(|(id, fields)| {
                let fields = if stream == form::STREAM {
                    fields.clone()
                } else {
                    form::qualified(fields.clone())
                };
                (name(id), fields)
            })
            .collect();
        for (entry, fields) in &named {
            log.push(Event::Audited {
                entry: entry.clone(),
                own: from == "0",
                copy: form::copied(fields),
            });
        }
        let ids: Vec<String> = entries.iter().map(|(id, _)| id.clone()).collect();
        record.lock().extend(named.iter().cloned());
        let acked: Result<u64, _> = redis.xack(stream, AUDIT_GROUP, ids.clone()).await;
        if acked.is_ok_and(|n| n == ids.len() as u64) {
            log.push(Event::AuditAcked {
                entries: named.into_iter().map(|(entry, _)| entry).collect(),
            });
        }
    }
    read
}

/// The entries of an XREADGROUP reply, with their fields (none for an entry deleted while
/// pending).
fn stream_entries(reply: Value) -> Vec<(String, Fields)> {
    let mut out = Vec::new();
    let Value::Array(streams) = reply else {
        return out;
    };
    for stream in streams {
        let Value::Array(mut pair) = stream else {
            continue;
        };
        let Some(Value::Array(entries)) = pair.pop() else {
            continue;
        };
        for entry in entries {
            let Value::Array(parts) = entry else { continue };
            let mut parts = parts.into_iter();
            let Some(id) = parts.next().and_then(|v| v.as_string()) else {
                continue;
            };
            let mut fields = Fields::new();
            if let Some(Value::Array(flat)) = parts.next() {
                for pair in flat.chunks(2) {
                    if let [k, v] = pair
                        && let (Some(k), Some(v)) = (k.as_string(), v.as_string())
                    {
                        fields.insert(k, v);
                    }
                }
            }
            out.push((id, fields));
        }
    }
    out
}

/// The stream's length once both groups have acknowledged everything and the trim has had
/// time to run; None when a group's position is unknown to Redis (the trim waits then, as
/// documented).
pub(crate) async fn retained(redis: &Client) -> Option<u64> {
    let groups: Value = redis
        .custom(fred::cmd!("XINFO"), vec!["GROUPS", form::STREAM])
        .await
        .ok()?;
    let Value::Array(groups) = groups else {
        return None;
    };
    let lag_known = groups.iter().all(|g| match g {
        Value::Array(f) => f
            .chunks(2)
            .any(|kv| kv[0].as_str().as_deref() == Some("lag") && !kv[1].is_null()),
        _ => false,
    });
    if !lag_known {
        println!("   retention: a group's position is unknown to Redis; the trim waits");
        return None;
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let len: u64 = redis.xlen(form::STREAM).await.ok()?;
        if len <= 1 || Instant::now() > deadline {
            return Some(len);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
