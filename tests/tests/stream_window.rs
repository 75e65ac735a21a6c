//! The stream window end to end: a real redis-server, the sidecar, the generated gRPC client.

use std::collections::HashSet;
use std::time::Duration;

use bytes::Bytes;
use fred::prelude::*;
use window_sidecar::proto;
use window_sidecar::proto::OutcomeKind::{Ack, Drop, Retry};
use window_sidecar::proto::subscribe_response::Kind;
use window_sidecar::proto::window_service_client::WindowServiceClient;
use window_sidecar_harness::*;

async fn counter(client: &Client, key: &str) -> i64 {
    client
        .get::<Option<i64>, _>(key)
        .await
        .unwrap()
        .unwrap_or(0)
}

#[tokio::test]
async fn ack_keeps_side_effects_and_drop_sends_none() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    publish(&mut client, "orders", numbered(2)).await;

    let (mut sub, opened) = Subscription::open(&mut client, stream_open("orders", "g", "c1", 10))
        .await
        .unwrap();
    assert_eq!(opened.consumer, "c1");
    let read = sub.read().await;
    assert_eq!(read.deliveries.len(), 2);
    let (a, b) = (&read.deliveries[0], &read.deliveries[1]);
    assert_eq!(a.delivery_count, 1);
    sub.send(
        vec![
            command(a.slot, "INCR", &["acked"]),
            command(b.slot, "INCR", &["dropped"]),
        ],
        vec![outcome(a.slot, Ack), outcome(b.slot, Drop)],
    )
    .await;
    let report = sub.flush().await;
    assert!(report.ok, "{report:?}");
    assert_eq!((report.segments_kept, report.segments_dropped), (1, 1));
    assert_eq!((report.commands, report.settles), (1, 2));

    let inspect = redis.client().await;
    assert_eq!(counter(&inspect, "acked").await, 1);
    assert_eq!(counter(&inspect, "dropped").await, 0);
    assert_eq!(pending(&inspect, "orders", "g").await, 0);
    sidecar.stop().await;
}

#[tokio::test]
async fn the_mixed_window_keeps_thirteen_of_twenty() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    publish(&mut client, "orders", numbered(20)).await;

    let (mut sub, _) = Subscription::open(&mut client, stream_open("orders", "g", "c1", 20))
        .await
        .unwrap();
    let read = sub.read().await;
    assert_eq!(read.deliveries.len(), 20);
    let mut commands = Vec::new();
    let mut outcomes = Vec::new();
    for d in &read.deliveries {
        let n: u32 = field(d, "n").parse().unwrap();
        commands.push(command(d.slot, "INCR", &["side-effects"]));
        commands.push(command(d.slot, "SADD", &["seen", &n.to_string()]));
        outcomes.push(outcome(
            d.slot,
            if n.is_multiple_of(3) { Drop } else { Ack },
        ));
    }
    sub.send(commands, outcomes).await;
    let report = sub.flush().await;
    assert!(report.ok);
    assert_eq!((report.segments_kept, report.settles), (13, 20));

    let inspect = redis.client().await;
    assert_eq!(counter(&inspect, "side-effects").await, 13);
    let seen: HashSet<String> = inspect.smembers("seen").await.unwrap();
    let expected: HashSet<String> = (0..20)
        .filter(|n| n % 3 != 0)
        .map(|n| n.to_string())
        .collect();
    assert_eq!(seen, expected);
    assert_eq!(pending(&inspect, "orders", "g").await, 0);
    sidecar.stop().await;
}

