//! Clients failing the sidecar: one that vanishes without closing (the network gone silent: its
//! deliveries come back to another client, its subscription is closed and its consumer name
//! freed), one slower than its producers (the backlog stays in Redis, the sidecar's memory
//! bounded), and one that acks part of a read and takes its time with the rest (nothing it
//! acked is handed out again). Each test ends by counting entries and side effects in Redis
//! (`window_sidecar_harness::faults`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use fred::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use window_sidecar::proto::{self, Mode};
use window_sidecar_harness::faults::{KEY, produce, state, work_until_settled};
use window_sidecar_harness::{
    Next, OpenExt, RedisServer, STEP, SidecarProcess, Worker, listen_addr, ok_body, pending,
    stream_open, value,
};

/// A TCP proxy that can turn into a black hole: it stops forwarding in both directions but
/// keeps every socket open (no FIN, no RST), as a cut network does.
struct Proxy {
    addr: String,
    hole: CancellationToken,
}

impl Proxy {
    async fn start(target: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let hole = CancellationToken::new();
        let cut = hole.clone();
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let Ok(outbound) = TcpStream::connect(&target).await else {
                    continue;
                };
                let (in_read, in_write) = inbound.into_split();
                let (out_read, out_write) = outbound.into_split();
                tokio::spawn(pipe(in_read, out_write, cut.clone()));
                tokio::spawn(pipe(out_read, in_write, cut.clone()));
            }
        });
        Self { addr, hole }
    }

    fn black_hole(&self) {
        self.hole.cancel();
    }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    hole: CancellationToken,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = tokio::select! {
            () = hole.cancelled() => break,
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
        };
        if hole.is_cancelled() || to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    // The black hole: hold both sockets open, forward nothing, until the test ends.
    std::future::pending::<()>().await;
    drop((from, to));
}

/// A client that vanished mid-window without closing: it acked half of a read, but the
/// network went silent (a black hole) before its outcomes arrived; another client of the same
/// group then worked until every entry was settled. The black hole and both clients are held
/// until the run is dropped.
struct Vanished {
    _redis: RedisServer,
    sidecar: SidecarProcess,
    _proxy: Proxy,
    _vanishing: Worker,
    /// The client that settled everything; its subscription stays open.
    _other: Worker,
    listen: String,
    metrics: String,
    min_idle: Option<Duration>,
    /// The read the vanished client held when the network went silent.
    cut_off: proto::Read,
    /// The cut-off deliveries the other client got again.
    came_back: usize,
    /// Entries seen, side effects that ran, entries left pending.
    seen: usize,
    count: usize,
    left: u64,
}

const VANISHED_ENTRIES: usize = 30;

impl Vanished {
    async fn run() -> Vanished {
        const N: usize = VANISHED_ENTRIES;
        let redis = RedisServer::start();
        let inspect = redis.client().await;
        produce(&inspect, 0..N, 0).await;
        let (listen, metrics) = (listen_addr(), listen_addr());
        let sidecar = SidecarProcess::serve(
            &redis.url(),
            &listen,
            &[
                "--reclaim-interval",
                "200ms",
                "--metrics-listen",
                &metrics,
                "--client-keepalive",
                "1s",
            ],
        );
        let proxy = Proxy::start(listen.clone()).await;
        let min_idle = Some(Duration::from_secs(1));

        let mut vanishing = Worker::open(
            &proxy.addr,
            stream_open(KEY, "g", "c-a", 10)
                .with_max_in_flight(10)
                .with_min_idle(min_idle),
        )
        .await;
        let first = vanishing.next_read().await;
        vanishing.ack(&first.deliveries).await;
        let report = vanishing.report_for(first.read_id, STEP).await.unwrap();
        assert!(report.ok, "{report:?}");
        // Mid-window: a read handed out, then the network goes silent. Its outcomes go nowhere.
        let cut_off = vanishing.next_read().await;
        proxy.black_hole();
        let half = cut_off.deliveries.len() / 2;
        vanishing.ack(&cut_off.deliveries[..half]).await;

        let mut other = Worker::open(
            &listen,
            stream_open(KEY, "g", "c-b", 10)
                .with_max_in_flight(10)
                .with_min_idle(min_idle),
        )
        .await;
        work_until_settled(&mut other, &inspect, N, Duration::from_secs(30)).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (seen, count, left) = state(&inspect).await;
        let came_back = cut_off
            .deliveries
            .iter()
            .filter(|d| other.delivered.get(&value(d)).is_some_and(|(_, c)| *c >= 2))
            .count();
        println!(
            "vanished client: {} deliveries cut off, {came_back} came back to the other client, \
             {seen} of {N} seen, {count} side effects",
            cut_off.deliveries.len()
        );
        Vanished {
            _redis: redis,
            sidecar,
            _proxy: proxy,
            _vanishing: vanishing,
            _other: other,
            listen,
            metrics,
            min_idle,
            cut_off,
            came_back,
            seen,
            count,
            left,
        }
    }
}

