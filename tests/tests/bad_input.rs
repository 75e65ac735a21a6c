//! Bad input: a malformed subscription ends with INVALID_ARGUMENT and an actionable message;
//! a malformed command or outcome is rejected for its slot while the stream goes on; nothing
//! is lost either way.

use fred::prelude::*;
use window_sidecar::proto::OutcomeKind::{Ack, Drop};
use window_sidecar::proto::subscribe_request::Kind as Request;
use window_sidecar::proto::{self, RejectionReason};
use window_sidecar_harness::*;

async fn invalid_open(sidecar: &Sidecar, open: proto::Open) -> tonic::Status {
    let mut client = sidecar.client().await;
    let mut sub = Subscription::start(&mut client, Request::Open(open))
        .await
        .unwrap();
    sub.status().await
}

#[tokio::test]
async fn malformed_subscriptions_end_with_invalid_argument() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &["--max-count", "100"]).await;

    let cases: Vec<(proto::Open, &str)> = vec![
        (stream_open("", "g", "c", 1), "open.stream.key is required"),
        (
            stream_open("k", "", "c", 1),
            "open.stream.group is required",
        ),
        (
            stream_open("k", "g", "c", 0),
            "open.count must be between 1 and 100",
        ),
        (
            stream_open("k", "g", "c", 101),
            "open.count must be between 1 and 100 (the sidecar's --max-count), got 101",
        ),
        (
            proto::Open {
                mode: 9,
                ..stream_open("k", "g", "c", 1)
            },
            "open.mode 9 is not a known mode",
        ),
        (
            proto::Open {
                source: None,
                ..stream_open("k", "g", "c", 1)
            },
            "open.source is required",
        ),
    ];
    for (open, expected) in cases {
        let status = invalid_open(&sidecar, open).await;
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(
            status.message().contains(expected),
            "{:?} lacks {expected:?}",
            status.message()
        );
    }

    // The first message must be an open.
    let mut client = sidecar.client().await;
    let mut sub = Subscription::start(&mut client, Request::Batch(proto::Batch::default()))
        .await
        .unwrap();
    let status = sub.status().await;
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status
            .message()
            .contains("first message of a subscription must be `open`")
    );

    // A second open ends the stream; what was settled before is still flushed.
    publish(&mut client, "orders", numbered(2)).await;
    let (mut sub, _) = Subscription::open(&mut client, stream_open("orders", "g", "c", 2))
        .await
        .unwrap();
    let read = sub.read().await;
    sub.send(
        vec![command(read.deliveries[0].slot, "INCR", &["k"])],
        vec![outcome(read.deliveries[0].slot, Ack)],
    )
    .await;
    sub.send_kind(Request::Open(stream_open("orders", "g", "c", 2)))
        .await;
    let report = sub.flush().await;
    assert_eq!(report.settles, 1);
    let status = sub.status().await;
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("already open"));
    let inspect = redis.client().await;
    assert_eq!(inspect.get::<i64, _>("k").await.unwrap(), 1);
    assert_eq!(
        pending(&inspect, "orders", "g").await,
        1,
        "the unsettled entry stays pending"
    );
    sidecar.stop().await;
}

/// Commands that must never run inside a window.
const FORBIDDEN: [&str; 17] = [
    "BLPOP",
    "multi",
    "EXEC",
    "WATCH",
    "SUBSCRIBE",
    "PSUBSCRIBE",
    "SSUBSCRIBE",
    "MONITOR",
    "FLUSHALL",
    "FLUSHDB",
    "CONFIG",
    "SHUTDOWN",
    "DEBUG",
    "SCRIPT",
    "FUNCTION",
    "CLIENT",
    "ACL",
];

/// A subscription holding one read of three deliveries, in slots `a`, `b` and `c`, that the
/// per-slot tests send bad input for, step by step: each step is the set-up of the next.
struct PerSlot {
    _redis: RedisServer,
    inspect: Client,
    sidecar: Sidecar,
    client: proto::window_service_client::WindowServiceClient<tonic::transport::Channel>,
    sub: Subscription,
    a: u64,
    b: u64,
    c: u64,
}

