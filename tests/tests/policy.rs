//! The operator's policy end to end: which keys and channels clients may open and touch, which
//! commands they may queue, and the limits on what they send. Every refusal names the setting
//! that would allow it, and nothing is lost: refused entries stay pending and come back.

use fred::prelude::*;
use tonic::Code;
use window_sidecar::proto::{self, OutcomeKind, RejectionReason};
use window_sidecar_harness::*;

use OutcomeKind::{Ack, Retry};

const POLICY: &[&str] = &[
    "--allow-keys",
    "orders*,count:*",
    "--allow-channels",
    "events.*",
    "--allow-commands",
    "+@read +@write -del",
    "--max-arg-size",
    "1KiB",
    "--max-message-size",
    "64KiB",
    "--max-commands-per-slot",
    "3",
    "--max-subscriptions-per-connection",
    "2",
];

async fn refused_open(sidecar: &Sidecar, open: proto::Open) -> tonic::Status {
    let mut client = sidecar.client().await;
    match Subscription::open(&mut client, open).await {
        Ok(_) => panic!("the open was accepted"),
        Err(status) => status,
    }
}

#[tokio::test]
async fn opens_and_publishes_outside_the_allowed_keys_are_permission_denied() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), POLICY).await;

    let status = refused_open(&sidecar, stream_open("secrets", "g", "c", 1)).await;
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(status.message().contains("\"secrets\""), "{status:?}");
    assert!(status.message().contains("--allow-keys"), "{status:?}");

    let mut open = stream_open("orders", "g", "c", 1);
    open.dead_letter = Some(proto::DeadLetter {
        target: Some(proto::dead_letter::Target::Stream("graveyard".into())),
    });
    open.max_deliveries = 3;
    let status = refused_open(&sidecar, open).await;
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(status.message().contains("\"graveyard\""), "{status:?}");

    let pubsub = proto::Open {
        source: Some(proto::open::Source::Pubsub(proto::PubSubSource {
            channels: vec!["events.created".into()],
            patterns: vec!["*".into()],
            ..Default::default()
        })),
        count: 1,
        ..Default::default()
    };
    let status = refused_open(&sidecar, pubsub).await;
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(status.message().contains("--allow-channels"), "{status:?}");

    let mut client = sidecar.client().await;
    let status = client
        .publish(proto::PublishRequest {
            stream: "secrets".into(),
            entries: vec![proto::PublishEntry {
                payload: "{}".into(),
                ..Default::default()
            }],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    let inspect = redis.client().await;
    assert_eq!(
        command_calls(&inspect, "xadd").await,
        0,
        "nothing was written"
    );

    // A Publish larger than --max-message-size is RESOURCE_EXHAUSTED, as gRPC clients expect.
    let status = client
        .publish(proto::PublishRequest {
            stream: "orders".into(),
            entries: vec![proto::PublishEntry {
                payload: vec![b'x'; 70 * 1024].into(),
                ..Default::default()
            }],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("--max-message-size"),
        "{status:?}"
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn refused_commands_are_rejected_per_slot_and_their_entries_come_back() {
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    let sidecar = Sidecar::start(&redis.url(), POLICY).await;
    let mut client = sidecar.client().await;
    publish(&mut client, "orders", numbered(4)).await;
    let (mut sub, _) = Subscription::open(&mut client, stream_open("orders", "g", "c", 4))
        .await
        .unwrap();
    let read = sub.read().await;
    let slots: Vec<u64> = read.deliveries.iter().map(|d| d.slot).collect();
    let (a, b, c, d) = (slots[0], slots[1], slots[2], slots[3]);
    let big = "x".repeat(2048);
    sub.send(
        vec![
            command(a, "INCR", &["count:a"]),
            command(b, "INCR", &["secret:b"]),
            command(c, "DEL", &["count:a"]),
            command(d, "SET", &["count:d", &big]),
            command(a, "INCR", &["count:a"]),
            command(a, "INCR", &["count:a"]),
            command(a, "INCR", &["count:a"]),
        ],
        vec![outcome(a, Ack), outcome(b, Ack)],
    )
    .await;
    let rejections = sub.rejections().await;
    let reasons: Vec<(u64, i32, String)> = rejections
        .iter()
        .map(|r| (r.slot, r.reason, r.command.clone()))
        .collect();
    assert_eq!(
        reasons,
        vec![
            (b, RejectionReason::PermissionDenied as i32, "INCR".into()),
            (c, RejectionReason::PermissionDenied as i32, "DEL".into()),
            (d, RejectionReason::LimitExceeded as i32, "SET".into()),
            (a, RejectionReason::LimitExceeded as i32, String::new()),
            // A segment with a refused command cannot be acked, so its side effects never
            // run half.
            (a, RejectionReason::IncompleteSegment as i32, String::new()),
            (b, RejectionReason::IncompleteSegment as i32, String::new()),
        ],
        "{rejections:#?}"
    );
    assert!(rejections[0].message.contains("\"secret:b\""));
    assert!(rejections[0].message.contains("--allow-keys"));
    assert!(rejections[1].message.contains("--allow-commands"));
    assert!(
        rejections[1].message.contains("+del"),
        "{}",
        rejections[1].message
    );
    assert!(rejections[2].message.contains("--max-arg-size"));
    assert!(rejections[3].message.contains("3 queued commands"));

    // Settled another way, the refused entries come back, and the incomplete segment's
    // commands were dropped with its retry.
    let retries = slots.iter().map(|&slot| outcome(slot, Retry)).collect();
    sub.send(vec![], retries).await;
    let report = sub.flush().await;
    assert!(report.ok, "{report:?}");
    assert_eq!((report.segments_kept, report.commands), (0, 0));
    let again = sub.read().await;
    assert_eq!(again.deliveries.len(), 4);
    let first = again.deliveries[0].slot;
    let outcomes = again
        .deliveries
        .iter()
        .map(|d| outcome(d.slot, Ack))
        .collect();
    sub.send(vec![command(first, "INCR", &["count:a"])], outcomes)
        .await;
    assert!(sub.flush().await.ok);
    assert_eq!(pending(&inspect, "orders", "g").await, 0);
    let counted: Option<i64> = inspect.get("count:a").await.unwrap();
    assert_eq!(counted, Some(1));
    let secret: Option<i64> = inspect.get("secret:b").await.unwrap();
    assert_eq!(secret, None, "the refused side effect never ran");
    sidecar.stop().await;
}

#[tokio::test]
async fn the_default_rules_refuse_scripts_and_name_the_rule_that_allows_them() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    publish(&mut client, "orders", numbered(1)).await;
    let (mut sub, _) = Subscription::open(&mut client, stream_open("orders", "g", "c", 1))
        .await
        .unwrap();
    let slot = sub.read().await.deliveries[0].slot;
    sub.send(vec![command(slot, "EVAL", &["return 1", "0"])], vec![])
        .await;
    let rejections = sub.rejections().await;
    assert_eq!(
        rejections[0].reason,
        RejectionReason::PermissionDenied as i32
    );
    assert!(
        rejections[0].message.contains("+eval"),
        "{}",
        rejections[0].message
    );

    // Allowed by the operator, the script runs.
    let redis2 = RedisServer::start();
    let allowed =
        Sidecar::start(&redis2.url(), &["--allow-commands", "+@read +@write +eval"]).await;
    let mut client = allowed.client().await;
    publish(&mut client, "orders", numbered(1)).await;
    let (mut sub, _) = Subscription::open(&mut client, stream_open("orders", "g", "c", 1))
        .await
        .unwrap();
    let slot = sub.read().await.deliveries[0].slot;
    sub.send(
        vec![command(
            slot,
            "EVAL",
            &["return redis.call('INCR', KEYS[1])", "1", "scripted"],
        )],
        vec![outcome(slot, Ack)],
    )
    .await;
    assert!(sub.flush().await.ok);
    let inspect = redis2.client().await;
    let value: Option<i64> = inspect.get("scripted").await.unwrap();
    assert_eq!(value, Some(1));
    sidecar.stop().await;
    allowed.stop().await;
}

#[tokio::test]
async fn an_oversized_message_ends_the_stream_with_resource_exhausted_and_loses_nothing() {
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    let sidecar = Sidecar::start(&redis.url(), POLICY).await;
    let mut client = sidecar.client().await;
    publish(&mut client, "orders", numbered(2)).await;
    let (mut sub, _) = Subscription::open(&mut client, stream_open("orders", "g", "c", 2))
        .await
        .unwrap();
    let read = sub.read().await;
    let commands = (0..100)
        .map(|i| {
            command(
                read.deliveries[0].slot,
                "SET",
                &[&format!("count:{i}"), &"y".repeat(1000)],
            )
        })
        .collect();
    sub.send(commands, vec![outcome(read.deliveries[0].slot, Ack)])
        .await;
    let status = sub.status().await;
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("--max-message-size"),
        "{status:?}"
    );
    assert!(status.message().contains("fewer commands"), "{status:?}");

    // Nothing of the refused message ran; both entries are still pending and come back.
    let written: Option<String> = inspect.get("count:0").await.unwrap();
    assert_eq!(written, None);
    assert_eq!(pending(&inspect, "orders", "g").await, 2);
    let mut open = stream_open("orders", "g", "c", 2);
    if let Some(proto::open::Source::Stream(stream)) = &mut open.source {
        stream.min_idle = Some(prost_types::Duration::default());
    }
    let (mut sub, _) = Subscription::open(&mut client, open).await.unwrap();
    let again = sub.read().await;
    assert_eq!(again.deliveries.len(), 2);
    let outcomes = again
        .deliveries
        .iter()
        .map(|d| outcome(d.slot, Ack))
        .collect();
    sub.send(vec![], outcomes).await;
    assert!(sub.flush().await.ok);
    assert_eq!(pending(&inspect, "orders", "g").await, 0);
    sidecar.stop().await;
}

#[tokio::test]
async fn one_connection_holds_at_most_its_share_of_subscriptions() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), POLICY).await;
    let mut client = sidecar.client().await;
    let (first, _) = Subscription::open(&mut client, stream_open("orders:1", "g", "c", 1))
        .await
        .unwrap();
    let (_second, _) = Subscription::open(&mut client, stream_open("orders:2", "g", "c", 1))
        .await
        .unwrap();
    let status = match Subscription::open(&mut client, stream_open("orders:3", "g", "c", 1)).await {
        Ok(_) => panic!("a third subscription on one connection was accepted"),
        Err(status) => status,
    };
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status
            .message()
            .contains("--max-subscriptions-per-connection"),
        "{status:?}"
    );

    // Another connection has its own share; closing one frees a place on the first.
    let mut other = sidecar.client().await;
    let (_third, _) = Subscription::open(&mut other, stream_open("orders:3", "g", "c", 1))
        .await
        .unwrap();
    drop(first);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let _fourth = loop {
        match Subscription::open(&mut client, stream_open("orders:4", "g", "c", 1)).await {
            Ok((sub, _)) => break sub,
            Err(status)
                if status.code() == Code::ResourceExhausted
                    && std::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            Err(status) => panic!("the place of a closed subscription was not freed: {status:?}"),
        }
    };
    sidecar.stop().await;
}
