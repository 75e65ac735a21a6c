//! Dead letters as subscriptions write them: at the delivery cap (a stream entry with its origin,
//! count and reason; a list value delivered past the cap without outcomes, dead-lettered
//! unread), and at once by the `dead_letter` outcome, which needs a dead-letter target and is
//! not offered on pub/sub.

use fred::prelude::*;
use window_sidecar::proto::OutcomeKind::{Ack, DeadLetter, Drop, Retry};
use window_sidecar::proto::{self, RejectionReason};
use window_sidecar_harness::forms::{len, pubsub, push, reliable};
use window_sidecar_harness::*;

#[tokio::test]
async fn at_the_delivery_cap_stream_entries_go_to_the_dead_letter() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    publish(
        &mut client,
        "orders",
        vec![vec![("order", "1".to_string())]],
    )
    .await;
    let open = proto::Open {
        max_deliveries: 3,
        dead_letter: Some(proto::DeadLetter {
            target: Some(proto::dead_letter::Target::Stream("orders:dead".into())),
        }),
        ..stream_open("orders", "g", "c", 1)
    };
    let (mut sub, _) = Subscription::open(&mut client, open).await.unwrap();
    let mut counts = Vec::new();
    loop {
        let d = sub.read().await.deliveries.remove(0);
        counts.push(d.delivery_count);
        sub.send(
            vec![],
            vec![proto::Outcome {
                reason: "still failing".into(),
                ..outcome(d.slot, Retry)
            }],
        )
        .await;
        let report = sub.flush().await;
        assert!(report.ok);
        if report.dead_lettered == 1 {
            break;
        }
    }
    assert_eq!(
        counts,
        [1, 2, 3],
        "delivery counts rise across redeliveries"
    );
    let inspect = redis.client().await;
    let dead: Vec<(String, std::collections::HashMap<String, String>)> =
        inspect.xrange("orders:dead", "-", "+", None).await.unwrap();
    assert_eq!(dead.len(), 1);
    let fields = &dead[0].1;
    assert_eq!(fields["order"], "1");
    assert_eq!(fields["h:x-window-subscription"], "orders/g");
    assert_eq!(fields["h:x-window-deliveries"], "3");
    assert_eq!(fields["h:x-window-reason"], "still failing");
    assert!(fields.contains_key("h:x-window-original-id"));
    assert_eq!(pending(&inspect, "orders", "g").await, 0);
    sidecar.stop().await;
}

#[tokio::test]
async fn an_entry_delivered_past_the_cap_without_outcomes_is_dead_lettered_unread() {
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    push(&inspect, "jobs", ["poison".to_string()]).await;
    let open = || proto::Open {
        max_deliveries: 2,
        dead_letter: Some(proto::DeadLetter {
            target: Some(proto::dead_letter::Target::List("jobs:dead".into())),
        }),
        ..reliable("jobs", "c1", 1)
    };
    // A client that crashes on the entry every time: it never sends an outcome.
    for expected in 1..=2 {
        let sidecar = Sidecar::start(&redis.url(), &[]).await;
        let mut client = sidecar.client().await;
        let (mut sub, _) = Subscription::open(&mut client, open()).await.unwrap();
        let d = sub.read().await.deliveries.remove(0);
        assert_eq!(d.delivery_count, expected);
        drop(sub);
        sidecar.stop().await;
    }
    // The third time it is not delivered: it goes to the dead letter with its settle.
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    let (mut sub, _) = Subscription::open(&mut client, open()).await.unwrap();
    let report = sub.flush().await;
    assert_eq!((report.read_id, report.dead_lettered), (0, 1));
    assert!(report.ok);
    // A frame of the value with where it came from, how often and why.
    let dead: Vec<bytes::Bytes> = inspect.lrange("jobs:dead", 0, -1).await.unwrap();
    assert_eq!(dead.len(), 1);
    let letter = window_sidecar::domain::frame::decode(&dead[0]).expect("a frame");
    let text = |s: &str| bytes::Bytes::copy_from_slice(s.as_bytes());
    assert_eq!(letter[0], (text("_payload"), text("poison")));
    assert!(letter.contains(&(text("h:x-window-subscription"), text("jobs"))));
    // Delivered twice: the read that found it past the cap delivered it to nobody.
    assert!(letter.contains(&(text("h:x-window-deliveries"), text("2"))));
    assert!(letter.contains(&(text("h:x-ruststream-retry-count"), text("2"))));
    assert!(
        letter
            .iter()
            .any(|(f, v)| f.as_ref() == b"h:x-window-reason"
                && v.starts_with(b"delivered more often than max_deliveries")),
        "{letter:?}"
    );
    assert_eq!(len(&inspect, "{jobs}:window:processing:c1").await, 0);
    sidecar.stop().await;
}

