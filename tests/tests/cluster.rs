//! Redis Cluster, end to end: atomic segments on the stream's slot, cross-slot rejections,
//! routing by key in pipeline mode, a reliable list, a group's retries kept out of the stream's
//! other groups, group metrics sampled on the stream's node, readers connected to their slot's
//! node alone, a failover and a resharding. Real `redis-server` processes, the in-process
//! sidecar and the generated gRPC client.
//!
//! The failover tests watch the replica that takes over with `MONITOR`, so that when an
//! entry's side effects apply twice the failure message shows which transaction ran where and
//! when.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use fred::prelude::*;
use tonic::Code;
use window_sidecar::proto::OutcomeKind::{Ack, Retry};
use window_sidecar::proto::subscribe_response::Kind;
use window_sidecar::proto::{self, Mode, RejectionReason};
use window_sidecar_harness::*;

fn reliable_list_open(key: &str, consumer: &str, count: u32) -> proto::Open {
    proto::Open {
        source: Some(proto::open::Source::ReliableList(
            proto::ReliableListSource {
                key: key.into(),
                consumer: consumer.into(),
                ..Default::default()
            },
        )),
        ..stream_open("unused", "unused", "unused", count)
    }
}

/// `n` entries with a field `n` = from..from + n.
fn numbered_from(from: usize, n: usize) -> Vec<Vec<(&'static str, String)>> {
    (from..from + n)
        .map(|i| vec![("n", i.to_string())])
        .collect()
}

/// `INFO <section>` of one node, over plain RESP.
fn info(port: u16, section: &str) -> String {
    resp::call_text(port, &["INFO", section]).unwrap_or_else(|e| panic!("INFO on {port}: {e}"))
}

