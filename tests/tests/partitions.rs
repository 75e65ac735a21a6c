//! A partitioned stream read by several replicas of one group, each a sidecar process with its
//! worker: every key's entries are handed out one at a time across the whole group and handled
//! in stream order, while a replica is paused past its lease, another is SIGKILLed and a
//! fourth joins mid-run. The handling order
//! is what Redis ends up holding: each ack writes `RPUSH handled:{p}:<key> <n>` in its delivery's
//! transaction, so a key's list is the order its entries were handled in, by whichever replica.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::prelude::{Client, KeysInterface, ListInterface, StreamsInterface};
use tonic::transport::Channel;
use window_sidecar::partition;
use window_sidecar::proto::window_service_client::WindowServiceClient;
use window_sidecar::proto::{self, OutcomeKind};
use window_sidecar_harness::*;

const PARTITIONS: u32 = 8;
const KEYS: usize = 1000;
const PER_KEY: usize = 3;
const STREAM: &str = "orders";

/// What every worker saw, in the order it saw it.
#[derive(Default)]
struct Book {
    /// Each key's delivery out right now: (replica, n).
    out: HashMap<String, (usize, usize)>,
    /// Each key's deliveries in the order they reached a worker: (replica, n, delivery count).
    deliveries: HashMap<String, Vec<(usize, usize, u32)>>,
    /// Deliveries each replica received.
    per_replica: HashMap<usize, usize>,
    /// Deliveries that reached a worker while an earlier one of their key was out elsewhere.
    overlaps: Vec<String>,
    rejections: usize,
    /// Streams that ended, with the status they ended with.
    ended: Vec<(usize, Option<String>)>,
    /// Each replica's highest partition number seen (a read's id over 2^36: each partition a
    /// replica reads numbers its reads from a range of its own, a new range each time).
    numbers: HashMap<usize, u64>,
    /// The replica whose sidecar was stopped, and its highest number seen then. What its
    /// worker receives from those partitions afterwards was sent before the stop (it sat in the
    /// sidecar's send buffer): the sidecar refuses its outcome, but it arrives after the new
    /// owner may have moved on. What it reads later comes under new numbers.
    stalled: Option<(usize, u64)>,
    /// Such late deliveries: (key, n).
    late: Vec<(String, usize)>,
}

fn open(replica: usize) -> proto::Open {
    let mut open = atomic(stream_open(STREAM, "g", &format!("w{replica}"), 16))
        .with_min_idle(Some(Duration::from_secs(30)));
    if let Some(proto::open::Source::Stream(stream)) = &mut open.source {
        stream.partitions = PARTITIONS;
    }
    open.ordering_key = Some(proto::OrderingKey {
        source: Some(proto::ordering_key::Source::Field("k".into())),
    });
    open
}

