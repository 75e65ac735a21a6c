//! Redis refusing a write: a retry, a delay or a dead letter whose write Redis refuses (out of
//! memory, an ACL without the write, a key of the wrong type, a script running long, writes
//! paused) never settles its entry. The flush report names the entries left pending and why,
//! the refusal counter counts them, and once Redis accepts writes again the entries come back
//! and are requeued as asked. Every form that settles in Redis, in both modes.

use std::time::Duration;

use fred::prelude::*;
use window_sidecar::proto::OutcomeKind::{DeadLetter, Retry};
use window_sidecar::proto::{self, subscribe_response::Kind};
use window_sidecar_harness::*;

/// The delay retry_after asks for: long enough that a promotion never races the checks.
const DELAY: Duration = Duration::from_secs(30);

/// What a test does to Redis between the deliveries and their outcomes, and undoes after.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    /// `maxmemory 1` with `noeviction`: every write that may grow memory is refused (OOM).
    OutOfMemory,
    /// The sidecar's user may no longer run the requeue writes (NOPERM inside the step).
    NoWrites,
    /// The sidecar's user may no longer run scripts (NOPERM for the whole step).
    NoScripts,
    /// The dead-letter key holds a string (WRONGTYPE for the dead letter only).
    DeadLetterWrongType,
    /// The delay set holds a string (WRONGTYPE for the delay only).
    DelaySetWrongType,
    /// Another script runs past `busy-reply-threshold` (BUSY for every command).
    Busy,
}

impl Fault {
    /// The slots of [retry, retry_after, dead_letter] whose requeue Redis refuses, and the
    /// refusal counter's reason for it. The step stops at the first refused write: the
    /// entries after it stay pending too.
    fn refused(self) -> (&'static [usize], &'static str) {
        match self {
            Fault::OutOfMemory => (&[0, 1, 2], "oom"),
            Fault::NoWrites => (&[0, 1, 2], "noperm"),
            Fault::NoScripts => (&[0, 1, 2], "noperm"),
            Fault::DeadLetterWrongType => (&[2], "wrongtype"),
            Fault::DelaySetWrongType => (&[1, 2], "wrongtype"),
            Fault::Busy => (&[0, 1, 2], "busy"),
        }
    }

    /// Whether Redis's error is this fault's (servers word a script's ACL refusal apart).
    fn worded(self, error: &str) -> bool {
        let codes: &[&str] = match self {
            Fault::OutOfMemory => &["OOM "],
            Fault::NoWrites | Fault::NoScripts => &[
                "NOPERM ",
                "ERR The user executing the script",
                "ERR ACL failure in script",
            ],
            Fault::DeadLetterWrongType | Fault::DelaySetWrongType => &["WRONGTYPE "],
            Fault::Busy => &["BUSY "],
        };
        codes.iter().any(|code| error.starts_with(code))
    }

