//! A Redis Cluster failing over under the window: the primary of the subscription's slot killed
//! mid-run in atomic mode, each entry then run exactly once; a read whose claims its replica
//! never saw, never delivered with `--wait-replicas` and possibly run twice without it; an
//! entry just delivered again from pending, still its consumer's on the new primary.
//!
//! The failover mid-run watches the replica that takes over with `MONITOR`, so that when an
//! entry's side effects apply twice the failure message shows which transaction ran where and
//! when.

use std::time::{Duration, Instant};

use fred::prelude::*;
use window_sidecar::proto;
use window_sidecar::proto::subscribe_response::Kind;
use window_sidecar_harness::*;

/// The primary of the subscription's slot is killed while 200 entries are being consumed in
/// atomic mode (the client has a read in hand, and acks it right after the kill): every entry
/// ends settled, with its side effects applied exactly once, and the flush reports tell the
/// truth (see [`assert_exactly_once`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_failover_mid_run_runs_each_entry_exactly_once_in_atomic_mode() {
    const ENTRIES: i64 = 200;
    let mut cluster = RedisCluster::start(3, 1);
    let slot = slot_of("{orders}");
    let old = cluster.primary_for_slot(slot);
    let replica = cluster.replicas_of(old)[0];
    let sidecar = Sidecar::start(
        &cluster.url(),
        &["--redis-timeout", "2s", "--wait-replicas", "1"],
    )
    .await;
    let mut client = sidecar.client().await;
    let inspect = cluster.client().await;
    let ids = publish(&mut client, "{orders}", numbered(ENTRIES as usize)).await;
    // The replica has every entry before the run starts: WAIT after a write on the connection
    // to the same node (replication is ordered, so the earlier XADDs are there too).
    let _: () = inspect
        .set("{orders}:marker", "1", None, None, false)
        .await
        .unwrap();
    let replicated: i64 = inspect
        .with_cluster_node(Server::new("127.0.0.1", old))
        .custom(fred::cmd!("WAIT"), vec![1, 2000])
        .await
        .unwrap();
    assert_eq!(replicated, 1);

    let monitor = Monitor::start(replica);
    let worker = FailoverWorker::spawn(
        client.clone(),
        atomic(stream_open("{orders}", "g", "c1", 10)),
        "{orders}:count",
        "{orders}:seen",
        Duration::from_millis(15),
    );
    // The primary dies while the client has a read in hand: it acks it right after the kill.
    worker.hold_after(60).await;
    let (at, killed_at, killed) = (worker.acked(), unix_now(), Instant::now());
    cluster.kill(old);
    worker.release();
    let new = tokio::task::block_in_place(|| {
        cluster.wait_for_failover(slot, old, Duration::from_secs(20))
    });
    assert_eq!(new, replica);
    eprintln!(
        "killed {old} after {at} acks; {new} took over in {:?}",
        killed.elapsed()
    );

    let log = settle_all(
        &inspect,
        worker,
        ("{orders}", "g", "{orders}:seen"),
        ENTRIES,
        Duration::from_secs(30),
    )
    .await;
    eprintln!("{}", log.summary());
    // Nothing lost.
    assert_eq!(
        inspect.scard::<i64, _>("{orders}:seen").await.unwrap(),
        ENTRIES
    );
    assert_eq!(pending(&inspect, "{orders}", "g").await, 0);
    assert_eq!(inspect.xlen::<i64, _>("{orders}").await.unwrap(), ENTRIES);
    assert!(log.rejections.is_empty(), "{log:#?}");
    let count = counter(&inspect, "{orders}:count").await;
    assert!(count >= ENTRIES, "side effects lost: {count}");
    assert_exactly_once(count, ENTRIES, &log, || {
        failover_evidence(&[&monitor], "{orders}", &ids, old, killed_at, &log)
    });
    let _ = inspect.quit().await;
    sidecar.stop().await;
}