/// A small deterministic generator: the test's choices are the same on every run.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// One replica's worker: takes deliveries until its stream ends, acks most after a random
/// pause (a few slow), retries one in twenty once, and writes each ack's side effect.
async fn work(replica: usize, addr: String, book: Arc<Mutex<Book>>) {
    let mut worker = Worker::open(&addr, open(replica)).await;
    let mut random = 0x9e37_79b9_7f4a_7c15 ^ (replica as u64 + 1);
    loop {
        let read = match worker.next(Duration::from_secs(60)).await {
            Next::Read(read) => read,
            Next::Idle | Next::Draining(_) => continue,
            Next::Ended(status) => {
                book.lock()
                    .unwrap()
                    .ended
                    .push((replica, status.map(|s| s.to_string())));
                return;
            }
        };
        let mut batch = proto::Batch::default();
        {
            let mut book = book.lock().unwrap();
            let number = read.read_id >> 36;
            let late = book
                .stalled
                .is_some_and(|(r, before)| r == replica && number <= before);
            let seen = book.numbers.entry(replica).or_default();
            *seen = (*seen).max(number);
            for d in &read.deliveries {
                let (key, n) = (field(d, "k"), field(d, "n").parse::<usize>().unwrap());
                let from = partition::of_key(key.as_bytes(), PARTITIONS);
                if read.partition != Some(from) {
                    let told = read.partition;
                    let misplaced =
                        format!("{key}: n={n} of partition {from} in a read of {told:?}");
                    book.overlaps.push(misplaced);
                }
                if late {
                    book.late.push((key, n));
                    continue;
                }
                if let Some((other, earlier)) = book.out.get(&key) {
                    let overlap = format!(
                        "{key}: n={n} reached w{replica} while n={earlier} was out at w{other}"
                    );
                    book.overlaps.push(overlap);
                }
                book.out.insert(key.clone(), (replica, n));
                book.deliveries
                    .entry(key)
                    .or_default()
                    .push((replica, n, d.delivery_count));
                *book.per_replica.entry(replica).or_default() += 1;
            }
            book.rejections = book.rejections.max(worker.rejections.len());
        }
        for d in &read.deliveries {
            let roll = next(&mut random) % 100;
            let pause = match roll {
                0..=2 => Duration::from_millis(40),
                _ => Duration::from_micros(roll * 20),
            };
            tokio::time::sleep(pause).await;
            let (key, n) = (field(d, "k"), field(d, "n"));
            // The key is free for the group the moment this outcome leaves.
            book.lock().unwrap().out.remove(&key);
            if roll % 20 == 7 && d.delivery_count == 1 {
                batch.outcomes.push(outcome(d.slot, OutcomeKind::Retry));
                continue;
            }
            let p = partition::of_key(key.as_bytes(), PARTITIONS);
            let list = format!("handled:{{{p}}}:{key}");
            batch.commands.push(command(d.slot, "RPUSH", &[&list, &n]));
            batch.outcomes.push(outcome(d.slot, OutcomeKind::Ack));
        }
        worker.send(batch).await;
    }
}

/// The entries of the test, in steps of a hundred keys each (a key's `n` in order): each key's
/// `n = 0` first, then its `n = 1` and so on.
const STEPS: usize = PER_KEY * KEYS / 100;

/// Appends the steps `steps` of [`STEPS`], about a third of a second apart: the even keys
/// through `Publish`, which finds each entry's partition by its key, the odd ones with XADD
/// straight to the partition a producer computes itself (FNV-1a of the key, modulo the
/// partitions).
async fn produce(
    redis: &Client,
    sidecar: &mut WindowServiceClient<Channel>,
    steps: std::ops::Range<usize>,
) {
    let keys: Vec<usize> = (0..KEYS).collect();
    for step in steps {
        let n = step / (KEYS / 100);
        let chunk = keys.chunks(100).nth(step % (KEYS / 100)).unwrap();
        let mut published = Vec::new();
        for key in chunk.iter() {
            let name = format!("key-{key}");
            let fields = vec![("k", name.clone()), ("n", n.to_string())];
            if key % 2 == 0 {
                published.push(fields);
                continue;
            }
            let stream =
                partition::stream_key(STREAM, partition::of_key(name.as_bytes(), PARTITIONS));
            let _: String = redis.xadd(&stream, false, None, "*", fields).await.unwrap();
        }
        let ids = publish_to(sidecar, published).await;
        assert_eq!(ids.len(), chunk.len() / 2, "an id per entry published");
        // About ten seconds of production: the faults land while entries keep coming.
        tokio::time::sleep(Duration::from_millis(330)).await;
    }
}

/// Publishes entries to the partitioned stream, each by its field `k`.
async fn publish_to(
    sidecar: &mut WindowServiceClient<Channel>,
    entries: Vec<Vec<(&str, String)>>,
) -> Vec<String> {
    let request = proto::PublishRequest {
        stream: STREAM.into(),
        entries: publish_entries(entries),
        partitions: PARTITIONS,
        partition_by: Some(proto::OrderingKey {
            source: Some(proto::ordering_key::Source::Field("k".into())),
        }),
        ..Default::default()
    };
    publish_request(sidecar, request).await
}