    async fn apply(self, redis: &Client, port: u16, form: &Form) {
        match self {
            Fault::OutOfMemory => admin(port, &["CONFIG", "SET", "maxmemory", "1"]),
            Fault::NoWrites => admin(
                port,
                &[
                    "ACL", "SETUSER", "default", "-xadd", "-zadd", "-lpush", "-rpush",
                ],
            ),
            Fault::NoScripts => admin(port, &["ACL", "SETUSER", "default", "-eval", "-evalsha"]),
            Fault::DeadLetterWrongType => set(redis, form.dead_letter()).await,
            Fault::DelaySetWrongType => set(redis, &form.delayed()).await,
            Fault::Busy => {
                admin(port, &["CONFIG", "SET", "busy-reply-threshold", "50"]);
                // A script that runs until killed, on a connection of its own.
                std::thread::spawn(move || {
                    let mut conn = resp::Conn::connect(port).expect("connect");
                    let _ = conn.call(&["EVAL", "while true do end", "0"]);
                });
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }

    async fn undo(self, redis: &Client, port: u16, form: &Form) {
        match self {
            Fault::OutOfMemory => admin(port, &["CONFIG", "SET", "maxmemory", "0"]),
            Fault::NoWrites | Fault::NoScripts => {
                admin(port, &["ACL", "SETUSER", "default", "+@all"])
            }
            Fault::DeadLetterWrongType => del(redis, form.dead_letter()).await,
            Fault::DelaySetWrongType => del(redis, &form.delayed()).await,
            Fault::Busy => {
                let killed = resp::call(port, &["SCRIPT", "KILL"]);
                assert!(killed.is_ok(), "the long script is killed: {killed:?}");
                // The kill lands at the script's next check: wait until Redis serves again.
                let served = eventually(STEP, || async { resp::call(port, &["PING"]).is_ok() });
                assert!(served.await, "Redis serves again after SCRIPT KILL");
            }
        }
    }
}

/// An admin command on the test's Redis, which must succeed.
fn admin(port: u16, args: &[&str]) {
    if let Err(err) = resp::call(port, args) {
        panic!("{args:?}: {err}");
    }
}

async fn set(redis: &Client, key: &str) {
    let _: () = redis
        .set(key, "clobbered", None, None, false)
        .await
        .unwrap();
}

async fn del(redis: &Client, key: &str) {
    let _: i64 = redis.del(key).await.unwrap();
}

/// The form under test: its open, how entries get in, and where its requeues go.
#[derive(Clone, Copy, Debug)]
enum Form {
    Stream,
    ReliableList,
}

impl Form {
    fn open(self, mode: proto::Mode) -> proto::Open {
        let base = match self {
            Form::Stream => stream_open("orders", "g", "c", 3),
            Form::ReliableList => proto::Open {
                source: Some(proto::open::Source::ReliableList(
                    proto::ReliableListSource {
                        key: "orders".into(),
                        consumer: "c".into(),
                        ..Default::default()
                    },
                )),
                count: 3,
                block: Some(duration(Duration::from_millis(200))),
                ..Default::default()
            },
        };
        let target = match self {
            Form::Stream => proto::dead_letter::Target::Stream(self.dead_letter().into()),
            Form::ReliableList => proto::dead_letter::Target::List(self.dead_letter().into()),
        };
        proto::Open {
            mode: mode as i32,
            max_deliveries: 10,
            dead_letter: Some(proto::DeadLetter {
                target: Some(target),
            }),
            ..base
        }
    }

    fn dead_letter(self) -> &'static str {
        "{orders}:dead"
    }

    fn delayed(self) -> String {
        "{orders}:window:delayed".to_owned()
    }

    async fn add(self, redis: &Client, values: &[&str]) {
        for value in values {
            match self {
                Form::Stream => {
                    let _: String = redis
                        .xadd("orders", false, None, "*", ("_payload", *value))
                        .await
                        .unwrap();
                }
                Form::ReliableList => {
                    let _: i64 = redis.lpush("orders", *value).await.unwrap();
                }
            }
        }
    }

    /// Entries this consumer still holds: pending in the group, or on the processing list.
    async fn held(self, redis: &Client) -> u64 {
        match self {
            Form::Stream => pending(redis, "orders", "g").await,
            Form::ReliableList => redis
                .llen::<u64, _>("{orders}:window:processing:c")
                .await
                .unwrap(),
        }
    }

    /// Entries in the source (a stream's length, or a list's values waiting).
    async fn length(self, redis: &Client) -> u64 {
        match self {
            Form::Stream => redis.xlen("orders").await.unwrap(),
            Form::ReliableList => redis.llen("orders").await.unwrap(),
        }
    }

    async fn dead_letters(self, redis: &Client) -> u64 {
        let key = self.dead_letter();
        match redis.r#type::<String, _>(key).await.unwrap().as_str() {
            "stream" => redis.xlen(key).await.unwrap(),
            "list" => redis.llen(key).await.unwrap(),
            _ => 0,
        }
    }

    async fn delayed_members(self, redis: &Client) -> u64 {
        match redis
            .r#type::<String, _>(self.delayed())
            .await
            .unwrap()
            .as_str()
        {
            "zset" => redis.zcard(self.delayed()).await.unwrap(),
            _ => 0,
        }
    }
}

