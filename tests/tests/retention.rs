//! Retention by acknowledgement against a real server: a stream under `--ack-retention` stays
//! as long as what its slowest group has not acknowledged, and every group still gets every
//! entry, whether or not a subscription of it is open on the sidecar, with several sidecars
//! trimming it, on every primary of a cluster, out of memory, and until an ACL allows the trim.
//! Runs against `redis-server` (or `WINDOW_TEST_REDIS_SERVER`: CI runs it on Redis 7.0,
//! where the background trim does the work, and on Redis 8.2, where `XACKDEL` does most of it).

use std::collections::HashSet;
use std::time::Duration;

use fred::prelude::*;
use window_sidecar::proto::OutcomeKind;
use window_sidecar_harness::{
    Next, RedisCluster, RedisServer, Sidecar, Subscription, Worker, acl_user, command, eventually,
    free_port, outcome, pending, sample, scrape, slot_of, stream_open, try_http_get, url_with_auth,
};

const ENTRIES: usize = 3_000;
/// The producer writes this many entries every PRODUCE_EVERY.
const BURST: usize = 50;
const PRODUCE_EVERY: Duration = Duration::from_millis(25);
const TRIM_EVERY: &str = "200ms";

async fn xlen(client: &Client, key: &str) -> usize {
    client.xlen(key).await.unwrap()
}

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

/// Reads up to `count` entries for `group` by hand (a consumer that is not the sidecar) and
/// acknowledges them with a plain XACK; returns their ids.
async fn hand_consume(client: &Client, key: &str, group: &str, count: u64) -> Vec<String> {
    let reply: Value = client
        .xreadgroup(group, "hand", Some(count), None, false, key, ">")
        .await
        .unwrap();
    let ids = stream_ids(reply);
    if !ids.is_empty() {
        let _: i64 = client.xack(key, group, ids.clone()).await.unwrap();
    }
    ids
}

/// The entry ids of an XREADGROUP reply.
fn stream_ids(reply: Value) -> Vec<String> {
    let Value::Array(streams) = reply else {
        return Vec::new();
    };
    let mut ids = Vec::new();
    for stream in streams {
        let Value::Array(mut pair) = stream else {
            continue;
        };
        let Some(Value::Array(entries)) = pair.pop() else {
            continue;
        };
        for entry in entries {
            if let Value::Array(parts) = entry
                && let Some(id) = parts.first().and_then(Value::as_string)
            {
                ids.push(id);
            }
        }
    }
    ids
}

/// Acks every delivery of one read through the sidecar (an INCR each); returns the entry ids.
async fn sidecar_consume(worker: &mut Worker, wait: Duration) -> Vec<String> {
    match worker.next(wait).await {
        Next::Read(read) => {
            let mut batch = window_sidecar::proto::Batch::default();
            for d in &read.deliveries {
                batch
                    .commands
                    .push(command(d.slot, "INCR", &["ret:effects"]));
                batch.outcomes.push(outcome(d.slot, OutcomeKind::Ack));
            }
            worker.send(batch).await;
            read.deliveries.iter().map(|d| d.entry_id.clone()).collect()
        }
        Next::Idle => Vec::new(),
        other => panic!("the subscription ended: {other:?}"),
    }
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

/// `n` entries appended to `key`; their ids.
async fn append(client: &Client, key: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let id: String = client
            .xadd(key, false, None, "*", vec![("n", i.to_string())])
            .await
            .unwrap();
        ids.push(id);
    }
    ids
}

/// A stream of `n` entries whose only group, `only`, read and acknowledged every one of them by
/// hand; their ids.
async fn acknowledged_stream(client: &Client, key: &str, n: usize) -> Vec<String> {
    let _: () = client.xgroup_create(key, "only", "$", true).await.unwrap();
    let ids = append(client, key, n).await;
    assert_eq!(hand_consume(client, key, "only", n as u64).await, ids);
    ids
}