impl PerSlot {
    async fn open() -> PerSlot {
        let redis = RedisServer::start();
        let sidecar = Sidecar::start(&redis.url(), &[]).await;
        let mut client = sidecar.client().await;
        publish(&mut client, "orders", numbered(3)).await;
        let (mut sub, _) = Subscription::open(&mut client, stream_open("orders", "g", "c", 3))
            .await
            .unwrap();
        let read = sub.read().await;
        let inspect = redis.client().await;
        PerSlot {
            a: read.deliveries[0].slot,
            b: read.deliveries[1].slot,
            c: read.deliveries[2].slot,
            _redis: redis,
            inspect,
            sidecar,
            client,
            sub,
        }
    }

    /// Forbidden commands in slot `b`, an empty name in `c`, a command for an unknown slot, an
    /// INCR in `a`; an outcome for an unknown slot and one with no kind for `a`.
    async fn send_malformed(&mut self) -> Vec<proto::Rejection> {
        let (a, b, c) = (self.a, self.b, self.c);
        let mut commands: Vec<_> = FORBIDDEN
            .iter()
            .map(|name| command(b, name, &["x"]))
            .collect();
        commands.push(command(c, "", &[]));
        commands.push(command(9_999, "INCR", &["k"]));
        commands.push(command(a, "INCR", &["a"]));
        self.sub
            .send(
                commands,
                vec![
                    outcome(0, Ack),
                    proto::Outcome {
                        slot: a,
                        kind: 0,
                        ..Default::default()
                    },
                ],
            )
            .await;
        self.sub.rejections().await
    }

    /// Acks slot `b`, whose segment lost its commands.
    async fn ack_the_incomplete_segment(&mut self) -> Vec<proto::Rejection> {
        self.sub.send(vec![], vec![outcome(self.b, Ack)]).await;
        self.sub.rejections().await
    }

    /// Acks then drops `a`, drops `b` and `c`: the flush that follows.
    async fn settle_a_twice(&mut self) -> (Vec<proto::Rejection>, proto::FlushReport) {
        let (a, b, c) = (self.a, self.b, self.c);
        self.sub
            .send(
                vec![],
                vec![
                    outcome(a, Ack),
                    outcome(a, Drop),
                    outcome(b, Drop),
                    outcome(c, Drop),
                ],
            )
            .await;
        let rejections = self.sub.rejections().await;
        (rejections, self.sub.flush().await)
    }

    /// A command for the settled slot `a`.
    async fn command_for_settled_a(&mut self) -> Vec<proto::Rejection> {
        self.sub
            .send(vec![command(self.a, "INCR", &["late"])], vec![])
            .await;
        self.sub.rejections().await
    }
}

/// Commands that must never run inside a window, an empty name, an unknown slot, an outcome
/// with no kind: each is rejected for its slot with its reason.
#[tokio::test]
async fn malformed_commands_and_outcomes_are_rejected_for_their_slot() {
    let mut on = PerSlot::open().await;
    let (a, b, c) = (on.a, on.b, on.c);
    let rejections = on.send_malformed().await;
    assert_eq!(rejections.len(), FORBIDDEN.len() + 4);
    for (r, name) in rejections.iter().zip(FORBIDDEN) {
        assert_eq!(r.slot, b);
        assert_eq!(r.reason, RejectionReason::ForbiddenCommand as i32, "{r:?}");
        assert_eq!(r.command, name.to_ascii_uppercase());
        assert!(
            r.message.contains("never run inside a window"),
            "{}",
            r.message
        );
    }
    let rest = &rejections[FORBIDDEN.len()..];
    assert_eq!(
        (rest[0].slot, rest[0].reason),
        (c, RejectionReason::InvalidCommand as i32)
    );
    assert!(rest[0].message.contains("empty"));
    assert_eq!(
        (rest[1].slot, rest[1].reason),
        (9_999, RejectionReason::UnknownSlot as i32)
    );
    assert_eq!(
        (rest[2].slot, rest[2].reason),
        (0, RejectionReason::UnknownSlot as i32)
    );
    assert_eq!(
        (rest[3].slot, rest[3].reason),
        (a, RejectionReason::InvalidOutcome as i32)
    );
    assert!(rest[3].message.contains("no kind"));
    on.sidecar.stop().await;
}

