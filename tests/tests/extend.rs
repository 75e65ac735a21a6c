//! A client still working on a delivery says so (`Batch.extend`): another consumer's reclaim
//! does not take the entry, its delivery count does not move, a reliable list's lease is
//! renewed at once, and slots it does not hold are refused.

use std::time::Duration;

use fred::prelude::ClientLike;

use tokio::time::Instant;
use window_sidecar::proto::OutcomeKind::Ack;
use window_sidecar::proto::{self, RejectionReason, subscribe_response::Kind};
use window_sidecar_harness::*;

fn extend(slots: Vec<u64>) -> proto::subscribe_request::Kind {
    proto::subscribe_request::Kind::Batch(proto::Batch {
        extend: slots,
        ..Default::default()
    })
}

fn with_min_idle(consumer: &str, count: u32, seconds: i64) -> proto::Open {
    let mut open = stream_open("orders", "g", consumer, count);
    if let Some(proto::open::Source::Stream(stream)) = &mut open.source {
        stream.min_idle = Some(prost_types::Duration { seconds, nanos: 0 });
    }
    open
}

/// A holds two entries past B's `min_idle` (1 s; A's own is a minute, so that A's reclaim
/// leaves them alone) and extends one of them every 300 ms; B reclaims every 200 ms. B gets
/// the other one (reclaim is live) and never the extended one, which A then acks as its first
/// delivery.
#[tokio::test]
async fn an_extended_entry_is_not_reclaimed_by_another_consumer() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &["--reclaim-interval", "200ms"]).await;
    let mut client = sidecar.client().await;
    publish(&mut client, "orders", numbered(2)).await;
    let (mut a, _) = Subscription::open(&mut client, with_min_idle("a", 2, 60))
        .await
        .unwrap();
    let read = a.read().await;
    let [kept, left] = [&read.deliveries[0], &read.deliveries[1]];
    let (mut b, _) = Subscription::open(&mut client, with_min_idle("b", 2, 1))
        .await
        .unwrap();

    let until = Instant::now() + Duration::from_millis(2600);
    let mut next_extend = Instant::now();
    let mut reclaimed = Vec::new();
    while Instant::now() < until {
        if Instant::now() >= next_extend {
            a.send_kind(extend(vec![kept.slot])).await;
            next_extend += Duration::from_millis(300);
        }
        let wait = next_extend
            .min(until)
            .saturating_duration_since(Instant::now());
        if let Ok(message) = tokio::time::timeout(wait, b.next()).await {
            match message.unwrap() {
                Some(Kind::Read(read)) => {
                    let acks = read.deliveries.iter().map(|d| outcome(d.slot, Ack));
                    b.send(vec![], acks.collect()).await;
                    reclaimed.extend(read.deliveries);
                }
                Some(_) => {}
                None => panic!("B's stream ended"),
            }
        }
    }
    let ids: Vec<&str> = reclaimed.iter().map(|d| d.entry_id.as_str()).collect();
    assert_eq!(ids, [left.entry_id.as_str()], "B reclaimed {reclaimed:?}");
    assert_eq!(reclaimed[0].delivery_count, 2);

    a.send(
        vec![command(kept.slot, "INCR", &["done"])],
        // The other one is B's now: A's ack of it settles nothing more.
        vec![outcome(kept.slot, Ack), outcome(left.slot, Ack)],
    )
    .await;
    let report = a.flush().await;
    assert!(report.ok, "{report:?}");
    let inspect = redis.client().await;
    let done: i64 = fred::prelude::KeysInterface::get(&inspect, "done")
        .await
        .unwrap();
    assert_eq!(done, 1);
    sidecar.stop().await;
}