#[tokio::test]
async fn one_xack_per_read() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    publish(&mut client, "orders", numbered(30)).await;
    let inspect = redis.client().await;
    let _: () = inspect
        .custom(fred::cmd!("CONFIG"), vec!["RESETSTAT"])
        .await
        .unwrap();

    let (mut sub, _) = Subscription::open(&mut client, stream_open("orders", "g", "c1", 10))
        .await
        .unwrap();
    let mut reads = 0;
    let mut settled = 0;
    while settled < 30 {
        // The sidecar reads ahead (in-flight is twice COUNT), so reads and flush reports
        // interleave; answer every read and count what the reports settle.
        match sub.next().await.unwrap() {
            Some(Kind::Read(read)) => {
                reads += 1;
                let commands = read
                    .deliveries
                    .iter()
                    .map(|d| command(d.slot, "INCR", &["n"]))
                    .collect();
                let outcomes = read
                    .deliveries
                    .iter()
                    .map(|d| outcome(d.slot, Ack))
                    .collect();
                sub.send(commands, outcomes).await;
            }
            Some(Kind::Flush(report)) => {
                assert!(report.ok);
                settled += report.settles;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(reads, 3);
    assert_eq!(
        command_calls(&inspect, "xack").await,
        3,
        "exactly one XACK per read"
    );
    assert_eq!(command_calls(&inspect, "incr").await, 30);
    assert_eq!(counter(&inspect, "n").await, 30);
    assert_eq!(pending(&inspect, "orders", "g").await, 0);
    sidecar.stop().await;
}

#[tokio::test]
async fn under_a_backlog_the_next_read_rides_on_the_flush() {
    let reports = under_a_backlog(false, false).await;
    assert_eq!(reports.in_reads, 0, "reports come alone unless asked for");
}

#[tokio::test]
async fn with_reports_in_reads_a_flush_report_comes_in_the_read_that_rode_on_it() {
    let reports = under_a_backlog(true, false).await;
    // Every read that rode on a flush carries that flush's report: one message per read.
    assert!(reports.in_reads >= 18, "{reports:?}");
    assert_eq!(reports.in_reads + reports.alone, 20, "{reports:?}");
}

/// A sidecar with `/metrics` and `n` entries on stream `orders`.
struct Measured {
    /// Kept running for as long as the test holds this.
    _redis: RedisServer,
    sidecar: Sidecar,
    client: WindowServiceClient<tonic::transport::Channel>,
    inspect: Client,
    metrics: String,
}

impl Measured {
    async fn start(n: usize) -> Self {
        let redis = RedisServer::start();
        let metrics = format!("127.0.0.1:{}", free_port());
        let sidecar = Sidecar::start(&redis.url(), &["--metrics-listen", &metrics]).await;
        let mut client = sidecar.client().await;
        publish(&mut client, "orders", numbered(n)).await;
        let inspect = redis.client().await;
        Self {
            _redis: redis,
            sidecar,
            client,
            inspect,
            metrics,
        }
    }
}

#[derive(Debug)]
struct Reports {
    in_reads: usize,
    alone: usize,
}

/// Under a backlog an ordered subscription's reads go on its read lane, one connection that
/// runs them in the order asked (so that they are admitted in the order Redis ran them): each
/// a round trip of its own, none riding on a flush, so every report comes alone.
#[tokio::test]
async fn under_a_backlog_an_ordered_subscription_reads_on_its_lane() {
    let reports = under_a_backlog(true, true).await;
    assert_eq!(reports.in_reads, 0, "a report in a read: {reports:?}");
}

/// 200 entries, COUNT 10, a client that answers a read only once the next one is there;
/// checks that every read but the first few rode on a flush (or, ordered, went on the read
/// lane) and nothing was lost or doubled. `ordered`: by a header the entries do not carry
/// (the subscription's reads are ordered).
async fn under_a_backlog(reports_in_reads: bool, ordered: bool) -> Reports {
    let mut m = Measured::start(200).await;

    // COUNT 10, in flight 20 (two reads). The client answers a read only once the next one is
    // there, as a client slower than Redis does: each flush then frees the room for the next
    // read, which goes in the flush's pipeline rather than on a round trip of its own.
    let ordering_key = ordered.then(|| proto::OrderingKey {
        source: Some(proto::ordering_key::Source::Header("k".into())),
    });
    let open = proto::Open {
        reports_in_reads,
        ordering_key,
        ..stream_open("orders", "g", "c1", 10)
    };
    let (mut sub, _) = Subscription::open(&mut m.client, open).await.unwrap();
    let mut held = std::collections::VecDeque::new();
    let (mut delivered, mut settled, mut reads) = (0, 0, 0);
    let mut reported = Vec::new();
    let mut reports = Reports {
        in_reads: 0,
        alone: 0,
    };
    while settled < 200 {
        let report = match sub.next().await.unwrap() {
            Some(Kind::Read(mut read)) => {
                reads += 1;
                delivered += read.deliveries.len();
                let report = read.flushed.take();
                reports.in_reads += usize::from(report.is_some());
                held.push_back(read);
                while held.len() >= 2 || (delivered == 200 && !held.is_empty()) {
                    let read = held.pop_front().unwrap();
                    let slots = read.deliveries.iter().map(|d| d.slot);
                    let commands = slots.clone().map(|s| command(s, "INCR", &["n"])).collect();
                    sub.send(commands, slots.map(|s| outcome(s, Ack)).collect())
                        .await;
                }
                report
            }
            Some(Kind::Flush(report)) => {
                reports.alone += 1;
                Some(report)
            }
            other => panic!("unexpected {other:?}"),
        };
        if let Some(report) = report {
            assert!(report.ok, "{report:?}");
            settled += report.settles;
            reported.push(report.read_id);
        }
    }
    assert_eq!(reads, 20);
    assert_eq!(
        reported,
        (1..=20).collect::<Vec<u64>>(),
        "each read reported once, in order"
    );
    assert_eq!(
        counter(&m.inspect, "n").await,
        200,
        "every side effect once"
    );
    assert_eq!(pending(&m.inspect, "orders", "g").await, 0);
    assert_eq!(command_calls(&m.inspect, "xack").await, 20);

    let text = scrape(&m.metrics).await;
    let s = |series: &str| sample(&text, series);
    let read_aheads = s("window_sidecar_read_aheads_total{form=\"stream\"}");
    let own_reads = s("window_sidecar_redis_round_trips_total{form=\"stream\",kind=\"read\"}");
    let flushes = s("window_sidecar_redis_round_trips_total{form=\"stream\",kind=\"flush\"}");
    // The first two reads (and the pending-history read before them) go on the subscription's
    // own connection, and so does the BLOCK read once the backlog is gone; every other read
    // rode on a flush, or went on the read lane as a round trip of its own.
    assert!(read_aheads >= 18.0, "{read_aheads} read-aheads\n{text}");
    if ordered {
        assert!(
            own_reads >= read_aheads,
            "{own_reads} reads of their own\n{text}"
        );
    } else {
        assert!(own_reads <= 4.0, "{own_reads} reads of their own\n{text}");
    }
    // The last two reads are answered together: their flushes may share a round trip.
    assert!(
        (19.0..=20.0).contains(&flushes),
        "{flushes} flush round trips\n{text}"
    );
    assert_eq!(
        s("window_sidecar_flushes_total{form=\"stream\",mode=\"pipeline\",result=\"ok\"}"),
        20.0
    );
    assert_eq!(s("window_sidecar_reads_total{form=\"stream\"}"), 20.0);
    let round_trips_per_read = (own_reads + flushes) / 20.0;
    let most = if ordered { 2.2 } else { 1.2 };
    assert!(round_trips_per_read <= most, "{round_trips_per_read}");
    sub.close();
    m.sidecar.stop().await;
    reports
}

#[tokio::test]
async fn flushes_that_queue_behind_a_slow_one_go_together_in_the_next_round_trip() {
    let mut m = Measured::start(20).await;

    let open = proto::Open {
        max_in_flight: 20,
        ..stream_open("orders", "g", "c1", 5)
    };
    let (mut sub, _) = Subscription::open(&mut m.client, open).await.unwrap();
    let mut reads = Vec::new();
    while reads.len() < 4 {
        reads.push(sub.read().await);
    }
    // Redis holds every write for a while: the first flush waits in Redis, the next three
    // queue behind it in the sidecar.
    let _: Value = m
        .inspect
        .custom(fred::cmd!("CLIENT"), vec!["PAUSE", "700", "WRITE"])
        .await
        .unwrap();
    for (i, read) in reads.iter().enumerate() {
        // Side effects in entry order; acks in the packed field.
        let commands = read
            .deliveries
            .iter()
            .map(|d| command(d.slot, "RPUSH", &["log", &field(d, "n")]))
            .collect();
        let acks = read.deliveries.iter().map(|d| d.slot).collect();
        sub.send_kind(proto::subscribe_request::Kind::Batch(proto::Batch {
            commands,
            acks,
            ..Default::default()
        }))
        .await;
        if i == 0 {
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    }
    let mut reported = Vec::new();
    while reported.len() < 4 {
        let report = sub.flush().await;
        assert!(report.ok, "{report:?}");
        assert_eq!((report.commands, report.settles), (5, 5), "{report:?}");
        reported.push(report.read_id);
    }
    let read_ids: Vec<u64> = reads.iter().map(|r| r.read_id).collect();
    assert_eq!(reported, read_ids, "a report per read, in order");
    let log: Vec<String> = m.inspect.lrange("log", 0, -1).await.unwrap();
    let expected: Vec<String> = (0..20).map(|n| n.to_string()).collect();
    assert_eq!(log, expected, "side effects in the order of their reads");
    assert_eq!(pending(&m.inspect, "orders", "g").await, 0);
    assert_eq!(
        command_calls(&m.inspect, "xack").await,
        4,
        "one XACK per read"
    );

    let text = scrape(&m.metrics).await;
    let s = |series: &str| sample(&text, series);
    assert_eq!(
        s("window_sidecar_flushes_total{form=\"stream\",mode=\"pipeline\",result=\"ok\"}"),
        4.0
    );
    assert_eq!(
        s("window_sidecar_redis_round_trips_total{form=\"stream\",kind=\"flush\"}"),
        2.0,
        "the three queued flushes shared one round trip\n{text}"
    );
    sub.close();
    m.sidecar.stop().await;
}

#[tokio::test]
async fn a_failed_flush_is_reported_once_and_the_stream_goes_on() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    let inspect = redis.client().await;
    let _: () = inspect
        .set("a-string", "x", None, None, false)
        .await
        .unwrap();
    publish(&mut client, "orders", numbered(1)).await;

    let (mut sub, _) = Subscription::open(&mut client, stream_open("orders", "g", "c1", 1))
        .await
        .unwrap();
    let d = sub.read().await.deliveries.remove(0);
    sub.send(
        vec![
            command(d.slot, "LPUSH", &["a-string", "v"]),
            command(d.slot, "INCR", &["after"]),
        ],
        vec![outcome(d.slot, Ack)],
    )
    .await;
    let report = sub.flush().await;
    assert!(!report.ok);
    assert_eq!(report.failed, 1);
    assert!(report.error.contains("WRONGTYPE"), "{}", report.error);
    assert!(!report.settle_failed, "the XACK itself succeeded");
    // The report names the failed command, its entry and Redis's error, settled all the same.
    let failure = &report.side_effect_failures[..];
    assert_eq!(failure.len(), 1, "{report:?}");
    assert_eq!(
        (failure[0].slot, failure[0].command.as_str()),
        (d.slot, "LPUSH")
    );
    assert_eq!(failure[0].entry_id, d.entry_id);
    assert!(failure[0].error.starts_with("WRONGTYPE") && failure[0].settled);
    // Redis has no rollback: the other command ran, and the entry is settled.
    assert_eq!(counter(&inspect, "after").await, 1);
    assert_eq!(pending(&inspect, "orders", "g").await, 0);

    // The stream continues: the next entry is delivered and settles normally, and the failed
    // flush was not reported a second time.
    publish(&mut client, "orders", numbered(1)).await;
    let d = sub.read().await.deliveries.remove(0);
    sub.send(
        vec![command(d.slot, "INCR", &["after"])],
        vec![outcome(d.slot, Ack)],
    )
    .await;
    assert!(sub.flush().await.ok);
    assert_eq!(counter(&inspect, "after").await, 2);
    sidecar.stop().await;
}

#[tokio::test]
async fn a_client_that_leaves_mid_window_gets_its_entries_back_on_the_next_open() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    publish(&mut client, "orders", numbered(5)).await;

    let (mut sub, _) = Subscription::open(&mut client, stream_open("orders", "g", "c1", 5))
        .await
        .unwrap();
    let read = sub.read().await;
    let ds = &read.deliveries;
    // Two settled, three left without an outcome; one of those queued a command.
    sub.send(
        vec![
            command(ds[0].slot, "INCR", &["done"]),
            command(ds[2].slot, "INCR", &["never"]),
        ],
        vec![outcome(ds[0].slot, Ack), outcome(ds[1].slot, Drop)],
    )
    .await;
    // The client half-closes: what it settled is flushed and reported, the rest stays pending.
    sub.close();
    let report = sub.flush().await;
    assert!(report.ok);
    assert_eq!(
        (
            report.settles,
            report.segments_kept,
            report.segments_dropped
        ),
        (2, 1, 4)
    );
    assert!(
        matches!(sub.next().await, Ok(None)),
        "the stream ends cleanly"
    );

    let inspect = redis.client().await;
    assert_eq!(pending(&inspect, "orders", "g").await, 3);
    assert_eq!(counter(&inspect, "done").await, 1);
    assert_eq!(
        counter(&inspect, "never").await,
        0,
        "an abandoned segment is discarded"
    );

    // The same consumer opens again: its own pending entries come first.
    let (mut sub, _) = Subscription::open(&mut client, stream_open("orders", "g", "c1", 5))
        .await
        .unwrap();
    let read = sub.read().await;
    let ids: Vec<_> = read.deliveries.iter().map(|d| d.entry_id.clone()).collect();
    let expected: Vec<_> = ds[2..].iter().map(|d| d.entry_id.clone()).collect();
    assert_eq!(ids, expected);
    assert!(read.deliveries.iter().all(|d| d.delivery_count == 2));
    let outcomes = read
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
async fn entries_abandoned_by_a_dead_consumer_are_reclaimed_after_min_idle() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &["--reclaim-interval", "100ms"]).await;
    let mut client = sidecar.client().await;
    publish(&mut client, "orders", numbered(3)).await;

    let (mut gone, _) = Subscription::open(&mut client, stream_open("orders", "g", "dead", 3))
        .await
        .unwrap();
    assert_eq!(gone.read().await.deliveries.len(), 3);
    gone.close();
    drop(gone);

    let mut open = stream_open("orders", "g", "alive", 3);
    let Some(window_sidecar::proto::open::Source::Stream(source)) = open.source.as_mut() else {
        unreachable!()
    };
    source.min_idle = Some(prost_types::Duration {
        seconds: 0,
        nanos: 300_000_000,
    });
    let (mut sub, opened) = Subscription::open(&mut client, open).await.unwrap();
    assert_eq!(opened.min_idle.unwrap().nanos, 300_000_000);
    let read = sub.read().await;
    assert_eq!(
        read.deliveries.len(),
        3,
        "the dead consumer's entries are claimed"
    );
    assert!(read.deliveries.iter().all(|d| d.delivery_count == 2));
    let outcomes = read
        .deliveries
        .iter()
        .map(|d| outcome(d.slot, Ack))
        .collect();
    sub.send(vec![], outcomes).await;
    assert!(sub.flush().await.ok);
    let inspect = redis.client().await;
    assert_eq!(pending(&inspect, "orders", "g").await, 0);
    sidecar.stop().await;
}

