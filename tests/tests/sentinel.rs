//! A Sentinel-managed primary and its failover, end to end: real `redis-server` and sentinel
//! processes, the in-process sidecar and the generated gRPC client. The replica that takes over
//! is watched with `MONITOR`, so that when an entry's side effects apply twice the failure
//! message shows which transaction ran where and when.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use fred::prelude::*;
use window_sidecar_harness::*;

/// A Sentinel failover mid-run: the subscription goes on with the new primary and every entry
/// ends settled with its side effects, none lost (and, in atomic mode, none applied twice; see
/// [`assert_exactly_once`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_mid_run_runs_each_entry_exactly_once_in_atomic_mode() {
    const ENTRIES: i64 = 100;
    let mut sentinels = Sentinels::start(3);
    let sidecar = Sidecar::start(
        &sentinels.url(),
        &["--redis-timeout", "2s", "--wait-replicas", "1"],
    )
    .await;
    let mut client = sidecar.client().await;
    let inspect = sentinels.primary_client().await;
    let ids = publish(&mut client, "orders", numbered(ENTRIES as usize)).await;
    let _: () = inspect.set("marker", "1", None, None, false).await.unwrap();
    let replicated: i64 = inspect
        .custom(fred::cmd!("WAIT"), vec![1, 2000])
        .await
        .unwrap();
    assert_eq!(replicated, 1);
    let old = sentinels.primary_port();
    let monitor = Monitor::start(sentinels.replica_ports()[0]);

    let worker = FailoverWorker::spawn(
        client.clone(),
        atomic(stream_open("orders", "g", "c1", 5)),
        "count",
        "seen",
        Duration::from_millis(15),
    );
    // The primary dies while the client has a read in hand: it acks it right after the kill.
    worker.hold_after(30).await;
    let (at, killed_at, killed) = (worker.acked(), unix_now(), Instant::now());
    assert_eq!(sentinels.kill_primary(), old);
    worker.release();
    let new = tokio::task::block_in_place(|| sentinels.wait_for_failover(Duration::from_secs(30)));
    // Sentinel disconnects the normal clients of the replica it promotes, MONITOR included:
    // watch the new primary again (what it ran in between is not seen).
    let monitor_after = Monitor::start(new);
    eprintln!(
        "killed {old} after {at} acks; {new} took over in {:?}",
        killed.elapsed()
    );

    let log = settle_all(
        &inspect,
        worker,
        ("orders", "g", "seen"),
        ENTRIES,
        Duration::from_secs(30),
    )
    .await;
    eprintln!("{}", log.summary());
    // Nothing lost: every entry was delivered and settled, and its side effects ran.
    let delivered: BTreeSet<u64> = log.delivered.keys().copied().collect();
    assert_eq!(delivered, (0..ENTRIES as u64).collect());
    assert_eq!(inspect.scard::<i64, _>("seen").await.unwrap(), ENTRIES);
    assert_eq!(pending(&inspect, "orders", "g").await, 0);
    let count = counter(&inspect, "count").await;
    assert!(count >= ENTRIES, "side effects lost: {count}");
    // The flushes after the failover ran on the new primary.
    let on_new = resp::call(new, &["GET", "count"]).unwrap();
    assert_eq!(on_new.text(), count.to_string());
    assert_exactly_once(count, ENTRIES, &log, || {
        failover_evidence(
            &[&monitor, &monitor_after],
            "orders",
            &ids,
            old,
            killed_at,
            &log,
        )
    });
    let _ = inspect.quit().await;
    sidecar.stop().await;
}
