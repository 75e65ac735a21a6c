//! Every form end to end: reliable lists, simple lists, pub/sub (classic, pattern, sharded),
//! delivery counts, dead letters at the cap.

use std::collections::HashSet;
use std::time::Duration;

use fred::prelude::*;
use window_sidecar::proto::OutcomeKind::{Ack, DeadLetter, Drop, Retry};
use window_sidecar::proto::{self, RejectionReason};
use window_sidecar_harness::*;

fn reliable(key: &str, consumer: &str, count: u32) -> proto::Open {
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

fn simple(key: &str, count: u32, max_in_flight: u32) -> proto::Open {
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

fn pubsub(source: proto::PubSubSource, count: u32, max_in_flight: u32) -> proto::Open {
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

async fn push(client: &Client, key: &str, values: impl IntoIterator<Item = String>) {
    for value in values {
        let _: i64 = client.lpush(key, value).await.unwrap();
    }
}

async fn len(client: &Client, key: &str) -> i64 {
    client.llen(key).await.unwrap()
}

fn payload(d: &proto::Delivery) -> String {
    String::from_utf8_lossy(&d.payload).into_owned()
}

/// Answers every delivery of reads until `settled` entries are reported flushed: one INCR on
/// `counter` per kept delivery, and the outcome `decide` picks.
async fn run_window(
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

#[tokio::test]
async fn a_reliable_list_keeps_thirteen_of_twenty_with_one_lrem_per_entry() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let inspect = redis.client().await;
    // Identical values must not confuse the settles: "7" is pushed twice.
    let values: Vec<String> = (0..19)
        .map(|n| n.to_string())
        .chain(["7".to_string()])
        .collect();
    push(&inspect, "jobs", values.clone()).await;
    let _: () = inspect
        .custom(fred::cmd!("CONFIG"), vec!["RESETSTAT"])
        .await
        .unwrap();

    let mut client = sidecar.client().await;
    let (mut sub, opened) = Subscription::open(&mut client, reliable("jobs", "c1", 20))
        .await
        .unwrap();
    assert_eq!(opened.consumer, "c1");
    let kept = run_window(&mut sub, "side-effects", 20, |_| Ack).await;
    assert_eq!(kept, 20);
    assert_eq!(len(&inspect, "jobs").await, 0);
    assert_eq!(len(&inspect, "{jobs}:window:processing:c1").await, 0);
    assert_eq!(
        command_calls(&inspect, "lrem").await,
        20,
        "one LREM per entry"
    );
    assert_eq!(inspect.get::<i64, _>("side-effects").await.unwrap(), 20);

    // The mixed window: every third dropped, exactly 13 side effects.
    push(&inspect, "jobs", (0..20).map(|n| n.to_string())).await;
    let kept = run_window(&mut sub, "mixed", 20, |d| {
        if payload(d).parse::<u32>().unwrap().is_multiple_of(3) {
            Drop
        } else {
            Ack
        }
    })
    .await;
    assert_eq!(kept, 13);
    assert_eq!(inspect.get::<i64, _>("mixed").await.unwrap(), 13);
    assert_eq!(len(&inspect, "jobs").await, 0);
    assert_eq!(len(&inspect, "{jobs}:window:processing:c1").await, 0);
    sidecar.stop().await;
}

#[tokio::test]
async fn a_reliable_list_retry_comes_back_with_a_higher_delivery_count() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let inspect = redis.client().await;
    push(&inspect, "jobs", ["job-1".to_string()]).await;
    let mut client = sidecar.client().await;
    let (mut sub, _) = Subscription::open(&mut client, reliable("jobs", "c1", 1))
        .await
        .unwrap();
    let first = sub.read().await.deliveries.remove(0);
    assert_eq!(
        (payload(&first).as_str(), first.delivery_count),
        ("job-1", 1)
    );
    sub.send(
        vec![command(first.slot, "INCR", &["never"])],
        vec![outcome(first.slot, Retry)],
    )
    .await;
    assert!(sub.flush().await.ok);
    let again = sub.read().await.deliveries.remove(0);
    assert_eq!(
        (payload(&again).as_str(), again.delivery_count),
        ("job-1", 2)
    );
    sub.send(
        vec![],
        vec![retry_after(again.slot, Duration::from_millis(300))],
    )
    .await;
    assert!(sub.flush().await.ok);
    let third = sub.read().await.deliveries.remove(0);
    assert_eq!(
        (payload(&third).as_str(), third.delivery_count),
        ("job-1", 3)
    );
    sub.send(vec![], vec![outcome(third.slot, Ack)]).await;
    assert!(sub.flush().await.ok);
    assert_eq!(
        inspect
            .exists::<i64, _>(vec!["never", "jobs", "{jobs}:window:processing:c1"])
            .await
            .unwrap(),
        0
    );
    let counts: i64 = inspect.hlen("{jobs}:window:deliveries").await.unwrap();
    assert_eq!(counts, 0, "settled values forget their delivery counts");
    sidecar.stop().await;
}

#[tokio::test]
async fn a_restarted_consumer_gets_its_processing_list_first_and_a_dead_ones_is_recovered() {
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    push(&inspect, "jobs", (0..6).map(|n| format!("job-{n}"))).await;

    // A sidecar reads three entries for c1 and dies without settling them.
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    let no_read_ahead = || proto::Open {
        max_in_flight: 3,
        ..reliable("jobs", "c1", 3)
    };
    let (mut sub, _) = Subscription::open(&mut client, no_read_ahead())
        .await
        .unwrap();
    assert_eq!(sub.read().await.deliveries.len(), 3);
    drop(sub);
    sidecar.stop().await;
    assert_eq!(len(&inspect, "{jobs}:window:processing:c1").await, 3);

    // c1 restarts: its own three come first, delivered a second time.
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    let (mut sub, _) = Subscription::open(&mut client, no_read_ahead())
        .await
        .unwrap();
    let read = sub.read().await;
    let own: Vec<String> = read.deliveries.iter().map(payload).collect();
    assert_eq!(own, ["job-0", "job-1", "job-2"]);
    assert!(read.deliveries.iter().all(|d| d.delivery_count == 2));
    // It reads three more and then its process is gone for good.
    sub.send(
        vec![],
        read.deliveries
            .iter()
            .map(|d| outcome(d.slot, Ack))
            .collect(),
    )
    .await;
    assert!(sub.flush().await.ok);
    assert_eq!(sub.read().await.deliveries.len(), 3);
    drop(sub);
    sidecar.stop().await;

    // Another consumer recovers them once c1's heartbeat has expired (dead_after 1 s).
    let sidecar = Sidecar::start(&redis.url(), &["--reclaim-interval", "200ms"]).await;
    let mut client = sidecar.client().await;
    let (mut sub, _) = Subscription::open(&mut client, reliable("jobs", "c2", 3))
        .await
        .unwrap();
    let mut seen = HashSet::new();
    while seen.len() < 3 {
        let read = sub.read().await;
        for d in &read.deliveries {
            assert!(d.delivery_count >= 2, "{d:?}");
            seen.insert(payload(d));
        }
        sub.send(
            vec![],
            read.deliveries
                .iter()
                .map(|d| outcome(d.slot, Ack))
                .collect(),
        )
        .await;
        assert!(sub.flush().await.ok);
    }
    assert_eq!(seen, ["job-3", "job-4", "job-5"].map(String::from).into());
    assert_eq!(len(&inspect, "jobs").await, 0);
    assert_eq!(len(&inspect, "{jobs}:window:processing:c1").await, 0);
    assert_eq!(len(&inspect, "{jobs}:window:processing:c2").await, 0);
    sidecar.stop().await;
}

#[tokio::test]
async fn a_simple_list_loses_at_most_what_was_in_flight() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let inspect = redis.client().await;
    push(&inspect, "tasks", (0..20).map(|n| n.to_string())).await;
    let mut client = sidecar.client().await;
    let (mut sub, _) = Subscription::open(&mut client, simple("tasks", 5, 5))
        .await
        .unwrap();
    let read = sub.read().await;
    assert_eq!(read.deliveries.len(), 5);
    let kept: Vec<_> = read.deliveries.iter().map(payload).collect();
    assert_eq!(
        kept,
        ["0", "1", "2", "3", "4"],
        "FIFO relative to producers"
    );
    // Ack two, retry one (pushed back), leave two unsettled and vanish.
    let d = &read.deliveries;
    sub.send(
        vec![
            command(d[0].slot, "INCR", &["done"]),
            command(d[1].slot, "INCR", &["done"]),
        ],
        vec![
            outcome(d[0].slot, Ack),
            outcome(d[1].slot, Ack),
            outcome(d[2].slot, Retry),
        ],
    )
    .await;
    // The client says goodbye: what it settled is flushed, and what it never settled is
    // pushed back (it was never processed); only a crash loses those, at most the in-flight
    // limit.
    sub.close();
    let report = sub.flush().await;
    assert_eq!((report.segments_kept, report.segments_dropped), (2, 3));
    assert!(matches!(sub.next().await, Ok(None)));
    sidecar.stop().await;
    assert_eq!(inspect.get::<i64, _>("done").await.unwrap(), 2);
    assert!(
        eventually(STEP, || async { len(&inspect, "tasks").await == 18 }).await,
        "{} left",
        len(&inspect, "tasks").await
    );
    let order: Vec<String> = inspect.lrange("tasks", 0, -1).await.unwrap();
    assert_eq!(
        order.last().map(String::as_str),
        Some("3"),
        "the oldest unsettled entry is next again"
    );
}

#[tokio::test]
async fn pubsub_keeps_acked_side_effects_on_channels_patterns_and_sharded_channels() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let inspect = redis.client().await;
    let mut client = sidecar.client().await;
    let source = proto::PubSubSource {
        channels: vec!["news".into()],
        patterns: vec!["alerts.*".into()],
        sharded_channels: vec!["orders-shard".into()],
        buffer: 0,
    };
    let (mut sub, _) = Subscription::open(&mut client, pubsub(source, 10, 10))
        .await
        .unwrap();
    // Subscribing happened before `opened`; give the server a moment to register it.
    let published = [
        ("PUBLISH", "news", "n1"),
        ("PUBLISH", "alerts.disk", "a1"),
        ("SPUBLISH", "orders-shard", "s1"),
        ("PUBLISH", "news", "n2"),
    ];
    for (cmd, channel, message) in published {
        let _: i64 = inspect
            .custom(
                fred::types::CustomCommand::new_static(
                    cmd,
                    fred::types::ClusterHash::FirstKey,
                    false,
                ),
                vec![channel, message],
            )
            .await
            .unwrap();
    }
    let mut got = Vec::new();
    while got.len() < 4 {
        let read = sub.read().await;
        let mut commands = Vec::new();
        let mut outcomes = Vec::new();
        for d in &read.deliveries {
            got.push((d.channel.clone(), payload(d)));
            commands.push(command(d.slot, "SADD", &["kept", &payload(d)]));
            // Drop n2; keep the rest.
            outcomes.push(outcome(d.slot, if payload(d) == "n2" { Drop } else { Ack }));
        }
        sub.send(commands, outcomes).await;
        let report = sub.flush().await;
        assert!(report.ok);
        assert_eq!(report.settles, 0, "pub/sub has nothing to settle");
    }
    let channels: HashSet<_> = got.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(channels, ["news", "alerts.disk", "orders-shard"].into());
    let kept: HashSet<String> = inspect.smembers("kept").await.unwrap();
    assert_eq!(kept, ["n1", "a1", "s1"].map(String::from).into());
    sidecar.stop().await;
}