#[tokio::test]
async fn retry_delivers_the_entry_again() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    publish(
        &mut client,
        "orders",
        vec![vec![("order", "42".to_string())]],
    )
    .await;

    let (mut sub, _) = Subscription::open(&mut client, stream_open("orders", "g", "c1", 1))
        .await
        .unwrap();
    let first = sub.read().await.deliveries.remove(0);
    sub.send(
        vec![command(first.slot, "INCR", &["never"])],
        vec![outcome(first.slot, Retry)],
    )
    .await;
    let report = sub.flush().await;
    assert!(report.ok);
    assert_eq!(report.segments_kept, 0);
    let again = sub.read().await.deliveries.remove(0);
    // The same entry, kept pending in its group: nothing appended to the stream, which every
    // other group of it reads.
    assert_eq!(again.entry_id, first.entry_id);
    assert_eq!(again.fields, first.fields);
    assert_eq!(again.delivery_count, 2);
    assert!(again.slot > first.slot, "slots are never reused");
    let inspect = redis.client().await;
    let length: u64 = inspect.xlen("orders").await.unwrap();
    assert_eq!(length, 1, "no copy appended");
    sub.send(vec![], vec![outcome(again.slot, Ack)]).await;
    assert!(sub.flush().await.ok);
    assert_eq!(counter(&inspect, "never").await, 0);
    assert_eq!(pending(&inspect, "orders", "g").await, 0);
    sidecar.stop().await;
}