/// The `calls=` of `cmdstat_<command>` on one node.
fn node_calls(port: u16, command: &str) -> u64 {
    let prefix = format!("cmdstat_{command}:calls=");
    info(port, "commandstats")
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// `<port>: cmdstat_…` lines with `rejected_calls` > 0 on the given nodes: a MOVED or ASK reply
/// counts as a rejected call of the command that got it.
fn redirected_commands(ports: &[u16]) -> Vec<String> {
    ports
        .iter()
        .flat_map(|&port| {
            info(port, "commandstats")
                .lines()
                .filter(|l| l.starts_with("cmdstat_") && !l.contains("rejected_calls=0,"))
                .map(|l| format!("{port}: {l}"))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// A cluster of three primaries, each with a replica, the in-process sidecar on it, a gRPC
/// client and a Redis client that looks at the result: what each test of one rule of the
/// window on a cluster starts from.
struct OnCluster {
    cluster: RedisCluster,
    sidecar: Sidecar,
    client: proto::window_service_client::WindowServiceClient<tonic::transport::Channel>,
    inspect: Client,
}

impl OnCluster {
    async fn start() -> Self {
        let cluster = RedisCluster::start(3, 1);
        let sidecar = Sidecar::start(&cluster.url(), &[]).await;
        let client = sidecar.client().await;
        let inspect = cluster.client().await;
        OnCluster {
            cluster,
            sidecar,
            client,
            inspect,
        }
    }

    async fn stop(self) {
        let OnCluster {
            cluster,
            sidecar,
            client,
            inspect,
        } = self;
        let _ = inspect.quit().await;
        sidecar.stop().await;
        drop(client);
        drop(cluster);
    }
}

/// Atomic segments on the stream's slot commit with their XACK, as one script on that slot's
/// node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_atomic_segments_commit_on_the_streams_slot() {
    let mut on = OnCluster::start().await;
    let (client, inspect) = (&mut on.client, &on.inspect);
    let orders_node = on.cluster.primary_for_slot(slot_of("{orders}"));

    publish(client, "{orders}", numbered(10)).await;
    resp::call(orders_node, &["CONFIG", "RESETSTAT"]).unwrap();
    let (mut sub, opened) =
        Subscription::open(client, atomic(stream_open("{orders}", "g", "c1", 10)))
            .await
            .unwrap();
    assert_eq!(opened.mode, Mode::Atomic as i32);
    consume(&mut sub, 10, |d| {
        let n = field(d, "n");
        vec![
            command(d.slot, "INCR", &["{orders}:count"]),
            command(d.slot, "HINCRBY", &["{orders}:totals", "sum", &n]),
            command(d.slot, "SADD", &["{orders}:seen", &n]),
        ]
    })
    .await;
    assert_eq!(counter(inspect, "{orders}:count").await, 10);
    let sum: i64 = inspect.hget("{orders}:totals", "sum").await.unwrap();
    assert_eq!(sum, (0..10).sum::<i64>());
    assert_eq!(inspect.scard::<i64, _>("{orders}:seen").await.unwrap(), 10);
    assert_eq!(pending(inspect, "{orders}", "g").await, 0);
    // Every kept segment ran as one script on the node of the stream's slot.
    assert!(node_calls(orders_node, "eval") >= 1);
    assert_eq!(node_calls(orders_node, "exec"), 0);
    assert_eq!(node_calls(orders_node, "xack"), 10);
    sub.close();
    on.stop().await;
}

/// A key of another slot is refused for its slot when queued, before anything is sent, with a
/// message that names the fix; the entry is then retried without loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_a_key_of_another_slot_is_refused_before_anything_is_sent() {
    let mut on = OnCluster::start().await;
    let (client, inspect) = (&mut on.client, &on.inspect);
    let orders_slot = slot_of("{orders}");
    let (mut sub, _) = Subscription::open(client, atomic(stream_open("{orders}", "g", "c1", 10)))
        .await
        .unwrap();

    publish(client, "{orders}", numbered(1)).await;
    let d = sub.read().await.deliveries.remove(0);
    let (elsewhere, multi_elsewhere) = ("leaderboard", "elsewhere");
    assert_ne!(slot_of(elsewhere), orders_slot);
    assert_ne!(slot_of(multi_elsewhere), orders_slot);
    sub.send(
        vec![
            command(d.slot, "INCR", &["{orders}:count"]),
            command(d.slot, "ZADD", &[elsewhere, "1", "x"]),
            // MSET's keys are every other argument (COMMAND key specs): its second key is the
            // one in another slot.
            command(d.slot, "MSET", &["{orders}:a", "1", multi_elsewhere, "2"]),
        ],
        vec![outcome(d.slot, Ack)],
    )
    .await;
    let rejections = sub.rejections().await;
    let reasons: Vec<i32> = rejections.iter().map(|r| r.reason).collect();
    assert_eq!(
        reasons,
        vec![
            RejectionReason::CrossSlot as i32,
            RejectionReason::CrossSlot as i32,
            // The ack of a slot with a refused command: its segment would be incomplete.
            RejectionReason::IncompleteSegment as i32,
        ],
        "{rejections:?}"
    );
    for (rejection, key) in rejections.iter().zip([elsewhere, multi_elsewhere]) {
        assert_eq!(rejection.slot, d.slot);
        let message = &rejection.message;
        for part in [
            format!("{key:?}"),
            format!("slot {}", slot_of(key)),
            format!("slot {orders_slot}"),
            "\"{orders}\"".to_owned(),
            "hash tag".to_owned(),
            "\"{orders}:…\"".to_owned(),
        ] {
            assert!(message.contains(&part), "{message:?} lacks {part:?}");
        }
    }
    // Nothing was sent: no flush, the entry is still pending, no side effect ran.
    let nothing = tokio::time::timeout(Duration::from_millis(300), sub.next()).await;
    assert!(
        nothing.is_err(),
        "no flush for a refused segment: {nothing:?}"
    );
    assert_eq!(pending(inspect, "{orders}", "g").await, 1);
    assert_eq!(counter(inspect, "{orders}:count").await, 0);
    assert_eq!(inspect.exists::<i64, _>("{orders}:a").await.unwrap(), 0);
    // The client settles it another way: retry discards the segment and the entry comes back.
    sub.send(vec![], vec![outcome(d.slot, Retry)]).await;
    let report = sub.flush().await;
    assert!(report.ok, "{report:?}");
    assert_eq!((report.segments_kept, report.commands), (0, 0));
    let again = sub.read().await.deliveries.remove(0);
    assert_eq!(field(&again, "n"), "0");
    assert_eq!(again.delivery_count, 2);
    assert_eq!(again.entry_id, d.entry_id, "the same entry, kept in place");
    sub.send(
        vec![command(again.slot, "INCR", &["{orders}:count"])],
        vec![outcome(again.slot, Ack)],
    )
    .await;
    assert!(sub.flush().await.ok);
    assert_eq!(counter(inspect, "{orders}:count").await, 1);
    assert_eq!(inspect.exists::<i64, _>(elsewhere).await.unwrap(), 0);
    assert_eq!(pending(inspect, "{orders}", "g").await, 0);
    sub.close();
    on.stop().await;
}

/// Pipeline mode routes each side effect to the node of its own key (from COMMAND key specs),
/// with no MOVED on the way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_pipeline_mode_routes_each_side_effect_by_its_own_key() {
    let mut on = OnCluster::start().await;
    let (cluster, client, inspect) = (&on.cluster, &mut on.client, &on.inspect);
    let spread: Vec<String> = (0..12).map(|i| format!("spread:{i}")).collect();
    let owners: BTreeSet<u16> = spread
        .iter()
        .map(|k| cluster.primary_for_slot(slot_of(k)))
        .collect();
    assert_eq!(owners.len(), 3, "side effects on every primary");
    // BITOP's first argument is the operation, not a key: only key specs route it right. Its
    // keys here live on other nodes than the slot of "OR".
    let or_node = cluster.primary_for_slot(slot_of("OR"));
    let bits: Vec<String> = (0..)
        .map(|i| format!("{{bits{i}}}:dst"))
        .filter(|k| cluster.primary_for_slot(slot_of(k)) != or_node)
        .take(3)
        .collect();
    publish(client, "{pipe}", numbered(24)).await;
    let primaries = cluster.primaries();
    for &port in &primaries {
        resp::call(port, &["CONFIG", "RESETSTAT"]).unwrap();
    }
    let (mut sub, _) = Subscription::open(client, stream_open("{pipe}", "g", "c1", 8))
        .await
        .unwrap();
    let spread_keys = spread.clone();
    let bit_keys = bits.clone();
    consume(&mut sub, 24, move |d| {
        let n: usize = field(d, "n").parse().unwrap();
        let bit = &bit_keys[n % 3];
        vec![
            command(d.slot, "INCR", &[&spread_keys[n % 12]]),
            command(d.slot, "SETBIT", &[bit, &n.to_string(), "1"]),
            command(d.slot, "BITOP", &["OR", bit, bit]),
        ]
    })
    .await;
    for key in &spread {
        assert_eq!(counter(inspect, key).await, 2, "{key}");
    }
    for key in &bits {
        let set: i64 = inspect
            .custom(fred::cmd!("BITCOUNT"), vec![key.clone()])
            .await
            .unwrap();
        assert_eq!(set, 8, "{key}");
    }
    assert_eq!(pending(inspect, "{pipe}", "g").await, 0);
    // Straight to the right node: no side effect got a MOVED (a redirect would be a rejected
    // call of its command). The sidecar's own XINFO sampling: see
    // `cluster_group_metrics_are_sampled_on_the_streams_node`.
    let side_effects_redirected: Vec<String> = redirected_commands(&primaries)
        .into_iter()
        .filter(|l| ["incr:", "setbit:", "bitop:"].iter().any(|c| l.contains(c)))
        .collect();
    assert_eq!(side_effects_redirected, Vec::<String>::new());
    sub.close();
    on.stop().await;
}

/// A reliable list on {jobs} works in atomic mode: its processing list and delay set share the
/// list's slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_a_reliable_list_is_consumed_on_its_slot() {
    let mut on = OnCluster::start().await;
    let (client, inspect) = (&mut on.client, &on.inspect);
    let values: Vec<String> = (0..10).map(|i| format!("job-{i}")).collect();
    let _: i64 = inspect.lpush("{jobs}", values.clone()).await.unwrap();
    let (mut sub, _) = Subscription::open(client, atomic(reliable_list_open("{jobs}", "w1", 4)))
        .await
        .unwrap();
    consume(&mut sub, 10, |d| {
        let value = String::from_utf8_lossy(&d.payload).into_owned();
        vec![
            command(d.slot, "INCR", &["{jobs}:done"]),
            command(d.slot, "SADD", &["{jobs}:seen", &value]),
        ]
    })
    .await;
    assert_eq!(counter(inspect, "{jobs}:done").await, 10);
    let seen: BTreeSet<String> = inspect.smembers("{jobs}:seen").await.unwrap();
    assert_eq!(seen, values.iter().cloned().collect());
    assert_eq!(inspect.llen::<i64, _>("{jobs}").await.unwrap(), 0);
    let processing: i64 = inspect.llen("{jobs}:window:processing:w1").await.unwrap();
    assert_eq!(processing, 0);
    sub.close();
    on.stop().await;
}

