//! A Redis Cluster resharding under the window: the subscription's slot moved to another
//! primary (the subscription goes on reading and flushing on the new owner, and Publish follows
//! the redirection), and a migration held for seconds mid-run, through which the subscription
//! keeps flowing (`-ASK`, `TRYAGAIN`) in both modes, exactly once in atomic mode.

use std::net::SocketAddr;
use std::time::Duration;

use fred::prelude::*;
use window_sidecar_harness::*;

/// `n` entries with a field `n` = from..from + n.
fn numbered_from(from: usize, n: usize) -> Vec<Vec<(&'static str, String)>> {
    (from..from + n)
        .map(|i| vec![("n", i.to_string())])
        .collect()
}

/// The slot of the subscription's key moves to another primary (a completed resharding: the
/// old owner answers MOVED): the subscription goes on reading and flushing on the new owner,
/// and Publish follows the redirection too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_resharding_moves_the_subscription_with_its_slot() {
    let cluster = RedisCluster::start(3, 0);
    let sidecar = Sidecar::start(&cluster.url(), &[]).await;
    let mut client = sidecar.client().await;
    let inspect = cluster.client().await;
    let slot = slot_of("{orders}");
    let from = cluster.primary_for_slot(slot);
    let to = *cluster.primaries().iter().find(|&&p| p != from).unwrap();
    let add = |from: usize, n: usize| {
        let inspect = inspect.clone();
        async move {
            for fields in numbered_from(from, n) {
                let _: String = inspect
                    .xadd("{orders}", false, None, "*", fields)
                    .await
                    .unwrap();
            }
        }
    };

    let worker = FailoverWorker::spawn(
        client.clone(),
        atomic(stream_open("{orders}", "g", "c1", 5)),
        "{orders}:count",
        "{orders}:seen",
        Duration::ZERO,
    );
    add(0, 10).await;
    let first = eventually(STEP, || async {
        inspect.scard::<i64, _>("{orders}:seen").await.unwrap() == 10
    })
    .await;
    assert!(first, "the first 10 entries settled");

    // The subscription is idle (its reader blocks in XREADGROUP on the old owner) when the slot
    // moves with the stream, its group and the side-effect keys.
    tokio::task::block_in_place(|| cluster.migrate_slot(slot, to));
    assert_eq!(cluster.primary_for_slot(slot), to);
    add(10, 20).await;
    let log = settle_all(
        &inspect,
        worker,
        ("{orders}", "g", "{orders}:seen"),
        30,
        Duration::from_secs(20),
    )
    .await;
    eprintln!("after the resharding: {}", log.summary());
    assert_eq!(log.opens, 1, "the same subscription went on: {log:#?}");
    let count = counter(&inspect, "{orders}:count").await;
    // No failover here: exactly once.
    assert_exactly_once(count, 30, &log, String::new);
    assert_eq!(pending(&inspect, "{orders}", "g").await, 0);
    let on_new_owner = |key: &str, command: &str| resp::call(to, &[command, key]).unwrap();
    assert_eq!(on_new_owner("{orders}", "XLEN").as_int(), Some(30));
    assert_eq!(on_new_owner("{orders}:count", "GET").text(), "30");

    // Publish to a slot that just moved: MOVED is "followed by the client library" (docs/how-to/cluster-and-sentinel.md).
    let produce_slot = slot_of("{produce}");
    let produce_from = cluster.primary_for_slot(produce_slot);
    let produce_to = *cluster
        .primaries()
        .iter()
        .find(|&&p| p != produce_from)
        .unwrap();
    try_publish(&mut client, "{produce}", 0).await.unwrap();
    tokio::task::block_in_place(|| cluster.migrate_slot(produce_slot, produce_to));
    let mut published = Vec::new();
    for n in 1..=4 {
        let result = try_publish(&mut client, "{produce}", n).await;
        published.push(
            result
                .map(|_| ())
                .map_err(|s| format!("{:?}: {}", s.code(), s.message())),
        );
    }
    let xlen = resp::call(produce_to, &["XLEN", "{produce}"]).unwrap();
    let _ = inspect.quit().await;
    sidecar.stop().await;
    let flushes: Vec<String> = log
        .failed_flushes
        .iter()
        .map(|(_, _, r)| format!("read {}: {}", r.read_id, r.error))
        .collect();
    assert!(
        published.iter().all(Result::is_ok),
        "Publish to a stream whose slot moved fails instead of following MOVED (the pool has \
         one attempt per command, and the failure is reported as FAILED_PRECONDITION, which \
         says retrying will not help): {published:#?}; XLEN on the new owner: {xlen:?}. The \
         subscription's flushes after its own slot moved failed the same way (reported, their \
         entries came back): {flushes:?}"
    );
}

