//! The background trim of retention by acknowledgement, whatever subscription is open: a
//! stream no subscription reads here, or whose subscription closed, is trimmed all the same;
//! what a second group still needs stays; two sidecars trimming one stream lose nothing a group
//! needs; a pattern Redis would read as a glob still finds its stream; the trim runs while Redis
//! is out of memory, is counted and tried again while an ACL refuses it, and reaches every
//! primary of a cluster. Runs against `redis-server` (or `WINDOW_TEST_REDIS_SERVER`, as CI's
//! server matrix does).

use std::collections::HashSet;
use std::time::Duration;

use fred::prelude::*;
use window_sidecar_harness::retention::{hand_consume, sidecar_consume, stream_ids, xlen};
use window_sidecar_harness::{
    RedisCluster, RedisServer, Sidecar, Worker, acl_user, eventually, free_port, pending, sample,
    scrape, slot_of, stream_open, try_http_get, url_with_auth,
};

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