/// The entries a plain consumer reads of one stream as (id, fields), each entry's fields as
/// stored, from an `XREADGROUP` reply (null when there is nothing new).
fn xread_entries(reply: Value) -> Vec<(String, Vec<String>)> {
    let array = |v: Value| match v {
        Value::Array(items) => items,
        other => panic!("not an array: {other:?}"),
    };
    if reply.is_null() {
        return Vec::new();
    }
    let mut entries = Vec::new();
    for stream in array(reply) {
        let [_key, list] = <[Value; 2]>::try_from(array(stream)).expect("[key, entries]");
        for entry in array(list) {
            let [id, fields] = <[Value; 2]>::try_from(array(entry)).expect("[id, fields]");
            let fields = array(fields).iter().filter_map(Value::as_string).collect();
            entries.push((id.as_string().expect("an id"), fields));
        }
    }
    entries
}

/// Fan-out on a cluster: group billing, through the sidecar, retries entries n ≡ 1 (mod 4) of
/// "{orders}" and retries those n ≡ 2 after 300 ms (acking the rest and every later delivery);
/// group shipping reads the stream by hand (XREADGROUP, XACK on the stream's node). Shipping
/// reads exactly what was published, each entry once; the stream never grows; billing gets
/// each retried entry back with its own id and its count one higher, a delayed one not before
/// 300 ms after the batch that delayed it was sent (nor more than 5 s later).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_a_groups_retries_stay_in_that_group() {
    const N: usize = 12;
    const DELAY: Duration = Duration::from_millis(300);
    let mut on = OnCluster::start().await;
    let (client, inspect) = (&mut on.client, &on.inspect);
    let _: () = inspect
        .xgroup_create("{orders}", "shipping", "0", true)
        .await
        .unwrap();
    let ids = publish(client, "{orders}", numbered(N)).await;
    let (mut sub, _) = Subscription::open(client, stream_open("{orders}", "billing", "c1", 4))
        .await
        .unwrap();
    let mut got: BTreeMap<usize, Vec<(String, u32)>> = BTreeMap::new();
    let (mut delayed_at, mut waited) = (HashMap::new(), HashMap::new());
    let mut acked = 0;
    while acked < N {
        match sub.next().await.unwrap() {
            Some(Kind::Read(read)) => {
                let mut outcomes = Vec::new();
                let mut delayed = Vec::new();
                for d in &read.deliveries {
                    let n: usize = field(d, "n").parse().unwrap();
                    got.entry(n)
                        .or_default()
                        .push((d.entry_id.clone(), d.delivery_count));
                    if let Some(sent) = delayed_at.get(&n) {
                        waited.insert(n, Instant::now().duration_since(*sent));
                    }
                    outcomes.push(match (n % 4, d.delivery_count) {
                        (1, 1) => outcome(d.slot, Retry),
                        (2, 1) => {
                            delayed.push(n);
                            retry_after(d.slot, DELAY)
                        }
                        _ => {
                            acked += 1;
                            outcome(d.slot, Ack)
                        }
                    });
                }
                let sent = Instant::now();
                delayed_at.extend(delayed.into_iter().map(|n| (n, sent)));
                sub.send(vec![], outcomes).await;
            }
            Some(Kind::Flush(report)) => assert!(report.ok, "{report:?}"),
            other => panic!("unexpected {other:?}"),
        }
    }
    let settled = || async { pending(inspect, "{orders}", "billing").await == 0 };
    assert!(
        eventually(STEP, settled).await,
        "billing left entries pending"
    );

    let mut shipped = Vec::new();
    loop {
        let reply: Value = inspect
            .xreadgroup("shipping", "fred", Some(100), None, false, "{orders}", ">")
            .await
            .unwrap();
        let entries = xread_entries(reply);
        if entries.is_empty() {
            break;
        }
        let read: Vec<String> = entries.iter().map(|(id, _)| id.clone()).collect();
        let _: i64 = inspect.xack("{orders}", "shipping", read).await.unwrap();
        shipped.extend(entries);
    }
    let published: Vec<(String, Vec<String>)> = ids
        .iter()
        .enumerate()
        .map(|(n, id)| (id.clone(), vec!["n".to_owned(), n.to_string()]))
        .collect();
    assert_eq!(
        shipped, published,
        "shipping reads each entry once, no copy"
    );
    let len: u64 = inspect.xlen("{orders}").await.unwrap();
    assert_eq!(len, N as u64, "nothing was appended to the stream");

    let expected: BTreeMap<usize, Vec<(String, u32)>> = ids
        .iter()
        .enumerate()
        .map(|(n, id)| match n % 4 {
            1 | 2 => (n, vec![(id.clone(), 1), (id.clone(), 2)]),
            _ => (n, vec![(id.clone(), 1)]),
        })
        .collect();
    assert_eq!(
        got, expected,
        "each retried entry again: same id, count + 1"
    );
    // Never earlier than due; later by at most 5 s (timers, round trips, a loaded machine).
    for (n, waited) in &waited {
        assert!(
            *waited >= DELAY && *waited <= DELAY + Duration::from_secs(5),
            "entry {n} came back {waited:?} after its retry_after of {DELAY:?}"
        );
    }
    assert_eq!(waited.len(), 3, "every delayed entry came back: {waited:?}");
    sub.close();
    on.stop().await;
}