#[tokio::test]
async fn a_slow_pubsub_client_loses_the_oldest_messages_and_is_told_how_many() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let inspect = redis.client().await;
    let mut client = sidecar.client().await;
    let source = proto::PubSubSource {
        channels: vec!["ticks".into()],
        buffer: 5,
        ..Default::default()
    };
    let (mut sub, _) = Subscription::open(&mut client, pubsub(source, 1, 1))
        .await
        .unwrap();
    let _: i64 = inspect.publish("ticks", "0").await.unwrap();
    let first = sub.read().await.deliveries.remove(0);
    // The client holds its one in-flight delivery while 20 more arrive: 5 fit the buffer.
    for n in 1..=20 {
        let _: i64 = inspect.publish("ticks", n.to_string()).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    sub.send(vec![], vec![outcome(first.slot, Ack)]).await;
    let read = sub.read().await;
    assert_eq!(read.lost, 15, "{read:?}");
    assert_eq!(
        payload(&read.deliveries[0]),
        "16",
        "the oldest were dropped"
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn pubsub_retry_republishes_and_sharded_retry_after_is_refused() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let inspect = redis.client().await;
    let mut client = sidecar.client().await;
    let source = proto::PubSubSource {
        channels: vec!["jobs".into()],
        sharded_channels: vec!["shard".into()],
        ..Default::default()
    };
    let (mut sub, _) = Subscription::open(&mut client, pubsub(source, 1, 1))
        .await
        .unwrap();
    let _: i64 = inspect.publish("jobs", "j").await.unwrap();
    let d = sub.read().await.deliveries.remove(0);
    sub.send(
        vec![],
        vec![retry_after(d.slot, Duration::from_millis(200))],
    )
    .await;
    assert!(sub.flush().await.ok);
    let again = sub.read().await.deliveries.remove(0);
    assert_eq!(
        (again.channel.as_str(), payload(&again).as_str()),
        ("jobs", "j")
    );
    sub.send(vec![], vec![outcome(again.slot, Ack)]).await;
    assert!(sub.flush().await.ok);

    let _: i64 = inspect
        .custom(fred::cmd!("SPUBLISH"), vec!["shard", "s"])
        .await
        .unwrap();
    let s = sub.read().await.deliveries.remove(0);
    sub.send(
        vec![],
        vec![retry_after(s.slot, Duration::from_millis(200))],
    )
    .await;
    let rejections = sub.rejections().await;
    assert_eq!(rejections[0].reason, RejectionReason::InvalidOutcome as i32);
    assert!(
        rejections[0].message.contains("sharded channels"),
        "{}",
        rejections[0].message
    );
    sub.send(vec![], vec![outcome(s.slot, Retry)]).await;
    assert!(sub.flush().await.ok);
    let s2 = sub.read().await.deliveries.remove(0);
    assert_eq!(
        payload(&s2),
        "s",
        "retry republished it on its sharded channel"
    );
    sidecar.stop().await;
}

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

#[tokio::test]
async fn forms_refuse_what_they_cannot_do() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let cases = vec![
        (reliable("", "c", 1), "open.reliable_list.key is required"),
        (
            pubsub(proto::PubSubSource::default(), 1, 1),
            "needs at least one of channels",
        ),
        (
            proto::Open {
                max_deliveries: 3,
                ..stream_open("s", "g", "c", 1)
            },
            "open.max_deliveries needs open.dead_letter",
        ),
        (
            proto::Open {
                max_deliveries: 3,
                dead_letter: Some(proto::DeadLetter {
                    target: Some(proto::dead_letter::Target::List("dead".into())),
                }),
                ..stream_open("s", "g", "c", 1)
            },
            "a stream subscription takes open.dead_letter.stream",
        ),
        (
            proto::Open {
                max_deliveries: 3,
                ..pubsub(
                    proto::PubSubSource {
                        channels: vec!["c".into()],
                        ..Default::default()
                    },
                    1,
                    1,
                )
            },
            "pub/sub messages are delivered once",
        ),
    ];
    for (open, expected) in cases {
        let mut client = sidecar.client().await;
        let mut sub = Subscription::start(&mut client, proto::subscribe_request::Kind::Open(open))
            .await
            .unwrap();
        let status = sub.status().await;
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(
            status.message().contains(expected),
            "{:?} lacks {expected:?}",
            status.message()
        );
    }
    sidecar.stop().await;
}