/// Answers deliveries until every one of `values` was settled: an `INCR` on `counter` for
/// each, `dead_letter` with `reason` for "poison", ack for the rest. Returns how many the
/// flush reports say went to the dead letter.
async fn dead_letter_poison(sub: &mut Subscription, counter: &str, reason: &str, n: u32) -> u32 {
    let (mut settled, mut dead_lettered) = (0, 0);
    while settled < n {
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
                    .map(|d| match value(d).as_str() {
                        "poison" => proto::Outcome {
                            reason: reason.into(),
                            ..outcome(d.slot, DeadLetter)
                        },
                        _ => outcome(d.slot, Ack),
                    })
                    .collect();
                sub.send(commands, outcomes).await;
            }
            Some(proto::subscribe_response::Kind::Flush(report)) => {
                assert!(report.ok, "{report:?}");
                settled += report.segments_kept + report.segments_dropped;
                dead_lettered += report.dead_lettered;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    dead_lettered
}

/// Settles the next delivery with `dead_letter` and expects it refused for want of a
/// dead-letter target; then drops it, which settles it.
async fn dead_letter_is_refused(sub: &mut Subscription, why: &str) {
    let d = sub.read().await.deliveries.remove(0);
    sub.send(vec![], vec![outcome(d.slot, DeadLetter)]).await;
    let rejections = sub.rejections().await;
    assert_eq!(rejections[0].slot, d.slot);
    assert_eq!(rejections[0].reason, RejectionReason::InvalidOutcome as i32);
    assert!(
        rejections[0].message.contains(why),
        "{}",
        rejections[0].message
    );
    sub.send(vec![], vec![outcome(d.slot, Drop)]).await;
    assert!(sub.flush().await.ok);
}

#[tokio::test]
async fn a_dead_letter_outcome_moves_a_stream_entry_at_once_and_needs_a_target() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let inspect = redis.client().await;
    let mut client = sidecar.client().await;
    let entries = ["poison", "good"].map(|v| proto::PublishEntry {
        payload: bytes::Bytes::from_static(v.as_bytes()),
        ..Default::default()
    });
    client
        .publish(proto::PublishRequest {
            stream: "orders".into(),
            entries: entries.to_vec(),
            ..Default::default()
        })
        .await
        .unwrap();
    let open = proto::Open {
        max_deliveries: 5,
        dead_letter: Some(proto::DeadLetter {
            target: Some(proto::dead_letter::Target::Stream("orders:dead".into())),
        }),
        ..stream_open("orders", "g", "c", 2)
    };
    let (mut sub, _) = Subscription::open(&mut client, open).await.unwrap();
    let dead_lettered = dead_letter_poison(&mut sub, "kept", "bad sku", 2).await;
    assert_eq!(dead_lettered, 1);
    // Its first delivery, far below the cap: in the dead letter with the client's reason, its
    // command discarded, settled, and no copy of it back in the stream.
    let dead: Vec<(String, std::collections::HashMap<String, String>)> =
        inspect.xrange("orders:dead", "-", "+", None).await.unwrap();
    assert_eq!(dead.len(), 1);
    let fields = &dead[0].1;
    assert_eq!(fields["_payload"], "poison");
    assert_eq!(fields["h:x-window-subscription"], "orders/g");
    assert_eq!(fields["h:x-window-deliveries"], "1");
    assert_eq!(fields["h:x-window-reason"], "bad sku");
    assert_eq!(counter(&inspect, "kept").await, 1);
    assert_eq!(pending(&inspect, "orders", "g").await, 0);
    let length: u64 = inspect.xlen("orders").await.unwrap();
    assert_eq!(length, 2);

    // A subscription without a dead-letter target refuses it for the slot.
    let (mut bare, _) = Subscription::open(&mut client, stream_open("orders", "g2", "c", 1))
        .await
        .unwrap();
    dead_letter_is_refused(&mut bare, "needs a dead-letter target").await;
    sidecar.stop().await;
}

#[tokio::test]
async fn a_dead_letter_outcome_moves_a_list_value_at_once_and_needs_a_target() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let inspect = redis.client().await;
    let mut client = sidecar.client().await;
    push(&inspect, "jobs", ["poison".to_string(), "good".to_string()]).await;
    let open = proto::Open {
        max_deliveries: 5,
        dead_letter: Some(proto::DeadLetter {
            target: Some(proto::dead_letter::Target::List("jobs:dead".into())),
        }),
        ..reliable("jobs", "c1", 2)
    };
    let (mut sub, _) = Subscription::open(&mut client, open).await.unwrap();
    let dead_lettered = dead_letter_poison(&mut sub, "kept", "bad job", 2).await;
    assert_eq!(dead_lettered, 1);
    let dead: Vec<bytes::Bytes> = inspect.lrange("jobs:dead", 0, -1).await.unwrap();
    assert_eq!(dead.len(), 1);
    let letter = window_sidecar::domain::frame::decode(&dead[0]).expect("a frame");
    let text = |s: &str| bytes::Bytes::copy_from_slice(s.as_bytes());
    assert_eq!(letter[0], (text("_payload"), text("poison")));
    assert!(letter.contains(&(text("h:x-window-subscription"), text("jobs"))));
    assert!(letter.contains(&(text("h:x-window-deliveries"), text("1"))));
    assert!(letter.contains(&(text("h:x-window-reason"), text("bad job"))));
    assert_eq!(counter(&inspect, "kept").await, 1);
    assert_eq!(len(&inspect, "jobs").await, 0);
    assert_eq!(len(&inspect, "{jobs}:window:processing:c1").await, 0);

    // Without a dead-letter target, and on pub/sub, it is refused for the slot.
    push(&inspect, "jobs2", ["x".to_string()]).await;
    let (mut bare, _) = Subscription::open(&mut client, reliable("jobs2", "c1", 1))
        .await
        .unwrap();
    dead_letter_is_refused(&mut bare, "needs a dead-letter target").await;
    assert_eq!(len(&inspect, "jobs2").await, 0);
    let source = proto::PubSubSource {
        channels: vec!["news".into()],
        ..Default::default()
    };
    let (mut news, _) = Subscription::open(&mut client, pubsub(source, 1, 1))
        .await
        .unwrap();
    let _: i64 = inspect.publish("news", "n").await.unwrap();
    dead_letter_is_refused(&mut news, "not offered on pub/sub").await;
    sidecar.stop().await;
}
