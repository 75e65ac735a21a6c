//! Redis refusing a write: a retry, a delay or a dead letter whose write Redis refuses (out of
//! memory, an ACL without the write, a key of the wrong type, a script running long, writes
//! paused, a primary turned replica, a cluster slot on the move) never settles its entry. The
//! flush report names the entries left pending and why, the refusal counter counts them, and
//! once Redis accepts writes again the entries come back and are requeued as asked. Every form
//! that requeues, in both modes: a simple list's entries, which left Redis when popped, are
//! held by the sidecar and pushed back once Redis takes them. A stream's retries write no copy:
//! they stay pending in their group, their due time in the group's delay set; a refused one is
//! a failed command of the flush (not a refused requeue: nothing was to be written elsewhere),
//! and the entry, still pending, comes back all the same.

use std::collections::VecDeque;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fred::prelude::*;
use window_sidecar::proto::OutcomeKind::{self, Ack, DeadLetter, Retry, RetryAfter};
use window_sidecar::proto::{self, subscribe_response::Kind};
use window_sidecar_harness::*;

/// The delay retry_after asks for: long enough that a promotion never races the checks.
const DELAY: Duration = Duration::from_secs(30);

/// The delay a stream's retry_after asks for: its entry stays pending in its group and comes
/// back when due, which the stream's stories wait for.
const STREAM_DELAY: Duration = Duration::from_millis(1500);