async fn handled(redis: &Client) -> usize {
    let mut done = 0;
    for key in 0..KEYS {
        let key = format!("key-{key}");
        let p = partition::of_key(key.as_bytes(), PARTITIONS);
        let len: usize = redis.llen(format!("handled:{{{p}}}:{key}")).await.unwrap();
        done += len;
    }
    done
}

/// What replica 0 shows its operator once the group has settled (replicas 0, 1 and 3 live):
/// the partitions it reads, each a subscription named for its partition, the live members,
/// and the same count and its hand-over times in the metrics.
async fn operator_view(metrics: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let (view, settled) = loop {
        let view: serde_json::Value =
            serde_json::from_str(&ok_body(metrics, "/subscriptions").await).unwrap();
        let member = &view["partitioned"][0];
        let settled = member["members"].as_array().map(Vec::len) == Some(3)
            && member["waiting"].as_array().is_some_and(Vec::is_empty)
            && member["leaving"].as_array().is_some_and(Vec::is_empty);
        if settled || tokio::time::Instant::now() >= deadline {
            break (view, settled);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let member = &view["partitioned"][0];
    assert!(
        settled,
        "replica 0 sees three members and no hand-over: {view:#}"
    );
    assert_eq!(member["member"], "w0");
    assert_eq!(member["partitions"], PARTITIONS);
    let reading: Vec<u64> = member["reading"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_u64().unwrap())
        .collect();
    assert!(
        (2..=3).contains(&reading.len()),
        "8 partitions over 3 replicas: {reading:?}"
    );
    let mut read: Vec<u64> = view["subscriptions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| {
            let partition = &s["partition"];
            assert_eq!(
                s["consumer"],
                format!("partition-{}", partition["partition"])
            );
            assert_eq!(s["key"], format!("orders:{{{}}}", partition["partition"]));
            partition["partition"].as_u64()
        })
        .collect();
    read.sort_unstable();
    assert_eq!(read, reading, "a subscription per partition read");
    let exposition = scrape(metrics).await;
    let labels = r#"{key="orders",group="g"}"#;
    assert_eq!(
        sample(
            &exposition,
            &format!("window_sidecar_partitions_read{labels}")
        ),
        reading.len() as f64
    );
    assert_eq!(
        sample(
            &exposition,
            &format!("window_sidecar_partitions_waiting{labels}")
        ),
        0.0
    );
    assert!(
        sample(
            &exposition,
            &format!("window_sidecar_partition_handover_seconds_count{labels}")
        ) >= reading.len() as f64,
        "every partition read came by a hand-over: {exposition}"
    );
    // Waiting for a partition's name while its owner hands it over is no refusal: the alert on
    // refused consumer names stays quiet through hand-overs.
    assert_eq!(
        sample(&exposition, "window_sidecar_consumer_refusals_total"),
        0.0
    );
}

/// Done when: with 3 replicas (one paused past its lease a sixth of the way, one SIGKILLed a
/// third of the way, a fourth joining at two thirds), no key ever has two deliveries out at
/// once across the group, each key's deliveries follow stream order (a retry again in its
/// place), and every key's entries are handled once each, in stream order; nothing stays
/// pending. On one Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_of_a_group_hand_out_each_key_in_stream_order_through_a_kill_and_a_join() {
    let redis = RedisServer::start();
    replicas_through_faults(&redis.url(), redis.client().await).await;
}

/// Done when: the same on a 3-primary cluster, the partitions spread over its slots, each
/// delivery's side effect in its partition's slot (atomic mode), and Redis's work spread over
/// every primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_replicas_hand_out_each_key_in_stream_order_through_a_kill_and_a_join() {
    let cluster = RedisCluster::start(3, 0);
    let primaries = cluster.primaries();
    let before = xreadgroup_calls(&primaries).await;
    replicas_through_faults(&cluster.url(), cluster.client().await).await;
    let after = xreadgroup_calls(&primaries).await;
    for ((port, was), now) in primaries.iter().zip(before).zip(after) {
        assert!(
            now > was,
            "primary {port} served reads of its partitions: {was} -> {now}"
        );
    }
}

