//! The keeper (`--keep`): with no subscription anywhere it makes a stream group's due
//! `retry_after` entries deliverable (they stay pending in the group) and exports the work
//! waiting, so an autoscaler can wake a worker from zero; keepers and workers' sidecars
//! promoting one delay set of copies an earlier version wrote move each entry back exactly
//! once, a SIGKILL of one keeper included; a kept key of the wrong type or outside `--allow-keys`
//! stops it with 64, naming the key; a list is `form="list"` on the keeper's series and the
//! workers' alike.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use fred::prelude::{Client, KeysInterface, SortedSetsInterface, StreamsInterface};
use window_sidecar::proto;
use window_sidecar_harness::*;

const STREAM: &str = "jobs";
const GROUP: &str = "workers";

fn work_series(key: &str, group: &str) -> String {
    format!(
        "window_sidecar_work_waiting_entries{{form=\"stream\",key=\"{key}\",group=\"{group}\"}}"
    )
}

/// The work-waiting gauge of the keeper at `metrics`, once it has a sample.
async fn work(metrics: SocketAddr) -> Option<f64> {
    let text = scrape(metrics).await;
    let series = work_series(STREAM, GROUP);
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(&series)?.trim().parse().ok())
}

/// Waits up to `wait` for the gauge to read `expected`; returns the last value seen.
async fn work_reaches(metrics: SocketAddr, expected: f64, wait: Duration) -> Option<f64> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let now = work(metrics).await;
        if now == Some(expected) || tokio::time::Instant::now() >= deadline {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn keeper(redis: &RedisServer, metrics: SocketAddr, extra: &[&str]) -> SidecarProcess {
    let listen = format!("127.0.0.1:{}", free_port());
    let metrics = metrics.to_string();
    let mut flags = vec![
        "--keep",
        "stream:jobs:workers",
        "--metrics-listen",
        &metrics,
        "--sample-interval",
        "100ms",
        "--promote-interval",
        "50ms",
    ];
    flags.extend_from_slice(extra);
    SidecarProcess::serve(&redis.url(), &listen, &flags)
}

fn metrics_addr() -> SocketAddr {
    format!("127.0.0.1:{}", free_port()).parse().unwrap()
}

async fn zcard(client: &Client, key: &str) -> i64 {
    client.zcard(key).await.unwrap()
}

/// Every value of field `n` in the stream, with how often it is there.
async fn values_in_stream(client: &Client) -> BTreeMap<String, u32> {
    let entries: Vec<(String, std::collections::HashMap<String, String>)> =
        client.xrange(STREAM, "-", "+", None).await.unwrap();
    let mut seen = BTreeMap::new();
    for (_, fields) in entries {
        *seen.entry(fields["n"].clone()).or_default() += 1;
    }
    seen
}

/// The delay set of copies an earlier version wrote for `STREAM`'s retries.
const DELAYED: &str = "{jobs}:window:delayed";

/// The group's delay set: the due times of its entries kept pending.
const GROUP_DUE: &str = "{jobs}:window:delayed:workers";

/// How long the scaled-to-zero worker's retries wait. The keeper must read 0 and then the new
/// entries' lag before they fall due, and a busy CI machine can take seconds for that.
const RETRY_DELAY: Duration = Duration::from_secs(6);

/// A worker reads five entries and asks for each again in `RETRY_DELAY`, then goes away
/// (scaled to zero): no subscription is left anywhere, the five wait pending in the group,
/// their due times in its delay set, and nothing was appended to the stream.
async fn scaled_to_zero(redis: &RedisServer, inspect: &Client) {
    let worker = Sidecar::start(&redis.url(), &[]).await;
    let mut client = worker.client().await;
    publish(&mut client, STREAM, numbered(5)).await;
    let (mut sub, _) = Subscription::open(&mut client, stream_open(STREAM, GROUP, "w1", 5))
        .await
        .unwrap();
    let read = sub.read().await;
    assert_eq!(read.deliveries.len(), 5);
    let later: Vec<_> = read
        .deliveries
        .iter()
        .map(|d| retry_after(d.slot, RETRY_DELAY))
        .collect();
    sub.send(Vec::new(), later).await;
    assert!(sub.flush().await.ok);
    sub.close();
    assert!(matches!(sub.next().await, Ok(None)));
    worker.stop().await;
    assert_eq!(zcard(inspect, GROUP_DUE).await, 5);
    assert_eq!(zcard(inspect, DELAYED).await, 0);
    assert_eq!(pending(inspect, STREAM, GROUP).await, 5);
    assert_eq!(values_in_stream(inspect).await.len(), 5);
}

/// A keeper started before the worker scales to zero, once it sampled that nothing waits
/// (the retries are not due, nothing is unread): entries added now are counted before the
/// retries fall due. Started first, so its start-up does not eat into the retries' delay.
async fn idle_keeper(redis: &RedisServer, inspect: &Client) -> (SidecarProcess, SocketAddr) {
    let metrics = metrics_addr();
    let keeper = keeper(redis, metrics, &[]);
    scaled_to_zero(redis, inspect).await;
    assert_eq!(
        work_reaches(metrics, 0.0, STEP).await,
        Some(0.0),
        "the work waiting starts at 0"
    );
    (keeper, metrics)
}

/// Three new entries arrive (lag 3); then the five retries fall due and the keeper at
/// `metrics` makes them deliverable (their consumer is gone): 8 waiting, every retry promoted.
async fn due_retries_come_back(inspect: &Client, metrics: SocketAddr) {
    for n in 5..8 {
        let _: String = inspect
            .xadd(STREAM, false, None, "*", ("n", n.to_string()))
            .await
            .unwrap();
    }
    assert_eq!(work_reaches(metrics, 3.0, STEP).await, Some(3.0));
    assert_eq!(
        work_reaches(metrics, 8.0, STEP).await,
        Some(8.0),
        "the due retries and the lag"
    );
    // The promotion itself is read from the set and the keeper's counter.
    let promoted = "window_sidecar_promoted_entries_total{form=\"stream\"}";
    assert!(
        eventually(STEP, || async {
            zcard(inspect, GROUP_DUE).await == 0 && sample(&scrape(metrics).await, promoted) == 5.0
        })
        .await,
        "every retry promoted: {} left in the group's delay set",
        zcard(inspect, GROUP_DUE).await
    );
    // Still the same five entries, pending in the group: nothing was copied.
    assert_eq!(pending(inspect, STREAM, GROUP).await, 5);
    assert_eq!(values_in_stream(inspect).await.len(), 8);
}

/// Done when: zero subscriptions, a keeper running, retry_after entries become due and
/// deliverable, and the work gauge goes from 0 to the due entries plus the lag.
#[tokio::test]
async fn with_no_subscriber_a_keeper_brings_delayed_retries_back() {
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    let (_keeper, metrics) = idle_keeper(&redis, &inspect).await;
    due_retries_come_back(&inspect, metrics).await;
    let text = scrape(metrics).await;
    assert_eq!(
        sample(
            &text,
            "window_sidecar_work_lag_counted{key=\"jobs\",group=\"workers\"}"
        ),
        0.0,
        "Redis reported the lag"
    );
    assert_eq!(sample(&text, "window_sidecar_redis_ready"), 1.0, "{text}");
}

/// A worker started once the keeper made the retries deliverable reads everything: each of the
/// five retried entries once (reclaimed, the same entries), and the three new ones; the gauge
/// drains to 0.
#[tokio::test]
async fn a_worker_started_after_the_keeper_drains_the_work_waiting() {
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    let (_keeper, metrics) = idle_keeper(&redis, &inspect).await;
    due_retries_come_back(&inspect, metrics).await;

    let worker = Sidecar::start(&redis.url(), &[]).await;
    let mut w = Worker::open(
        &worker.addr.to_string(),
        stream_open(STREAM, GROUP, "w2", 16),
    )
    .await;
    let mut got = BTreeMap::<String, u32>::new();
    while got.values().sum::<u32>() < 8 {
        let read = w.next_read().await;
        for d in &read.deliveries {
            *got.entry(field(d, "n")).or_default() += 1;
        }
        w.ack(&read.deliveries).await;
    }
    let expected: BTreeMap<String, u32> = (0..8).map(|n| (n.to_string(), 1)).collect();
    assert_eq!(got, expected);
    assert_eq!(
        work_reaches(metrics, 0.0, STEP).await,
        Some(0.0),
        "drained by the worker"
    );
    w.close();
    worker.stop().await;
}

/// Two keepers and a worker's sidecar promote one delay set of copies an earlier version wrote
/// (as after an upgrade) at once, and one keeper is killed with SIGKILL halfway: each due entry
/// is back in the stream exactly once, and the worker gets each once.
#[tokio::test]
async fn two_keepers_and_a_worker_promote_each_due_entry_exactly_once_through_a_sigkill() {
    const ENTRIES: usize = 300;
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    let _: () = inspect
        .xgroup_create(STREAM, GROUP, "$", true)
        .await
        .unwrap();

    // Delay-set members as retry_after writes them, due one after the other over 3 s.
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let delayed = "{jobs}:window:delayed";
    for n in 0..ENTRIES {
        let member = window_sidecar::redis::delay::encode(
            format!("token-{n}").as_bytes(),
            [Bytes::from_static(b"n"), Bytes::from(n.to_string())],
        );
        let due = (now_ms + 500 + n as u64 * 10) as f64;
        let _: i64 = inspect
            .zadd(delayed, None, None, false, false, (due, member))
            .await
            .unwrap();
    }

    let first = keeper(&redis, metrics_addr(), &[]);
    let second_metrics = metrics_addr();
    let _second = keeper(&redis, second_metrics, &[]);
    // The worker's own sidecar promotes too, while its subscription is open.
    let worker = Sidecar::start(&redis.url(), &[]).await;
    let mut w = Worker::open(
        &worker.addr.to_string(),
        stream_open(STREAM, GROUP, "w1", 32),
    )
    .await;

    let mut got = BTreeMap::<String, u32>::new();
    let mut first = Some(first);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while got.len() < ENTRIES && tokio::time::Instant::now() < deadline {
        if first.is_some() && zcard(&inspect, delayed).await < (ENTRIES / 2) as i64 {
            first.take().unwrap().kill9();
        }
        if let Next::Read(read) = w.next(Duration::from_millis(200)).await {
            for d in &read.deliveries {
                *got.entry(field(d, "n")).or_default() += 1;
            }
            w.ack(&read.deliveries).await;
        }
    }
    assert!(first.is_none(), "the first keeper was killed halfway");
    assert_eq!(zcard(&inspect, delayed).await, 0, "every member promoted");
    let twice: Vec<_> = got.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "delivered more than once: {twice:?}");
    assert_eq!(got.len(), ENTRIES, "every entry delivered");
    let in_stream = values_in_stream(&inspect).await;
    assert_eq!(in_stream.len(), ENTRIES);
    assert!(
        in_stream.values().all(|n| *n == 1),
        "an entry went back more than once: {:?}",
        in_stream
            .iter()
            .filter(|(_, n)| **n > 1)
            .collect::<Vec<_>>()
    );
    // The surviving keeper promoted some of them, and its gauge is back to 0.
    assert_eq!(work_reaches(second_metrics, 0.0, STEP).await, Some(0.0));
    w.close();
    worker.stop().await;
}

