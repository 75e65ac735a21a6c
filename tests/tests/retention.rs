//! Retention by acknowledgement while groups read the stream: a stream under `--ack-retention`
//! stays as long as what its slowest group has not acknowledged, and every group still gets
//! every entry once; entries every group settled leave it (at once where `XACKDEL` exists), a
//! retried entry stays until the flush that acks it, and a group whose position Redis cannot
//! tell stops the trim until it is known. Runs against `redis-server` (or
//! `WINDOW_TEST_REDIS_SERVER`: CI runs it on Redis 7.0, where the background trim does the
//! work, and on Redis 8.2, where `XACKDEL` does most of it).

use std::collections::HashSet;
use std::time::Duration;

use fred::prelude::*;
use window_sidecar::proto::OutcomeKind;
use window_sidecar_harness::retention::{hand_consume, sidecar_consume, xlen};
use window_sidecar_harness::{
    RedisServer, Sidecar, Subscription, Worker, eventually, free_port, outcome, pending, sample,
    scrape, stream_open,
};

const ENTRIES: usize = 3_000;
/// The producer writes this many entries every PRODUCE_EVERY.
const BURST: usize = 50;
const PRODUCE_EVERY: Duration = Duration::from_millis(25);
const TRIM_EVERY: &str = "200ms";

async fn server_offers_xackdel(client: &Client) -> bool {
    let reply: Value = client
        .custom(
            fred::types::CustomCommand::new_static(
                "COMMAND",
                fred::types::ClusterHash::Random,
                false,
            ),
            vec!["INFO", "XACKDEL"],
        )
        .await
        .unwrap();
    matches!(reply, Value::Array(items) if items.iter().any(|i| !i.is_null()))
}

/// A steady producer, a group consumed through the sidecar at full speed and a hand-written
/// group that lags by thousands of entries, on a stream under retention, once the producer
/// wrote every entry and the fast group had them all.
struct LaggingGroup {
    _redis: RedisServer,
    client: Client,
    sidecar: Sidecar,
    fast: Worker,
    fast_ids: Vec<String>,
    slow_ids: Vec<String>,
    /// The most entries the stream held beyond what the slow group had not acknowledged.
    worst_excess: i64,
    /// The entries one trim interval of traffic brings.
    per_interval: i64,
}

const LAGGING_KEY: &str = "ret:orders";

impl LaggingGroup {
    async fn run() -> LaggingGroup {
        let redis = RedisServer::start();
        let client = redis.client().await;
        let key = LAGGING_KEY;
        // Both groups exist before the first entry: retention never deletes what a group has
        // not read, and a group created later starts where it is created.
        let _: () = client.xgroup_create(key, "slow", "$", true).await.unwrap();
        let sidecar = Sidecar::start(
            &redis.url(),
            &[
                "--ack-retention",
                "ret:*",
                "--retention-interval",
                TRIM_EVERY,
            ],
        )
        .await;
        let mut fast = Worker::open(
            &sidecar.addr.to_string(),
            stream_open(key, "fast", "c1", 64),
        )
        .await;
        assert!(
            eventually(Duration::from_secs(5), || async {
                let groups: Value = client.xinfo_groups(key).await.unwrap();
                matches!(groups, Value::Array(g) if g.len() == 2)
            })
            .await,
            "the sidecar created its group"
        );

        let written = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let producer = produce_steadily(redis.client().await, written.clone());
        let (mut fast_ids, mut slow_ids) = (Vec::new(), Vec::new());
        let mut worst_excess = i64::MIN;
        let per_interval = (BURST as u128 * 200 / PRODUCE_EVERY.as_millis()) as i64;
        let started = std::time::Instant::now();
        for round in 0.. {
            if fast_ids.len() >= ENTRIES {
                break;
            }
            fast_ids.extend(sidecar_consume(&mut fast, Duration::from_millis(50)).await);
            // The slow group reads a few entries now and then until the producer is done.
            if !producer.is_finished() && round % 4 == 0 {
                slow_ids.extend(hand_consume(&client, key, "slow", 5).await);
            }
            // Measured after the count it is compared with: a burst written in between only
            // makes the excess look larger.
            let unacked_by_slow =
                written.load(std::sync::atomic::Ordering::SeqCst) as i64 - slow_ids.len() as i64;
            let excess = xlen(&client, key).await as i64 - unacked_by_slow;
            worst_excess = worst_excess.max(excess);
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "the fast group got {} of {ENTRIES} entries in 2 minutes",
                fast_ids.len()
            );
        }
        producer.await.unwrap();
        LaggingGroup {
            _redis: redis,
            client,
            sidecar,
            fast,
            fast_ids,
            slow_ids,
            worst_excess,
            per_interval,
        }
    }

    /// The slow group reads everything left.
    async fn catch_up(&mut self) {
        loop {
            let got = hand_consume(&self.client, LAGGING_KEY, "slow", 500).await;
            if got.is_empty() {
                break;
            }
            self.slow_ids.extend(got);
        }
    }

    async fn stop(self) {
        let LaggingGroup {
            mut fast, sidecar, ..
        } = self;
        fast.close();
        sidecar.stop().await;
    }
}