/// XREADGROUP calls each primary has served (INFO commandstats).
async fn xreadgroup_calls(ports: &[u16]) -> Vec<u64> {
    let mut calls = Vec::new();
    for port in ports {
        let node = connect(&format!("redis://127.0.0.1:{port}")).await;
        calls.push(command_calls(&node, "xreadgroup").await);
    }
    calls
}

async fn replicas_through_faults(url: &str, inspect: Client) {
    let flags = ["--consumer-lease", "2s", "--shutdown-grace", "2s"];
    let book = Arc::new(Mutex::new(Book::default()));
    let mut sidecars = Vec::new();
    let mut workers = Vec::new();
    let mut listens = Vec::new();
    let metrics = listen_addr();
    for replica in 0..3 {
        let listen = listen_addr();
        let mut flags = flags.to_vec();
        if replica == 0 {
            flags.extend(["--metrics-listen", &metrics]);
        }
        sidecars.push(Some(SidecarProcess::serve(url, &listen, &flags)));
        workers.push(tokio::spawn(work(
            replica,
            listen.clone(),
            Arc::clone(&book),
        )));
        listens.push(listen);
    }
    // The last sixth of the entries waits for the replica that joins to read a partition, so
    // that it has entries to read however fast the others drained the rest.
    let held_back = STEPS / 6;
    let producer = {
        let redis = inspect.clone();
        // Through the replica that is neither paused nor killed.
        let mut sidecar = connect_client(&listens[0]).await;
        tokio::spawn(async move {
            produce(&redis, &mut sidecar, 0..STEPS - held_back).await;
            sidecar
        })
    };
    let total = KEYS * PER_KEY;
    assert!(
        eventually(Duration::from_secs(60), || async {
            handled(&inspect).await >= total / 6
        })
        .await,
        "a sixth of the entries handled; streams ended: {:?}",
        book.lock().unwrap().ended
    );
    // A replica's sidecar is paused past its lease (its worker goes on, its acks queued):
    // the others take its partitions, and once it runs again it writes nothing it held.
    let paused = sidecars[1].as_ref().unwrap();
    {
        let mut book = book.lock().unwrap();
        let before = book.numbers.get(&1).copied().unwrap_or_default();
        book.stalled = Some((1, before));
    }
    paused.signal("STOP");
    tokio::time::sleep(Duration::from_secs(4)).await;
    paused.signal("CONT");
    assert!(
        eventually(Duration::from_secs(10), || async {
            paused.lines().iter().any(|l| l.contains("lease was lost"))
        })
        .await,
        "the paused replica found its partitions' leases gone: {}",
        paused.tail(20)
    );
    assert!(
        eventually(Duration::from_secs(60), || async {
            handled(&inspect).await >= total / 3
        })
        .await,
        "a third of the entries handled; streams ended: {:?}",
        book.lock().unwrap().ended
    );
    // A replica dies: its worker with it, whatever it held abandoned.
    workers[2].abort();
    sidecars[2].take().unwrap().kill9();
    book.lock()
        .unwrap()
        .out
        .retain(|_, (replica, _)| *replica != 2);
    let before_join = handled(&inspect).await;
    assert!(
        eventually(Duration::from_secs(60), || async {
            handled(&inspect).await >= 2 * total / 3
        })
        .await,
        "two thirds handled after the kill (at {before_join})"
    );
    let listen = listen_addr();
    sidecars.push(Some(SidecarProcess::serve(url, &listen, &flags)));
    workers.push(tokio::spawn(work(3, listen, Arc::clone(&book))));
    let mut sidecar = producer.await.unwrap();
    let joined = sidecars[3].as_ref().unwrap();
    assert!(
        eventually(Duration::from_secs(30), || async {
            joined
                .lines()
                .iter()
                .any(|l| l.contains("reading the partition"))
        })
        .await,
        "the replica that joined reads a partition: {}",
        joined.tail(20)
    );
    produce(&inspect, &mut sidecar, STEPS - held_back..STEPS).await;
    let all = eventually(Duration::from_secs(90), || async {
        handled(&inspect).await >= total
    })
    .await;
    let handled_now = handled(&inspect).await;

    let (overlaps, deliveries, per_replica, late) = {
        let book = book.lock().unwrap();
        (
            book.overlaps.clone(),
            book.deliveries.clone(),
            book.per_replica.clone(),
            book.late.clone(),
        )
    };
    // What the stopped replica's worker got late was handed out again by the new owner, whose
    // deliveries the checks below hold to the order.
    for (key, n) in &late {
        assert!(
            deliveries[key].iter().any(|(r, m, _)| *r != 1 && m == n),
            "{key}: n={n}, received late by w1, was delivered again elsewhere"
        );
    }
    let again: usize = deliveries
        .values()
        .flatten()
        .filter(|(_, _, count)| *count > 1)
        .count();
    eprintln!(
        "deliveries per replica {per_replica:?}, {again} delivered again, {} rejections, {} received late after the stop, handled at the kill {before_join}",
        book.lock().unwrap().rejections,
        late.len()
    );
    assert!(all, "every entry handled: {handled_now} of {total}");
    assert!(
        overlaps.is_empty(),
        "two of a key's deliveries out at once: {:?}",
        &overlaps[..overlaps.len().min(5)]
    );
    for (key, deliveries) in &deliveries {
        let mut expected_next = 0;
        for (replica, n, _) in deliveries {
            // Each n again (a retry, or an entry abandoned by the killed replica) or the next.
            assert!(
                *n + 1 == expected_next || *n == expected_next,
                "{key}: n={n} at w{replica} out of order: {deliveries:?}"
            );
            expected_next = n + 1;
        }
    }
    let expected: Vec<String> = (0..PER_KEY).map(|n| n.to_string()).collect();
    for key in 0..KEYS {
        let key = format!("key-{key}");
        let p = partition::of_key(key.as_bytes(), PARTITIONS);
        let list: Vec<String> = inspect
            .lrange(format!("handled:{{{p}}}:{key}"), 0, -1)
            .await
            .unwrap();
        assert_eq!(
            list, expected,
            "{key} handled in stream order, each entry once"
        );
    }
    assert!(
        per_replica.get(&3).copied().unwrap_or(0) > 0,
        "the replica that joined read partitions: {per_replica:?}"
    );
    operator_view(&metrics).await;
    // The first replica read every partition alone, then handed the others their shares.
    let logged = sidecars[0].as_ref().unwrap().lines();
    for said in [
        "partitioned subscription opened partitions=8 member=w0",
        "handing the partition over partition=",
        "partition handed over: waiting for outstanding outcomes",
        "reading the partition partition=",
        ":partition{partition=",
    ] {
        assert!(
            logged.iter().any(|l| l.contains(said)),
            "replica 0 logged {said:?}"
        );
    }
    // How long partitions waited to be read once they were a replica's, for the record.
    let mut waits: Vec<u64> = sidecars
        .iter()
        .flatten()
        .flat_map(|s| s.lines())
        .filter(|l| l.contains("reading the partition"))
        .filter_map(|l| {
            l.split("waited_ms=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect();
    waits.sort_unstable();
    eprintln!("partitions read after waiting (ms): {waits:?}");
    for p in 0..PARTITIONS {
        let stream = partition::stream_key(STREAM, p);
        assert_eq!(
            pending(&inspect, &stream, "g").await,
            0,
            "{stream} has nothing pending"
        );
    }
    for worker in &workers {
        worker.abort();
    }
    for sidecar in sidecars.into_iter().flatten() {
        sidecar.kill9();
    }
}

/// Done when: `Publish` to a partitioned stream writes each entry to its key's partition
/// (the header named by `partition_by`), in the order given within a key, answers the ids in
/// the entries' order, and spreads entries without the key over the partitions in turn.
#[tokio::test]
async fn publish_routes_each_entry_to_its_keys_partition() {
    let redis = RedisServer::start();
    let inspect: Client = redis.client().await;
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    let keys = ["alpha", "beta", "gamma", "delta", "epsilon"];
    let entries: Vec<proto::PublishEntry> = (0..40)
        .map(|n| proto::PublishEntry {
            payload: n.to_string().into(),
            headers: match n % 8 {
                // Every eighth entry has no key.
                7 => Default::default(),
                i => [("Customer".to_string(), keys[i % keys.len()].to_string())].into(),
            },
            ..Default::default()
        })
        .collect();
    let ids = client
        .publish(proto::PublishRequest {
            stream: "events".into(),
            entries,
            partitions: 4,
            partition_by: Some(proto::OrderingKey {
                source: Some(proto::ordering_key::Source::Header("customer".into())),
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .ids;
    assert_eq!(ids.len(), 40);
    let mut found = HashMap::new();
    let mut unkeyed_partitions = Vec::new();
    for p in 0..4 {
        let stream = partition::stream_key("events", p);
        let rows: Vec<(String, HashMap<String, String>)> =
            inspect.xrange(&stream, "-", "+", None).await.unwrap();
        let mut last_n_of_key: HashMap<String, usize> = HashMap::new();
        for (id, fields) in rows {
            let n: usize = fields["_payload"].parse().unwrap();
            assert_eq!(ids[n], id, "entry {n}'s id answered in its place");
            match fields.get("h:Customer") {
                Some(key) => {
                    assert_eq!(
                        partition::of_key(key.as_bytes(), 4),
                        p,
                        "{key} in its partition"
                    );
                    if let Some(before) = last_n_of_key.insert(key.clone(), n) {
                        assert!(before < n, "{key}'s entries in the order published");
                    }
                }
                None => unkeyed_partitions.push(p),
            }
            found.insert(n, p);
        }
    }
    assert_eq!(found.len(), 40, "every entry written once");
    unkeyed_partitions.sort();
    // Five unkeyed entries over four partitions, the sidecar's first Publish beginning at 0.
    assert_eq!(
        unkeyed_partitions,
        vec![0, 0, 1, 2, 3],
        "unkeyed entries take turns"
    );
    sidecar.stop().await;
}

/// Done when: what cannot be partitioned is refused with INVALID_ARGUMENT and a message that
/// names the setting, at `Publish` and at the open.
#[tokio::test]
async fn partitions_out_of_place_are_refused_with_what_to_set() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let mut client = sidecar.client().await;
    let entry = proto::PublishEntry {
        payload: "x".into(),
        ..Default::default()
    };
    let by = Some(proto::OrderingKey {
        source: Some(proto::ordering_key::Source::Header("k".into())),
    });
    let cases = [
        (
            proto::PublishRequest {
                stream: "s".into(),
                partitions: 4,
                ..Default::default()
            },
            "partitions needs partition_by",
        ),
        (
            proto::PublishRequest {
                stream: "s".into(),
                partition_by: by.clone(),
                ..Default::default()
            },
            "partition_by needs partitions",
        ),
        (
            proto::PublishRequest {
                list: "l".into(),
                partitions: 4,
                partition_by: by.clone(),
                ..Default::default()
            },
            "partitions is for streams",
        ),
        (
            proto::PublishRequest {
                stream: "s".into(),
                partitions: 5000,
                partition_by: by.clone(),
                ..Default::default()
            },
            "partitions",
        ),
    ];
    for (mut request, says) in cases {
        request.entries = vec![entry.clone()];
        let status = client.publish(request).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(says), "{status:?} says {says:?}");
    }
    let mut open = stream_open("s", "g", "w", 4);
    if let Some(proto::open::Source::Stream(stream)) = &mut open.source {
        stream.partitions = 2000;
    }
    let status = Subscription::open(&mut client, open)
        .await
        .err()
        .expect("refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("open.stream.partitions"),
        "{status:?}"
    );
    sidecar.stop().await;
}

/// A replica's worker on a sidecar of its own: opened on the partitioned stream "orders" of
/// group "g", unordered, as consumer `name`.
async fn replica(sidecar: &Sidecar, name: &str, partitions: u32) -> Worker {
    let mut open = stream_open(STREAM, "g", name, 16);
    if let Some(proto::open::Source::Stream(stream)) = &mut open.source {
        stream.partitions = partitions;
    }
    Worker::open(&sidecar.addr.to_string(), open).await
}

/// Appends `n` entries to each partition, straight to its stream.
async fn fill(redis: &Client, partitions: u32, n: usize, tag: &str) {
    for p in 0..partitions {
        for i in 0..n {
            let _: String = redis
                .xadd(
                    partition::stream_key(STREAM, p),
                    false,
                    None,
                    "*",
                    vec![("v", format!("{tag}-{p}-{i}"))],
                )
                .await
                .unwrap();
        }
    }
}

/// Acks whatever `worker` gets within `wait`; returns the values.
async fn take(worker: &mut Worker, wait: Duration) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + wait;
    let mut got = Vec::new();
    while let Some(left) = deadline.checked_duration_since(tokio::time::Instant::now()) {
        if let Next::Read(read) = worker.next(left).await {
            for d in &read.deliveries {
                // Each value is `<tag>-<partition>-<i>`: the read names the partition it is of.
                let v = field(d, "v");
                let of: Option<u32> = v.split('-').nth(1).and_then(|p| p.parse().ok());
                assert_eq!(
                    read.partition, of,
                    "{v} came in a read of {:?}",
                    read.partition
                );
            }
            got.extend(read.deliveries.iter().map(|d| field(d, "v")));
            worker.ack(&read.deliveries).await;
        }
    }
    got
}

/// Done when: a replica whose client closes frees its partitions at once (its leases freed,
/// its membership left), so the other reads them within a renewal, long before the 10 s lease
/// would have expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_leaves_hands_its_partitions_over_at_once() {
    let redis = RedisServer::start();
    let inspect: Client = redis.client().await;
    let (a, b) = (
        Sidecar::start(&redis.url(), &["--consumer-lease", "9s"]).await,
        Sidecar::start(&redis.url(), &["--consumer-lease", "9s"]).await,
    );
    let mut first = replica(&a, "w1", 4).await;
    let mut second = replica(&b, "w2", 4).await;
    // Both replicas read once the first has handed the second its share, at its next
    // renewal (3 s): entries keep coming until the second has some.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(12);
    let mut second_got = 0;
    let mut round = 0;
    while second_got == 0 && tokio::time::Instant::now() < deadline {
        fill(&inspect, 4, 1, &format!("before{round}")).await;
        round += 1;
        let (_, got) = tokio::join!(
            take(&mut first, Duration::from_millis(500)),
            take(&mut second, Duration::from_millis(500))
        );
        second_got += got.len();
    }
    assert!(second_got > 0, "the second replica reads its share");
    let partitions = |w: &Worker| w.opened.as_ref().map(|o| o.partitions);
    assert_eq!(
        partitions(&first),
        Some(4),
        "opened says what it shares out"
    );
    assert_eq!(
        partitions(&second),
        Some(4),
        "opened says what it shares out"
    );
    second.close();
    assert!(matches!(
        second.next(Duration::from_secs(5)).await,
        Next::Ended(None)
    ));
    let left = tokio::time::Instant::now();
    fill(&inspect, 4, 5, "after").await;
    let mut got = Vec::new();
    while got.len() < 20 && left.elapsed() < Duration::from_secs(8) {
        got.extend(take(&mut first, Duration::from_millis(500)).await);
    }
    assert_eq!(
        got.len(),
        20,
        "every partition read by the one left: {got:?}"
    );
    assert!(
        left.elapsed() < Duration::from_secs(8),
        "within a renewal of the other's leaving, not the lease's 9 s"
    );
    first.close();
    a.stop().await;
    b.stop().await;
}

/// Done when: a partition handed over while its delivery is still out abandons it after the
/// drain: the new owner delivers the entry again, and the outcome the old one sends later is
/// answered ALREADY_SETTLED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_of_a_partition_handed_over_is_answered_already_settled() {
    let redis = RedisServer::start();
    let inspect: Client = redis.client().await;
    let flags = ["--consumer-lease", "2s"];
    let (a, b) = (
        Sidecar::start(&redis.url(), &flags).await,
        Sidecar::start(&redis.url(), &flags).await,
    );
    let mut first = replica(&a, "w1", 2).await;
    fill(&inspect, 2, 1, "held").await;
    let mut held = Vec::new();
    while held.len() < 2 {
        match first.next(Duration::from_secs(5)).await {
            Next::Read(read) => held.extend(read.deliveries),
            other => panic!("the first replica reads both partitions: {other:?}"),
        }
    }
    let mut second = replica(&b, "w2", 2).await;
    // The second takes its partition once the first's drain (2 s) gives up on the delivery.
    let moved = match second.next(Duration::from_secs(10)).await {
        Next::Read(read) => read.deliveries,
        other => panic!("the second replica reads the partition handed over: {other:?}"),
    };
    assert_eq!(moved.len(), 1);
    assert_eq!(
        moved[0].delivery_count, 2,
        "delivered again by its new owner"
    );
    second.ack(&moved).await;
    first.ack(&held).await;
    let stale = held
        .iter()
        .find(|d| field(d, "v") == field(&moved[0], "v"))
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while first.rejections.is_empty() && tokio::time::Instant::now() < deadline {
        first.next(Duration::from_millis(200)).await;
    }
    assert_eq!(first.rejections.len(), 1, "{:?}", first.rejections);
    assert_eq!(first.rejections[0].slot, stale.slot);
    assert_eq!(
        first.rejections[0].reason,
        proto::RejectionReason::AlreadySettled as i32
    );
    for p in 0..2 {
        let stream = partition::stream_key(STREAM, p);
        assert!(
            eventually(Duration::from_secs(5), || async {
                pending(&inspect, &stream, "g").await == 0
            })
            .await,
            "{stream}: both entries acked, once each"
        );
    }
    first.close();
    second.close();
    a.stop().await;
    b.stop().await;
}

/// Done when: a replica whose membership Redis refuses to write (the members key holds a
/// string) still reads, as if alone (the partitions' leases are what keep replicas apart), and
/// its log says why.
#[tokio::test]
async fn a_replica_reads_on_when_redis_refuses_its_membership() {
    let redis = RedisServer::start();
    let inspect: Client = redis.client().await;
    let _: () = inspect
        .set(
            "{orders}:window:members:g",
            "not a sorted set",
            None,
            None,
            false,
        )
        .await
        .unwrap();
    let listen = listen_addr();
    let sidecar = SidecarProcess::serve(&redis.url(), &listen, &[]);
    let mut open = stream_open(STREAM, "g", "w1", 16);
    if let Some(proto::open::Source::Stream(stream)) = &mut open.source {
        stream.partitions = 3;
    }
    let mut worker = Worker::open(&listen, open).await;
    fill(&inspect, 3, 2, "x").await;
    let mut got = Vec::new();
    while got.len() < 6 {
        let more = take(&mut worker, Duration::from_secs(2)).await;
        assert!(!more.is_empty(), "reads every partition: {got:?}");
        got.extend(more);
    }
    let said = sidecar.wait_for("could not renew this replica's membership");
    assert!(said.contains("WRONGTYPE"), "{said}");
    worker.close();
    sidecar.kill9();
}