/// Three deliveries answered retry, retry_after and dead_letter.
fn requeues(read: &proto::Read) -> Vec<proto::Outcome> {
    let slots: Vec<u64> = read.deliveries.iter().map(|d| d.slot).collect();
    vec![
        outcome(slots[0], Retry),
        retry_after(slots[1], DELAY),
        outcome(slots[2], DeadLetter),
    ]
}

/// Reads until `n` deliveries came, in as many reads as the sidecar makes.
async fn deliveries(sub: &mut Subscription, n: usize) -> proto::Read {
    let mut all = proto::Read::default();
    while all.deliveries.len() < n {
        let read = sub.read().await;
        all.deliveries.extend(read.deliveries);
    }
    all
}

/// The report names the entries whose requeue was refused, with Redis's error, and the
/// counter counts them under the fault's reason.
async fn refused_as_reported(
    report: &proto::FlushReport,
    read: &proto::Read,
    fault: Fault,
    metrics: &str,
) {
    let (refused_at, reason) = fault.refused();
    let refused_slots: Vec<u64> = report.requeue_refused.iter().map(|r| r.slot).collect();
    let expected: Vec<u64> = refused_at
        .iter()
        .map(|&i| read.deliveries[i].slot)
        .collect();
    assert_eq!(refused_slots, expected, "{report:?}");
    for refusal in &report.requeue_refused {
        assert!(fault.worded(&refusal.error), "{refusal:?}");
        // A stream's entry id; a list value has none, on either side.
        let delivery = read.deliveries.iter().find(|d| d.slot == refusal.slot);
        assert_eq!(refusal.entry_id, delivery.unwrap().entry_id);
    }
    let exposition = scrape(metrics).await;
    let counted = metric_sum(
        &exposition,
        "window_sidecar_requeue_refused_total",
        &format!("reason=\"{reason}\""),
    );
    assert_eq!(counted, refused_at.len() as f64, "{exposition}");
}

/// The whole story for one form, mode and fault: the refused requeues leave every entry held
/// and nothing written; once Redis takes writes again the entries come back with a higher
/// count, and their requeues are written as asked.
async fn refused_requeues_stay_pending(form: Form, mode: proto::Mode, fault: Fault) {
    let redis = RedisServer::start();
    let metrics = format!("127.0.0.1:{}", free_port());
    let sidecar = Sidecar::start(&redis.url(), &["--metrics-listen", &metrics]).await;
    let inspect = redis.client().await;
    let mut client = sidecar.client().await;
    form.add(&inspect, &["a", "b", "c"]).await;
    let (mut sub, _) = Subscription::open(&mut client, form.open(mode))
        .await
        .unwrap();
    let read = deliveries(&mut sub, 3).await;
    let values: Vec<String> = read.deliveries.iter().map(value).collect();
    assert_eq!(values, ["a", "b", "c"]);

    fault.apply(&inspect, redis.port(), &form).await;
    sub.send(vec![], requeues(&read)).await;
    let report = sub.flush().await;
    let (refused_at, _) = fault.refused();
    fault.undo(&inspect, redis.port(), &form).await;

    // The report names the entries whose requeue was refused, with Redis's error.
    assert!(!report.ok, "{report:?}");
    assert!(report.settle_failed, "{report:?}");
    if fault == Fault::Busy && report.error.starts_with("not sent") {
        // A server that answers BUSY to the client's health check too (Valkey 9.1) has the
        // connection dropped and the flush not sent at all: refused by nobody, every entry
        // still pending, which is what the rest checks.
        assert!(report.requeue_refused.is_empty(), "{report:?}");
    } else {
        refused_as_reported(&report, &read, fault, &metrics).await;
    }

    // Only what Redis accepted was written: the refused entries have no copy, no delay-set
    // member and no dead letter, and they are still this consumer's.
    let written = |i: usize| !refused_at.contains(&i);
    let (copies, refused) = (u64::from(written(0)), refused_at.len() as u64);
    assert_eq!(form.delayed_members(&inspect).await, u64::from(written(1)));
    assert_eq!(form.dead_letters(&inspect).await, u64::from(written(2)));
    // A copy written may be read already (then it is held too).
    let held = form.held(&inspect).await;
    assert!(held == refused || held == refused + copies, "held {held}");
    match form {
        Form::Stream => assert_eq!(form.length(&inspect).await, 3 + copies),
        Form::ReliableList => {
            assert_eq!(form.length(&inspect).await + held, refused + copies)
        }
    }

    // They come back, counted once more, and are requeued as asked now that Redis takes them.
    // The retry's copy, written then or now, comes back once and is acked.
    let mut left: Vec<String> = refused_at.iter().map(|&i| values[i].clone()).collect();
    let mut copies = 0;
    while !left.is_empty() || copies == 0 {
        let read = sub.read().await;
        let mut outcomes = Vec::new();
        for delivery in &read.deliveries {
            let value = value(delivery);
            let Some(at) = left.iter().position(|v| *v == value) else {
                assert_eq!(value, "a", "only the retry is copied: {delivery:?}");
                copies += 1;
                outcomes.push(outcome(delivery.slot, proto::OutcomeKind::Ack));
                continue;
            };
            left.remove(at);
            assert_eq!(delivery.delivery_count, 2, "{delivery:?}");
            outcomes.push(match values.iter().position(|v| *v == value) {
                Some(0) => outcome(delivery.slot, Retry),
                Some(1) => retry_after(delivery.slot, DELAY),
                _ => outcome(delivery.slot, DeadLetter),
            });
        }
        sub.send(vec![], outcomes).await;
        let report = sub.flush().await;
        assert!(report.ok && report.requeue_refused.is_empty(), "{report:?}");
    }
    // Each requeue written once: one copy (read and acked above), one delay-set member, one
    // dead letter; nothing else comes, and nothing is held.
    assert_eq!(copies, 1);
    assert_eq!(form.delayed_members(&inspect).await, 1);
    assert_eq!(form.dead_letters(&inspect).await, 1);
    assert!(
        sub.message_within(Duration::from_millis(600))
            .await
            .is_none(),
        "nothing more is delivered"
    );
    assert_eq!(form.held(&inspect).await, 0);
    sub.close();
    sidecar.stop().await;
}

