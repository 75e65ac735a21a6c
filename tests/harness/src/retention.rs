//! What the retention tests share: a stream's two kinds of consumer, one by hand (a plain
//! `XREADGROUP` and `XACK`, as a service that is not the sidecar reads) and one through the
//! sidecar, and the stream's length they watch.

use std::time::Duration;

use fred::prelude::*;
use window_sidecar::proto::OutcomeKind;

use crate::{Next, Worker, command, outcome};

/// The length of the stream `key`.
pub async fn xlen(client: &Client, key: &str) -> usize {
    client.xlen(key).await.unwrap()
}

/// Reads up to `count` entries for `group` by hand (a consumer that is not the sidecar) and
/// acknowledges them with a plain XACK; returns their ids.
pub async fn hand_consume(client: &Client, key: &str, group: &str, count: u64) -> Vec<String> {
    let reply: Value = client
        .xreadgroup(group, "hand", Some(count), None, false, key, ">")
        .await
        .unwrap();
    let ids = stream_ids(reply);
    if !ids.is_empty() {
        let _: i64 = client.xack(key, group, ids.clone()).await.unwrap();
    }
    ids
}

/// The entry ids of an XREADGROUP reply.
pub fn stream_ids(reply: Value) -> Vec<String> {
    let Value::Array(streams) = reply else {
        return Vec::new();
    };
    let mut ids = Vec::new();
    for stream in streams {
        let Value::Array(mut pair) = stream else {
            continue;
        };
        let Some(Value::Array(entries)) = pair.pop() else {
            continue;
        };
        for entry in entries {
            if let Value::Array(parts) = entry
                && let Some(id) = parts.first().and_then(Value::as_string)
            {
                ids.push(id);
            }
        }
    }
    ids
}

/// Acks every delivery of one read through the sidecar (an INCR of `ret:effects` each); returns
/// the entry ids.
pub async fn sidecar_consume(worker: &mut Worker, wait: Duration) -> Vec<String> {
    match worker.next(wait).await {
        Next::Read(read) => {
            let mut batch = window_sidecar::proto::Batch::default();
            for d in &read.deliveries {
                batch
                    .commands
                    .push(command(d.slot, "INCR", &["ret:effects"]));
                batch.outcomes.push(outcome(d.slot, OutcomeKind::Ack));
            }
            worker.send(batch).await;
            read.deliveries.iter().map(|d| d.entry_id.clone()).collect()
        }
        Next::Idle => Vec::new(),
        other => panic!("the subscription ended: {other:?}"),
    }
}