/// A slot whose command was rejected has an incomplete segment: an ack is refused with what to
/// do instead.
#[tokio::test]
async fn an_incomplete_segment_refuses_an_ack() {
    let mut on = PerSlot::open().await;
    on.send_malformed().await;
    let rejections = on.ack_the_incomplete_segment().await;
    assert_eq!(
        rejections[0].reason,
        RejectionReason::IncompleteSegment as i32
    );
    assert!(
        rejections[0]
            .message
            .contains("settle it with drop, retry or retry_after")
    );
    on.sidecar.stop().await;
}

/// Commands Redis would refuse for their arguments (a wrong number of them, a subcommand it
/// does not know) are refused for their slot before anything is sent, in either mode: in
/// atomic mode Redis would discard the delivery's whole transaction for them, and in pipeline
/// mode ack the entry beside a side effect that never ran.
#[tokio::test]
async fn commands_redis_would_refuse_for_their_arguments_are_rejected_for_their_slot() {
    for mode in [proto::Mode::Pipeline, proto::Mode::Atomic] {
        let redis = RedisServer::start();
        let sidecar = Sidecar::start(&redis.url(), &[]).await;
        let mut client = sidecar.client().await;
        publish(&mut client, "orders", numbered(3)).await;
        let open = proto::Open {
            mode: mode as i32,
            ..stream_open("orders", "g", "c", 3)
        };
        let (mut sub, _) = Subscription::open(&mut client, open).await.unwrap();
        let read = sub.read().await;
        let [a, b, c] = [0, 1, 2].map(|i| read.deliveries[i].slot);
        sub.send(
            vec![
                command(a, "INCR", &["applied-never", "1"]),
                command(b, "SET", &["k"]),
                command(c, "OBJECT", &["nope", "k"]),
                command(c, "SET", &["applied-never", "v", "EX", "60"]),
            ],
            vec![],
        )
        .await;
        let rejections = sub.rejections().await;
        let got: Vec<_> = rejections
            .iter()
            .map(|r| (r.slot, r.reason, r.command.clone(), r.message.clone()))
            .collect();
        let invalid = RejectionReason::InvalidCommand as i32;
        let want = |slot: u64, command: &str, why: &str| {
            (
                slot,
                invalid,
                command.to_owned(),
                format!("slot {slot}: {why}"),
            )
        };
        assert_eq!(
            got,
            [
                want(
                    a,
                    "INCR",
                    "wrong number of arguments: INCR takes exactly 1 argument, 2 given"
                ),
                want(
                    b,
                    "SET",
                    "wrong number of arguments: SET takes at least 2 arguments, 1 given"
                ),
                want(
                    c,
                    "OBJECT NOPE",
                    "Redis does not know the command OBJECT NOPE"
                ),
            ],
            "{mode:?}"
        );
        // Their segments are incomplete: an ack is refused, a drop settles them.
        sub.send(vec![], vec![outcome(a, Ack)]).await;
        let refused = sub.rejections().await;
        assert_eq!(
            refused[0].reason,
            RejectionReason::IncompleteSegment as i32,
            "{mode:?}"
        );
        sub.send(
            vec![],
            vec![outcome(a, Drop), outcome(b, Drop), outcome(c, Drop)],
        )
        .await;
        let report = sub.flush().await;
        assert!(report.ok, "{mode:?}: {report:?}");
        assert_eq!((report.settles, report.commands), (3, 0), "{mode:?}");
        let inspect = redis.client().await;
        assert_eq!(
            inspect
                .exists::<i64, _>(vec!["applied-never", "k"])
                .await
                .unwrap(),
            0
        );
        assert_eq!(pending(&inspect, "orders", "g").await, 0);
        sidecar.stop().await;
    }
}