/// A dead letter in another slot than the stream's cannot be written with the settle: refused
/// at open, with a message that names the fix, and the fix works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_a_dead_letter_in_another_slot_is_refused_at_open() {
    let mut on = OnCluster::start().await;
    let client = &mut on.client;
    let orders_slot = slot_of("{orders}");
    let with_dead_letter = |target: &str| proto::Open {
        max_deliveries: 3,
        dead_letter: Some(proto::DeadLetter {
            target: Some(proto::dead_letter::Target::Stream(target.into())),
        }),
        ..atomic(stream_open("{orders}", "g", "c2", 10))
    };
    let status = Subscription::open(client, with_dead_letter("orders-dead"))
        .await
        .err()
        .expect("refused");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    for part in [
        "\"orders-dead\"",
        &format!("slot of \"{{orders}}\" ({orders_slot})"),
        &format!("slot {}", slot_of("orders-dead")),
        "hash tag",
        "\"{orders}:dead\"",
    ] {
        assert!(status.message().contains(part), "{status:?} lacks {part:?}");
    }
    // The fix the message names works.
    Subscription::open(client, with_dead_letter("{orders}:dead"))
        .await
        .unwrap();
    on.stop().await;
}

/// What an operator sees on a cluster: the consumer group's pending count
/// (`window_sidecar_group_pending_entries`) is sampled from the stream's node, and no command of the
/// sidecar needs a redirection; it goes on being sampled after the last subscription closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_group_metrics_are_sampled_on_the_streams_node() {
    let cluster = RedisCluster::start(3, 0);
    let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let sidecar = Sidecar::start(
        &cluster.url(),
        &[
            "--metrics-listen",
            &metrics.to_string(),
            "--sample-interval",
            "200ms",
        ],
    )
    .await;
    let mut client = sidecar.client().await;
    let ids = publish(&mut client, "{orders}", numbered(3)).await;
    for port in cluster.primaries() {
        resp::call(port, &["CONFIG", "RESETSTAT"]).unwrap();
    }

    // Three entries left pending by a consumer that went away.
    let (mut gone, _) = Subscription::open(&mut client, stream_open("{orders}", "g", "c0", 3))
        .await
        .unwrap();
    assert_eq!(gone.read().await.deliveries.len(), 3);
    gone.close();
    assert!(matches!(gone.next().await, Ok(None)));

    // A subscription samples its group (XINFO GROUPS) when it opens, then every interval.
    let (mut sub, _) = Subscription::open(&mut client, stream_open("{orders}", "g", "c1", 3))
        .await
        .unwrap();
    let series = "window_sidecar_group_pending_entries{key=\"{orders}\",group=\"g\"}";
    let sampled = eventually(Duration::from_secs(2), || async {
        sample(&http_get(metrics, "/metrics").await.1, series) == 3.0
    })
    .await;
    let text = http_get(metrics, "/metrics").await.1;
    let redirected = redirected_commands(&cluster.primaries());
    assert!(
        redirected.is_empty() && sampled,
        "on a cluster, `XINFO GROUPS <key>` is routed by its first argument (\"GROUPS\", slot {}) \
         instead of the key's slot {}: it gets MOVED, which the pool (one attempt per command) \
         does not follow, so the group's pending count is never sampled.\n\
         redirected commands: {redirected:#?}\n{series} = {} (want 3)",
        slot_of("GROUPS"),
        slot_of("{orders}"),
        sample(&text, series),
    );

    // With no subscription open, the shared sampler still follows the group on its node.
    sub.close();
    let node = cluster.primary_for_slot(slot_of("{orders}"));
    resp::call(node, &["XACK", "{orders}", "g", &ids[0]]).unwrap();
    let followed = eventually(Duration::from_secs(3), || async {
        sample(&http_get(metrics, "/metrics").await.1, series) == 2.0
    })
    .await;
    assert!(
        followed,
        "after an XACK with no subscription open, {series} = {} (want 2)",
        sample(&http_get(metrics, "/metrics").await.1, series)
    );
    sidecar.stop().await;
}

