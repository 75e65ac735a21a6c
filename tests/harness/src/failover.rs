//! A client that keeps going through failovers ([`FailoverWorker`]), and the evidence a
//! failover test prints when an entry's side effects apply twice: the commands the node that
//! took over executed ([`Monitor`]), which transaction ran where and when.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fred::prelude::*;
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use window_sidecar::proto;
use window_sidecar::proto::subscribe_response::Kind;
use window_sidecar::proto::window_service_client::WindowServiceClient;

use crate::{STEP, Subscription, ack_read, command, eventually, field, resp};

/// Seconds since the Unix epoch, as MONITOR prints them.
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64()
}

/// XPENDING's count, or `None` while Redis cannot answer (during a failover).
pub async fn try_pending(client: &Client, key: &str, group: &str) -> Option<u64> {
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

/// `redis-cli MONITOR` on one node: every command it executes (its clients' and, on a
/// replica, the ones its primary replicates), as `<unix time> [<db> <client>] "NAME" …` lines.
/// The process is killed by pid on drop.
pub struct Monitor {
    child: std::process::Child,
    lines: Arc<Mutex<Vec<String>>>,
}

/// One MONITOR line.
#[derive(Debug)]
pub struct Seen {
    pub at: f64,
    pub client: String,
    pub command: String,
}

impl Monitor {
    pub fn start(port: u16) -> Self {
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

    pub fn seen(&self) -> Vec<Seen> {
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

/// A reader of a subscription that behaves like a real client: it acks every delivery with
/// `INCR <counter>` and `SADD <seen> <n>` and reopens with the same consumer whenever the
/// stream ends or fails, until told to stop. While held, it keeps the read in hand unanswered
/// (a client busy with its deliveries).
pub struct FailoverWorker {
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicU64>,
    hold: Arc<AtomicBool>,
    /// A read is in hand, unanswered, because of `hold`.
    holding: Arc<AtomicBool>,
    task: JoinHandle<WorkerLog>,
}

#[derive(Debug, Default)]
pub struct WorkerLog {
    pub opens: u32,
    pub open_errors: Vec<String>,
    pub stream_ends: Vec<String>,
    /// Deliveries per `n`.
    pub delivered: BTreeMap<u64, u32>,
    /// Entry ids of each read, by (subscription stream, read id).
    pub reads: BTreeMap<(u32, u64), Vec<String>>,
    pub flushes: u32,
    /// Failed flush reports, with when (unix seconds) the client got them and on which
    /// subscription stream.
    pub failed_flushes: Vec<(f64, u32, proto::FlushReport)>,
    pub rejections: Vec<String>,
}

impl WorkerLog {
    /// One line: opens, failed flushes, redeliveries.
    pub fn summary(&self) -> String {
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
    pub fn settle_failed_but_not_delivered_again(&self) -> Vec<(u64, Vec<String>)> {
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

    pub fn redelivered(&self) -> Vec<u64> {
        self.delivered
            .iter()
            .filter(|&(_, &times)| times > 1)
            .map(|(&n, _)| n)
            .collect()
    }
}

impl FailoverWorker {
    pub fn spawn(
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

    pub fn acked(&self) -> u64 {
        self.acked.load(Ordering::SeqCst)
    }

    /// Waits until at least `acks` deliveries are acked, then until the worker holds its next
    /// read unanswered.
    pub async fn hold_after(&self, acks: u64) {
        let started = eventually(Duration::from_secs(10), || async { self.acked() >= acks }).await;
        assert!(started, "the run started");
        self.hold.store(true, Ordering::SeqCst);
        let holding = eventually(STEP, || async { self.holding.load(Ordering::SeqCst) }).await;
        assert!(holding, "the worker holds a read");
    }

    /// Answers the read in hand and goes on.
    pub fn release(&self) {
        self.hold.store(false, Ordering::SeqCst);
    }

    pub async fn stop(self) -> WorkerLog {
        self.stop.store(true, Ordering::SeqCst);
        tokio::time::timeout(Duration::from_secs(20), self.task)
            .await
            .expect("the worker stops")
            .expect("the worker did not panic")
    }
}

/// Waits until `entries` distinct entries are in `seen` and nothing is pending, lets the worker
/// go on a little longer (a duplicate delivery would show now), and stops it.
pub async fn settle_all(
    inspect: &Client,
    worker: FailoverWorker,
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
pub fn failover_evidence(
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
pub fn assert_exactly_once(
    count: i64,
    entries: i64,
    log: &WorkerLog,
    evidence: impl Fn() -> String,
) {
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