#[tokio::test]
async fn retry_after_comes_back_after_the_delay_even_across_a_sidecar_restart() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    publish(
        &mut client,
        "orders",
        vec![vec![("order", "7".to_string())]],
    )
    .await;

    let (mut sub, _) = Subscription::open(&mut client, stream_open("orders", "g", "c1", 1))
        .await
        .unwrap();
    let first = sub.read().await.deliveries.remove(0);
    let settled_at = std::time::Instant::now();
    sub.send(
        vec![],
        vec![retry_after(first.slot, Duration::from_millis(1500))],
    )
    .await;
    assert!(sub.flush().await.ok);
    let inspect = redis.client().await;
    // The entry stays pending in its group, its due time in the group's delay set: nothing
    // is appended to the stream, which every other group of it reads.
    let due: Vec<(String, f64)> = inspect
        .zrange("{orders}:window:delayed:g", 0, -1, None, false, None, true)
        .await
        .unwrap();
    assert_eq!(due.len(), 1, "the due time is kept in Redis: {due:?}");
    assert_eq!(due[0].0, first.entry_id);
    assert_eq!(pending(&inspect, "orders", "g").await, 1);
    let length: u64 = inspect.xlen("orders").await.unwrap();
    assert_eq!(length, 1, "no copy appended");
    drop(sub);
    sidecar.stop().await;

    // A new sidecar process: the schedule lives in Redis, not in the old process's memory.
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    let (mut sub, _) = Subscription::open(&mut client, stream_open("orders", "g", "c1", 1))
        .await
        .unwrap();
    let again = sub.read().await.deliveries.remove(0);
    let waited = settled_at.elapsed();
    assert!(
        waited >= Duration::from_millis(1500),
        "came back after {waited:?}"
    );
    assert_eq!(again.entry_id, first.entry_id);
    assert_eq!(field(&again, "order"), "7");
    assert_eq!(again.delivery_count, 2);
    sub.send(vec![], vec![outcome(again.slot, Ack)]).await;
    assert!(sub.flush().await.ok);
    assert_eq!(pending(&inspect, "orders", "g").await, 0);
    let length: u64 = inspect.xlen("orders").await.unwrap();
    assert_eq!(length, 1);
    sidecar.stop().await;
}

