//! The window on a Redis Cluster, key by key: atomic segments commit on the stream's slot, a
//! side effect on a key of another slot is refused before anything is sent (and names the
//! refused command), pipeline mode routes each side effect by its own key, a reliable list is
//! consumed on its slot, a dead letter in another slot is refused at open, a group's retries
//! stay out of the stream's other groups, group metrics are sampled on the stream's node, and
//! a subscription's reader connects to its slot's node alone. Real `redis-server` processes,
//! the in-process sidecar and the generated gRPC client.

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