/// The delay set of copies an earlier version wrote for a stream's retry_after (`{key}:window:
/// delayed`), still promoted after an upgrade; the stream's retries write nothing to it now.
const SHARED_DELAYED: &str = "{orders}:window:delayed";

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

    /// On a stream, the slots of [retry, retry_after, dead_letter] whose write Redis refuses:
    /// a retry kept in place writes only its group's pending entry (`XCLAIM`) and, for a
    /// retry_after, the group's delay set (`ZADD`); the dead letter is the requeue step's.
    /// Each is a command of its own: one refused leaves the others as written.
    fn refused_on_stream(self) -> &'static [usize] {
        match self {
            Fault::OutOfMemory | Fault::NoScripts | Fault::Busy => &[0, 1, 2],
            // The ACL keeps XCLAIM (and ZREM): only the ZADD and the XADD are refused.
            Fault::NoWrites => &[1, 2],
            Fault::DeadLetterWrongType => &[2],
            // A plain retry's removal of an earlier due time may fail and the retry goes on.
            Fault::DelaySetWrongType => &[1],
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
    /// Entries leave Redis when popped: the sidecar holds the refused ones and pushes them
    /// back once Redis takes that write.
    SimpleList,
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
            Form::SimpleList => proto::Open {
                source: Some(proto::open::Source::SimpleList(proto::SimpleListSource {
                    key: "orders".into(),
                })),
                count: 3,
                block: Some(duration(Duration::from_millis(200))),
                ..Default::default()
            },
        };
        let target = match self {
            Form::Stream => proto::dead_letter::Target::Stream(self.dead_letter().into()),
            Form::ReliableList | Form::SimpleList => {
                proto::dead_letter::Target::List(self.dead_letter().into())
            }
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

    /// Where a retry_after's due time goes: a list's delay set (of copies), a stream group's
    /// delay set (of the ids of its entries kept pending).
    fn delayed(self) -> String {
        match self {
            Form::Stream => "{orders}:window:delayed:g".to_owned(),
            Form::ReliableList | Form::SimpleList => "{orders}:window:delayed".to_owned(),
        }
    }

    /// The delay its retry_after asks for: a stream's entry stays pending until then and the
    /// stories wait it out.
    fn delay(self) -> Duration {
        match self {
            Form::Stream => STREAM_DELAY,
            Form::ReliableList | Form::SimpleList => DELAY,
        }
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
                Form::ReliableList | Form::SimpleList => {
                    let _: i64 = redis.lpush("orders", *value).await.unwrap();
                }
            }
        }
    }

    /// Entries this consumer still holds in Redis: pending in the group, or on the processing
    /// list (a simple list's are held by the sidecar alone).
    async fn held(self, redis: &Client) -> u64 {
        match self {
            Form::Stream => pending(redis, "orders", "g").await,
            Form::ReliableList => redis
                .llen::<u64, _>("{orders}:window:processing:c")
                .await
                .unwrap(),
            Form::SimpleList => 0,
        }
    }

    /// Entries in the source (a stream's length, or a list's values waiting).
    async fn length(self, redis: &Client) -> u64 {
        match self {
            Form::Stream => redis.xlen("orders").await.unwrap(),
            Form::ReliableList | Form::SimpleList => redis.llen("orders").await.unwrap(),
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

/// Three deliveries answered retry, retry_after (the form's delay) and dead_letter.
fn requeues(form: Form, read: &proto::Read) -> Vec<proto::Outcome> {
    let slots: Vec<u64> = read.deliveries.iter().map(|d| d.slot).collect();
    vec![
        outcome(slots[0], Retry),
        retry_after(slots[1], form.delay()),
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

/// The report names the entries whose requeue was refused (those at `refused_at` in the
/// read), with Redis's error, and the counter counts them under the fault's reason.
async fn refused_as_reported(
    report: &proto::FlushReport,
    read: &proto::Read,
    fault: Fault,
    refused_at: &[usize],
    metrics: &str,
) {
    let (_, reason) = fault.refused();
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

/// The whole story for one list form, mode and fault: the refused requeues leave every entry
/// held and nothing written; once Redis takes writes again the entries come back with a higher
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
    sub.send(vec![], requeues(form, &read)).await;
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
        refused_as_reported(&report, &read, fault, refused_at, &metrics).await;
    }

    // Only what Redis accepted was written: the refused entries have no copy, no delay-set
    // member and no dead letter, and they are still this consumer's.
    let written = |i: usize| !refused_at.contains(&i);
    let (copies, refused) = (u64::from(written(0)), refused_at.len() as u64);
    assert_eq!(form.delayed_members(&inspect).await, u64::from(written(1)));
    assert_eq!(form.dead_letters(&inspect).await, u64::from(written(2)));
    // A copy written may be read already (then it is held too).
    let held = form.held(&inspect).await;
    if !matches!(form, Form::SimpleList) {
        assert!(held == refused || held == refused + copies, "held {held}");
    }
    match form {
        Form::Stream => unreachable!("a stream's story: refused_retries_stay_pending_in_the_group"),
        Form::ReliableList => {
            assert_eq!(form.length(&inspect).await + held, refused + copies)
        }
        // Refused entries the sidecar gave back already wait in the list, or were read.
        Form::SimpleList => assert!(form.length(&inspect).await <= refused + copies),
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

/// The whole story for a stream, one mode and fault. A retry and a retry_after stay pending
/// in their group (`KEEP_IN_PLACE`), a dead letter goes through the requeue step: what Redis
/// refuses of them leaves that entry pending and writes nothing (the dead letter a refused
/// requeue, the others a failed command of the flush), what it takes is written as asked, and
/// nothing is appended to the stream. Once Redis takes writes again every entry comes back
/// (the same three, by id) and each ends as asked, exactly once: the retry delivered again,
/// the retry_after again when due and not before, its due time in the group's delay set, the
/// dead letter written once; nothing else delivered, nothing left pending.
async fn refused_retries_stay_pending_in_the_group(mode: proto::Mode, fault: Fault) {
    let form = Form::Stream;
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
    let (asked, asked_ms) = (Instant::now(), unix_ms());
    sub.send(vec![], requeues(form, &read)).await;
    let report = sub.flush().await;
    let replied_ms = unix_ms();
    fault.undo(&inspect, redis.port(), &form).await;

    assert!(!report.ok, "{report:?}");
    let mut refused_at = fault.refused_on_stream();
    if fault == Fault::Busy && report.error.starts_with("not sent") {
        // A server that answers BUSY to the client's health check too (Valkey 9.1; Redis 7.0
        // now and then) has the connection dropped and the flush not sent at all: refused by
        // nobody, every entry still pending, which is what the rest checks.
        assert!(report.requeue_refused.is_empty(), "{report:?}");
        refused_at = &[0, 1, 2];
    } else {
        // One failed command per refused write, each with the fault's error, and each a
        // refused requeue: the dead letter's step comes first in the flush, then the retries
        // kept in place. Only the dead letter's refusal leaves the read's settle undone.
        assert_eq!(report.failed as usize, refused_at.len(), "{report:?}");
        assert!(fault.worded(&report.error), "{report:?}");
        let dead_letter_refused = refused_at.contains(&2);
        assert_eq!(report.settle_failed, dead_letter_refused, "{report:?}");
        let in_flush_order: Vec<usize> = [2, 0, 1]
            .into_iter()
            .filter(|i| refused_at.contains(i))
            .collect();
        refused_as_reported(&report, &read, fault, &in_flush_order, &metrics).await;
    }

    // Only what Redis accepted was written, and nothing anywhere else: no copy in the stream
    // or in the delay set of copies, a due time only for a retry_after Redis took, a dead
    // letter only if Redis took it. Every entry but a written dead letter is still pending.
    let taken = [0, 1, 2].map(|i| !refused_at.contains(&i));
    assert_eq!(form.length(&inspect).await, 3, "nothing appended");
    assert_eq!(zcard(&inspect, SHARED_DELAYED).await, 0);
    if taken[1] {
        let id = &read.deliveries[1].entry_id;
        due_time_written(&inspect, &form.delayed(), id, (asked_ms, replied_ms)).await;
    } else {
        assert_eq!(form.delayed_members(&inspect).await, 0);
    }
    assert_eq!(form.dead_letters(&inspect).await, u64::from(taken[2]));
    assert_eq!(form.held(&inspect).await, 3 - u64::from(taken[2]));

    // Every entry comes back and ends as asked; after a settle that failed, the re-read that
    // brings them back counts a delivery of its own.
    let reread = report.settle_failed;
    stream_entries_come_back_as_asked(&mut sub, &inspect, &read, (taken, reread), asked).await;
    assert_eq!(form.length(&inspect).await, 3, "nothing appended");
    assert_eq!(form.dead_letters(&inspect).await, 1);
    assert_eq!(form.held(&inspect).await, 0);
    assert_eq!(zcard(&inspect, SHARED_DELAYED).await, 0);
    due_times_leave_once_settled(&inspect, &form.delayed(), 0).await;
    sub.close();
    sidecar.stop().await;
}

/// Now, in Unix milliseconds: the clock of the due times Redis writes (the tests' servers run
/// on this machine).
fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A sorted set's size; 0 when it does not exist.
async fn zcard(redis: &Client, key: &str) -> u64 {
    redis.zcard(key).await.unwrap()
}

/// The group's delay set `due_set` holds the stream's retry_after entry `id`, and nothing else
/// but a test's `marker`, scored by its due time: Redis's clock when the flush ran, between
/// `sent` and `replied` (Unix ms), plus [`STREAM_DELAY`].
async fn due_time_written(redis: &Client, due_set: &str, id: &str, (sent, replied): (u64, u64)) {
    let members: Vec<(String, f64)> = redis
        .zrange(due_set, 0, -1, None, false, None, true)
        .await
        .unwrap();
    let ours: Vec<&(String, f64)> = members.iter().filter(|(m, _)| m != "marker").collect();
    assert_eq!(
        ours.len(),
        1,
        "one due time, the retry_after's: {members:?}"
    );
    assert_eq!(ours[0].0, id, "{members:?}");
    let delay = STREAM_DELAY.as_millis() as u64;
    let due = ours[0].1 as u64;
    assert!(
        (sent + delay..=replied + delay).contains(&due),
        "due at {due}, asked between {sent} and {replied} for {delay} ms later"
    );
}

/// Once its entry is settled, a due time leaves the group's delay set (the promotion drops the
/// members of entries no longer pending): `left` members stay (a test's markers).
async fn due_times_leave_once_settled(redis: &Client, due_set: &str, left: u64) {
    let gone = eventually(STEP, || async { zcard(redis, due_set).await == left });
    assert!(
        gone.await,
        "{} members left in {due_set}",
        zcard(redis, due_set).await
    );
}

/// What each of a stream's three entries (the read's, answered retry, retry_after and
/// dead_letter) is answered each time it comes back, until it is done as first asked. An
/// entry whose write Redis took (`taken`) ends as asked: a retry or a retry_after comes back
/// once more and is acked, a dead letter never comes back. One whose write Redis refused is
/// asked the same again first.
fn stream_answers(taken: [bool; 3]) -> [VecDeque<OutcomeKind>; 3] {
    let again = |i: usize, kind: OutcomeKind| (!taken[i]).then_some(kind);
    [
        again(0, Retry).into_iter().chain([Ack]).collect(),
        again(1, RetryAfter).into_iter().chain([Ack]).collect(),
        again(2, DeadLetter).into_iter().collect(),
    ]
}

/// A stream's three entries (`first`'s, answered retry, retry_after and dead_letter in a flush
/// sent at `asked`, of whose writes Redis took those `taken` says) come back until each is
/// done as asked ([`stream_answers`]): the same entries by id, no copy; each counted once more
/// than its previous delivery, never less, and on its first return after a flush whose settle
/// failed (`reread`) perhaps one more still (the re-read that brings it back, `XREADGROUP …
/// 0`, counts a delivery of its own); a retry_after whose due time Redis took not before it,
/// its due time in the group's delay set. Nothing else is delivered.
async fn stream_entries_come_back_as_asked(
    sub: &mut Subscription,
    redis: &Client,
    first: &proto::Read,
    (taken, reread): ([bool; 3], bool),
    asked: Instant,
) {
    let mut answers = stream_answers(taken);
    let mut counts: Vec<u32> = first.deliveries.iter().map(|d| d.delivery_count).collect();
    let mut reread = [reread; 3];
    let mut not_before = [None, taken[1].then_some(asked + STREAM_DELAY), None];
    while answers.iter().any(|a| !a.is_empty()) {
        let read = sub.read().await;
        let mut outcomes = Vec::new();
        let mut delayed = None;
        for delivery in &read.deliveries {
            let at = first
                .deliveries
                .iter()
                .position(|d| d.entry_id == delivery.entry_id);
            let Some(i) = at else {
                panic!("only the three entries come back, never a copy: {delivery:?}");
            };
            assert_eq!(value(delivery), value(&first.deliveries[i]), "{delivery:?}");
            let Some(answer) = answers[i].pop_front() else {
                panic!("delivered again once done: {delivery:?}");
            };
            let counted = counts[i] + 1;
            let ahead = u32::from(std::mem::take(&mut reread[i]));
            assert!(
                (counted..=counted + ahead).contains(&delivery.delivery_count),
                "{delivery:?}: counted {counted} (up to {ahead} more after a re-read)"
            );
            counts[i] = delivery.delivery_count;
            if let Some(due) = not_before[i].take() {
                assert!(
                    Instant::now() >= due,
                    "back before its due time: {delivery:?}"
                );
            }
            outcomes.push(if answer == RetryAfter {
                delayed = Some(i);
                retry_after(delivery.slot, STREAM_DELAY)
            } else {
                outcome(delivery.slot, answer)
            });
        }
        let (sent, sent_ms) = (Instant::now(), unix_ms());
        sub.send(vec![], outcomes).await;
        let report = sub.flush().await;
        assert!(report.ok && report.requeue_refused.is_empty(), "{report:?}");
        if let Some(i) = delayed {
            not_before[i] = Some(sent + STREAM_DELAY);
            let id = &first.deliveries[i].entry_id;
            let due_set = Form::Stream.delayed();
            due_time_written(redis, &due_set, id, (sent_ms, unix_ms())).await;
        }
    }
    // Nothing more, read already (kept while a flush report was awaited) or still to come.
    let more = tokio::time::timeout(Duration::from_millis(600), sub.next()).await;
    assert!(more.is_err(), "nothing more is delivered: {more:?}");
}

#[tokio::test]
async fn out_of_memory_stream() {
    refused_retries_stay_pending_in_the_group(proto::Mode::Pipeline, Fault::OutOfMemory).await;
}

#[tokio::test]
async fn out_of_memory_stream_atomic() {
    refused_retries_stay_pending_in_the_group(proto::Mode::Atomic, Fault::OutOfMemory).await;
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
    refused_retries_stay_pending_in_the_group(proto::Mode::Pipeline, Fault::NoWrites).await;
}

#[tokio::test]
async fn no_permission_for_the_writes_reliable_list() {
    refused_requeues_stay_pending(Form::ReliableList, proto::Mode::Atomic, Fault::NoWrites).await;
}

#[tokio::test]
async fn no_permission_for_scripts_stream() {
    refused_retries_stay_pending_in_the_group(proto::Mode::Atomic, Fault::NoScripts).await;
}

#[tokio::test]
async fn no_permission_for_scripts_reliable_list() {
    refused_requeues_stay_pending(Form::ReliableList, proto::Mode::Pipeline, Fault::NoScripts)
        .await;
}

#[tokio::test]
async fn dead_letter_of_the_wrong_type_stream() {
    refused_retries_stay_pending_in_the_group(proto::Mode::Pipeline, Fault::DeadLetterWrongType)
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

/// The group's delay set (`{orders}:window:delayed:g`) holds a string.
#[tokio::test]
async fn delay_set_of_the_wrong_type_stream() {
    refused_retries_stay_pending_in_the_group(proto::Mode::Atomic, Fault::DelaySetWrongType).await;
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
    refused_retries_stay_pending_in_the_group(proto::Mode::Pipeline, Fault::Busy).await;
}

#[tokio::test]
async fn a_long_script_reliable_list() {
    refused_requeues_stay_pending(Form::ReliableList, proto::Mode::Atomic, Fault::Busy).await;
}

#[tokio::test]
async fn out_of_memory_simple_list() {
    refused_requeues_stay_pending(Form::SimpleList, proto::Mode::Pipeline, Fault::OutOfMemory)
        .await;
}

#[tokio::test]
async fn out_of_memory_simple_list_atomic() {
    refused_requeues_stay_pending(Form::SimpleList, proto::Mode::Atomic, Fault::OutOfMemory).await;
}

/// The give-back is refused too (no `RPUSH`) until the ACL is restored.
#[tokio::test]
async fn no_permission_for_the_writes_simple_list() {
    refused_requeues_stay_pending(Form::SimpleList, proto::Mode::Pipeline, Fault::NoWrites).await;
}

#[tokio::test]
async fn no_permission_for_scripts_simple_list() {
    refused_requeues_stay_pending(Form::SimpleList, proto::Mode::Atomic, Fault::NoScripts).await;
}

#[tokio::test]
async fn dead_letter_of_the_wrong_type_simple_list() {
    refused_requeues_stay_pending(
        Form::SimpleList,
        proto::Mode::Pipeline,
        Fault::DeadLetterWrongType,
    )
    .await;
}

#[tokio::test]
async fn delay_set_of_the_wrong_type_simple_list() {
    refused_requeues_stay_pending(
        Form::SimpleList,
        proto::Mode::Atomic,
        Fault::DelaySetWrongType,
    )
    .await;
}

#[tokio::test]
async fn a_long_script_simple_list() {
    refused_requeues_stay_pending(Form::SimpleList, proto::Mode::Pipeline, Fault::Busy).await;
}

/// A simple list's entries given back when their client leaves, while Redis refuses the
/// give-back (out of memory): nothing in Redis has them, so the closing subscription holds them
/// and pushes them back once Redis takes writes again. The next subscriber gets them in their
/// order, counted once more.
#[tokio::test]
async fn a_refused_give_back_of_a_simple_list_is_held_until_redis_takes_it() {
    // Out of memory refuses the whole give-back; an ACL without RPUSH refuses its push, while
    // the count beside it would be allowed: the tries Redis refuses count nothing.
    for fault in [Fault::OutOfMemory, Fault::NoWrites] {
        a_refused_give_back_of_a_simple_list_is_held(fault).await;
    }
}

async fn a_refused_give_back_of_a_simple_list_is_held(fault: Fault) {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let inspect = redis.client().await;
    let mut client = sidecar.client().await;
    let form = Form::SimpleList;
    form.add(&inspect, &["a", "b", "c"]).await;
    let open = form.open(proto::Mode::Pipeline);
    let (mut sub, _) = Subscription::open(&mut client, open.clone()).await.unwrap();
    deliveries(&mut sub, 3).await;
    assert_eq!(form.length(&inspect).await, 0);

    fault.apply(&inspect, redis.port(), &form).await;
    drop(sub);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        form.length(&inspect).await,
        0,
        "{fault:?}: Redis refuses the give-back"
    );
    fault.undo(&inspect, redis.port(), &form).await;
    let back = eventually(Duration::from_secs(5), || async {
        form.length(&inspect).await == 3
    });
    assert!(
        back.await,
        "held entries are pushed back once Redis takes them"
    );

    let (mut sub, _) = Subscription::open(&mut client, open).await.unwrap();
    let read = deliveries(&mut sub, 3).await;
    let values: Vec<String> = read.deliveries.iter().map(value).collect();
    assert_eq!(values, ["a", "b", "c"]);
    let counts: Vec<u32> = read.deliveries.iter().map(|d| d.delivery_count).collect();
    assert_eq!(counts, [2, 2, 2], "{fault:?}: {read:?}");
    sub.close();
    sidecar.stop().await;
}

/// Writes paused (`CLIENT PAUSE … WRITE`, as during a failover's hand-over): the requeue step
/// (and a stream's retries kept in place) waits for the pause to end and then runs whole;
/// nothing is refused or lost.
#[tokio::test]
async fn paused_writes_delay_the_requeues_and_lose_nothing() {
    for form in [Form::Stream, Form::ReliableList, Form::SimpleList] {
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
        let (asked, asked_ms) = (Instant::now(), unix_ms());
        sub.send(vec![], requeues(form, &read)).await;
        let report = sub.flush().await;
        assert!(
            report.ok && report.requeue_refused.is_empty(),
            "{form:?}: {report:?}"
        );
        if let Form::Stream = form {
            // The retries stay pending in the group, the retry_after's due time in its delay
            // set; the dead letter is written and its entry settled; nothing is appended.
            let id = &read.deliveries[1].entry_id;
            due_time_written(&inspect, &form.delayed(), id, (asked_ms, unix_ms())).await;
            assert_eq!(form.dead_letters(&inspect).await, 1);
            assert_eq!(form.held(&inspect).await, 2);
            let taken = ([true; 3], false);
            stream_entries_come_back_as_asked(&mut sub, &inspect, &read, taken, asked).await;
            assert_eq!(form.length(&inspect).await, 3, "nothing appended");
            assert_eq!(form.dead_letters(&inspect).await, 1);
            assert_eq!(form.held(&inspect).await, 0);
            sub.close();
            sidecar.stop().await;
            continue;
        }
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
    for form in [Form::Stream, Form::ReliableList, Form::SimpleList] {
        a_flushed_script_cache_refuses_nothing_on(form).await;
    }
}

async fn a_flushed_script_cache_refuses_nothing_on(form: Form) {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let inspect = redis.client().await;
    let mut client = sidecar.client().await;
    form.add(&inspect, &["a", "b"]).await;
    let (mut sub, _) = Subscription::open(&mut client, form.open(proto::Mode::Pipeline))
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

/// A promotion of due delays that Redis refuses keeps its member. The delay set is a stream's
/// shared one of copies an earlier version wrote for retry_after (this version writes none, but
/// still promotes them after an upgrade, appending the copy to the stream as then): out of
/// memory (the script is refused whole) and an ACL without `XADD` (the copy is refused inside
/// it), each held past the member's due time; once Redis takes the write the copy comes back,
/// once, counted as the earlier version counted it.
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
        let first = &read.deliveries[0];
        sub.send(vec![], vec![outcome(first.slot, Ack)]).await;
        assert!(sub.flush().await.ok);
        // What an earlier version left of a retry_after of it after one delivery: the entry
        // settled, and its copy in the shared delay set, due in 500 ms.
        let member = window_sidecar::redis::delay::encode(
            first.entry_id.as_bytes(),
            [
                "_payload",
                "a",
                "h:x-window-attempts",
                "1",
                "h:x-window-original-id",
                &first.entry_id,
            ]
            .map(|part| bytes::Bytes::copy_from_slice(part.as_bytes())),
        );
        let due = (unix_ms() + 500) as f64;
        let _: i64 = inspect
            .zadd(SHARED_DELAYED, None, None, false, false, (due, member))
            .await
            .unwrap();
        admin(redis.port(), fault);
        // Well past the due time, with a promotion every 100 ms: still delayed.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        assert_eq!(zcard(&inspect, SHARED_DELAYED).await, 1, "{fault:?}");
        assert_eq!(form.length(&inspect).await, 1, "{fault:?}");
        admin(redis.port(), undo);
        let back = deliveries(&mut sub, 1).await;
        let copy = &back.deliveries[0];
        assert_eq!(value(copy), "a", "{fault:?}");
        assert_ne!(copy.entry_id, first.entry_id, "{fault:?}: a copy, as then");
        assert_eq!(copy.delivery_count, 2, "{fault:?}");
        assert_eq!(zcard(&inspect, SHARED_DELAYED).await, 0, "{fault:?}");
        assert_eq!(form.length(&inspect).await, 2, "{fault:?}");
        sub.send(vec![], vec![outcome(copy.slot, Ack)]).await;
        assert!(sub.flush().await.ok);
        assert!(
            sub.message_within(Duration::from_millis(600))
                .await
                .is_none(),
            "{fault:?}: the copy comes once"
        );
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
    sub.send(vec![], requeues(Form::Stream, &read)).await;
    assert!(!sub.flush().await.ok);
    admin(redis.port(), &["CONFIG", "SET", "maxmemory", "0"]);
    let line: serde_json::Value =
        serde_json::from_str(&sidecar.wait_for("Redis refused to write a retry")).unwrap();
    assert_eq!(line["level"], "WARN", "{line}");
    assert_eq!(line["subscription"], "orders/g", "{line}");
    // All three refused: the dead letter (the third delivery) first, its step coming first in
    // the flush, then the two retries kept in place.
    assert_eq!(line["entries"], 3, "{line}");
    let dead_letter = &read.deliveries[2];
    assert_eq!(line["entry_id"], dead_letter.entry_id.as_str(), "{line}");
    assert_eq!(line["slot"], dead_letter.slot, "{line}");
    assert!(
        line["error"].as_str().unwrap().starts_with("OOM "),
        "{line}"
    );
    drop((sub, client));
    sidecar.terminate();
}

/// A reliable list's entries a closing subscription gives back unread (on an ordered
/// subscription, the one waiting behind its key's first) while Redis refuses the push back (an
/// ACL without `RPUSH`): the value stays on the consumer's processing list, never taken off it
/// without its copy back in the list, and the consumer's next subscription delivers it.
#[tokio::test]
async fn a_refused_give_back_of_a_reliable_list_leaves_the_value_on_its_processing_list() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::start(&redis.url(), &[]).await;
    let inspect = redis.client().await;
    let mut client = sidecar.client().await;
    let entries = ["a", "b"]
        .iter()
        .map(|payload| proto::PublishEntry {
            payload: bytes::Bytes::from_static(payload.as_bytes()),
            headers: [("k".to_string(), "x".to_string())].into(),
            ..Default::default()
        })
        .collect();
    let request = proto::PublishRequest {
        list: "jobs".into(),
        entries,
        ..Default::default()
    };
    client.publish(request).await.unwrap();
    let open = proto::Open {
        source: Some(proto::open::Source::ReliableList(
            proto::ReliableListSource {
                key: "jobs".into(),
                consumer: "c".into(),
                ..Default::default()
            },
        )),
        count: 2,
        ordering_key: Some(proto::OrderingKey {
            source: Some(proto::ordering_key::Source::Header("k".into())),
        }),
        ..Default::default()
    };
    let (mut sub, _) = Subscription::open(&mut client, open.clone()).await.unwrap();
    let first = sub.read().await;
    assert_eq!(first.deliveries.len(), 1, "b waits behind a: {first:?}");
    let processing = "{jobs}:window:processing:c";
    let held = || async { inspect.llen::<u64, _>(processing).await.unwrap() };
    assert_eq!(held().await, 2);

    admin(redis.port(), &["ACL", "SETUSER", "default", "-rpush"]);
    drop(sub);
    tokio::time::sleep(Duration::from_millis(500)).await;
    admin(redis.port(), &["ACL", "SETUSER", "default", "+@all"]);
    assert_eq!(held().await, 2, "the refused give-back took nothing off");
    assert_eq!(inspect.llen::<u64, _>("jobs").await.unwrap(), 0);

    let mut sub = open_once_the_lease_expires(&mut client, open).await;
    let mut back = Vec::new();
    while back.len() < 2 {
        let read = sub.read().await;
        let acks = read
            .deliveries
            .iter()
            .map(|d| outcome(d.slot, proto::OutcomeKind::Ack))
            .collect();
        back.extend(read.deliveries.iter().map(|d| d.payload.clone()));
        sub.send(vec![], acks).await;
        assert!(sub.flush().await.ok);
    }
    assert_eq!(back, [&b"a"[..], &b"b"[..]]);
    assert_eq!(held().await, 0);
    sub.close();
    sidecar.stop().await;
}

/// The binary's lines for a simple list's held entries: held when Redis refuses their
/// give-back, taken back once it accepts, and, when the sidecar stops while Redis still
/// refuses, the error that says how many were lost and the first of them (documented fields).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_entries_of_a_simple_list_are_logged_taken_back_or_lost() {
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
            "1s",
        ])
        .env("RUST_LOG", "info")
        .capture_stdout()
        .start();
    sidecar.wait_for("Redis answers: SERVING");
    let inspect = redis.client().await;
    let form = Form::SimpleList;
    form.add(&inspect, &["a", "b", "c"]).await;
    let open = form.open(proto::Mode::Pipeline);
    let json = |line: String| -> serde_json::Value { serde_json::from_str(&line).unwrap() };

    let mut client = connect_client(&listen).await;
    let (mut sub, _) = Subscription::open(&mut client, open.clone()).await.unwrap();
    deliveries(&mut sub, 3).await;
    admin(redis.port(), &["CONFIG", "SET", "maxmemory", "1"]);
    drop(sub);
    let held = json(sidecar.wait_for("Redis refused to take popped entries back"));
    assert_eq!(
        (&held["level"], &held["entries"]),
        (&"WARN".into(), &3.into()),
        "{held}"
    );
    admin(redis.port(), &["CONFIG", "SET", "maxmemory", "0"]);
    let back = json(sidecar.wait_for("held entries taken back by Redis"));
    assert_eq!(
        (&back["level"], &back["entries"]),
        (&"INFO".into(), &3.into()),
        "{back}"
    );
    assert_eq!(form.length(&inspect).await, 3);

    let (mut sub, _) = Subscription::open(&mut client, open).await.unwrap();
    deliveries(&mut sub, 3).await;
    admin(redis.port(), &["CONFIG", "SET", "maxmemory", "1"]);
    sidecar.signal("TERM");
    let lost = json(sidecar.wait_for("popped entries lost"));
    assert_eq!(lost["level"], "ERROR", "{lost}");
    assert_eq!(
        (&lost["entries"], &lost["first"]),
        (&3.into(), &"a".into()),
        "{lost}"
    );
    drop((sub, client));
    sidecar.wait_exit();
}

/// A simple list's requeues on a primary turned replica (`READONLY`): the entries left Redis
/// when they were popped, so the sidecar holds them; when the roles swap back (a failback) the
/// node takes writes again, the held entries go back to the list, come back counted once more,
/// and are requeued as asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_turned_replica_refuses_the_requeues_whole_simple_list() {
    let form = Form::SimpleList;
    let old = RedisServer::start();
    let new = RedisServer::start_with(&["--replicaof", "127.0.0.1", &old.port().to_string()]);
    let synced = eventually(STEP, || async { replication(new.port()).1 });
    assert!(synced.await, "the replica synced");
    let sidecar = Sidecar::start(&old.url(), &[]).await;
    let on_old = old.client().await;
    let mut client = sidecar.client().await;
    form.add(&on_old, &["a", "b", "c"]).await;
    let (mut sub, _) = Subscription::open(&mut client, form.open(proto::Mode::Pipeline))
        .await
        .unwrap();
    let read = deliveries(&mut sub, 3).await;
    let values: Vec<String> = read.deliveries.iter().map(value).collect();
    assert_eq!(values, ["a", "b", "c"]);
    let swap = |from: u16, to: u16| async move {
        admin(from, &["FAILOVER", "TIMEOUT", "5000"]);
        let swapped = eventually(Duration::from_secs(10), || async {
            replication(from) == ("slave".to_owned(), true) && replication(to).0 == "master"
        });
        assert!(swapped.await, "the failover swapped the roles");
    };
    swap(old.port(), new.port()).await;
    sub.send(vec![], requeues(form, &read)).await;
    let report = sub.flush().await;
    assert!(!report.ok, "{report:?}");
    if !report.requeue_refused.is_empty() {
        assert_eq!(report.requeue_refused.len(), 3, "{report:?}");
        let error = &report.requeue_refused[0].error;
        assert!(error.starts_with("READONLY "), "{report:?}");
    }
    let on_new = new.client().await;
    assert_eq!(form.length(&on_new).await, 0);
    assert_eq!(form.delayed_members(&on_new).await, 0);
    assert_eq!(form.dead_letters(&on_new).await, 0);

    // The failback: the sidecar's node is a primary again and takes the held entries back.
    swap(new.port(), old.port()).await;
    let back = deliveries(&mut sub, 3).await;
    let again: Vec<String> = back.deliveries.iter().map(value).collect();
    assert_eq!(again, values, "{back:?}");
    assert!(
        back.deliveries.iter().all(|d| d.delivery_count == 2),
        "{back:?}"
    );
    sub.send(vec![], requeues(form, &back)).await;
    let report = sub.flush().await;
    assert!(report.ok && report.requeue_refused.is_empty(), "{report:?}");
    let copy = deliveries(&mut sub, 1).await;
    assert_eq!(value(&copy.deliveries[0]), "a", "{copy:?}");
    assert_eq!(form.delayed_members(&on_old).await, 1);
    assert_eq!(form.dead_letters(&on_old).await, 1);
    sub.close();
    sidecar.stop().await;
}

/// `INFO replication`'s `role` of a server (`master` or `slave`) and, for a replica, whether
/// its link to its primary is up.
fn replication(port: u16) -> (String, bool) {
    let info = resp::call_text(port, &["INFO", "replication"]).unwrap_or_default();
    let role = info_field(&info, "role").unwrap_or_default().to_owned();
    let up = info_field(&info, "master_link_status") == Some("up");
    (role, up)
}

/// Opens `open`, again every 100 ms while its consumer's lease is still held (a sidecar whose
/// release Redis refused), for up to 5 s.
async fn open_once_the_lease_expires(
    client: &mut proto::window_service_client::WindowServiceClient<tonic::transport::Channel>,
    open: proto::Open,
) -> Subscription {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        match Subscription::open(client, open.clone()).await {
            Ok((sub, _)) => return sub,
            Err(status)
                if status.code() == tonic::Code::AlreadyExists
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(status) => panic!("open: {status:?}"),
        }
    }
}