/// How many deliveries Redis counts for entry `id` of group `group` (its pending entry).
async fn redis_count(client: &Client, key: &str, group: &str, id: &str) -> i64 {
    let reply: Value = client
        .custom(fred::cmd!("XPENDING"), vec![key, group, id, id, "1"])
        .await
        .unwrap();
    let row = reply.into_array().into_iter().next().expect("pending");
    row.into_array()[3].as_i64().unwrap()
}

/// A `retry_after` counts nothing while it waits: Redis counts the entry's one delivery until
/// it falls due, then one round trip (`kind="count"`) counts the next, the delay set forgets
/// it, and it goes out counted twice. A sidecar that stopped meanwhile would have left
/// nothing counted that nobody saw.
#[tokio::test]
async fn a_retry_after_counts_its_next_delivery_when_it_falls_due() {
    let redis = RedisServer::start();
    let metrics = format!("127.0.0.1:{}", free_port());
    let sidecar = Sidecar::start(&redis.url(), &["--metrics-listen", &metrics]).await;
    let mut client = sidecar.client().await;
    publish(
        &mut client,
        "orders",
        vec![vec![("order", "8".to_string())]],
    )
    .await;
    let (mut sub, _) = Subscription::open(&mut client, stream_open("orders", "g", "c1", 1))
        .await
        .unwrap();
    let first = sub.read().await.deliveries.remove(0);
    let delay = Duration::from_millis(1500);
    sub.send(vec![], vec![retry_after(first.slot, delay)]).await;
    assert!(sub.flush().await.ok);
    let inspect = redis.client().await;
    let id = first.entry_id.as_str();
    assert_eq!(
        redis_count(&inspect, "orders", "g", id).await,
        1,
        "nothing counted ahead while it waits"
    );
    let counts = "window_sidecar_redis_round_trips_total{form=\"stream\",kind=\"count\"}";
    assert_eq!(sample(&scrape(&metrics).await, counts), 0.0);

    let again = sub.read().await.deliveries.remove(0);
    assert_eq!(again.entry_id, first.entry_id);
    assert_eq!(again.delivery_count, 2);
    assert_eq!(redis_count(&inspect, "orders", "g", id).await, 2);
    assert_eq!(sample(&scrape(&metrics).await, counts), 1.0);
    let due: u64 = inspect.zcard("{orders}:window:delayed:g").await.unwrap();
    assert_eq!(due, 0, "its due time is spent");
    sub.send(vec![], vec![outcome(again.slot, Ack)]).await;
    assert!(sub.flush().await.ok);
    assert_eq!(pending(&inspect, "orders", "g").await, 0);
    sidecar.stop().await;
}

