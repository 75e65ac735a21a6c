//! The deployments users run, end to end: a Redis Cluster (atomic segments on the stream's
//! slot, cross-slot rejections, routing by key in pipeline mode, a reliable list, a failover
//! and a resharding), a Sentinel-managed primary and its failover, an ACL user whose key
//! patterns exclude a side effect, and TLS with client certificates. Real `redis-server`
//! processes, the in-process sidecar and the generated gRPC client.
//!
//! The failover tests watch the replica that takes over with `MONITOR`, so that when an
//! entry's side effects apply twice the failure message shows which transaction ran where and
//! when.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fred::prelude::*;
use fred::util::redis_keyslot;
use tokio::task::JoinHandle;
use tonic::Code;
use tonic::transport::Channel;
use window_sidecar::proto::OutcomeKind::{Ack, Retry};
use window_sidecar::proto::subscribe_response::Kind;
use window_sidecar::proto::window_service_client::WindowServiceClient;
use window_sidecar::proto::{self, Mode, RejectionReason};
use window_sidecar_harness::*;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn slot_of(key: &str) -> u16 {
    redis_keyslot(key.as_bytes())
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64()
}

fn atomic(open: proto::Open) -> proto::Open {
    proto::Open {
        mode: Mode::Atomic as i32,
        ..open
    }
}

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

