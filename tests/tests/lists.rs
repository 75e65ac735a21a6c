//! The list forms end to end. A reliable list: one `LREM` per settled entry, a retry back with
//! a higher delivery count, a restarted consumer served its processing list first and a dead
//! one's recovered, a consumer that reopens at once given what its last read took. A simple
//! list: no more lost than was in flight.

use std::collections::HashSet;
use std::time::Duration;

use fred::prelude::*;
use window_sidecar::proto;
use window_sidecar::proto::OutcomeKind::{Ack, Drop, Retry};
use window_sidecar_harness::forms::{len, payload, push, reliable, run_window, simple};
use window_sidecar_harness::*;

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