/// Extending a slot the client does not hold is a per-slot rejection, and extending does not
/// settle: the slot is still there to ack afterwards.
#[tokio::test]
async fn extending_a_slot_that_is_not_outstanding_is_rejected() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    publish(&mut client, "orders", numbered(1)).await;
    let (mut sub, _) = Subscription::open(&mut client, stream_open("orders", "g", "c", 1))
        .await
        .unwrap();
    let d = sub.read().await.deliveries.remove(0);
    sub.send_kind(extend(vec![d.slot, 99])).await;
    let rejected = sub.rejections().await;
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert_eq!(rejected[0].slot, 99);
    assert_eq!(rejected[0].reason, RejectionReason::UnknownSlot as i32);
    sub.send(vec![], vec![outcome(d.slot, Ack)]).await;
    assert!(sub.flush().await.ok);
    sub.send_kind(extend(vec![d.slot])).await;
    let rejected = sub.rejections().await;
    assert_eq!(rejected[0].reason, RejectionReason::AlreadySettled as i32);
    sidecar.stop().await;
}

/// A reliable list's consumer extends by renewing its lease (its heartbeat key) at once: the
/// key's time to live goes back to `dead_after` long before the next periodic renewal (a third
/// of `dead_after`, 10 s here), so no other consumer recovers its processing list meanwhile.
#[tokio::test]
async fn extending_on_a_reliable_list_renews_the_consumers_lease_at_once() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    let inspect = redis.client().await;
    let _: i64 = fred::prelude::ListInterface::lpush(&inspect, "jobs", "job-1")
        .await
        .unwrap();
    let open = proto::Open {
        source: Some(proto::open::Source::ReliableList(
            proto::ReliableListSource {
                key: "jobs".into(),
                consumer: "a".into(),
                dead_after: Some(prost_types::Duration {
                    seconds: 30,
                    nanos: 0,
                }),
            },
        )),
        count: 1,
        ..Default::default()
    };
    let (mut sub, _) = Subscription::open(&mut client, open).await.unwrap();
    let d = sub.read().await.deliveries.remove(0);
    let ttl = || async {
        let ttl: i64 = fred::prelude::KeysInterface::pttl(&inspect, "{jobs}:window:heartbeat:a")
            .await
            .unwrap();
        ttl
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = ttl().await;
    assert!(
        before < 29_000,
        "the lease was renewed on its own: {before} ms left"
    );

    sub.send_kind(extend(vec![d.slot])).await;
    let renewed = eventually(Duration::from_secs(2), || async { ttl().await > 29_500 }).await;
    assert!(renewed, "extend left {} ms on the lease", ttl().await);

    sub.send(vec![], vec![outcome(d.slot, Ack)]).await;
    assert!(sub.flush().await.ok);
    let held: i64 = fred::prelude::ListInterface::llen(&inspect, "{jobs}:window:processing:a")
        .await
        .unwrap();
    assert_eq!(held, 0);
    sidecar.stop().await;
}

/// The consumer an entry is pending on, per `XPENDING`.
async fn owner(client: &fred::prelude::Client, id: &str) -> String {
    let reply: fred::types::Value = client
        .custom(fred::cmd!("XPENDING"), vec!["orders", "g", id, id, "1"])
        .await
        .unwrap();
    let fred::types::Value::Array(rows) = reply else {
        panic!("XPENDING: {reply:?}")
    };
    let fred::types::Value::Array(row) = &rows[0] else {
        panic!("XPENDING row: {rows:?}")
    };
    row[1].as_string().unwrap()
}

/// An extension that comes after another consumer reclaimed the entry (A's handler outlived
/// `min_idle` without extending) leaves it with that consumer: taking it back from under them
/// would leave both working on it.
#[tokio::test]
async fn a_late_extension_does_not_take_the_entry_back_from_its_new_consumer() {
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    publish(&mut client, "orders", numbered(1)).await;
    let (mut a, _) = Subscription::open(&mut client, with_min_idle("a", 1, 60))
        .await
        .unwrap();
    let held = a.read().await.deliveries[0].clone();
    // Another consumer's reclaim, as XAUTOCLAIM would do once A's entry was idle enough.
    let _: fred::types::Value = inspect
        .custom(
            fred::cmd!("XCLAIM"),
            vec!["orders", "g", "b", "0", held.entry_id.as_str()],
        )
        .await
        .unwrap();
    a.send_kind(extend(vec![held.slot])).await;
    // The extension goes out at once; give it time to have run.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(owner(&inspect, &held.entry_id).await, "b");
    a.close();
    sidecar.stop().await;
}