#[tokio::test]
async fn atomic_mode_wraps_list_and_pubsub_segments() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let inspect = redis.client().await;
    push(&inspect, "jobs", (0..3).map(|n| n.to_string())).await;
    let _: () = inspect
        .custom(fred::cmd!("CONFIG"), vec!["RESETSTAT"])
        .await
        .unwrap();
    let mut client = sidecar.client().await;
    let open = proto::Open {
        mode: proto::Mode::Atomic as i32,
        max_in_flight: 3,
        ..reliable("jobs", "c1", 3)
    };
    let (mut sub, _) = Subscription::open(&mut client, open).await.unwrap();
    let kept = run_window(&mut sub, "list-atomic", 3, |d| {
        if payload(d) == "1" { Drop } else { Ack }
    })
    .await;
    assert_eq!(kept, 2);
    // Two segment scripts, each with its own LREM; the dropped entry's LREM outside.
    assert!(command_calls(&inspect, "eval").await >= 1);
    assert_eq!(command_calls(&inspect, "multi").await, 0);
    assert_eq!(command_calls(&inspect, "lrem").await, 3);
    assert_eq!(inspect.get::<i64, _>("list-atomic").await.unwrap(), 2);
    assert_eq!(len(&inspect, "{jobs}:window:processing:c1").await, 0);
    drop(sub);

    let source = proto::PubSubSource {
        channels: vec!["events".into()],
        ..Default::default()
    };
    let open = proto::Open {
        mode: proto::Mode::Atomic as i32,
        ..pubsub(source, 1, 1)
    };
    let (mut sub, _) = Subscription::open(&mut client, open).await.unwrap();
    let _: () = inspect
        .custom(fred::cmd!("CONFIG"), vec!["RESETSTAT"])
        .await
        .unwrap();
    let _: i64 = inspect.publish("events", "e").await.unwrap();
    let kept = run_window(&mut sub, "pubsub-atomic", 1, |_| Ack).await;
    assert_eq!(kept, 1);
    assert!(
        command_calls(&inspect, "eval").await >= 1,
        "a pub/sub segment is a script without a settle"
    );
    assert_eq!(command_calls(&inspect, "multi").await, 0);
    assert_eq!(inspect.get::<i64, _>("pubsub-atomic").await.unwrap(), 1);
    sidecar.stop().await;
}