/// The deliveries a vanished client held come back to another client, and the outcomes that
/// never arrived ran nothing: each side effect ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_of_a_client_that_vanished_without_closing_come_back_to_another_client() {
    let run = Vanished::run().await;
    assert_eq!((run.seen, run.left), (VANISHED_ENTRIES, 0));
    assert_eq!(run.came_back, run.cut_off.deliveries.len());
    assert_eq!(
        run.count, VANISHED_ENTRIES,
        "the cut-off outcomes never arrived: each side effect ran once"
    );
    drop(run.sidecar);
}

/// The keepalive PING to a vanished client goes unanswered: the sidecar closes its
/// subscription and frees its consumer name (only the other client's stays open).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_subscription_of_a_client_that_vanished_is_closed_and_its_name_freed() {
    let run = Vanished::run().await;
    let mut still_open = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let view: serde_json::Value =
            serde_json::from_str(&ok_body(&run.metrics, "/subscriptions").await).unwrap();
        still_open = view["subscriptions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["consumer"].as_str().unwrap_or_default().to_owned())
            .collect();
        if !still_open.iter().any(|c| c == "c-a") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!("vanished client: subscriptions still open: {still_open:?}");
    assert_eq!(
        still_open,
        vec!["c-b".to_string()],
        "the vanished client's subscription was not closed"
    );
    // Its consumer name is free again.
    let mut again = Worker::open(
        &run.listen,
        stream_open(KEY, "g", "c-a", 10)
            .with_max_in_flight(10)
            .with_min_idle(run.min_idle),
    )
    .await;
    let next = again.next(Duration::from_secs(2)).await;
    assert!(
        matches!(next, Next::Idle) && again.opened.is_some(),
        "reopening as the vanished consumer: {next:?}"
    );
    again.close();
    drop(run.sidecar);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_client_keeps_the_backlog_in_redis_and_the_sidecar_memory_bounded() {
    const N: usize = 100_000;
    const COUNT: u32 = 10;
    const MAX_IN_FLIGHT: u32 = 20;
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    let listen = listen_addr();
    let metrics = listen_addr();
    let sidecar = SidecarProcess::serve(&redis.url(), &listen, &["--metrics-listen", &metrics]);
    let mut worker = Worker::open(
        &listen,
        stream_open(KEY, "g", "c1", COUNT).with_max_in_flight(MAX_IN_FLIGHT),
    )
    .await;
    produce(&inspect, 0..1, 1000).await;
    let read = worker.next_read().await;
    worker.ack(&read.deliveries).await;
    let baseline = sidecar.rss_kib();

    let producer = {
        let client = redis.client().await;
        tokio::spawn(async move { produce(&client, 1..N, 1000).await })
    };
    let (mut peak, mut max_pending, mut max_outstanding, mut reads) = (baseline, 0, 0, 0);
    while !producer.is_finished() || reads < 40 {
        let read = worker.next_read().await;
        // A slow handler.
        tokio::time::sleep(Duration::from_millis(50)).await;
        worker.ack(&read.deliveries).await;
        reads += 1;
        peak = peak.max(sidecar.rss_kib());
        if reads % 5 == 0 {
            max_pending = max_pending.max(pending(&inspect, KEY, "g").await);
            let view: serde_json::Value =
                serde_json::from_str(&ok_body(&metrics, "/subscriptions").await).unwrap();
            let outstanding = view["subscriptions"][0]["outstanding_deliveries"]
                .as_u64()
                .expect("the subscription's view");
            max_outstanding = max_outstanding.max(outstanding);
        }
    }
    producer.await.unwrap();
    let xlen: usize = inspect.xlen(KEY).await.unwrap();
    let consumed = worker.acked.len();
    worker.close();
    // Reads already on their way when the client closed are abandoned: they stay pending.
    let mut abandoned = 0;
    loop {
        match worker.next(STEP).await {
            Next::Read(read) => abandoned += read.deliveries.len(),
            Next::Ended(None) => break,
            other => panic!("the stream did not end cleanly: {other:?}"),
        }
    }
    let (seen, count, left) = state(&inspect).await;
    println!(
        "slow client: {xlen} entries of 1 KB produced, {consumed} consumed in {reads} reads, \
         max pending {max_pending}, max outstanding {max_outstanding} (count {COUNT}, \
         max_in_flight {MAX_IN_FLIGHT}); sidecar RSS {baseline} KiB before, {peak} KiB at peak, \
         {} KiB after; {left} pending after the close ({abandoned} abandoned on the way)",
        sidecar.rss_kib()
    );
    assert_eq!(xlen, N);
    assert!(
        consumed < N / 2,
        "the backlog stays in Redis: {consumed} consumed"
    );
    assert!(max_outstanding <= u64::from(MAX_IN_FLIGHT));
    // Deliveries waiting for their flush count against the limit beyond one read's worth.
    assert!(
        max_pending <= u64::from(MAX_IN_FLIGHT + COUNT),
        "pending {max_pending}"
    );
    assert!(
        peak < baseline + 48 * 1024,
        "the sidecar's memory grew from {baseline} KiB to {peak} KiB"
    );
    assert_eq!((seen, count), (consumed, consumed));
    assert!(left as usize <= abandoned + COUNT as usize);
    drop(sidecar);
}

// ---------------------------------------------------------------------------------------------
// Found while writing the fault tests: an entry the client acked, whose flush waits for the rest
// of its read, is handed out again.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_acked_while_its_read_is_still_open_is_not_delivered_and_applied_again() {
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    produce(&inspect, 0..2, 0).await;
    let listen = listen_addr();
    let sidecar = SidecarProcess::serve(&redis.url(), &listen, &["--reclaim-interval", "100ms"]);
    let min_idle = Duration::from_millis(300);
    let open = proto::Open {
        mode: Mode::Atomic as i32,
        ..stream_open(KEY, "g", "c1", 2)
            .with_max_in_flight(4)
            .with_min_idle(Some(min_idle))
    };
    let mut worker = Worker::open(&listen, open).await;
    let read = worker.next_read().await;
    assert_eq!(read.deliveries.len(), 2);
    // e0 is acked at once; e1 takes its time (longer than min_idle: it may be claimed and
    // handled twice, as docs/design.md warns for `min_idle`). e0's flush waits for e1.
    worker.ack(&read.deliveries[..1]).await;
    let deadline = tokio::time::Instant::now() + 5 * min_idle;
    while let Some(left) = deadline.checked_duration_since(tokio::time::Instant::now()) {
        // Whatever comes meanwhile is handled as a client would.
        if let Next::Read(again) = worker.next(left).await {
            worker.ack(&again.deliveries).await;
        }
    }
    worker.ack(&read.deliveries[1..]).await;
    worker.report_for(read.read_id, STEP).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let applied: HashMap<String, i64> = inspect.hgetall("applied").await.unwrap();
    let (seen, count, left) = state(&inspect).await;
    println!(
        "acked, then claimed while its read was open: e0 delivered {:?} times (times, highest \
         delivery count), applied {:?}; e1 delivered {:?}; {seen} seen, {count} side effects, \
         {left} pending",
        worker.delivered["e0"],
        applied.get("e0"),
        worker.delivered["e1"]
    );
    assert_eq!((seen, left), (2, 0));
    assert_eq!(
        worker.delivered["e0"].0, 1,
        "e0 was acked by this very subscription and is only waiting for its flush: handing it out \
         again makes its side effects run twice"
    );
    assert_eq!(applied["e0"], 1, "an acked entry's side effects ran twice");
    drop(sidecar);
}