/// A Publish of one entry `n=<n>`, without unwrapping the answer.
async fn try_publish(
    client: &mut WindowServiceClient<Channel>,
    stream: &str,
    n: usize,
) -> Result<Vec<String>, tonic::Status> {
    client
        .publish(proto::PublishRequest {
            stream: stream.into(),
            entries: vec![proto::PublishEntry {
                fields: vec![proto::Field {
                    name: "n".into(),
                    value: n.to_string().into(),
                }],
                ..Default::default()
            }],
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner().ids)
}

async fn counter(client: &Client, key: &str) -> i64 {
    client
        .get::<Option<i64>, _>(key)
        .await
        .unwrap()
        .unwrap_or(0)
}

/// XPENDING's count, or `None` while Redis cannot answer (during a failover).
async fn try_pending(client: &Client, key: &str, group: &str) -> Option<u64> {
    let reply: Value = client
        .custom(
            fred::cmd!("XPENDING"),
            vec![key.to_owned(), group.to_owned()],
        )
        .await
        .ok()?;
    match reply {
        Value::Array(parts) => parts.first().and_then(Value::as_u64),
        _ => None,
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

/// Answers one read: `commands(delivery)` for each delivery, then an ack for each.
async fn ack_read(
    sub: &Subscription,
    read: &proto::Read,
    commands: impl Fn(&proto::Delivery) -> Vec<proto::QueuedCommand>,
) {
    let queued = read.deliveries.iter().flat_map(&commands).collect();
    let outcomes = read
        .deliveries
        .iter()
        .map(|d| outcome(d.slot, Ack))
        .collect();
    sub.send(queued, outcomes).await;
}

/// Reads, acks with `commands` and collects flush reports until `entries` entries are settled
/// by successful flushes.
async fn consume(
    sub: &mut Subscription,
    entries: u32,
    commands: impl Fn(&proto::Delivery) -> Vec<proto::QueuedCommand>,
) {
    let mut settled = 0;
    while settled < entries {
        match sub.next().await.unwrap() {
            Some(Kind::Read(read)) => ack_read(sub, &read, &commands).await,
            Some(Kind::Flush(report)) => {
                assert!(report.ok, "{report:?}");
                settled += report.settles;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// `redis-cli MONITOR` on one node: every command it executes (its clients' and, on a
/// replica, the ones its primary replicates), as `<unix time> [<db> <client>] "NAME" …` lines.
/// The process is killed by pid on drop.
struct Monitor {
    child: std::process::Child,
    lines: Arc<Mutex<Vec<String>>>,
}

/// One MONITOR line.
#[derive(Debug)]
struct Seen {
    at: f64,
    client: String,
    command: String,
}

impl Monitor {
    fn start(port: u16) -> Self {
        use std::io::BufRead;
        let mut child = std::process::Command::new("redis-cli")
            .args(["-p", &port.to_string(), "MONITOR"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("redis-cli");
        let stdout = child.stdout.take().expect("piped stdout");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                sink.lock().unwrap().push(line);
            }
        });
        let attached = (0..100).any(|_| {
            let clients = resp::call_text(port, &["CLIENT", "LIST"]).unwrap_or_default();
            clients.contains("cmd=monitor") || {
                std::thread::sleep(Duration::from_millis(20));
                false
            }
        });
        assert!(attached, "MONITOR attached to {port}");
        Self { child, lines }
    }

    fn seen(&self) -> Vec<Seen> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter_map(|line| {
                // 1700000000.123456 [0 127.0.0.1:1234] "XACK" "k" "g" "1-0"
                let (at, rest) = line.split_once(' ')?;
                let (client, command) = rest.strip_prefix('[')?.split_once("] ")?;
                Some(Seen {
                    at: at.parse().ok()?,
                    client: client.split(' ').nth(1).unwrap_or(client).to_owned(),
                    command: command.to_owned(),
                })
            })
            .collect()
    }
}

impl std::ops::Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------------
// A client that keeps going through failovers
// ---------------------------------------------------------------------------------------------

/// A reader of a subscription that behaves like a real client: it acks every delivery with
/// `INCR <counter>` and `SADD <seen> <n>` and reopens with the same consumer whenever the
/// stream ends or fails, until told to stop. While held, it keeps the read in hand unanswered
/// (a client busy with its deliveries).
struct Worker {
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicU64>,
    hold: Arc<AtomicBool>,
    /// A read is in hand, unanswered, because of `hold`.
    holding: Arc<AtomicBool>,
    task: JoinHandle<WorkerLog>,
}

#[derive(Debug, Default)]
struct WorkerLog {
    opens: u32,
    open_errors: Vec<String>,
    stream_ends: Vec<String>,
    /// Deliveries per `n`.
    delivered: BTreeMap<u64, u32>,
    /// Entry ids of each read, by (subscription stream, read id).
    reads: BTreeMap<(u32, u64), Vec<String>>,
    flushes: u32,
    /// Failed flush reports, with when (unix seconds) the client got them and on which
    /// subscription stream.
    failed_flushes: Vec<(f64, u32, proto::FlushReport)>,
    rejections: Vec<String>,
}

impl WorkerLog {
    /// One line: opens, failed flushes, redeliveries.
    fn summary(&self) -> String {
        let failed: Vec<String> = self
            .failed_flushes
            .iter()
            .map(|(_, _, r)| {
                format!(
                    "read {} ({:?}, settle_failed={})",
                    r.read_id, r.error, r.settle_failed
                )
            })
            .collect();
        format!(
            "opens {}, flushes {}, failed flushes {failed:?}, entries delivered more than once {:?}",
            self.opens,
            self.flushes,
            self.redelivered()
        )
    }

    /// Entries of flushes reported with `settle_failed` ("the read's settled entries stay
    /// pending in Redis and are delivered again") that were never delivered again.
    fn settle_failed_but_not_delivered_again(&self) -> Vec<(u64, Vec<String>)> {
        self.failed_flushes
            .iter()
            .filter(|(_, _, r)| r.settle_failed)
            .filter_map(|(_, open, r)| {
                let ids = self.reads.get(&(*open, r.read_id))?;
                let later: BTreeSet<&String> = self
                    .reads
                    .range((*open, r.read_id + 1)..)
                    .flat_map(|(_, ids)| ids)
                    .collect();
                let missing: Vec<String> = ids
                    .iter()
                    .filter(|id| !later.contains(id))
                    .cloned()
                    .collect();
                (!missing.is_empty()).then_some((r.read_id, missing))
            })
            .collect()
    }

    fn redelivered(&self) -> Vec<u64> {
        self.delivered
            .iter()
            .filter(|&(_, &times)| times > 1)
            .map(|(&n, _)| n)
            .collect()
    }
}

impl Worker {
    fn spawn(
        mut client: WindowServiceClient<Channel>,
        open: proto::Open,
        counter: &str,
        seen: &str,
        pace: Duration,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(AtomicU64::new(0));
        let hold = Arc::new(AtomicBool::new(false));
        let holding = Arc::new(AtomicBool::new(false));
        let (stopped, acks) = (Arc::clone(&stop), Arc::clone(&acked));
        let (held, in_hand) = (Arc::clone(&hold), Arc::clone(&holding));
        let (counter, seen) = (counter.to_owned(), seen.to_owned());
        let task = tokio::spawn(async move {
            let mut log = WorkerLog::default();
            while !stopped.load(Ordering::SeqCst) {
                let mut sub = match Subscription::open(&mut client, open.clone()).await {
                    Ok((sub, _)) => sub,
                    Err(status) => {
                        log.open_errors.push(format!("{status:?}"));
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                };
                log.opens += 1;
                loop {
                    if stopped.load(Ordering::SeqCst) {
                        // A clean goodbye: what was settled is flushed, then the stream ends.
                        sub.close();
                        let _ = tokio::time::timeout(Duration::from_secs(5), async {
                            while let Ok(Some(kind)) = sub.next().await {
                                if let Kind::Flush(report) = kind
                                    && !report.ok
                                {
                                    log.failed_flushes.push((unix_now(), log.opens, report));
                                }
                            }
                        })
                        .await;
                        break;
                    }
                    let next = tokio::time::timeout(Duration::from_millis(500), sub.next()).await;
                    let Ok(message) = next else {
                        continue; // quiet (a failover under way): look again
                    };
                    match message {
                        Ok(Some(Kind::Read(read))) => {
                            let ids = read.deliveries.iter().map(|d| d.entry_id.clone());
                            log.reads.insert((log.opens, read.read_id), ids.collect());
                            for d in &read.deliveries {
                                let n: u64 = field(d, "n").parse().unwrap();
                                *log.delivered.entry(n).or_default() += 1;
                            }
                            tokio::time::sleep(pace).await;
                            while held.load(Ordering::SeqCst) {
                                in_hand.store(true, Ordering::SeqCst);
                                tokio::time::sleep(Duration::from_millis(2)).await;
                            }
                            in_hand.store(false, Ordering::SeqCst);
                            ack_read(&sub, &read, |d| {
                                vec![
                                    command(d.slot, "INCR", &[&counter]),
                                    command(d.slot, "SADD", &[&seen, &field(d, "n")]),
                                ]
                            })
                            .await;
                            acks.fetch_add(read.deliveries.len() as u64, Ordering::SeqCst);
                        }
                        Ok(Some(Kind::Flush(report))) => {
                            log.flushes += 1;
                            if !report.ok {
                                log.failed_flushes.push((unix_now(), log.opens, report));
                            }
                        }
                        Ok(Some(Kind::Rejections(r))) => log.rejections.push(format!("{r:?}")),
                        Ok(Some(other)) => panic!("unexpected {other:?}"),
                        Ok(None) => {
                            log.stream_ends.push("ended cleanly".into());
                            break;
                        }
                        Err(status) => {
                            log.stream_ends.push(format!("{status:?}"));
                            break;
                        }
                    }
                }
            }
            log
        });
        Self {
            stop,
            acked,
            hold,
            holding,
            task,
        }
    }

    fn acked(&self) -> u64 {
        self.acked.load(Ordering::SeqCst)
    }

    /// Waits until at least `acks` deliveries are acked, then until the worker holds its next
    /// read unanswered.
    async fn hold_after(&self, acks: u64) {
        let started = eventually(Duration::from_secs(10), || async { self.acked() >= acks }).await;
        assert!(started, "the run started");
        self.hold.store(true, Ordering::SeqCst);
        let holding = eventually(STEP, || async { self.holding.load(Ordering::SeqCst) }).await;
        assert!(holding, "the worker holds a read");
    }

    /// Answers the read in hand and goes on.
    fn release(&self) {
        self.hold.store(false, Ordering::SeqCst);
    }

    async fn stop(self) -> WorkerLog {
        self.stop.store(true, Ordering::SeqCst);
        tokio::time::timeout(Duration::from_secs(20), self.task)
            .await
            .expect("the worker stops")
            .expect("the worker did not panic")
    }
}

/// Waits until `entries` distinct entries are in `seen` and nothing is pending, lets the worker
/// go on a little longer (a duplicate delivery would show now), and stops it.
async fn settle_all(
    inspect: &Client,
    worker: Worker,
    (stream, group, seen): (&str, &str, &str),
    entries: i64,
    timeout: Duration,
) -> WorkerLog {
    let done = eventually(timeout, || async {
        let scard = inspect.scard::<i64, _>(seen).await.unwrap_or(-1);
        scard == entries && try_pending(inspect, stream, group).await == Some(0)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let log = worker.stop().await;
    assert!(
        done,
        "not every entry settled within {timeout:?}: SCARD {seen} = {:?}, XPENDING = {:?}\n{log:#?}",
        inspect.scard::<i64, _>(seen).await,
        try_pending(inspect, stream, group).await
    );
    log
}

/// What the node that took over saw (its MONITOR), for the entries whose side effects applied
/// more than once and for the flushes reported failed: which transaction ran when, through
/// which client. `old` is the killed primary (what it replicated shows its address as client).
fn failover_evidence(
    monitors: &[&Monitor],
    stream: &str,
    ids: &[String],
    old: u16,
    killed_at: f64,
    log: &WorkerLog,
) -> String {
    let mut seen: Vec<Seen> = monitors.iter().flat_map(|m| m.seen()).collect();
    seen.sort_by(|a, b| a.at.total_cmp(&b.at));
    let from_old = format!("127.0.0.1:{old}");
    // In atomic mode each kept segment carries the XACK of its own entry, one id per XACK.
    let xack = |id: &str| format!("\"XACK\" \"{stream}\" \"g\" \"{id}\"");
    // XREADGROUP is replicated as one XCLAIM per delivered entry.
    let delivery = |id: &str| format!("\"XCLAIM\" \"{stream}\" \"g\" \"c1\" \"0\" \"{id}\" ");
    let describe = |s: &Seen| {
        let by = if s.client == from_old {
            "replicated from the old primary".to_owned()
        } else {
            format!("by {} on the new primary", s.client)
        };
        format!("{:+.3}s {by}", s.at - killed_at)
    };
    let mut out = format!("Times are relative to the kill of {old}.\n");
    let mut twice = 0;
    for (n, id) in ids.iter().enumerate() {
        let transactions: Vec<String> = seen
            .iter()
            .filter(|s| s.command == xack(id))
            .map(describe)
            .collect();
        if transactions.len() < 2 {
            continue;
        }
        twice += 1;
        if twice > 6 {
            continue;
        }
        let delivered: Vec<String> = seen
            .iter()
            .filter(|s| s.command.starts_with(&delivery(id)))
            .map(describe)
            .collect();
        out.push_str(&format!(
            "entry n={n} ({id}), delivered {}x to the client; deliveries replicated: {delivered:?}; \
             transactions (INCR, SADD, XACK) that ran: {transactions:?}\n",
            log.delivered.get(&(n as u64)).copied().unwrap_or(0),
        ));
    }
    out.push_str(&format!(
        "{twice} entries had their transaction run more than once.\n"
    ));
    for (reported_at, open, report) in &log.failed_flushes {
        let Some(read_ids) = log.reads.get(&(*open, report.read_id)) else {
            continue;
        };
        let ran_later: Vec<String> = read_ids
            .iter()
            .filter_map(|id| {
                let first = seen
                    .iter()
                    .find(|s| s.at > *reported_at && s.command == xack(id))?;
                Some(format!("{id} {}", describe(first)))
            })
            .collect();
        out.push_str(&format!(
            "flush of read {} ({} entries) reported failed at {:+.3}s (settle_failed={}, {:?}); \
             {} of its entries were acknowledged by a transaction after that report, the \
             first ones: {:?}\n",
            report.read_id,
            read_ids.len(),
            reported_at - killed_at,
            report.settle_failed,
            report.error,
            ran_later.len(),
            &ran_later[..ran_later.len().min(3)],
        ));
    }
    out
}

/// Atomic mode across a failover with `--wait-replicas 1`: nothing is lost and each entry's
/// side effects ran exactly once (the replica had every delivery's claim before the client saw
/// it, so the new primary never hands an entry out again while its first transaction runs),
/// and flush reports tell the truth: a flush reported `settle_failed` did not settle, so its
/// entries are delivered again.
fn assert_exactly_once(count: i64, entries: i64, log: &WorkerLog, evidence: impl Fn() -> String) {
    let duplicates = count - entries;
    eprintln!("failover: {entries} entries, {count} side effects, {duplicates} duplicates");
    assert_eq!(
        duplicates,
        0,
        "side effects ran more than once per entry.\n{}\n{}",
        log.summary(),
        evidence(),
    );
    let untrue = log.settle_failed_but_not_delivered_again();
    assert!(
        untrue.is_empty(),
        "flushes reported settle_failed (\"the read's settled entries stay pending in Redis and \
         are delivered again\"), but these entries (by read) were never delivered again: their \
         settle ran after all: {untrue:?}\n{}\n{}",
        log.summary(),
        evidence(),
    );
}

// ---------------------------------------------------------------------------------------------
// Redis Cluster
// ---------------------------------------------------------------------------------------------

/// One cluster, every rule of the window on it: atomic segments on the stream's slot commit
/// with their XACK on that slot's node; a key of another slot is refused per slot before
/// anything is sent, and the entry is then retried without loss; pipeline mode routes each side
/// effect by its own key (from COMMAND key specs, with no MOVED on the way); a reliable list
/// works; a dead letter in another slot is refused at open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_atomic_segments_cross_slot_rejections_routing_and_lists() {
    let cluster = RedisCluster::start(3, 1);
    let sidecar = Sidecar::start(&cluster.url(), &[]).await;
    let mut client = sidecar.client().await;
    let inspect = cluster.client().await;
    let orders_slot = slot_of("{orders}");
    let orders_node = cluster.primary_for_slot(orders_slot);

    // --- Atomic mode: side effects on {orders}:… commit with the entry's own XACK.
    publish(&mut client, "{orders}", numbered(10)).await;
    resp::call(orders_node, &["CONFIG", "RESETSTAT"]).unwrap();
    let (mut sub, opened) =
        Subscription::open(&mut client, atomic(stream_open("{orders}", "g", "c1", 10)))
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
    assert_eq!(counter(&inspect, "{orders}:count").await, 10);
    let sum: i64 = inspect.hget("{orders}:totals", "sum").await.unwrap();
    assert_eq!(sum, (0..10).sum::<i64>());
    assert_eq!(inspect.scard::<i64, _>("{orders}:seen").await.unwrap(), 10);
    assert_eq!(pending(&inspect, "{orders}", "g").await, 0);
    // Every kept segment ran as a transaction on the node of the stream's slot.
    assert_eq!(node_calls(orders_node, "exec"), 10);
    assert_eq!(node_calls(orders_node, "xack"), 10);

    // --- A key of another slot is refused for its slot when queued, before anything is sent.
    publish(&mut client, "{orders}", numbered(1)).await;
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
    assert_eq!(pending(&inspect, "{orders}", "g").await, 1);
    assert_eq!(counter(&inspect, "{orders}:count").await, 10);
    assert_eq!(inspect.exists::<i64, _>("{orders}:a").await.unwrap(), 0);
    // The client settles it another way: retry discards the segment and the copy comes back.
    sub.send(vec![], vec![outcome(d.slot, Retry)]).await;
    let report = sub.flush().await;
    assert!(report.ok, "{report:?}");
    assert_eq!((report.segments_kept, report.commands), (0, 0));
    let again = sub.read().await.deliveries.remove(0);
    assert_eq!(field(&again, "n"), "0");
    assert_eq!(again.delivery_count, 2);
    assert_eq!(field(&again, "h:x-window-original-id"), d.entry_id);
    sub.send(
        vec![command(again.slot, "INCR", &["{orders}:count"])],
        vec![outcome(again.slot, Ack)],
    )
    .await;
    assert!(sub.flush().await.ok);
    assert_eq!(counter(&inspect, "{orders}:count").await, 11);
    assert_eq!(inspect.exists::<i64, _>(elsewhere).await.unwrap(), 0);
    assert_eq!(pending(&inspect, "{orders}", "g").await, 0);
    sub.close();

    // --- Pipeline mode: each side effect goes to the node of its own key.
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
    publish(&mut client, "{pipe}", numbered(24)).await;
    let primaries = cluster.primaries();
    for &port in &primaries {
        resp::call(port, &["CONFIG", "RESETSTAT"]).unwrap();
    }
    let (mut sub, _) = Subscription::open(&mut client, stream_open("{pipe}", "g", "c1", 8))
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
        assert_eq!(counter(&inspect, key).await, 2, "{key}");
    }
    for key in &bits {
        let set: i64 = inspect
            .custom(fred::cmd!("BITCOUNT"), vec![key.clone()])
            .await
            .unwrap();
        assert_eq!(set, 8, "{key}");
    }
    assert_eq!(pending(&inspect, "{pipe}", "g").await, 0);
    // Straight to the right node: no side effect got a MOVED (a redirect would be a rejected
    // call of its command). The sidecar's own XINFO sampling: see
    // `cluster_group_metrics_are_sampled_on_the_streams_node`.
    let side_effects_redirected: Vec<String> = redirected_commands(&primaries)
        .into_iter()
        .filter(|l| ["incr:", "setbit:", "bitop:"].iter().any(|c| l.contains(c)))
        .collect();
    assert_eq!(side_effects_redirected, Vec::<String>::new());
    sub.close();

    // --- A reliable list on {jobs}: its processing list and delay set share the list's slot.
    let values: Vec<String> = (0..10).map(|i| format!("job-{i}")).collect();
    let _: i64 = inspect.lpush("{jobs}", values.clone()).await.unwrap();
    let (mut sub, _) =
        Subscription::open(&mut client, atomic(reliable_list_open("{jobs}", "w1", 4)))
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
    assert_eq!(counter(&inspect, "{jobs}:done").await, 10);
    let seen: BTreeSet<String> = inspect.smembers("{jobs}:seen").await.unwrap();
    assert_eq!(seen, values.iter().cloned().collect());
    assert_eq!(inspect.llen::<i64, _>("{jobs}").await.unwrap(), 0);
    let processing: i64 = inspect.llen("{jobs}:window:processing:w1").await.unwrap();
    assert_eq!(processing, 0);
    sub.close();

    // --- A dead letter in another slot cannot be written with the settle: refused at open.
    let with_dead_letter = |target: &str| proto::Open {
        max_deliveries: 3,
        dead_letter: Some(proto::DeadLetter {
            target: Some(proto::dead_letter::Target::Stream(target.into())),
        }),
        ..atomic(stream_open("{orders}", "g", "c2", 10))
    };
    let status = Subscription::open(&mut client, with_dead_letter("orders-dead"))
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
    Subscription::open(&mut client, with_dead_letter("{orders}:dead"))
        .await
        .unwrap();

    let _ = inspect.quit().await;
    sidecar.stop().await;
}

/// What an operator sees on a cluster: the consumer group's pending count
/// (`window_group_pending_entries`) is sampled from the stream's node, and no command of the
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
    let series = "window_group_pending_entries{key=\"{orders}\",group=\"g\"}";
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
    let worker = Worker::spawn(
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
        match sub.next().await.unwrap() {
            Some(Kind::Read(read)) => {
                ack_read(&sub, &read, |d: &proto::Delivery| {
                    vec![
                        command(d.slot, "INCR", &["{orders}:count"]),
                        command(d.slot, "SADD", &["{orders}:seen", &field(d, "n")]),
                    ]
                })
                .await
            }
            Some(Kind::Flush(_)) => {}
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

    let worker = Worker::spawn(
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

    // Publish to a slot that just moved: MOVED is "followed by the client library" (README).
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
    let worker = Worker::spawn(
        client.clone(),
        open("{orders}"),
        "{orders}:count",
        "{orders}:seen",
        Duration::from_millis(2),
    );
    let (other_count, other_seen) = (format!("{other}:count"), format!("{other}:seen"));
    let other_worker = Worker::spawn(
        client.clone(),
        open(&other),
        &other_count,
        &other_seen,
        Duration::from_millis(2),
    );
    let producer = {
        let (inspect, other) = (inspect.clone(), other.clone());
        tokio::spawn(async move {
            for n in 0..ENTRIES {
                for key in ["{orders}", other.as_str()] {
                    let fields = vec![("n", n.to_string())];
                    let _: String = inspect.xadd(key, false, None, "*", fields).await.unwrap();
                }
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
        })
    };
    let seen = |key: String| {
        let inspect = inspect.clone();
        async move { inspect.scard::<i64, _>(key).await.unwrap_or(0) }
    };
    let started = eventually(STEP, || async { seen("{orders}:seen".into()).await >= 20 }).await;
    assert!(started, "the run started");

    let migration = tokio::task::block_in_place(|| cluster.begin_slot_migration(slot, to));
    let (orders_before, other_before) = (
        seen("{orders}:seen".into()).await,
        seen(other_seen.clone()).await,
    );
    let mut moved = 0;
    let mut health = Vec::new();
    for _ in 0..4 {
        // A key or two at a time: the stream, its side-effect keys and the sidecar's own keys
        // are split between the nodes for a second each time.
        moved += tokio::task::block_in_place(|| cluster.move_slot_keys(&migration, 2));
        tokio::time::sleep(Duration::from_secs(1)).await;
        health.push(serving(sidecar.addr).await);
    }
    let (orders_during, other_during) = (
        seen("{orders}:seen".into()).await,
        seen(other_seen.clone()).await,
    );
    tokio::task::block_in_place(|| cluster.finish_slot_migration(migration));
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

// ---------------------------------------------------------------------------------------------
// Sentinel
// ---------------------------------------------------------------------------------------------

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

    let worker = Worker::spawn(
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

// ---------------------------------------------------------------------------------------------
// ACL users
// ---------------------------------------------------------------------------------------------

const ACL_PASSWORD: &str = "Pw-0f-the.s1decar~user";

/// One ACL scenario on `stream` (whose keys the user may touch): a delivery whose side effects
/// include a key outside the user's patterns, and one whose side effects are all allowed.
async fn acl_scenario(sidecar: &Sidecar, inspect: &Client, stream: &str, mode: Mode) {
    let mut client = sidecar.client().await;
    publish(&mut client, stream, numbered(2)).await;
    let open = proto::Open {
        mode: mode as i32,
        ..stream_open(stream, "g", "c1", 2)
    };
    let (mut sub, _) = Subscription::open(&mut client, open).await.unwrap();
    let read = sub.read().await;
    let (a, b) = (&read.deliveries[0], &read.deliveries[1]);
    let allowed = format!("allowed:{stream}");
    sub.send(
        vec![
            command(a.slot, "INCR", &[&allowed]),
            command(a.slot, "INCR", &["forbidden:count"]),
            command(b.slot, "INCR", &[&allowed]),
        ],
        vec![outcome(a.slot, Ack), outcome(b.slot, Ack)],
    )
    .await;
    let report = sub.flush().await;
    assert!(!report.ok, "{mode:?}: {report:?}");
    assert!(report.error.contains("NOPERM"), "{mode:?}: {report:?}");
    assert!(
        !report.error.contains(ACL_PASSWORD),
        "the password leaked into the report: {report:?}"
    );
    assert_eq!(counter(inspect, "forbidden:count").await, 0);
    match mode {
        Mode::Pipeline => {
            // Redis has no rollback: the other side effects and the XACK ran; the entry is
            // settled without its refused side effect (the failure is reported).
            assert_eq!(report.failed, 1, "{report:?}");
            assert!(!report.settle_failed, "{report:?}");
            assert_eq!(counter(inspect, &allowed).await, 2);
            assert_eq!(pending(inspect, stream, "g").await, 0);
        }
        Mode::Atomic => {
            // NOPERM is raised while queuing: the transaction is discarded whole, its XACK with
            // it; b's transaction commits on its own.
            assert_eq!(report.aborted, 1, "{report:?}");
            assert!(report.settle_failed, "{report:?}");
            assert_eq!(counter(inspect, &allowed).await, 1);
            assert_eq!(pending(inspect, stream, "g").await, 1);
            // The entry comes back; the client settles it without the forbidden key.
            let again = sub.read().await.deliveries.remove(0);
            assert_eq!(again.entry_id, a.entry_id);
            assert_eq!(again.delivery_count, 2);
            sub.send(
                vec![command(again.slot, "INCR", &[&allowed])],
                vec![outcome(again.slot, Ack)],
            )
            .await;
            let report = sub.flush().await;
            assert!(report.ok, "{report:?}");
            assert_eq!(counter(inspect, &allowed).await, 2);
            assert_eq!(pending(inspect, stream, "g").await, 0);
        }
        Mode::Unspecified => unreachable!(),
    }
    sub.close();
}

/// An ACL user whose key patterns exclude a side-effect key, with the credentials given as
/// flags and in the URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_user_without_access_to_a_side_effect_key() {
    let redis = RedisServer::start_with_password("admin-pw");
    let admin = redis.client_with_auth(None, "admin-pw").await;
    // The sidecar's own keys: the streams and their `{key}:window:…` companions (the delay
    // set), plus `allowed:*` for side effects.
    acl_user(
        &admin,
        "sidecar",
        ACL_PASSWORD,
        "~orders* ~{orders*}:window:* ~allowed:* +@all -@dangerous",
    )
    .await;

    let flags = Sidecar::start(
        &redis.url(),
        &[
            "--redis-username",
            "sidecar",
            "--redis-password",
            ACL_PASSWORD,
        ],
    )
    .await;
    acl_scenario(&flags, &admin, "orders-flags-pipeline", Mode::Pipeline).await;
    acl_scenario(&flags, &admin, "orders-flags-atomic", Mode::Atomic).await;
    flags.stop().await;

    let in_url = Sidecar::start(&redis.url_with_auth(Some("sidecar"), ACL_PASSWORD), &[]).await;
    acl_scenario(&in_url, &admin, "orders-url-pipeline", Mode::Pipeline).await;
    acl_scenario(&in_url, &admin, "orders-url-atomic", Mode::Atomic).await;

    // A stream outside the user's patterns cannot be opened: the status says why, without the
    // password.
    let mut client = in_url.client().await;
    let status = Subscription::open(&mut client, stream_open("secret", "g", "c1", 1))
        .await
        .err()
        .expect("refused");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains("NOPERM"), "{status:?}");
    assert!(!status.message().contains(ACL_PASSWORD), "{status:?}");
    in_url.stop().await;

    // A wrong password: the subscription fails in bounded time with the refused login, without
    // echoing the password.
    let wrong = "Wr0ng-pa55word";
    let denied = Sidecar::start(
        &redis.url(),
        &[
            "--redis-username",
            "sidecar",
            "--redis-password",
            wrong,
            "--redis-timeout",
            "1s",
        ],
    )
    .await;
    let mut client = denied.client().await;
    let status = Subscription::open(&mut client, stream_open("orders", "g", "c1", 1))
        .await
        .err()
        .expect("refused");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("WRONGPASS") && status.message().contains("user \"sidecar\""),
        "says the login was refused, and for whom: {status:?}"
    );
    assert!(!status.message().contains(wrong), "{status:?}");
    denied.stop().await;
    let _ = admin.quit().await;
}

// ---------------------------------------------------------------------------------------------
// TLS
// ---------------------------------------------------------------------------------------------

fn path(p: &std::path::Path) -> String {
    p.to_string_lossy().into_owned()
}

/// TLS with a client certificate: publish and consume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_client_certificate_publishes_and_consumes() {
    let material = TlsMaterial::generate_temp();
    let server = TlsRedisServer::start(&material, true);
    let (ca, cert, key) = (
        path(&material.ca_cert),
        path(&material.client_cert),
        path(&material.client_key),
    );
    let flags = [
        "--redis-tls-ca",
        &ca,
        "--redis-tls-cert",
        &cert,
        "--redis-tls-key",
        &key,
    ];
    let sidecar = Sidecar::start(&server.url(), &flags).await;
    let mut client = sidecar.client().await;
    publish(&mut client, "orders", numbered(5)).await;
    let (mut sub, _) = Subscription::open(&mut client, atomic(stream_open("orders", "g", "c1", 5)))
        .await
        .unwrap();
    consume(&mut sub, 5, |d| {
        vec![
            command(d.slot, "INCR", &["count"]),
            command(d.slot, "SADD", &["seen", &field(d, "n")]),
        ]
    })
    .await;
    let cli = |args: &[&str]| String::from_utf8_lossy(&server.cli(args).stdout).into_owned();
    assert_eq!(cli(&["GET", "count"]).trim(), "5");
    assert_eq!(cli(&["SCARD", "seen"]).trim(), "5");
    let pending = cli(&["XPENDING", "orders", "g"]);
    assert_eq!(pending.lines().next(), Some("0"), "{pending}");
    sub.close();
    sidecar.stop().await;
}

/// Trusting the CA but presenting no client certificate to a server that requires one: the
/// subscription and Publish fail with UNAVAILABLE within the Redis timeout (no hang), nothing is
/// written, and the error says what is wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_without_the_client_certificate_fails_fast_and_says_why() {
    let material = TlsMaterial::generate_temp();
    let server = TlsRedisServer::start(&material, true);
    let ca = path(&material.ca_cert);
    let sidecar = Sidecar::start(
        &server.url(),
        &["--redis-tls-ca", &ca, "--redis-timeout", "2s"],
    )
    .await;
    let mut client = sidecar.client().await;
    let started = Instant::now();
    let status = Subscription::open(&mut client, stream_open("orders", "g", "c1", 1))
        .await
        .err()
        .expect("no subscription without a client certificate");
    let took = started.elapsed();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(took < Duration::from_secs(6), "took {took:?}");
    let publish = try_publish(&mut client, "orders", 1)
        .await
        .expect_err("no publish without a client certificate");
    assert_eq!(publish.code(), Code::Unavailable, "{publish:?}");
    let xlen = String::from_utf8_lossy(&server.cli(&["XLEN", "orders"]).stdout).into_owned();
    assert_eq!(xlen.trim(), "0", "nothing was written");
    sidecar.stop().await;

    // What an operator reads must point at the cause: the server demands a client certificate
    // (fred sees `AlertReceived(CertificateRequired)` on every attempt), not a 0 ns timeout.
    let message = status.message().to_ascii_lowercase();
    assert!(
        message.contains("certificate") || message.contains("tls"),
        "the error does not say why Redis is unreachable: {status:?} (Publish: {publish:?})"
    );
}