#[tokio::test]
async fn out_of_memory_stream() {
    refused_requeues_stay_pending(Form::Stream, proto::Mode::Pipeline, Fault::OutOfMemory).await;
}

#[tokio::test]
async fn out_of_memory_stream_atomic() {
    refused_requeues_stay_pending(Form::Stream, proto::Mode::Atomic, Fault::OutOfMemory).await;
}

#[tokio::test]
async fn out_of_memory_reliable_list() {
    refused_requeues_stay_pending(
        Form::ReliableList,
        proto::Mode::Pipeline,
        Fault::OutOfMemory,
    )
    .await;
}

#[tokio::test]
async fn out_of_memory_reliable_list_atomic() {
    refused_requeues_stay_pending(Form::ReliableList, proto::Mode::Atomic, Fault::OutOfMemory)
        .await;
}

#[tokio::test]
async fn no_permission_for_the_writes_stream() {
    refused_requeues_stay_pending(Form::Stream, proto::Mode::Pipeline, Fault::NoWrites).await;
}

#[tokio::test]
async fn no_permission_for_the_writes_reliable_list() {
    refused_requeues_stay_pending(Form::ReliableList, proto::Mode::Atomic, Fault::NoWrites).await;
}

#[tokio::test]
async fn no_permission_for_scripts_stream() {
    refused_requeues_stay_pending(Form::Stream, proto::Mode::Atomic, Fault::NoScripts).await;
}

#[tokio::test]
async fn no_permission_for_scripts_reliable_list() {
    refused_requeues_stay_pending(Form::ReliableList, proto::Mode::Pipeline, Fault::NoScripts)
        .await;
}

#[tokio::test]
async fn dead_letter_of_the_wrong_type_stream() {
    refused_requeues_stay_pending(
        Form::Stream,
        proto::Mode::Pipeline,
        Fault::DeadLetterWrongType,
    )
    .await;
}

#[tokio::test]
async fn dead_letter_of_the_wrong_type_reliable_list() {
    refused_requeues_stay_pending(
        Form::ReliableList,
        proto::Mode::Atomic,
        Fault::DeadLetterWrongType,
    )
    .await;
}