#[tokio::test]
async fn the_mixed_window_on_a_simple_list_and_on_pubsub() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let inspect = redis.client().await;
    let every_third = |d: &proto::Delivery| {
        if payload(d).parse::<u32>().unwrap().is_multiple_of(3) {
            Drop
        } else {
            Ack
        }
    };

    push(&inspect, "tasks", (0..20).map(|n| n.to_string())).await;
    let mut client = sidecar.client().await;
    let (mut sub, _) = Subscription::open(&mut client, simple("tasks", 20, 20))
        .await
        .unwrap();
    assert_eq!(
        run_window(&mut sub, "simple-mixed", 20, every_third).await,
        13
    );
    assert_eq!(inspect.get::<i64, _>("simple-mixed").await.unwrap(), 13);
    assert_eq!(len(&inspect, "tasks").await, 0);
    drop(sub);

    let source = proto::PubSubSource {
        channels: vec!["mixed".into()],
        ..Default::default()
    };
    let (mut sub, _) = Subscription::open(&mut client, pubsub(source, 20, 20))
        .await
        .unwrap();
    for n in 0..20 {
        let _: i64 = inspect.publish("mixed", n.to_string()).await.unwrap();
    }
    assert_eq!(
        run_window(&mut sub, "pubsub-mixed", 20, every_third).await,
        13
    );
    assert_eq!(inspect.get::<i64, _>("pubsub-mixed").await.unwrap(), 13);
    sidecar.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pubsub_resubscribes_after_redis_restarts() {
    let mut redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    let source = proto::PubSubSource {
        channels: vec!["news".into()],
        patterns: vec!["alerts.*".into()],
        ..Default::default()
    };
    let (mut sub, _) = Subscription::open(&mut client, pubsub(source, 10, 10))
        .await
        .unwrap();
    redis.restart();
    let inspect = redis.client().await;
    // Publish until the resubscribed connection hears it (PUBLISH returns the receivers).
    let heard = eventually(Duration::from_secs(15), || async {
        let news: i64 = inspect.publish("news", "after-restart").await.unwrap_or(0);
        news > 0
    })
    .await;
    assert!(heard, "the channel was resubscribed");
    let pattern = eventually(Duration::from_secs(15), || async {
        inspect
            .publish::<i64, _, _>("alerts.cpu", "hot")
            .await
            .unwrap_or(0)
            > 0
    })
    .await;
    assert!(pattern, "the pattern was resubscribed");
    let mut payloads = HashSet::new();
    while !payloads.contains("hot") {
        let read = sub.read().await;
        for d in &read.deliveries {
            payloads.insert(payload(d));
        }
        sub.send(
            vec![],
            read.deliveries
                .iter()
                .map(|d| outcome(d.slot, Ack))
                .collect(),
        )
        .await;
    }
    assert!(payloads.contains("after-restart"));
    sidecar.stop().await;
}