/// A primary turned replica under a running sidecar (`READONLY`). The sidecar is pointed at a
/// fixed address (a `redis://` URL, as to a managed service's node or a Service in front of a
/// pod) and a coordinated failover (`FAILOVER`, as managed services and operators run it)
/// swaps the roles while the deliveries are out: the old primary keeps the sidecar's
/// connections and answers its writes with READONLY. Sentinel, by contrast, drops the clients
/// of the primary it demotes, so the sidecar reconnects to the new one (see sentinel.rs). The
/// requeue step is refused whole (on a stream, the scripts that keep its retries pending too):
/// nothing written, nothing settled, seen from the new primary; once the sidecar talks to the
/// new primary the entries come back and are requeued as asked, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_turned_replica_refuses_the_requeues_whole_stream() {
    a_primary_turned_replica_refuses_the_requeues_whole(Form::Stream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_turned_replica_refuses_the_requeues_whole_reliable_list() {
    a_primary_turned_replica_refuses_the_requeues_whole(Form::ReliableList).await;
}

async fn a_primary_turned_replica_refuses_the_requeues_whole(form: Form) {
    let old = RedisServer::start();
    let new = RedisServer::start_with(&["--replicaof", "127.0.0.1", &old.port().to_string()]);
    let synced = eventually(STEP, || async { replication(new.port()).1 });
    assert!(synced.await, "the replica synced");
    let metrics = format!("127.0.0.1:{}", free_port());
    // A short consumer lease: the old primary refuses the lease's release too, and the new
    // primary holds the lease as the failover left it until it expires.
    let flags = ["--metrics-listen", &metrics, "--consumer-lease", "1s"];
    let sidecar = Sidecar::start(&old.url(), &flags).await;
    // A reliable list's lease is its heartbeat: as short as the stream's.
    let mut open = form.open(proto::Mode::Pipeline);
    if let Some(proto::open::Source::ReliableList(list)) = &mut open.source {
        list.dead_after = Some(duration(Duration::from_secs(1)));
    }
    let on_old = old.client().await;
    let mut client = sidecar.client().await;
    form.add(&on_old, &["a", "b", "c"]).await;
    let (mut sub, _) = Subscription::open(&mut client, open.clone()).await.unwrap();
    let read = deliveries(&mut sub, 3).await;
    let values: Vec<String> = read.deliveries.iter().map(value).collect();
    assert_eq!(values, ["a", "b", "c"]);
    // The deliveries (the group's pending entries) reached the replica before the failover.
    let replicated = resp::call(old.port(), &["WAIT", "1", "2000"]).unwrap();
    assert_eq!(replicated.as_int(), Some(1));

    admin(old.port(), &["FAILOVER", "TIMEOUT", "5000"]);
    let swapped = eventually(Duration::from_secs(10), || async {
        replication(old.port()) == ("slave".to_owned(), true)
            && replication(new.port()).0 == "master"
    });
    assert!(swapped.await, "the failover swapped the roles");
    sub.send(vec![], requeues(form, &read)).await;
    let report = sub.flush().await;
    eprintln!("the flush on the demoted primary: {report:?}");
    assert!(!report.ok, "{report:?}");
    assert!(report.settle_failed, "{report:?}");
    if report.requeue_refused.is_empty() {
        // A connection the failover dropped: the step was never sent, or its reply never came.
        assert!(
            report.error.starts_with("not sent") || report.outcome_unknown,
            "{report:?}"
        );
    } else {
        // Each requeue refused: a stream's dead letter first (its step comes first in the
        // flush), then the scripts that keep its retries pending in the group; a list's in
        // the order of its step.
        let refused: &[usize] = match form {
            Form::Stream => &[2, 0, 1],
            _ => &[0, 1, 2],
        };
        let slots: Vec<u64> = report.requeue_refused.iter().map(|r| r.slot).collect();
        let expected: Vec<u64> = refused.iter().map(|&i| read.deliveries[i].slot).collect();
        assert_eq!(slots, expected, "{report:?}");
        for (refusal, &i) in report.requeue_refused.iter().zip(refused) {
            assert!(refusal.error.starts_with("READONLY "), "{refusal:?}");
            assert_eq!(refusal.entry_id, read.deliveries[i].entry_id, "{refusal:?}");
        }
        if let Form::Stream = form {
            assert_eq!(report.failed, 3, "{report:?}");
            assert!(report.error.starts_with("READONLY "), "{report:?}");
        }
        let exposition = scrape(&metrics).await;
        let counted = metric_sum(
            &exposition,
            "window_sidecar_requeue_refused_total",
            "reason=\"readonly\"",
        );
        assert_eq!(counted, refused.len() as f64, "{exposition}");
    }
    sub.close();
    sidecar.stop().await;

    // The new primary's view: the three entries still pending on their consumer (on its
    // processing list), no copy, no delay-set member, no dead letter.
    let on_new = new.client().await;
    assert_eq!(form.held(&on_new).await, 3);
    let before = form.length(&on_new).await;
    assert_eq!(before, if let Form::Stream = form { 3 } else { 0 });
    assert_eq!(form.delayed_members(&on_new).await, 0);
    assert_eq!(form.dead_letters(&on_new).await, 0);
    assert_eq!(zcard(&on_new, SHARED_DELAYED).await, 0);

    // The sidecar pointed at the new primary (the address updated, or the URL changed): the
    // entries come back, are requeued as asked, and each requeue is written once.
    let sidecar = Sidecar::start(&new.url(), &["--consumer-lease", "1s"]).await;
    let mut client = sidecar.client().await;
    let mut sub = open_once_the_lease_expires(&mut client, open).await;
    let back = deliveries(&mut sub, 3).await;
    let again: Vec<String> = back.deliveries.iter().map(value).collect();
    assert_eq!(again, values, "{back:?}");
    let (asked, asked_ms) = (Instant::now(), unix_ms());
    sub.send(vec![], requeues(form, &back)).await;
    let report = sub.flush().await;
    assert!(report.ok && report.requeue_refused.is_empty(), "{report:?}");
    if let Form::Stream = form {
        // The same entries, still pending in the group: each ends as asked, nothing appended.
        let ids = |read: &proto::Read| -> Vec<String> {
            read.deliveries.iter().map(|d| d.entry_id.clone()).collect()
        };
        assert_eq!(ids(&back), ids(&read), "{back:?}");
        let id = &back.deliveries[1].entry_id;
        due_time_written(&on_new, &form.delayed(), id, (asked_ms, unix_ms())).await;
        let taken = ([true; 3], false);
        stream_entries_come_back_as_asked(&mut sub, &on_new, &back, taken, asked).await;
        assert_eq!(form.held(&on_new).await, 0);
        assert_eq!(form.length(&on_new).await, 3, "nothing appended");
        assert_eq!(form.dead_letters(&on_new).await, 1);
        assert_eq!(zcard(&on_new, SHARED_DELAYED).await, 0);
        due_times_leave_once_settled(&on_new, &form.delayed(), 0).await;
        sub.close();
        sidecar.stop().await;
        return;
    }
    let copy = deliveries(&mut sub, 1).await;
    assert_eq!(value(&copy.deliveries[0]), "a", "{copy:?}");
    let slot = copy.deliveries[0].slot;
    sub.send(vec![], vec![outcome(slot, proto::OutcomeKind::Ack)])
        .await;
    assert!(sub.flush().await.ok);
    assert!(
        sub.message_within(Duration::from_millis(600))
            .await
            .is_none(),
        "nothing more is delivered"
    );
    assert_eq!(form.held(&on_new).await, 0);
    // A list's entries were all read, the copy too.
    assert_eq!(form.length(&on_new).await, before);
    assert_eq!(form.delayed_members(&on_new).await, 1);
    assert_eq!(form.dead_letters(&on_new).await, 1);
    sub.close();
    sidecar.stop().await;
}

/// Where the slot of the subscription's keys stands when its deliveries are answered.
#[derive(Clone, Copy, Debug, PartialEq)]
enum SlotMove {
    /// `MIGRATING`/`IMPORTING`, no key moved yet: the old owner still serves them all.
    Begun,
    /// The stream moved, its delay set and dead-letter stream not yet (`TRYAGAIN` for the
    /// requeue step, which declares all three), for 400 ms; then the rest moves.
    Split,
    /// Split as above for longer than `--redis-timeout`; then the rest moves.
    SplitPastTimeout,
    /// The slot moved for good: the old owner answers `MOVED`.
    Moved,
}

/// `errorstat_<code>`'s count on a node.
fn errors(port: u16, code: &str) -> u64 {
    let prefix = format!("errorstat_{code}:count=");
    resp::call_text(port, &["INFO", "errorstats"])
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(&prefix).and_then(|n| n.trim().parse().ok()))
        .unwrap_or(0)
}