#[tokio::test]
async fn delay_set_of_the_wrong_type_stream() {
    refused_requeues_stay_pending(Form::Stream, proto::Mode::Atomic, Fault::DelaySetWrongType)
        .await;
}

#[tokio::test]
async fn delay_set_of_the_wrong_type_reliable_list() {
    refused_requeues_stay_pending(
        Form::ReliableList,
        proto::Mode::Pipeline,
        Fault::DelaySetWrongType,
    )
    .await;
}

#[tokio::test]
async fn a_long_script_stream() {
    refused_requeues_stay_pending(Form::Stream, proto::Mode::Pipeline, Fault::Busy).await;
}

#[tokio::test]
async fn a_long_script_reliable_list() {
    refused_requeues_stay_pending(Form::ReliableList, proto::Mode::Atomic, Fault::Busy).await;
}

/// Writes paused (`CLIENT PAUSE … WRITE`, as during a failover's hand-over): the requeue step
/// waits for the pause to end and then runs whole; nothing is refused or lost.
#[tokio::test]
async fn paused_writes_delay_the_requeues_and_lose_nothing() {
    for form in [Form::Stream, Form::ReliableList] {
        let redis = RedisServer::start();
        let sidecar = Sidecar::start(&redis.url(), &[]).await;
        let inspect = redis.client().await;
        let mut client = sidecar.client().await;
        form.add(&inspect, &["a", "b", "c"]).await;
        let (mut sub, _) = Subscription::open(&mut client, form.open(proto::Mode::Pipeline))
            .await
            .unwrap();
        let read = deliveries(&mut sub, 3).await;
        admin(redis.port(), &["CLIENT", "PAUSE", "1000", "WRITE"]);
        sub.send(vec![], requeues(&read)).await;
        let report = sub.flush().await;
        assert!(
            report.ok && report.requeue_refused.is_empty(),
            "{form:?}: {report:?}"
        );
        assert_eq!(form.delayed_members(&inspect).await, 1, "{form:?}");
        assert_eq!(form.dead_letters(&inspect).await, 1, "{form:?}");
        let copy = deliveries(&mut sub, 1).await;
        assert_eq!(value(&copy.deliveries[0]), "a", "{form:?}");
        let slot = copy.deliveries[0].slot;
        sub.send(vec![], vec![outcome(slot, proto::OutcomeKind::Ack)])
            .await;
        assert!(sub.flush().await.ok);
        assert_eq!(form.held(&inspect).await, 0, "{form:?}");
        sub.close();
        sidecar.stop().await;
    }
}

/// A script cache flushed under the sidecar (`SCRIPT FLUSH`) costs nothing: the requeue step
/// is sent with its text, and the promotion of due delays loads its script again.
#[tokio::test]
async fn a_flushed_script_cache_refuses_nothing() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let inspect = redis.client().await;
    let mut client = sidecar.client().await;
    Form::Stream.add(&inspect, &["a", "b"]).await;
    let (mut sub, _) = Subscription::open(&mut client, Form::Stream.open(proto::Mode::Pipeline))
        .await
        .unwrap();
    let read = deliveries(&mut sub, 2).await;
    admin(redis.port(), &["SCRIPT", "FLUSH"]);
    let outcomes = vec![
        outcome(read.deliveries[0].slot, Retry),
        retry_after(read.deliveries[1].slot, Duration::from_millis(100)),
    ];
    sub.send(vec![], outcomes).await;
    let report = sub.flush().await;
    assert!(report.ok && report.requeue_refused.is_empty(), "{report:?}");
    let mut back: Vec<String> = Vec::new();
    while back.len() < 2 {
        match sub.next().await.unwrap() {
            Some(Kind::Read(read)) => {
                back.extend(read.deliveries.iter().map(value));
                let acks = read
                    .deliveries
                    .iter()
                    .map(|d| outcome(d.slot, proto::OutcomeKind::Ack))
                    .collect();
                sub.send(vec![], acks).await;
            }
            Some(Kind::Flush(report)) => assert!(report.ok, "{report:?}"),
            other => panic!("unexpected {other:?}"),
        }
    }
    back.sort();
    assert_eq!(back, ["a", "b"]);
    sub.close();
    sidecar.stop().await;
}