/// A reliable list's consumer that closes while its read is blocked and opens again at once:
/// the old read may still move an entry into the processing list; the new subscription waits
/// for it to return before it reads its processing list, so that entry is delivered.
#[tokio::test]
async fn a_consumer_that_reopens_at_once_gets_what_its_last_read_took() {
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    let mut open = reliable("jobs", "c0", 1);
    open.block = Some(prost_types::Duration {
        seconds: 2,
        nanos: 0,
    });
    let (mut first, _) = Subscription::open(&mut client, open.clone()).await.unwrap();
    // Let the first read block in BLMOVE, then leave and come straight back.
    tokio::time::sleep(Duration::from_millis(300)).await;
    first.close();
    let pusher = {
        let inspect = inspect.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            push(&inspect, "jobs", ["late".to_string()]).await;
        })
    };
    let (mut second, _) = Subscription::open(&mut client, open).await.unwrap();
    pusher.await.unwrap();
    let read = second.read().await;
    assert_eq!(payload(&read.deliveries[0]), "late");
    second
        .send(vec![], vec![outcome(read.deliveries[0].slot, Ack)])
        .await;
    assert!(second.flush().await.ok);
    assert_eq!(len(&inspect, "jobs").await, 0);
    assert_eq!(len(&inspect, "{jobs}:window:processing:c0").await, 0);
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