/// A side effect on a key of another slot is refused with the command's name, like every other
/// refused command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_cross_slot_rejection_names_the_refused_command() {
    let cluster = RedisCluster::start(3, 0);
    let sidecar = Sidecar::start(&cluster.url(), &[]).await;
    let mut client = sidecar.client().await;
    publish(&mut client, "{orders}", numbered(1)).await;
    let (mut sub, _) =
        Subscription::open(&mut client, atomic(stream_open("{orders}", "g", "c1", 1)))
            .await
            .unwrap();
    let d = sub.read().await.deliveries.remove(0);
    sub.send(
        vec![command(d.slot, "zadd", &["leaderboard", "1", "x"])],
        vec![],
    )
    .await;
    let rejection = sub.rejections().await.remove(0);
    assert_eq!(rejection.reason, RejectionReason::CrossSlot as i32);
    assert_eq!(
        rejection.command, "ZADD",
        "Rejection.command is \"the refused command's name, when a command was refused\": {rejection:?}"
    );
    sidecar.stop().await;
}

/// The connections of each primary (`connected_clients`).
fn connections(ports: &[u16]) -> Vec<i64> {
    ports
        .iter()
        .map(|&port| {
            info(port, "clients")
                .lines()
                .find_map(|l| l.strip_prefix("connected_clients:"))
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or_else(|| panic!("no connected_clients in INFO clients of {port}"))
        })
        .collect()
}