/// `ENTRIES` entries to the lagging-group stream, in bursts of `BURST` every `PRODUCE_EVERY`,
/// counted in `written`.
fn produce_steadily(
    client: Client,
    written: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        for start in (0..ENTRIES).step_by(BURST) {
            let pipeline = client.pipeline();
            for i in start..start + BURST {
                let _: () = pipeline
                    .xadd(LAGGING_KEY, false, None, "*", vec![("n", i.to_string())])
                    .await
                    .unwrap();
            }
            let _: Vec<Value> = pipeline.all().await.unwrap();
            written.fetch_add(BURST, std::sync::atomic::Ordering::SeqCst);
            tokio::time::sleep(PRODUCE_EVERY).await;
        }
    })
}

/// The stream's length stays within what the lagging group has not acknowledged plus one trim
/// interval of traffic (and the fast group's window).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_under_retention_keeps_only_what_some_group_still_needs() {
    let run = LaggingGroup::run().await;
    let (worst_excess, per_interval) = (run.worst_excess, run.per_interval);
    let lagging_by = ENTRIES - run.slow_ids.len();
    eprintln!(
        "retention: the slow group lagged by {lagging_by} entries; the stream held at most {worst_excess} entries beyond what it had not acknowledged (one trim interval of traffic: {per_interval})"
    );
    assert!(
        lagging_by > 1_000,
        "the slow group should lag by thousands, it lags by {lagging_by}"
    );
    assert!(
        worst_excess <= 2 * per_interval + 256,
        "the stream held {worst_excess} entries beyond what the slow group had not acknowledged (one interval: {per_interval})"
    );
    run.stop().await;
}

/// A group lagging by thousands behind a stream under retention still gets every entry once
/// when it catches up: none was trimmed before it read it. So does the fast group, and every
/// side effect ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_group_gets_every_entry_once_under_retention() {
    let mut run = LaggingGroup::run().await;
    run.catch_up().await;
    let once = |ids: &[String]| ids.iter().collect::<HashSet<_>>().len();
    assert_eq!(
        (run.slow_ids.len(), once(&run.slow_ids)),
        (ENTRIES, ENTRIES)
    );
    assert_eq!(
        (run.fast_ids.len(), once(&run.fast_ids)),
        (ENTRIES, ENTRIES)
    );
    let effects: i64 = run.client.get("ret:effects").await.unwrap();
    assert_eq!(effects, ENTRIES as i64, "every side effect ran once");
    run.stop().await;
}

/// Everything acknowledged by both groups: the stream empties but for the entry every group
/// last read (kept so that each group's position stays an entry of the stream).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_every_group_acknowledged_empties_but_for_the_last_read() {
    let mut run = LaggingGroup::run().await;
    run.catch_up().await;
    let client = &run.client;
    assert!(
        eventually(Duration::from_secs(5), || async {
            xlen(client, LAGGING_KEY).await <= 1
        })
        .await,
        "the stream still holds {} entries after both groups acknowledged everything",
        xlen(client, LAGGING_KEY).await
    );
    run.stop().await;
}