/// The entries pending for the hand consumer of `group`, read again (`XREADGROUP … 0`): each
/// id with whether the entry is still in the stream (Redis answers a deleted one without
/// fields).
async fn pending_entries(client: &Client, key: &str, group: &str) -> Vec<(String, bool)> {
    let reply: Value = client
        .xreadgroup(group, "hand", Some(10_000), None, false, key, "0")
        .await
        .unwrap();
    let mut entries = Vec::new();
    for stream in reply.into_array() {
        let Some(list) = stream.into_array().pop() else {
            continue;
        };
        for entry in list.into_array() {
            let mut parts = entry.into_array().into_iter();
            let id = parts.next().and_then(|v| v.as_string()).unwrap_or_default();
            let present = parts.next().is_some_and(|fields| !fields.is_null());
            entries.push((id, present));
        }
    }
    entries
}

/// Waits several trim intervals of 100 ms, for a check that nothing more was trimmed.
async fn several_intervals() {
    tokio::time::sleep(Duration::from_millis(600)).await;
}

/// A stream whose only group acknowledged everything is trimmed by a sidecar on which no
/// subscription of it was ever open, as is one created after the sidecar started (found by the
/// walk of the keyspace); a stream the patterns do not name is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_no_subscription_reads_here_is_trimmed_all_the_same() {
    let redis = RedisServer::start();
    let client = redis.client().await;
    acknowledged_stream(&client, "ret:idle", 50).await;
    acknowledged_stream(&client, "other:idle", 50).await;
    let metrics = format!("127.0.0.1:{}", free_port());
    let sidecar = Sidecar::start(
        &redis.url(),
        &[
            "--ack-retention",
            "ret:*",
            "--retention-interval",
            "100ms",
            "--metrics-listen",
            &metrics,
        ],
    )
    .await;
    assert!(
        eventually(Duration::from_secs(3), || async {
            xlen(&client, "ret:idle").await == 1
        })
        .await,
        "the stream still holds {} entries, every one acknowledged by its only group",
        xlen(&client, "ret:idle").await
    );
    let trimmed = r#"window_sidecar_retention_trimmed_entries_total{key="ret:idle"}"#;
    assert_eq!(sample(&scrape(&metrics).await, trimmed), 49.0);

    let late = acknowledged_stream(&client, "ret:late", 30).await;
    assert!(
        eventually(Duration::from_secs(3), || async {
            xlen(&client, "ret:late").await == 1
        })
        .await,
        "a stream created after the sidecar started still holds {} entries",
        xlen(&client, "ret:late").await
    );
    let left: Value = client.xrange("ret:late", "-", "+", None).await.unwrap();
    assert_eq!(
        left.into_array()[0].clone().into_array()[0].as_string(),
        late.last().cloned(),
        "the entry the group last read is the one kept"
    );

    several_intervals().await;
    assert_eq!(
        xlen(&client, "other:idle").await,
        50,
        "a stream --ack-retention does not name keeps its entries"
    );
    sidecar.stop().await;
}

