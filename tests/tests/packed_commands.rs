//! Packed commands (`Batch.packed_commands`): RESP arrays of bulk strings, one per command,
//! with their slots beside them. They run as the same commands sent one `QueuedCommand` each
//! would, after those of the same message, in both modes; they are rejected per slot alike;
//! bytes that are not RESP end the stream with INVALID_ARGUMENT and lose nothing.

use bytes::Bytes;
use fred::prelude::*;
use window_sidecar::proto::OutcomeKind::{Ack, Drop};
use window_sidecar::proto::subscribe_request::Kind as Request;
use window_sidecar::proto::{self, RejectionReason};
use window_sidecar_harness::*;

async fn packed_commands_run_as_queued_commands(mode: proto::Mode) {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let inspect = redis.client().await;
    let mut client = sidecar.client().await;
    publish(&mut client, "orders", numbered(3)).await;
    let open = proto::Open {
        mode: mode as i32,
        ..stream_open("orders", "g", "c", 3)
    };
    let (mut sub, opened) = Subscription::open(&mut client, open).await.unwrap();
    assert!(opened.packed_commands, "{opened:?}");
    let read = sub.read().await;
    let [a, b, c] = [0, 1, 2].map(|i| read.deliveries[i].slot);

    let mut hset = command(a, "hset", &["h", "f"]);
    hset.args.push(Bytes::from_static(b"binary\r\n\0safe"));
    let (packed_commands, packed_command_slots) = pack_commands(&[
        command(a, "APPEND", &["log", "-packed"]),
        hset,
        command(b, "INCR", &["hits"]),
        command(c, "FLUSHALL", &[]),
        command(c, "INCR", &["hits"]),
    ]);
    sub.send_kind(Request::Batch(proto::Batch {
        // Queued before the packed ones of the same message.
        commands: vec![command(a, "APPEND", &["log", "queued"])],
        packed_commands,
        packed_command_slots,
        outcomes: vec![outcome(c, Drop)],
        acks: vec![a, b],
        ..Default::default()
    }))
    .await;
    let rejections = sub.rejections().await;
    assert_eq!(rejections.len(), 1, "{rejections:?}");
    assert_eq!(
        (rejections[0].slot, rejections[0].reason),
        (c, RejectionReason::ForbiddenCommand as i32)
    );
    assert_eq!(rejections[0].command, "FLUSHALL");
    let report = sub.flush().await;
    assert!(report.ok, "{report:?}");
    assert_eq!((report.segments_kept, report.settles), (2, 3), "{report:?}");

    let log: String = inspect.get("log").await.unwrap();
    assert_eq!(log, "queued-packed");
    let field: Bytes = inspect.hget("h", "f").await.unwrap();
    assert_eq!(&field[..], b"binary\r\n\0safe");
    // c was dropped: its INCR was never kept.
    assert_eq!(counter(&inspect, "hits").await, 1);
    assert_eq!(pending(&inspect, "orders", "g").await, 0);
    sidecar.stop().await;
}

#[tokio::test]
async fn packed_commands_run_as_queued_commands_in_pipeline_mode() {
    packed_commands_run_as_queued_commands(proto::Mode::Pipeline).await;
}

#[tokio::test]
async fn packed_commands_run_as_queued_commands_in_atomic_mode() {
    packed_commands_run_as_queued_commands(proto::Mode::Atomic).await;
}

/// Bytes that are not RESP arrays of bulk strings end the stream with a message that says
/// where; the read's entries stay pending and come again.
#[tokio::test]
async fn packed_commands_that_are_not_resp_end_the_stream_and_lose_nothing() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let inspect = redis.client().await;
    let mut client = sidecar.client().await;
    publish(&mut client, "orders", numbered(2)).await;
    let cases: [(&[u8], usize, &str); 2] = [
        (
            b"*2\r\n$4\r\nINCR\r\n$4\r\nhits\r\nINCR hits\r\n",
            2,
            "batch.packed_commands: command 1, at byte 24: expected '*'",
        ),
        (
            b"*2\r\n$4\r\nINCR\r\n$4\r\nhits\r\n",
            2,
            "batch.packed_commands holds 1 commands, but packed_command_slots names 2 slots",
        ),
    ];
    for (bytes, slots, expected) in cases {
        let (mut sub, _) = Subscription::open(&mut client, stream_open("orders", "g", "c", 2))
            .await
            .unwrap();
        let read = sub.read().await;
        assert_eq!(read.deliveries.len(), 2);
        let slot = read.deliveries[0].slot;
        sub.send_kind(Request::Batch(proto::Batch {
            packed_commands: Bytes::from_static(bytes),
            packed_command_slots: vec![slot; slots],
            outcomes: vec![outcome(slot, Ack)],
            ..Default::default()
        }))
        .await;
        let status = sub.status().await;
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(
            status.message().contains(expected),
            "{:?} lacks {expected:?}",
            status.message()
        );
        assert_eq!(pending(&inspect, "orders", "g").await, 2);
        assert_eq!(inspect.exists::<i64, _>("hits").await.unwrap(), 0);
    }
    sidecar.stop().await;
}