/// Where `XACKDEL` exists, two groups consumed through the sidecar empty the stream as they
/// settle, without waiting for a trim; where it does not, the background trim does it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_settled_by_every_group_leave_the_stream() {
    let redis = RedisServer::start();
    let client = redis.client().await;
    let key = "ret:both";
    for group in ["a", "b"] {
        let _: () = client.xgroup_create(key, group, "$", true).await.unwrap();
    }
    // A long trim interval: on a server with XACKDEL the settles alone must empty the stream.
    let xackdel = server_offers_xackdel(&client).await;
    let interval = if xackdel { "1h" } else { "100ms" };
    let sidecar = Sidecar::start(
        &redis.url(),
        &["--ack-retention", key, "--retention-interval", interval],
    )
    .await;
    let addr = sidecar.addr.to_string();
    let mut a = Worker::open(&addr, stream_open(key, "a", "c", 16)).await;
    let mut b = Worker::open(&addr, stream_open(key, "b", "c", 16)).await;
    for i in 0..200 {
        let _: String = client
            .xadd(key, false, None, "*", vec![("n", i.to_string())])
            .await
            .unwrap();
    }
    let (mut got_a, mut got_b) = (HashSet::new(), HashSet::new());
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while got_a.len() < 200 || got_b.len() < 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "{} and {} of 200 delivered",
            got_a.len(),
            got_b.len()
        );
        got_a.extend(sidecar_consume(&mut a, Duration::from_millis(100)).await);
        got_b.extend(sidecar_consume(&mut b, Duration::from_millis(100)).await);
    }
    let settled = eventually(Duration::from_secs(5), || async {
        xlen(&client, key).await <= usize::from(!xackdel)
    })
    .await;
    assert!(
        settled,
        "{} entries left after both groups settled everything (XACKDEL: {xackdel})",
        xlen(&client, key).await
    );
    a.close();
    b.close();
    sidecar.stop().await;
}

/// A retried entry is not settled: it stays pending in its group, the same entry, so it stays
/// in the stream however often it is retried, and nothing is appended to the stream for it.
/// Where `XACKDEL` exists it leaves the stream with the flush that finally acknowledges it (the
/// settle under retention is `XACKDEL`); elsewhere it stays for the background trim.
#[tokio::test]
async fn a_retried_entry_leaves_the_stream_with_the_flush_that_acks_it() {
    let redis = RedisServer::start();
    let client = redis.client().await;
    let key = "ret:retry";
    let _: () = client.xgroup_create(key, "g", "$", true).await.unwrap();
    let xackdel = server_offers_xackdel(&client).await;
    // Two entries read and acknowledged before the subscription opens. The trim's first round
    // runs as it opens and removes the first (the last read stays): once it has, no trim runs
    // for the rest of the test (`--retention-interval 1h`), so only the flush can remove what
    // follows.
    for n in ["a", "b"] {
        let _: String = client
            .xadd(key, false, None, "*", vec![("n", n)])
            .await
            .unwrap();
    }
    let before = hand_consume(&client, key, "g", 2).await;
    assert_eq!(before.len(), 2);
    let metrics = format!("127.0.0.1:{}", free_port());
    let sidecar = Sidecar::start(
        &redis.url(),
        &[
            "--ack-retention",
            key,
            "--retention-interval",
            "1h",
            "--metrics-listen",
            &metrics,
        ],
    )
    .await;
    let mut grpc = sidecar.client().await;
    let (mut sub, _) = Subscription::open(&mut grpc, stream_open(key, "g", "c", 1))
        .await
        .unwrap();
    let trimmed = r#"window_sidecar_retention_trimmed_entries_total{key="ret:retry"}"#;
    assert!(
        eventually(Duration::from_secs(5), || async {
            sample(&scrape(&metrics).await, trimmed) == 1.0
        })
        .await,
        "the trim's first round removed the first acknowledged entry ({} left)",
        xlen(&client, key).await
    );
    let last_read = before[1].clone();
    let original: String = client
        .xadd(key, false, None, "*", vec![("n", "0")])
        .await
        .unwrap();
    let ids = |reply: Value| -> Vec<String> {
        reply
            .into_array()
            .into_iter()
            .filter_map(|e| e.into_array().first().and_then(Value::as_string))
            .collect()
    };
    // Retried twice: each time the same entry comes back, still pending in the group, and
    // the stream holds it and nothing more.
    let mut delivery = sub.read().await.deliveries[0].clone();
    assert_eq!(delivery.entry_id, original);
    for count in [2, 3] {
        sub.send(vec![], vec![outcome(delivery.slot, OutcomeKind::Retry)])
            .await;
        assert!(sub.flush().await.ok);
        let stream: Value = client.xrange(key, "-", "+", None).await.unwrap();
        let expected = vec![last_read.clone(), original.clone()];
        assert_eq!(ids(stream), expected, "XACKDEL: {xackdel}");
        assert_eq!(
            pending(&client, key, "g").await,
            1,
            "the retry stays pending"
        );
        delivery = sub.read().await.deliveries[0].clone();
        assert_eq!(delivery.entry_id, original, "the same entry, no copy");
        assert_eq!(delivery.delivery_count, count);
    }
    sub.send(vec![], vec![outcome(delivery.slot, OutcomeKind::Ack)])
        .await;
    assert!(sub.flush().await.ok);
    assert_eq!(pending(&client, key, "g").await, 0);
    let stream: Value = client.xrange(key, "-", "+", None).await.unwrap();
    let expected = if xackdel {
        // Only the entry acknowledged by hand before the subscription is left.
        vec![last_read]
    } else {
        vec![last_read, original]
    };
    assert_eq!(ids(stream), expected, "XACKDEL: {xackdel}");
    assert_eq!(
        sample(&scrape(&metrics).await, trimmed),
        1.0,
        "no trim ran after the first"
    );
    sub.close();
    sidecar.stop().await;
}