#[tokio::test]
async fn shutdown_flushes_what_is_owed_and_ends_the_stream_with_unavailable() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    publish(&mut client, "orders", numbered(3)).await;
    let (mut sub, _) = Subscription::open(&mut client, stream_open("orders", "g", "c1", 3))
        .await
        .unwrap();
    let read = sub.read().await;
    let ds = &read.deliveries;
    sub.send(
        vec![command(ds[0].slot, "INCR", &["k"])],
        vec![outcome(ds[0].slot, Ack)],
    )
    .await;

    sidecar.begin_shutdown();
    // The client is told, so it can send what it holds.
    match sub.next().await.unwrap() {
        Some(Kind::Draining(draining)) => {
            assert_eq!(draining.grace.unwrap().seconds, 2);
            // 3, or 2 when the first ack arrived before the drain began.
            assert!((2..=3).contains(&draining.outstanding), "{draining:?}");
        }
        other => panic!("expected draining, got {other:?}"),
    }
    // Outcomes that arrive within the grace period still count.
    sub.send(
        vec![command(ds[1].slot, "INCR", &["k"])],
        vec![outcome(ds[1].slot, Ack)],
    )
    .await;
    // The third is never settled: after the grace period it is abandoned and stays pending.
    let report = sub.flush().await;
    assert!(report.ok);
    assert_eq!(report.segments_kept, 2);
    assert_eq!(report.settles, 2);
    let status = sub.status().await;
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert!(status.message().contains("shutting down"));
    sidecar.stop().await;

    let inspect = redis.client().await;
    assert_eq!(counter(&inspect, "k").await, 2);
    assert_eq!(pending(&inspect, "orders", "g").await, 1);
}