/// A subscription opened on the sidecar, drained and closed: what its group acknowledges
/// afterwards (by hand, or through another sidecar) still leaves the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_subscription_closed_is_still_trimmed() {
    let redis = RedisServer::start();
    let client = redis.client().await;
    let key = "ret:closed";
    let _: () = client.xgroup_create(key, "g", "$", true).await.unwrap();
    let sidecar = Sidecar::start(
        &redis.url(),
        &["--ack-retention", "ret:*", "--retention-interval", "100ms"],
    )
    .await;
    let mut worker = Worker::open(&sidecar.addr.to_string(), stream_open(key, "g", "c", 64)).await;
    append(&client, key, 20).await;
    let mut got = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while got < 20 {
        assert!(
            std::time::Instant::now() < deadline,
            "{got} of 20 delivered"
        );
        got += sidecar_consume(&mut worker, Duration::from_millis(200))
            .await
            .len();
    }
    assert!(
        eventually(Duration::from_secs(5), || async {
            pending(&client, key, "g").await == 0
        })
        .await,
        "every delivery was settled"
    );
    worker.close();

    let after = append(&client, key, 50).await;
    // The closing subscription's last read may still take some of them: the hand consumer
    // takes those over too, as a worker that replaced it would.
    let mut acknowledged = HashSet::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while acknowledged.len() < after.len() {
        assert!(
            std::time::Instant::now() < deadline,
            "the group acknowledged {} of the {} entries appended after the subscription closed",
            acknowledged.len(),
            after.len()
        );
        acknowledged.extend(hand_consume(&client, key, "g", 100).await);
        let claimed: Value = client
            .custom(
                fred::cmd!("XAUTOCLAIM"),
                vec![key, "g", "hand", "0", "0-0", "COUNT", "100"],
            )
            .await
            .unwrap();
        let claimed: Vec<String> = claimed.into_array()[1]
            .clone()
            .into_array()
            .into_iter()
            .filter_map(|e| e.into_array().first().and_then(Value::as_string))
            .collect();
        if !claimed.is_empty() {
            let _: i64 = client.xack(key, "g", claimed.clone()).await.unwrap();
        }
        acknowledged.extend(claimed);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        eventually(Duration::from_secs(3), || async {
            xlen(&client, key).await == 1
        })
        .await,
        "{} entries left after the subscription closed and its group acknowledged the rest",
        xlen(&client, key).await
    );
    sidecar.stop().await;
}

/// A second group that has not read or not acknowledged entries keeps them in the stream, with
/// no subscription anywhere: the trim stops at its oldest pending entry, and it still reads
/// everything it had not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_a_second_group_still_needs_stay() {
    let redis = RedisServer::start();
    let client = redis.client().await;
    let key = "ret:second";
    for group in ["a", "b"] {
        let _: () = client.xgroup_create(key, group, "$", true).await.unwrap();
    }
    let ids = append(&client, key, 50).await;
    assert_eq!(hand_consume(&client, key, "a", 50).await, ids);
    // b: 20 read, the first 10 of them acknowledged, 10 pending, 30 unread.
    let read: Value = client
        .xreadgroup("b", "hand", Some(20), None, false, key, ">")
        .await
        .unwrap();
    assert_eq!(stream_ids(read), ids[..20]);
    let _: i64 = client.xack(key, "b", ids[..10].to_vec()).await.unwrap();
    let sidecar = Sidecar::start(
        &redis.url(),
        &["--ack-retention", "ret:*", "--retention-interval", "100ms"],
    )
    .await;
    assert!(
        eventually(Duration::from_secs(3), || async {
            xlen(&client, key).await == 40
        })
        .await,
        "the stream holds {} entries: group b needs the last 40",
        xlen(&client, key).await
    );
    several_intervals().await;
    let left: Value = client.xrange(key, "-", "+", None).await.unwrap();
    let left: Vec<Option<String>> = left
        .into_array()
        .into_iter()
        .map(|e| e.into_array()[0].as_string())
        .collect();
    assert_eq!(
        left,
        ids[10..].iter().cloned().map(Some).collect::<Vec<_>>()
    );
    let pending = pending_entries(&client, key, "b").await;
    assert_eq!(
        pending,
        ids[10..20]
            .iter()
            .map(|id| (id.clone(), true))
            .collect::<Vec<_>>(),
        "b's pending entries are all still in the stream"
    );
    assert_eq!(hand_consume(&client, key, "b", 100).await, ids[20..]);
    sidecar.stop().await;
}

