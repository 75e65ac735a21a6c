//! What the tests of Redis refusing a requeue share: the form under test ([`Form`]: its open,
//! how entries get in, where its requeues go), the faults they do to Redis and undo
//! ([`Fault`]), and the checks of a stream's entries coming back once Redis takes writes again
//! ([`stream_entries_come_back_as_asked`], with their due times in the group's delay set).

use std::collections::VecDeque;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fred::prelude::*;
use window_sidecar::proto;
use window_sidecar::proto::OutcomeKind::{self, Ack, DeadLetter, Retry, RetryAfter};

use crate::{
    STEP, Subscription, duration, eventually, outcome, pending, resp, retry_after, stream_open,
    value,
};

/// The delay retry_after asks for: long enough that a promotion never races the checks.
pub const DELAY: Duration = Duration::from_secs(30);

/// The delay a stream's retry_after asks for: its entry stays pending in its group and comes
/// back when due, which the stream's stories wait for.
pub const STREAM_DELAY: Duration = Duration::from_millis(1500);

/// The delay set of copies an earlier version wrote for a stream's retry_after (`{key}:window:
/// delayed`), still promoted after an upgrade; the stream's retries write nothing to it now.
pub const SHARED_DELAYED: &str = "{orders}:window:delayed";

/// What a test does to Redis between the deliveries and their outcomes, and undoes after.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fault {
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
    pub fn refused(self) -> (&'static [usize], &'static str) {
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
    pub fn refused_on_stream(self) -> &'static [usize] {
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
    pub fn worded(self, error: &str) -> bool {
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

    pub async fn apply(self, redis: &Client, port: u16, form: &Form) {
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

    pub async fn undo(self, redis: &Client, port: u16, form: &Form) {
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
pub fn admin(port: u16, args: &[&str]) {
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
pub enum Form {
    Stream,
    ReliableList,
    /// Entries leave Redis when popped: the sidecar holds the refused ones and pushes them
    /// back once Redis takes that write.
    SimpleList,
}

impl Form {
    pub fn open(self, mode: proto::Mode) -> proto::Open {
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

    pub fn dead_letter(self) -> &'static str {
        "{orders}:dead"
    }

    /// Where a retry_after's due time goes: a list's delay set (of copies), a stream group's
    /// delay set (of the ids of its entries kept pending).
    pub fn delayed(self) -> String {
        match self {
            Form::Stream => "{orders}:window:delayed:g".to_owned(),
            Form::ReliableList | Form::SimpleList => "{orders}:window:delayed".to_owned(),
        }
    }

    /// The delay its retry_after asks for: a stream's entry stays pending until then and the
    /// stories wait it out.
    pub fn delay(self) -> Duration {
        match self {
            Form::Stream => STREAM_DELAY,
            Form::ReliableList | Form::SimpleList => DELAY,
        }
    }

    pub async fn add(self, redis: &Client, values: &[&str]) {
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
    pub async fn held(self, redis: &Client) -> u64 {
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
    pub async fn length(self, redis: &Client) -> u64 {
        match self {
            Form::Stream => redis.xlen("orders").await.unwrap(),
            Form::ReliableList | Form::SimpleList => redis.llen("orders").await.unwrap(),
        }
    }

    pub async fn dead_letters(self, redis: &Client) -> u64 {
        let key = self.dead_letter();
        match redis.r#type::<String, _>(key).await.unwrap().as_str() {
            "stream" => redis.xlen(key).await.unwrap(),
            "list" => redis.llen(key).await.unwrap(),
            _ => 0,
        }
    }

    pub async fn delayed_members(self, redis: &Client) -> u64 {
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
pub fn requeues(form: Form, read: &proto::Read) -> Vec<proto::Outcome> {
    let slots: Vec<u64> = read.deliveries.iter().map(|d| d.slot).collect();
    vec![
        outcome(slots[0], Retry),
        retry_after(slots[1], form.delay()),
        outcome(slots[2], DeadLetter),
    ]
}

/// Reads until `n` deliveries came, in as many reads as the sidecar makes.
pub async fn deliveries(sub: &mut Subscription, n: usize) -> proto::Read {
    let mut all = proto::Read::default();
    while all.deliveries.len() < n {
        let read = sub.read().await;
        all.deliveries.extend(read.deliveries);
    }
    all
}

/// Now, in Unix milliseconds: the clock of the due times Redis writes (the tests' servers run
/// on this machine).
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A sorted set's size; 0 when it does not exist.
pub async fn zcard(redis: &Client, key: &str) -> u64 {
    redis.zcard(key).await.unwrap()
}

/// The group's delay set `due_set` holds the stream's retry_after entry `id`, and nothing else
/// but a test's `marker`, scored by its due time: Redis's clock when the flush ran, between
/// `sent` and `replied` (Unix ms), plus [`STREAM_DELAY`].
pub async fn due_time_written(
    redis: &Client,
    due_set: &str,
    id: &str,
    (sent, replied): (u64, u64),
) {
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
pub async fn due_times_leave_once_settled(redis: &Client, due_set: &str, left: u64) {
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
pub async fn stream_entries_come_back_as_asked(
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

/// Opens `open`, again every 100 ms while its consumer's lease is still held (a sidecar whose
/// release Redis refused), for up to 5 s.
pub async fn open_once_the_lease_expires(
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
