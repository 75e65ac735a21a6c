//! What holds across the forms: what each refuses at open, atomic mode over list and pub/sub
//! segments as over a stream's, the mixed window (some deliveries kept, some dropped) on a
//! simple list and on pub/sub, and a close that cuts each form's blocked read short.

use std::time::Duration;

use fred::prelude::*;
use window_sidecar::proto;
use window_sidecar::proto::OutcomeKind::{Ack, Drop};
use window_sidecar_harness::forms::{len, payload, pubsub, push, reliable, run_window, simple};
use window_sidecar_harness::*;

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