/// The connections of each primary once they stop changing (up to 3 s).
async fn steady_connections(ports: &[u16]) -> Vec<i64> {
    let mut last = connections(ports);
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = connections(ports);
        if now == last {
            return now;
        }
        last = now;
    }
    last
}

/// A subscription reads from its slot's node alone: its reader connects to that primary and
/// to no other (fred's cluster client would connect to every primary), for a stream and for a
/// reliable list; and it reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_a_subscription_connects_only_to_its_slots_node() {
    const EACH: usize = 4;
    let cluster = RedisCluster::start(3, 0);
    let sidecar = Sidecar::start(&cluster.url(), &[]).await;
    let mut client = sidecar.client().await;
    let inspect = cluster.client().await;
    publish(&mut client, "{orders}", numbered(EACH)).await;
    // Each list subscription takes up to its window (2) at once.
    let jobs: Vec<String> = (0..2 * EACH).map(|i| format!("job-{i}")).collect();
    let _: i64 = inspect.lpush("{jobs}", jobs).await.unwrap();
    let primaries = cluster.primaries();
    let (orders, jobs) = (
        cluster.primary_for_slot(slot_of("{orders}")),
        cluster.primary_for_slot(slot_of("{jobs}")),
    );
    let mut subs = Vec::new();
    for i in 0..EACH {
        let open = stream_open("{orders}", &format!("g{i}"), "c", 1);
        let (mut sub, _) = Subscription::open(&mut client, open).await.unwrap();
        assert_eq!(
            sub.read().await.deliveries.len(),
            1,
            "stream subscription {i} reads"
        );
        subs.push(sub);
        let open = reliable_list_open("{jobs}", &format!("w{i}"), 1);
        let (mut sub, _) = Subscription::open(&mut client, open).await.unwrap();
        assert_eq!(
            sub.read().await.deliveries.len(),
            1,
            "list subscription {i} reads"
        );
        subs.push(sub);
    }
    // The readers' connections are what closing the subscriptions takes away (the pools'
    // connect in the background, and stay).
    let open = steady_connections(&primaries).await;
    for sub in &mut subs {
        sub.close();
    }
    let readers: Vec<i64> = primaries
        .iter()
        .map(|&port| [orders, jobs].iter().filter(|&&p| p == port).count() as i64 * EACH as i64)
        .collect();
    let want: Vec<i64> = open.iter().zip(&readers).map(|(n, r)| n - r).collect();
    let closed = eventually(Duration::from_secs(3), || async {
        connections(&primaries) == want
    })
    .await;
    assert!(
        closed,
        "connections per primary {primaries:?}: {open:?} with {EACH} stream subscriptions on \
         {orders} and {EACH} reliable-list subscriptions on {jobs}, {:?} once they closed; want \
         {want:?}: one reader connection each, on its slot's node only",
        connections(&primaries)
    );
    let _ = inspect.quit().await;
    sidecar.stop().await;
}

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
