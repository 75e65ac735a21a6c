//! What the tests of the list and pub/sub forms share: the opens of a reliable list, a simple
//! list and a pub/sub subscription, values pushed onto a list and counted there, and a window
//! answered read by read ([`run_window`]).

use fred::prelude::*;
use window_sidecar::proto;

use crate::{Subscription, command, outcome};

/// A reliable list subscription to `key` as `consumer`, `count` a read (BLOCK 200 ms), a
/// consumer silent for 1 s given up for dead.
pub fn reliable(key: &str, consumer: &str, count: u32) -> proto::Open {
    proto::Open {
        source: Some(proto::open::Source::ReliableList(
            proto::ReliableListSource {
                key: key.into(),
                consumer: consumer.into(),
                dead_after: Some(prost_types::Duration {
                    seconds: 1,
                    nanos: 0,
                }),
            },
        )),
        count,
        block: Some(prost_types::Duration {
            seconds: 0,
            nanos: 200_000_000,
        }),
        ..Default::default()
    }
}

/// A simple list subscription to `key` (BLOCK 200 ms).
pub fn simple(key: &str, count: u32, max_in_flight: u32) -> proto::Open {
    proto::Open {
        source: Some(proto::open::Source::SimpleList(proto::SimpleListSource {
            key: key.into(),
        })),
        count,
        max_in_flight,
        block: Some(prost_types::Duration {
            seconds: 0,
            nanos: 200_000_000,
        }),
        ..Default::default()
    }
}

/// A pub/sub subscription to `source` (BLOCK 200 ms).
pub fn pubsub(source: proto::PubSubSource, count: u32, max_in_flight: u32) -> proto::Open {
    proto::Open {
        source: Some(proto::open::Source::Pubsub(source)),
        count,
        max_in_flight,
        block: Some(prost_types::Duration {
            seconds: 0,
            nanos: 200_000_000,
        }),
        ..Default::default()
    }
}

/// Pushes each of `values` onto the list `key`.
pub async fn push(client: &Client, key: &str, values: impl IntoIterator<Item = String>) {
    for value in values {
        let _: i64 = client.lpush(key, value).await.unwrap();
    }
}

/// The length of the list `key`.
pub async fn len(client: &Client, key: &str) -> i64 {
    client.llen(key).await.unwrap()
}

/// A delivery's payload, as text.
pub fn payload(d: &proto::Delivery) -> String {
    String::from_utf8_lossy(&d.payload).into_owned()
}

/// Answers every delivery of reads until `settled` entries are reported flushed: one INCR on
/// `counter` per kept delivery, and the outcome `decide` picks.
pub async fn run_window(
    sub: &mut Subscription,
    counter: &str,
    settled: u32,
    decide: impl Fn(&proto::Delivery) -> proto::OutcomeKind,
) -> u32 {
    let mut done = 0;
    let mut kept = 0;
    while done < settled {
        match sub.next().await.unwrap() {
            Some(proto::subscribe_response::Kind::Read(read)) => {
                let commands = read
                    .deliveries
                    .iter()
                    .map(|d| command(d.slot, "INCR", &[counter]))
                    .collect();
                let outcomes = read
                    .deliveries
                    .iter()
                    .map(|d| outcome(d.slot, decide(d)))
                    .collect();
                sub.send(commands, outcomes).await;
            }
            Some(proto::subscribe_response::Kind::Flush(report)) => {
                assert!(report.ok, "{report:?}");
                done += report.segments_kept + report.segments_dropped;
                kept += report.segments_kept;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    kept
}