/// A close does not wait out the read it finds blocked: the sidecar cuts BLMOVE, BRPOP or
/// XREADGROUP BLOCK short (`CLIENT UNBLOCK … TIMEOUT`), so the stream ends at once rather than
/// after the read's whole block (a minute at most), and the cut read takes nothing: a value
/// pushed after the close stays in the list.
#[tokio::test]
async fn a_close_cuts_a_blocked_read_short_and_takes_nothing() {
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    let long = Some(prost_types::Duration {
        seconds: 30,
        nanos: 0,
    });
    let opens = [
        (
            "simple",
            proto::Open {
                block: long,
                ..simple("idle-simple", 1, 1)
            },
        ),
        (
            "reliable",
            proto::Open {
                block: long,
                ..reliable("idle-reliable", "c0", 1)
            },
        ),
        (
            "stream",
            proto::Open {
                block: long,
                ..stream_open("idle-stream", "g", "c0", 1)
            },
        ),
    ];
    for (form, open) in opens {
        let (mut sub, _) = Subscription::open(&mut client, open).await.unwrap();
        // Let the read block in Redis.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let closed_at = std::time::Instant::now();
        sub.close();
        let end = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match sub.next().await {
                    Ok(Some(_)) => continue,
                    end => return end,
                }
            }
        })
        .await;
        assert!(
            matches!(end, Ok(Ok(None))),
            "{form}: the stream ended cleanly within 10 s of the close, not after the 30 s block: {end:?} after {:?}",
            closed_at.elapsed()
        );
    }
    // Nothing reads any more: what producers push now stays where it is.
    push(&inspect, "idle-simple", ["after".to_string()]).await;
    push(&inspect, "idle-reliable", ["after".to_string()]).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(len(&inspect, "idle-simple").await, 1);
    assert_eq!(len(&inspect, "idle-reliable").await, 1);
    assert_eq!(
        len(&inspect, "{idle-reliable}:window:processing:c0").await,
        0
    );
    sidecar.stop().await;
}