/// An integer reply of a node, as a count.
fn count_on(port: u16, args: &[&str]) -> u64 {
    let reply = resp::call(port, args).unwrap_or_else(|e| panic!("{args:?} on {port}: {e}"));
    reply
        .as_int()
        .unwrap_or_else(|| panic!("{args:?}: {reply:?}")) as u64
}

/// The requeue step of a stream or a reliable list on a 3-primary cluster whose slot is moving
/// when the deliveries are answered retry, retry_after and dead_letter. The step declares the
/// source (a stream, or a list's processing list), the delay set and the dead letter, so a node
/// serving only some of them refuses it whole; the sidecar runs it again where the keys live.
/// Either it runs once (each entry settled with exactly one copy, delay-set member or dead
/// letter) or it is refused and every entry stays pending, comes back once the slot has moved,
/// and is requeued once then. On a stream the retries write no copy: they stay pending in the
/// group, each kept by a script of its own that declares the stream and the group's delay set,
/// and come back themselves. The delay set and the dead letter exist beforehand (a marker
/// each), so that a migration can split them from the source.
async fn requeues_while_the_slot_moves(form: Form, stage: SlotMove) {
    let cluster = RedisCluster::start(3, 0);
    let sidecar = Sidecar::start(&cluster.url(), &["--redis-timeout", "1s"]).await;
    let inspect = cluster.client().await;
    let mut client = sidecar.client().await;
    let slot = slot_of("orders");
    for key in [form.dead_letter(), &form.delayed()] {
        assert_eq!(slot_of(key), slot, "{key}");
    }
    let from = cluster.primary_for_slot(slot);
    let to = *cluster.primaries().iter().find(|&&p| p != from).unwrap();
    if let Form::Stream = form {
        let _: String = inspect
            .xadd(form.dead_letter(), false, None, "*", ("marker", "1"))
            .await
            .unwrap();
    } else {
        let _: i64 = inspect.lpush(form.dead_letter(), "marker").await.unwrap();
    }
    let _: i64 = inspect
        .zadd(form.delayed(), None, None, false, false, (9e15, "marker"))
        .await
        .unwrap();
    form.add(&inspect, &["a", "b", "c"]).await;
    let (mut sub, _) = Subscription::open(&mut client, form.open(proto::Mode::Pipeline))
        .await
        .unwrap();
    let read = deliveries(&mut sub, 3).await;
    let values: Vec<String> = read.deliveries.iter().map(value).collect();
    assert_eq!(values, ["a", "b", "c"]);

    let migration = tokio::task::block_in_place(|| match stage {
        SlotMove::Moved => {
            cluster.migrate_slot(slot, to);
            None
        }
        SlotMove::Begun => Some(cluster.begin_slot_migration(slot, to)),
        SlotMove::Split | SlotMove::SplitPastTimeout => {
            let migration = cluster.begin_slot_migration(slot, to);
            let port = to.to_string();
            // The source: a stream, or the list with its processing list.
            let mut args = vec![
                "MIGRATE",
                "127.0.0.1",
                &port,
                "",
                "0",
                "10000",
                "KEYS",
                "orders",
            ];
            if let Form::ReliableList = form {
                args.push("{orders}:window:processing:c");
            }
            admin(from, &args);
            Some(migration)
        }
    });
    let tryagain_before = errors(from, "TRYAGAIN") + errors(to, "TRYAGAIN");
    let (asked, asked_ms) = (Instant::now(), unix_ms());
    sub.send(vec![], requeues(form, &read)).await;
    if stage == SlotMove::Split {
        tokio::time::sleep(Duration::from_millis(400)).await;
        tokio::task::block_in_place(|| cluster.finish_slot_migration(migration.unwrap()));
    }
    let report = sub.flush().await;
    let replied_ms = unix_ms();
    eprintln!("{stage:?}: {report:?}");
    if let Some(migration) = migration.filter(|_| stage != SlotMove::Split) {
        tokio::task::block_in_place(|| cluster.finish_slot_migration(migration));
    }
    assert_eq!(cluster.primary_for_slot(slot), to);
    let tryagain = errors(from, "TRYAGAIN") + errors(to, "TRYAGAIN") - tryagain_before;
    if matches!(stage, SlotMove::Split | SlotMove::SplitPastTimeout) {
        assert!(tryagain > 0, "{stage:?}: the step met the split keys");
    }

    // What the new owner holds, with the markers: a stream keeps its entries, a list's leave
    // it when read (and wait on the processing list until settled).
    let length = if let Form::Stream = form {
        "XLEN"
    } else {
        "LLEN"
    };
    let stream = || count_on(to, &[length, "orders"]);
    let delay_set = form.delayed();
    let delayed = || count_on(to, &["ZCARD", &delay_set]);
    let dead = || count_on(to, &[length, "{orders}:dead"]);
    let held = || match form {
        Form::Stream => {
            let reply = resp::call(to, &["XPENDING", "orders", "g"]).unwrap();
            reply.items()[0].as_int().unwrap() as u64
        }
        _ => count_on(to, &["LLEN", "{orders}:window:processing:c"]),
    };
    // What the source itself holds of the three entries: all of a stream's, none of a list's.
    let kept = if let Form::Stream = form { 3 } else { 0 };
    let mut copies = 0;
    if stage == SlotMove::SplitPastTimeout {
        assert!(!report.ok, "keys split past --redis-timeout: {report:?}");
    }
    if let Form::Stream = form {
        // The retries stay pending in the group (each kept by a script that declares the
        // stream and the group's delay set), the dead letter goes through the requeue step
        // (the stream and the dead letter): each refused whole by a node serving only some of
        // its keys, or run once where they live. Nothing is appended to the stream.
        let due_set = form.delayed();
        let shared = || count_on(to, &["EXISTS", SHARED_DELAYED]);
        let taken = if report.ok {
            assert!(report.requeue_refused.is_empty(), "{stage:?}: {report:?}");
            assert_eq!((stream(), delayed(), dead()), (3, 2, 2), "{stage:?}");
            assert_eq!(held(), 2, "{stage:?}: the retries stay pending");
            let id = &read.deliveries[1].entry_id;
            due_time_written(&inspect, &due_set, id, (asked_ms, replied_ms)).await;
            [true; 3]
        } else {
            // Refused (given up on at `--redis-timeout`): nothing written, nothing settled;
            // each a refused requeue, the dead letter's step first, all TRYAGAIN.
            let split = matches!(stage, SlotMove::Split | SlotMove::SplitPastTimeout);
            assert!(split, "{stage:?}: {report:?}");
            assert!(report.settle_failed, "{stage:?}: {report:?}");
            assert_eq!(report.failed, 3, "{stage:?}: {report:?}");
            assert!(report.error.starts_with("TRYAGAIN "), "{report:?}");
            let slots: Vec<u64> = report.requeue_refused.iter().map(|r| r.slot).collect();
            let expected = [2, 0, 1].map(|i| read.deliveries[i].slot);
            assert_eq!(slots, expected, "{stage:?}: {report:?}");
            for refusal in &report.requeue_refused {
                assert!(refusal.error.starts_with("TRYAGAIN "), "{refusal:?}");
            }
            assert_eq!((stream(), delayed(), dead()), (3, 1, 1), "{stage:?}");
            assert_eq!(held(), 3, "{stage:?}");
            [false; 3]
        };
        assert_eq!(shared(), 0, "{stage:?}: no copy in the delay set of copies");
        // Each comes back (now from the new owner) and ends as asked, once.
        let reread = report.settle_failed;
        stream_entries_come_back_as_asked(&mut sub, &inspect, &read, (taken, reread), asked).await;
        assert_eq!((stream(), dead(), held()), (3, 2, 0), "{stage:?}");
        assert_eq!(shared(), 0, "{stage:?}");
        due_times_leave_once_settled(&inspect, &due_set, 1).await;
        sub.close();
        let _ = inspect.quit().await;
        sidecar.stop().await;
        return;
    }
    if report.ok {
        // Run once, where the keys were: each requeue written once, each entry settled.
        assert!(report.requeue_refused.is_empty(), "{stage:?}: {report:?}");
        assert_eq!((delayed(), dead()), (2, 2), "{stage:?}");
        // The copy is in the source, or read already and held.
        assert!(held() <= 1, "{stage:?}: only the copy may be held");
        let copy_in = match form {
            Form::Stream => stream(),
            _ => stream() + held(),
        };
        assert_eq!(copy_in, kept + 1, "{stage:?}");
    } else {
        // Refused (given up on at `--redis-timeout`): nothing written, nothing settled, and
        // the report names every entry with Redis's error.
        // A list's step also declares its counts hash, which no retry wrote yet: while the
        // slot migrates Redis cannot tell whether a missing key moved, and refuses the step
        // (TRYAGAIN) until the slot has.
        let split = matches!(stage, SlotMove::Split | SlotMove::SplitPastTimeout)
            || (stage == SlotMove::Begun && matches!(form, Form::ReliableList));
        assert!(split, "{stage:?}: {report:?}");
        assert!(report.settle_failed, "{stage:?}: {report:?}");
        let slots: Vec<u64> = report.requeue_refused.iter().map(|r| r.slot).collect();
        let expected: Vec<u64> = read.deliveries.iter().map(|d| d.slot).collect();
        assert_eq!(slots, expected, "{stage:?}: {report:?}");
        for refusal in &report.requeue_refused {
            assert!(refusal.error.starts_with("TRYAGAIN "), "{refusal:?}");
        }
        assert_eq!((stream(), delayed(), dead()), (kept, 1, 1), "{stage:?}");
        assert_eq!(held(), 3, "{stage:?}");
        // They come back, and are requeued now that the keys have settled on the new owner.
        let mut left = values.clone();
        while !left.is_empty() {
            let read = sub.read().await;
            let mut outcomes = Vec::new();
            for delivery in &read.deliveries {
                let value = value(delivery);
                if let Some(at) = left.iter().position(|v| *v == value) {
                    left.remove(at);
                    outcomes.push(match value.as_str() {
                        "a" => outcome(delivery.slot, Retry),
                        "b" => retry_after(delivery.slot, DELAY),
                        _ => outcome(delivery.slot, DeadLetter),
                    });
                } else {
                    assert_eq!(value, "a", "{stage:?}: only the retry is copied");
                    copies += 1;
                    outcomes.push(outcome(delivery.slot, proto::OutcomeKind::Ack));
                }
            }
            sub.send(vec![], outcomes).await;
            let report = sub.flush().await;
            assert!(report.ok, "{stage:?}: {report:?}");
        }
    }
    // The retry's copy comes back once and is acked.
    while copies == 0 {
        let read = sub.read().await;
        let mut acks = Vec::new();
        for delivery in &read.deliveries {
            assert_eq!(value(delivery), "a", "{stage:?}: {delivery:?}");
            copies += 1;
            acks.push(outcome(delivery.slot, proto::OutcomeKind::Ack));
        }
        sub.send(vec![], acks).await;
        assert!(sub.flush().await.ok, "{stage:?}");
    }
    assert_eq!(copies, 1, "{stage:?}");
    assert!(
        sub.message_within(Duration::from_millis(600))
            .await
            .is_none(),
        "{stage:?}: nothing more is delivered"
    );
    let copy = u64::from(kept > 0);
    assert_eq!(
        (stream(), delayed(), dead(), held()),
        (kept + copy, 2, 2, 0),
        "{stage:?}"
    );
    sub.close();
    let _ = inspect.quit().await;
    sidecar.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeues_while_the_slot_migrates_run_on_the_old_owner() {
    requeues_while_the_slot_moves(Form::Stream, SlotMove::Begun).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeues_while_the_slot_migrates_run_on_the_old_owner_reliable_list() {
    requeues_while_the_slot_moves(Form::ReliableList, SlotMove::Begun).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeues_with_the_slots_keys_split_run_once_they_moved() {
    requeues_while_the_slot_moves(Form::Stream, SlotMove::Split).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeues_with_the_slots_keys_split_run_once_they_moved_reliable_list() {
    requeues_while_the_slot_moves(Form::ReliableList, SlotMove::Split).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeues_with_the_slots_keys_split_too_long_stay_pending() {
    requeues_while_the_slot_moves(Form::Stream, SlotMove::SplitPastTimeout).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeues_with_the_slots_keys_split_too_long_stay_pending_reliable_list() {
    requeues_while_the_slot_moves(Form::ReliableList, SlotMove::SplitPastTimeout).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeues_after_the_slot_moved_run_on_the_new_owner() {
    requeues_while_the_slot_moves(Form::Stream, SlotMove::Moved).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeues_after_the_slot_moved_run_on_the_new_owner_reliable_list() {
    requeues_while_the_slot_moves(Form::ReliableList, SlotMove::Moved).await;
}