fn exits_64_naming(args: &[&str], named: &str) {
    let out = Launch::new().args(args).command().output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{args:?}: {stderr}");
    assert!(
        stderr.contains(named),
        "{args:?} should name {named}: {stderr}"
    );
}

/// A kept key that holds another type, or whose delay set does, stops the sidecar with 64 and
/// its name; so does one outside --allow-keys, already at --check-config.
#[tokio::test]
async fn a_kept_key_of_the_wrong_type_or_outside_allow_keys_exits_64_naming_it() {
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    let _: () = inspect.set("jobs", "x", None, None, false).await.unwrap();
    let _: () = inspect
        .set("{mail}:window:delayed", "x", None, None, false)
        .await
        .unwrap();
    let url = redis.url();
    let listen = format!("127.0.0.1:{}", free_port());
    let base = ["--redis-url", url.as_str(), "--listen", listen.as_str()];
    let with = |extra: &[&'static str]| [&base[..], extra].concat();
    exits_64_naming(
        &with(&["--keep", "stream:jobs:workers"]),
        "\"jobs\" holds a string",
    );
    exits_64_naming(&with(&["--keep", "list:jobs"]), "list:jobs");
    exits_64_naming(
        &with(&["--keep", "list:mail"]),
        "\"{mail}:window:delayed\" holds a string, not a zset",
    );
    exits_64_naming(
        &[
            "--check-config",
            "--allow-keys",
            "orders:*",
            "--keep",
            "list:jobs",
        ],
        "\"jobs\" is outside --allow-keys",
    );
    exits_64_naming(
        &["--check-config", "--keep", "stream:nogroup"],
        "stream:nogroup",
    );
    // A key that does not exist yet is fine: --check-config connects nowhere and accepts it.
    let ok = Launch::new()
        .args(["--check-config", "--keep", "stream:later:workers"])
        .command()
        .output()
        .unwrap();
    assert!(ok.status.success(), "{ok:?}");
    // A key that holds nothing yet starts: the keeper samples it.
    let metrics = metrics_addr();
    let m = metrics.to_string();
    let listen = format!("127.0.0.1:{}", free_port());
    let running = SidecarProcess::serve(
        &url,
        &listen,
        &["--keep", "stream:later:workers", "--metrics-listen", &m],
    );
    assert!(
        running
            .lines()
            .iter()
            .any(|l| l.contains("keeping") && l.contains("stream:later:workers")),
        "{}",
        running.tail(20)
    );
    let _ = scrape(metrics).await;
}

/// One vocabulary for the `form` label: a list is `list` on every series, whether a reliable
/// or a simple subscription counts it or the keeper (which knows the key, not how its workers
/// read it) samples and promotes it. Two values retried later on a reliable list come back
/// through the keeper: its work gauge and its promotions say `form="list"`, as the worker's
/// deliveries and its simple list's series do, and no series says `reliable_list` or
/// `simple_list`.
#[tokio::test]
async fn a_list_is_form_list_on_every_series_of_the_keeper_and_the_workers() {
    use fred::prelude::ListInterface;
    let redis = RedisServer::start();
    let inspect = redis.client().await;
    let keeper_metrics = metrics_addr();
    let _keeper = keeper(&redis, keeper_metrics, &["--keep", "list:tasks"]);
    let worker_metrics = metrics_addr().to_string();
    let worker = Sidecar::start(&redis.url(), &["--metrics-listen", &worker_metrics]).await;
    let mut client = worker.client().await;
    let _: i64 = inspect.lpush("tasks", vec!["a", "b"]).await.unwrap();
    let reliable = proto::Open {
        source: Some(proto::open::Source::ReliableList(
            proto::ReliableListSource {
                key: "tasks".into(),
                consumer: "w1".into(),
                ..Default::default()
            },
        )),
        count: 2,
        block: Some(duration(Duration::from_millis(200))),
        ..Default::default()
    };
    let (mut sub, _) = Subscription::open(&mut client, reliable).await.unwrap();
    let read = sub.read().await;
    assert_eq!(read.deliveries.len(), 2);
    let later: Vec<_> = read
        .deliveries
        .iter()
        .map(|d| retry_after(d.slot, Duration::from_millis(300)))
        .collect();
    sub.send(Vec::new(), later).await;
    assert!(sub.flush().await.ok);
    sub.close();
    assert!(matches!(sub.next().await, Ok(None)));
    let simple = proto::Open {
        source: Some(proto::open::Source::SimpleList(proto::SimpleListSource {
            key: "mail".into(),
        })),
        count: 1,
        block: Some(duration(Duration::from_millis(200))),
        ..Default::default()
    };
    let (_simple, _) = Subscription::open(&mut client, simple).await.unwrap();

    // No subscription reads `tasks` now: the keeper promotes both retries.
    let promoted = "window_sidecar_promoted_entries_total{form=\"list\"}";
    let work = "window_sidecar_work_waiting_entries{form=\"list\",key=\"tasks\",group=\"\"}";
    assert!(
        eventually(STEP, || async {
            let text = scrape(keeper_metrics).await;
            sample(&text, promoted) == 2.0 && sample(&text, work) == 2.0
        })
        .await,
        "{}",
        scrape(keeper_metrics).await
    );
    let keeper_text = scrape(keeper_metrics).await;
    let worker_text = scrape(&worker_metrics).await;
    assert_eq!(
        sample(
            &worker_text,
            "window_sidecar_deliveries_total{form=\"list\"}"
        ),
        2.0,
        "{worker_text}"
    );
    assert_eq!(
        sample(
            &worker_text,
            "window_sidecar_subscriptions_open{form=\"list\"}"
        ),
        1.0,
        "the simple list's subscription: {worker_text}"
    );
    for text in [&keeper_text, &worker_text] {
        assert!(
            !text.contains("reliable_list") && !text.contains("simple_list"),
            "{text}"
        );
    }
    worker.stop().await;
}