/// Two sidecars trimming one stream every 20 ms while a producer appends and two groups read
/// it, one acknowledging at once and one holding what it read pending for a while: each group
/// reads every entry once, in order, and never finds one it holds pending deleted; at the end
/// the stream empties but for the last read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sidecars_trimming_one_stream_lose_nothing_a_group_needs() {
    const TOTAL: usize = 1_500;
    let redis = RedisServer::start();
    let key = "ret:two";
    let client = redis.client().await;
    for group in ["fast", "slow"] {
        let _: () = client.xgroup_create(key, group, "$", true).await.unwrap();
    }
    let flags = ["--ack-retention", "ret:*", "--retention-interval", "20ms"];
    let first = Sidecar::start(&redis.url(), &flags).await;
    let second = Sidecar::start(&redis.url(), &flags).await;

    let producer = {
        let client = redis.client().await;
        tokio::spawn(async move {
            let mut ids = Vec::new();
            while ids.len() < TOTAL {
                ids.extend(append(&client, key, 25).await);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            ids
        })
    };
    let fast = {
        let client = redis.client().await;
        tokio::spawn(async move {
            let mut ids = Vec::new();
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            while ids.len() < TOTAL {
                assert!(
                    std::time::Instant::now() < deadline,
                    "fast: {} of {TOTAL}",
                    ids.len()
                );
                let got = hand_consume(&client, key, "fast", 100).await;
                if got.is_empty() {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                ids.extend(got);
            }
            ids
        })
    };
    let slow = {
        let client = redis.client().await;
        tokio::spawn(async move {
            let mut ids: Vec<String> = Vec::new();
            let mut holding: Vec<String> = Vec::new();
            let mut deleted_while_pending = Vec::new();
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            while ids.len() < TOTAL || !holding.is_empty() {
                assert!(
                    std::time::Instant::now() < deadline,
                    "slow: {} of {TOTAL}",
                    ids.len()
                );
                let read: Value = client
                    .xreadgroup("slow", "hand", Some(40), None, false, key, ">")
                    .await
                    .unwrap();
                let got = stream_ids(read);
                ids.extend(got.iter().cloned());
                holding.extend(got);
                // Held across a few trims of both sidecars before it is acknowledged.
                tokio::time::sleep(Duration::from_millis(30)).await;
                for (id, present) in pending_entries(&client, key, "slow").await {
                    if !present {
                        deleted_while_pending.push(id);
                    }
                }
                let done: Vec<String> = holding.drain(..holding.len() / 2).collect();
                let done = if done.is_empty() && ids.len() >= TOTAL {
                    std::mem::take(&mut holding)
                } else {
                    done
                };
                if !done.is_empty() {
                    let _: i64 = client.xack(key, "slow", done).await.unwrap();
                }
            }
            (ids, deleted_while_pending)
        })
    };
    let produced = producer.await.unwrap();
    let fast_ids = fast.await.unwrap();
    let (slow_ids, deleted_while_pending) = slow.await.unwrap();
    assert_eq!(
        fast_ids, produced,
        "the fast group read every entry once, in order"
    );
    assert_eq!(
        slow_ids, produced,
        "the slow group read every entry once, in order"
    );
    assert_eq!(
        deleted_while_pending,
        Vec::<String>::new(),
        "entries deleted while the slow group held them pending"
    );
    assert!(
        eventually(Duration::from_secs(3), || async {
            xlen(&client, key).await == 1
        })
        .await,
        "{} entries left once both groups acknowledged everything",
        xlen(&client, key).await
    );
    first.stop().await;
    second.stop().await;
}

/// A pattern with what a Redis glob reads as syntax (`[`, `]`) and a `?` that stands for a
/// character of two bytes: the walk of the keyspace still finds the stream it names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pattern_redis_would_read_as_a_glob_finds_its_stream() {
    let redis = RedisServer::start();
    let client = redis.client().await;
    let key = "odd:[1]é";
    acknowledged_stream(&client, key, 20).await;
    let sidecar = Sidecar::start(
        &redis.url(),
        &[
            "--ack-retention",
            "odd:[1]?",
            "--retention-interval",
            "100ms",
        ],
    )
    .await;
    assert!(
        eventually(Duration::from_secs(3), || async {
            xlen(&client, key).await == 1
        })
        .await,
        "{} entries left",
        xlen(&client, key).await
    );
    sidecar.stop().await;
}

