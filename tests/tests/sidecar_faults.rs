//! The sidecar failing under load: SIGKILLed mid-window and restarted, or replaced by a second
//! replica that claims its pending entries after `min_idle`, settling every entry; SIGTERMed,
//! flushing every acked entry within its grace and leaving the rest pending; and a simple
//! list's crash, which loses no more than the in-flight limit allows. Each test ends by
//! counting entries and side effects in Redis (`window_sidecar_harness::faults`).

use std::collections::HashSet;
use std::time::Duration;

use fred::prelude::*;
use tokio_util::sync::CancellationToken;
use window_sidecar::proto;
use window_sidecar_harness::faults::{KEY, produce, state, work_until_settled};
use window_sidecar_harness::{
    Next, OpenExt, RedisServer, STEP, SidecarProcess, Worker, duration, listen_addr, pending,
    stream_open, value,
};

fn value_of_id(id: &str) -> String {
    let n: usize = id
        .strip_suffix("-0")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not an id of ours: {id}"));
    format!("e{}", n - 1)
}

/// The ids pending in the group (on any consumer, or on `consumer`).
async fn pending_ids(inspect: &Client, consumer: Option<&str>) -> Vec<String> {
    let mut args = vec![
        KEY.to_owned(),
        "g".into(),
        "-".into(),
        "+".into(),
        "100000".into(),
    ];
    args.extend(consumer.map(str::to_owned));
    let rows: Vec<Value> = inspect
        .custom(fred::cmd!("XPENDING"), args)
        .await
        .expect("XPENDING");
    rows.into_iter()
        .filter_map(|row| match row {
            Value::Array(row) => row.into_iter().next()?.as_string(),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_killed_mid_window_and_restarted_settles_every_entry() {
    const N: usize = 100;
    const COUNT: u32 = 10;
    const MAX_IN_FLIGHT: u32 = 20;
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    produce(&inspect, 0..N, 0).await;
    let listen = listen_addr();
    let flags = ["--reclaim-interval", "200ms"];
    let sidecar = SidecarProcess::serve(&redis.url(), &listen, &flags);
    let open = || stream_open(KEY, "g", "c1", COUNT).with_max_in_flight(MAX_IN_FLIGHT);
    let mut worker = Worker::open(&listen, open()).await;
    // One read settled, the next half settled: SIGKILL before its flush.
    worker.work(2, Some(2)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    sidecar.kill9();
    let in_flight = pending(&inspect, KEY, "g").await;

    let sidecar = SidecarProcess::serve(&redis.url(), &listen, &flags);
    let mut worker = Worker::open(&listen, open()).await;
    work_until_settled(&mut worker, &inspect, N, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (seen, count, left) = state(&inspect).await;
    // Deliveries of entries the killed sidecar had handed out (the group's counter says so).
    let redelivered = worker.delivered.values().filter(|(_, c)| *c > 1).count();
    println!(
        "stream after SIGKILL: {N} entries, pending at the kill {in_flight}, \
         {redelivered} delivered again (count {COUNT}, max_in_flight {MAX_IN_FLIGHT}), \
         {count} side effects ({} twice)",
        count - N
    );
    assert_eq!((seen, left), (N, 0));
    assert!(count >= N);
    assert!(
        redelivered as u64 <= in_flight,
        "only what was in flight comes again"
    );
    // What may be pending: the in-flight limit, plus one read's worth of settled deliveries
    // waiting for their flush (they do not count against the limit, so the next read overlaps
    // the flush: see `Engine::room` in server/core/src/engine/flow.rs).
    assert!(
        redelivered <= (MAX_IN_FLIGHT + COUNT) as usize,
        "duplicate deliveries are bounded by the in-flight limit and one read: {redelivered}"
    );
    drop(sidecar);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_replica_claims_a_killed_replicas_pending_entries_after_min_idle() {
    const N: usize = 60;
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    produce(&inspect, 0..N, 0).await;
    let (a, b) = (listen_addr(), listen_addr());
    let replica = |addr: &str, name: &str| {
        SidecarProcess::serve(
            &redis.url(),
            addr,
            &["--reclaim-interval", "200ms", "--consumer-name", name],
        )
    };
    let (replica_a, replica_b) = (replica(&a, "pod-a"), replica(&b, "pod-b"));
    // The consumer name comes from each replica's --consumer-name.
    let open = || {
        stream_open(KEY, "g", "", 10)
            .with_max_in_flight(20)
            .with_min_idle(Some(Duration::from_secs(1)))
    };
    let mut worker_a = Worker::open(&a, open()).await;
    worker_a.work(2, Some(2)).await;
    assert_eq!(worker_a.opened.as_ref().unwrap().consumer, "pod-a");
    tokio::time::sleep(Duration::from_millis(300)).await;
    replica_a.kill9();
    let stranded = pending_ids(&inspect, Some("pod-a")).await;
    assert!(
        stranded.len() >= 5,
        "the killed replica left entries pending: {stranded:?}"
    );

    let mut worker_b = Worker::open(&b, open()).await;
    work_until_settled(&mut worker_b, &inspect, N, Duration::from_secs(30)).await;
    assert_eq!(worker_b.opened.as_ref().unwrap().consumer, "pod-b");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (seen, count, left) = state(&inspect).await;
    let claimed: Vec<&String> = stranded
        .iter()
        .filter(|id| {
            worker_b
                .delivered
                .get(&value_of_id(id))
                .is_some_and(|(_, c)| *c >= 2)
        })
        .collect();
    println!(
        "second replica: {N} entries, {} stranded on pod-a, {} of them claimed by pod-b, \
         {count} side effects ({} twice)",
        stranded.len(),
        claimed.len(),
        count - N
    );
    assert_eq!((seen, left), (N, 0));
    assert_eq!(
        claimed.len(),
        stranded.len(),
        "every entry stranded on the killed replica is claimed and delivered again"
    );
    assert!(pending_ids(&inspect, Some("pod-a")).await.is_empty());
    drop(replica_b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_flushes_every_acked_entry_and_leaves_the_unacked_pending() {
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    produce(&inspect, 0..50, 0).await;
    let listen = listen_addr();
    let sidecar = SidecarProcess::serve(&redis.url(), &listen, &["--shutdown-grace", "3s"]);
    let mut worker = Worker::open(
        &listen,
        stream_open(KEY, "g", "c1", 10).with_max_in_flight(20),
    )
    .await;

    let stop = CancellationToken::new();
    let producer = {
        let client = redis.client().await;
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut next = 50;
            while !stop.is_cancelled() {
                produce(&client, next..next + 10, 0).await;
                next += 10;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            next
        })
    };
    let mut last_acked = 0;
    while worker.acked.len() < 200 {
        let read = worker.next_read().await;
        worker.ack(&read.deliveries).await;
        last_acked = read.read_id;
    }
    // A read handed out and not settled when SIGTERM comes.
    let mut held = worker.next_read().await.deliveries;
    // The acks sent last have reached the sidecar (their read is flushed), so what it counts as
    // outstanding is what the client holds.
    worker
        .report_for(last_acked, STEP)
        .await
        .expect("the last acked read is flushed");
    sidecar.signal("TERM");
    let draining = loop {
        match worker.next(STEP).await {
            // Handed out before the drain began.
            Next::Read(read) => held.extend(read.deliveries),
            Next::Draining(draining) => break draining,
            other => panic!("expected the draining notice, got {other:?}"),
        }
    };
    assert_eq!(draining.outstanding as usize, held.len());
    // The client settles half of what it holds within the grace; the rest stays unsettled.
    let (settled, unsettled) = held.split_at(held.len() / 2);
    worker.ack(settled).await;
    // No read comes after the notice; flush reports are recorded on the way.
    let status = match worker.next(STEP).await {
        Next::Ended(Some(status)) => status,
        other => panic!("expected the stream to end with a status, got {other:?}"),
    };
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    let closed = sidecar.wait_for("subscription closed");
    let exit = sidecar.wait();
    stop.cancel();
    let produced = producer.await.unwrap();

    let acked: HashSet<String> = worker.acked.iter().cloned().collect();
    let seen: HashSet<String> = inspect.smembers("seen").await.unwrap();
    let count: usize = inspect.get("count").await.unwrap();
    let pending: HashSet<String> = pending_ids(&inspect, None)
        .await
        .iter()
        .map(|id| value_of_id(id))
        .collect();
    let failed = worker.reports.iter().filter(|r| !r.ok).count();
    println!(
        "SIGTERM under load: {produced} produced, {} acked ({} within the grace), {} left \
         unsettled, {} pending after the exit, {count} side effects, {failed} failed flushes; \
         {closed}",
        acked.len(),
        settled.len(),
        unsettled.len(),
        pending.len()
    );
    assert!(exit.success(), "{exit:?}");
    assert_eq!(failed, 0);
    assert_eq!(seen, acked, "every acked entry's side effects were flushed");
    assert_eq!(count, acked.len(), "each once");
    assert!(
        pending.is_disjoint(&acked),
        "acked entries were XACKed: {:?}",
        pending.intersection(&acked).collect::<Vec<_>>()
    );
    for d in unsettled {
        let value = value(d);
        assert!(pending.contains(&value), "{value} is still pending");
    }
}

// ---------------------------------------------------------------------------------------------
// Found while writing the fault tests: acked deliveries whose read is not complete do not count
// against the in-flight limit.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_simple_list_crash_loses_no_more_than_the_in_flight_limit_when_reads_are_half_settled() {
    const N: usize = 100;
    const COUNT: u32 = 10;
    const MAX_IN_FLIGHT: u32 = 10;
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    for n in 0..N {
        let _: i64 = inspect.lpush("tasks", format!("v{n}")).await.unwrap();
    }
    let listen = listen_addr();
    let sidecar = SidecarProcess::serve(&redis.url(), &listen, &[]);
    let open = proto::Open {
        source: Some(proto::open::Source::SimpleList(proto::SimpleListSource {
            key: "tasks".into(),
        })),
        count: COUNT,
        max_in_flight: MAX_IN_FLIGHT,
        block: Some(duration(Duration::from_millis(200))),
        ..Default::default()
    };
    let mut worker = Worker::open(&listen, open).await;
    // A client that handles deliveries concurrently, with one slow delivery in every read: it
    // acks all but the last of each read at once.
    let mut handed_out = 0;
    while let Next::Read(read) = worker.next(Duration::from_secs(1)).await {
        handed_out += read.deliveries.len();
        let (done, _slow) = read.deliveries.split_at(read.deliveries.len() - 1);
        worker.ack(done).await;
    }
    sidecar.kill9();
    let left: usize = inspect.llen("tasks").await.unwrap();
    let applied: usize = inspect.scard("seen").await.unwrap();
    let lost = N - left - applied;
    println!(
        "simple list, half-settled reads, SIGKILL: {handed_out} handed out, {} acked, {applied} \
         applied, {left} left in the list: {lost} lost (count {COUNT}, max_in_flight \
         {MAX_IN_FLIGHT})",
        worker.acked.len()
    );
    assert!(
        lost <= (MAX_IN_FLIGHT + COUNT) as usize,
        "a crash lost {lost} entries: more than the in-flight limit (plus one read) allows"
    );
}
