//! A client still working on a delivery says so (`Batch.extend`): another consumer's reclaim
//! does not take the entry, its delivery count does not move, a reliable list's lease is
//! renewed at once, and slots it does not hold are refused. What a holder sends after another
//! consumer took its entry anyway (a late extension, a late retry or dead letter) leaves the
//! entry with them.

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

/// A holder that answers after another consumer claimed its entries (its extensions could not
/// reach Redis within `min_idle`) keeps no retry in place and writes no dead letter for them:
/// it leaves them pending on that consumer, which will handle them, and does not deliver them
/// again; its own entry beside them is retried in place as usual, and the metric counts the
/// two left alone.
#[tokio::test]
async fn a_late_retry_or_dead_letter_leaves_the_entry_with_its_new_consumer() {
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    let metrics = format!("127.0.0.1:{}", free_port());
    let sidecar = Sidecar::start(&redis.url(), &["--metrics-listen", &metrics]).await;
    let mut client = sidecar.client().await;
    publish(&mut client, "orders", numbered(3)).await;
    let mut open = with_min_idle("a", 3, 60);
    open.dead_letter = Some(proto::DeadLetter {
        target: Some(proto::dead_letter::Target::Stream("orders:dead".into())),
    });
    open.max_deliveries = 5;
    let (mut a, _) = Subscription::open(&mut client, open).await.unwrap();
    let read = a.read().await;
    let [claimed, dead, mine] = [0, 1, 2].map(|i| read.deliveries[i].clone());
    // Another consumer's reclaim, as XAUTOCLAIM does once A's entries were idle enough.
    let _: fred::types::Value = inspect
        .custom(
            fred::cmd!("XCLAIM"),
            vec![
                "orders",
                "g",
                "b",
                "0",
                claimed.entry_id.as_str(),
                dead.entry_id.as_str(),
            ],
        )
        .await
        .unwrap();
    a.send(
        vec![],
        vec![
            outcome(claimed.slot, proto::OutcomeKind::Retry),
            outcome(dead.slot, proto::OutcomeKind::DeadLetter),
            outcome(mine.slot, proto::OutcomeKind::Retry),
        ],
    )
    .await;
    let report = a.flush().await;
    assert!(report.ok, "{report:?}");

    let xlen = |key: &'static str| {
        let inspect = inspect.clone();
        async move {
            let n: u64 = inspect.custom(fred::cmd!("XLEN"), vec![key]).await.unwrap();
            n
        }
    };
    assert_eq!(xlen("orders").await, 3, "no copy appended");
    assert_eq!(xlen("orders:dead").await, 0, "no dead letter for B's entry");
    assert_eq!(owner(&inspect, &claimed.entry_id).await, "b");
    assert_eq!(owner(&inspect, &dead.entry_id).await, "b");
    assert_eq!(owner(&inspect, &mine.entry_id).await, "a");
    // A's own entry comes back to A; B's do not.
    let again = a.read().await;
    let ids: Vec<&str> = again
        .deliveries
        .iter()
        .map(|d| d.entry_id.as_str())
        .collect();
    assert_eq!(ids, [mine.entry_id.as_str()]);
    assert_eq!(again.deliveries[0].delivery_count, 2);
    let nothing_more = tokio::time::timeout(Duration::from_millis(300), a.read()).await;
    assert!(
        nothing_more.is_err(),
        "B's entries delivered to A: {nothing_more:?}"
    );
    let text = scrape(&metrics).await;
    assert_eq!(
        sample(
            &text,
            r#"window_sidecar_settles_skipped_total{form="stream"}"#
        ),
        2.0
    );
    assert_eq!(
        metric_sum(&text, "window_sidecar_dead_letters_total", ""),
        0.0,
        "B's entry was not dead-lettered here"
    );
    a.close();
    sidecar.stop().await;
}

/// On a reliable list: a holder whose processing list another consumer recovered (its lease
/// lapsed) pushes no copy and no dead letter for the values that left it; its own value beside
/// them is retried as usual.
#[tokio::test]
async fn a_late_retry_on_a_reliable_list_leaves_a_recovered_value_alone() {
    use fred::prelude::ListInterface;
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    let _: i64 = inspect.rpush("jobs", vec!["job-1", "job-2"]).await.unwrap();
    let open = proto::Open {
        source: Some(proto::open::Source::ReliableList(
            proto::ReliableListSource {
                key: "jobs".into(),
                consumer: "a".into(),
                ..Default::default()
            },
        )),
        count: 2,
        ..Default::default()
    };
    let (mut a, _) = Subscription::open(&mut client, open).await.unwrap();
    let read = a.read().await;
    assert_eq!(read.deliveries.len(), 2);
    let payload = |d: &proto::Delivery| String::from_utf8(d.payload.to_vec()).unwrap();
    let recovered = read
        .deliveries
        .iter()
        .find(|d| payload(d) == "job-1")
        .unwrap();
    let mine = read
        .deliveries
        .iter()
        .find(|d| payload(d) == "job-2")
        .unwrap();
    // Another consumer's recovery of A's processing list took job-1 (onto its own processing
    // list, as if it read it at once: where it went, the reader of A cannot take it again).
    let _: Option<String> = inspect
        .lmove(
            "{jobs}:window:processing:a",
            "{jobs}:window:processing:b",
            fred::types::lists::LMoveDirection::Left,
            fred::types::lists::LMoveDirection::Left,
        )
        .await
        .unwrap();
    let taken: Vec<String> = inspect
        .lrange("{jobs}:window:processing:b", 0, -1)
        .await
        .unwrap();
    assert_eq!(taken, ["job-1"]);
    a.send(
        vec![],
        vec![
            outcome(recovered.slot, proto::OutcomeKind::Retry),
            outcome(mine.slot, proto::OutcomeKind::Retry),
        ],
    )
    .await;
    assert!(a.flush().await.ok);
    let mut all = Vec::new();
    for list in [
        "jobs",
        "{jobs}:window:processing:a",
        "{jobs}:window:processing:b",
    ] {
        let values: Vec<String> = inspect.lrange(list, 0, -1).await.unwrap();
        all.extend(values);
    }
    all.sort();
    assert_eq!(all, ["job-1", "job-2"], "job-1 once, with B; no copy of it");
    a.close();
    sidecar.stop().await;
}