/// Out of memory, Redis refuses writes that could grow it, not the trim, which only frees
/// memory: a stream whose only group acknowledged everything still empties.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_is_trimmed_while_redis_is_out_of_memory() {
    let redis = RedisServer::start();
    let client = redis.client().await;
    let key = "ret:oom";
    acknowledged_stream(&client, key, 50).await;
    let _: Value = client
        .custom(fred::cmd!("CONFIG"), vec!["SET", "maxmemory", "1"])
        .await
        .unwrap();
    let refused: Result<(), Error> = client.set("ret:probe", 1, None, None, false).await;
    assert!(
        refused.is_err_and(|e| e.details().starts_with("OOM")),
        "Redis refuses writes that could grow it"
    );
    let sidecar = Sidecar::start(
        &redis.url(),
        &["--ack-retention", "ret:*", "--retention-interval", "100ms"],
    )
    .await;
    assert!(
        eventually(Duration::from_secs(3), || async {
            xlen(&client, key).await == 1
        })
        .await,
        "{} entries left while Redis is out of memory",
        xlen(&client, key).await
    );
    sidecar.stop().await;
}

/// A trim Redis refuses (an ACL without XTRIM: NOPERM) is counted and tried again every
/// interval, and nothing leaves until it is allowed; then the stream empties.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_trim_is_counted_and_tried_again_until_redis_allows_it() {
    let redis = RedisServer::start();
    let client = redis.client().await;
    let key = "ret:denied";
    acknowledged_stream(&client, key, 50).await;
    acl_user(&client, "trimmer", "pw", "~* &* +@all -xtrim").await;
    let metrics = format!("127.0.0.1:{}", free_port());
    let sidecar = Sidecar::start(
        &url_with_auth(&redis.url(), Some("trimmer"), "pw"),
        &[
            "--ack-retention",
            "ret:*",
            "--retention-interval",
            "100ms",
            "--metrics-listen",
            &metrics,
        ],
    )
    .await;
    let failures = r#"window_sidecar_retention_trim_failures_total{key="ret:denied"}"#;
    assert!(
        eventually(Duration::from_secs(3), || async {
            // The metrics listener may not be bound yet.
            try_http_get(&metrics, "/metrics")
                .await
                .is_ok_and(|(_, body)| sample(&body, failures) >= 3.0)
        })
        .await,
        "refused trims are counted, one an interval"
    );
    assert_eq!(xlen(&client, key).await, 50, "nothing left while refused");

    let _: Value = client
        .custom(fred::cmd!("ACL"), vec!["SETUSER", "trimmer", "+xtrim"])
        .await
        .unwrap();
    assert!(
        eventually(Duration::from_secs(3), || async {
            xlen(&client, key).await == 1
        })
        .await,
        "{} entries left once the ACL allows XTRIM",
        xlen(&client, key).await
    );
    let counted = sample(&scrape(&metrics).await, failures);
    several_intervals().await;
    assert_eq!(
        sample(&scrape(&metrics).await, failures),
        counted,
        "no failure once allowed"
    );
    sidecar.stop().await;
}

/// On a cluster, a stream on each of the three primaries, none of them subscribed to: the walk
/// of every primary's keyspace finds them all, and each empties.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_the_streams_of_every_primary_are_trimmed() {
    let cluster = RedisCluster::start(3, 0);
    let client = cluster.client().await;
    let mut keys = std::collections::BTreeMap::new();
    for i in 0.. {
        let key = format!("ret:{{{i}}}");
        keys.entry(cluster.primary_for_slot(slot_of(&key)))
            .or_insert(key);
        if keys.len() == 3 {
            break;
        }
    }
    for key in keys.values() {
        acknowledged_stream(&client, key, 30).await;
    }
    let sidecar = Sidecar::start(
        &cluster.url(),
        &["--ack-retention", "ret:*", "--retention-interval", "100ms"],
    )
    .await;
    for (primary, key) in &keys {
        assert!(
            eventually(Duration::from_secs(5), || async {
                xlen(&client, key).await == 1
            })
            .await,
            "{key} on the primary at port {primary} still holds {} entries",
            xlen(&client, key).await
        );
    }
    sidecar.stop().await;
}