/// A read the replica never saw: the replica's link to its primary is cut (it cannot
/// re-authenticate), the sidecar reads ten entries, then the primary dies and the replica takes
/// over without the claims of that read. Returns (side effects, entries): every entry must be
/// settled with its side effects whatever the flags.
async fn read_the_replica_never_saw(flags: &[&str]) -> (i64, i64) {
    const ENTRIES: i64 = 10;
    let mut cluster = RedisCluster::start(3, 1);
    let slot = slot_of("{orders}");
    let old = cluster.primary_for_slot(slot);
    let replica = cluster.replicas_of(old)[0];
    let sidecar = Sidecar::start(&cluster.url(), flags).await;
    let mut client = sidecar.client().await;
    let inspect = cluster.client().await;
    publish(&mut client, "{orders}", numbered(ENTRIES as usize)).await;
    let replicated: i64 = inspect
        .with_cluster_node(Server::new("127.0.0.1", old))
        .custom(fred::cmd!("WAIT"), vec![1, 2000])
        .await
        .unwrap();
    assert_eq!(replicated, 1, "the entries themselves are on the replica");

    // Cut replication: the primary has no password, so a replica that sends one is refused
    // and keeps retrying; then drop its current link.
    resp::call(
        replica,
        &["CONFIG", "SET", "masterauth", "not-the-password"],
    )
    .unwrap();
    resp::call(old, &["CLIENT", "KILL", "TYPE", "replica"]).unwrap();
    let (mut sub, _) = Subscription::open(
        &mut client,
        atomic(stream_open("{orders}", "g", "c1", ENTRIES as u32)),
    )
    .await
    .unwrap();
    // The read happens on the primary now; its claims cannot reach the replica.
    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.kill(old);
    let new = tokio::task::block_in_place(|| {
        cluster.wait_for_failover(slot, old, Duration::from_secs(20))
    });
    assert_eq!(new, replica);

    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let seen = inspect.scard::<i64, _>("{orders}:seen").await.unwrap_or(-1);
        if seen == ENTRIES && try_pending(&inspect, "{orders}", "g").await == Some(0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not settled: SCARD {seen}, XPENDING {:?}",
            try_pending(&inspect, "{orders}", "g").await
        );
        // Redis is looked at again after each message and each quiet half second: the test's
        // own client may fail a look while it finds the new primary, and once everything
        // is settled no message is left to wake it.
        let Some(message) = sub.message_within(Duration::from_millis(500)).await else {
            continue;
        };
        match message.unwrap().map(|m| m.kind) {
            Some(Some(Kind::Read(read))) => {
                ack_read(&sub, &read, |d: &proto::Delivery| {
                    vec![
                        command(d.slot, "INCR", &["{orders}:count"]),
                        command(d.slot, "SADD", &["{orders}:seen", &field(d, "n")]),
                    ]
                })
                .await
            }
            Some(Some(Kind::Flush(_))) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    let count = counter(&inspect, "{orders}:count").await;
    eprintln!(
        "read the replica never saw, flags {flags:?}: {ENTRIES} entries, {count} side effects"
    );
    let _ = inspect.quit().await;
    sidecar.stop().await;
    (count, ENTRIES)
}

/// With `--wait-replicas 1` the read is not delivered while the replica lacks its claims (WAIT
/// blocks, then fails with the primary): the new primary delivers the entries once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_wait_replicas_a_read_the_replica_never_saw_is_never_delivered() {
    let (count, entries) =
        read_the_replica_never_saw(&["--wait-replicas", "1", "--wait-timeout", "2s"]).await;
    assert_eq!(count, entries, "side effects ran more than once per entry");
}

/// Without it, the same read reaches the client; acked after the failover, its transactions
/// run on the new primary (whose XACK finds nothing pending) and the new primary hands the same
/// entries out again: nothing is lost, and each entry's side effects can run twice. This is the
/// documented limit that --wait-replicas removes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_wait_replicas_a_read_the_replica_never_saw_can_run_twice() {
    let (count, entries) = read_the_replica_never_saw(&["--redis-timeout", "2s"]).await;
    assert!(
        (entries..=2 * entries).contains(&count),
        "{count} side effects for {entries} entries"
    );
}