/// A second outcome for a slot and a command for a settled slot are refused; the incomplete
/// segment's drop and the other outcomes are flushed.
#[tokio::test]
async fn a_settled_slot_refuses_a_second_outcome_and_a_late_command() {
    let mut on = PerSlot::open().await;
    let a = on.a;
    on.send_malformed().await;
    on.ack_the_incomplete_segment().await;
    let (rejections, report) = on.settle_a_twice().await;
    assert_eq!(rejections.len(), 1);
    assert_eq!(
        (rejections[0].slot, rejections[0].reason),
        (a, RejectionReason::AlreadySettled as i32)
    );
    assert!(report.ok);
    assert_eq!(
        (report.segments_kept, report.settles, report.commands),
        (1, 3, 1)
    );
    let rejections = on.command_for_settled_a().await;
    assert_eq!(rejections[0].reason, RejectionReason::AlreadySettled as i32);
    on.sidecar.stop().await;
}

/// After every kind of per-slot rejection nothing was lost and nothing forbidden ran, and the
/// stream is still open and delivering.
#[tokio::test]
async fn per_slot_problems_lose_nothing_and_the_stream_goes_on() {
    let mut on = PerSlot::open().await;
    on.send_malformed().await;
    on.ack_the_incomplete_segment().await;
    on.settle_a_twice().await;
    on.command_for_settled_a().await;

    let inspect = &on.inspect;
    assert_eq!(inspect.get::<i64, _>("a").await.unwrap(), 1);
    assert_eq!(
        inspect
            .exists::<i64, _>(vec!["late", "k", "x"])
            .await
            .unwrap(),
        0
    );
    assert_eq!(pending(inspect, "orders", "g").await, 0);

    publish(&mut on.client, "orders", numbered(1)).await;
    assert_eq!(on.sub.read().await.deliveries.len(), 1);
    on.sidecar.stop().await;
}

#[tokio::test]
async fn retry_after_without_a_delay_is_rejected() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    publish(&mut client, "orders", numbered(1)).await;
    let (mut sub, _) = Subscription::open(&mut client, stream_open("orders", "g", "c", 1))
        .await
        .unwrap();
    let slot = sub.read().await.deliveries[0].slot;
    let no_delay = proto::Outcome {
        slot,
        kind: proto::OutcomeKind::RetryAfter as i32,
        ..Default::default()
    };
    sub.send(vec![], vec![no_delay]).await;
    let rejections = sub.rejections().await;
    assert_eq!(rejections[0].reason, RejectionReason::InvalidOutcome as i32);
    assert!(rejections[0].message.contains("retry_after needs a delay"));
    // The slot is still open and can be settled properly.
    sub.send(
        vec![],
        vec![retry_after(slot, std::time::Duration::from_millis(10))],
    )
    .await;
    assert!(sub.flush().await.ok);
    sidecar.stop().await;
}

#[tokio::test]
async fn one_consumer_name_reads_on_one_stream_at_a_time() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    let (mut first, _) = Subscription::open(&mut client, stream_open("orders", "g", "c", 1))
        .await
        .unwrap();
    let mut second = Subscription::start(
        &mut client,
        Request::Open(stream_open("orders", "g", "c", 1)),
    )
    .await
    .unwrap();
    let status = second.status().await;
    assert_eq!(status.code(), tonic::Code::AlreadyExists);
    assert!(
        status
            .message()
            .contains("give each subscription its own consumer name")
    );

    // Once the first stream is gone, the name is free again.
    first.close();
    assert!(matches!(first.next().await, Ok(None)));
    Subscription::open(&mut client, stream_open("orders", "g", "c", 1))
        .await
        .unwrap();
    sidecar.stop().await;
}