/// A promotion of due delays that Redis refuses keeps its member: out of memory (the script is
/// refused whole) and an ACL without `XADD` (the copy is refused inside it), each held past the
/// delay's due time; once Redis takes the write the entry comes back, once.
#[tokio::test]
async fn a_refused_promotion_keeps_the_delayed_entry() {
    for (fault, undo) in [
        (
            &["CONFIG", "SET", "maxmemory", "1"][..],
            &["CONFIG", "SET", "maxmemory", "0"][..],
        ),
        (
            &["ACL", "SETUSER", "default", "-xadd"][..],
            &["ACL", "SETUSER", "default", "+@all"][..],
        ),
    ] {
        let redis = RedisServer::start();
        let sidecar = Sidecar::start(&redis.url(), &[]).await;
        let inspect = redis.client().await;
        let mut client = sidecar.client().await;
        let form = Form::Stream;
        form.add(&inspect, &["a"]).await;
        let (mut sub, _) = Subscription::open(&mut client, form.open(proto::Mode::Pipeline))
            .await
            .unwrap();
        let read = deliveries(&mut sub, 1).await;
        let slot = read.deliveries[0].slot;
        sub.send(vec![], vec![retry_after(slot, Duration::from_millis(200))])
            .await;
        assert!(sub.flush().await.ok);
        admin(redis.port(), fault);
        // Well past the due time, with a promotion every 100 ms: still delayed.
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert_eq!(form.delayed_members(&inspect).await, 1, "{fault:?}");
        assert_eq!(form.length(&inspect).await, 1, "{fault:?}");
        admin(redis.port(), undo);
        let back = deliveries(&mut sub, 1).await;
        assert_eq!(value(&back.deliveries[0]), "a", "{fault:?}");
        assert_eq!(back.deliveries[0].delivery_count, 2, "{fault:?}");
        assert_eq!(form.delayed_members(&inspect).await, 0, "{fault:?}");
        assert_eq!(form.length(&inspect).await, 2, "{fault:?}");
        sub.close();
        sidecar.stop().await;
    }
}

/// The binary's warning for a refused requeue carries what an operator needs to act: the
/// subscription, the first entry left pending and Redis's error (documented fields).
// Multi-threaded: the harness waits for the binary's exit on this thread, while the dropped
// stream's connection closes on another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_requeue_is_logged_with_the_subscription_the_entry_and_the_error() {
    let redis = RedisServer::start();
    let listen = format!("127.0.0.1:{}", free_port());
    let mut sidecar = Launch::new()
        .args([
            "--redis-url",
            &redis.url(),
            "--listen",
            &listen,
            "--log-format",
            "json",
            "--shutdown-grace",
            "2s",
        ])
        .env("RUST_LOG", "info")
        .capture_stdout()
        .start();
    sidecar.wait_for("Redis answers: SERVING");
    let inspect = redis.client().await;
    let mut client = connect_client(&listen).await;
    Form::Stream.add(&inspect, &["a", "b", "c"]).await;
    let open = Form::Stream.open(proto::Mode::Pipeline);
    let (mut sub, _) = Subscription::open(&mut client, open).await.unwrap();
    let read = deliveries(&mut sub, 3).await;
    admin(redis.port(), &["CONFIG", "SET", "maxmemory", "1"]);
    sub.send(vec![], requeues(&read)).await;
    assert!(!sub.flush().await.ok);
    admin(redis.port(), &["CONFIG", "SET", "maxmemory", "0"]);
    let line: serde_json::Value =
        serde_json::from_str(&sidecar.wait_for("Redis refused to write a retry")).unwrap();
    assert_eq!(line["level"], "WARN", "{line}");
    assert_eq!(line["subscription"], "orders/g", "{line}");
    assert_eq!(line["entries"], 3, "{line}");
    assert_eq!(
        line["entry_id"],
        read.deliveries[0].entry_id.as_str(),
        "{line}"
    );
    assert_eq!(line["slot"], read.deliveries[0].slot, "{line}");
    assert!(
        line["error"].as_str().unwrap().starts_with("OOM "),
        "{line}"
    );
    drop((sub, client));
    sidecar.terminate();
}