/// Redis keeps a re-read of a consumer's own pending entries (`XREADGROUP … 0`) in memory only,
/// away from its replicas: after a failover the new primary would show an entry just delivered
/// again as idle since its first read, for another consumer's reclaim to take while its
/// handler runs (in atomic mode, its side effects twice). The sidecar claims such entries
/// again to itself and, with `--wait-replicas`, delivers them once the replica has that claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_wait_replicas_an_entry_delivered_again_from_pending_stays_its_consumers_across_a_failover()
 {
    let mut cluster = RedisCluster::start(3, 1);
    let slot = slot_of("{orders}");
    let old = cluster.primary_for_slot(slot);
    let inspect = cluster.client().await;
    let on_primary = inspect.with_cluster_node(Server::new("127.0.0.1", old));
    let _: Value = inspect
        .custom(fred::cmd!("XADD"), vec!["{orders}", "*", "n", "1"])
        .await
        .unwrap();
    let _: Value = inspect
        .custom(fred::cmd!("XGROUP"), vec!["CREATE", "{orders}", "g", "0"])
        .await
        .unwrap();
    // Read by `c1` before, by a sidecar that died holding it; the replica has that read.
    let _: Value = inspect
        .custom(
            fred::cmd!("XREADGROUP"),
            vec!["GROUP", "g", "c1", "COUNT", "1", "STREAMS", "{orders}", ">"],
        )
        .await
        .unwrap();
    let replicated: i64 = on_primary
        .custom(fred::cmd!("WAIT"), vec![1, 2000])
        .await
        .unwrap();
    assert_eq!(replicated, 1);
    tokio::time::sleep(Duration::from_secs(4)).await;

    let sidecar = Sidecar::start(
        &cluster.url(),
        &["--wait-replicas", "1", "--redis-timeout", "2s"],
    )
    .await;
    let mut client = sidecar.client().await;
    // The default min_idle (60 s): c1 gets its entry back through the re-read of its own
    // pending entries, not through a claim of its own.
    let (mut sub, _) =
        Subscription::open(&mut client, atomic(stream_open("{orders}", "g", "c1", 10)))
            .await
            .unwrap();
    let read = loop {
        match sub.next().await.unwrap() {
            Some(Kind::Read(read)) => break read,
            Some(_) => {}
            None => panic!("the subscription ended"),
        }
    };
    assert_eq!(read.deliveries.len(), 1);
    assert_eq!(read.deliveries[0].delivery_count, 2, "{read:?}");
    let delivered = Instant::now();

    cluster.kill(old);
    tokio::task::block_in_place(|| cluster.wait_for_failover(slot, old, Duration::from_secs(20)));
    // Idle since it was delivered again, it is not claimed with a min_idle a second above
    // that; idle since its first read (4 s more), it would be.
    let min_idle = (delivered.elapsed() + Duration::from_secs(1))
        .as_millis()
        .to_string();
    let reply: Value = inspect
        .custom(
            fred::cmd!("XAUTOCLAIM"),
            vec!["{orders}", "g", "c2", &min_idle, "0-0", "JUSTID"],
        )
        .await
        .unwrap();
    let claimed = match reply {
        Value::Array(parts) => parts.into_iter().nth(1),
        other => panic!("XAUTOCLAIM replied {other:?}"),
    };
    assert!(
        matches!(&claimed, Some(Value::Array(ids)) if ids.is_empty()),
        "another consumer's reclaim took {claimed:?} with min_idle {min_idle} ms, delivered \
         again to c1 a second less ago, 4 s after its first read"
    );

    ack_read(&sub, &read, |d: &proto::Delivery| {
        vec![command(d.slot, "INCR", &["{orders}:count"])]
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while try_pending(&inspect, "{orders}", "g").await != Some(0) {
        assert!(Instant::now() < deadline, "the ack is not settled");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(counter(&inspect, "{orders}:count").await, 1);
    let _ = inspect.quit().await;
    sidecar.stop().await;
}