/// Fields are passed on as the bytes Redis holds, UTF-8 or not, whether a read comes on the
/// reader's own connection or rides on a flush (under a backlog).
#[tokio::test]
async fn fields_that_are_not_utf8_arrive_as_the_bytes_redis_holds() {
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    let binary = |tail: u8| Bytes::from(vec![0xff, 0x00, 0xc3, tail]);
    let entries: Vec<Vec<(Bytes, Bytes)>> = vec![
        vec![
            (binary(1), binary(2)),
            (Bytes::from_static(b"n"), binary(3)),
        ],
        vec![(Bytes::from_static(b"_payload"), binary(4))],
        vec![(binary(5), Bytes::new())],
    ];
    for fields in &entries {
        let _: String = inspect
            .xadd("bin", false, None, "*", fields.clone())
            .await
            .unwrap();
    }
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    let (mut sub, _) = Subscription::open(&mut client, stream_open("bin", "g", "c1", 1))
        .await
        .unwrap();
    let mut seen = Vec::new();
    while seen.len() < entries.len() {
        let read = sub.read().await;
        let d = &read.deliveries[0];
        seen.push(if d.payload.is_empty() {
            d.fields
                .iter()
                .map(|f| (f.name.clone(), f.value.clone()))
                .collect()
        } else {
            vec![(Bytes::from_static(b"_payload"), d.payload.clone())]
        });
        sub.send(Vec::new(), vec![outcome(d.slot, Ack)]).await;
    }
    // Compared as sets: an unordered subscription promises no order between its reads, and
    // with two out (the reader's and one riding on a flush) the later entry can come first.
    let (mut seen, mut entries) = (seen, entries);
    seen.sort();
    entries.sort();
    assert_eq!(seen, entries);
    sidecar.stop().await;
}