/// Whether the sidecar's health says SERVING now.
async fn serving(addr: SocketAddr) -> bool {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    let Ok(channel) = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
    else {
        return false;
    };
    let request = HealthCheckRequest {
        service: "window_sidecar.v1.WindowService".into(),
    };
    match HealthClient::new(channel).check(request).await {
        Ok(response) => response.into_inner().status == 1,
        Err(_) => false,
    }
}

/// `entries` entries to `{orders}` and to `other`, one to each every 15 ms.
fn produce_to_both(inspect: Client, other: String, entries: usize) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        for n in 0..entries {
            for key in ["{orders}", other.as_str()] {
                let fields = vec![("n", n.to_string())];
                let _: String = inspect.xadd(key, false, None, "*", fields).await.unwrap();
            }
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
    })
}

/// The members of a side-effect set (0 when it cannot be read).
async fn seen(inspect: &Client, key: &str) -> i64 {
    inspect.scard::<i64, _>(key).await.unwrap_or(0)
}

/// What a migration held for seconds let through: keys moved, the sidecar's health at each
/// step, and the entries seen on the migrating stream and on the other, at its start and end.
struct Migrated {
    moved: usize,
    health: Vec<bool>,
    orders: (i64, i64),
    other: (i64, i64),
}

/// Migrates `slot` to `to` a key or two at a time over 4 s while the run goes on: the stream,
/// its side-effect keys and the sidecar's own keys are split between the nodes for a second
/// each time; then the slot is assigned to `to`.
async fn migrate_while_flowing(
    cluster: &RedisCluster,
    slot: u16,
    to: u16,
    sidecar: SocketAddr,
    inspect: &Client,
    other_seen: &str,
) -> Migrated {
    let migration = tokio::task::block_in_place(|| cluster.begin_slot_migration(slot, to));
    let before = (
        seen(inspect, "{orders}:seen").await,
        seen(inspect, other_seen).await,
    );
    let mut moved = 0;
    let mut health = Vec::new();
    for _ in 0..4 {
        moved += tokio::task::block_in_place(|| cluster.move_slot_keys(&migration, 2));
        tokio::time::sleep(Duration::from_secs(1)).await;
        health.push(serving(sidecar).await);
    }
    let during = (
        seen(inspect, "{orders}:seen").await,
        seen(inspect, other_seen).await,
    );
    tokio::task::block_in_place(|| cluster.finish_slot_migration(migration));
    Migrated {
        moved,
        health,
        orders: (before.0, during.0),
        other: (before.1, during.1),
    }
}