/// A group whose position Redis cannot tell (a deleted entry in its unread range: XINFO GROUPS
/// shows no lag) stops the trim, in a gauge and a log line, until it has read to the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_of_unknown_position_stops_the_trim_until_it_is_known() {
    let redis = RedisServer::start();
    let client = redis.client().await;
    let key = "ret:mid";
    let _: () = client.xgroup_create(key, "mid", "0", true).await.unwrap();
    for i in 1..=20 {
        let _: String = client
            .xadd(
                key,
                false,
                None,
                format!("{i}-0"),
                vec![("n", i.to_string())],
            )
            .await
            .unwrap();
    }
    // A tombstone in the unread range: Redis can no longer tell how far behind the group is.
    let _: i64 = client.xdel(key, "15-0").await.unwrap();
    let metrics = format!("127.0.0.1:{}", free_port());
    let sidecar = Sidecar::start(
        &redis.url(),
        &[
            "--ack-retention",
            key,
            "--retention-interval",
            "100ms",
            "--metrics-listen",
            &metrics,
        ],
    )
    .await;
    let mut worker = Worker::open(&sidecar.addr.to_string(), stream_open(key, "g", "c", 64)).await;
    let mut got = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while got < 19 {
        assert!(
            std::time::Instant::now() < deadline,
            "{got} of 19 delivered"
        );
        got += sidecar_consume(&mut worker, Duration::from_millis(200))
            .await
            .len();
    }
    let blocked = r#"window_sidecar_retention_blocked{key="ret:mid",group="mid"}"#;
    assert!(
        eventually(Duration::from_secs(5), || async {
            sample(&scrape(&metrics).await, blocked) == 1.0
        })
        .await,
        "the gauge says the trim is blocked"
    );
    // Every entry is one the group has not read: nothing leaves, on any server (XACKDEL keeps
    // what another group still references).
    assert_eq!(
        xlen(&client, key).await,
        19,
        "nothing trimmed past a group of unknown position"
    );

    // The group reads to the end: its position is known again and the trim resumes.
    let read = hand_consume(&client, key, "mid", 100).await;
    assert_eq!(read.len(), 19);
    assert!(
        eventually(Duration::from_secs(5), || async {
            xlen(&client, key).await <= 1 && sample(&scrape(&metrics).await, blocked) == 0.0
        })
        .await,
        "{} entries left, gauge {}",
        xlen(&client, key).await,
        sample(&scrape(&metrics).await, blocked)
    );
    worker.close();
    sidecar.stop().await;
}