#[tokio::test]
async fn a_client_that_vanishes_leaves_its_entries_pending() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    publish(&mut client, "orders", numbered(2)).await;
    let (mut sub, _) = Subscription::open(&mut client, stream_open("orders", "g", "c", 2))
        .await
        .unwrap();
    assert_eq!(sub.read().await.deliveries.len(), 2);
    // Dropping the call without a goodbye cancels it (RST_STREAM), as a crashed client would.
    drop(sub);
    let inspect = redis.client().await;
    let reopened = eventually(STEP, || async {
        let mut client = sidecar.client().await;
        Subscription::open(&mut client, stream_open("orders", "g", "c", 2))
            .await
            .is_ok()
    })
    .await;
    assert!(
        reopened,
        "the consumer is released when its client vanishes"
    );
    assert_eq!(pending(&inspect, "orders", "g").await, 2);
    sidecar.stop().await;
}

#[tokio::test]
async fn publish_refuses_malformed_requests() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    let cases = vec![
        (
            proto::PublishRequest {
                stream: String::new(),
                entries: vec![proto::PublishEntry::default()],
                ..Default::default()
            },
            "set exactly one of stream, list, channel and sharded_channel",
        ),
        (
            proto::PublishRequest {
                stream: "s".into(),
                channel: "c".into(),
                entries: vec![proto::PublishEntry::default()],
                ..Default::default()
            },
            "set exactly one of stream, list, channel and sharded_channel",
        ),
        (
            proto::PublishRequest {
                list: "l".into(),
                entries: vec![proto::PublishEntry {
                    fields: vec![proto::Field::default()],
                    ..Default::default()
                }],
                ..Default::default()
            },
            "entries[0]: a list value or a message is a `payload` with `headers`",
        ),
        (
            proto::PublishRequest {
                stream: "s".into(),
                entries: vec![],
                ..Default::default()
            },
            "entries must not be empty",
        ),
        (
            proto::PublishRequest {
                stream: "s".into(),
                entries: vec![proto::PublishEntry::default()],
                ..Default::default()
            },
            "entries[0]: a publish entry needs `fields` or a `payload`",
        ),
    ];
    for (request, expected) in cases {
        let status = client.publish(request).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains(expected), "{}", status.message());
    }
    // A key of the wrong type is a precondition the deployment must fix.
    let inspect = redis.client().await;
    let _: () = inspect
        .set("not-a-stream", "x", None, None, false)
        .await
        .unwrap();
    let status = client
        .publish(proto::PublishRequest {
            stream: "not-a-stream".into(),
            entries: vec![proto::PublishEntry {
                payload: "p".into(),
                ..Default::default()
            }],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(
        status.message().contains("WRONGTYPE"),
        "{}",
        status.message()
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn publish_writes_the_payload_layout_and_delivers_it_split() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    client
        .publish(proto::PublishRequest {
            stream: "orders".into(),
            entries: vec![proto::PublishEntry {
                payload: r#"{"id":1}"#.into(),
                headers: [("tenant".to_string(), "acme".to_string())].into(),
                trace: Some(proto::TraceContext {
                    traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
                    tracestate: String::new(),
                }),
                ..Default::default()
            }],
            ..Default::default()
        })
        .await
        .unwrap();
    let (mut sub, _) = Subscription::open(&mut client, stream_open("orders", "g", "c", 1))
        .await
        .unwrap();
    let d = sub.read().await.deliveries.remove(0);
    assert_eq!(d.payload.as_ref(), br#"{"id":1}"#);
    assert_eq!(d.headers["tenant"], "acme");
    assert!(d.fields.is_empty());
    assert_eq!(
        d.trace.unwrap().traceparent,
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    );
    sidecar.stop().await;
}