/// A slot migration held for seconds in the middle of a run (`MIGRATING`/`IMPORTING`, the
/// slot's keys moved a few at a time while entries keep coming, then the slot assigned): the
/// subscription on the migrating slot keeps flowing through `-ASK` and `TRYAGAIN` without
/// ending, another subscription on another node never stops, health stays SERVING, and every
/// entry ends settled with its side effects: in atomic mode with `--wait-replicas`, each
/// exactly once. Returns the side effects on the migrating stream.
async fn flowing_through_a_migration(atomic_mode: bool) -> i64 {
    const ENTRIES: usize = 200;
    let cluster = RedisCluster::start(3, 1);
    let flags: &[&str] = if atomic_mode {
        &["--wait-replicas", "1"]
    } else {
        &[]
    };
    let sidecar = Sidecar::start(&cluster.url(), flags).await;
    let client = sidecar.client().await;
    let inspect = cluster.client().await;
    let slot = slot_of("{orders}");
    let from = cluster.primary_for_slot(slot);
    let to = *cluster.primaries().iter().find(|&&p| p != from).unwrap();
    // A stream on the third primary, which the migration does not touch.
    let other = (0..)
        .map(|i| format!("{{other{i}}}"))
        .find(|k| ![from, to].contains(&cluster.primary_for_slot(slot_of(k))))
        .unwrap();
    let open = |key: &str| {
        let open = stream_open(key, "g", "c1", 10);
        if atomic_mode { atomic(open) } else { open }
    };
    let worker = FailoverWorker::spawn(
        client.clone(),
        open("{orders}"),
        "{orders}:count",
        "{orders}:seen",
        Duration::from_millis(2),
    );
    let (other_count, other_seen) = (format!("{other}:count"), format!("{other}:seen"));
    let other_worker = FailoverWorker::spawn(
        client.clone(),
        open(&other),
        &other_count,
        &other_seen,
        Duration::from_millis(2),
    );
    let producer = produce_to_both(inspect.clone(), other.clone(), ENTRIES);
    let started = eventually(STEP, || async {
        seen(&inspect, "{orders}:seen").await >= 20
    })
    .await;
    assert!(started, "the run started");

    let Migrated {
        moved,
        health,
        orders: (orders_before, orders_during),
        other: (other_before, other_during),
    } = migrate_while_flowing(&cluster, slot, to, sidecar.addr, &inspect, &other_seen).await;
    assert_eq!(cluster.primary_for_slot(slot), to);
    producer.await.unwrap();
    eprintln!(
        "migration ({} mode): {moved} keys moved over 4 s; settled during it: {} on the \
         migrating slot, {} on the other node; health {health:?}",
        if atomic_mode { "atomic" } else { "pipeline" },
        orders_during - orders_before,
        other_during - other_before,
    );

    let entries = ENTRIES as i64;
    let log = settle_all(
        &inspect,
        worker,
        ("{orders}", "g", "{orders}:seen"),
        entries,
        Duration::from_secs(30),
    )
    .await;
    let other_log = settle_all(
        &inspect,
        other_worker,
        (&other, "g", &other_seen),
        entries,
        Duration::from_secs(30),
    )
    .await;
    eprintln!("migrating slot: {}", log.summary());
    assert!(moved > 0, "the migration moved keys while the run went on");
    assert!(
        other_during > other_before,
        "the subscription on another node stopped during the migration"
    );
    assert!(
        orders_during > orders_before,
        "the subscription on the migrating slot stopped during the migration: {}",
        log.summary()
    );
    assert!(
        health.iter().all(|&s| s),
        "health during the migration: {health:?}"
    );
    assert_eq!(log.opens, 1, "the subscription never ended: {log:#?}");
    assert_eq!(other_log.opens, 1);
    assert!(log.rejections.is_empty(), "{log:#?}");
    let count = counter(&inspect, "{orders}:count").await;
    assert!(count >= entries, "side effects lost: {count} for {entries}");
    if atomic_mode {
        assert_exactly_once(count, entries, &log, String::new);
    }
    let on_new_owner = resp::call(to, &["SCARD", "{orders}:seen"]).unwrap();
    assert_eq!(on_new_owner.as_int(), Some(entries));
    let _ = inspect.quit().await;
    sidecar.stop().await;
    count
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_keeps_flowing_while_its_slot_migrates_in_pipeline_mode() {
    let count = flowing_through_a_migration(false).await;
    eprintln!("pipeline mode: {count} side effects for 200 entries");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_keeps_flowing_while_its_slot_migrates_in_atomic_mode_exactly_once() {
    flowing_through_a_migration(true).await;
}
